"""Opt-in timing trace of where a deployed round spends its time.

With the environment variable PFEDES_TRACE=<file> set for the SuperNodes and the SuperLink (whose
processes pass it on to the ClientApp and ServerApp processes they start), every train or
evaluate message appends one JSON line to <file> on its device, and the ServerApp one line per
send-and-collect. `scripts/measure_deployment.py --trace` reads them into a table. Unset, nothing
is written.
"""

from __future__ import annotations

import json
import os
import time
from logging import WARNING
from pathlib import Path

from flwr.common.logger import log

TRACE_ENV = "PFEDES_TRACE"
now = time.time  # the one clock every trace line uses (comparable across processes)
_warned: set[str] = set()


def clock() -> tuple[float, float]:
    """(wall clock, this process's CPU seconds since it started): the CPU time tells what a
    step costs even where other processes share the cores."""
    return now(), time.process_time()


def process_start_time() -> float | None:
    """When this process started (seconds since the epoch), from /proc; None elsewhere."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return now() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))  # now minus this process's age
    except (OSError, ValueError, IndexError):
        return None


def enabled() -> bool:
    return bool(os.environ.get(TRACE_ENV))


def record(kind: str, **fields) -> None:
    """Append {kind, pid, **fields} to the trace file if PFEDES_TRACE names one."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "pid": os.getpid(), **fields})
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except OSError as exc:  # a diagnostic never stops training; say so once
        if path not in _warned:
            _warned.add(path)
            log(WARNING, "[pfedes] %s=%s cannot be written (%s): no timing trace", TRACE_ENV, path, exc)


STEPS = ("server sends -> ClientApp process starts (polls)",
         "process start -> handler (flwr, torch, app imports)",
         "handler set-up (data, model, private state)",
         "work (train or evaluate, save)",
         "reply -> server has all replies")
ROUND_CPU = "all ClientApp processes of a round, start to reply (CPU)"


def breakdown(trace_text: str, first_round: int = 1) -> dict[str, list[float]]:
    """Seconds of each step (STEPS) for every traced message from `first_round` on. A message
    belongs to the server's send-and-collect whose interval holds its handler entry; without a
    process start time the first two steps are one (counted as the second)."""
    lines = [json.loads(line) for line in trace_text.splitlines() if line.strip()]
    phases = [t for t in lines if t["kind"] == "server"]
    steps: dict[str, list[float]] = {step: [] for step in STEPS}
    for t in lines:
        if t["kind"] != "clientapp" or t["round"] < first_round:
            continue
        phase = next((p for p in phases if p["sent"] <= t["entered"] <= p["received"]), None)
        if phase is None:
            continue
        started = t["process_start"]
        if started is not None:
            steps[STEPS[0]].append(started - phase["sent"])
        else:
            started = phase["sent"]
        for step, seconds in zip(STEPS[1:], (t["entered"] - started, t["set_up"] - t["entered"],
                                             t["done"] - t["set_up"], phase["received"] - t["done"])):
            steps[step].append(seconds)
    return {step: v for step, v in steps.items() if v}


def cpu_breakdown(trace_text: str, first_round: int = 1) -> dict[str, list[float]]:
    """CPU seconds of each ClientApp process's steps (STEPS[1:4]) from `first_round` on, from the
    lines that carry CPU times: process start to handler (Flower's start-up and the imports), the
    handler's set-up, the work; and per round, the sum over its messages of all three."""
    lines = [json.loads(line) for line in trace_text.splitlines() if line.strip()]
    steps: dict[str, list[float]] = {step: [] for step in (*STEPS[1:4], ROUND_CPU)}
    per_round: dict[int, float] = {}
    for t in lines:
        if t["kind"] != "clientapp" or t["round"] < first_round or "cpu" not in t:
            continue
        cpu = t["cpu"]
        for step, seconds in zip(STEPS[1:4], (cpu["entered"], cpu["set_up"] - cpu["entered"],
                                              cpu["done"] - cpu["set_up"])):
            steps[step].append(seconds)
        per_round[t["round"]] = per_round.get(t["round"], 0.0) + cpu["done"]
    steps[ROUND_CPU] = [per_round[r] for r in sorted(per_round)]
    return {step: v for step, v in steps.items() if v}
