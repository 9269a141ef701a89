r"""`pfedes-bench`: run several strategies on the identical partitions, seeds and local test
splits through Flower's simulation engine, then put the results side by side, e.g.

    pfedes-bench strategies=[local,fedavg,fedprox,pfedes] seeds=[0,1,2] clients.devices=[phone] \
        num_clients=10 num_rounds=30 data.path=../shared/data/cifar10 out_dir=bench/homog

It first diagnoses the heterogeneity of the partition (mean pairwise Jensen-Shannon divergence
of the clients' label distributions, per-client label histograms), then runs every (strategy,
seed) with `pfedes.sim.simulate` into <out_dir>/<strategy>/seed<k> (a run already finished
there with the same configuration is read back instead, unless rerun=true), and writes
<out_dir>/results.csv (one row per strategy and seed), results.md (one row per strategy, mean
± std over seeds) and curves.png. Personalized figures are means over the last
5 rounds. A strategy that needs one architecture is skipped, with the reason, when
clients.devices maps to several. Nothing here knows any strategy except the two references
(Local-only and FedAvg) that the gains are measured against.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError, conf_dir, experiment_config
from ..devices import check_simulation_devices
from .heterogeneity import heterogeneity_note, histogram_table, label_histograms, mean_pairwise_jsd
from .plots import plot_curves
from .runs import Run, execute, run_overrides, split_overrides
from .tables import results_table, training_note, write_csv, write_markdown


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
    for cfg in configs.values():  # every run's devices, before the first run starts
        check_simulation_devices(cfg)
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
                "training": training_note(first) + "".join(
                    f"; {name} trains at its own lr {configs[(name, seeds[0])]['strategy']['lr']:g} (strategy.lr)"
                    for name in strategies if configs[(name, seeds[0])]["strategy"].get("lr") is not None)}
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



def command_line(argv: list[str]) -> dict[str, Any]:
    """conf/bench.yaml with the command line's hydra overrides (`key=value`)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose(config_name="bench", overrides=argv)
    except HydraException as exc:
        raise ConfigError(f"bad configuration override: {str(exc).splitlines()[0]}") from None
    return OmegaConf.to_container(cfg, resolve=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nSettings (conf/bench.yaml, then every key of conf/config.yaml):\n"
              + (conf_dir() / "bench.yaml").read_text())
        return
    try:
        runs = bench(command_line(argv), argv)
    except ConfigError as exc:
        sys.exit(f"pfedes-bench: {exc}")
    failed = [f"{r.strategy} seed {r.seed}" for r in runs if r.status == "failed"]
    if failed:
        sys.exit(f"pfedes-bench: {len(failed)} run(s) failed: {', '.join(failed)} (see results.md)")
