"""Does a committed table still hold on today's code? Compares a re-run of a `pfedes-bench` table
with the committed one, strategy by strategy and seed by seed, e.g. the one-architecture table
re-run after the refactors and the data layer's computed normalisation statistics:

    pfedes-bench strategies=[local,fedrep,pfedes] seeds=[0,1,2] clients.devices=[phone] \\
      data.partition=dirichlet data.alpha=0.3 num_rounds=60 data.path=../shared/data/cifar10 \\
      data.samples_per_client=500 data.val_fraction=0.15 num_clients=10 \\
      out_dir=benchmarks/results/homog_dirichlet_val_rerun
    python benchmarks/rerun_compare.py benchmarks/results/homog_dirichlet_val \\
      benchmarks/results/homog_dirichlet_val_rerun

(There FedRep's row is not a reproduction: its learning rate changed between the two, 0.01 then
0.02 as the grid chose.)

Prints and writes `<rerun>/comparison.json`: each strategy's accuracy then and now (mean of the
last 5 rounds, paired by seed), and each gain over Local-only then and now. "Within noise" means
the paired change is under the 1.5 points this project counts as a gain.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import paired, pct, read_bench, stat  # noqa: E402

NOISE = 0.015
REFERENCE = "local"


def gains(table: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
    """{strategy: {seed: gain over Local-only}} for the seeds Local-only has."""
    base = table.get(REFERENCE, {})
    return {name: {s: acc - base[s] for s, acc in accs.items() if s in base}
            for name, accs in table.items() if name != REFERENCE}


def compare(committed: dict[str, dict[int, float]], rerun: dict[str, dict[int, float]]) -> dict:
    rows = {}
    gains_then, gains_now = gains(committed), gains(rerun)
    for name in sorted(set(committed) & set(rerun)):
        seeds = sorted(set(committed[name]) & set(rerun[name]))
        then = {s: committed[name][s] for s in seeds}
        now = {s: rerun[name][s] for s in seeds}
        change = paired(now, then)
        row = {"seeds": seeds, "then": stat(list(then.values())), "now": stat(list(now.values())),
               "change": change, "within_noise": abs(change["mean"]) < NOISE}
        if name in gains_then and name in gains_now:
            row["gain_then"] = stat([gains_then[name][s] for s in seeds if s in gains_then[name]])
            row["gain_now"] = stat([gains_now[name][s] for s in seeds if s in gains_now[name]])
        rows[name] = row
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("committed", type=Path)
    parser.add_argument("rerun", type=Path)
    args = parser.parse_args()
    rows = compare(read_bench(args.committed), read_bench(args.rerun))
    print("| strategy | seeds | committed % | re-run % | change (per seed) | gain then | gain now |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        by_seed = " / ".join(f"{100 * d:+.1f}" for d in r["change"]["by_seed"].values())
        print(f"| {name} | {r['seeds']} | {pct(r['then'])} | {pct(r['now'])} | {pct(r['change'], True)} "
              f"({by_seed}){'' if r['within_noise'] else ' **beyond noise**'} | "
              f"{pct(r.get('gain_then'), True)} | {pct(r.get('gain_now'), True)} |")
    out = {"committed": str(args.committed), "rerun": str(args.rerun), "noise": NOISE, "strategies": rows}
    (args.rerun / "comparison.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
