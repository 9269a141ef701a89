"""The bench's tables: results.csv (one row per strategy and seed) and results.md (one row per
strategy, mean ± std over seeds, gains paired by seed, the plateau, devices, the shared proxy)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from ..config import device_train_settings
from ..recording import shown_path
from .heterogeneity import histogram_table
from .runs import LAST_ROUNDS, Run

LOCAL, FEDAVG = "local", "fedavg"


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
            f"{t['local_epochs']} local epoch(s) per round, device {t.get('device', 'cpu')}"
            + ("" if t.get("amp", "none") == "none" else f", amp {t['amp']}"))
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
        "client asked to train, per round, training and evaluation messages together. A method that does not beat "
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


