"""Local data for a client: CIFAR-10-style Parquet, partitioned with flwr-datasets, decoded once.

A data directory holds `train.parquet` and `test.parquet` in the Hugging Face schema
(`img` = {bytes, path} JPEG/PNG, `label` = int). "embedded" names the small real sample shipped
inside this package. Decoded tensors are cached per process, so a ClientApp decodes its
partition once, not every round.
"""

from __future__ import annotations

import functools
import io
import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

EMBEDDED = "embedded"
CIFAR_MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
CIFAR_STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


class DataError(ValueError):
    """A data path or data setting that cannot be used; the message names it."""


@dataclass
class ClientData:
    x_train: torch.Tensor  # uint8, N x 3 x 32 x 32
    y_train: torch.Tensor  # int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    # The validation split (same label mix), for choosing hyperparameters; empty when
    # data.val_fraction is 0.
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    @property
    def num_train(self) -> int:
        return len(self.y_train)


@functools.lru_cache(maxsize=1)
def embedded_dir() -> Path:
    """The sample shipped in the package. A FAB (`flwr run .`) carries code and text only, so
    when this module runs from a FAB the sample is taken from the installed pfedes package."""
    here = Path(__file__).parent / "sample"
    if here.is_dir():
        return here
    import importlib.metadata
    import json as _json
    from urllib.parse import unquote, urlparse

    try:
        dist = importlib.metadata.distribution("pfedes")
    except importlib.metadata.PackageNotFoundError:
        return here
    installed = Path(str(dist.locate_file("pfedes/sample")))
    if installed.is_dir():
        return installed
    direct_url = dist.read_text("direct_url.json")  # editable install: the source tree
    if direct_url:
        source = Path(unquote(urlparse(_json.loads(direct_url).get("url", "")).path))
        if (source / "pfedes" / "sample").is_dir():
            return source / "pfedes" / "sample"
    return here


def resolve_data_dir(path: str) -> Path:
    """`embedded` or a directory with train.parquet and test.parquet; anything else is a DataError."""
    directory = embedded_dir() if path == EMBEDDED else Path(path).expanduser()
    if not directory.is_dir():
        raise DataError(f"data path '{path}' is not a directory (expected train.parquet and test.parquet in it)")
    for name in ("train.parquet", "test.parquet"):
        if not (directory / name).is_file():
            raise DataError(f"data path '{path}' has no {name} (expected train.parquet and test.parquet)")
    return directory.resolve()


def _offline_hub() -> None:
    """Keep Hugging Face's libraries off the network (the data is local Parquet): set before they
    are first imported, which reads it, unless the user has set it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


@functools.lru_cache(maxsize=4)
def load_split(path: str, split: str):
    """The `split` ("train" or "test") table of a data directory as a datasets.Dataset (in memory)."""
    _offline_hub()
    import datasets
    import pyarrow.parquet as pq

    file = resolve_data_dir(path) / f"{split}.parquet"
    try:
        table = pq.read_table(file)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise DataError(f"cannot read '{file}' as Parquet: {exc}") from None
    missing = {"img", "label"} - set(table.column_names)
    if missing:
        raise DataError(f"'{file}' lacks column(s) {sorted(missing)}: expected the Hugging Face "
                        "CIFAR-10 schema (img, label)")
    return datasets.Dataset(table)


def num_classes_of(dataset) -> int:
    feature = dataset.features["label"]
    names = getattr(feature, "names", None)
    return len(names) if names else int(max(dataset["label"])) + 1


def make_partitioner(partition: str, num_partitions: int, seed: int, classes_per_client: int = 2,
                     alpha: float = 0.3):
    _offline_hub()
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
def _partitioner(path: str, partition: str, num_partitions: int, seed: int, classes_per_client: int,
                 alpha: float):
    partitioner = make_partitioner(partition, num_partitions, seed, classes_per_client, alpha)
    labels = load_split(path, "train").select_columns(["label"])
    partitioner.dataset = labels.add_column("row", np.arange(len(labels)))
    return partitioner


def partition_indices(path: str, partition: str, num_partitions: int, partition_id: int, seed: int,
                      classes_per_client: int = 2, alpha: float = 0.3) -> np.ndarray:
    """Row indices of the train table that form partition `partition_id` (labels only are read)."""
    if not 0 <= partition_id < num_partitions:
        raise DataError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    partitioner = _partitioner(path, partition, num_partitions, seed, classes_per_client, float(alpha))
    with warnings.catch_warnings():  # flwr-datasets says it from every client; the server says it once
        warnings.filterwarnings("ignore", message=r"Classes: .* will NOT be used")
        return np.asarray(partitioner.load_partition(partition_id)["row"], dtype=np.int64)


def classes_in_no_partition(path: str, partition: str, num_partitions: int, seed: int,
                            classes_per_client: int = 2, alpha: float = 0.3) -> list[int]:
    """The classes of the train table that no partition holds (the pathological partition leaves
    some out when the clients' classes do not cover them all)."""
    labels = load_split(path, "train").data.column("label").to_numpy()
    held = set()
    for pid in range(num_partitions):
        rows = partition_indices(path, partition, num_partitions, pid, seed, classes_per_client, alpha)
        held.update(np.unique(labels[rows]).tolist())
    return sorted(set(np.unique(labels).tolist()) - held)


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


def decode_images(dataset, rows: np.ndarray) -> torch.Tensor:
    """Decode the `img` bytes of `rows` into a uint8 N x 3 x 32 x 32 tensor."""
    from PIL import Image

    column = dataset.data.column("img").take(rows).to_pylist() if len(rows) else []
    images = [np.asarray(Image.open(io.BytesIO(cell["bytes"])).convert("RGB")) for cell in column]
    if not images:
        return torch.zeros(0, 3, 32, 32, dtype=torch.uint8)
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()


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


def load_client_data(path: str, partition: str, num_partitions: int, partition_id: int, seed: int,
                     classes_per_client: int = 2, alpha: float = 0.3, samples_per_client: int = 0,
                     test_fraction: float = 0.2, cache_dir: str | Path | None = None,
                     val_fraction: float = 0.0) -> ClientData:
    """One client's local train/validation/test data, decoded once per process while the cache holds it
    (PFEDES_DATA_CACHE_MB, default 512 MB) and, with `cache_dir`, once per device: a deployed
    ClientApp is a new process per message, and re-partitioning and decoding the dataset would
    cost it seconds each time."""
    key = (path, partition, num_partitions, partition_id, seed, classes_per_client, float(alpha),
           samples_per_client, float(test_fraction), float(val_fraction))
    if cache_dir is None:
        return DECODED.get_or_load(key, lambda: _load_client_data(*key))
    return DECODED.get_or_load(key, lambda: _load_through_disk(key, Path(cache_dir)))


def _load_through_disk(key: tuple, cache_dir: Path) -> ClientData:
    """The decoded data from `cache_dir` if it was made from the same files with the same
    settings, else decoded and written there (atomically) for the next process."""
    import hashlib

    source = resolve_data_dir(key[0])
    stamp = [(name, (source / name).stat().st_size, (source / name).stat().st_mtime_ns)
             for name in ("train.parquet", "test.parquet")]
    digest = hashlib.sha256(repr((str(source), stamp, key[1:])).encode()).hexdigest()[:20]
    file = cache_dir / f"decoded-{digest}.pt"
    if file.is_file():
        try:
            return ClientData(**torch.load(file, map_location="cpu", weights_only=True))
        except Exception:  # a damaged cache file is rebuilt, never trusted
            file.unlink(missing_ok=True)
    from .client_state import atomic_torch_save

    data = _load_client_data(*key)
    atomic_torch_save(vars(data), file)
    return data


def _load_client_data(path: str, partition: str, num_partitions: int, partition_id: int, seed: int,
                      classes_per_client: int, alpha: float, samples_per_client: int,
                      test_fraction: float, val_fraction: float = 0.0) -> ClientData:
    train_table = load_split(path, "train")
    if num_partitions == 1:
        rows = np.arange(len(train_table))
    else:
        rows = partition_indices(path, partition, num_partitions, partition_id, seed,
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
    return ClientData(
        x_train=decode_images(train_table, rows[tr]), y_train=torch.from_numpy(labels[tr]),
        x_test=decode_images(train_table, rows[te]), y_test=torch.from_numpy(labels[te]),
        num_classes=num_classes_of(train_table),
        x_val=decode_images(train_table, rows[va]), y_val=torch.from_numpy(labels[va]),
    )


@functools.lru_cache(maxsize=2)
def load_unified_test(path: str, max_rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared test table (test.parquet), for global accuracy of methods with a global model."""
    table = load_split(path, "test")
    rows = np.arange(len(table) if not max_rows else min(max_rows, len(table)))
    labels = np.array(table.data.column("label").take(rows).to_numpy(), dtype=np.int64)  # a writable copy
    return decode_images(table, rows), torch.from_numpy(labels)


def to_input(x_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 images -> standardised float input."""
    return (x_uint8.float().div_(255.0) - CIFAR_MEAN) / CIFAR_STD


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
            train: bool, do_augment: bool):
    """Yield (input, label) batches; shuffled and augmented when `train`."""
    n = len(data_y)
    order = torch.randperm(n, generator=generator) if train else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        if train and len(idx) < 2 and n >= 2:
            continue  # a 1-sample batch breaks BatchNorm
        x = to_input(data_x[idx])
        if train and do_augment:
            x = augment(x, generator)
        yield x, data_y[idx]
