"""The run log: metrics.jsonl (one JSON object per round), summary.json and accuracy.png."""

from __future__ import annotations

import json
import time
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log


def round_record(server_round: int, stats: dict[str, Any], seconds: float,
                 global_metrics: dict[str, float] | None = None) -> dict[str, Any]:
    evals = stats.get("eval", [])
    accs = [e["accuracy"] for e in evals]
    by_device: dict[str, list[float]] = {}
    for e in evals:
        by_device.setdefault(e["device"], []).append(e["accuracy"])
    train = stats.get("train", {})
    trained = max(int(stats.get("clients_trained", 0)), 1)
    record = {
        "round": server_round,
        "acc_mean": float(np.mean(accs)) if accs else None,
        "acc_worst": float(np.min(accs)) if accs else None,
        "acc_by_device": {d: float(np.mean(v)) for d, v in sorted(by_device.items())},
        "acc_by_client": {str(e["partition"]): e["accuracy"] for e in evals},
        "train_loss": train.get("train_loss"),
        "align_loss": train.get("align_loss"),
        "train_metrics": dict(train),  # every aggregated train metric of the method
        "server_metrics": dict(stats.get("server", {})),  # what the strategy itself computed (e.g. CFL)
        "clients_trained": int(stats.get("clients_trained", 0)),
        "clients_dropped": int(stats.get("clients_dropped", 0)),
        "bytes_up": int(stats.get("bytes_up", 0)),
        "bytes_down": int(stats.get("bytes_down", 0)),
        "bytes_up_per_client": int(stats.get("bytes_up", 0)) // trained,
        "bytes_down_per_client": int(stats.get("bytes_down", 0)) // trained,
        "seconds": seconds,
    }
    if global_metrics:
        record.update(global_metrics)
    return record


class RunRecorder:
    def __init__(self, out_dir: Path, cfg: dict[str, Any], resume_rounds: list[dict] | None = None) -> None:
        self.out_dir = out_dir
        self.cfg = cfg
        self.rounds: list[dict[str, Any]] = list(resume_rounds or [])
        out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = out_dir / "metrics.jsonl"
        if not resume_rounds:
            self.metrics_path.write_text("")
        self.t_last = time.perf_counter()
        self.t_start = self.t_last

    def record(self, server_round: int, stats: dict[str, Any],
               global_metrics: dict[str, float] | None = None) -> dict[str, Any]:
        now = time.perf_counter()
        record = round_record(server_round, stats, now - self.t_last, global_metrics)
        self.t_last = now
        self.rounds.append(record)
        with self.metrics_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        log(INFO, "[pfedes] %s seed %s  round %d/%d  acc_mean %s  acc_worst %s  train_loss %s  "
            "align_loss %s  %.1fs", self.cfg["strategy"]["name"], self.cfg.get("seed"), server_round,
            self.cfg["num_rounds"], fmt(record["acc_mean"]),
            fmt(record["acc_worst"]), fmt(record["train_loss"]), fmt(record["align_loss"]),
            record["seconds"])
        return record

    def finish(self, extra: dict[str, Any]) -> dict[str, Any]:
        last = [r for r in self.rounds[-5:] if r["acc_mean"] is not None]
        summary = {
            "strategy": self.cfg["strategy"]["name"],
            "rounds": len(self.rounds),
            "final": self.rounds[-1] if self.rounds else None,
            "acc_mean_last5": float(np.mean([r["acc_mean"] for r in last])) if last else None,
            "acc_worst_last5": float(np.mean([r["acc_worst"] for r in last])) if last else None,
            "seconds_per_round": float(np.mean([r["seconds"] for r in self.rounds])) if self.rounds else None,
            "seconds_total": time.perf_counter() - self.t_start,
            "config": {**self.cfg, **{k: shown_path(self.cfg[k]) for k in ("out_dir", "client_state_dir")
                                      if k in self.cfg}},
            **extra,
        }
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        plot_accuracy(self.rounds, self.out_dir / "accuracy.png", self.cfg["strategy"]["name"])
        log(INFO, "[pfedes] wrote %s (metrics.jsonl, summary.json, accuracy.png)", self.out_dir)
        return summary


def shown_path(path: str | Path) -> str:
    """A path as records show it: relative to the working directory when inside it, so the
    records of a run do not carry the machine they ran on."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def plot_accuracy(rounds: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (MaxNLocator)

    xs = [r["round"] for r in rounds if r["acc_mean"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [r["acc_mean"] for r in rounds if r["acc_mean"] is not None], marker="o", label="mean")
    ax.plot(xs, [r["acc_worst"] for r in rounds if r["acc_worst"] is not None], marker="s", label="worst client")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("personalized accuracy (local test split)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
