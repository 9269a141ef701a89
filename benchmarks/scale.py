"""Cost follows the sampled clients, not the total: 100 virtual clients with 10 sampled per round
against 10 clients all sampled, same per-client data, 20 rounds; plus the peak resident memory of
the whole simulation (this process, Ray and every worker, summed).

    python benchmarks/scale.py [hydra overrides]

pFedES's warm-up (its first steps on a client train only the heads) is off here: with 100
clients most trainings would be a client's first and cheaper, which is not what is measured.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time

import numpy as np

from _common import default_data_path, experiment, print_table, rss_tree_bytes, write_result


class PeakMemory:
    """Samples the RSS of this process tree every `period` seconds."""

    def __init__(self, period: float = 0.5) -> None:
        self.period, self.peak, self._stop = period, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_tree_bytes(os.getpid()))
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str]) -> None:
    from pfedes.sim import simulate

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for total, fraction in ((10, 1.0), (100, 0.1)):
            out = f"{tmp}/c{total}"
            cfg = experiment(argv, num_clients=total, num_rounds=20, fraction_train=fraction,
                             fraction_evaluate=fraction, out_dir=out,
                             **{"data.samples_per_client": 500, "data.path": default_data_path(),
                                "strategy.warmup_steps": 0})
            t0 = time.perf_counter()
            with PeakMemory() as mem:
                simulate(cfg)
            wall = time.perf_counter() - t0
            rounds = [json.loads(x) for x in open(f"{out}/metrics.jsonl")]
            rows.append({"clients": total, "sampled_per_round": int(round(total * fraction)),
                         "steady_s_per_round": float(np.mean([r["seconds"] for r in rounds[1:]])),
                         "wall_s": wall, "peak_rss_gib": mem.peak / 2**30})
    ratio = rows[1]["steady_s_per_round"] / rows[0]["steady_s_per_round"]
    print_table(rows, ["clients", "sampled_per_round", "steady_s_per_round", "wall_s", "peak_rss_gib"])
    print(f"\nper-round time ratio (100 clients, 10 sampled / 10 clients): {ratio:.3f}  (target <= 1.10)")
    print(f"peak resident memory, all processes: {rows[1]['peak_rss_gib']:.2f} GiB  (target <= 6 GiB)")
    path = write_result("scale", {"overrides": argv, "rows": rows, "time_ratio": ratio,
                                  "peak_rss_gib_100": rows[1]["peak_rss_gib"]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
