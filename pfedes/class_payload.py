"""Per-class payloads: what prototype and distillation methods send instead of weights.

A payload is a set of arrays: `class.<c>` (float32, length `dim`: the mean of one per-sample
output, e.g. a prototype or the logits, over the sender's samples of class c) for each class the
sender has, plus `counts` (int64, one entry per class: the number of samples behind each mean;
0 = the class is absent and has no `class.<c>`). A client sends its local means; the server
sends back the count-weighted means over the clients (and the summed counts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from .data import ImageFormat, batches
from .validation import arrays_problem

COUNTS_KEY = "counts"
CLASS_PREFIX = "class."
MEAN_DTYPE = np.float32
COUNT_DTYPE = np.int64


def class_key(label: int) -> str:
    return f"{CLASS_PREFIX}{label}"


def expected_payload(counts: np.ndarray, dim: int) -> dict[str, np.ndarray]:
    """Zero arrays with exactly the keys, shapes and dtypes that a payload with `counts` has."""
    expected = {COUNTS_KEY: np.zeros(counts.shape, COUNT_DTYPE)}
    for label in np.flatnonzero(counts):
        expected[class_key(int(label))] = np.zeros(dim, MEAN_DTYPE)
    return expected


def counts_problem(arrays: Mapping[str, np.ndarray], num_classes: int) -> str | None:
    """Why the `counts` array of a payload is unusable, or None."""
    counts = arrays.get(COUNTS_KEY)
    if counts is None:
        return f"no '{COUNTS_KEY}' array (a per-class payload needs one)"
    if counts.shape != (num_classes,):
        return f"'{COUNTS_KEY}' has shape {counts.shape}, expected ({num_classes},)"
    if counts.dtype != COUNT_DTYPE:
        return f"'{COUNTS_KEY}' has dtype {counts.dtype}, expected {np.dtype(COUNT_DTYPE)}"
    if (counts < 0).any():
        return f"'{COUNTS_KEY}' holds negative counts"
    if counts.sum() == 0:
        return f"'{COUNTS_KEY}' is all zero: the payload holds no class"
    return None


def payload_problem(arrays: Mapping[str, np.ndarray], num_classes: int, dim: int) -> str | None:
    """Why `arrays` is not a valid per-class payload (keys, shapes, dtypes, finiteness), or None."""
    problem = counts_problem(arrays, num_classes)
    if problem:
        return problem
    return arrays_problem(arrays, expected_payload(arrays[COUNTS_KEY], dim))


def decode(arrays: Mapping[str, np.ndarray]) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """(label -> mean, counts) of a payload that `payload_problem` accepted."""
    means = {int(k[len(CLASS_PREFIX):]): np.asarray(v) for k, v in arrays.items() if k != COUNTS_KEY}
    return means, np.asarray(arrays[COUNTS_KEY])


def weighted_class_average(payloads: list[tuple[dict[int, np.ndarray], np.ndarray]]) -> dict[str, np.ndarray]:
    """Per class, the mean over senders weighted by each sender's count of that class:
    mean_c = sum_k n_kc * m_kc / sum_k n_kc; counts_c = sum_k n_kc (computed in float64)."""
    total = np.sum([counts for _, counts in payloads], axis=0).astype(COUNT_DTYPE)
    out = {COUNTS_KEY: total}
    for label in np.flatnonzero(total):
        weighted = sum(counts[label] * means[label].astype(np.float64)
                       for means, counts in payloads if counts[label] > 0)
        out[class_key(int(label))] = (weighted / total[label]).astype(MEAN_DTYPE)
    return out


@torch.no_grad()
def local_class_means(output: Callable[[torch.Tensor], torch.Tensor], x_uint8: torch.Tensor,
                      labels: torch.Tensor, num_classes: int, fmt: ImageFormat, batch_size: int = 256,
                      device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """A client's payload: the per-class mean of `output(x)` over its samples (no augmentation).
    `output` runs on `device`; the means are summed, and returned, on the CPU."""
    sums, counts = None, torch.zeros(num_classes, dtype=torch.int64)
    for x, y in batches(x_uint8, labels, batch_size, None, train=False, do_augment=False, fmt=fmt):
        out = output(x.to(device)).double().cpu()
        if sums is None:
            sums = torch.zeros(num_classes, out.shape[1], dtype=torch.float64)
        sums.index_add_(0, y, out)
        counts += torch.bincount(y, minlength=num_classes)
    if sums is None:
        raise ValueError("no local samples to compute per-class means from")
    payload = {COUNTS_KEY: counts}
    for label in torch.nonzero(counts).flatten().tolist():
        payload[class_key(label)] = (sums[label] / counts[label]).float()
    return payload


def global_means(arrays: Mapping[str, torch.Tensor], num_classes: int, dim: int) -> dict[int, torch.Tensor]:
    """The server's per-class means for a client to use (empty before the first aggregation);
    a payload that does not fit raises ValueError naming the problem."""
    if not arrays:
        return {}
    as_numpy = {k: v.detach().cpu().numpy() for k, v in arrays.items()}
    problem = payload_problem(as_numpy, num_classes, dim)
    if problem:
        raise ValueError(f"server per-class payload: {problem}")
    means, _ = decode(as_numpy)
    return {label: torch.from_numpy(m) for label, m in means.items()}
