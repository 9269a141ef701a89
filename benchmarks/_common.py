"""Shared by the benchmark scripts: the experiment from hydra overrides, results as JSON + a table."""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import platform
import time
from pathlib import Path

import numpy as np

from pfedes.bench.runs import LAST_ROUNDS as LAST

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SHARED_CIFAR = ROOT.parent / "shared" / "data" / "cifar10"
# the reference heterogeneous setting (the zoo, 10 clients, Dirichlet 0.3, 500 samples per client,
# 15 % validation, 60 rounds) and the table made with it, whose pfedes and Local-only runs the
# benchmarks of one option of pfedes pair their runs with
REFERENCE_SETTING = ["num_rounds=60", "data.samples_per_client=500", "data.partition=dirichlet", "data.alpha=0.3",
                     "num_clients=10", "data.path=../shared/data/cifar10", "data.val_fraction=0.15"]
REFERENCE_BENCH = RESULTS / "hetero_dirichlet_val"


def option_command(method: str, seeds: list[int], overrides: list[str], out: Path) -> list[str]:
    """The pfedes-bench command of one option of a method on the reference setting."""
    return ["pfedes-bench", f"strategies=[{method}]", f"seeds=[{','.join(map(str, seeds))}]", *REFERENCE_SETTING,
            *overrides, f"out_dir={out.relative_to(ROOT)}"]


def run_options(argv: list[str], description: str, options: list[str], command) -> argparse.Namespace:
    """The command line of a benchmark of options (--options, --seeds, --no-run); runs command(option,
    seeds) for each chosen option unless --no-run (pfedes-bench reuses finished runs)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--options", nargs="+", choices=options, default=options)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-run", action="store_true", help="report the finished runs only")
    args = parser.parse_args(argv)
    if not args.no_run:
        for option in args.options:
            subprocess.run(command(option, args.seeds), check=True, cwd=ROOT)
    return args


def default_data_path() -> str:
    if not (SHARED_CIFAR / "train.parquet").is_file():
        return "embedded"
    return os.path.relpath(SHARED_CIFAR)  # as a user would type it: results carry no machine paths


def experiment(overrides: list[str], **settings) -> dict:
    """experiment_config with the benchmark's settings, then the user's command-line overrides."""
    from pfedes.config import experiment_config

    base = [f"{k}={v}" for k, v in settings.items()]
    return experiment_config(base + list(overrides))


def write_result(name: str, result: dict, directory: Path | None = None) -> Path:
    """<directory, default benchmarks/results>/<name>.json, with when and on what it ran."""
    directory = RESULTS if directory is None else directory
    directory.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, **result}
    path = directory / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(fmt(r.get(c)).ljust(widths[c]) for c in columns))


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "-" if v is None else str(v)


def process_tree(pid: int) -> list[int]:
    """A process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    tree, stack = [], [pid]
    while stack:
        p = stack.pop()
        if p not in tree:
            tree.append(p)
            stack.extend(children.get(p, []))
    return tree


def rss_tree_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (from /proc)."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def cpu_seconds_by_process(pid: int) -> dict[tuple[int, int, str], float]:
    """CPU seconds (user + system) so far of a process and each of its live descendants, keyed by
    (pid, start time, name) so that a reused pid is another process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for p in process_tree(pid):
        try:
            name, rest = Path(f"/proc/{p}/stat").read_text().split("(", 1)[1].rsplit(")", 1)
            fields = rest.split()
            out[(p, int(fields[19]), name)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return out


def read_bench(directory: Path, samples: int | None = None) -> dict[str, dict[int, float]]:
    """{strategy: {seed: personalized accuracy}} of the finished runs in a pfedes-bench directory
    (its results.csv); with `samples`, the runs must have been made with that many per client."""
    rows = [r for r in csv.DictReader((directory / "results.csv").open()) if r["status"] == "ok"]
    if not rows:
        raise SystemExit(f"no finished run in {directory}")
    for r in rows:
        summary = directory / r["strategy"] / f"seed{r['seed']}" / "summary.json"
        if samples is not None and summary.is_file():
            made = int(json.loads(summary.read_text())["config"]["data"]["samples_per_client"])
            if made != samples:
                raise SystemExit(f"{directory} was made with {made} samples per client, not {samples}")
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        out.setdefault(r["strategy"], {})[int(r["seed"])] = float(r["acc_mean_last"])
    return out


def settings_apart(directory: Path, reference: Path, strategy: str, free: tuple[str, ...] = ()) -> list[str]:
    """The settings (dotted names) in which a bench directory's finished runs of a strategy were made
    otherwise than the reference directory's runs of it with the same seed, leaving out `free` (the
    settings of the option being measured, dotted names or the groups above them) and what names a
    run rather than configures it. A setting one of them did not have yet counts at its value from
    before it existed (`with_later_settings`)."""
    from pfedes.bench.runs import REUSE_FREE_KEYS
    from pfedes.config import with_later_settings

    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
        return out

    apart: set[str] = set()
    for run in sorted((directory / strategy).glob("seed*/summary.json")):
        against = reference / strategy / run.parent.name / "summary.json"
        if not against.is_file():
            continue
        mine, theirs = (json.loads(p.read_text())["config"] for p in (run, against))
        mine = with_later_settings(mine, theirs)  # each given the settings the other has: both all of them
        theirs = with_later_settings(theirs, mine)
        mine, theirs = flat(with_later_settings(mine, theirs)), flat(theirs)
        apart |= {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)
                  and k.split(".")[0] not in REUSE_FREE_KEYS
                  and not any(k == f or k.startswith(f"{f}.") for f in free)}
    return sorted(apart)


def overridden(overrides: list[str]) -> tuple[str, ...]:
    """The dotted names that hydra overrides set ("a.b=1" -> "a.b")."""
    return tuple(o.split("=", 1)[0].lstrip("+~") for o in overrides)


def curves(directory: Path, strategy: str) -> dict[int, list[float]]:
    """{seed: personalized accuracy by round} of a bench directory's finished runs of a strategy."""
    out = {}
    for run in sorted((directory / strategy).glob("seed*")):
        if (run / "summary.json").is_file():
            rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
            out[int(run.name[4:])] = [r["acc_mean"] for r in rounds if r.get("acc_mean") is not None]
    return out


def seed_mean_curve(by_seed: dict[int, list[float]]) -> tuple[range, np.ndarray]:
    """Rounds 1..n and the mean over seeds of a curve, in percent (n: the shortest seed's length)."""
    length = min(len(c) for c in by_seed.values())
    return range(1, length + 1), 100 * np.mean([c[:length] for c in by_seed.values()], axis=0)


def save_plot(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Label a benchmark's one-axes figure (with its legend), write it as a PNG and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rounds_to_reach(curve: list[float], target: float) -> int | None:
    """The first round (1-based) whose trailing mean over LAST rounds reaches target; None if none does."""
    for end in range(LAST, len(curve) + 1):
        if np.mean(curve[end - LAST:end]) >= target:
            return end
    return None


def stat(values: list[float]) -> dict[str, float | None]:
    """Mean, sample standard deviation (None for one value) and count."""
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else None,
            "n": len(values)}


def paired(values: dict[int, float], against: dict[int, float]) -> dict | None:
    """values - against, paired by seed over the seeds both have: mean, std and each seed's."""
    common = sorted(set(values) & set(against))
    if not common:
        return None
    diffs = [values[s] - against[s] for s in common]
    return {**stat(diffs), "by_seed": {s: d for s, d in zip(common, diffs)}}


def points_columns(figures: dict[str, dict | None]) -> dict[str, float | None]:
    """{name: stat()/paired() figure} as CSV columns in points: <name>_mean, <name>_std (none missing)."""
    out = {}
    for name, value in figures.items():
        if value is not None:
            out[f"{name}_mean"] = 100 * value["mean"]
            out[f"{name}_std"] = None if value["std"] is None else 100 * value["std"]
    return out


def pct(value: dict | None, sign: bool = False) -> str:
    """A stat()/paired() figure as points: "mean ± std" ("—" when there is none)."""
    if value is None:
        return "—"
    std = "" if value["std"] is None else f" ± {100 * value['std']:.1f}"
    return f"{100 * value['mean']:{'+' if sign else ''}.1f}{std}"
