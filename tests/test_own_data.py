"""Bring your own image data: the three layouts, column detection, what is inferred from the
data, the models built for it, and one line for each kind of bad data."""

import json
import logging

import numpy as np
import pytest
import torch

from conftest import make_cfg
from own_data import (gray28, make_images, png_bytes, rgb64, write_hf_parquet, write_image_folder,
                      write_plain_parquet)
from pfedes.config import ConfigError
from pfedes.data import (DataError, DataSource, check_data, image_format, load_client_data, load_split,
                         load_unified_test, num_classes_of)
from pfedes.image_data import HOLDOUT_FRACTION, ImageFormat, open_image
from pfedes.models import ARCHITECTURES, ProxyExtractor, build_client_model

LAYOUTS = ("hf_parquet", "plain_parquet", "imagefolder")


# -- layouts and what is inferred ----------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_28x28_grayscale_dataset_is_read_in_every_layout(tmp_path, layout):
    root = str(gray28(tmp_path, layout))
    fmt = image_format(root)
    assert (fmt.channels, fmt.height, fmt.width) == (1, 28, 28)
    assert num_classes_of(root) == 10
    assert len(load_split(root, "train")) == 120 and len(load_split(root, "test")) == 40
    data = load_client_data(root, "iid", 2, 0, 0, samples_per_client=50)
    assert data.x_train.shape[1:] == (1, 28, 28) and data.x_train.dtype == torch.uint8
    assert data.image_format == fmt and data.num_classes == 10
    # the statistics are those of the training images, not constants
    cells = load_split(root, "train").data.column("img").to_pylist()
    pixels = np.stack([np.asarray(open_image(cell)) for cell in cells])
    assert fmt.mean[0] == pytest.approx(pixels.mean() / 255, abs=1e-4)
    assert fmt.std[0] == pytest.approx(pixels.std() / 255, abs=1e-3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_64x64_rgb_100_class_dataset_with_one_split_holds_out_a_test_split(tmp_path, layout):
    root = str(rgb64(tmp_path, layout, n=200))
    fmt = image_format(root)
    assert (fmt.channels, fmt.height, fmt.width) == (3, 64, 64)
    assert num_classes_of(root) == 100
    train, test = load_split(root, "train"), load_split(root, "test")
    assert len(test) == round(200 * HOLDOUT_FRACTION) and len(train) + len(test) == 200
    # deterministic: the same rows are held out however often the data is read
    from pfedes.image_data import read_splits

    read_splits.cache_clear()
    assert load_split(root, "test").data.column("label").to_pylist() == test.data.column("label").to_pylist()


def test_columns_are_found_by_their_features_and_overrides_choose_others(tmp_path):
    images, labels = make_images(30, 3, (20, 20), "RGB")
    # HF features with other names, and a string column beside them
    write_hf_parquet(tmp_path / "hf" / "train.parquet", images, labels, 3, "pixels", "kind",
                     caption=["x"] * 30)
    hf = str(tmp_path / "hf")
    assert sorted(list(load_split(hf, "train")["label"]) + list(load_split(hf, "test")["label"])) == sorted(labels)
    assert num_classes_of(hf) == 3
    # no metadata: the struct with bytes and the one integer column
    write_plain_parquet(tmp_path / "plain" / "train.parquet", [png_bytes(i) for i in images],
                        {"target": labels, "name": ["a"] * 30})
    assert num_classes_of(str(tmp_path / "plain")) == 3
    # two integer columns: the override picks one
    write_plain_parquet(tmp_path / "two" / "train.parquet", [png_bytes(i) for i in images],
                        {"coarse": [v % 2 for v in labels], "fine": labels})
    assert num_classes_of(DataSource(str(tmp_path / "two"), label_column="fine")) == 3
    assert num_classes_of(DataSource(str(tmp_path / "two"), label_column="coarse")) == 2
    with pytest.raises(DataError, match="data.image_column 'nope' is not a column"):
        load_split(DataSource(str(tmp_path / "two"), image_column="nope"), "train")


def test_a_validation_split_stands_in_for_a_missing_test_split(tmp_path):
    images, labels = make_images(30, 3, (16, 16), "RGB")
    write_hf_parquet(tmp_path / "train.parquet", images[:20], labels[:20], 3)
    write_hf_parquet(tmp_path / "validation.parquet", images[20:], labels[20:], 3)
    assert (len(load_split(str(tmp_path), "train")), len(load_split(str(tmp_path), "test"))) == (20, 10)


def test_rgba_becomes_rgb_and_image_size_resizes_to_a_non_square_size(tmp_path):
    images, labels = make_images(40, 4, (24, 20), "RGBA")
    write_image_folder(tmp_path, images, labels)
    assert image_format(str(tmp_path)).channels == 3
    source = DataSource(str(tmp_path), image_size=(16, 32))
    fmt = image_format(source)
    assert (fmt.channels, fmt.height, fmt.width) == (3, 16, 32)
    data = load_client_data(source, "iid", 2, 1, 0)
    assert data.x_train.shape[1:] == (3, 16, 32)


def test_the_decoded_cache_on_disk_is_keyed_by_the_data_settings(tmp_path):
    root = str(gray28(tmp_path / "data", "hf_parquet"))
    cache = tmp_path / "cache"
    load_client_data(root, "iid", 2, 0, 0, cache_dir=cache)
    resized = DataSource(root, image_size=(32, 32))
    load_client_data(resized, "iid", 2, 0, 0, cache_dir=cache)
    files = list(cache.glob("decoded-*.pt"))
    assert len(files) == 2
    from pfedes import data as data_module

    data_module.DECODED._items.clear()  # a new process: read back from disk, statistics included
    again = load_client_data(resized, "iid", 2, 0, 0, cache_dir=cache)
    assert again.x_train.shape[1:] == (1, 32, 32) and again.image_format == image_format(resized)


# -- models for any channel count and size -------------------------------------------------------

@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 64, 64), (3, 16, 16), (1, 20, 36)])
def test_every_architecture_takes_the_channels_and_size(arch, shape):
    channels, height, width = shape
    model = build_client_model(arch, 7, 32, 64, channels, (height, width)).eval()
    with torch.no_grad():
        assert model(torch.randn(2, channels, height, width)).shape == (2, 7)
    proxy = ProxyExtractor(32, norm="group", num_classes=7, in_channels=channels).eval()
    with torch.no_grad():
        assert proxy(torch.randn(2, channels, height, width)).shape == (2, 32)


def test_the_default_models_keep_their_cifar_shapes():
    """Parameter counts and entries of the 3x32x32 default as before channels and size were
    parameters: checkpoints of the default setting still load."""
    before = {"cnn3": (354442, 14), "mobilenet_v3_small": (1122588, 248), "resnet18": (11345502, 128),
              "resnet_bn": (130435, 62), "vit_small": (370922, 62)}
    for arch, (entries, keys) in before.items():
        state = build_client_model(arch, 10, 128, 256).state_dict()
        assert (sum(v.numel() for v in state.values()), len(state)) == (entries, keys), arch
    assert build_client_model("vit_small", 10, 128, 256).backbone.pos_embed.shape == (1, 65, 96)
    assert build_client_model("vit_small", 10, 128, 256, 1, (28, 28)).backbone.pos_embed.shape == (1, 50, 96)
    assert sum(v.numel() for v in ProxyExtractor(128, norm="group", num_classes=10).state_dict().values()) == 33306


def test_a_trainer_built_for_the_data_trains_on_it(tmp_path):
    from pfedes.client_round import build_trainer, evaluate_round, train_round

    root = str(gray28(tmp_path, "hf_parquet"))
    cfg = make_cfg(f"data.path={root}", "num_clients=2")
    data = load_client_data(root, "iid", 2, 0, 0, samples_per_client=40)
    for arch in ("cnn3", "vit_small"):
        trainer = build_trainer(cfg, arch, data.num_classes, 0, image=data.image_format)
        assert trainer.image.channels == 1
        sent = type(trainer).initial_shared(cfg, arch, data.num_classes, data.image_format)
        shared, metrics = train_round(trainer, sent, data, cfg, 0, 1)
        assert np.isfinite(metrics["train_loss"]) and set(shared)
        assert 0.0 <= evaluate_round(trainer, {}, data)["accuracy"] <= 1.0


@pytest.mark.parametrize("factory,method", [(gray28, "pfedes"), (rgb64, "pfedes"), (rgb64, "lgfedavg")])
def test_the_plain_loop_runs_a_method_on_own_data(tmp_path, factory, method):
    """The same client and server work as a Flower run, without Flower (fast)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from plain_loop import run_plain

    root = factory(tmp_path, "plain_parquet")
    cfg = make_cfg(f"strategy={method}", f"data.path={root}", "num_clients=2", "num_rounds=1",
                   "clients.devices=[phone,gpu-host]", "data.partition=iid", "data.samples_per_client=40",
                   "data.unified_test_samples=20")
    result = run_plain(cfg)
    assert 0.0 <= result["rounds"][0]["acc_mean"] <= 1.0 and result["arrays"]


# -- one line for each kind of bad data ----------------------------------------------------------

def test_no_image_column(tmp_path):
    write_plain_parquet(tmp_path / "train.parquet", None, {"label": [0, 1], "note": ["a", "b"]})
    with pytest.raises(DataError, match="has no image column"):
        load_split(str(tmp_path), "train")


def test_two_candidate_label_columns(tmp_path):
    images, labels = make_images(6, 2, (16, 16), "L")
    write_plain_parquet(tmp_path / "train.parquet", [png_bytes(i) for i in images], {"a": labels, "b": labels})
    with pytest.raises(DataError, match=r"2 candidate label columns \['a', 'b'\]: set data.label_column"):
        load_split(str(tmp_path), "train")


def test_string_labels_without_a_classlabel(tmp_path):
    images, labels = make_images(6, 2, (16, 16), "L")
    write_plain_parquet(tmp_path / "train.parquet", [png_bytes(i) for i in images],
                        {"animal": ["cat" if v else "dog" for v in labels]})
    with pytest.raises(DataError, match="labels in column 'animal' are string, not class ids"):
        load_split(str(tmp_path), "train")


def test_a_single_class(tmp_path):
    images, labels = make_images(6, 1, (16, 16), "L")
    write_plain_parquet(tmp_path / "p" / "train.parquet", [png_bytes(i) for i in images], {"y": labels})
    with pytest.raises(DataError, match="single class"):
        load_split(str(tmp_path / "p"), "train")
    write_image_folder(tmp_path / "f", images, labels)
    with pytest.raises(DataError, match="one class folder"):
        load_split(str(tmp_path / "f"), "train")


def test_fewer_samples_than_clients(tmp_path):
    images, labels = make_images(4, 2, (16, 16), "L")
    write_plain_parquet(tmp_path / "train.parquet", [png_bytes(i) for i in images], {"y": labels})
    with pytest.raises(DataError, match="has 3 training samples, fewer than the 6 clients"):
        check_data(str(tmp_path), 6)  # 4 rows, one held out as the test split


def test_one_unreadable_image_is_skipped_and_counted_and_a_file_of_them_is_an_error(tmp_path, caplog):
    images, labels = make_images(10, 2, (16, 16), "L")
    cells = [png_bytes(i) for i in images]
    cells[3] = b"not an image"
    write_plain_parquet(tmp_path / "ok" / "train.parquet", cells, {"y": labels})
    with caplog.at_level(logging.WARNING):
        assert len(load_split(str(tmp_path / "ok"), "train")) + len(load_split(str(tmp_path / "ok"), "test")) == 9
    assert "skipped 1 unreadable image(s) of 10" in caplog.text
    write_plain_parquet(tmp_path / "bad" / "train.parquet", [b"junk"] * 4, {"y": [0, 1, 0, 1]})
    with pytest.raises(DataError, match="none of the 4 images of '.*train.parquet' .* can be read"):
        load_split(str(tmp_path / "bad"), "train")


def test_images_of_several_sizes_need_image_size(tmp_path):
    a, la = make_images(4, 2, (16, 16), "L")
    b, lb = make_images(4, 2, (20, 18), "L")
    write_image_folder(tmp_path, a + b, la + lb)
    with pytest.raises(DataError, match="have 2 sizes .* set data.image_size"):
        image_format(str(tmp_path))
    assert image_format(DataSource(str(tmp_path), image_size=(16, 16))).size == (16, 16)


def test_a_hub_name_while_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="'someone/some-images' is not a local directory.*offline") as info:
        load_split("someone/some-images", "train")
    assert "\n" not in str(info.value)


def test_the_run_refuses_bad_data_before_any_client_starts(tmp_path):
    """pfedes-sim (simulate) checks the data before Ray starts: one line, no run."""
    from pfedes.sim import simulate

    images, labels = make_images(6, 2, (16, 16), "L")
    write_plain_parquet(tmp_path / "train.parquet", [png_bytes(i) for i in images], {"a": labels, "b": labels})
    with pytest.raises(DataError, match="candidate label columns"):
        simulate(make_cfg(f"data.path={tmp_path}", f"out_dir={tmp_path / 'out'}"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override,message", [
    ("data.image_size=8", "data.image_size must be"),
    ("data.image_size=[32,32,3]", "data.image_size must be"),
    ("data.label_column=''", "data.label_column must be a column name"),
])
def test_bad_data_settings_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        make_cfg(override)


def test_image_size_settings_read_as_height_and_width():
    assert DataSource.from_cfg(make_cfg("data.image_size=40")["data"]).image_size == (40, 40)
    assert DataSource.from_cfg(make_cfg("data.image_size=[20,36]")["data"]).image_size == (20, 36)
    assert DataSource.from_cfg(make_cfg()["data"]) == DataSource("embedded")
    assert ImageFormat().size == (32, 32)


# -- a device with its own data: the run's classes ----------------------------------------------

def _subset(root, layout, classes, seed=5):
    """A device's own data: 28x28 grayscale images of `classes` only (their ids in the 10-class
    set), in `layout`: an image folder names them class003, ...; plain Parquet has their ids."""
    images, labels = make_images(60, 10, (28, 28), "L", seed=seed)
    keep = [i for i, label in enumerate(labels) if label in classes]
    images, labels = [images[i] for i in keep], [labels[i] for i in keep]
    if layout == "imagefolder":
        return write_image_folder(root, images, labels)
    return write_plain_parquet(root / "train.parquet", [png_bytes(im) for im in images], {"y": labels}).parent


def test_a_device_with_some_of_the_classes_takes_the_runs_count_and_ids():
    from pfedes.data import ClientData, align_classes

    y = torch.tensor([0, 1, 2, 1])
    named = ClientData(torch.zeros(4, 1, 16, 16, dtype=torch.uint8), y, torch.zeros(2, 1, 16, 16, dtype=torch.uint8),
                       torch.tensor([2, 0]), 3, class_names=["cat", "dog", "owl"])
    run = ["ant", "cat", "cow", "dog", "elk", "owl"]
    out = align_classes(named, 6, run, "here")
    assert out.num_classes == 6 and out.class_names == run
    assert out.y_train.tolist() == [1, 3, 5, 3] and out.y_test.tolist() == [5, 1]  # by name
    assert named.y_train.tolist() == [0, 1, 2, 1]  # the (cached) data itself is left alone
    assert align_classes(named, 3, ["cat", "dog", "owl"], "here") is named  # the run's own data: unchanged
    bare = ClientData(named.x_train, y, named.x_test, torch.tensor([2, 0]), 3)
    ids = align_classes(bare, 10, None, "here")  # bare ids are ids: only the count changes
    assert ids.num_classes == 10 and ids.y_train.tolist() == [0, 1, 2, 1]
    assert align_classes(bare, 6, run, "here").y_train.tolist() == [0, 1, 2, 1]
    with pytest.raises(DataError, match=r"here: class\(es\) \['bee'\] are not among the 6 classes"):
        align_classes(ClientData(named.x_train, y, named.x_test, y[:2], 3, class_names=["cat", "bee", "owl"]),
                      6, run, "here")
    with pytest.raises(DataError, match="here: label 2 is not a class of the run's data.path, which has 2 classes"):
        align_classes(bare, 2, None, "here")
    with pytest.raises(DataError, match="here: names its 3 classes .* but the run's data.path has 10 unnamed"):
        align_classes(named, 10, None, "here")
    assert align_classes(named, 3, None, "here") is named  # as many: taken in their order


@pytest.mark.parametrize("layout, method", [("imagefolder", "pfedes"), ("plain_parquet", "lgfedavg")])
def test_the_client_app_of_a_device_with_some_of_the_classes_trains_for_all_of_them(tmp_path, layout, method):
    """The real ClientApp (without Ray) as a deployed SuperNode runs it, with its own data-path: 3
    of the run's 10 classes. It builds its models for the 10 the server's arrays are shaped for,
    and its labels are the run's class ids (an image folder's class003 is class 3, not 0)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

    from pfedes import client_app
    from pfedes.config import client_settings
    from pfedes.data import class_names_of
    from pfedes.methods import method_of
    from pfedes.models import resolve_architecture
    from pfedes.server_app import prepare
    from pfedes.strategies.base import CLASSES_KEY

    run_data = gray28(tmp_path / "run", layout)
    own = _subset(tmp_path / "own", layout, (3, 7, 8))
    assert num_classes_of(str(own)) in (3, 9)  # on its own the device would build 3- or 9-class models
    cfg = prepare(make_cfg(f"strategy={method}", "num_clients=2", f"data.path={run_data}", "data.samples_per_client=40",
                           f"out_dir={tmp_path / 'out'}"))
    cfg["run_token"] = "t"
    initial = method_of(cfg).trainer.initial_shared(cfg, resolve_architecture("phone", cfg["model"]["profiles"]), 10,
                                                    image_format(str(run_data)))
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    classes = json.dumps({"num_classes": 10, "class_names": class_names_of(str(run_data))})
    config = ConfigRecord({"experiment": json.dumps(client_settings(cfg)), "server-round": 1, CLASSES_KEY: classes})
    msg = Message(RecordDict({"arrays": ArrayRecord({k: Array(v.numpy()) for k, v in initial.items()}),
                              "config": config}), dst_node_id=1, message_type="train")
    context = Context(run_id=1, node_id=1, node_config={"device": "phone", "data-path": str(own),
                                                        "state-dir": str(tmp_path / "state")},
                      state=RecordDict(), run_config={})
    reply = client_app.app(msg, context)
    assert not reply.has_error(), reply.error.reason
    assert {k: a.numpy().shape for k, a in reply.content["arrays"].items()} == \
        {k: tuple(v.shape) for k, v in initial.items()}
    _, _, data, trainer, _ = client_app._setup(msg, context)
    assert data.num_classes == 10 and sorted(set(data.y_train.tolist()) | set(data.y_test.tolist())) == [3, 7, 8]
    ten = method_of(cfg).trainer(cfg, trainer.arch, 10, seed=0, image=data.image_format).state_dict()["private"]
    assert {k: v.shape for k, v in trainer.state_dict()["private"].items()} == {k: v.shape for k, v in ten.items()}


# -- end to end through Flower's simulation engine ----------------------------------------------

def _sim_cfg(root, tmp_path, method: str, devices: str, *extra):
    return make_cfg(f"strategy={method}", f"data.path={root}", "num_clients=3", "num_rounds=1",
                    f"clients.devices={devices}", "data.partition=iid", "data.samples_per_client=40",
                    "data.unified_test_samples=30", "simulation.num_cpus_per_client=1",
                    f"out_dir={tmp_path / 'out'}", *extra)


DEVICES = {"pfedes": "[phone,gateway,gpu-host]", "fedavg": "[phone]", "lgfedavg": "[gateway,gpu-host]",
           "fd": "[phone,gateway,gpu-host]"}


@pytest.mark.slow
@pytest.mark.parametrize("factory,layout,method", [
    (gray28, "hf_parquet", "pfedes"), (gray28, "imagefolder", "fedavg"), (gray28, "plain_parquet", "lgfedavg"),
    (gray28, "hf_parquet", "fd"), (rgb64, "imagefolder", "pfedes"), (rgb64, "plain_parquet", "fedavg"),
    (rgb64, "hf_parquet", "lgfedavg"), (rgb64, "imagefolder", "fd")])
def test_own_data_trains_end_to_end_in_simulation(tmp_path, factory, layout, method):
    """Each dataset in each layout, each method on both datasets: 3 clients (the three device
    profiles where the method allows them), 1 round."""
    from pfedes.sim import simulate

    root = factory(tmp_path / "data", layout)
    summary = simulate(_sim_cfg(root, tmp_path, method, DEVICES[method]))
    rounds = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert rounds[0]["clients_trained"] == 3 and rounds[0]["clients_dropped"] == 0
    assert 0.0 <= summary["acc_mean_last5"] <= 1.0


def test_data_loaded_from_the_table_matches_the_unified_test(tmp_path):
    root = str(gray28(tmp_path, "imagefolder"))
    x, y = load_unified_test(root, 25)
    assert x.shape == (25, 1, 28, 28) and len(y) == 25
