"""The learning-rate grid: every baseline's train.lr chosen on validation accuracy of tuning seed 100.

The runs are `pfedes-bench` runs on the tuning setting (the zoo, 10 clients, Dirichlet alpha 0.3,
500 samples per client, 15 % validation split, 20 rounds, seed 100, never a reported seed), one
directory per learning rate, e.g.

    for lr in 0.01 0.005 0.02; do
      pfedes-bench strategies=[local,lgfedavg,fd,fedgh,fedproto,fml,pfedes_paper] seeds=[100] num_rounds=20 \
        data.partition=dirichlet data.alpha=0.3 data.path=../shared/data/cifar10 data.samples_per_client=500 \
        data.val_fraction=0.15 num_clients=10 train.lr=$lr strategy.lr=null \
        out_dir=benchmarks/results/tuning/lr_grid/lr$lr
    done
The one-architecture grid (FedRep, the one-architecture table's baseline, beside Local-only on the
same clients) is the same with `strategies=[local,fedrep] clients.devices=[phone]` and
`out_dir=benchmarks/results/tuning/lr_grid_one_arch/lr$lr`.

    python benchmarks/lr_grid.py

This reads each run's validation accuracy (the mean of its last 5 rounds; the test split is not
read) and writes benchmarks/results/tuning/lr_grid.{json,md} (and lr_grid_one_arch.{json,md}). `strategy.lr=null`: a method whose
preset has its own learning rate (chosen here) trains at the grid's train.lr. The rule, fixed before the runs:
the shared lr (train.lr, 0.01) stays a method's learning rate unless another lr of the grid beats
it by more than 1 point on validation, the noise of one seed's last-5-round mean.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS  # noqa: E402

GRID_DIR = RESULTS / "tuning" / "lr_grid"
# grid directory -> the setting its runs share
GRIDS = {
    GRID_DIR: "the zoo",
    RESULTS / "tuning" / "lr_grid_one_arch": "one architecture (phone, CNN3)",
}
SHARED_LR = 0.01
MARGIN = 0.01  # one seed's noise on the last-5-round mean (accuracy as a fraction)
SEED = 100
LAST = 5


def validation_accuracy(run_dir: Path) -> float | None:
    """The mean validation accuracy of a finished run's last LAST rounds, else None."""
    if not (run_dir / "summary.json").is_file():
        return None
    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    vals = [r["val_acc_mean"] for r in rounds[-LAST:] if r.get("val_acc_mean") is not None]
    return sum(vals) / len(vals) if len(vals) == LAST else None


def read_grid(grid_dir: Path = GRID_DIR) -> dict[str, dict[float, float]]:
    """{strategy: {lr: validation accuracy}} for every finished run under grid_dir/lr<lr>/."""
    grid: dict[str, dict[float, float]] = {}
    for lr_dir in sorted(grid_dir.glob("lr*")):
        lr = float(lr_dir.name[2:])
        for run_dir in sorted(lr_dir.glob(f"*/seed{SEED}")):
            acc = validation_accuracy(run_dir)
            if acc is not None:
                grid.setdefault(run_dir.parent.name, {})[lr] = acc
    return grid


def choose(scores: dict[float, float]) -> float | None:
    """The rule above; None when the shared lr was not run."""
    if SHARED_LR not in scores:
        return None
    best = max(scores, key=scores.get)
    return best if scores[best] - scores[SHARED_LR] > MARGIN else SHARED_LR


def write_record(grid_dir: Path, clients: str) -> list[str]:
    """grid_dir's record next to it, <name>.json and <name>.md; returns the markdown lines."""
    grid = read_grid(grid_dir)
    lrs = sorted({lr for scores in grid.values() for lr in scores})
    rows = {name: {"validation_accuracy": {str(lr): acc for lr, acc in sorted(scores.items())},
                   "chosen_lr": choose(scores)} for name, scores in sorted(grid.items())}
    out = {"setting": f"{clients}, 10 clients, Dirichlet alpha 0.3, 500 samples per client, 15 % validation, "
                      f"20 rounds, seed {SEED}; validation accuracy, mean of the last {LAST} rounds",
           "rule": f"the shared lr {SHARED_LR} stays unless another lr beats it by more than "
                   f"{100 * MARGIN:.0f} point on validation", "methods": rows}
    (grid_dir.parent / f"{grid_dir.name}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"Validation accuracy % ({clients}; tuning seed {SEED}, mean of the last {LAST} of 20 rounds) by "
             f"train.lr; `python benchmarks/lr_grid.py`. Rule: {out['rule']}.", "",
             "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | chosen lr |",
             "|---|" + "---|" * (len(lrs) + 1)]
    for name, scores in sorted(grid.items()):
        cells = [f"{100 * scores[lr]:.1f}" if lr in scores else "not run" for lr in lrs]
        chosen = choose(scores)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'—' if chosen is None else f'{chosen:g}'} |")
    (grid_dir.parent / f"{grid_dir.name}.md").write_text("\n".join(lines) + "\n")
    return lines


def main() -> None:
    for grid_dir, clients in GRIDS.items():
        if grid_dir.is_dir():
            print("\n".join(write_record(grid_dir, clients)) + "\n")


if __name__ == "__main__":
    main()
