"""Small image datasets written by the tests themselves (no download), in every layout that
data.path takes: Parquet with Hugging Face features, plain Parquet, and an image folder."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def make_images(n: int, num_classes: int, size: tuple[int, int], mode: str, seed: int = 0):
    """`n` images of `size` (height, width) in PIL `mode`, labels cycling over the classes; each
    class has its own mean colour, so the task can be learnt."""
    rng = np.random.default_rng(seed)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    labels = [i % num_classes for i in range(n)]
    images = []
    for label in labels:
        base = (np.array([37, 91, 151, 211])[:channels] * (label + 1)) % 200 + 20
        pixels = np.clip(base + rng.normal(0, 20, (*size, channels)), 0, 255).astype(np.uint8)
        images.append(Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode))
    return images, labels


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def write_hf_parquet(path: Path, images, labels, num_classes: int, image_column: str = "picture",
                     label_column: str = "digit", **extra_columns) -> Path:
    """One Parquet file with the Hugging Face features (Image, ClassLabel) in its schema metadata."""
    import datasets

    features = datasets.Features({image_column: datasets.Image(),
                                  label_column: datasets.ClassLabel(names=[f"c{i}" for i in range(num_classes)]),
                                  **{k: datasets.Value("string") for k in extra_columns}})
    table = {image_column: [{"bytes": png_bytes(im), "path": None} for im in images], label_column: labels,
             **extra_columns}
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(table, features=features).to_parquet(str(path))
    return path


def write_plain_parquet(path: Path, cells: list, columns: dict) -> Path:
    """One Parquet file without Hugging Face metadata: `cells` as an {bytes, path} struct column
    named "photo" (None: no image column), and other columns as given."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = dict(columns)
    if cells is not None:
        data["photo"] = pa.array([{"bytes": c, "path": None} for c in cells],
                                 pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data), path)
    return path


def write_image_folder(root: Path, images, labels, split: str | None = None, suffix: str = "png") -> Path:
    """root/[split/]<class name>/<i>.<suffix>"""
    for i, (image, label) in enumerate(zip(images, labels)):
        folder = root / split if split else root
        (folder / f"class{label:03d}").mkdir(parents=True, exist_ok=True)
        image.save(folder / f"class{label:03d}" / f"{i}.{suffix}")
    return root


def gray28(root: Path, layout: str, n: int = 120) -> Path:
    """A 28x28 grayscale, 10-class dataset in `layout` (hf_parquet | plain_parquet | imagefolder)."""
    images, labels = make_images(n, 10, (28, 28), "L", seed=1)
    test_images, test_labels = make_images(40, 10, (28, 28), "L", seed=2)
    if layout == "hf_parquet":
        write_hf_parquet(root / "train.parquet", images, labels, 10)
        write_hf_parquet(root / "test.parquet", test_images, test_labels, 10)
    elif layout == "plain_parquet":
        write_plain_parquet(root / "train.parquet", [png_bytes(im) for im in images], {"y": labels})
        write_plain_parquet(root / "test.parquet", [png_bytes(im) for im in test_images], {"y": test_labels})
    else:
        write_image_folder(root, images, labels, "train")
        write_image_folder(root, test_images, test_labels, "test")
    return root


def rgb64(root: Path, layout: str, n: int = 300) -> Path:
    """A 64x64 RGB, 100-class dataset in `layout`, one split only (the test split is held out)."""
    images, labels = make_images(n, 100, (64, 64), "RGB", seed=3)
    if layout == "hf_parquet":
        write_hf_parquet(root / "data.parquet", images, labels, 100, image_column="image", label_column="fine_label")
    elif layout == "plain_parquet":
        write_plain_parquet(root / "data.parquet", [png_bytes(im) for im in images], {"fine": labels})
    else:
        write_image_folder(root, images, labels, suffix="jpg")
    return root
