"""`pfedes-trial`: a first deployment on this machine in one command. It starts a SuperLink and N
SuperNodes with Flower's own CLIs (`flower-superlink`, `flower-supernode`), submits the run with
`flwr run`, shows each round as it lands, stops every process it started, and exits non-zero
when the run failed (unlike `flwr run`, whose exit code does not say).

    pfedes-trial                                  # 3 devices, the embedded sample, 3 rounds
    pfedes-trial --nodes 4 --tls -c "num_rounds=5 strategy.name='local'"

Everything stays under --dir (default outputs/trial): the SuperLink's database, each device's
private state and Flower home, the logs, the CLI's connection, and the run's results (results/).
Nothing is written to ~/.flwr. The devices cycle phone, gateway, gpu-host and share the data
(data.path, default the embedded sample) as partitions. A bad setting is one line before anything
starts. Default for devices: evaluate_in_train=true (one ClientApp process per device and round,
not two) where the method can take it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from .config import ConfigError, default_run_config, experiment_config, overrides_from_run_config
from .data import DataError, embedded_dir, resolve_data_dir
from .methods import method_of
from .server_app import check_method_settings

DEVICES = ("phone", "gateway", "gpu-host")


def parse_run_config(text: str) -> dict:
    """`-c "k=v k2=v2"` as `flwr run -c` reads it (TOML values)."""
    from flwr.common.config import parse_config_args

    return parse_config_args([text]) if text.strip() else {}


def run_config_for(args: argparse.Namespace, root: Path) -> dict:
    """The run config sent to the SuperLink; checked here first, so that a bad setting is one
    line before anything starts."""
    wanted = parse_run_config(args.config)
    unknown = sorted(set(wanted) - set(default_run_config()))
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown}: see pyproject.toml [tool.flwr.app.config]")
    data = str(wanted.get("data.path", "embedded"))
    data = str(embedded_dir()) if data == "embedded" else str(Path(data).expanduser().resolve())
    resolve_data_dir(data)
    run = {"num_clients": args.nodes, "num_rounds": 3, **wanted, "data.path": data, "out_dir": str(root / "results")}
    cfg = experiment_config(overrides_from_run_config(dict(default_run_config(), **run)))
    if "evaluate_in_train" not in wanted:  # the devices' default, where the method can take it
        run["evaluate_in_train"] = not method_of(cfg).strategy.send_arrays_to_evaluate
        cfg = experiment_config(overrides_from_run_config(dict(default_run_config(), **run)))
    check_method_settings(cfg)
    return run


def progress(results: Path, shown: int) -> int:
    """Print the rounds the ServerApp has logged since `shown`; returns the new count."""
    path = results / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in lines[shown:]:
        r = json.loads(line)
        acc = "-" if r.get("acc_mean") is None else f"{r['acc_mean']:.3f}"
        print(f"[pfedes-trial] round {r['round']}: acc_mean {acc}  clients {r['clients_trained']}  "
              f"{r['seconds']:.1f}s", flush=True)
    return len(lines)


def main(argv: list[str] | None = None) -> int:
    from .local_deployment import ROOT, DeploymentError, LocalDeployment

    parser = argparse.ArgumentParser(prog="pfedes-trial", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3, help="SuperNodes (devices) to start")
    parser.add_argument("--dir", type=Path, default=Path("outputs/trial"), help="where everything goes")
    parser.add_argument("--tls", action="store_true", help="TLS and SuperNode authentication (certificates "
                                                           "made by scripts/make_certs.sh)")
    parser.add_argument("-c", "--run-config", dest="config", default="",
                        help='settings as `flwr run -c` takes them, e.g. "num_rounds=5 strategy.name=\'local\'"')
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the run")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        print("pfedes-trial: --nodes must be >= 1", file=sys.stderr)
        return 2
    if not (ROOT / "pyproject.toml").is_file():
        print(f"pfedes-trial: needs the source checkout (the app is packed from it), not found at {ROOT}",
              file=sys.stderr)
        return 2
    root = args.dir.expanduser().resolve()
    try:
        run = run_config_for(args, root)
    except (ConfigError, DataError) as exc:
        print(f"pfedes-trial: {exc}", file=sys.stderr)
        return 2
    names = [f"{DEVICES[i % len(DEVICES)]}-{i}" for i in range(args.nodes)]
    print(f"[pfedes-trial] {args.nodes} devices on 127.0.0.1 ({'TLS + SuperNode auth' if args.tls else 'insecure'})"
          f", everything under {root}; run config: {shlex.quote(json.dumps(run))}", flush=True)
    dep = LocalDeployment(root, tls=args.tls, node_auth=args.tls, node_names=tuple(names))
    try:
        dep.start_superlink()
        for i, name in enumerate(names):
            if args.tls:
                dep.register(name)
            dep.start_supernode(name, {"device": DEVICES[i % len(DEVICES)], "data-path": run["data.path"],
                                       "state-dir": str(root / "state" / name), "partition-id": i,
                                       "num-partitions": args.nodes})
        dep.wait_nodes_online(args.nodes)
        run_id = dep.submit(run)
        print(f"[pfedes-trial] run {run_id} submitted; `flwr log {run_id}` with FLWR_HOME={root / 'flwr-cli'} "
              "shows the ServerApp's log", flush=True)
        shown, end = 0, time.monotonic() + args.timeout
        while True:
            status = str(dep.run_status(run_id).get("status", ""))
            shown = progress(root / "results", shown)
            if status.startswith("finished") or time.monotonic() > end:
                break
            time.sleep(2)
        shown = progress(root / "results", shown)
        if status != "finished:completed":
            tail = "\n".join(dep.run_log(run_id).splitlines()[-15:])
            print(f"{tail}\npfedes-trial: run {run_id} ended as '{status or 'unfinished'}' (logs in {root / 'logs'})",
                  file=sys.stderr)
            return 1
        print(f"[pfedes-trial] run {run_id} finished: results in {root / 'results'}", flush=True)
        return 0
    except DeploymentError as exc:
        print(f"pfedes-trial: {str(exc).splitlines()[0]} (logs in {root / 'logs'})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pfedes-trial: interrupted; stopping the SuperLink and the SuperNodes", file=sys.stderr)
        return 130
    finally:
        dep.close()


def cli() -> None:
    sys.exit(main())
