"""Per-round wall time of the same 3-client pFedES work in a real deployment (SuperLink +
3 SuperNodes on 127.0.0.1, TLS and SuperNode auth) and in Flower's simulation engine.

    python scripts/measure_deployment.py --rounds 3 --samples 100 [--evaluate-in-train] [--trace] [--out m.json]

Both runs use one partition per client of the same data (partition-id = client index, so
the same device, architecture and data per client), one torch thread per client, and the
ServerApp's own per-round clock (metrics.jsonl `seconds`: train + evaluate + aggregation).
Round 1 holds start-up (Ray actors, first imports), so the ratio is taken over rounds 2..N.
--trace also times each deployed message step by step (pfedes.tracing) and prints where a round
goes: pick-up and process start, start-up and imports, the handler's set-up, the work, the reply;
and the CPU time of each ClientApp process's steps, which other load on the machine disturbs less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DEVICES = ("phone", "gateway", "gpu-host")


def overrides(args: argparse.Namespace, out_dir: Path) -> dict:
    return {"num_clients": len(DEVICES), "num_rounds": args.rounds, "data.path": args.data,
            "data.samples_per_client": args.samples, "train.local_epochs": args.epochs,
            "train.torch_threads": 1, "evaluate_in_train": bool(args.evaluate_in_train),
            "out_dir": str(out_dir)}


def round_seconds(out_dir: Path) -> list[float]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["seconds"] for line in lines if line.strip()]


def run_simulation(args: argparse.Namespace, out_dir: Path) -> list[float]:
    from pfedes.config import experiment_config
    from pfedes.sim import simulate

    cfg = experiment_config([f"{k}={v}" for k, v in overrides(args, out_dir).items()]
                            + ["simulation.num_cpus_per_client=1"])
    simulate(cfg)
    return round_seconds(out_dir)


def run_deployment(args: argparse.Namespace, root: Path) -> list[float]:
    from pfedes.local_deployment import LocalDeployment
    from pfedes.tracing import TRACE_ENV

    out_dir = root / "server-out"
    extra_env = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(args.superexec_poll)} if args.superexec_poll else None
    if args.trace:  # inherited by the SuperLink, the SuperNodes and the app processes they start
        os.environ[TRACE_ENV] = str(root / "trace.jsonl")
    with LocalDeployment(root / "deploy", node_names=DEVICES) as dep:
        dep.start_superlink()
        for index, device in enumerate(DEVICES):
            dep.register(device)
            dep.start_supernode(device, {"device": device, "data-path": str(args.data_dir),
                                         "state-dir": str(root / "state" / device),
                                         "partition-id": index, "num-partitions": len(DEVICES)},
                                extra_env=extra_env)
        dep.wait_nodes_online(len(DEVICES), timeout=300)
        run_id = dep.submit({**overrides(args, out_dir), "data.path": str(args.data_dir)})
        status = dep.wait_run(run_id, timeout=args.timeout)
        if status["status"] != "finished:completed":
            raise SystemExit(f"deployment run ended as {status['status']}:\n{dep.run_log(run_id)[-3000:]}")
    os.environ.pop(TRACE_ENV, None)
    return round_seconds(out_dir)


def summary(seconds: list[float]) -> dict:
    steady = seconds[1:] or seconds
    return {"per_round": [round(s, 2) for s in seconds], "mean_after_round_1": statistics.mean(steady)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=100, help="data.samples_per_client")
    parser.add_argument("--epochs", type=int, default=1, help="train.local_epochs")
    parser.add_argument("--data", default="embedded", help="data.path (embedded or a parquet directory)")
    parser.add_argument("--superexec-poll", type=float, default=0.0,
                        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL for the SuperNodes (0 = Flower's default, 1 s)")
    parser.add_argument("--evaluate-in-train", action="store_true",
                        help="evaluate_in_train=true in both runs: no evaluate round")
    parser.add_argument("--trace", action="store_true",
                        help="time each deployed message step by step (PFEDES_TRACE) and print the breakdown")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds the deployment run may take")
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()

    from pfedes.data import resolve_data_dir

    args.data_dir = resolve_data_dir(args.data)
    with tempfile.TemporaryDirectory(prefix="pfedes-measure-") as tmp:
        tmp = Path(tmp)
        started = time.perf_counter()
        sim = summary(run_simulation(args, tmp / "sim"))
        dep = summary(run_deployment(args, tmp / "dep"))
        if args.trace:
            from pfedes.tracing import breakdown, cpu_breakdown

            trace = (tmp / "dep" / "trace.jsonl").read_text()
            steps = breakdown(trace, first_round=2)
            dep["steps_seconds_min_max"] = {step: [round(min(v), 2), round(max(v), 2)] for step, v in steps.items()}
            cpu = cpu_breakdown(trace, first_round=2)
            dep["steps_cpu_seconds_min_max"] = {step: [round(min(v), 2), round(max(v), 2)] for step, v in cpu.items()}
    result = {"config": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")},
              "simulation": sim, "deployment": dep,
              "ratio_deployment_over_simulation": dep["mean_after_round_1"] / sim["mean_after_round_1"],
              "wall_seconds": time.perf_counter() - started}
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
