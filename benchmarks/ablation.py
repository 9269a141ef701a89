"""pFedES's ablation: each part of the default turned off on its own, on the reference setting
(heterogeneous zoo, Dirichlet alpha = 0.3, 10 clients, 500 samples, 60 rounds, validation split
held out), 3 seeds, paired by seed with Local-only and with the default.

The default, Local-only and the whole-method controls come from the reference table
(`benchmarks/results/hetero_dirichlet_val`); each other row is a `pfedes-bench` run of the
default with one setting changed:

    for row in proxy_head=private proxy_epochs=0 predict_with=local proxy_norm=none; do
      pfedes-bench strategies=[pfedes] strategy.$row seeds=[0,1,2] data.partition=dirichlet \\
        data.alpha=0.3 num_clients=10 num_rounds=60 data.path=../shared/data/cifar10 \\
        data.samples_per_client=500 data.val_fraction=0.15 out_dir=benchmarks/results/ablation/${row/=/_}
    done
    python benchmarks/ablation.py

writes `benchmarks/results/ablation/ablation.json` and `ablation.md`. A row whose runs are not
all there is reported with the seeds it has (and says so); a run that did not reach the
reference's rounds is left out, and so is a single-setting run whose other settings differ from the
default's run of the same seed (one made before the default changed; re-running its command
re-runs it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, paired, pct, stat  # noqa: E402

from pfedes.bench.runs import REUSE_FREE_KEYS  # noqa: E402
from pfedes.config import flatten, with_later_settings  # noqa: E402

REFERENCE = RESULTS / "hetero_dirichlet_val"
ROUNDS = 60
SEEDS = (0, 1, 2)
# (label, what changes against the default, bench directory, strategy, the one strategy setting a
# single-setting row changes: None for the reference table's own runs)
ROWS = [
    ("default (`pfedes`)", "—", REFERENCE, "pfedes", None),
    ("nothing shared", "share: [] (`pfedes_unshared`): each client keeps its own proxy", REFERENCE,
     "pfedes_unshared", None),
    ("private proxy head", "proxy_head=private: a private head G_k on the proxy instead of the shared, "
                           "logit-adjusted classifier C", RESULTS / "ablation" / "proxy_head_private", "pfedes",
     "proxy_head"),
    ("proxy as trained here", "predict_with=local: the prediction uses the proxy after this client's passes, "
                              "not the one the server sent", RESULTS / "ablation" / "predict_with_local", "pfedes",
     "predict_with"),
    ("no extra proxy passes", "proxy_epochs=0 (the default takes {proxy_epochs})",
     RESULTS / "ablation" / "proxy_epochs_0", "pfedes", "proxy_epochs"),
    ("no normalisation in the proxy", "proxy_norm=none (the default: GroupNorm)",
     RESULTS / "ablation" / "proxy_norm_none", "pfedes", "proxy_norm"),
    ("previous default", "`pfedes_ensemble`: private head G_k, the proxy as trained here, 3 extra passes",
     REFERENCE, "pfedes_ensemble", None),
    ("seed form", "`pfedes_seed`: MSE alignment, no proxy in the prediction, proxy lr 0.1x, beta 0.5",
     REFERENCE, "pfedes_seed", None),
]


def summaries(directory: Path, strategy: str) -> dict[int, dict]:
    """{seed: summary.json} of the runs that finished the reference's rounds."""
    out = {}
    for seed in SEEDS:
        path = directory / strategy / f"seed{seed}" / "summary.json"
        if path.is_file():
            summary = json.loads(path.read_text())
            if int(summary["rounds"]) == ROUNDS:
                out[seed] = summary
    return out


def changed_settings(run: dict, default: dict) -> set[str]:
    """The settings (dotted) in which a run's saved config differs from the default's, with the
    settings added since either ran at their defaults, as the bench reads a finished run."""
    def compared(config: dict) -> dict:
        return flatten({k: v for k, v in config.items() if k not in REUSE_FREE_KEYS})

    mine, theirs = compared(with_later_settings(run["config"], default["config"])), compared(default["config"])
    return {key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key)}


def accuracies(directory: Path, strategy: str, changes: str | None,
               defaults: dict[int, dict]) -> dict[int, dict[str, float]]:
    """{seed: {"acc", "worst"}} of a row's runs; a single-setting row keeps only the runs that differ
    from the default's run of their seed in that one setting."""
    out = {}
    for seed, summary in summaries(directory, strategy).items():
        if changes is not None and (
                seed not in defaults or changed_settings(summary, defaults[seed]) != {f"strategy.{changes}"}):
            continue
        out[seed] = {"acc": summary["acc_mean_last5"], "worst": summary["acc_worst_last5"]}
    return out


def main() -> None:
    defaults = summaries(REFERENCE, "pfedes")
    local = {s: v["acc"] for s, v in accuracies(REFERENCE, "local", None, defaults).items()}
    default = {s: v["acc"] for s, v in accuracies(REFERENCE, "pfedes", None, defaults).items()}
    default_settings = next(iter(defaults.values()))["config"]["strategy"] if defaults else {}
    rows = []
    for label, change, directory, strategy, changes in ROWS:
        runs = accuracies(directory, strategy, changes, defaults)
        acc = {s: v["acc"] for s, v in runs.items()}
        rows.append({
            "row": label, "change": change.format(**default_settings),
            "runs": f"{directory.relative_to(RESULTS.parents[1])}/{strategy}",
            "seeds": sorted(runs),
            "accuracy": stat(list(acc.values())) if acc else None,
            "worst_client": stat([v["worst"] for v in runs.values()]) if runs else None,
            "gain_vs_local": paired(acc, local),
            "vs_default": None if strategy == "pfedes" and directory == REFERENCE else paired(acc, default),
        })
    out_dir = RESULTS / "ablation"
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"setting": "heterogeneous zoo, Dirichlet 0.3, 10 clients, 500 samples, 60 rounds, val 0.15",
              "local_only": stat(list(local.values())), "rows": rows}
    (out_dir / "ablation.json").write_text(json.dumps(result, indent=2, default=str))
    lines = ["| row | what changes | acc % | worst client % | gain vs Local-only | vs the default (per seed) | seeds |",
             "|---|---|---|---|---|---|---|",
             f"| Local-only | — | {pct(result['local_only'])} | — | — | — | {sorted(local)} |"]
    for r in rows:
        by_seed = "" if r["vs_default"] is None else " (" + " / ".join(
            f"{100 * d:+.1f}" for d in r["vs_default"]["by_seed"].values()) + ")"
        lines.append(f"| {r['row']} | {r['change']} | {pct(r['accuracy'])} | {pct(r['worst_client'])} | "
                     f"{pct(r['gain_vs_local'], True)} | {pct(r['vs_default'], True)}{by_seed} | {r['seeds'] or 'not run'} |")
    (out_dir / "ablation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out_dir / 'ablation.json'} and ablation.md")


if __name__ == "__main__":
    main()
