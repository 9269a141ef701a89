"""Local data for a client: an image dataset (pfedes/image_data.py reads its layouts),
partitioned with flwr-datasets, decoded once.

Every function takes a `DataSource` (a data path with the data settings that decide how it is
read) or a bare data path, read with the default settings. Decoded tensors are cached per
process, so a ClientApp decodes its partition once, not every round, and with a cache directory
once per device.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from .image_data import (EMBEDDED, DataError, DataSource, ImageFormat, as_source, decode_cells, embedded_dir,
                         image_format, is_hub_name, read_splits, resolve_data_dir, source_stamp)

__all__ = ["EMBEDDED", "ClientData", "DataError", "DataSource", "ImageFormat", "align_classes", "batches",
           "check_data", "class_names_of", "embedded_dir", "image_format", "load_client_data", "load_split",
           "load_unified_test", "num_classes_of", "resolve_data_dir", "to_input"]

logger = logging.getLogger(__name__)


@dataclass
class ClientData:
    x_train: torch.Tensor  # uint8, N x C x H x W
    y_train: torch.Tensor  # int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    # The validation split (same label mix), for choosing hyperparameters; empty when
    # data.val_fraction is 0.
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    # The dataset's per-channel statistics (image_data.image_format), for standardising inputs.
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    # The dataset's class names (a ClassLabel's, an image folder's class folders), label i named
    # class_names[i]; None when the labels are bare class ids.
    class_names: list[str] | None = None

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def image_format(self) -> ImageFormat:
        _, channels, height, width = self.x_train.shape
        return ImageFormat(channels, height, width, tuple(self.mean), tuple(self.std))


def load_split(source: DataSource | str, split: str):
    """The `split` ("train" or "test") of a data source as an in-memory datasets.Dataset with
    columns `img` and `label` (pfedes/image_data.py reads the layouts)."""
    source = as_source(source)
    _offline_hub(source.path)
    return read_splits(source)[split].dataset


def num_classes_of(source: DataSource | str) -> int:
    """The class count: the ClassLabel's names, else the largest train label + 1."""
    train = read_splits(as_source(source))["train"]
    if train.class_names:
        return len(train.class_names)
    return int(np.max(train.dataset.data.column("label").to_numpy())) + 1


def class_names_of(source: DataSource | str) -> list[str] | None:
    """The class names of the train split (a ClassLabel's, an image folder's class folders), or
    None when its labels are bare class ids."""
    names = read_splits(as_source(source))["train"].class_names
    return [str(n) for n in names] if names else None


def align_classes(data: ClientData, num_classes: int, class_names: list[str] | None, where: str) -> ClientData:
    """`data` in the run's classes: the class count of the run's data (data.path, which the server
    builds the shared entries for) and its labels as the run's class ids, matched by name where both
    name their classes, so that a device whose own data holds only some of the classes builds the
    models every other device builds, and its label i means what it means elsewhere. DataError,
    naming `where`, when its classes cannot be the run's."""
    own = data.class_names
    if own and class_names:
        index = {name: i for i, name in enumerate(class_names)}
        unknown = [name for name in own if name not in index]
        if unknown:
            raise DataError(f"{where}: class(es) {unknown[:5]} are not among the {len(class_names)} classes of the "
                            f"run's data.path ({class_names[:5]}{' ...' if len(class_names) > 5 else ''})")
        mapping = torch.tensor([index[name] for name in own], dtype=torch.int64)
    else:
        if own and len(own) != num_classes:
            raise DataError(f"{where}: names its {len(own)} classes ({own[:5]}{' ...' if len(own) > 5 else ''}) "
                            f"but the run's data.path has {num_classes} unnamed ones (bare class ids): the labels "
                            "cannot be matched; give both the same class names (image folders, or a ClassLabel)")
        labels = [y for y in (data.y_train, data.y_test, data.y_val) if y is not None and len(y)]
        largest = max(int(y.max()) for y in labels) if labels else -1
        if largest >= num_classes:
            raise DataError(f"{where}: label {largest} is not a class of the run's data.path, which has "
                            f"{num_classes} classes (0 to {num_classes - 1})")
        mapping = None
    if mapping is not None and torch.equal(mapping, torch.arange(len(mapping))):
        mapping = None
    if mapping is None and num_classes == data.num_classes:
        return data

    def relabel(y: torch.Tensor | None) -> torch.Tensor | None:
        return y if y is None or mapping is None else mapping[y]

    return replace(data, y_train=relabel(data.y_train), y_test=relabel(data.y_test), y_val=relabel(data.y_val),
                   num_classes=num_classes, class_names=list(class_names) if class_names else own)


def _offline_hub(path: str) -> None:
    """Keep Hugging Face's libraries off the network when the data is local: set before they are
    first imported, which reads it, unless the user has set it."""
    if not is_hub_name(path):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


def check_data(source: DataSource | str, num_clients: int) -> None:
    """Everything about the data that can be told before a client starts: the source is readable,
    its columns found, its image format inferred, and there is a training sample per client."""
    source = as_source(source)
    train = load_split(source, "train")
    image_format(source)
    if len(train) < num_clients:
        raise DataError(f"data path '{source.path}' has {len(train)} training samples, fewer than the "
                        f"{num_clients} clients (num_clients)")


def make_partitioner(partition: str, num_partitions: int, seed: int, classes_per_client: int = 2,
                     alpha: float = 0.3):
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, PathologicalPartitioner

    if partition == "iid":
        return IidPartitioner(num_partitions=num_partitions)
    if partition == "pathological":
        return PathologicalPartitioner(
            num_partitions=num_partitions, partition_by="label",
            num_classes_per_partition=classes_per_client,
            class_assignment_mode="first-deterministic", seed=seed)
    if partition == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_partitions, partition_by="label", alpha=alpha,
            min_partition_size=10, self_balancing=False, seed=seed)
    raise DataError(f"data.partition '{partition}' is unknown: expected iid, pathological or dirichlet")


@functools.lru_cache(maxsize=4)
def _partitioner(source: DataSource, partition: str, num_partitions: int, seed: int, classes_per_client: int,
                 alpha: float):
    labels = load_split(source, "train").select_columns(["label"])  # first: it keeps a local source offline
    partitioner = make_partitioner(partition, num_partitions, seed, classes_per_client, alpha)
    partitioner.dataset = labels.add_column("row", np.arange(len(labels)))
    return partitioner


def partition_indices(source: DataSource | str, partition: str, num_partitions: int, partition_id: int, seed: int,
                      classes_per_client: int = 2, alpha: float = 0.3) -> np.ndarray:
    """Row indices of the train table that form partition `partition_id` (labels only are read)."""
    if not 0 <= partition_id < num_partitions:
        raise DataError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    partitioner = _partitioner(as_source(source), partition, num_partitions, seed, classes_per_client, float(alpha))
    with warnings.catch_warnings():  # flwr-datasets says it from every client; the server says it once
        warnings.filterwarnings("ignore", message=r"Classes: .* will NOT be used")
        return np.asarray(partitioner.load_partition(partition_id)["row"], dtype=np.int64)


def classes_in_no_partition(source: DataSource | str, partition: str, num_partitions: int, seed: int,
                            classes_per_client: int = 2, alpha: float = 0.3) -> list[int]:
    """The classes of the train table that no partition holds (the pathological partition leaves
    some out when the clients' classes do not cover them all). It stops at the first partitions
    that hold every class: each partition read costs milliseconds (flwr-datasets' select hashes its
    rows), which 1,000 clients would pay on the server at every start."""
    labels = load_split(source, "train").data.column("label").to_numpy()
    missing = set(np.unique(labels).tolist())
    for pid in range(num_partitions):
        if not missing:
            break
        rows = partition_indices(source, partition, num_partitions, pid, seed, classes_per_client, alpha)
        missing.difference_update(np.unique(labels[rows]).tolist())
    return sorted(missing)


def stratified_split(labels: np.ndarray, test_fraction: float, rng: np.random.Generator):
    """Per class, `test_fraction` of the rows (rounded, at least one when a class has two or more)
    go to the test split, so both splits keep the partition's label mix."""
    train, test = [], []
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        n_test = int(round(len(rows) * test_fraction))
        if len(rows) >= 2:
            n_test = min(max(n_test, 1), len(rows) - 1)
        test.append(rows[:n_test])
        train.append(rows[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def take_cells(column, rows: np.ndarray) -> list:
    """`column[rows]` as Python values, taken chunk by chunk: pyarrow's take on a chunked column
    of images joins all its chunks first (8 ms for CIFAR-10's 50,000 training images, paid by
    every client that loads its 40 rows, twice)."""
    rows = np.asarray(rows, dtype=np.int64)
    out: list = [None] * len(rows)
    starts = np.cumsum([0] + [len(chunk) for chunk in column.chunks])
    which = np.searchsorted(starts, rows, side="right") - 1
    for k in np.unique(which):
        at = np.flatnonzero(which == k)
        for i, value in zip(at, column.chunk(int(k)).take(rows[at] - starts[k]).to_pylist()):
            out[i] = value
    return out


def decode_images(dataset, rows: np.ndarray, fmt: ImageFormat) -> tuple[torch.Tensor, np.ndarray]:
    """Decode the `img` cells of `rows` into a uint8 N x C x H x W tensor in `fmt`'s channels and
    size; also the mask of the rows that decoded (those that did not are left out)."""
    return decode_cells(take_cells(dataset.data.column("img"), rows), fmt)


class DecodedCache:
    """Least-recently-used decoded client data, bounded by bytes (a process may serve many
    clients in simulation; each one is decoded once while it fits)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple, ClientData] = OrderedDict()

    @staticmethod
    def nbytes(data: ClientData) -> int:
        return sum(t.numel() * t.element_size() for t in (data.x_train, data.y_train, data.x_test, data.y_test,
                                                          data.x_val, data.y_val) if t is not None)

    def get_or_load(self, key: tuple, load) -> ClientData:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        data = load()
        self._items[key] = data
        while len(self._items) > 1 and sum(map(self.nbytes, self._items.values())) > self.max_bytes:
            self._items.popitem(last=False)
        return data


DECODED = DecodedCache(int(os.environ.get("PFEDES_DATA_CACHE_MB", "512")) * 2**20)


def load_client_data(source: DataSource | str, partition: str, num_partitions: int, partition_id: int, seed: int,
                     classes_per_client: int = 2, alpha: float = 0.3, samples_per_client: int = 0,
                     test_fraction: float = 0.2, cache_dir: str | Path | None = None,
                     val_fraction: float = 0.0) -> ClientData:
    """One client's local train/validation/test data, decoded once per process while the cache holds it
    (PFEDES_DATA_CACHE_MB, default 512 MB) and, with `cache_dir`, once per device: a deployed
    ClientApp is a new process per message, and re-partitioning and decoding the dataset would
    cost it seconds each time."""
    key = (as_source(source), partition, num_partitions, partition_id, seed, classes_per_client, float(alpha),
           samples_per_client, float(test_fraction), float(val_fraction))
    if cache_dir is None:
        return DECODED.get_or_load(key, lambda: _load_client_data(*key))
    return DECODED.get_or_load(key, lambda: _load_through_disk(key, Path(cache_dir)))


def _load_through_disk(key: tuple, cache_dir: Path) -> ClientData:
    """The decoded data from `cache_dir` if it was made from the same files with the same
    settings, else decoded and written there (atomically) for the next process."""
    import hashlib

    # "class_names": files written before ClientData had them are not read back without them
    digest = hashlib.sha256(repr((source_stamp(key[0].path), key, "class_names")).encode()).hexdigest()[:20]
    file = cache_dir / f"decoded-{digest}.pt"
    if file.is_file():
        try:
            return ClientData(**torch.load(file, map_location="cpu", weights_only=True))
        except Exception:  # a damaged cache file is rebuilt, never trusted
            file.unlink(missing_ok=True)
    from .client_state import atomic_torch_save

    data = _load_client_data(*key)
    atomic_torch_save(vars(data), file, durable=False)  # a cache: a damaged file is rebuilt (above)
    return data


def _load_client_data(source: DataSource, partition: str, num_partitions: int, partition_id: int, seed: int,
                      classes_per_client: int, alpha: float, samples_per_client: int,
                      test_fraction: float, val_fraction: float = 0.0) -> ClientData:
    train_table = load_split(source, "train")
    fmt = image_format(source)
    if num_partitions == 1:
        rows = np.arange(len(train_table))
    else:
        rows = partition_indices(source, partition, num_partitions, partition_id, seed,
                                 classes_per_client, alpha)
    rng = np.random.default_rng([seed, partition_id])
    if samples_per_client and len(rows) > samples_per_client:
        rows = np.sort(rng.choice(rows, samples_per_client, replace=False))
    labels = np.asarray(train_table.data.column("label").take(rows).to_numpy(), dtype=np.int64)
    tr, te = stratified_split(labels, test_fraction, rng)
    va = np.zeros(0, dtype=np.int64)
    if val_fraction > 0:  # carved from the train split: val_fraction of all the client's rows
        keep, va = stratified_split(labels[tr], val_fraction / (1.0 - test_fraction), rng)
        tr, va = tr[keep], tr[va]
    splits = {}
    for name, part in (("train", tr), ("test", te), ("val", va)):
        x, decoded = decode_images(train_table, rows[part], fmt)
        if not decoded.all():
            logger.warning("[pfedes] partition %d: skipped %d image(s) of its %s split that do not decode",
                           partition_id, int((~decoded).sum()), name)
        splits[name] = (x, torch.from_numpy(labels[part][decoded]))
    return ClientData(
        x_train=splits["train"][0], y_train=splits["train"][1],
        x_test=splits["test"][0], y_test=splits["test"][1],
        num_classes=num_classes_of(source),
        x_val=splits["val"][0], y_val=splits["val"][1], mean=fmt.mean, std=fmt.std,
        class_names=class_names_of(source),
    )


@functools.lru_cache(maxsize=2)
def load_unified_test(source: DataSource | str, max_rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared test split, for global accuracy of methods with a global model."""
    source = as_source(source)
    table = load_split(source, "test")
    rows = np.arange(len(table) if not max_rows else min(max_rows, len(table)))
    labels = np.array(table.data.column("label").take(rows).to_numpy(), dtype=np.int64)  # a writable copy
    x, decoded = decode_images(table, rows, image_format(source))
    return x, torch.from_numpy(labels[decoded])


def to_input(x_uint8: torch.Tensor, fmt: ImageFormat) -> torch.Tensor:
    """uint8 images -> float input standardised with `fmt`'s per-channel statistics."""
    mean = torch.tensor(fmt.mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(fmt.std, dtype=torch.float32).view(1, -1, 1, 1)
    return (x_uint8.float().div_(255.0) - mean) / std


def augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop with 4-pixel zero padding and random horizontal flip, batched on tensors."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    dx = torch.randint(0, 9, (n,), generator=generator)
    dy = torch.randint(0, 9, (n,), generator=generator)
    rows = (dy.view(n, 1) + torch.arange(h).view(1, h))  # n x h
    cols = (dx.view(n, 1) + torch.arange(w).view(1, w))  # n x w
    out = padded[torch.arange(n).view(n, 1, 1, 1), torch.arange(x.shape[1]).view(1, -1, 1, 1),
                 rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]
    flip = torch.rand(n, generator=generator) < 0.5
    out[flip] = out[flip].flip(3)
    return out


def batches(data_x: torch.Tensor, data_y: torch.Tensor, batch_size: int, generator: torch.Generator,
            train: bool, do_augment: bool, *, fmt: ImageFormat):
    """Yield (input, label) batches, standardised with `fmt`; shuffled and augmented when `train`."""
    n = len(data_y)
    order = torch.randperm(n, generator=generator) if train else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        if train and len(idx) < 2 and n >= 2:
            continue  # a 1-sample batch breaks BatchNorm
        x = to_input(data_x[idx], fmt)
        if train and do_augment:
            x = augment(x, generator)
        yield x, data_y[idx]
