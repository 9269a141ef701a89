"""The tuning grids: each baseline's main hyperparameters chosen on validation accuracy of tuning seed 100.

Every grid is a set of `pfedes-bench` runs on the tuning setting (10 clients, Dirichlet alpha 0.3,
500 samples per client, 15 % validation split, seed 100, never a reported seed), one directory per
value, <grid>/<prefix><value>/<strategy>/seed100. The learning-rate grid on the zoo:

    for lr in 0.01 0.005 0.02; do
      pfedes-bench strategies=[local,lgfedavg,fd,fedgh,fedproto,fml,pfedes_paper] seeds=[100] num_rounds=20 \
        data.partition=dirichlet data.alpha=0.3 data.path=../shared/data/cifar10 data.samples_per_client=500 \
        data.val_fraction=0.15 num_clients=10 train.lr=$lr strategy.lr=null \
        out_dir=benchmarks/results/tuning/lr_grid/lr$lr
    done

Every method whose best learning rate lies at an edge of the grid is run one step beyond it (the
same command with only those methods): Local-only, pfedes, FML and the paper form at 0.04, FedGH,
FedProto and LG-FedAvg at 0.0025, then FedGH and FedProto, still best at the edge, at 0.00125,
then FedGH, best there, at 0.000625 (`out_dir=.../lr_grid/lr0.04`, `.../lr0.0025`, `.../lr0.00125`,
`.../lr0.000625`); on one architecture Local-only and FedRep at 0.04.
LG-FedAvg's cells of this grid ran at server momentum 0, its preset until its budget grid below
chose 0.95 (and lr 0.005): to run them again, run lgfedavg alone with `strategy.server_momentum=0`.

The one-architecture learning-rate grid (the one-architecture table's baselines beside Local-only on
the same clients) is the same with `strategies=[local,fedrep] clients.devices=[phone]` and
`out_dir=benchmarks/results/tuning/lr_grid_one_arch/lr$lr`; CFL's is the same with
`strategies=[cfl] num_rounds=40` at the eps2 its grid chose (its lr 0.01 point is that grid's run).
pFedMe's lambda (20 rounds) at two personal learning rates (the step of the K plain gradient
steps that make the personal model: train.lr 0.01, and the reference code's 0.09, since these
steps have no momentum), and CFL's split threshold eps2 (40 rounds: no split comes before its
20-round gate; eps1 0.4, above every round's mean update norm at lr 0.01, so eps2 decides), one architecture:

    for lam in 0.1 1 15; do pfedes-bench strategies=[pfedme] seeds=[100] clients.devices=[phone] \
        data.partition=dirichlet data.alpha=0.3 data.path=../shared/data/cifar10 data.samples_per_client=500 \
        data.val_fraction=0.15 num_clients=10 num_rounds=20 ++strategy.lam=$lam \
        out_dir=benchmarks/results/tuning/pfedme_lam/lam$lam; done
    for lam in 15 1 0.1; do pfedes-bench strategies=[pfedme] (the same setting) num_rounds=20 \
        ++strategy.lam=$lam ++strategy.personal_lr=0.09 out_dir=benchmarks/results/tuning/pfedme_lam_plr0.09/lam$lam; done
    for e2 in 1.6 0.8 0.5; do pfedes-bench strategies=[cfl] (the same setting) num_rounds=40 \
        ++strategy.eps1=0.4 ++strategy.eps2=$e2 out_dir=benchmarks/results/tuning/cfl_eps/eps2_$e2; done

The two baselines the tables compare pfedes with also have their main setting beside the learning
rate tuned (the zoo, 20 rounds, train.lr 0.01): FD's distillation weight lam, and LG-FedAvg's server
momentum on the shared head (0 is LG-FedAvg's plain average; pfedes aggregates with momentum):

    T="seeds=[100] num_rounds=20 data.partition=dirichlet data.alpha=0.3 data.path=../shared/data/cifar10 \
       data.samples_per_client=500 data.val_fraction=0.15 num_clients=10 strategy.lr=null"
    for lam in 1 0.3 3 0.1; do pfedes-bench strategies=[fd] $T ++strategy.lam=$lam \
        out_dir=benchmarks/results/tuning/fd_lam/lam$lam; done
    for m in 0 0.5 0.9; do pfedes-bench strategies=[lgfedavg] $T ++strategy.server_momentum=$m \
        out_dir=benchmarks/results/tuning/lgfedavg_momentum/m$m; done

FedRep, the one-architecture table's baseline, also has its main setting beside the learning rate
tuned: the passes of its private head (with the body frozen) before each round's body epoch, at
the learning rate its grid chose (one architecture, 20 rounds):

    for h in 1 10 5; do pfedes-bench strategies=[fedrep] seeds=[100] clients.devices=[phone] num_rounds=20 \
        data.partition=dirichlet data.alpha=0.3 data.path=../shared/data/cifar10 data.samples_per_client=500 \
        data.val_fraction=0.15 num_clients=10 train.lr=0.02 strategy.lr=null ++strategy.head_epochs=$h \
        out_dir=benchmarks/results/tuning/fedrep_head/h$h; done

The equal budget: pfedes's defaults were chosen among 31 validation candidates (25 structural ones in
the tune.py records and 4 learning rates, then proxy_epochs 10 and 20 beyond the edge of its 1 / 3 / 5), so the baselines it is compared with most closely get as
many, on train.lr against their main setting: FedRep (one architecture) lr x head_epochs, FD (the
zoo) lr x lam, LG-FedAvg (the zoo) lr x server_momentum, and the pathological table's other
baselines FedProto (the zoo) lr x lam, FedGH (the zoo) lr x server_epochs, FML (the zoo) lr x alpha
(the private model's weight of cross-entropy against distillation from the meme) and the paper form
(the zoo) lr x mu (the weight of CE(F(G(x))) in F's loss). Cells already run by
the grids above are copied in (the same runs); the rest:

    for lr in 0.0025 0.005 0.01 0.02 0.04 0.08; do for h in 1 3 5 10; do
      pfedes-bench strategies=[fedrep] seeds=[100] clients.devices=[phone] num_rounds=20 \
        data.partition=dirichlet data.alpha=0.3 data.path=../shared/data/cifar10 data.samples_per_client=500 \
        data.val_fraction=0.15 num_clients=10 strategy.lr=null train.lr=$lr ++strategy.head_epochs=$h \
        out_dir=benchmarks/results/tuning/fedrep_budget/lr${lr}_h$h; done; done
    (then head_epochs 20, one step beyond the edge, at lr 0.005 to 0.08: 29 cells; then, when pfedes's
    pass count was found at its grid's edge and got 2 more cells, head_epochs 40 at lr 0.005 and 0.01,
    where the best cells rose to the edge: 31 cells)
    for lr in 0.0025 0.005 0.01 0.02 0.04; do for lam in 0.1 0.3 1 3 10; do
      pfedes-bench strategies=[fd] $T train.lr=$lr ++strategy.lam=$lam \
        out_dir=benchmarks/results/tuning/fd_budget/lr${lr}_lam$lam; done; done
    (then lam 0.5 and 2 at lr 0.005 and 0.01, around the best cells: 29 cells)
    for lr in 0.00125 0.0025 0.005 0.01 0.02 0.04; do for m in 0 0.5 0.7 0.9; do
      pfedes-bench strategies=[lgfedavg] $T train.lr=$lr ++strategy.server_momentum=$m \
        out_dir=benchmarks/results/tuning/lgfedavg_budget/lr${lr}_m$m; done; done
    (then server_momentum 0.95 at lr 0.00125 to 0.02: 29 cells; and 0.98 at lr 0.005, beyond the best cell's edge)
    for lr in 0.00125 0.0025 0.005 0.01 0.02; do for lam in 0.1 0.3 1 3 10; do
      pfedes-bench strategies=[fedproto] $T train.lr=$lr ++strategy.lam=$lam \
        out_dir=benchmarks/results/tuning/fedproto_budget/lr${lr}_lam$lam; done; done
    (then lam 0.03 at lr 0.00125 and 0.0025, and lr 0.000625 at lam 0.1 and 0.3, one step beyond the
    best cells' edges: 29 cells)
    for lr in 0.000625 0.00125 0.0025 0.005 0.01; do for e in 1 2 5 10 20; do
      pfedes-bench strategies=[fedgh] $T train.lr=$lr ++strategy.server_epochs=$e \
        out_dir=benchmarks/results/tuning/fedgh_budget/lr${lr}_e$e; done; done
    (then lr 0.0035 and 0.0075 at server_epochs 1 and 5, between the best cells: 29 cells)
    for lr in 0.005 0.01 0.02 0.04; do for a in 0.1 0.3 0.5 0.7 0.9; do
      pfedes-bench strategies=[fml] $T train.lr=$lr ++strategy.alpha=$a \
        out_dir=benchmarks/results/tuning/fml_budget/lr${lr}_a$a; done; done
    (then alpha 0.6 and 0.8 at lr 0.01, 0.02 and 0.04, and lr 0.03 at alpha 0.6 to 0.8, around the best
    cells: 29 cells)
    for lr in 0.005 0.01 0.02 0.04; do for mu in 0.1 0.2 0.3 0.4 0.5; do
      pfedes-bench strategies=[pfedes_paper] $T train.lr=$lr ++strategy.mu=$mu \
        out_dir=benchmarks/results/tuning/pfedes_paper_budget/lr${lr}_mu$mu; done; done
    (then mu 0.05, 0.02 and 0.01, beyond the best cells' edge, at lr 0.005, 0.01 and 0.02: 29 cells)

Local-only, the reference of every gain, gets the same budget on its own main settings, the
learning rate against the weight decay (its cells at the shared 0.0005 are the learning-rate grid's
runs, copied in):

    for lr in 0.005 0.01 0.02 0.04; do for wd in 0 0.0001 0.001 0.002 0.005; do
      pfedes-bench strategies=[local] $T train.lr=$lr train.weight_decay=$wd \
        out_dir=benchmarks/results/tuning/local_budget/lr${lr}_wd$wd; done; done
    (then lr 0.015 at weight decay 0, 0.0001 and 0.0005, and lr 0.0075 at 0.0001 and 0.0005, around
    the best cells: 29 cells)

pFedMe (one architecture) gets the same budget on the learning rate (its K inner steps' personal
learning rate follows it, as in its preset) against lambda; every cell is run anew, so the lam
grids above (made with CIFAR-10's fixed normalisation constants) are not copied in:

    for lr in 0.01 0.02 0.005 0.04 0.0025; do for lam in 0.1 1 15 0.3 3; do
      pfedes-bench strategies=[pfedme] seeds=[100] clients.devices=[phone] num_rounds=20 \
        data.partition=dirichlet data.alpha=0.3 data.path=../shared/data/cifar10 data.samples_per_client=500 \
        data.val_fraction=0.15 num_clients=10 strategy.lr=null train.lr=$lr ++strategy.lam=$lam \
        out_dir=benchmarks/results/tuning/pfedme_budget/lr${lr}_lam$lam; done; done
    (then, since lr 0.04 rose with lam to the corner, the same command at lr 0.04 with lam 30 and
    at lr 0.08 with lam 3, 15 and 30: 29 cells)

CFL (one architecture, 40 rounds: no split comes before its 20-round gate) likewise, the learning
rate against its split threshold eps2 (eps1 at its preset's 0.4), every cell run anew:

    for lr in 0.01 0.02 0.005 0.04 0.0025; do for e2 in 0.5 0.8 0.3 1.2 0.2; do
      pfedes-bench strategies=[cfl] seeds=[100] clients.devices=[phone] num_rounds=40 \
        data.partition=dirichlet data.alpha=0.3 data.path=../shared/data/cifar10 data.samples_per_client=500 \
        data.val_fraction=0.15 num_clients=10 strategy.lr=null train.lr=$lr ++strategy.eps2=$e2 \
        out_dir=benchmarks/results/tuning/cfl_budget/lr${lr}_eps2_$e2; done; done

When pfedes's pass count was extended past its grid's edge (2 more candidates, 31 in all), each
baseline was owed 2 more cells: beyond its grid's edge where its best cells lay there (FedRep above,
FedProto lam 0.01 at lr 0.00125 and 0.0025), else beside its best cell (the same commands with:
Local-only lr 0.015 wd 0.001 and lr 0.0125 wd 0.0001; FD lam 1 at lr 0.0075 and 0.015; LG-FedAvg
server_momentum 0.98 at lr 0.0025 and 0.01; FedGH lr 0.00175 at server_epochs 1 and 5; FML lr 0.015
alpha 0.8 and lr 0.03 alpha 0.9; the paper form mu 0.1 at lr 0.0075 and 0.015). pFedMe (29) got lam
0.3 at lr 0.0035 and 0.0075, beside its best cells; CFL (25) got lr 0.0075 and 0.015 at eps2 0.3, 0.5
and 0.8, beside its best cells: 31 each, and both presets stand.

    python benchmarks/tuning_grid.py

This reads each run's validation accuracy (the mean of its last 5 rounds; the test split is not
read) and writes benchmarks/results/tuning/<grid>.{json,md} for every grid that has runs.
`strategy.lr=null`: a method whose preset has its own learning rate trains at the grid's train.lr.
The rule, fixed before the runs: a setting's default (the shared lr 0.01; the preset's value before
its grid) stays unless another value of the grid beats it by more than 1 point on validation, the
noise of one seed's last-5-round mean. pFedMe's two grids are read as one: their best cell replaces
lambda 0.1 at personal lr 0.01 only if it beats that cell by more than 1 point.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS  # noqa: E402

MARGIN = 0.01  # one seed's noise on the last-5-round mean (accuracy as a fraction)
SEED = 100
LAST = 5
ONE_ARCH = "one architecture (phone, CNN3)"


@dataclass(frozen=True)
class Grid:
    directory: Path  # <directory>/<prefix><value>/<strategy>/seed<SEED>
    clients: str
    setting: str  # the key the grid varies
    prefix: str
    default: float  # the value that stays unless beaten by more than MARGIN
    rounds: str


GRIDS = [
    Grid(RESULTS / "tuning" / "lr_grid", "the zoo", "train.lr", "lr", 0.01, "20"),
    Grid(RESULTS / "tuning" / "lr_grid_one_arch", ONE_ARCH, "train.lr", "lr", 0.01, "20 (CFL 40)"),
    Grid(RESULTS / "tuning" / "pfedme_lam", ONE_ARCH, "strategy.lam", "lam", 0.1, "20"),
    Grid(RESULTS / "tuning" / "pfedme_lam_plr0.09", ONE_ARCH + ", personal lr 0.09", "strategy.lam", "lam", 0.1, "20"),
    Grid(RESULTS / "tuning" / "cfl_eps", ONE_ARCH + ", eps1 0.4", "strategy.eps2", "eps2_", 1.6, "40"),
    Grid(RESULTS / "tuning" / "fd_lam", "the zoo", "strategy.lam", "lam", 1.0, "20"),
    Grid(RESULTS / "tuning" / "lgfedavg_momentum", "the zoo", "strategy.server_momentum", "m", 0.0, "20"),
    Grid(RESULTS / "tuning" / "fedrep_head", ONE_ARCH + ", lr 0.02", "strategy.head_epochs", "h", 5.0, "20"),
]


def validation_accuracy(run_dir: Path) -> float | None:
    """The mean validation accuracy of a finished run's last LAST rounds, else None."""
    if not (run_dir / "summary.json").is_file():
        return None
    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    vals = [r["val_acc_mean"] for r in rounds[-LAST:] if r.get("val_acc_mean") is not None]
    return sum(vals) / len(vals) if len(vals) == LAST else None


def tuning_setting(clients: str, rounds: str) -> str:
    """What a record's runs were, for its JSON."""
    return (f"{clients}, 10 clients, Dirichlet alpha 0.3, 500 samples per client, 15 % validation, {rounds} rounds, "
            f"seed {SEED}; validation accuracy, mean of the last {LAST} rounds")


def read_grid(grid: Grid) -> dict[str, dict[float, float]]:
    """{strategy: {value: validation accuracy}} for every finished run of the grid."""
    scores: dict[str, dict[float, float]] = {}
    for value_dir in sorted(grid.directory.glob(f"{grid.prefix}*")):
        value = float(value_dir.name[len(grid.prefix):])
        for run_dir in sorted(value_dir.glob(f"*/seed{SEED}")):
            acc = validation_accuracy(run_dir)
            if acc is not None:
                scores.setdefault(run_dir.parent.name, {})[value] = acc
    return scores


def choose(scores: dict[float, float], default: float) -> float | None:
    """The rule above; None when the default was not run."""
    if default not in scores:
        return None
    best = max(scores, key=scores.get)
    return best if scores[best] - scores[default] > MARGIN else default


def write_record(grid: Grid) -> list[str]:
    """The grid's record next to it, <name>.json and <name>.md; returns the markdown lines (none, and
    nothing written, while no run of the grid has finished)."""
    scores = read_grid(grid)
    if not scores:
        return []
    values = sorted({v for by_value in scores.values() for v in by_value})
    name = grid.setting.split(".")[-1]
    rows = {method: {"validation_accuracy": {str(v): acc for v, acc in sorted(by_value.items())},
                     "chosen": choose(by_value, grid.default)} for method, by_value in sorted(scores.items())}
    out = {"setting": tuning_setting(grid.clients, grid.rounds),
           "varied": grid.setting,
           "rule": f"{grid.setting} {grid.default:g} stays unless another value beats it by more than "
                   f"{100 * MARGIN:.0f} point on validation", "methods": rows}
    (grid.directory.parent / f"{grid.directory.name}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"Validation accuracy % ({grid.clients}; tuning seed {SEED}, mean of the last {LAST} of {grid.rounds} "
             f"rounds) by {grid.setting}; `python benchmarks/tuning_grid.py`. Rule: {out['rule']}.", "",
             "| method | " + " | ".join(f"{name} {v:g}" for v in values) + f" | chosen {name} |",
             "|---|" + "---|" * (len(values) + 1)]
    for method, by_value in sorted(scores.items()):
        cells = [f"{100 * by_value[v]:.1f}" if v in by_value else "not run" for v in values]
        chosen = choose(by_value, grid.default)
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {'—' if chosen is None else f'{chosen:g}'} |")
    (grid.directory.parent / f"{grid.directory.name}.md").write_text("\n".join(lines) + "\n")
    return lines


@dataclass(frozen=True)
class BudgetGrid:
    """The equal-budget grid of one method: train.lr against its main setting, as many candidates as
    pfedes had (PFEDES_CANDIDATES); <directory>/lr<lr>_<prefix><value>/<strategy>/seed<SEED>."""
    directory: Path
    strategy: str
    clients: str
    setting: str
    prefix: str
    # (lr, value): the preset's cell, kept unless beaten by more than MARGIN. Where a grid replaced the
    # preset before it (LG-FedAvg, FML, the paper form, pFedMe: README), this is the cell it chose, so a
    # cell added later replaces it only by the same rule.
    default: tuple[float, float]
    rounds: int = 20


PFEDES_CANDIDATES = 31  # 25 structural candidates and 4 learning rates, then proxy_epochs 10 and 20 past its grid's edge
BUDGET_GRIDS = [
    BudgetGrid(RESULTS / "tuning" / "fedrep_budget", "fedrep", ONE_ARCH, "strategy.head_epochs", "h", (0.02, 5.0)),
    BudgetGrid(RESULTS / "tuning" / "fd_budget", "fd", "the zoo", "strategy.lam", "lam", (0.01, 1.0)),
    BudgetGrid(RESULTS / "tuning" / "lgfedavg_budget", "lgfedavg", "the zoo", "strategy.server_momentum", "m",
               (0.005, 0.95)),
    BudgetGrid(RESULTS / "tuning" / "fedproto_budget", "fedproto", "the zoo", "strategy.lam", "lam", (0.0025, 1.0)),
    BudgetGrid(RESULTS / "tuning" / "fedgh_budget", "fedgh", "the zoo", "strategy.server_epochs", "e", (0.00125, 5.0)),
    BudgetGrid(RESULTS / "tuning" / "fml_budget", "fml", "the zoo", "strategy.alpha", "a", (0.02, 0.8)),
    BudgetGrid(RESULTS / "tuning" / "pfedes_paper_budget", "pfedes_paper", "the zoo", "strategy.mu", "mu", (0.01, 0.1)),
    BudgetGrid(RESULTS / "tuning" / "local_budget", "local", "the zoo", "train.weight_decay", "wd", (0.01, 0.0005)),
    BudgetGrid(RESULTS / "tuning" / "pfedme_budget", "pfedme", ONE_ARCH, "strategy.lam", "lam", (0.005, 0.3)),
    BudgetGrid(RESULTS / "tuning" / "cfl_budget", "cfl", ONE_ARCH + ", eps1 0.4", "strategy.eps2", "eps2_", (0.01, 0.5),
               rounds=40),
]


def read_budget(grid: BudgetGrid) -> dict[tuple[float, float], float]:
    """{(lr, value): validation accuracy} for every finished cell."""
    scores = {}
    for cell in sorted(grid.directory.glob("lr*_*")):
        lr, _, value = cell.name[len("lr"):].partition(f"_{grid.prefix}")
        acc = validation_accuracy(cell / grid.strategy / f"seed{SEED}")
        if acc is not None:
            scores[(float(lr), float(value))] = acc
    return scores


def write_budget_record(grid: BudgetGrid) -> list[str]:
    """The grid's record next to it (<name>.json, <name>.md: rows lr, columns the setting); returns the
    markdown lines, none while no cell has finished."""
    scores = read_budget(grid)
    if not scores:
        return []
    name = grid.setting.split(".")[-1]
    lrs, values = sorted({lr for lr, _ in scores}), sorted({v for _, v in scores})
    chosen = choose(scores, grid.default)
    rule = (f"lr {grid.default[0]:g} with {name} {grid.default[1]:g} (the preset) stays unless another cell beats "
            f"it by more than {100 * MARGIN:.0f} point on validation")
    out = {"setting": tuning_setting(grid.clients, str(grid.rounds)),
           "strategy": grid.strategy, "varied": ["train.lr", grid.setting], "rule": rule,
           "candidates": len(scores), "pfedes_candidates": PFEDES_CANDIDATES,
           "validation_accuracy": [{"lr": lr, name: v, "acc": acc} for (lr, v), acc in sorted(scores.items())],
           "chosen": None if chosen is None else {"lr": chosen[0], name: chosen[1]}}
    (grid.directory.parent / f"{grid.directory.name}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"{grid.strategy}: validation accuracy % ({grid.clients}; tuning seed {SEED}, mean of the last {LAST} "
             f"of {grid.rounds} rounds) by train.lr (rows) and {grid.setting} (columns), {len(scores)} candidates against "
             f"pfedes's {PFEDES_CANDIDATES}; `python benchmarks/tuning_grid.py`. Rule: {rule}.", "",
             "| lr | " + " | ".join(f"{name} {v:g}" for v in values) + " |", "|---|" + "---|" * len(values)]
    for lr in lrs:
        cells = [f"{100 * scores[(lr, v)]:.1f}" if (lr, v) in scores else "not run" for v in values]
        lines.append(f"| {lr:g} | " + " | ".join(cells) + " |")
    lines += ["", "Chosen: " + ("— (the preset's cell has not run)" if chosen is None
                                else f"lr {chosen[0]:g}, {name} {chosen[1]:g}")]
    (grid.directory.parent / f"{grid.directory.name}.md").write_text("\n".join(lines) + "\n")
    return lines


def main() -> None:
    for lines in [write_record(grid) for grid in GRIDS] + [write_budget_record(grid) for grid in BUDGET_GRIDS]:
        if lines:
            print("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
