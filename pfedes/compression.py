"""Compressed payloads, for every strategy (`compression.*`): what a client's train reply carries
(the upload) and what the server's train and evaluate messages carry (the downlink).

Upload. A client encodes the entries it sends; the server decodes each reply before validating it
like any other (a malformed encoding drops the reply with a warning naming the node and the
reason). The bytes in the run log are those of the encoded arrays in the message. Options, combinable:

- `quantize`: `fp16`; `int8`, per-tensor affine (value = code * scale + zero, codes 0..255);
  `int8_channel`, the same per slice along the first axis of a dense array of 2+ dimensions;
- `delta`: send u = value - reference, the change from what the server sent this round;
- `topk` < 1: send only that fraction of u's entries, the largest in magnitude (implies `delta`),
  with a bit mask saying where they go;
- `error_feedback` (with `delta` or `topk`): what was not sent, the dropped entries and the
  quantization error, is kept on the client and added to the next round's u. It is private state,
  saved with the trainer, so it survives a restart.

Entries that are not floating point (counters, class counts) travel as they are. An entry without
a reference (not among what the server sent this round) is sent densely, never as a change.

Downlink (`downlink`: `fp16`, `int8`, `int8_channel`): the server quantizes the arrays it sends,
once per round, with the same `Codec` (a dense encoding, no reference); the client decodes them
before anything reads them. Only the message copy is quantized: the server's arrays (and its
momentum) stay as they are, the change a compressed upload sends is measured from what the client
decoded, and a reply that trains the sent arrays further is moved onto the server's own arrays by
`onto_server_arrays`. Delta and top-k do not apply to the downlink: the server would need each
client's last received copy. Decoded floating entries are float32.

Encoded names, for an entry `k`: `k|v` the values (float32, float16 or uint8 codes), `k|q` the
int8 parameters (float32, shape (2, c): scale and zero per slice), `k|mask` the top-k positions
(np.packbits of a boolean mask over the entry's flat elements).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .settings import Section

SEP = "|"
QUANTIZE = ("none", "fp16", "int8", "int8_channel")
VALUE_DTYPE = {"none": np.float32, "fp16": np.float16, "int8": np.uint8, "int8_channel": np.uint8}
LEVELS = 255.0


class EncodingError(ValueError):
    """A payload (a reply, or a message of the server) whose encoding does not follow the run's
    compression settings."""


def _floating(value: np.ndarray) -> bool:
    return value.dtype.kind == "f"


@dataclass(frozen=True)
class Codec:
    quantize: str = "none"
    topk: float = 1.0
    delta: bool = False
    error_feedback: bool = True

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any]) -> Codec:
        """The run's codec; a bad setting raises ValueError naming it."""
        c = Section(cfg, "compression")
        return cls(c.choice("quantize", "none", QUANTIZE), c.number("topk", 1.0, "in (0, 1]", lambda v: 0 < v <= 1),
                   c.flag("delta", False), c.flag("error_feedback", True))

    @classmethod
    def downlink_from_cfg(cls, cfg: Mapping[str, Any]) -> Codec:
        """The codec of the server's messages: `compression.downlink`'s quantization, dense."""
        return cls(Section(cfg, "compression").choice("downlink", "none", QUANTIZE))

    @property
    def active(self) -> bool:
        return self.quantize != "none" or self.sends_change

    @property
    def sends_change(self) -> bool:
        return self.delta or self.topk < 1.0

    # -- client side ---------------------------------------------------------------------------
    def encode(self, values: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
               residual: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(the arrays to send, the new residual). `reference`: the entries as the server sent them
        this round; `residual`: what error feedback carried over from earlier rounds."""
        out: dict[str, np.ndarray] = {}
        kept: dict[str, np.ndarray] = {}
        for key, value in values.items():
            value = np.asarray(value)
            if not _floating(value):
                out[key] = value
                continue
            ref = reference.get(key)
            change = self.sends_change and ref is not None and np.shape(ref) == value.shape
            u = value.astype(np.float32) - (np.asarray(ref, np.float32) if change else 0.0)
            if change and self.error_feedback and key in residual and np.shape(residual[key]) == u.shape:
                u = u + residual[key]
            mask = None
            if change and self.topk < 1.0:
                mask = top_mask(u, self.topk)
                out[key + SEP + "mask"] = np.packbits(mask.ravel())
                sent = u.ravel()[mask.ravel()]
            else:
                sent = u
            encoded = self._quantize(sent)
            out.update({f"{key}{SEP}{part}": arr for part, arr in encoded.items()})
            if change and self.error_feedback:
                kept[key] = u - self._expand(self._dequantize(encoded, sent.shape), mask, u.shape)
        return out, kept

    def _quantize(self, x: np.ndarray) -> dict[str, np.ndarray]:
        if self.quantize == "none":
            return {"v": x.astype(np.float32)}
        if self.quantize == "fp16":
            return {"v": x.astype(np.float16)}
        per_channel = self.quantize == "int8_channel" and x.ndim >= 2
        rows = x.reshape(x.shape[0], -1) if per_channel else x.reshape(1, -1)
        low = rows.min(axis=1) if rows.size else np.zeros(len(rows), np.float32)
        high = rows.max(axis=1) if rows.size else np.zeros(len(rows), np.float32)
        scale = np.where(high > low, (high - low) / LEVELS, 1.0).astype(np.float32)
        codes = np.rint((rows - low[:, None]) / scale[:, None]).clip(0, LEVELS).astype(np.uint8)
        return {"v": codes.reshape(x.shape), "q": np.stack([scale, low.astype(np.float32)])}

    def _dequantize(self, encoded: Mapping[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        values = encoded["v"]
        if self.quantize in ("none", "fp16"):
            return values.astype(np.float32).reshape(shape)
        scale, zero = encoded["q"]
        rows = values.reshape(len(scale), -1).astype(np.float32)
        return (rows * scale[:, None] + zero[:, None]).reshape(shape)

    @staticmethod
    def _expand(sent: np.ndarray, mask: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
        if mask is None:
            return sent.reshape(shape)
        dense = np.zeros(int(np.prod(shape)), np.float32)
        dense[mask.ravel()] = sent
        return dense.reshape(shape)

    # -- server side ---------------------------------------------------------------------------
    def decode(self, arrays: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The entries a client meant to send; EncodingError names what does not fit."""
        groups: dict[str, dict[str, np.ndarray]] = {}
        out: dict[str, np.ndarray] = {}
        for name, arr in arrays.items():
            key, sep, part = name.rpartition(SEP)
            if not sep:
                if _floating(np.asarray(arr)):
                    raise EncodingError(f"'{name}' is sent as raw floats, but the run's compression encodes them")
                out[name] = np.asarray(arr)
                continue
            if part not in ("v", "q", "mask"):
                raise EncodingError(f"'{name}': unknown part '{part}'")
            groups.setdefault(key, {})[part] = np.asarray(arr)
        for key, parts in groups.items():
            if key in out:
                raise EncodingError(f"'{key}' is sent both raw and encoded")
            out[key] = self._decode_entry(key, parts, reference.get(key))
        return out

    def _decode_entry(self, key: str, parts: Mapping[str, np.ndarray], ref: np.ndarray | None) -> np.ndarray:
        int8 = self.quantize in ("int8", "int8_channel")
        change = self.sends_change and ref is not None and _floating(np.asarray(ref))
        sparse = change and self.topk < 1.0
        wanted = {"v"} | ({"q"} if int8 else set()) | ({"mask"} if sparse else set())
        if set(parts) != wanted:
            raise EncodingError(f"'{key}' has parts {sorted(parts)}, the run's compression sends {sorted(wanted)}")
        values = parts["v"]
        if values.dtype != VALUE_DTYPE[self.quantize]:
            raise EncodingError(f"'{key}|v' has dtype {values.dtype}, expected {np.dtype(VALUE_DTYPE[self.quantize])}")
        shape = tuple(np.shape(ref)) if change else values.shape
        mask = None
        if sparse:
            size = int(np.prod(shape))
            bits = parts["mask"]
            if bits.dtype != np.uint8 or bits.shape != ((size + 7) // 8,):
                raise EncodingError(f"'{key}|mask' has shape {bits.shape} and dtype {bits.dtype}, expected "
                                    f"(({size} + 7) // 8,) uint8")
            mask = np.unpackbits(bits)[:size].astype(bool)
            if values.shape != (int(mask.sum()),) or int(mask.sum()) != top_count(size, self.topk):
                raise EncodingError(f"'{key}' sends {values.size} values for {int(mask.sum())} mask bits; the "
                                    f"run's top-k sends {top_count(size, self.topk)} of {size}")
        elif values.shape != shape:
            raise EncodingError(f"'{key}|v' has shape {values.shape}, expected {shape}")
        if int8:
            q = parts["q"]
            slices = values.shape[0] if self.quantize == "int8_channel" and values.ndim >= 2 else 1
            if q.dtype != np.float32 or q.shape != (2, slices):
                raise EncodingError(f"'{key}|q' has shape {q.shape} and dtype {q.dtype}, expected (2, {slices}) float32")
            if not np.isfinite(q).all() or (q[0] <= 0).any():
                raise EncodingError(f"'{key}|q' holds a non-finite or non-positive scale")
        decoded = self._dequantize(parts, values.shape)
        if not np.isfinite(decoded).all():
            raise EncodingError(f"'{key}' decodes to NaN or Inf")
        dense = self._expand(decoded.ravel(), mask, shape) if sparse else decoded.reshape(shape)
        if change:
            return (np.asarray(ref, np.float64) + dense).astype(np.asarray(ref).dtype)
        return dense


def onto_server_arrays(reply: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray],
                       server: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A reply that trained the quantized arrays a client `received`, moved onto the `server`'s
    own: reply + (server - received) for each floating entry the three share, in the reply's dtype.
    The client's change is kept, and the quantization error of the downlink stays out of the
    server's arrays."""
    out = dict(reply)
    for key, value in reply.items():
        value = np.asarray(value)
        ref, own = received.get(key), server.get(key)
        if _floating(value) and ref is not None and own is not None \
                and value.shape == np.shape(ref) == np.shape(own):
            shift = np.asarray(own, np.float64) - np.asarray(ref, np.float64)
            out[key] = (value.astype(np.float64) + shift).astype(value.dtype)
    return out


def top_count(size: int, fraction: float) -> int:
    """How many of `size` entries top-k sends: at least one."""
    return min(size, max(1, math.ceil(fraction * size)))


def top_mask(u: np.ndarray, fraction: float) -> np.ndarray:
    """Boolean mask of the `top_count` entries of u largest in magnitude (ties: lowest index)."""
    flat = np.abs(u.ravel())
    count = top_count(flat.size, fraction)
    chosen = np.argsort(-flat, kind="stable")[:count]
    mask = np.zeros(flat.size, bool)
    mask[chosen] = True
    return mask.reshape(u.shape)
