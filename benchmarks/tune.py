"""Choose a method's settings on validation accuracy, on a tuning seed that no reported table uses.

Runs one candidate (a name and hydra overrides) in the plain loop (`benchmarks/plain_loop.py`, the same
computation as a Flower run, one process) on the reference heterogeneous setting with a
validation split, and appends one JSON line (the candidate, its per-round validation accuracy,
the mean of the last 5 rounds) to the tuning record. The test split is not read.

    python benchmarks/tune.py ens_pure strategy=pfedes strategy.fusion=ensemble ... \
        --record benchmarks/results/tuning/pfedes_hetero_dirichlet.jsonl

Defaults: 10 clients, the phone/gateway/gpu-host zoo, Dirichlet alpha 0.3, 500 samples per client,
data.val_fraction 0.15, seed 100, 20 rounds; any of them can be overridden on the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import default_data_path, experiment  # noqa: E402

SETTING = {"num_clients": 10, "data.samples_per_client": 500, "data.partition": "dirichlet",
           "data.alpha": 0.3, "data.val_fraction": 0.15, "seed": 100, "num_rounds": 20,
           "train.torch_threads": 1}


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
    line = {"name": args.name, "overrides": args.overrides, "setting": SETTING,
            "val_acc_by_round": val, "val_acc_last5": sum(val[-5:]) / len(val[-5:]),
            # a method's own validation figures (e.g. each ensemble branch's accuracy), by round
            "branches_by_round": {k: [r["eval_means"][k] for r in result["rounds"]]
                                  for k in result["rounds"][0]["eval_means"] if "branch" in k},
            "seconds": time.perf_counter() - start}
    args.record.parent.mkdir(parents=True, exist_ok=True)
    with args.record.open("a") as handle:
        handle.write(json.dumps(line) + "\n")
    print(f"{args.name}: validation accuracy, mean of the last 5 rounds {100 * line['val_acc_last5']:.1f}%")


if __name__ == "__main__":
    main()
