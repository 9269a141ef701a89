"""Flower's overhead: the identical local work through `pfedes-sim` (Flower simulation) and in
a plain single-process loop that calls the same client trainer and server aggregation.

    python benchmarks/overhead.py [hydra overrides, e.g. num_rounds=5]

Default: 10 clients cycling phone/gateway/gpu-host, 500 samples each, 5 rounds, pFedES.
Steady state = mean seconds of rounds 2..R; start-up = wall time - R x steady state.
Runs: plain loop with all cores as torch threads; Flower with 1 client at a time using all
cores (the same resources: the ratio of the two is the overhead); Flower with one client per
core (how pfedes-sim runs by default).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

from _common import default_data_path, experiment, print_table, write_result


def steady(rounds: list[dict]) -> float:
    later = [r["seconds"] for r in rounds[1:]] or [rounds[0]["seconds"]]
    return float(np.mean(later))


def main(argv: list[str]) -> None:
    import json

    from pfedes.plain_loop import run_plain
    from pfedes.sim import simulate

    cores = os.cpu_count() or 1
    settings = dict(num_clients=10, num_rounds=5, **{"data.samples_per_client": 500,
                    "data.path": default_data_path()})
    rows, accs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = experiment(argv, **settings, out_dir=f"{tmp}/plain", **{"train.torch_threads": cores})
        t0 = time.perf_counter()
        plain = run_plain(cfg, threads=cores)
        wall = time.perf_counter() - t0
        label = f"plain loop ({cores} threads)"
        accs[label] = [r["acc_mean"] for r in plain["rounds"]]
        rows.append({"run": label, "steady_s_per_round": steady(plain["rounds"]),
                     "startup_s": wall - len(plain["rounds"]) * steady(plain["rounds"])})
        for label, cpus in ((f"flower 1 client x {cores} cpus", cores),
                            (f"flower {cores} clients x 1 cpu", 1)):
            out = f"{tmp}/flower{cpus}"
            cfg = experiment(argv, **settings, out_dir=out, **{"simulation.num_cpus_per_client": cpus,
                                                              "train.torch_threads": cpus})
            t0 = time.perf_counter()
            simulate(cfg)
            wall = time.perf_counter() - t0
            rounds = [json.loads(x) for x in open(f"{out}/metrics.jsonl")]
            accs[label] = [r["acc_mean"] for r in rounds]
            rows.append({"run": label, "steady_s_per_round": steady(rounds),
                         "startup_s": wall - len(rounds) * steady(rounds)})
    base, plain_accs = rows[0]["steady_s_per_round"], accs[rows[0]["run"]]
    for row in rows:
        row["ratio_vs_plain"] = row["steady_s_per_round"] / base
        row["max_acc_diff_vs_plain"] = float(np.max(np.abs(np.subtract(accs[row["run"]], plain_accs))))
    print_table(rows, ["run", "steady_s_per_round", "ratio_vs_plain", "startup_s", "max_acc_diff_vs_plain"])
    same = rows[1]
    print(f"\noverhead ratio (Flower / plain, same cores): {same['ratio_vs_plain']:.3f}  (target <= 1.10)")
    print(f"Flower start-up: {same['startup_s']:.1f} s")
    path = write_result("overhead", {"settings": settings, "overrides": argv, "rows": rows,
                                     "accuracies": accs, "overhead_ratio": same["ratio_vs_plain"]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
