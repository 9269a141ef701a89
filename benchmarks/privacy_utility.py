"""Privacy against accuracy (issue 16): personalized accuracy at a target epsilon of inf (no
privacy), 8, 4 and 1 (delta 1e-5), pFedES and FedAvg, 3 seeds, each private run paired by seed
with the non-private one.

`pfedes_validated` is pFedES whose clients pick their ensemble's weights on their validation
splits (strategy.ensemble_weight: validated), so that a client can fall back on its private model
when the noised shared branch is worse.

FedAvg needs one architecture (pfedes-bench skips it on the zoo), so the two are compared where
both run: every client a phone (CNN3). There FedAvg shares the whole CNN3 (321,290 entries) and
pFedES its proxy and shared classifier (33,306). pFedES is also run on the reference
heterogeneous setting (the zoo of phone, gateway and GPU host), whose non-private runs are the
reference table's (`benchmarks/results/hetero_dirichlet_val`; it has no `pfedes_validated`, so on
the zoo that method is compared with Local-only only). Everything else is the reference
setting: Dirichlet 0.3, 10 clients, 500 samples per client, 60 rounds, validation split 0.15.

The private runs use central DP (`privacy.mode=central`, the server clips each update and noises
the equal-weight mean) with per-model clipping (C_i = sqrt(n_i / 100,000): 1.79 for FedAvg's
CNN3, 0.58 for pFedES's proxy, the same bound on an entry's root-mean-square change); the
clipping norm was not tuned for either method. Local DP (each client noises its own reply) is an
optional third panel. The non-private run (epsilon = inf) aggregates by the sample-weighted mean
without clipping, so the paired loss is that of the whole mechanism (clipping, equal weights and
noise):

    COMMON="seeds=[0,1,2] data.partition=dirichlet data.alpha=0.3 num_clients=10 num_rounds=60 \\
      data.path=../shared/data/cifar10 data.samples_per_client=500 data.val_fraction=0.15"
    DP="privacy.delta=1e-5 privacy.clipping=per_model"
    OUT=benchmarks/results/privacy_utility
    pfedes-bench strategies=[fedavg,pfedes,pfedes_validated] clients.devices=[phone] $COMMON out_dir=$OUT/phone_epsinf
    for eps in 8 4 1; do
      pfedes-bench strategies=[fedavg,pfedes,pfedes_validated] clients.devices=[phone] $COMMON $DP \\
        privacy.target_epsilon=$eps out_dir=$OUT/phone_central_eps$eps
      pfedes-bench strategies=[pfedes,pfedes_validated] $COMMON $DP privacy.target_epsilon=$eps \\
        out_dir=$OUT/zoo_central_eps$eps
    done
    # optional: local DP
    for eps in 8 4 1; do
      pfedes-bench strategies=[fedavg,pfedes] clients.devices=[phone] $COMMON $DP privacy.mode=local \\
        privacy.target_epsilon=$eps out_dir=$OUT/phone_local_eps$eps
    done
    python benchmarks/privacy_utility.py

writes `benchmarks/results/privacy_utility.{json,md,png}`. A run that is missing, stopped before
60 rounds, or was made with other privacy or device settings than its cell asks for is "not run"
(the JSON says why); a cell is reported with the seeds it has.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT as REPO  # noqa: E402
from _common import RESULTS, paired, pct, stat, write_result  # noqa: E402

NAME = "privacy_utility"
ROOT = RESULTS / NAME  # the pfedes-bench directories of the commands above
REFERENCE = RESULTS / "hetero_dirichlet_val"  # the zoo's non-private runs, and its Local-only runs
LOCAL_PHONE = RESULTS / "homog_dirichlet_val"  # Local-only with every client a phone, the same setting
ROUNDS = 60
SEEDS = (0, 1, 2)
DELTA = 1e-5
EPSILONS = (math.inf, 8.0, 4.0, 1.0)
# (panel, setting, privacy mode, strategies)
PANELS = [("one architecture (phone), central DP", "phone", "central", ("fedavg", "pfedes", "pfedes_validated")),
          ("zoo (phone, gateway, GPU host), central DP", "zoo", "central", ("pfedes", "pfedes_validated")),
          ("one architecture (phone), local DP", "phone", "local", ("fedavg", "pfedes"))]


def shown(path: Path) -> str:
    """A path as the results show it: relative to the repository where it is inside it."""
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


def eps_name(eps: float) -> str:
    return "inf" if math.isinf(eps) else f"{eps:g}"


def bench_dirs(root: Path, reference: Path, setting: str, mode: str, eps: float) -> list[Path]:
    """Where a cell's runs may be, in order: its own bench directory; for the zoo's non-private
    runs, then the reference table's."""
    if math.isinf(eps):
        return [root / f"{setting}_epsinf"] + ([reference] if setting == "zoo" else [])
    return [root / f"{setting}_{mode}_eps{eps_name(eps)}"]


def settings_problem(config: dict, setting: str, mode: str, eps: float) -> str | None:
    """Why a run's configuration is not that of its cell, or None."""
    privacy = config.get("privacy") or {}
    target = float(privacy.get("target_epsilon", 0.0))
    private = target > 0 or float(privacy.get("noise_multiplier", 0.0)) > 0
    devices = set((config.get("clients") or {}).get("devices") or [])
    if math.isinf(eps) and private:
        return f"privacy is on (target_epsilon {target:g}), the cell is the non-private run"
    if not math.isinf(eps):
        if target != eps:
            return f"made with privacy.target_epsilon {target:g}, not {eps:g}"
        if privacy.get("mode", "central") != mode or float(privacy.get("delta", 0.0)) != DELTA:
            return f"made with privacy.mode {privacy.get('mode', 'central')} and delta {privacy.get('delta')}"
    if (setting == "phone") != (devices == {"phone"}):
        return f"made with clients.devices {sorted(devices)}"
    return None


def read_run(directory: Path, strategy: str, seed: int, setting: str, mode: str, eps: float) -> dict:
    """{"acc", "worst", "epsilon"} of a finished run, or {"missing": why}."""
    run = directory / strategy / f"seed{seed}"
    if not (run / "summary.json").is_file():
        return {"missing": f"not run ({shown(run)} has no summary.json)"}
    summary = json.loads((run / "summary.json").read_text())
    if int(summary.get("rounds", 0)) != ROUNDS:
        return {"missing": f"{shown(run)} ran {summary.get('rounds')} rounds, not {ROUNDS}"}
    problem = settings_problem(summary.get("config") or {}, setting, mode, eps)
    if problem:
        return {"missing": f"{shown(run)}: {problem}"}
    epsilon = summary.get("dp_epsilon")
    metrics = run / "metrics.jsonl"
    if metrics.is_file():  # the accountant's figure of the last round that released an aggregate
        for line in reversed([line for line in metrics.read_text().splitlines() if line.strip()]):
            reported = (json.loads(line).get("server_metrics") or {}).get("dp_epsilon")
            if reported is not None:
                epsilon = reported
                break
    return {"acc": float(summary["acc_mean_last5"]), "worst": float(summary["acc_worst_last5"]),
            "epsilon": None if epsilon is None else float(epsilon)}


def read_cell(root: Path, reference: Path, setting: str, mode: str, strategy: str, eps: float) -> dict:
    """One method at one epsilon: {seed: run} and {seed: why missing}, from the first directory
    that has each seed."""
    runs, missing = {}, {}
    for seed in SEEDS:
        for directory in bench_dirs(root, reference, setting, mode, eps):
            got = read_run(directory, strategy, seed, setting, mode, eps)
            if "missing" not in got:
                runs[seed] = {**got, "bench": shown(directory)}
                missing.pop(seed, None)
                break
            missing.setdefault(seed, got["missing"])
    return {"runs": runs, "missing": missing}


def local_only(directory: Path, setting: str) -> dict:
    """Local-only's accuracy over the seeds it has in `directory` (it shares nothing, so privacy
    costs it nothing: the floor a private method should stay above)."""
    runs = {seed: read_run(directory, "local", seed, setting, "central", math.inf) for seed in SEEDS}
    acc = {seed: r["acc"] for seed, r in runs.items() if "missing" not in r}
    return {"bench": shown(directory), "seeds": sorted(acc), "accuracy": stat(list(acc.values())) if acc else None,
            "by_seed": acc}


def collect(root: Path, reference: Path, local_phone: Path = LOCAL_PHONE) -> list[dict]:
    """Per panel and method, per epsilon: accuracy over seeds, the epsilon the accountant
    reported, and the change against the non-private run paired by seed; and Local-only's accuracy."""
    panels = []
    for title, setting, mode, strategies in PANELS:
        local = local_only(local_phone if setting == "phone" else reference, setting)
        methods = {}
        for strategy in strategies:
            cells = {eps: read_cell(root, reference, setting, mode, strategy, eps) for eps in EPSILONS}
            base = {s: r["acc"] for s, r in cells[math.inf]["runs"].items()}
            methods[strategy] = {}
            for eps, cell in cells.items():
                acc = {s: r["acc"] for s, r in cell["runs"].items()}
                reached = [r["epsilon"] for r in cell["runs"].values() if r["epsilon"] is not None]
                methods[strategy][eps_name(eps)] = {
                    "status": "ok" if acc else "not run",
                    "seeds": sorted(acc),
                    "accuracy": stat(list(acc.values())) if acc else None,
                    "worst_client": stat([r["worst"] for r in cell["runs"].values()]) if acc else None,
                    "epsilon_reported": max(reached) if reached else None,
                    "vs_nonprivate": None if math.isinf(eps) else paired(acc, base),
                    "vs_local_only": paired(acc, local["by_seed"]),
                    "missing": cell["missing"],
                }
        gaps = {}  # how much more each later method loses than the first, paired by seed
        first = strategies[0]
        for second in strategies[1:]:
            for eps in EPSILONS[1:]:
                a, b = methods[first][eps_name(eps)]["vs_nonprivate"], methods[second][eps_name(eps)]["vs_nonprivate"]
                if a and b:
                    gaps.setdefault(second, {})[eps_name(eps)] = paired(b["by_seed"], a["by_seed"])
        panels.append({"panel": title, "setting": setting, "mode": mode, "methods": methods,
                       "loss_difference": gaps or None, "local_only": local})
    return panels


def markdown(panels: list[dict]) -> str:
    heads = " | ".join(f"ε = {'∞' if e == 'inf' else e}" for e in map(eps_name, EPSILONS))
    lines = ["Personalized accuracy % (mean ± std over seeds, last 5 rounds); in brackets the change "
             "against the non-private run in points, paired by seed; ε as the accountant reported it "
             f"(δ = {DELTA:g}).", "",
             "Made by `python benchmarks/privacy_utility.py` from the `pfedes-bench` runs its docstring names; "
             f"test splits of seeds {', '.join(map(str, SEEDS))}. Nothing was tuned for this table, so every method "
             "had the same (zero) budget: each runs at the defaults chosen on validation splits of tuning seed "
             "100, and the clipping norms follow one rule from the shared sizes.", ""]
    for panel in panels:
        lines += [f"**{panel['panel']}**", "", f"| method | {heads} |", "|---" * (len(EPSILONS) + 1) + "|"]
        for strategy, cells in panel["methods"].items():
            row = []
            for name in map(eps_name, EPSILONS):
                cell = cells[name]
                if cell["status"] != "ok":
                    row.append("not run")
                    continue
                text = pct(cell["accuracy"])
                if cell["vs_nonprivate"] is not None:
                    text += f" ({pct(cell['vs_nonprivate'], True)})"
                if cell["epsilon_reported"] is not None:
                    text += f", ε {cell['epsilon_reported']:.2f}"
                if len(cell["seeds"]) < len(SEEDS):
                    text += f", seeds {cell['seeds']}"
                row.append(text)
            lines.append(f"| {strategy} | " + " | ".join(row) + " |")
        first = next(iter(panel["methods"]))
        for second, gaps in (panel["loss_difference"] or {}).items():
            lines += ["", f"{second}'s change minus {first}'s (points, paired by seed; > 0: {second} loses less): "
                      + ", ".join(f"ε = {e}: {pct(v, True)}" for e, v in gaps.items())]
        local = panel["local_only"]
        lines += ["", "Local-only (shares nothing, so no privacy cost): "
                  + (f"{pct(local['accuracy'])}, seeds {local['seeds']} ({local['bench']})" if local["accuracy"]
                     else "not run")]
        for strategy, cells in panel["methods"].items():
            against = [(name, cells[name]["vs_local_only"]) for name in map(eps_name, EPSILONS)
                       if cells[name]["vs_local_only"] is not None]
            if against:
                lines += ["", f"{strategy} against Local-only (points, paired by seed): " + ", ".join(
                    f"ε = {'∞' if e == 'inf' else e}: {pct(v, True)} ("
                    + " / ".join(f"{100 * d:+.1f}" for d in v["by_seed"].values()) + ")" for e, v in against)]
        lines.append("")
    return "\n".join(lines)


def plot(panels: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), sharey=True, squeeze=False)
    xs = list(range(len(EPSILONS)))
    strategies = list(dict.fromkeys(s for panel in panels for s in panel["methods"]))  # one colour each, in every panel
    for ax, panel in zip(axes[0], panels):
        drawn = False
        for strategy, cells in panel["methods"].items():
            accs = [cells[eps_name(e)]["accuracy"] for e in EPSILONS]
            if all(a is None for a in accs):
                continue
            drawn = True  # an epsilon that is not run is a gap (NaN), not a line across it
            ax.errorbar(xs, [math.nan if a is None else 100 * a["mean"] for a in accs],
                        yerr=[0.0 if a is None else 100 * (a["std"] or 0.0) for a in accs], marker="o",
                        capsize=3, color=f"C{strategies.index(strategy)}", label=strategy)
        local = panel["local_only"]["accuracy"]
        if local is not None:
            ax.axhline(100 * local["mean"], color="gray", linestyle="--", label="Local-only")
        if not drawn:
            ax.text(0.5, 0.5, "not run", transform=ax.transAxes, ha="center", va="center", color="gray")
        else:
            ax.legend(fontsize=8)
        ax.set_xticks(xs, ["∞" if math.isinf(e) else f"{e:g}" for e in EPSILONS])
        ax.set_xlabel(f"target ε (δ = {DELTA:g})")
        ax.set_title(panel["panel"], fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("personalized accuracy % (± std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="where the pfedes-bench directories are")
    parser.add_argument("--reference", type=Path, default=REFERENCE, help="the zoo's non-private bench directory")
    parser.add_argument("--local-phone", type=Path, default=LOCAL_PHONE,
                        help="the bench directory of Local-only with every client a phone")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where privacy_utility.{json,md,png} go")
    args = parser.parse_args(argv)
    panels = collect(args.root, args.reference, args.local_phone)
    result = {"command": " ".join(["python benchmarks/privacy_utility.py", *(argv if argv is not None else sys.argv[1:])]),
              "setting": "Dirichlet 0.3, 10 clients, 500 samples per client, 60 rounds, val 0.15; "
                         f"delta {DELTA:g}, per-model clipping", "panels": panels}
    path = write_result(NAME, result, args.out)
    table = markdown(panels)
    (args.out / f"{NAME}.md").write_text(table)
    plot(panels, args.out / f"{NAME}.png")
    print(table)
    print(f"wrote {path}, {NAME}.md and {NAME}.png")
    return result


if __name__ == "__main__":
    main()
