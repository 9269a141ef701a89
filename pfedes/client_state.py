"""Durable private client state: saved after every round with an atomic write, restored after
a ClientApp or SuperNode restart, and cached per process so an unchanged copy is not re-read.

A save bumps a version that the node also keeps in Flower's `context.state` (a few bytes); a
cached trainer is reused only if its version equals that one, otherwise the file wins. That is
what keeps simulation correct when a node's messages land on different Ray actors.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import OrderedDict
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common.logger import log

CACHE_SIZE = 16  # trainers kept in memory per process; the rest live on disk only


def atomic_torch_save(obj: Any, path: Path, durable: bool = True) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over `path`. Not
    `durable`: no fsync, for a cache whose reader rebuilds a file that a crash left damaged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def state_digest(state: Any) -> str:
    """sha256 over a nested state (mappings in key order, sequences, tensors and arrays with
    dtype and shape, scalars): equal digests mean bit-for-bit equal states. Tensors and numpy
    arrays with the same dtype, shape and bytes hash alike."""
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            value = (value.view(torch.int16) if value.dtype == torch.bfloat16 else value).numpy()
        if isinstance(value, np.ndarray):
            value = np.ascontiguousarray(value)
            digest.update(f"array {value.dtype.str} {value.shape}:".encode())
            digest.update(value.tobytes())
        elif isinstance(value, dict):
            digest.update(f"dict {len(value)}:".encode())
            for key in sorted(value, key=str):
                digest.update(f"{key!r}=".encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(f"seq {len(value)}:".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"{type(value).__name__} {value!r};".encode())

    feed(state)
    return digest.hexdigest()


class StateStore:
    """Per-process LRU of live trainers in front of one file per client."""

    def __init__(self, capacity: int = CACHE_SIZE) -> None:
        self.capacity = capacity
        self._cache: OrderedDict[tuple[str, str], tuple[int, Any]] = OrderedDict()

    def get(self, path: Path, version: int | None, build, run_token: str = ""):
        """The trainer for `path`: cached if at `version`, else loaded from disk, else `build()`.

        `run_token` names the training run (kept across client restarts and `resume=true`, new
        for a fresh run): a saved state of another run is left alone and training starts fresh."""
        key = (str(path), run_token)
        cached = self._cache.get(key)
        if cached is not None and version is not None and cached[0] == version:
            self._cache.move_to_end(key)
            return cached[1], version
        trainer = build()
        saved_version = 0
        if path.is_file():
            saved = torch.load(path, map_location="cpu", weights_only=False)
            if saved.get("run_token", "") == run_token:
                trainer.load_state_dict(saved["trainer"])
                saved_version = int(saved["version"])
                log(INFO, "[pfedes] restored private state v%d from %s (digest %s)", saved_version,
                    path, state_digest(trainer.state_dict()))
            else:
                log(INFO, "[pfedes] %s belongs to another run: starting from a fresh model", path)
        self._remember(key, saved_version, trainer)
        return trainer, saved_version

    def save(self, path: Path, trainer, version: int, run_token: str = "") -> None:
        atomic_torch_save({"version": version, "run_token": run_token, "trainer": trainer.state_dict()},
                          path)
        self._remember((str(path), run_token), version, trainer)

    def forget(self, path: Path, run_token: str = "") -> None:
        """Drop the live trainer of `path`: a message that failed after changing it (a training
        that diverged) must not hand its half-updated state to the next message, which then loads
        the saved state, as a fresh ClientApp process in a deployment does."""
        self._cache.pop((str(path), run_token), None)

    def _remember(self, key: tuple[str, str], version: int, trainer) -> None:
        self._cache[key] = (version, trainer)
        self._cache.move_to_end(key)
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
