"""Choose a method's settings on validation accuracy, on a tuning seed that no reported table uses.

Runs one candidate (a name and hydra overrides) in the plain loop (`benchmarks/plain_loop.py`, the same
computation as a Flower run, one process) on the reference heterogeneous setting with a
validation split, and appends one JSON line (the candidate, its per-round validation accuracy,
the mean of the last 5 rounds) to the tuning record. For a method that shares a feature extractor
the record also has a linear probe of the final shared extractor beside the same probe of the
extractor as initialised (`probe_val`, `probe_val_fresh`): fit on one half of the clients' pooled
validation splits, scored on the other half. The test split is not read.

    python benchmarks/tune.py ens_pure strategy=pfedes strategy.fusion=ensemble ... \
        --record benchmarks/results/tuning/pfedes_hetero_dirichlet.jsonl

Defaults: 10 clients, the phone/gateway/gpu-host zoo, Dirichlet alpha 0.3, 500 samples per client,
data.val_fraction 0.15, seed 100, 20 rounds; any of them can be overridden on the command line
(`data.partition=pathological`, `num_rounds=30`, ...), and the record says the setting it ran.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import default_data_path, experiment  # noqa: E402

SETTING = {"num_clients": 10, "data.samples_per_client": 500, "data.partition": "dirichlet",
           "data.alpha": 0.3, "data.val_fraction": 0.15, "seed": 100, "num_rounds": 20,
           "train.torch_threads": 1}


def cfg_value(cfg: dict, dotted: str):
    for key in dotted.split("."):
        cfg = cfg[key]
    return cfg


def validation_probe(cfg: dict, shared: dict) -> dict[str, float]:
    """The linear probe of the shared extractor `shared` (the final aggregate) and of the one the
    server starts from, on the clients' pooled validation splits (shuffled; one half fits, the other
    scores): how much the federation taught the extractor, without reading a test split."""
    from pfedes.client_round import load_node_data
    from pfedes.data import to_input
    from pfedes.methods import method_of
    from pfedes.models import resolve_architecture
    from pfedes.proxy_monitor import feature_std, linear_probe, shared_features

    n = int(cfg["num_clients"])
    parts = [load_node_data(cfg, cfg["data"]["path"], p, n) for p in range(n)]
    x, y = torch.cat([d.x_val for d in parts]), torch.cat([d.y_val for d in parts])
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    image, num_classes = parts[0].image_format, parts[0].num_classes
    x, y = to_input(x[order], image), y[order]
    trainer_cls = method_of(cfg).trainer
    arch = resolve_architecture(cfg["clients"]["devices"][0], cfg["model"]["profiles"])
    trainer = trainer_cls(cfg, arch, num_classes, seed=int(cfg["seed"]), image=image)

    def features(arrays: dict[str, torch.Tensor]) -> torch.Tensor:
        trainer.load_shared(arrays)
        return shared_features(trainer, x)

    initial = trainer_cls.initial_shared(cfg, arch, num_classes, image)
    final = features({k: torch.from_numpy(v.copy()) for k, v in shared.items()})
    return {"probe_val": linear_probe(final, y, num_classes),
            "probe_val_fresh": linear_probe(features(initial), y, num_classes),
            "proxy_std_val": feature_std(final)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the candidate's name in the record")
    parser.add_argument("overrides", nargs="*", help="hydra overrides (strategy=..., strategy.KEY=VALUE)")
    parser.add_argument("--record", type=Path, required=True, help="JSONL file the result is appended to")
    args = parser.parse_args()
    from plain_loop import run_plain

    cfg = experiment(args.overrides, **{"data.path": default_data_path(), **SETTING})
    start = time.perf_counter()
    result = run_plain(cfg, threads=1, progress=True)
    val = [r["val_acc_mean"] for r in result["rounds"]]
    # the setting it ran: the defaults, with any of them the command line overrides
    setting = {**SETTING, **{k: cfg_value(cfg, k) for k in SETTING if any(o.startswith(f"{k}=") for o in args.overrides)}}
    line = {"name": args.name, "overrides": args.overrides, "setting": setting,
            "val_acc_by_round": val, "val_acc_last5": sum(val[-5:]) / len(val[-5:]),
            # a method's own validation figures (e.g. each ensemble branch's accuracy), by round
            "branches_by_round": {k: [r["eval_means"][k] for r in result["rounds"]]
                                  for k in result["rounds"][0]["eval_means"] if "branch" in k},
            "seconds": time.perf_counter() - start}
    from pfedes.methods import method_of

    if getattr(method_of(cfg).trainer, "shares_feature_extractor", False):
        line.update(validation_probe(cfg, result["arrays"]))
    args.record.parent.mkdir(parents=True, exist_ok=True)
    with args.record.open("a") as handle:
        handle.write(json.dumps(line) + "\n")
    probe = (f"; probe {100 * line['probe_val']:.1f}% (fresh {100 * line['probe_val_fresh']:.1f}%)"
             if "probe_val" in line else "")
    print(f"{args.name}: validation accuracy, mean of the last 5 rounds {100 * line['val_acc_last5']:.1f}%{probe}")


if __name__ == "__main__":
    main()
