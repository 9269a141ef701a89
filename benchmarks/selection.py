"""Dynamic client selection against uniform sampling (issue 15, part 3): 100 clients of the zoo
(phone, gateway, GPU host), 10 % of them training each round, Dirichlet alpha 0.3, 200 samples per
client, 15 % validation, 100 rounds; Local-only and pFedES under each selection mode, 3 seeds.

    python benchmarks/selection.py [--options uniform power_of_choice] [--seeds 0 1 2] [--no-run]

Each option is one `pfedes-bench` run of Local-only and pfedes into
benchmarks/results/selection/<option>/ (finished runs are reused, so the command resumes); --no-run
only reads what has finished. `power_of_choice` runs at its conf/ default (2 candidates per place):
nothing here was tuned. Every client is evaluated every round (fraction_evaluate 1), so each round's
accuracy is over all 100 clients, the ones a mode rarely picks included. Local-only is run under both
modes: selection by loss also changes which clients learn when nothing is shared, and a gain that
Local-only gets as well is the schedule's, not federation's.

Per method and mode: the final accuracy (mean of the last 5 rounds) and worst client, the change
against uniform sampling (same method, paired by seed), the gain over Local-only (same mode, paired
by seed), and the rounds each seed takes to reach uniform Local-only's final accuracy (5-round
trailing mean). Which nodes a round samples is not the same between runs of one seed: the
simulation gives its nodes random ids, so a seed pins the data, the models' initialisation and the
selection's own draws, but not which partition a draw lands on. Writes
benchmarks/results/selection.{csv,json,png}.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (ROOT, RESULTS, curves, paired, pct, points_columns, read_bench, rounds_to_reach,  # noqa: E402
                     run_options, save_plot, seed_mean_curve, stat, write_result)

OUT = RESULTS / "selection"
SAMPLES = 200
FLEET = ["num_clients=100", "fraction_train=0.1", "fraction_evaluate=1.0", "num_rounds=100",
         f"data.samples_per_client={SAMPLES}", "data.partition=dirichlet", "data.alpha=0.3",
         "data.path=../shared/data/cifar10", "data.val_fraction=0.15"]
OPTIONS = {"uniform": ["selection.mode=uniform"], "power_of_choice": ["selection.mode=power_of_choice"]}
METHODS = ["local", "pfedes"]


def bench_command(option: str, seeds: list[int]) -> list[str]:
    return ["pfedes-bench", f"strategies=[{','.join(METHODS)}]", f"seeds=[{','.join(map(str, seeds))}]", *FLEET,
            *OPTIONS[option], f"out_dir={(OUT / option).relative_to(ROOT)}"]


def worst_last(directory: Path, strategy: str) -> dict[int, float]:
    """{seed: the worst client's accuracy, mean of the last rounds} of a bench directory's runs."""
    return {int(r["seed"]): float(r["acc_worst_last"]) for r in csv.DictReader((directory / "results.csv").open())
            if r["status"] == "ok" and r["strategy"] == strategy and r.get("acc_worst_last")}


def table(options: list[str]) -> list[dict]:
    """One row per (option, method) that has runs, paired with uniform sampling and with Local-only."""
    runs = {o: read_bench(OUT / o, samples=SAMPLES) for o in options if (OUT / o / "results.csv").is_file()}
    uniform_local = curves(OUT / "uniform", "local") if "uniform" in runs else {}
    target = {s: float(np.mean(c[-5:])) for s, c in uniform_local.items()}
    rows = []
    for option in options:
        for method in METHODS:
            accs = runs.get(option, {}).get(method)
            if not accs:
                rows.append({"option": option, "method": method, "status": "not run"})
                continue
            worst = worst_last(OUT / option, method)
            rows.append({
                "option": option, "method": method, "status": "ok", "seeds": sorted(accs),
                "accuracy": stat(list(accs.values())), "worst_client": stat(list(worst.values())) if worst else None,
                "vs_uniform": None if option == "uniform" else paired(accs, runs.get("uniform", {}).get(method, {})),
                "vs_local": None if method == "local" else paired(accs, runs[option].get("local", {})),
                "rounds_to_uniform_local": {s: rounds_to_reach(c, target[s])
                                            for s, c in curves(OUT / option, method).items() if s in target}})
    return rows


def reach_text(reach: dict[int, int | None]) -> str:
    return " / ".join("never" if r is None else str(r) for _, r in sorted(reach.items())) or "—"


def write_csv(rows: list[dict], path: Path) -> None:
    columns = ["option", "method", "status", "acc_mean", "acc_std", "worst_mean", "worst_std", "vs_uniform_mean",
               "vs_uniform_std", "vs_local_mean", "vs_local_std", "rounds_to_uniform_local_by_seed", "seeds"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            out = {"option": r["option"], "method": r["method"], "status": r["status"]}
            if r["status"] == "ok":
                out.update(seeds=" ".join(map(str, r["seeds"])),
                           rounds_to_uniform_local_by_seed=reach_text(r["rounds_to_uniform_local"]))
                out.update(points_columns({"acc": r["accuracy"], "worst": r["worst_client"],
                                           "vs_uniform": r["vs_uniform"], "vs_local": r["vs_local"]}))
            writer.writerow(out)


def plot(options: list[str], path: Path) -> None:
    """Seed-mean personalized accuracy over all clients by round, each method under each mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for option in options:
        for method in METHODS:
            by_seed = curves(OUT / option, method)
            if by_seed:
                ax.plot(*seed_mean_curve(by_seed), label=f"{method}, {option} ({len(by_seed)} seeds)",
                        linestyle="--" if method == "local" else "-")
    save_plot(fig, ax, path, "round",
              "personalized accuracy %, all 100 clients",
              "10 % of 100 clients a round: selection by loss against uniform")


def main(argv: list[str]) -> None:
    args = run_options(argv, __doc__.splitlines()[0], list(OPTIONS), bench_command)
    rows = table(list(OPTIONS))
    write_csv(rows, RESULTS / "selection.csv")
    plot(list(OPTIONS), RESULTS / "selection.png")
    path = write_result("selection", {
        "command": "python benchmarks/selection.py",
        "bench_commands": {o: " ".join(bench_command(o, args.seeds)) for o in OPTIONS}, "rows": rows})
    print("| method | selection | personalized acc % | worst client % | vs uniform (points) | vs Local-only "
          "(points) | rounds to uniform Local-only's final accuracy, by seed |\n|---|---|---|---|---|---|---|")
    for r in rows:
        if r["status"] != "ok":
            print(f"| {r['method']} | {r['option']} | not run | | | | |")
            continue
        print(f"| {r['method']} | {r['option']} | {pct(r['accuracy'])} | {pct(r['worst_client'])} | "
              f"{pct(r['vs_uniform'], sign=True)} | {pct(r['vs_local'], sign=True)} | "
              f"{reach_text(r['rounds_to_uniform_local'])} |")
    print(f"wrote {path}, selection.csv and selection.png")


if __name__ == "__main__":
    main(sys.argv[1:])
