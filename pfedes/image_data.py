"""Where a run's images come from, read as one (img, label) table per split, and what the models
must know about them (`ImageFormat`).

A data path is one of:

- `embedded`: the small CIFAR-10 sample shipped in this package;
- a local directory of Parquet files in the Hugging Face schema, any column names; its splits
  are found by `datasets`' file-name patterns (`train*`, `test*`, ...; one unnamed file is train);
- an image folder, `root/<class name>/<image>` (optionally `root/train/...` and `root/test/...`),
  read by `datasets`' `imagefolder` builder;
- a Hugging Face hub dataset name (`owner/name`), read by `datasets.load_dataset`; online only.

Columns: the image column is the one `Image` feature, else the one struct column with `bytes`;
the label column is the one `ClassLabel`, else the one integer column; `data.image_column` and
`data.label_column` name them instead. A validation split stands in for a missing test split;
without either, `HOLDOUT_FRACTION` of the train
rows are held out as the test split by `datasets`' `train_test_split` with seed `HOLDOUT_SEED`
(fixed, not the run's seed, so every run and every node holds out the same rows).

Unreadable images (PIL cannot open them) are dropped when the table is read, with one warning
that counts them; a Parquet file or split of nothing but unreadable images is a DataError.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Any

import numpy as np
import torch

EMBEDDED = "embedded"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
HOLDOUT_FRACTION = 0.2
HOLDOUT_SEED = 0
STATS_SAMPLE = 1024  # training images the normalisation statistics are computed from (evenly spaced)
MIN_SIDE = 16  # the smallest side the models take
GRAYSCALE_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

logger = logging.getLogger(__name__)


class DataError(ValueError):
    """A data path or data setting that cannot be used; the message names it."""


@dataclass(frozen=True)
class DataSource:
    """A data path and the data settings that decide how it is read (hashable: a cache key)."""

    path: str
    image_column: str | None = None
    label_column: str | None = None
    image_size: tuple[int, int] | None = None  # (height, width) to resize to; None keeps the images'

    @classmethod
    def from_cfg(cls, data_cfg: dict[str, Any], path: str | None = None) -> DataSource:
        """The experiment's `data` settings, read from `path` instead of data.path when given
        (a SuperNode's own data-path)."""
        return cls(str(data_cfg["path"] if path is None else path), data_cfg.get("image_column") or None,
                   data_cfg.get("label_column") or None, image_size_pair(data_cfg.get("image_size")))


def as_source(source: DataSource | str) -> DataSource:
    return source if isinstance(source, DataSource) else DataSource(str(source))


def image_size_pair(value) -> tuple[int, int] | None:
    """data.image_size (null, an int, or [height, width]) -> (height, width) or None."""
    if value is None:
        return None
    if isinstance(value, int):
        return (value, value)
    height, width = (int(v) for v in value)
    return (height, width)


@dataclass(frozen=True)
class ImageFormat:
    """What a model's input looks like: channels x height x width, and the per-channel mean and
    std (of pixels in [0, 1]) it is standardised with. The default is 3 x 32 x 32 with no
    standardisation (the statistics come from the data: `image_format`)."""

    channels: int = 3
    height: int = 32
    width: int = 32
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)

    @property
    def size(self) -> tuple[int, int]:
        return (self.height, self.width)


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


def is_hub_name(path: str) -> bool:
    """A name such as `uoft-cs/cifar10` that is no local path."""
    return (path != EMBEDDED and not Path(path).expanduser().exists() and not path.startswith((".", "~"))
            and HUB_NAME.match(path) is not None)


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def layout_of(path: str) -> str:
    """`parquet`, `imagefolder` or `hub`; a path that is none of them is a DataError."""
    if path == EMBEDDED:
        return "parquet"
    directory = Path(path).expanduser()
    if directory.is_dir():
        files = [f for f in directory.rglob("*") if f.is_file() and not f.name.startswith(".")]
        if any(f.suffix == ".parquet" for f in files):
            return "parquet"
        if any(f.suffix.lower() in IMAGE_SUFFIXES for f in files):
            return "imagefolder"
        raise DataError(f"data path '{path}' holds neither Parquet files nor images "
                        f"(expected *.parquet, or <class name>/<image> folders)")
    if is_hub_name(path):
        return "hub"
    raise DataError(f"data path '{path}' is not a directory (expected Parquet files or an image folder "
                    "in it), nor a Hugging Face hub dataset name")


def resolve_data_dir(path: str) -> Path:
    """The local directory of a data path (`embedded` or a directory of Parquet files or
    images); a hub name offline, or any other path, is a DataError."""
    layout = layout_of(path)
    if layout == "hub":
        if hub_offline():
            raise DataError(offline_message(path))
        raise DataError(f"data path '{path}' is a hub dataset, not a local directory")
    return (embedded_dir() if path == EMBEDDED else Path(path).expanduser()).resolve()


def offline_message(path: str) -> str:
    return (f"data path '{path}' is not a local directory, and as a Hugging Face hub dataset it needs the "
            "network, but this machine is offline (HF_HUB_OFFLINE is set): download it where there is a "
            "network and pass its local directory")


def source_stamp(path: str) -> tuple:
    """What identifies the data's content cheaply: the directory and every file's name, size and
    modification time in nanoseconds (local), or the hub name. Every new ClientApp process of a
    deployment checks it (the decoded-data cache, data.py), so it is one walk of the directory, one
    stat per file and no file's bytes: any write changes a file's mtime, and hashing the bytes would
    cost a read of the whole dataset per process (docs/deployment.md, section 6)."""
    if path != EMBEDDED and not Path(path).expanduser().is_dir():
        if is_hub_name(path):
            return (path,)
        resolve_data_dir(path)  # the DataError that names the path
    root = str((embedded_dir() if path == EMBEDDED else Path(path).expanduser()).resolve())
    files = []
    for directory, _, names in os.walk(root):  # as Path.rglob: symlinked directories are not entered
        for name in names:
            file = os.path.join(directory, name)
            try:
                stat = os.stat(file)
            except OSError:  # a dangling link: no file
                continue
            if S_ISREG(stat.st_mode):
                files.append((os.path.relpath(file, root), stat.st_size, stat.st_mtime_ns))
    return (root, tuple(sorted(files)))


# -- reading a layout into datasets.Dataset splits ---------------------------------------------

def _quiet_datasets() -> None:
    """No progress bars, and no retry notices: a failure is one DataError line."""
    import datasets
    from huggingface_hub.utils import logging as hub_logging

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    hub_logging.set_verbosity_error()


def _read_parquet_dir(directory: Path, label: str) -> dict[str, list]:
    """Split name -> list of (file, datasets.Dataset), one per Parquet file, split names found by
    `datasets`' own file-name patterns."""
    import datasets
    import pyarrow.parquet as pq
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        files = DataFilesDict.from_patterns(get_data_patterns(str(directory)), str(directory),
                                            allowed_extensions=[".parquet"])
    except Exception as exc:  # datasets raises its own types for a layout it cannot split
        raise DataError(f"data path '{label}': cannot find its splits: {exc}") from None
    splits: dict[str, list] = {}
    for split, names in files.items():
        for name in names:
            file = Path(name)
            try:
                table = pq.read_table(file)
            except Exception as exc:  # pyarrow raises several types for a bad file
                raise DataError(f"cannot read '{file}' as Parquet: {exc}") from None
            splits.setdefault(str(split), []).append((file, datasets.Dataset(table, fingerprint=_fingerprint(file))))
    if not splits:
        raise DataError(f"data path '{label}' has no Parquet files")
    return splits


def _read_image_folder(directory: Path, label: str) -> dict[str, list]:
    import datasets

    try:
        loaded = datasets.load_dataset("imagefolder", data_dir=str(directory))
    except Exception as exc:  # the builder's own errors, e.g. an empty split
        raise DataError(f"data path '{label}': cannot read it as an image folder: {exc}") from None
    return {str(split): [(directory / str(split), ds)] for split, ds in loaded.items()}


def _read_hub(name: str) -> dict[str, list]:
    if hub_offline():
        raise DataError(offline_message(name))
    import datasets

    try:
        loaded = datasets.load_dataset(name)
    except Exception as exc:  # no network, no such dataset, no access: one line either way
        raise DataError(f"data path '{name}': cannot load it from the Hugging Face hub "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(loaded, datasets.DatasetDict):
        raise DataError(f"data path '{name}': the hub dataset has no splits")
    return {str(split): [(Path(name), ds)] for split, ds in loaded.items()}


def image_column_of(dataset, override: str | None, label: str) -> str:
    """The one Image feature, else the one struct column with `bytes`, else `override`."""
    import datasets
    import pyarrow as pa

    if override:
        if override not in dataset.column_names:
            raise DataError(f"data.image_column '{override}' is not a column of '{label}' "
                            f"(columns: {dataset.column_names})")
        return override
    images = [c for c, f in dataset.features.items() if isinstance(f, datasets.Image)]
    if not images:
        schema = dataset.data.schema
        images = [c for c in dataset.column_names
                  if pa.types.is_struct(schema.field(c).type) and schema.field(c).type.get_field_index("bytes") >= 0]
    if len(images) == 1:
        return images[0]
    if not images:
        raise DataError(f"'{label}' has no image column (no Image feature, no column of image bytes; "
                        f"columns: {dataset.column_names}): set data.image_column")
    raise DataError(f"'{label}' has {len(images)} image columns {images}: set data.image_column to one")


def label_column_of(dataset, image_column: str, override: str | None, label: str) -> str:
    """The one ClassLabel feature, else the one integer column, else `override`."""
    import datasets
    import pyarrow as pa

    schema = dataset.data.schema
    if override:
        if override not in dataset.column_names:
            raise DataError(f"data.label_column '{override}' is not a column of '{label}' "
                            f"(columns: {dataset.column_names})")
        candidates = [override]
    else:
        candidates = [c for c, f in dataset.features.items() if isinstance(f, datasets.ClassLabel)]
        if not candidates:
            candidates = [c for c in dataset.column_names
                          if c != image_column and pa.types.is_integer(schema.field(c).type)]
    if len(candidates) > 1:
        raise DataError(f"'{label}' has {len(candidates)} candidate label columns {candidates}: "
                        "set data.label_column to one")
    if candidates and (isinstance(dataset.features[candidates[0]], datasets.ClassLabel)
                       or pa.types.is_integer(schema.field(candidates[0]).type)):
        return candidates[0]
    strings = candidates or [c for c in dataset.column_names if c != image_column
                             and (pa.types.is_string(schema.field(c).type)
                                  or pa.types.is_large_string(schema.field(c).type))]
    if strings:
        raise DataError(f"'{label}': labels in column '{strings[0]}' are {schema.field(strings[0]).type}, "
                        "not class ids, and it is no ClassLabel: store it as a ClassLabel "
                        "(datasets' class_encode_column) or as integers")
    raise DataError(f"'{label}' has no label column (no ClassLabel, no integer column; columns: "
                    f"{dataset.column_names}): set data.label_column")


def open_image(cell: dict):
    """A PIL image from an image cell ({bytes, path})."""
    from PIL import Image

    if cell is None:
        raise ValueError("no image")
    if cell.get("bytes") is not None:
        return Image.open(io.BytesIO(cell["bytes"]))
    return Image.open(cell["path"])


def _headers(cells: list) -> list:
    """(mode, (width, height)) of each image cell, or None for one PIL cannot open."""
    out = []
    for cell in cells:
        try:
            with open_image(cell) as image:
                out.append((image.mode, image.size))
        except Exception:  # PIL raises many types for unreadable bytes
            out.append(None)
    return out


def _fingerprint(*parts) -> str:
    """A datasets fingerprint from what identifies a table here (datasets would hash the table)."""
    import hashlib

    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


@dataclass
class Split:
    """One split as the rest of the package reads it: `dataset` has columns img and label (int64),
    unreadable rows dropped; `modes` and `sizes` of its images, read from their headers."""

    dataset: Any
    modes: list
    sizes: list
    class_names: list | None


def _standardise(dataset, source: DataSource, label: str, split_name: str):
    """(img, label) columns, readable rows only, plus the headers of those images."""
    import pyarrow as pa

    image_col = image_column_of(dataset, source.image_column, label)
    label_col = label_column_of(dataset, image_col, source.label_column, label)
    names = getattr(dataset.features[label_col], "names", None)
    table = dataset.data.table
    cells = table.column(image_col).to_pylist()
    headers = _headers(cells)
    readable = [i for i, h in enumerate(headers) if h is not None]
    if not readable:
        raise DataError(f"none of the {len(cells)} images of '{label}' ({split_name}) can be read")
    if len(readable) < len(cells):
        first = next(i for i, h in enumerate(headers) if h is None)
        logger.warning("[pfedes] skipped %d unreadable image(s) of %d in '%s' (%s), first at row %d",
                       len(cells) - len(readable), len(cells), label, split_name, first)
    labels = table.column(label_col)
    out = pa.table({"img": table.column(image_col), "label": labels.cast(pa.int64())})
    if len(readable) < len(cells):
        out = out.take(pa.array(readable))
    if out.column("label").null_count:
        raise DataError(f"'{label}' ({split_name}): {out.column('label').null_count} rows have no label")
    kept = [headers[i] for i in readable]
    return out, [h[0] for h in kept], [h[1] for h in kept], names


@functools.lru_cache(maxsize=4)
def read_splits(source: DataSource) -> dict[str, Split]:
    """The source's train and test splits (the test split held out of train when there is none)."""
    import datasets
    import pyarrow as pa

    _quiet_datasets()
    layout = layout_of(source.path)
    if layout == "hub":
        raw = _read_hub(source.path)
    else:
        directory = resolve_data_dir(source.path)
        reader = _read_parquet_dir if layout == "parquet" else _read_image_folder
        raw = reader(directory, source.path)
    if "test" not in raw and "validation" in raw:
        raw["test"] = raw.pop("validation")
    if "train" not in raw:
        if len(raw) != 1:
            raise DataError(f"data path '{source.path}' has splits {sorted(raw)} but none named train")
        raw = {"train": next(iter(raw.values()))}
    if layout == "imagefolder" and all("label" not in ds.column_names for _, ds in raw["train"]) \
            and source.label_column is None:
        raise DataError(f"image folder '{source.path}' has one class folder (or none): expected "
                        "<class name>/<image> folders for two or more classes")
    splits: dict[str, Split] = {}
    for split in ("train", "test"):
        if split not in raw:
            continue
        parts = [_standardise(ds, source, str(file), split) for file, ds in raw[split]]
        table = pa.concat_tables([p[0] for p in parts])
        splits[split] = Split(datasets.Dataset(table, fingerprint=_fingerprint(source, split)),
                              [m for p in parts for m in p[1]], [s for p in parts for s in p[2]], parts[0][3])
    train = splits["train"]
    classes = np.unique(train.dataset.data.column("label").to_numpy())
    if len(classes) < 2:
        raise DataError(f"data path '{source.path}' has a single class ({classes.tolist()}) in its train "
                        "split: classification needs two or more")
    if (classes < 0).any():
        raise DataError(f"data path '{source.path}' has negative labels {classes[classes < 0].tolist()}")
    if "test" not in splits:
        splits["train"], splits["test"] = _hold_out(train, source)
    return splits


def _hold_out(train: Split, source: DataSource) -> tuple[Split, Split]:
    """(train, test): HOLDOUT_FRACTION of the rows drawn by datasets' train_test_split (seed
    HOLDOUT_SEED) as the test split."""
    import datasets

    numbered = train.dataset.add_column("row", np.arange(len(train.dataset)),
                                        new_fingerprint=_fingerprint(source, "numbered"))
    parts = numbered.train_test_split(test_size=HOLDOUT_FRACTION, seed=HOLDOUT_SEED,
                                      train_new_fingerprint=_fingerprint(source, "held-in"),
                                      test_new_fingerprint=_fingerprint(source, "held-out"))
    out = []
    for name in ("train", "test"):
        rows = np.asarray(parts[name]["row"], dtype=np.int64)
        table = train.dataset.data.table.take(rows)
        out.append(Split(datasets.Dataset(table, fingerprint=_fingerprint(source, name, "held")),
                         [train.modes[i] for i in rows], [train.sizes[i] for i in rows], train.class_names))
    return out[0], out[1]


# -- what the models need to know ----------------------------------------------------------------

def _channels(modes: list) -> int:
    return 1 if all(m in GRAYSCALE_MODES for m in modes) else 3


def image_format(source: DataSource | str) -> ImageFormat:
    """The source's ImageFormat (a bare path: read with the default settings)."""
    return _image_format(as_source(source))


@functools.lru_cache(maxsize=4)
def _image_format(source: DataSource) -> ImageFormat:
    """Channels (1 when every image is grayscale, else 3: RGBA and palettes become RGB), size
    (data.image_size, else the images' own, which must then be one size), and the per-channel
    mean and std of up to STATS_SAMPLE training images, evenly spaced, as the models see them."""
    splits = read_splits(source)
    modes = splits["train"].modes + splits["test"].modes
    channels = _channels(modes)
    if source.image_size is not None:
        height, width = source.image_size
    else:
        sizes = sorted(set(splits["train"].sizes + splits["test"].sizes))
        if len(sizes) > 1:
            raise DataError(f"the images of '{source.path}' have {len(sizes)} sizes (e.g. {sizes[0][1]}x{sizes[0][0]} "
                            f"and {sizes[-1][1]}x{sizes[-1][0]}, height x width): set data.image_size to resize them")
        width, height = sizes[0]
    if min(height, width) < MIN_SIDE:
        raise DataError(f"the images of '{source.path}' are {height}x{width}: the models need at least "
                        f"{MIN_SIDE}x{MIN_SIDE}; set data.image_size")
    unscaled = ImageFormat(channels, height, width, (0.0,) * channels, (1.0,) * channels)
    train = splits["train"].dataset
    rows = np.unique(np.linspace(0, len(train) - 1, min(STATS_SAMPLE, len(train))).astype(np.int64))
    pixels, _ = decode_cells(train.data.column("img").take(rows).to_pylist(), unscaled)
    pixels = pixels.float().div_(255.0).transpose(0, 1).reshape(channels, -1)
    mean = pixels.mean(1)
    std = pixels.std(1).clamp_min(1e-3)  # a constant channel is left unscaled, not divided by zero
    return ImageFormat(channels, height, width, tuple(round(float(v), 6) for v in mean),
                       tuple(round(float(v), 6) for v in std))


def decode_cells(cells: list, fmt: ImageFormat) -> tuple[torch.Tensor, np.ndarray]:
    """Image cells -> (uint8 N x C x H x W tensor of those that decode, boolean mask of which did):
    converted to L or RGB and resized (bilinear) to the format's size where they differ."""
    from PIL import Image

    mode = "L" if fmt.channels == 1 else "RGB"
    images, ok = [], np.zeros(len(cells), dtype=bool)
    for i, cell in enumerate(cells):
        try:
            with open_image(cell) as image:
                image = image.convert(mode)
                if image.size != (fmt.width, fmt.height):
                    image = image.resize((fmt.width, fmt.height), Image.BILINEAR)
                array = np.asarray(image, dtype=np.uint8)
        except Exception:  # a header that opens but bytes that do not decode: skipped
            continue
        images.append(array.reshape(fmt.height, fmt.width, fmt.channels))
        ok[i] = True
    if not images:
        return torch.zeros(0, fmt.channels, fmt.height, fmt.width, dtype=torch.uint8), ok
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous(), ok
