"""`pfedes-bench`: run several strategies on the identical partitions, seeds and local test
splits through Flower's simulation engine, then put the results side by side, e.g.

    pfedes-bench strategies=[local,fedavg,fedprox,pfedes] seeds=[0,1,2] clients.devices=[phone] \
        num_clients=10 num_rounds=30 data.path=../shared/data/cifar10 out_dir=bench/homog

It first diagnoses the heterogeneity of the partition (mean pairwise Jensen-Shannon divergence
of the clients' label distributions, per-client label histograms), then runs every (strategy,
seed) with `pfedes.sim.simulate` into <out_dir>/<strategy>/seed<k> (a run already finished
there with the same configuration is read back instead, unless rerun=true), and writes
<out_dir>/results.csv (one row per strategy and seed), results.md (one row per strategy, mean
± std over seeds) and curves.png. Personalized figures are means over the last
LAST_ROUNDS rounds. A strategy that needs one architecture is skipped, with the reason, when
clients.devices maps to several. Nothing here knows any strategy except the two references
(Local-only and FedAvg) that the gains are measured against.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from .config import ConfigError, conf_dir, device_train_settings, experiment_config, with_later_settings
from .recording import shown_path

LAST_ROUNDS = 5
LOCAL, FEDAVG = "local", "fedavg"
# Keys the bench sets itself for each run, or that only the bench reads.
BENCH_KEYS = ("strategies", "seeds", "out_dir", "strategy", "seed", "rerun")
# Keys in which a finished run may differ from the one asked for and still be reused.
REUSE_FREE_KEYS = frozenset({"run_token", "client_state_dir", "out_dir", "resume", "logging"})


# -- heterogeneity ------------------------------------------------------------------------
def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence (base 2, so in [0, 1]) of two distributions."""
    p, q = p / p.sum(), q / q.sum()
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> float:
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / m[mask])))

    return 0.5 * kl(p) + 0.5 * kl(q)


def mean_pairwise_jsd(histograms: np.ndarray) -> float:
    n = len(histograms)
    pairs = [js_divergence(histograms[i], histograms[j]) for i in range(n) for j in range(i + 1, n)]
    return float(np.mean(pairs)) if pairs else 0.0


def label_histograms(cfg: dict[str, Any]) -> np.ndarray:
    """Per client (rows) the count of each label (columns) in its local data, train and test,
    exactly as the clients of this configuration load it."""
    from .data import DataSource, load_client_data

    d = cfg["data"]
    rows = []
    for pid in range(int(cfg["num_clients"])):
        data = load_client_data(DataSource.from_cfg(d), d["partition"], int(cfg["num_clients"]), pid, int(cfg["seed"]),
                                int(d["classes_per_client"]), float(d["alpha"]),
                                int(d["samples_per_client"]), float(d["test_fraction"]))
        labels = np.concatenate([data.y_train.numpy(), data.y_test.numpy()])
        rows.append(np.bincount(labels, minlength=data.num_classes))
    return np.stack(rows)


def heterogeneity_note(jsd: float) -> str:
    if jsd < 0.1:
        return "close to IID in labels: feature shift is the likelier problem"
    if jsd > 0.3:
        return "strong label skew"
    return "moderate label skew"


def histogram_table(histograms: np.ndarray) -> str:
    head = "| client | " + " | ".join(str(c) for c in range(histograms.shape[1])) + " | total |"
    rule = "|---" * (histograms.shape[1] + 2) + "|"
    body = [f"| {i} | " + " | ".join(str(int(v)) for v in row) + f" | {int(row.sum())} |"
            for i, row in enumerate(histograms)]
    return "\n".join([head, rule, *body])


# -- one run ------------------------------------------------------------------------------
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
    from .methods import method_of
    from .models import resolve_architecture

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
    from .server_app import CHECKPOINT, load_checkpoint, prepare

    if not (out_dir / "client_state").is_dir():
        return None
    try:  # the ServerApp's own check: the checkpoint exists and fits this configuration
        done = int(load_checkpoint(out_dir / CHECKPOINT, prepare(cfg))["round"])
    except Exception:  # missing, another configuration, or unreadable: start afresh
        return None
    return done if 0 < done < int(cfg["num_rounds"]) else None


def execute(run: Run, cfg: dict[str, Any], rerun: bool = False) -> None:
    from .sim import simulate

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


# -- aggregation --------------------------------------------------------------------------
def paired_gains(runs: list[Run], reference: str) -> dict[tuple[str, int], float]:
    """acc(strategy, seed) - acc(reference, seed), for the seeds where both ran."""
    base = {r.seed: r.figures["acc_mean_last"] for r in runs if r.strategy == reference and r.status == "ok"}
    return {(r.strategy, r.seed): r.figures["acc_mean_last"] - base[r.seed]
            for r in runs if r.status == "ok" and base.get(r.seed) is not None
            and r.figures["acc_mean_last"] is not None}


def mean_std(values: list[float]) -> tuple[float, float | None] | None:
    """(mean, sample standard deviation); the deviation is None for a single value."""
    if not values:
        return None
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else None)


GAIN_THRESHOLD = 0.015  # a mean gain under 1.5 points over seeds is within seed noise

CSV_FIELDS = ["strategy", "seed", "status", "note", "acc_mean_last", "acc_worst_last", "global_acc_last",
              "gain_vs_local", "gain_vs_fedavg", "bytes_up_per_client_round", "bytes_down_per_client_round",
              "seconds_per_round", "rounds", "out_dir"]


def write_csv(path: Path, runs: list[Run]) -> None:
    vs_local, vs_fedavg = paired_gains(runs, LOCAL), paired_gains(runs, FEDAVG)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in runs:
            writer.writerow({"strategy": r.strategy, "seed": r.seed, "status": r.status, "note": r.note,
                             **r.figures, "gain_vs_local": vs_local.get((r.strategy, r.seed)),
                             "gain_vs_fedavg": vs_fedavg.get((r.strategy, r.seed)),
                             "rounds": len(r.rounds), "out_dir": shown_path(r.out_dir)})


def _pct(stat: tuple[float, float | None] | None, signed: bool = False) -> str:
    if stat is None:
        return "—"
    mean, std = stat
    text = f"{100 * mean:{'+' if signed else ''}.1f}"
    return text if std is None else f"{text} ± {100 * std:.1f}"


def _bytes(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, size in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def results_table(strategies: list[str], runs: list[Run]) -> str:
    vs_local, vs_fedavg = paired_gains(runs, LOCAL), paired_gains(runs, FEDAVG)
    local_ran = any(r.strategy == LOCAL and r.status == "ok" for r in runs)
    lines = ["| strategy | personalized acc % | worst client % | gain vs Local-only (points) | "
             "gain vs FedAvg (points) | global acc % | up / client / round | down / client / round | "
             "s / round | vs Local-only |",
             "|---" * 10 + "|"]
    for name in strategies:
        mine = [r for r in runs if r.strategy == name]
        ok = [r for r in mine if r.status == "ok"]
        if not ok:
            reasons = sorted({r.note or r.status for r in mine})
            lines.append(f"| {name} | {'; '.join(reasons)} |" + " |" * 8 + " — |")
            continue

        def stat(key: str) -> tuple[float, float] | None:
            return mean_std([r.figures[key] for r in ok if r.figures[key] is not None])

        def avg(key: str) -> float | None:
            values = [r.figures[key] for r in ok if r.figures[key] is not None]
            return float(np.mean(values)) if values else None

        gain_local = mean_std([vs_local[(name, r.seed)] for r in ok if (name, r.seed) in vs_local])
        gain_fedavg = mean_std([vs_fedavg[(name, r.seed)] for r in ok if (name, r.seed) in vs_fedavg])
        if name == LOCAL:
            verdict = "reference"
        elif not local_ran or gain_local is None:
            verdict = "— (Local-only not run)"
        else:
            verdict = ("beats" if gain_local[0] >= GAIN_THRESHOLD else
                       f"level (under {100 * GAIN_THRESHOLD:.1f} points: not a gain)" if gain_local[0] > 0
                       else "**loses**")
        seconds = avg("seconds_per_round")
        lines.append(" | ".join([
            f"| {name}", _pct(stat("acc_mean_last")), _pct(stat("acc_worst_last")),
            _pct(gain_local, signed=True) if name != LOCAL else "—",
            _pct(gain_fedavg, signed=True) if name != FEDAVG else "—",
            _pct(stat("global_acc_last")), _bytes(avg("bytes_up_per_client_round")),
            _bytes(avg("bytes_down_per_client_round")),
            "—" if seconds is None else f"{seconds:.2f}", verdict]) + " |")
        failed = [r for r in mine if r.status != "ok"]
        if failed:
            lines[-1] += f" ({len(failed)} of {len(mine)} seeds did not run: {failed[0].note or failed[0].status})"
    return "\n".join(lines)


def device_table(strategies: list[str], runs: list[Run]) -> str | None:
    """Personalized accuracy per device profile (mean ± std over seeds) and its gain over
    Local-only on the same device, paired by seed; None when every client ran one profile."""
    ok = [r for r in runs if r.status == "ok"]
    devices = sorted({d for r in ok for d in r.by_device()})
    if len(devices) < 2:
        return None
    local = {r.seed: r.by_device() for r in ok if r.strategy == LOCAL}
    lines = ["| strategy | " + " | ".join(f"{d} % (gain vs Local-only)" for d in devices) + " |",
             "|---" * (len(devices) + 1) + "|"]
    for name in strategies:
        mine = [(r.seed, r.by_device()) for r in ok if r.strategy == name]
        if not mine:
            continue
        cells = []
        for device in devices:
            accs = [acc[device] for _, acc in mine if device in acc]
            gains = [acc[device] - local[seed][device] for seed, acc in mine
                     if device in acc and device in local.get(seed, {})]
            gain = "" if name == LOCAL or not gains else f" ({_pct(mean_std(gains), signed=True)})"
            cells.append(_pct(mean_std(accs)) + gain)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def proxy_table(strategies: list[str], runs: list[Run]) -> str | None:
    """The shared proxy's diagnostics (pfedes/proxy_monitor.py) for the methods that record
    them: the last linear probe of the trained and of the fresh proxy, and the proxy's feature
    std in the last round and at its lowest, against round 1; mean ± std over seeds."""
    ok = [r for r in runs if r.status == "ok" and any(x.get("proxy_std") is not None for x in r.rounds)]
    if not ok:
        return None
    lines = ["| strategy | probe, trained proxy % | probe, fresh proxy % | probe gain (points) | "
             "proxy std, last round | lowest proxy std / round 1 |", "|---" * 6 + "|"]
    for name in strategies:
        mine = [r for r in ok if r.strategy == name]
        if not mine:
            continue

        def final(r: Run, key: str) -> float:
            return [x[key] for x in r.rounds if x.get(key) is not None][-1]

        stds = [[x["proxy_std"] for x in r.rounds if x.get("proxy_std") is not None] for r in mine]
        trained, fresh = [final(r, "probe_acc") for r in mine], [final(r, "probe_acc_fresh") for r in mine]
        lines.append(" | ".join([
            f"| {name}", _pct(mean_std(trained)), _pct(mean_std(fresh)),
            _pct(mean_std([t - f for t, f in zip(trained, fresh)]), signed=True),
            f"{np.mean([s[-1] for s in stds]):.4f}",
            f"{np.mean([min(s) / s[0] for s in stds]):.2f}"]) + " |")
    return "\n".join(lines)


PLATEAU_ROUNDS, PLATEAU_POINTS = 10, 0.005  # Local-only has plateaued: its curve moves < 0.5 points in 10 rounds


def plateau(runs: list[Run], strategy: str = LOCAL) -> dict[str, Any] | None:
    """How much the strategy's seed-mean accuracy curve still moves over its last PLATEAU_ROUNDS
    rounds: the rise of its least-squares line across them (fraction, not points), per seed too.
    None when it has fewer rounds."""
    curves = [[x["acc_mean"] for x in r.rounds] for r in runs if r.strategy == strategy and r.status == "ok"]
    curves = [c[-PLATEAU_ROUNDS:] for c in curves if len(c) >= PLATEAU_ROUNDS]
    if not curves:
        return None

    def rise(curve: list[float]) -> float:
        return float(np.polyfit(np.arange(PLATEAU_ROUNDS), curve, 1)[0] * (PLATEAU_ROUNDS - 1))

    mean_rise = rise(list(np.mean(curves, axis=0)))
    return {"rise": mean_rise, "rise_by_seed": [rise(c) for c in curves],
            "plateaued": abs(mean_rise) < PLATEAU_POINTS}


def plateau_note(runs: list[Run], num_rounds: int) -> str | None:
    p = plateau(runs)
    if p is None:
        return None
    limit = f"the protocol asks for under {100 * PLATEAU_POINTS:.1f} either way"
    verdict = ("it has plateaued" if p["plateaued"] else
               f"it is still rising ({limit}): a method that only speeds up early learning can pass "
               "for a gain here" if p["rise"] > 0 else
               f"it is falling ({limit}): over-fitting, or seed noise where one seed carries the fall")
    seeds = ", ".join(f"{100 * r:+.1f}" for r in p["rise_by_seed"])
    return (f"Local-only's plateau: over rounds {num_rounds - PLATEAU_ROUNDS + 1}-{num_rounds} its mean "
            f"accuracy (over seeds) moves by {100 * p['rise']:+.1f} points (the rise of a least-squares line "
            f"across those rounds; by seed {seeds}), so {verdict}.")


def training_note(cfg: dict[str, Any]) -> str:
    """The local training settings, and what each device profile set for itself."""
    t = cfg["train"]
    note = (f"SGD lr {t['lr']}, momentum {t['momentum']}, batch {t['batch_size']}, "
            f"{t['local_epochs']} local epoch(s) per round")
    own = device_train_settings(cfg)
    if own:
        note += "; " + "; ".join(f"{d}: " + ", ".join(f"{k} {v}" for k, v in sorted(s.items()))
                                 for d, s in sorted(own.items()))
    return note


def write_markdown(path: Path, settings: dict[str, Any], strategies: list[str], runs: list[Run],
                   diagnosis: dict[str, Any]) -> None:
    seeds = settings["seeds"]
    parts = [
        "# pfedes-bench results", "",
        f"`{settings['command']}`", "",
        f"Clients: {settings['num_clients']} ({', '.join(settings['devices'])}); rounds: {settings['num_rounds']}; "
        f"data: {settings['data']}; seeds: {seeds}. Every strategy ran on the same partition, seeds and "
        "local test splits. Training: " + settings["training"] + ".", "",
        f"Personalized accuracy: each client's model on its own held-out split, averaged over clients, "
        f"mean of the last {LAST_ROUNDS} rounds; ± is the standard deviation over seeds (none with one seed). Worst client: the "
        "lowest client accuracy of a round, same averaging. Gains are paired by seed. Global accuracy: the "
        "shared model on the unified test set, only for methods that have one. Bytes: array payload per "
        "trained client and round, training and evaluation messages together. A method that does not beat "
        "Local-only is reported as losing; one that beats it by less than 1.5 points on average is reported as level (within seed noise).", "",
        results_table(strategies, runs), "",
    ]
    note = plateau_note(runs, int(settings["num_rounds"]))
    if note:
        parts += [note, ""]
    by_device = device_table(strategies, runs)
    if by_device:
        parts += ["## By device profile", "",
                  "Personalized accuracy of the clients of each device profile, same averaging; gains "
                  "over Local-only on the same clients, paired by seed.", "", by_device, ""]
    proxies = proxy_table(strategies, runs)
    if proxies:
        parts += ["## The shared proxy", "",
                  "A linear probe on the global proxy's features (one half of the unified test set to fit, "
                  "the other to score) in the last probed round, beside the same probe on the proxy as "
                  "initialised; the proxy's mean per-dimension feature std (collapse shows as a fall "
                  "below 10% of round 1).", "", proxies, ""]
    parts += [
        "## Heterogeneity", "",
    ]
    for seed, d in diagnosis.items():
        parts += [f"Seed {seed}: mean pairwise Jensen-Shannon divergence of the client label distributions "
                  f"= {d['mean_pairwise_jsd']:.3f} ({d['note']}). Labels per client:", "",
                  histogram_table(np.asarray(d["label_histograms"])), ""]
    path.write_text("\n".join(parts))


def plot_curves(path: Path, strategies: list[str], runs: list[Run]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = ["-", "--", ":", "-."]  # 10 colours repeat: the line style tells strategies apart
    for i, name in enumerate(strategies):
        curves: dict[int, list[float]] = {}
        for r in runs:
            if r.strategy == name and r.status == "ok":
                for rec in r.rounds:
                    if rec.get("acc_mean") is not None:
                        curves.setdefault(rec["round"], []).append(rec["acc_mean"])
        if curves:
            xs = sorted(curves)
            ax.plot(xs, [np.mean(curves[x]) for x in xs], marker="o", markersize=3, label=name,
                    color=f"C{i % 10}", linestyle=styles[(i // 10) % len(styles)])
    ax.set_xlabel("round")
    ax.set_ylabel("mean personalized accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=1, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- the app ------------------------------------------------------------------------------
def bench(bench_cfg: dict[str, Any], task_overrides: list[str]) -> list[Run]:
    strategies = [str(s) for s in bench_cfg["strategies"]]
    seeds = [int(s) for s in bench_cfg["seeds"]]
    if not strategies or len(set(strategies)) != len(strategies):
        raise ConfigError(f"strategies must be a non-empty list without repeats, got {strategies}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds must be a non-empty list without repeats, got {seeds}")
    out_dir = Path(str(bench_cfg["out_dir"])).expanduser().resolve()
    common, per_strategy = split_overrides(task_overrides)
    presets = {name: experiment_config([*common, f"strategy={name}"])["strategy"] for name in strategies}
    unused = sorted({o for key, o in per_strategy if not any(key in p for p in presets.values())})
    if unused:
        raise ConfigError(f"{unused}: no strategy in {strategies} has that key")

    configs = {(name, seed): experiment_config([*run_overrides(common, per_strategy, name, presets[name]),
                                                f"seed={seed}", f"out_dir={out_dir / name / f'seed{seed}'}"])
               for seed in seeds for name in strategies}
    out_dir.mkdir(parents=True, exist_ok=True)

    diagnosis = {}
    for seed in seeds:
        cfg = configs[(strategies[0], seed)]
        histograms = label_histograms(cfg)
        jsd = mean_pairwise_jsd(histograms.astype(np.float64))
        diagnosis[seed] = {"mean_pairwise_jsd": jsd, "note": heterogeneity_note(jsd),
                           "label_histograms": histograms.tolist()}
        print(f"[pfedes-bench] heterogeneity, seed {seed}: mean pairwise JSD of label distributions "
              f"{jsd:.3f} ({heterogeneity_note(jsd)})\n{histogram_table(histograms)}", flush=True)
    (out_dir / "heterogeneity.json").write_text(json.dumps(diagnosis, indent=2))

    first = configs[(strategies[0], seeds[0])]
    settings = {"seeds": seeds, "num_clients": first["num_clients"], "num_rounds": first["num_rounds"],
                "devices": first["clients"]["devices"],
                "data": f"{first['data']['path']}, {first['data']['partition']}, "
                        f"{first['data']['samples_per_client']} samples per client",
                "command": " ".join(["pfedes-bench", *task_overrides]),
                "training": training_note(first)}
    runs = [Run(name, seed, out_dir / name / f"seed{seed}") for seed in seeds for name in strategies]
    for run in runs:
        execute(run, configs[(run.strategy, run.seed)], bool(bench_cfg.get("rerun", False)))
        write_csv(out_dir / "results.csv", runs)
        write_markdown(out_dir / "results.md", settings, strategies, runs, diagnosis)
        plot_curves(out_dir / "curves.png", strategies, runs)
    print(f"[pfedes-bench] wrote {out_dir}/results.md, results.csv, curves.png, heterogeneity.json\n\n"
          + results_table(strategies, runs), flush=True)
    return runs


_COMMAND_LINE: dict[str, Any] = {}


@hydra.main(config_path=str(conf_dir()), config_name="bench", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    """Hydra parses the command line; the runs compose their own configs after it returns."""
    from hydra.core.hydra_config import HydraConfig

    _COMMAND_LINE.update(cfg=OmegaConf.to_container(cfg, resolve=True),
                         overrides=list(HydraConfig.get().overrides.task))


def main() -> None:
    _COMMAND_LINE.clear()
    _hydra_main()
    if not _COMMAND_LINE:  # --help, --cfg and the like
        return
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()  # experiment_config composes each run's config
    try:
        runs = bench(_COMMAND_LINE["cfg"], _COMMAND_LINE["overrides"])
    except ConfigError as exc:
        sys.exit(f"pfedes-bench: {exc}")
    failed = [f"{r.strategy} seed {r.seed}" for r in runs if r.status == "failed"]
    if failed:
        sys.exit(f"pfedes-bench: {len(failed)} run(s) failed: {', '.join(failed)} (see results.md)")


if __name__ == "__main__":
    main()
