"""Bytes of one compressed upload against the uncompressed one and the mean full fp32 model of the
device zoo: the x axis of the bytes-against-accuracy curve (issue 15). The payload is the shared
entries of a method's client after one round's worth of change (the preset's arrays plus Gaussian
noise of 1 % of their scale, so top-k has something to choose), encoded as the ClientApp encodes it
and counted as Flower serialises it (npy headers included).

    python benchmarks/compression_bytes.py [hydra overrides, e.g. strategy=fml]

Writes benchmarks/results/compression_bytes.json. Accuracy under each option is not measured here.
"""

from __future__ import annotations

import sys

import numpy as np
from flwr.app import Array, ArrayRecord

from _common import experiment, print_table, write_result

OPTIONS = {
    "fp32": {},
    "fp16": {"quantize": "fp16"},
    "int8": {"quantize": "int8"},
    "int8_channel": {"quantize": "int8_channel"},
    "top25": {"topk": 0.25},
    "top10": {"topk": 0.1},
    "fp16+top10": {"quantize": "fp16", "topk": 0.1},
    "int8+top25": {"quantize": "int8", "topk": 0.25},
    "int8+top10": {"quantize": "int8", "topk": 0.1},
}


def client_trainers(cfg: dict) -> list:
    """One freshly built client trainer of cfg's method per device profile in cfg's device list."""
    from pfedes.methods import method_of
    from pfedes.models import resolve_architecture

    trainer_cls = method_of(cfg).trainer
    return [trainer_cls(cfg, resolve_architecture(d, cfg["model"]["profiles"]), 10, seed=0)
            for d in sorted(set(cfg["clients"]["devices"]))]


def mean_full_model_bytes(trainers: list) -> float:
    """The mean over the trainers of their whole model as fp32 bytes: what "% of a full model" is of."""
    return float(np.mean([sum(p.numel() * 4 for p in t.model.parameters()) for t in trainers]))


def main(overrides: list[str]) -> None:
    from pfedes.compression import Codec
    from pfedes.strategies.base import arrays_nbytes

    cfg = experiment(overrides)
    devices = sorted(set(cfg["clients"]["devices"]))
    models = client_trainers(cfg)
    full = mean_full_model_bytes(models)
    sent = {k: v.numpy().copy() for k, v in models[0].shared_state().items()}
    rng = np.random.default_rng(0)
    new = {k: (v + 0.01 * (np.abs(v).mean() + 1e-8) * rng.standard_normal(v.shape)).astype(v.dtype)
           if v.dtype.kind == "f" else v for k, v in sent.items()}
    sizes = {}
    for name, option in OPTIONS.items():
        codec = Codec(**option)
        encoded = codec.encode(new, sent, {})[0] if codec.active else new
        sizes[name] = arrays_nbytes(ArrayRecord({k: Array(np.asarray(v)) for k, v in encoded.items()}))
    rows = [{"option": name, "KiB": size / 1024, "vs_fp32": size / sizes["fp32"],
             "pct_of_full_model": 100 * size / full} for name, size in sizes.items()]
    print(f"strategy {cfg['strategy']['name']}: mean full fp32 model of {devices} = {full / 1024:.1f} KiB")
    print_table(rows, ["option", "KiB", "vs_fp32", "pct_of_full_model"])
    path = write_result("compression_bytes", {
        "command": "python benchmarks/compression_bytes.py " + " ".join(overrides),
        "strategy": cfg["strategy"]["name"], "mean_full_model_kib": full / 1024, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
