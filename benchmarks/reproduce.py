"""Does today's code compute what a committed run computed? Re-runs the first rounds of finished
`pfedes-bench` / `pfedes-sim` runs with their saved configuration (settings added since at their
defaults) and compares every round's figures exactly, e.g. after a refactor:

    python benchmarks/reproduce.py benchmarks/results/hetero_pathological_val/pfedes/seed0 \
        benchmarks/results/hetero_pathological_val/fd/seed0 --rounds 3

Writes benchmarks/results/reproduction.json: per run, the figures compared and the largest
difference (0 = bit for bit the same; a simulation is deterministic for a seed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, write_result  # noqa: E402

FIGURES = ("acc_mean", "acc_worst", "val_acc_mean", "train_loss", "align_loss", "global_acc",
           "bytes_up_per_client", "bytes_down_per_client")


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def reproduce(run_dir: Path, rounds: int) -> dict:
    from pfedes.config import experiment_config, with_later_settings
    from pfedes.sim import simulate

    saved = json.loads((run_dir / "summary.json").read_text())["config"]
    before = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()[:rounds]]
    cfg = with_later_settings(saved, experiment_config([f"strategy={saved['strategy']['name']}"]))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {k: v for k, v in cfg.items() if k not in ("run_token", "client_state_dir")}
        cfg.update(num_rounds=rounds, out_dir=tmp, resume=False)
        simulate(cfg)
        now = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    diffs = [abs(a[k] - b[k]) for a, b in zip(before, now) for k in FIGURES
             if a.get(k) is not None and b.get(k) is not None]
    mismatched = [k for a, b in zip(before, now) for k in FIGURES if (a.get(k) is None) != (b.get(k) is None)]
    return {"run": str(run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir),
            "rounds": rounds, "figures_compared": len(diffs), "largest_difference": max(diffs, default=None),
            "present_in_one_only": sorted(set(mismatched)),
            "acc_mean_then": [r["acc_mean"] for r in before], "acc_mean_now": [r["acc_mean"] for r in now]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories (summary.json, metrics.jsonl)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = [reproduce(run.resolve(), args.rounds) for run in args.runs]
    for r in rows:
        print(f"{r['run']}: {r['figures_compared']} figures over {r['rounds']} rounds, largest difference "
              f"{r['largest_difference']}" + (f", present in one only: {r['present_in_one_only']}"
                                               if r["present_in_one_only"] else ""))
    path = write_result("reproduction", {"commit": commit(), "runs": rows,
                                         "command": "python benchmarks/reproduce.py " + " ".join(sys.argv[1:])})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
