"""`pfedes-sim`: a hydra app over conf/ that runs the ServerApp and ClientApp through Flower's
simulation engine in this process, e.g.

    pfedes-sim strategy=pfedes num_clients=10 num_rounds=30 data.path=../shared/data/cifar10
"""

from __future__ import annotations

import os
import sys
from logging import WARNING
from typing import Any

import hydra
from flwr.common.logger import log
from omegaconf import DictConfig

from .config import ConfigError, conf_dir, to_dict, validate
from .data import DataError, DataSource, check_data
from .devices import check_simulation_devices, hidden_gpu_note
from .flower_log import quiet_flower


def simulate(cfg: dict[str, Any], client_app=None) -> dict[str, Any]:
    """Run one experiment in Flower's simulation engine; returns the run's summary. `client_app`:
    another ClientApp for every node (a benchmark's, e.g. benchmarks/poisoning.py's attackers)."""
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from .client_app import app as pfedes_client_app
    from .server_app import check_method_settings, prepare, serve

    client_app = client_app or pfedes_client_app
    validate(cfg)
    check_simulation_devices(cfg)  # each profile's train.device as Ray will show the machine to it
    note = hidden_gpu_note(cfg)
    if note:
        log(WARNING, "[pfedes] %s", note)
    check_data(DataSource.from_cfg(cfg["data"]), int(cfg["num_clients"]))  # fail fast, with one line, before Ray starts
    check_method_settings(cfg)
    cfg = prepare(cfg)
    result: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid, context):  # noqa: ANN001  the hydra config instead of Flower's run config
        result.update(serve(grid, cfg))

    sim = cfg["simulation"]  # Ray gives a client GPUs only when num_gpus_per_client asks for them
    cpus = int(sim["num_cpus_per_client"]) or (os.cpu_count() or 1)
    with quiet_flower():
        run_simulation(
            server_app=server_app, client_app=client_app, num_supernodes=int(cfg["num_clients"]),
            backend_config={"client_resources": {"num_cpus": cpus, "num_gpus": float(sim["num_gpus_per_client"])},
                            "init_args": {"num_cpus": os.cpu_count() or 1}},
        )
    if not result:
        raise RuntimeError("the simulation ended without a result: see the log above")
    return result


@hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    try:
        simulate(to_dict(cfg))
    except (ConfigError, DataError) as exc:
        sys.exit(f"pfedes-sim: {exc}")


def main() -> None:
    _hydra_main()
