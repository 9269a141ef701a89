"""Where federation pays: each method's gain over Local-only against the samples per client.

Reads finished `pfedes-bench` directories, one per data size (the same strategies, seeds and
setting otherwise), and writes `benchmarks/results/sample_sweep.json` (per size and strategy: the
accuracy and the gain over Local-only paired by seed, mean ± std) and `sample_sweep.png`.

    for n in 100 250; do pfedes-bench strategies=[local,pfedes,pfedes_unshared,lgfedavg,fd] seeds=[0,1,2] \\
        data.partition=dirichlet data.alpha=0.3 num_clients=10 num_rounds=60 data.val_fraction=0.15 \\
        data.path=../shared/data/cifar10 data.samples_per_client=$n out_dir=benchmarks/results/sweep_n${n}_60r; done
    python benchmarks/sample_sweep.py 100=benchmarks/results/sweep_n100_60r 250=benchmarks/results/sweep_n250_60r \\
        500=benchmarks/results/hetero_dirichlet_val

(the 60 rounds of the reference table at 500 samples; the older 40-round directories, sweep_n100 and
sweep_n250, were short of Local-only's plateau at 250)

Each directory's runs must have been made with the samples per client it is given for (checked
against the runs' summary.json).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, read_bench, stat, write_result  # noqa: E402

LOCAL = "local"


def sweep_of(benches: list[str]) -> dict[int, dict[str, dict]]:
    """{size: {strategy: accuracy and gain over Local-only (paired by seed)}} from SIZE=DIR items."""
    sweep: dict[int, dict[str, dict]] = {}
    for item in benches:
        size, _, directory = item.partition("=")
        accs = read_bench(Path(directory), samples=int(size))
        if LOCAL not in accs:
            raise SystemExit(f"sample_sweep: {directory} has no Local-only run to measure gains against")
        sweep[int(size)] = {
            name: {"accuracy": stat(list(by_seed.values())),
                   "gain_vs_local": None if name == LOCAL else stat(
                       [acc - accs[LOCAL][s] for s, acc in by_seed.items() if s in accs[LOCAL]]),
                   "seeds": sorted(by_seed), "bench": directory}
            for name, by_seed in accs.items()}
    return sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benches", nargs="+", metavar="SIZE=DIR", help="samples per client = a pfedes-bench out_dir")
    args = parser.parse_args()
    sweep = sweep_of(args.benches)
    sizes = sorted(sweep)
    path = write_result("sample_sweep", {"command": " ".join(["python benchmarks/sample_sweep.py", *args.benches]),
                                         "samples_per_client": sizes, "by_size": {str(n): sweep[n] for n in sizes}})
    plot(sweep, sizes, RESULTS / "sample_sweep.png")
    for n in sizes:
        cells = [f"{name} {100 * v['accuracy']['mean']:.1f}%" + (
            "" if v["gain_vs_local"] is None else f" ({100 * v['gain_vs_local']['mean']:+.1f})")
            for name, v in sweep[n].items()]
        print(f"{n} samples per client: " + ", ".join(cells))
    print(f"wrote {path} and {RESULTS / 'sample_sweep.png'}")


def plot(sweep: dict[int, dict[str, dict]], sizes: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    names = sorted({name for n in sizes for name in sweep[n] if name != LOCAL})
    for i, name in enumerate(names):
        xs = [n for n in sizes if name in sweep[n]]
        gains = [sweep[n][name]["gain_vs_local"] for n in xs]
        every_size = xs == sizes  # a line only where no size is missing: none drawn across a gap
        ax.errorbar(xs, [100 * g["mean"] for g in gains], yerr=[100 * (g["std"] or 0.0) for g in gains],
                    marker="o", capsize=3, color=f"C{i}", linestyle="-" if every_size else "none",
                    label=name if every_size else f"{name} (not run at every size)")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_xlabel("samples per client (before the train / validation / test split)")
    ax.set_ylabel("gain over Local-only (points, ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
