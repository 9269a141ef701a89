"""The run log: metrics.jsonl (one JSON object per round), summary.json and accuracy.png."""

from __future__ import annotations

import json
import time
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from .tensorboard_log import TensorBoardLog


def round_record(server_round: int, stats: dict[str, Any], seconds: float,
                 global_metrics: dict[str, float] | None = None) -> dict[str, Any]:
    evals = stats.get("eval", [])
    accs = [e["accuracy"] for e in evals]
    val_accs = [e["val_accuracy"] for e in evals if not np.isnan(e.get("val_accuracy", np.nan))]
    by_device: dict[str, list[float]] = {}
    for e in evals:
        by_device.setdefault(e["device"], []).append(e["accuracy"])
    train = stats.get("train", {})
    # per client asked to train: a client that replied badly or not at all was still sent its
    # arrays, and a round in which every reply was dropped still cost what it sent
    asked = max(int(stats.get("clients_asked", stats.get("clients_trained", 0))), 1)
    record = {
        "round": server_round,
        "acc_mean": float(np.mean(accs)) if accs else None,
        "acc_worst": float(np.min(accs)) if accs else None,
        "val_acc_mean": float(np.mean(val_accs)) if val_accs else None,
        "acc_by_device": {d: float(np.mean(v)) for d, v in sorted(by_device.items())},
        "acc_by_client": {str(e["partition"]): e["accuracy"] for e in evals},
        "train_loss": train.get("train_loss"),
        "align_loss": train.get("align_loss"),
        "projection_std": train.get("projection_std"),
        "train_metrics": dict(train),  # every aggregated train metric of the method
        "server_metrics": dict(stats.get("server", {})),  # what the strategy itself computed (e.g. CFL)
        "clients_asked": int(stats.get("clients_asked", 0)),
        "clients_trained": int(stats.get("clients_trained", 0)),
        "clients_dropped": int(stats.get("clients_dropped", 0)),
        "update_cosine_min": stats.get("update_cosine_min"),  # aggregation.min_cosine on: the lowest cosine
        "update_cosines": stats.get("update_cosines"),  # ... each reply's, by partition
        "update_cosine_floor": stats.get("update_cosine_floor"),  # ... below which a reply was dropped
        "bytes_up": int(stats.get("bytes_up", 0)),
        "bytes_down": int(stats.get("bytes_down", 0)),
        "bytes_up_per_client": int(stats.get("bytes_up", 0)) // asked,
        "bytes_down_per_client": int(stats.get("bytes_down", 0)) // asked,
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
        self.tensorboard = (TensorBoardLog(out_dir, first_round=len(self.rounds) + 1)
                            if cfg.get("logging", {}).get("tensorboard") else None)

    def record(self, server_round: int, stats: dict[str, Any],
               global_metrics: dict[str, float] | None = None) -> dict[str, Any]:
        now = time.perf_counter()
        record = round_record(server_round, stats, now - self.t_last, global_metrics)
        self.t_last = now
        self.rounds.append(record)
        with self.metrics_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.write(record)
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        log(INFO, "[pfedes] %s seed %s  round %d/%d  acc_mean %s  acc_worst %s  train_loss %s  "
            "align_loss %s%s  %.1fs", self.cfg["strategy"]["name"], self.cfg.get("seed"), server_round,
            self.cfg["num_rounds"], fmt(record["acc_mean"]),
            fmt(record["acc_worst"]), fmt(record["train_loss"]), fmt(record["align_loss"]),
            "" if record.get("proxy_std") is None else f"  proxy_std {record['proxy_std']:.4f}",
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
            "last5_rounds_averaged": len(last),  # fewer than 5 in a run of fewer rounds
            "dp_epsilon": (self.rounds[-1].get("server_metrics") or {}).get("dp_epsilon") if self.rounds else None,
            "seconds_per_round": float(np.mean([r["seconds"] for r in self.rounds])) if self.rounds else None,
            "seconds_total": time.perf_counter() - self.t_start,
            "config": {**self.cfg, **{k: shown_path(self.cfg[k]) for k in ("out_dir", "client_state_dir")
                                      if k in self.cfg}},
            **extra,
        }
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if self.tensorboard is not None:
            self.tensorboard.close()
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
    diagnostics = any(r.get("proxy_std") is not None for r in rounds)
    fig, axes = plt.subplots(1, 2 if diagnostics else 1, figsize=(11 if diagnostics else 6, 4), squeeze=False)
    ax = axes[0][0]
    ax.plot(xs, [r["acc_mean"] for r in rounds if r["acc_mean"] is not None], marker="o", label="mean")
    ax.plot(xs, [r["acc_worst"] for r in rounds if r["acc_worst"] is not None], marker="s", label="worst client")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("personalized accuracy (local test split)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    if diagnostics:
        plot_proxy_diagnostics(axes[0][1], rounds)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_proxy_diagnostics(ax, rounds: list[dict[str, Any]]) -> None:
    """Feature stds (log scale) and the linear-probe accuracy of the shared proxy by round."""
    def series(key):
        pts = [(r["round"], r[key]) for r in rounds if r.get(key) is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    for key, label in (("proxy_std", "proxy feature std"), ("projection_std", "projection std (clients)")):
        xs, ys = series(key)
        ax.plot(xs, ys, marker=".", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("mean per-dimension std")
    ax.grid(alpha=0.3)
    probe = ax.twinx()
    for key, label, style in (("probe_acc", "linear probe, trained proxy", "o-"),
                              ("probe_acc_fresh", "linear probe, fresh proxy", "x--")):
        xs, ys = series(key)
        probe.plot(xs, ys, style, color="tab:red" if key == "probe_acc" else "tab:gray", label=label)
    probe.set_ylim(0, 1)
    probe.set_ylabel("probe accuracy (unified test, 2nd half)")
    lines = ax.get_legend_handles_labels()
    more = probe.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower left")
    ax.set_title("shared proxy")
