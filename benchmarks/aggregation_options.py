"""Two-tier and contribution-weighted aggregation against flat aggregation (issue 15, parts 3 and 5):
pFedES on the reference heterogeneous setting (the zoo, 10 clients, Dirichlet alpha 0.3, 500 samples
per client, 15 % validation, 60 rounds), each aggregation option against the flat sample-weighted
mean, paired by seed.

    python benchmarks/aggregation_options.py [--options flat two_tier ...] [--seeds 0 1 2] [--no-run]

Each option, flat included, is one `pfedes-bench` run of pfedes into
benchmarks/results/aggregation/<option>/ (finished runs are reused, so the command resumes); the
Local-only runs are those of the heterogeneous Dirichlet table, benchmarks/results/hetero_dirichlet_val,
made with the same setting. Every option runs at its conf/ defaults: nothing here was tuned. Per
option: the final accuracy (mean of the last 5 rounds), its change against flat and its gain over
Local-only, and the rounds it takes to reach Local-only's plateau (per seed, the first round whose
5-round trailing mean reaches Local-only's last-5-round mean on that seed). An option whose runs were
made with other settings than the flat runs (besides its own) is reported as such, unpaired:
finished runs of an earlier default are not compared with runs of today's. --no-run only reads what
has finished. Writes benchmarks/results/aggregation_options.{csv,json,png}.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (REFERENCE_BENCH, RESULTS, curves, option_command, overridden, paired, pct,  # noqa: E402
                     points_columns, read_bench, rounds_to_reach, run_options, save_plot, seed_mean_curve,
                     settings_apart, stat, write_result)

LOCAL_BENCH = REFERENCE_BENCH  # its Local-only runs, made with the same setting
OUT = RESULTS / "aggregation"
METHOD = "pfedes"
OPTIONS = {  # name -> aggregation overrides
    "flat": [],  # conf/'s default: the sample-weighted mean of every accepted reply
    # each device profile's mean, then the profiles equally (weighing the profiles by samples instead
    # is the flat mean again under the default rule, by construction: tests/test_robust.py)
    "two_tier": ["aggregation.groups=device"],
    "val_score": ["aggregation.weighting=val_score"],  # softmax of the reported validation accuracy
    "quality": ["aggregation.weighting=quality"],  # FQI/DLI blend
}


def bench_command(option: str, seeds: list[int]) -> list[str]:
    return option_command(METHOD, seeds, OPTIONS[option], OUT / option)


def row(option: str, directory: Path, flat: dict[int, float], local: dict[int, float],
        local_curves: dict[int, list[float]]) -> dict:
    accs = read_bench(directory, samples=500).get(METHOD, {})
    reach = {s: rounds_to_reach(c, local[s]) for s, c in curves(directory, METHOD).items() if s in local}
    return {"option": option, "status": "ok", "seeds": sorted(accs), "accuracy": stat(list(accs.values())),
            "vs_flat": None if option == "flat" else paired(accs, flat), "vs_local": paired(accs, local),
            "rounds_to_local_plateau": reach,
            "local_plateau_rounds": {s: rounds_to_reach(c, local[s]) for s, c in local_curves.items()}}


def table(options: list[str]) -> list[dict]:
    """One row per option (flat first, and needed), paired by seed with flat and with Local-only."""
    reference = OUT / "flat"
    if not (reference / "results.csv").is_file():
        raise SystemExit(f"no flat runs in {reference}: run the flat option first")
    flat = read_bench(reference, samples=500)[METHOD]
    local = read_bench(LOCAL_BENCH, samples=500)["local"]
    local_curves = curves(LOCAL_BENCH, "local")
    rows = []
    for option in ["flat", *(o for o in options if o != "flat")]:
        directory = OUT / option
        if not (directory / "results.csv").is_file() or METHOD not in read_bench(directory, samples=500):
            rows.append({"option": option, "status": "not run"})
        elif apart := settings_apart(directory, reference, METHOD, free=overridden(OPTIONS[option])):
            rows.append({"option": option, "status": "other settings than flat: " + " ".join(apart)})
        else:
            rows.append(row(option, directory, flat, local, local_curves))
    return rows


def reach_text(reach: dict[int, int | None]) -> str:
    return " / ".join("never" if r is None else str(r) for _, r in sorted(reach.items()))


def write_csv(rows: list[dict], path: Path) -> None:
    columns = ["option", "status", "acc_mean", "acc_std", "vs_flat_mean", "vs_flat_std", "vs_local_mean",
               "vs_local_std", "rounds_to_local_plateau_by_seed", "seeds"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            flat = {"option": r["option"], "status": r["status"]}
            if r["status"] == "ok":
                flat.update(seeds=" ".join(map(str, r["seeds"])),
                            rounds_to_local_plateau_by_seed=reach_text(r["rounds_to_local_plateau"]))
                flat.update(points_columns({"acc": r["accuracy"], "vs_flat": r["vs_flat"], "vs_local": r["vs_local"]}))
            writer.writerow(flat)


def plot(options: list[str], path: Path) -> None:
    """Seed-mean personalized accuracy by round: Local-only and each of `options` (flat among them) that has runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {"Local-only": curves(LOCAL_BENCH, "local")}
    series.update({o: curves(OUT / o, METHOD) for o in options})
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, by_seed in series.items():
        if by_seed:
            ax.plot(*seed_mean_curve(by_seed), label=f"{name} ({len(by_seed)} seeds)",
                    linestyle="--" if name == "Local-only" else "-")
    save_plot(fig, ax, path, "round",
              "personalized accuracy % (mean over seeds)",
              "pFedES: aggregation options against the flat mean")


def main(argv: list[str]) -> None:
    args = run_options(argv, __doc__.splitlines()[0], list(OPTIONS), bench_command)
    rows = table(list(OPTIONS))
    write_csv(rows, RESULTS / "aggregation_options.csv")
    plot([r["option"] for r in rows if r["status"] == "ok"], RESULTS / "aggregation_options.png")
    path = write_result("aggregation_options", {
        "command": "python benchmarks/aggregation_options.py",
        "bench_commands": {o: " ".join(bench_command(o, args.seeds)) for o in OPTIONS},
        "local_bench": str(LOCAL_BENCH.relative_to(RESULTS.parents[1])), "rows": rows})
    print("| option | personalized acc % | vs flat (points) | vs Local-only (points) | rounds to Local-only's "
          "plateau, by seed |\n|---|---|---|---|---|")
    for r in rows:
        if r["status"] != "ok":
            print(f"| {r['option']} | {r['status']} | | | |")
            continue
        print(f"| {r['option']} | {pct(r['accuracy'])} | {'—' if r['vs_flat'] is None else pct(r['vs_flat'], sign=True)}"
              f" | {pct(r['vs_local'], sign=True)} | {reach_text(r['rounds_to_local_plateau'])} |")
    print(f"wrote {path}, aggregation_options.csv and aggregation_options.png")


if __name__ == "__main__":
    main(sys.argv[1:])
