"""One (strategy, seed) run of the bench: its configuration, and running it, reusing a finished
run with the same configuration or resuming a stopped one from its checkpoint."""

from __future__ import annotations

import json
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError, with_later_settings

LAST_ROUNDS = 5
# Keys the bench sets itself for each run, or that only the bench reads.
BENCH_KEYS = ("strategies", "seeds", "out_dir", "strategy", "seed", "rerun")
# Keys in which a finished run may differ from the one asked for and still be reused.
REUSE_FREE_KEYS = frozenset({"run_token", "client_state_dir", "out_dir", "resume", "logging"})


@dataclass
class Run:
    strategy: str
    seed: int
    out_dir: Path
    status: str = "pending"  # ok | skipped | failed
    note: str = ""
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def last(self, key: str) -> float | None:
        values = [r[key] for r in self.rounds if r.get(key) is not None]
        return float(np.mean(values[-LAST_ROUNDS:])) if values else None

    def mean(self, key: str) -> float | None:
        values = [r[key] for r in self.rounds if r.get(key) is not None]
        return float(np.mean(values)) if values else None

    def by_device(self) -> dict[str, float]:
        """Personalized accuracy per device profile, mean of the last LAST_ROUNDS rounds."""
        values: dict[str, list[float]] = {}
        for r in self.rounds:
            for device, acc in (r.get("acc_by_device") or {}).items():
                values.setdefault(device, []).append(acc)
        return {d: float(np.mean(v[-LAST_ROUNDS:])) for d, v in sorted(values.items())}

    @property
    def figures(self) -> dict[str, float | None]:
        return {"acc_mean_last": self.last("acc_mean"), "acc_worst_last": self.last("acc_worst"),
                "global_acc_last": self.last("global_acc"),
                "bytes_up_per_client_round": self.mean("bytes_up_per_client"),
                "bytes_down_per_client_round": self.mean("bytes_down_per_client"),
                "seconds_per_round": self.mean("seconds")}


def split_overrides(task_overrides: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """The user's overrides minus the bench's own keys: (overrides for every run,
    [(strategy key, override)] for the runs whose preset has that key)."""
    common, per_strategy = [], []
    for override in task_overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in ("strategy", "seed"):
            raise ConfigError(f"'{override}': the bench sets {key} per run; use "
                              f"{'strategies' if key == 'strategy' else 'seeds'}=[...]")
        if key in BENCH_KEYS:
            continue
        if key.startswith("strategy."):
            per_strategy.append((key.split(".", 1)[1].split(".")[0], override))
        else:
            common.append(override)
    return common, per_strategy


def run_overrides(common: list[str], per_strategy: list[tuple[str, str]], strategy: str,
                  preset: dict[str, Any]) -> list[str]:
    return [*common, *(o for key, o in per_strategy if key in preset), f"strategy={strategy}"]


def needs_one_architecture(cfg: dict[str, Any]) -> str | None:
    """Why this run cannot go ahead with this device list, or None."""
    from ..methods import method_of
    from ..models import resolve_architecture

    trainer = method_of(cfg).trainer
    archs = sorted({resolve_architecture(d, cfg["model"]["profiles"]) for d in cfg["clients"]["devices"]})
    if trainer.requires_same_architecture and len(archs) > 1:
        return f"needs one architecture (clients.devices maps to {', '.join(archs)})"
    return None


def read_rounds(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finished_rounds(out_dir: Path, cfg: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The rounds of a finished earlier run in out_dir with the same configuration, else None."""
    try:
        saved = json.loads((out_dir / "summary.json").read_text())["config"]
        rounds = read_rounds(out_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    wanted = json.loads(json.dumps(cfg))
    saved = with_later_settings(saved, wanted)
    same = ({k: v for k, v in saved.items() if k not in REUSE_FREE_KEYS}
            == {k: v for k, v in wanted.items() if k not in REUSE_FREE_KEYS})
    return rounds if same and len(rounds) == int(cfg["num_rounds"]) else None


def resumable_round(out_dir: Path, cfg: dict[str, Any]) -> int | None:
    """The last round of an earlier run in out_dir that this one can continue: one that stopped
    (or finished) before cfg's num_rounds with the same configuration otherwise, with its server
    checkpoint and client states still there. None: start afresh."""
    from ..server_app import CHECKPOINT, load_checkpoint, prepare

    if not (out_dir / "client_state").is_dir():
        return None
    try:  # the ServerApp's own check: the checkpoint exists and fits this configuration
        done = int(load_checkpoint(out_dir / CHECKPOINT, prepare(cfg))["round"])
    except Exception:  # missing, another configuration, or unreadable: start afresh
        return None
    return done if 0 < done < int(cfg["num_rounds"]) else None


def execute(run: Run, cfg: dict[str, Any], rerun: bool = False) -> None:
    from ..sim import simulate

    reason = needs_one_architecture(cfg)
    if reason:
        run.status, run.note = "skipped", reason
        print(f"[pfedes-bench] {run.strategy} seed {run.seed}: skipped, {reason}", flush=True)
        return
    rounds = None if rerun else finished_rounds(run.out_dir, cfg)
    if rounds is not None:
        run.rounds, run.status = rounds, "ok"
        print(f"[pfedes-bench] {run.strategy} seed {run.seed}: reusing the finished run in {run.out_dir} "
              "(rerun=true runs it again)", flush=True)
        return
    # before the summary goes: an older checkpoint is matched to its config through it
    done = None if rerun else resumable_round(run.out_dir, cfg)
    (run.out_dir / "summary.json").unlink(missing_ok=True)  # marks the run finished only at its end
    if done is None:
        shutil.rmtree(run.out_dir / "client_state", ignore_errors=True)  # a fresh run, not a resumed one
        print(f"[pfedes-bench] {run.strategy} seed {run.seed} -> {run.out_dir}", flush=True)
    else:
        cfg = {**cfg, "resume": True}
        print(f"[pfedes-bench] {run.strategy} seed {run.seed}: resuming after round {done} of "
              f"{cfg['num_rounds']} in {run.out_dir}", flush=True)
    try:
        simulate(cfg)
        run.rounds = read_rounds(run.out_dir)
        run.status = "ok"
    except Exception as exc:  # one broken method must not lose the others' results
        traceback.print_exc()
        run.status, run.note = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


