"""Poisoned clients against the server's defences (pfedes/robust.py): some clients send scaled
(x100) or sign-flipped updates every round; pFedES's accuracy with no defence, with the default
(norm-anomaly rejection, then the direction check relative to the round's spread with its memory
of the nodes it dropped), with the norm check alone (the default until 2026-12-06), with a fixed
cosine floor, with the relative check without memory, with the memory also counting rounds far
below the median (`strike_spread`), and with a trimmed mean, the median or Multi-Krum (each after
the norm check), beside the clean run with the default, paired by seed.

    python benchmarks/poisoning.py [--seeds 0 1 2] [--attackers 0 5] [--conditions flip:default ...]
                                   [--out DIR] [hydra overrides]
                                   [--replay-strike-spreads S ... --replay-strike-shares H ...]

(the replay options last: each takes every value that follows it)

The attackers live here only: this file's ClientApp wraps pfedes's own and rewrites the train
reply of the attacking partitions (update u = sent - received becomes 100 u, or -u). No setting in
conf/ reaches it. Runs are reused when finished with the same configuration (as pfedes-bench); a
clean run with the norm check alone is also taken from the reference table
(`benchmarks/results/hetero_dirichlet_val`, made with it) when it finished there with the same configuration,
as it does with `num_rounds=60 data.val_fraction=0.15` (the plateau protocol; the default is 20
rounds without a validation split). `--conditions` runs a subset (attack:defence; the clean run
with the default defence is always run, as every other run is paired with it).
Writes <out>/poisoning.csv, poisoning.json and poisoning.png (default out: benchmarks/results/poisoning).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from _common import REFERENCE_BENCH, RESULTS, default_data_path, experiment, stat
from pfedes.client_app import decode_downlink
from pfedes.robust import MAD_TO_STD, MIN_COSINES_FOR_SPREAD, DirectionStrikes, Robustness

ATTACKS = {"scale": 100.0, "flip": -1.0}  # u -> factor * u
# chosen on the tuning seeds by --replay-strike-spreads and --replay-strike-shares (README, "Robust aggregation")
STRIKE_SPREAD, STRIKE_SHARE = 2.5, 0.4
NO_DIRECTION = ["aggregation.direction_spread=0", "aggregation.direction_strikes=0"]
DEFENCES = {
    "none": ["aggregation.rule=mean", "aggregation.norm_threshold=0", *NO_DIRECTION],
    # conf/'s: the norm check, then the direction check relative to the round's spread (4 robust
    # std below its median cosine) with its memory (a node dropped in 3 rounds, and in a quarter of
    # its rounds, is quarantined), then the weighted mean
    "default": [],
    "norm_check": NO_DIRECTION,  # the norm check alone: the default until 2026-12-06
    "direction": ["aggregation.min_cosine=0", *NO_DIRECTION],  # the norm check and a fixed cosine floor of 0
    "spread_each_round": ["aggregation.direction_strikes=0"],  # the default without the memory
    # the default with rounds past STRIKE_SPREAD robust spreads also counting toward the quarantine,
    # which takes STRIKE_SHARE of a node's rounds
    "strike_spread": [f"aggregation.strike_spread={STRIKE_SPREAD}", f"aggregation.strike_share={STRIKE_SHARE}"],
    "trimmed_mean": ["aggregation.rule=trimmed_mean", "aggregation.trim_fraction=0.2", *NO_DIRECTION],
    "median": ["aggregation.rule=median", *NO_DIRECTION],
    "multikrum": ["aggregation.rule=multikrum", "aggregation.num_malicious=2", *NO_DIRECTION],
}
# the norm check runs before every rule and already drops the x100 updates, so the direction
# checks, the median and Multi-Krum are measured against the flips, which pass it
AGAINST_SCALE = ("none", "norm_check", "default", "trimmed_mean")
# without attackers: what the direction checks and Multi-Krum (setting aside f honest replies) cost
CONDITIONS = [("clean", "default"), ("clean", "norm_check"), ("clean", "direction"), ("clean", "spread_each_round"),
              ("clean", "multikrum"), ("clean", "strike_spread")] + [
    (a, d) for a in ATTACKS for d in DEFENCES if a == "flip" or d in AGAINST_SCALE]
LAST = 5
OUTLIER_SPREADS = 2.0  # a node's cosine this many robust spreads below its round's median: see outlier_shares

attacker_app = ClientApp()


def poisoned(reply: Message, received: ArrayRecord, factor: float) -> Message:
    """The reply with every floating shared entry moved to received + factor * (sent - received)."""
    for name, record in list(reply.content.array_records.items()):
        out = {}
        for key, array in record.items():
            value = array.numpy()
            ref = received[key].numpy() if key in received else np.zeros_like(value)
            out[key] = ((ref + factor * (value - ref)).astype(value.dtype) if value.dtype.kind == "f" else value)
        reply.content[name] = ArrayRecord({k: Array(v) for k, v in out.items()})
    return reply


@attacker_app.train(mods=[decode_downlink])  # as pfedes's: the arrays decoded first
def train(msg: Message, context: Context) -> Message:
    from pfedes import client_app

    cfg = client_app.parse_experiment(str(msg.content["config"]["experiment"]))
    received = msg.content.array_records.get("arrays", ArrayRecord())
    reply = client_app.train(msg, context)
    attack = cfg.get("attack") or {}
    partition = int(context.node_config.get("partition-id", -1))
    if not reply.has_error() and partition in attack.get("partitions", []):
        reply = poisoned(reply, received, float(attack["factor"]))
    return reply


@attacker_app.evaluate(mods=[decode_downlink])
def evaluate(msg: Message, context: Context) -> Message:
    from pfedes import client_app

    return client_app.evaluate(msg, context)


def run_condition(attack: str, defence: str, seed: int, attackers: list[int], out: Path,
                  overrides: list[str]) -> list[dict]:
    """One run (reused when it finished with the same configuration); its per-round records."""
    from pfedes.bench.runs import finished_rounds, read_rounds
    from pfedes.sim import simulate

    run_dir = out / f"{attack}-{defence}" / f"seed{seed}"
    cfg = experiment([*DEFENCES[defence], *overrides], seed=seed, out_dir=str(run_dir))
    if attack != "clean":
        cfg["attack"] = {"factor": ATTACKS[attack], "partitions": attackers}
    rounds = finished_rounds(run_dir, cfg)
    if rounds is None and (attack, defence) == ("clean", "norm_check"):  # the reference table's defence
        rounds = finished_rounds(REFERENCE_BENCH / str(cfg["strategy"]["name"]) / f"seed{seed}", cfg)
    if rounds is None:
        from pfedes import config

        # the ServerApp (in this process) sends clients only config.CLIENT_KEYS: for this
        # benchmark's runs it also sends `attack`, so that the attacker ClientApp sees it
        keys = config.CLIENT_KEYS
        config.CLIENT_KEYS = (*keys, "attack")
        try:
            simulate(cfg, client_app=attacker_app)
        finally:
            config.CLIENT_KEYS = keys
        rounds = read_rounds(run_dir)
    return rounds


def last_mean(rounds: list[dict], key: str = "acc_mean") -> float:
    return float(np.mean([r[key] for r in rounds[-LAST:]]))


def honest_last_mean(rounds: list[dict], attackers: list[int]) -> float:
    """The last rounds' mean accuracy over the clients that do not attack (a defence that sets the
    attackers' replies aside protects the others, not the attackers' own accuracy)."""
    return float(np.mean([np.mean([acc for partition, acc in r["acc_by_client"].items()
                                   if int(partition) not in attackers]) for r in rounds[-LAST:]]))


def outlier_shares(rounds: list[dict], spreads: float = OUTLIER_SPREADS) -> dict[int, float]:
    """{node: share of its checked rounds in which its update's cosine (`update_cosines`) lay more
    than `spreads` robust standard deviations (as the direction check's) below the round's median cosine}: the
    evidence a direction check could gather across rounds about a node that no single round shows."""
    hits: dict[int, list[bool]] = {}
    for r in rounds:
        cosines = r.get("update_cosines") or {}
        if len(cosines) < MIN_COSINES_FOR_SPREAD:
            continue
        values = np.array(list(cosines.values()))
        median = np.median(values)
        spread = MAD_TO_STD * np.median(np.abs(values - median))
        for node, cosine in cosines.items():
            hits.setdefault(int(node), []).append(bool(cosine < median - spreads * spread))
    return {node: float(np.mean(h)) for node, h in hits.items()}


def outlier_summary(rounds: list[dict], attackers: list[int]) -> dict:
    """The attackers' mean and the honest nodes' highest outlier share (None without cosines)."""
    shares = outlier_shares(rounds)
    attacking = [v for node, v in shares.items() if node in attackers]
    honest = [v for node, v in shares.items() if node not in attackers]
    return {"outlier_share_attackers": float(np.mean(attacking)) if attacking else None,
            "outlier_share_honest_max": max(honest) if honest else None}


def replayed_quarantines(rounds: list[dict], strike_spread: float, strike_share: float = 0.25,
                         limit: int = 3) -> dict[int, int]:
    """{node: the round in which the direction check's memory (`direction_strikes` limit) with
    `strike_spread` and `strike_share` would have quarantined it}, replayed on a run's recorded
    cosines and floors with pfedes.robust's own rule. Exact until the first quarantine that the run itself did not make
    (from then on the run would have gone differently); a node the replay quarantines is skipped
    after, one the run quarantined has no cosines after."""
    robust = Robustness(direction_strikes=limit, strike_spread=strike_spread, strike_share=strike_share)
    memory, out = DirectionStrikes(limit, strike_share), {}
    for r in rounds:
        recorded = {int(node): c for node, c in (r.get("update_cosines") or {}).items()}
        nodes = [node for node in recorded if node not in memory.quarantined]
        cosines = [recorded[node] for node in nodes]
        floor = r.get("update_cosine_floor")  # to the 4 decimals the cosines are recorded with:
        away = [] if floor is None else [i for i, c in enumerate(cosines) if c <= round(floor, 4)]  # (ties: below)
        for node, struck in zip(nodes, robust.strikes(cosines, away)):
            if memory.record(node, struck):
                out[node] = int(r["round"])
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--attackers", type=int, nargs="+", default=[0, 5], help="partition ids")
    parser.add_argument("--conditions", nargs="+", choices=[f"{a}:{d}" for a, d in CONDITIONS],
                        default=[f"{a}:{d}" for a, d in CONDITIONS], help="attack:defence")
    parser.add_argument("--out", type=Path, default=RESULTS / "poisoning")
    parser.add_argument("--replay-strike-spreads", type=float, nargs="+", default=[], metavar="S",
                        help="print, per run, the nodes the memory would quarantine with aggregation.strike_spread=S "
                        "(replayed on its recorded cosines; how STRIKE_SPREAD was chosen on the tuning seeds)")
    parser.add_argument("--replay-strike-shares", type=float, nargs="+", default=[0.25], metavar="SHARE",
                        help="... and each aggregation.strike_share=SHARE")
    args, overrides = parser.parse_known_args(argv)
    conditions = [(a, d) for a, d in CONDITIONS if f"{a}:{d}" in args.conditions or (a, d) == ("clean", "default")]
    overrides = [f"data.path={default_data_path()}", "num_clients=10", "data.partition=dirichlet",
                 "data.alpha=0.3", "data.samples_per_client=500", *overrides]
    rows = []
    for seed in args.seeds:
        for attack, defence in conditions:
            rounds = run_condition(attack, defence, seed, args.attackers, args.out, overrides)
            rows.append({"attack": attack, "defence": defence, "seed": seed, "acc_last5": last_mean(rounds),
                         "honest_acc_last5": honest_last_mean(rounds, args.attackers),
                         "dropped_per_round": float(np.mean([r["clients_dropped"] for r in rounds])),
                         **outlier_summary(rounds, args.attackers)})
            print(f"[poisoning] seed {seed} {attack:5s} {defence:12s} acc {rows[-1]['acc_last5']:.3f} "
                  f"dropped/round {rows[-1]['dropped_per_round']:.2f}", flush=True)
            for share in args.replay_strike_shares:
                for spread in args.replay_strike_spreads:
                    print(f"  replayed with strike_spread={spread:g} strike_share={share:g}: quarantined "
                          f"{{node: round}} {replayed_quarantines(rounds, spread, share)} (attackers {args.attackers})",
                          flush=True)
    report(rows, conditions, args, overrides)


def report(rows: list[dict], conditions: list[tuple[str, str]], args, overrides: list[str]) -> None:
    clean = {r["seed"]: r for r in rows if (r["attack"], r["defence"]) == ("clean", "default")}
    summary = []
    for attack, defence in conditions:
        runs = [r for r in rows if (r["attack"], r["defence"]) == (attack, defence)]
        entry = {"attack": attack, "defence": defence}
        for prefix, key in (("", "acc_last5"), ("honest_", "honest_acc_last5")):  # all clients; the others
            accs = np.array([r[key] for r in runs]) * 100
            gaps = np.array([r[key] - clean[r["seed"]][key] for r in runs]) * 100
            entry.update({f"{prefix}acc_mean": float(accs.mean()), f"{prefix}acc_std": stat(accs)["std"] or 0.0,
                          f"{prefix}vs_clean_mean": float(gaps.mean()), f"{prefix}vs_clean_std": stat(gaps)["std"] or 0.0})
        summary.append({**entry, "dropped_per_round": float(np.mean([r["dropped_per_round"] for r in runs])),
                        **{key: by_seed(runs, key) for key in ("outlier_share_attackers", "outlier_share_honest_max")}})
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/poisoning.py " + " ".join(
        [f"--seeds {' '.join(map(str, args.seeds))}", f"--attackers {' '.join(map(str, args.attackers))}"]
        + ([] if len(conditions) == len(CONDITIONS) else [f"--conditions {' '.join(args.conditions)}"])
        + [f"--out {args.out}"] * (args.out.resolve() != RESULTS / "poisoning")
        + overrides)
    (args.out / "poisoning.json").write_text(json.dumps({"command": command, "runs": rows, "summary": summary},
                                                        indent=2))
    with (args.out / "poisoning.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    plot(summary, args.out / "poisoning.png")
    print(f"\n`{command}`\n\n| attack | defence | accuracy % | vs clean (points) | the other clients' "
          "accuracy % | theirs vs clean | replies dropped / round |\n|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['attack']} | {s['defence']} | {s['acc_mean']:.1f} ± {s['acc_std']:.1f} | "
              f"{s['vs_clean_mean']:+.1f} ± {s['vs_clean_std']:.1f} | {s['honest_acc_mean']:.1f} ± "
              f"{s['honest_acc_std']:.1f} | {s['honest_vs_clean_mean']:+.1f} ± {s['honest_vs_clean_std']:.1f} | "
              f"{s['dropped_per_round']:.2f} |")
    print(f"\nshare of a node's checked rounds with its cosine over {OUTLIER_SPREADS:g} robust spreads below the "
          "round's median (by seed): the attackers' mean; the most of any honest node")
    for s in summary:
        if s["outlier_share_honest_max"]:
            print(f"  {s['attack']:5s} {s['defence']:18s} attackers {s['outlier_share_attackers'] or '-'}; "
                  f"honest max {s['outlier_share_honest_max']}")


def by_seed(runs: list[dict], key: str) -> str | None:
    """"0.42 / 0.85 / 0.85": a per-run figure by seed, or None where no run has it."""
    values = [r.get(key) for r in runs]
    return None if all(v is None for v in values) else " / ".join("-" if v is None else f"{v:.2f}" for v in values)


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = np.arange(len(summary))
    for offset, prefix, label in ((-0.2, "", "all clients"), (0.2, "honest_", "the clients that do not attack")):
        ax.bar(x + offset, [s[f"{prefix}acc_mean"] for s in summary], 0.4, label=label,
               yerr=[s[f"{prefix}acc_std"] for s in summary], capsize=3)
    ax.set_xticks(x, [f"{s['attack']}\n{s['defence']}" for s in summary])
    ax.legend(fontsize=8)
    ax.set_ylabel("personalized accuracy % (last 5 rounds)")
    ax.set_title("pFedES with poisoned clients")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1:])
