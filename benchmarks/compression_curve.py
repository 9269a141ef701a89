"""Bytes against accuracy for compressed uploads (issue 15, target P3): pFedES on the reference
heterogeneous setting (the zoo, 10 clients, Dirichlet alpha 0.3, 500 samples per client, 15 %
validation, 60 rounds), each compression option against the uncompressed (fp32) runs, paired by seed.

    python benchmarks/compression_curve.py [--options fp32 fp16 int8 ...] [--seeds 0 1 2] [--no-run]

Each option, fp32 included, is one `pfedes-bench` run of pfedes into
benchmarks/results/compression/<option>/ (finished runs are reused, so the command resumes); the
Local-only runs are those of the heterogeneous Dirichlet table, benchmarks/results/hetero_dirichlet_val,
made with the same setting. An option whose runs were made with other settings than the fp32 runs
(besides its compression) is reported as such, unpaired: finished runs of an earlier default are
not compared with runs of today's. --no-run only reads what has finished (a missing option shows as
not run). The bytes are those measured in the runs (bytes_up_per_client in metrics.jsonl: the
encoded arrays in the messages), as a share of the mean full fp32 model of the zoo. Writes
benchmarks/results/compression_curve.{csv,json,png}."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (REFERENCE_BENCH, REFERENCE_SETTING, RESULTS, experiment, option_command, paired, pct,  # noqa: E402
                     overridden, points_columns, read_bench, run_options, save_plot, settings_apart, stat,
                     write_result)
from compression_bytes import client_trainers, mean_full_model_bytes  # noqa: E402

SETTING = REFERENCE_SETTING
LOCAL_BENCH = REFERENCE_BENCH  # its Local-only runs, made with SETTING
OUT = RESULTS / "compression"
METHOD = "pfedes"
OPTIONS = {  # name -> compression overrides (top-k sends the change, with error feedback: conf/'s default)
    "fp32": [],
    "fp16": ["compression.quantize=fp16"],
    "int8": ["compression.quantize=int8"],
    "top25": ["compression.topk=0.25"],
    "top10": ["compression.topk=0.1"],
    "int8+top50": ["compression.quantize=int8", "compression.topk=0.5"],
    "int8+top25": ["compression.quantize=int8", "compression.topk=0.25"],
    "int8+top10": ["compression.quantize=int8", "compression.topk=0.1"],
    # what the direction check costs under top-k: the same with it off (a diagnostic, not a setting to use)
    "int8+top10_nocheck": ["compression.quantize=int8", "compression.topk=0.1", "aggregation.direction_spread=0",
                           "aggregation.direction_strikes=0"],
}


def bench_command(option: str, seeds: list[int]) -> list[str]:
    return option_command(METHOD, seeds, OPTIONS[option], OUT / option)


def upload_bytes(directory: Path) -> dict[int, float]:
    """{seed: mean upload bytes per trained client and round} of the method's finished runs."""
    rows = [r for r in csv.DictReader((directory / "results.csv").open())
            if r["status"] == "ok" and r["strategy"] == METHOD]
    return {int(r["seed"]): float(r["bytes_up_per_client_round"]) for r in rows}


def curve(options: list[str], full_bytes: float) -> list[dict]:
    """One row per option (fp32 first, and needed): bytes, accuracy, and the paired changes against
    fp32 and Local-only; an option made with other settings than fp32 besides its compression is
    left unpaired, with the settings that differ."""
    reference = OUT / "fp32"
    if not (reference / "results.csv").is_file():
        raise SystemExit(f"no fp32 runs in {reference}: run the fp32 option first")
    fp32 = read_bench(reference, samples=500)[METHOD]
    local = read_bench(LOCAL_BENCH, samples=500)["local"]
    rows = []
    for option in ["fp32", *(o for o in options if o != "fp32")]:
        directory = OUT / option
        if not (directory / "results.csv").is_file():
            rows.append({"option": option, "status": "not run"})
            continue
        apart = settings_apart(directory, reference, METHOD, free=overridden(OPTIONS.get(option, [])))
        if apart:
            rows.append({"option": option, "status": "other settings than fp32: " + " ".join(apart)})
            continue
        accs = read_bench(directory, samples=500).get(METHOD, {})
        mean_bytes = stat(list(upload_bytes(directory).values()))["mean"]
        rows.append({"option": option, "status": "ok", "seeds": sorted(accs),
                     "upload_kib": mean_bytes / 1024, "pct_of_full_model": 100 * mean_bytes / full_bytes,
                     "accuracy": stat(list(accs.values())), "vs_fp32": paired(accs, fp32),
                     "vs_local": paired(accs, local)})
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    columns = ["option", "status", "upload_kib", "pct_of_full_model", "acc_mean", "acc_std",
               "vs_fp32_mean", "vs_fp32_std", "vs_local_mean", "vs_local_std", "seeds"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            flat = {"option": r["option"], "status": r["status"]}
            if r["status"] == "ok":
                flat.update(upload_kib=r["upload_kib"], pct_of_full_model=r["pct_of_full_model"],
                            seeds=" ".join(map(str, r["seeds"])))
                flat.update(points_columns({"acc": r["accuracy"], "vs_fp32": r["vs_fp32"], "vs_local": r["vs_local"]}))
            writer.writerow(flat)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in done:
        change = r["vs_fp32"] or {"mean": 0.0, "std": None}  # fp32 against itself: 0
        ax.errorbar(r["pct_of_full_model"], 100 * change["mean"], yerr=100 * (change["std"] or 0.0),
                    fmt="o", capsize=3)
        ax.annotate(f"{r['option']} ({len(r['seeds'])} seeds)", (r["pct_of_full_model"], 100 * change["mean"]),
                    textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.axhline(-0.5, color="grey", linestyle=":", label="P3: lose at most 0.5 points")
    ax.axvline(3.0, color="tab:red", linestyle="--", label="P3: upload at most 3 % of a full model")
    ax.set_xscale("log")
    save_plot(fig, ax, path, "upload per client and round, % of the mean full fp32 model (log)",
              "accuracy change against fp32, points\n(paired by seed, mean ± std)",
              "pFedES: bytes against accuracy, compressed uploads")


def main(argv: list[str]) -> None:
    args = run_options(argv, __doc__.splitlines()[0], list(OPTIONS), bench_command)
    full_bytes = mean_full_model_bytes(client_trainers(experiment(SETTING)))
    rows = curve(list(OPTIONS), full_bytes)
    write_csv(rows, RESULTS / "compression_curve.csv")
    plot(rows, RESULTS / "compression_curve.png")
    path = write_result("compression_curve", {
        "command": "python benchmarks/compression_curve.py",
        "bench_commands": {o: " ".join(bench_command(o, args.seeds)) for o in OPTIONS},
        "local_bench": str(LOCAL_BENCH.relative_to(RESULTS.parents[1])),
        "mean_full_model_kib": full_bytes / 1024, "rows": rows})
    print("| option | upload / client / round | % of full model | personalized acc % | vs fp32 (points) "
          "| vs Local-only (points) |\n|---|---|---|---|---|---|")
    for r in rows:
        if r["status"] != "ok":
            print(f"| {r['option']} | {r['status']} | | | | |")
            continue
        print(f"| {r['option']} | {r['upload_kib']:.1f} KiB | {r['pct_of_full_model']:.2f} | {pct(r['accuracy'])} | "
              f"{'—' if r['option'] == 'fp32' else pct(r['vs_fp32'], sign=True)} | {pct(r['vs_local'], sign=True)} |")
    print(f"wrote {path}, compression_curve.csv and compression_curve.png")


if __name__ == "__main__":
    main(sys.argv[1:])
