"""GPU smoke check: the same pFedES simulation (same seed, same data, same clients) once with
every client on the CPU and once with every client on the GPU, through `pfedes.sim.simulate` as
`pfedes-sim` runs it (Ray gives each client 1/N of the GPU). Prints the speed-up of a round and
both accuracies, and whether they agree within noise: the mean over clients of the paired
difference (GPU - CPU) of the last round's personalized accuracy, against twice its standard
error (a GPU run is not bit-for-bit the CPU's, so the two differ by chance, not by method).

The GPU side names `cuda` for every profile: a client that could not see the GPU would fail
its round with a one-line error, and the check fails if any client's reply was dropped, so a
finished GPU side did train on the GPU. `--bf16` adds a third run, the GPU side with
train.amp=bf16 (the option's first measurement).

Without a CUDA device it says so in one line and exits 0; `--cpu-only` runs the CPU side alone
(what can be checked here), e.g. `python benchmarks/gpu_smoke.py --cpu-only --rounds 1 --clients 3`.

    python benchmarks/gpu_smoke.py [--rounds 5] [--clients 10] [--bf16] [--cpu-only]
                                   [--out benchmarks/results/gpu_smoke.json] [hydra overrides]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, default_data_path, experiment

CPU_SIDE = ["train.device=cpu", "train.by_device.gpu-host.device=cpu", "simulation.num_gpus_per_client=0"]


def gpu_side(clients: int, amp: str = "none") -> list[str]:
    return ["train.device=cuda", "train.by_device.gpu-host.device=cuda", f"train.amp={amp}",
            f"simulation.num_gpus_per_client={1.0 / clients:.6g}"]


def run_side(name: str, overrides: list[str], common: list[str], work: Path, settings: dict) -> dict:
    """One simulation; its per-round seconds, accuracies and dropped replies."""
    from pfedes.sim import simulate

    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    cfg = experiment([*common, *overrides, f"out_dir={out}"], **settings)
    started = time.perf_counter()
    summary = simulate(cfg)
    total = time.perf_counter() - started
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    seconds = [float(r["seconds"]) for r in rounds]
    steady = seconds[1:] or seconds  # round 1 pays each client's start-up (CUDA context, first kernels)
    return {"overrides": overrides, "num_clients": cfg["num_clients"], "num_rounds": cfg["num_rounds"],
            "data": cfg["data"]["path"], "samples_per_client": cfg["data"]["samples_per_client"],
            "seconds_total": total, "seconds_by_round": seconds,
            "seconds_per_round_after_the_first": statistics.median(steady),
            "acc_mean_last": rounds[-1]["acc_mean"], "acc_mean_last5": summary.get("acc_mean_last5"),
            "acc_by_client_last": rounds[-1]["acc_by_client"],
            "clients_dropped": sum(int(r.get("clients_dropped") or 0) for r in rounds)}


def agreement(gpu: dict, cpu: dict) -> dict:
    """The mean paired difference (GPU - CPU) of the last round's per-client accuracy, its
    standard error, and whether it is within two of them."""
    clients = sorted(set(gpu["acc_by_client_last"]) & set(cpu["acc_by_client_last"]), key=int)
    diffs = [gpu["acc_by_client_last"][c] - cpu["acc_by_client_last"][c] for c in clients]
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return {"clients": len(diffs), "mean_difference": mean, "standard_error": se,
            "within_two_standard_errors": bool(abs(mean) <= 2 * se) if math.isfinite(se) else None}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--bf16", action="store_true", help="also run the GPU side with train.amp=bf16")
    parser.add_argument("--cpu-only", action="store_true", help="run the CPU side alone (no GPU needed)")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_smoke.json")
    parser.add_argument("--work-dir", type=Path, default=None, help="the runs' out_dirs (default: a temporary one)")
    args, overrides = parser.parse_known_args(argv)

    import torch

    if not args.cpu_only and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device on this machine (torch.cuda.is_available() is False): nothing to "
              "compare, nothing written; --cpu-only runs the CPU side alone")
        return 0
    settings = {"strategy": "pfedes", "num_clients": args.clients, "num_rounds": args.rounds, "seed": 0,
                "data.path": default_data_path(), "data.samples_per_client": 300,
                "simulation.num_cpus_per_client": 1}
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu_smoke-"))
    sides = {"cpu": run_side("cpu", CPU_SIDE, overrides, work, settings)}
    if not args.cpu_only:
        sides["gpu"] = run_side("gpu", gpu_side(args.clients), overrides, work, settings)
        if args.bf16:
            sides["gpu_bf16"] = run_side("gpu_bf16", gpu_side(args.clients, "bf16"), overrides, work, settings)
    cpu = sides["cpu"]
    result = {"benchmark": "gpu_smoke", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "settings": settings,
              "overrides": overrides, "cpus": os.cpu_count(), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "sides": sides}
    lines = [f"cpu      : {cpu['seconds_per_round_after_the_first']:.2f} s/round, "
             f"acc_mean last round {cpu['acc_mean_last']:.3f}"]
    for name in [s for s in sides if s != "cpu"]:
        side = sides[name]
        side["speed_up"] = cpu["seconds_per_round_after_the_first"] / side["seconds_per_round_after_the_first"]
        side["agreement_with_cpu"] = agreement(side, cpu)
        a = side["agreement_with_cpu"]
        lines.append(f"{name:<9}: {side['seconds_per_round_after_the_first']:.2f} s/round, acc_mean last round "
                     f"{side['acc_mean_last']:.3f}; speed-up {side['speed_up']:.2f}x; accuracy GPU - CPU "
                     f"{a['mean_difference']:+.3f} (SE {a['standard_error']:.3f}, over {a['clients']} clients: "
                     f"{'within' if a['within_two_standard_errors'] else 'NOT within'} 2 SE)")
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    dropped = {name: s["clients_dropped"] for name, s in sides.items() if s["clients_dropped"]}
    if dropped:
        print(f"gpu_smoke: replies were dropped ({dropped}): see the log above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
