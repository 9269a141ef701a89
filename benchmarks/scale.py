"""Cost follows the sampled clients, not the fleet: the same sampled work per round (10 clients,
40 samples each) out of 10 clients (all sampled), 100 (10 %) and 1,000 (1 %, with selection.mode
uniform and power_of_choice), 20 rounds; per row the steady seconds per round, the peak resident
memory of the whole simulation (this process, Ray and every worker, summed), the clients'
private state on disk and the server's state per client it knows.

    python benchmarks/scale.py [--repeats N] [--rows 10,100,1000,1000poc] [hydra overrides]

40 samples per client: CIFAR-10's 50,000 training images in 1,000 pathological partitions give
46 to 54 per client, so 40 is what every row can give every client. `--repeats` runs all rows
in turn N times (default 3), each row in a fresh process; a row's ratio to the 10-client row is
the median over the repeats of the ratio within one repeat (rows minutes apart), so a loaded
stretch of a shared machine weighs less. Besides wall seconds, the CPU seconds of the whole
process tree per round (rounds 2..N), which waiting for a core does not inflate, and their split
between the server process (the ServerApp and Flower's simulation engine), the ClientApp actors
and Ray's own processes. pFedES's
warm-up (its first steps on a client train only the heads) is off here: with 1,000 clients
nearly every training is a client's first and would be cheaper, which is not what is measured.

Client state: the private state files (`<strategy>-p<partition>.pt`) in the run's client_state
directory, one per client that has trained (evaluation writes none); the decoded-data caches
beside them (`decoded-*.pt`, one per client that has loaded its data) are counted apart, they
are a cache that can be deleted. Server state: `server_checkpoint.pt`, and in it selection's
per-node history (`pfedes/selection.py`, kept in every mode), per node the server has heard from.

Each ClientApp message's set-up (data, model, private state) and work (train or evaluate, save)
are timed with pfedes.tracing (PFEDES_TRACE, one JSON line per message in the run's directory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from _common import cpu_seconds_by_process, default_data_path, experiment, print_table, rss_tree_bytes, write_result

SAMPLES_PER_CLIENT = 40
NUM_ROUNDS = 20
SAMPLED = 10  # clients sampled per round in every row
ROWS = {  # name: (clients, selection.mode)
    "10": (10, "uniform"),
    "100": (100, "uniform"),
    "1000": (1000, "uniform"),
    "1000poc": (1000, "power_of_choice"),
}


class Sampler:
    """Calls `sample` every `period` seconds in a thread, from `with` until its end or `done`."""

    done = False

    def __init__(self, period: float) -> None:
        self.period, self._stop = period, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set() and not self.done:
            self.sample()
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class PeakMemory(Sampler):
    """The peak RSS of a process tree (default: this process's)."""

    def __init__(self, period: float = 0.5, pid: int | None = None) -> None:
        super().__init__(period)
        self.peak, self.pid = 0, os.getpid() if pid is None else pid

    def sample(self) -> None:
        self.peak = max(self.peak, rss_tree_bytes(self.pid))


def cpu_group(key: tuple[int, int, str]) -> str:
    """Whose CPU a process of the simulation's tree is: the server (this process: the ServerApp
    and Flower's simulation engine), a ClientApp actor, or Ray's own processes."""
    pid, _, name = key
    if pid == os.getpid():
        return "server"
    return "clientapps" if name.startswith("ray::ClientApp") else "ray"


class SteadyCpu(Sampler):
    """CPU seconds (user + system) of this process and all its descendants (Ray and its workers),
    by `cpu_group`, from the end of round 1 to the end of the last round, less this sampler's
    own: the rounds are seen ending as lines of metrics.jsonl. Less noisy than wall time on a
    shared machine, where a process may wait for a core as long as it runs."""

    def __init__(self, metrics: Path, rounds: int, period: float = 0.5) -> None:
        super().__init__(period)
        self.metrics, self.rounds = metrics, rounds
        self.seen: dict[tuple[int, int, str], float] = {}  # kept after a process ends
        self.marks: dict[int, dict[str, float]] = {}  # rounds done -> CPU seconds by group then

    def sample(self) -> None:
        self.seen.update(cpu_seconds_by_process(os.getpid()))
        done = len(self.metrics.read_text().splitlines()) if self.metrics.is_file() else 0
        for mark in (1, self.rounds):
            if done >= mark and mark not in self.marks:
                groups = {"server": -time.thread_time(), "clientapps": 0.0, "ray": 0.0}  # less this thread
                for key, seconds in self.seen.items():
                    groups[cpu_group(key)] += seconds
                self.marks[mark] = groups
        self.done = self.rounds in self.marks

    def per_round(self) -> dict[str, float] | None:
        """CPU seconds per steady round: in all ("total") and by group."""
        if 1 not in self.marks or self.rounds not in self.marks or self.rounds < 2:
            return None
        out = {g: (self.marks[self.rounds][g] - self.marks[1][g]) / (self.rounds - 1) for g in self.marks[1]}
        return {"total": sum(out.values()), **out}


def client_state(state_dir: Path, strategy: str, devices: list[str]) -> dict:
    """The private state files (one per client that trained) and the decoded-data caches."""
    files = {int(m.group(1)): f.stat().st_size for f in state_dir.glob(f"{strategy}-p*.pt")
             if (m := re.fullmatch(rf"{re.escape(strategy)}-p(\d+)\.pt", f.name))}
    by_device: dict[str, list[int]] = {}
    for pid, size in files.items():
        by_device.setdefault(devices[pid % len(devices)], []).append(size)
    total = sum(files.values())
    caches = [f.stat().st_size for f in state_dir.glob("decoded-*.pt")]
    return {"clients_trained": len(files), "client_state_bytes": total,
            "client_state_bytes_per_trained": total / len(files) if files else None,
            "client_state_bytes_by_device": {d: float(np.mean(v)) for d, v in sorted(by_device.items())},
            "trained_by_device": {d: len(v) for d, v in sorted(by_device.items())},
            "data_cache_files": len(caches), "data_cache_bytes": sum(caches)}


def server_state(out: Path) -> dict:
    """server_checkpoint.pt's size, and the selection history's share of it per known node."""
    import torch

    path = out / "server_checkpoint.pt"
    history = torch.load(path, map_location="cpu", weights_only=False)["common"]["history"]
    known = set(history["loss"]) | set(history["device"])
    empty = len(pickle.dumps({"loss": {}, "device": {}}, protocol=2))  # torch.save's protocol
    size = len(pickle.dumps(history, protocol=2))
    return {"server_checkpoint_bytes": path.stat().st_size, "clients_known_to_server": len(known),
            "selection_history_bytes": size,
            "server_bytes_per_known_client": (size - empty) / len(known) if known else None}


def handler_times(trace: Path) -> dict:
    """Mean seconds of a ClientApp message's set-up and work, train and evaluate, rounds 2..N."""
    out = {}
    if not trace.is_file():
        return out
    lines = [json.loads(x) for x in trace.read_text().splitlines() if x.strip()]
    for kind in ("train", "evaluate"):
        mine = [t for t in lines if t.get("kind") == "clientapp" and t["message"] == kind and t["round"] >= 2]
        if mine:
            out[f"{kind}_setup_s"] = float(np.mean([t["set_up"] - t["entered"] for t in mine]))
            out[f"{kind}_work_s"] = float(np.mean([t["done"] - t["set_up"] for t in mine]))
    return out


def run_row(name: str, argv: list[str], out: Path) -> dict:
    """One row in this process (the child that `measure_row` starts): the simulation, then its
    figures from the run's directory."""
    from pfedes.sim import simulate
    from pfedes.tracing import TRACE_ENV

    total, mode = ROWS[name]
    fraction = SAMPLED / total
    cfg = experiment(argv, num_clients=total, num_rounds=NUM_ROUNDS, fraction_train=fraction,
                     fraction_evaluate=fraction, out_dir=str(out),
                     **{"data.samples_per_client": SAMPLES_PER_CLIENT, "data.path": default_data_path(),
                        "strategy.warmup_steps": 0, "selection.mode": mode})
    os.environ[TRACE_ENV] = str(out / "trace.jsonl")  # Ray's workers inherit it
    t0 = time.perf_counter()
    with SteadyCpu(out / "metrics.jsonl", int(cfg["num_rounds"])) as cpu:
        simulate(cfg)
    wall = time.perf_counter() - t0
    rounds = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [r["seconds"] for r in rounds[1:]]
    return {"row": name, "clients": total, "sampled_per_round": int(round(total * fraction)),
            "selection": mode, "samples_per_client": SAMPLES_PER_CLIENT, "rounds": len(rounds),
            "steady_s_per_round": float(np.mean(steady)), "steady_s_per_round_median": float(np.median(steady)),
            "steady_cpu_s_per_round": (cpu.per_round() or {}).get("total"),
            "steady_cpu_s_per_round_by_process": cpu.per_round(), "wall_s": wall,
            **client_state(out / "client_state", cfg["strategy"]["name"], list(cfg["clients"]["devices"])),
            **server_state(out), **handler_times(out / "trace.jsonl")}


def measure_row(name: str, argv: list[str], out: Path, attempts: int = 6, timeout: float = 3600) -> dict:
    """One row in a fresh child process (each row's memory its own: Ray, its workers and the
    server's caches start empty), its peak resident memory sampled from here. Ray may miss its
    node-start timeout on a loaded machine: a failed attempt is retried in a new directory."""
    for attempt in range(1, attempts + 1):
        row_dir = out / f"attempt{attempt}"
        row_dir.mkdir(parents=True)
        child = subprocess.Popen([sys.executable, __file__, "--one-row", name, "--out", str(row_dir), *argv],
                                 start_new_session=True)
        with PeakMemory(pid=child.pid) as mem:
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)  # its own session: the child and its Ray processes
                child.wait()
        result = row_dir / "row.json"
        if child.returncode == 0 and result.is_file():
            return {**json.loads(result.read_text()), "peak_rss_gib": mem.peak / 2**30, "attempts": attempt}
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # Ray's processes left behind by a failed start
        print(f"[scale] row {name} attempt {attempt} failed (exit {child.returncode})", flush=True)
        time.sleep(30)
    raise SystemExit(f"row {name}: {attempts} attempts failed")


def combine(runs: list[dict]) -> dict:
    """One row from its repeats: mean steady time (each repeat's kept), the largest peak, and the
    state figures of the last repeat (which clients train is random, so they differ a little)."""
    row = dict(runs[-1])
    row["steady_s_per_round"] = float(np.mean([r["steady_s_per_round"] for r in runs]))
    row["steady_s_per_round_repeats"] = [r["steady_s_per_round"] for r in runs]
    cpu = [r["steady_cpu_s_per_round"] for r in runs if r["steady_cpu_s_per_round"] is not None]
    row["steady_cpu_s_per_round"] = float(np.mean(cpu)) if cpu else None
    row["steady_cpu_s_per_round_repeats"] = [r["steady_cpu_s_per_round"] for r in runs]
    by = [r["steady_cpu_s_per_round_by_process"] for r in runs if r["steady_cpu_s_per_round_by_process"]]
    row["steady_cpu_s_per_round_by_process"] = {g: float(np.mean([b[g] for b in by])) for g in by[0]} if by else None
    for group in ("server", "clientapps", "ray"):
        row[f"cpu_{group}_s"] = (row["steady_cpu_s_per_round_by_process"] or {}).get(group)
    row["wall_s"] = float(np.mean([r["wall_s"] for r in runs]))
    row["peak_rss_gib"] = max(r["peak_rss_gib"] for r in runs)
    return row


def paired_ratios(runs: list[dict], reference: list[dict], key: str) -> list[float]:
    """Each repeat's `key` over the 10-client row's of the same repeat (run minutes apart, so a
    machine's load shifts less between them than between repeats)."""
    return [r[key] / b[key] for r, b in zip(runs, reference) if r[key] and b[key]]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"some of {','.join(ROWS)}")
    parser.add_argument("--work-dir", help="keep every run's directory here (default: a temporary one)")
    parser.add_argument("--one-row", help=argparse.SUPPRESS)  # the child process of measure_row
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args(argv)
    if args.one_row:
        code = 1
        try:
            row = run_row(args.one_row, overrides, Path(args.out))
            (Path(args.out) / "row.json").write_text(json.dumps(row))
            code = 0
        except Exception:  # noqa: BLE001  reported, then the parent retries
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                import ray

                ray.shutdown()  # the Ray processes this run started, also after a failed start
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # Flower's threads (a failed run leaves one waiting) are not waited for
    names = args.rows.split(",")
    unknown = sorted(set(names) - set(ROWS))
    if unknown or "10" not in names:
        parser.error(f"--rows: unknown {unknown}" if unknown else "--rows must include 10 (the reference)")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    with contextlib.ExitStack() as stack:
        tmp = args.work_dir or stack.enter_context(tempfile.TemporaryDirectory())
        for repeat in range(args.repeats):
            for name in names:  # all rows in turn, each repeat
                runs[name].append(measure_row(name, overrides, Path(tmp) / f"r{repeat}-{name}"))
                print(f"[scale] repeat {repeat + 1}/{args.repeats} row {name}: "
                      f"{runs[name][-1]['steady_s_per_round']:.2f} s/round", flush=True)
    rows = [combine(runs[n]) for n in names]
    base = rows[0]
    for r in rows:
        for key, ratio in (("steady_s_per_round", "time_ratio"), ("steady_cpu_s_per_round", "cpu_ratio")):
            by_repeat = paired_ratios(runs[r["row"]], runs["10"], key)
            r[f"{ratio}s_by_repeat"] = by_repeat
            r[f"{ratio}_vs_10"] = float(np.median(by_repeat)) if by_repeat else None
        per = r["client_state_bytes_per_trained"]
        r["state_per_trained_ratio_vs_10"] = per / base["client_state_bytes_per_trained"] if per else None
    print_table(rows, ["row", "clients", "sampled_per_round", "selection", "steady_s_per_round", "time_ratio_vs_10",
                       "wall_s", "peak_rss_gib", "clients_trained", "client_state_bytes",
                       "client_state_bytes_per_trained", "state_per_trained_ratio_vs_10",
                       "server_checkpoint_bytes", "clients_known_to_server", "server_bytes_per_known_client"])
    print_table(rows, ["row", "steady_cpu_s_per_round", "cpu_ratio_vs_10", "cpu_server_s", "cpu_clientapps_s",
                       "cpu_ray_s", "train_setup_s", "train_work_s",
                       "evaluate_setup_s", "evaluate_work_s", "data_cache_files", "data_cache_bytes"])
    by_name = {r["row"]: r for r in rows}
    result = {"overrides": overrides, "repeats": args.repeats, "samples_per_client": SAMPLES_PER_CLIENT,
              "num_rounds": NUM_ROUNDS, "rows": rows,
              "time_ratios_vs_10": {r["row"]: r["time_ratio_vs_10"] for r in rows},
              "cpu_ratios_vs_10": {r["row"]: r["cpu_ratio_vs_10"] for r in rows},
              "peak_rss_gib_max": max(r["peak_rss_gib"] for r in rows)}
    if "100" in by_name:  # the keys of the 10/100-client benchmark this one extends
        result["time_ratio"] = by_name["100"]["time_ratio_vs_10"]
        result["peak_rss_gib_100"] = by_name["100"]["peak_rss_gib"]
    print(f"\nper-round time ratios vs 10 clients: "
          + ", ".join(f"{k} {v:.3f}" for k, v in result["time_ratios_vs_10"].items()) + "  (target <= 1.10)")
    print(f"peak resident memory, all processes: {result['peak_rss_gib_max']:.2f} GiB  (target <= 6 GiB)")
    path = write_result("scale", result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
