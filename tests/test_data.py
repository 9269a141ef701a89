import numpy as np
import pytest
import torch

from pfedes.data import DataError, load_client_data, partition_indices, resolve_data_dir


def test_pathological_partitions_are_disjoint_and_have_k_classes():
    parts = [partition_indices("embedded", "pathological", 5, i, seed=0, classes_per_client=2)
             for i in range(5)]
    flat = np.concatenate(parts)
    assert len(flat) == len(set(flat.tolist()))
    for i in range(5):
        d = load_client_data("embedded", "pathological", 5, i, 0, 2, 0.3, 0, 0.2)
        assert len(set(d.y_train.tolist()) | set(d.y_test.tolist())) == 2


@pytest.mark.parametrize("partition", ["dirichlet", "iid"])
def test_other_partitioners_are_disjoint(partition):
    parts = [partition_indices("embedded", partition, 4, i, seed=1, alpha=0.3) for i in range(4)]
    flat = np.concatenate(parts)
    assert len(flat) == len(set(flat.tolist()))


def test_local_split_keeps_label_mix_and_cap():
    d = load_client_data("embedded", "dirichlet", 3, 1, 0, 2, 0.5, 200, 0.2)
    assert d.num_train + len(d.y_test) == 200
    train_mix = np.bincount(d.y_train.numpy(), minlength=10) / d.num_train
    test_mix = np.bincount(d.y_test.numpy(), minlength=10) / len(d.y_test)
    assert np.abs(train_mix - test_mix).max() < 0.1
    assert d.x_train.dtype.is_floating_point is False and d.x_train.shape[1:] == (3, 32, 32)


def test_missing_or_malformed_path_names_it(tmp_path):
    with pytest.raises(DataError, match="nowhere"):
        resolve_data_dir(str(tmp_path / "nowhere"))
    (tmp_path / "train.parquet").write_text("not parquet")
    (tmp_path / "test.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="train.parquet"):
        load_client_data(str(tmp_path), "iid", 2, 0, 0)


def test_the_stamp_a_new_process_checks_is_each_regular_files_name_size_and_mtime(tmp_path):
    """The decoded cache's key (data.py): one stat per file, no bytes read; links to files count
    as their targets, dangling links and linked directories are left out (as Path.rglob does)."""
    import os

    from pfedes.image_data import source_stamp

    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.png").write_bytes(b"aa")
    (tmp_path / "b.png").write_bytes(b"bbb")
    (tmp_path / "link.png").symlink_to(tmp_path / "b.png")
    (tmp_path / "dangling.png").symlink_to(tmp_path / "nowhere.png")
    (tmp_path / "linked-dir").symlink_to(tmp_path / "cat")
    expected = tuple(sorted((name, os.stat(tmp_path / name).st_size, os.stat(tmp_path / name).st_mtime_ns)
                            for name in ("b.png", os.path.join("cat", "a.png"), "link.png")))
    stamp = source_stamp(str(tmp_path))
    assert stamp == (str(tmp_path.resolve()), expected)
    (tmp_path / "cat" / "a.png").write_bytes(b"xx")  # the same size, new content
    os.utime(tmp_path / "cat" / "a.png", ns=(1, stamp[1][1][2] + 10**9))  # past the clock's granularity
    assert source_stamp(str(tmp_path)) != stamp
    assert source_stamp("uoft-cs/cifar10") == ("uoft-cs/cifar10",)
    with pytest.raises(DataError, match="nowhere"):
        source_stamp(str(tmp_path / "nowhere"))


def test_a_device_decodes_its_data_once_on_disk_and_a_new_process_reads_it_back(tmp_path, monkeypatch):
    """A deployed ClientApp is a fresh process per message: with a cache dir the partitioned,
    decoded data is written once and read back bit for bit; other settings get their own file."""
    import pfedes.data as data_module

    args = ("embedded", "pathological", 4, 1, 0, 2, 0.3, 60, 0.2)
    synced = []
    monkeypatch.setattr("os.fsync", synced.append)
    first = load_client_data(*args, cache_dir=tmp_path)
    assert synced == []  # a cache, not state: no fsync (a first-time client of a large fleet waits less)
    files = list(tmp_path.glob("decoded-*.pt"))
    assert len(files) == 1
    monkeypatch.setattr(data_module, "DECODED", data_module.DecodedCache(2**30))  # a new process
    monkeypatch.setattr(data_module, "_load_client_data", lambda *a: pytest.fail("decoded again"))
    again = load_client_data(*args, cache_dir=tmp_path)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(first, name), getattr(again, name))
    assert again.num_classes == first.num_classes
    files[0].write_bytes(b"damaged")  # never trusted: rebuilt
    monkeypatch.undo()
    monkeypatch.setattr(data_module, "DECODED", data_module.DecodedCache(2**30))
    assert torch.equal(load_client_data(*args, cache_dir=tmp_path).x_train, first.x_train)
    load_client_data("embedded", "pathological", 4, 2, 0, 2, 0.3, 60, 0.2, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("decoded-*.pt"))) == 2


def test_cells_are_taken_chunk_by_chunk_in_the_order_asked():
    import pyarrow as pa

    from pfedes.data import take_cells

    cell = pa.struct([("bytes", pa.binary())])
    column = pa.chunked_array([pa.array([{"bytes": bytes([i])} for i in range(start, stop)], cell)
                               for start, stop in ((0, 3), (3, 3), (3, 7), (7, 10))])  # one chunk empty
    rows = np.array([9, 0, 4, 3, 7, 2, 9])
    assert take_cells(column, rows) == column.take(pa.array(rows)).to_pylist()
    assert take_cells(column, np.zeros(0, dtype=np.int64)) == []
