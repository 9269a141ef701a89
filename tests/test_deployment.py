"""Real deployment on 127.0.0.1 with Flower's deployment engine: a SuperLink, SuperNodes and the
`flwr` CLI as separate processes, TLS everywhere and SuperNode authentication (pfedes/local_deployment.py).

The end-to-end test follows one federation through what users do to it: three devices train
three rounds, one device dies mid-run, the server is restarted and resumes, the dead device
comes back and restores its private model from disk, and two misconfigured devices join.
"""

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from flwr.app import Array, ArrayRecord

from pfedes.local_deployment import ROOT, LocalDeployment, wait_until
from pfedes.client_state import state_digest
from pfedes.data import embedded_dir
from pfedes.server_app import CHECKPOINT
from pfedes.strategies.base import arrays_nbytes

DEVICES = ("phone", "gateway", "gpu-host")
BAD_NODES = ("bad-device", "bad-data")


def read_rounds(out_dir: Path) -> list[dict]:
    path = out_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def node_config(device: str, index: int, data: Path, state_root: Path) -> dict:
    """Three devices that share one dataset for the trial: partition-id splits it."""
    return {"device": device, "data-path": str(data), "state-dir": str(state_root / device),
            "partition-id": index, "num-partitions": len(DEVICES)}


def proxy_nbytes(checkpoint: dict) -> int:
    """The proxy's size as it travels (Flower's serialised arrays)."""
    return arrays_nbytes(ArrayRecord({k: Array(np.asarray(v)) for k, v in checkpoint["arrays"].items()}))


@pytest.mark.slow
def test_three_devices_over_tls_with_auth_survive_kills_and_restarts(tmp_path):
    data = embedded_dir()
    out_dir, state_root = tmp_path / "server-out", tmp_path / "device-state"
    # No warm-up, so the proxy moves in every round and a resumed run could not pass for a fresh one.
    run_config = {"num_clients": 3, "min_available_clients": 2, "data.path": str(data),
                  "data.samples_per_client": 100, "strategy.warmup_steps": 0, "train.torch_threads": 1,
                  "out_dir": str(out_dir)}
    configs = {d: node_config(d, i, data, state_root) for i, d in enumerate(DEVICES)}
    with LocalDeployment(tmp_path / "deploy", node_names=(*DEVICES, *BAD_NODES, "intruder")) as dep:
        dep.start_superlink()
        node_ids = {name: dep.register(name) for name in (*DEVICES, *BAD_NODES)}

        # A SuperNode whose key was never registered is refused and exits.
        intruder = dep.start_supernode("intruder", configs["phone"])
        assert intruder.wait(timeout=180) != 0
        assert "Failed to activate SuperNode" in dep.log_text("intruder")

        for device in DEVICES:
            dep.start_supernode(device, configs[device])
        dep.wait_nodes_online(3)

        # Run A: three rounds; gpu-host dies after round 1, the run finishes with the other two.
        run_a = dep.submit({**run_config, "num_rounds": 3})
        wait_until(lambda: len(read_rounds(out_dir)) >= 1, 600, "round 1 of run A", interval=1)
        dep.kill("gpu-host")
        gpu_state = state_root / "gpu-host" / "pfedes-p2.pt"
        saved = torch.load(gpu_state, weights_only=False)
        assert saved["version"] == 1
        status_a = dep.wait_run(run_a, timeout=900)
        assert status_a["status"] == "finished:completed", dep.run_log(run_a)[-3000:]

        rounds = read_rounds(out_dir)
        assert [r["round"] for r in rounds] == [1, 2, 3]
        for r in rounds:
            for key in ("acc_mean", "acc_worst", "train_loss", "align_loss", "seconds"):
                assert r[key] is not None, (r["round"], key)
            assert 0.0 <= r["acc_worst"] <= r["acc_mean"] <= 1.0
        assert set(rounds[0]["acc_by_device"]) == set(DEVICES) and rounds[0]["clients_trained"] == 3
        assert rounds[0]["clients_dropped"] == 0
        # gpu-host was sampled in round 2 and never answered: Flower reports it unavailable.
        assert rounds[1]["clients_trained"] == 2 and rounds[1]["clients_dropped"] == 1
        assert rounds[2]["clients_trained"] == 2 and rounds[2]["clients_dropped"] == 0
        assert set(rounds[2]["acc_by_device"]) == {"phone", "gateway"}
        assert torch.load(gpu_state, weights_only=False)["version"] == 1  # nothing touched it since

        # Only the proxy travels. The server drops replies whose keys differ from the proxy's
        # (none dropped except the dead node), it counted exactly the proxy's bytes per reply,
        # and Flower's own count of client-to-server traffic has room for nothing bigger.
        checkpoint = torch.load(out_dir / CHECKPOINT, weights_only=False)
        assert checkpoint["round"] == 3
        assert checkpoint["arrays"] and all(k.startswith("proxy.") for k in checkpoint["arrays"])
        proxy = proxy_nbytes(checkpoint)
        for r in rounds:  # train messages carry the proxy both ways; evaluate messages none
            assert r["bytes_up"] == r["clients_trained"] * proxy
            assert r["bytes_down"] == (r["clients_trained"] + r["clients_dropped"]) * proxy
        train_replies = sum(r["clients_trained"] for r in rounds)
        print("run A:", json.dumps(status_a), "proxy bytes", proxy, "train replies", train_replies)
        assert train_replies * proxy <= status_a["network-traffic"]["inbound-bytes"] < (train_replies + 1) * proxy

        # The server (SuperLink and ServerApp) is killed and restarted; the devices reconnect.
        dep.kill("superlink")
        dep.start_superlink()
        # The dead device comes back, and two misconfigured devices join.
        dep.start_supernode("gpu-host", configs["gpu-host"])
        dep.start_supernode("bad-device", {**configs["phone"], "device": "toaster",
                                           "state-dir": str(state_root / "bad-device")})
        dep.start_supernode("bad-data", {**configs["phone"], "data-path": str(tmp_path / "no-such-dir"),
                                         "state-dir": str(state_root / "bad-data")})
        dep.wait_nodes_online(5, timeout=240)

        # Run B: resume=true continues after round 3 from the checkpointed proxy.
        run_b = dep.submit({**run_config, "num_rounds": 4, "resume": True})
        status_b = dep.wait_run(run_b, timeout=900)
        server_log = dep.run_log(run_b)
        assert status_b["status"] == "finished:completed", server_log[-3000:]
        assert (f"resuming after round 3 from {out_dir / CHECKPOINT} "
                f"(shared digest {state_digest(checkpoint['arrays'])})") in server_log
        rounds = read_rounds(out_dir)
        assert [r["round"] for r in rounds] == [1, 2, 3, 4]
        assert rounds[3]["clients_trained"] == 3 and set(rounds[3]["acc_by_device"]) == set(DEVICES)
        assert rounds[3]["clients_dropped"] == 2  # the two misconfigured devices
        assert torch.load(out_dir / CHECKPOINT, weights_only=False)["round"] == 4

        # The restarted device restored, bit for bit, the private model it saved before dying
        # (backbone, head, projection, optimizer state), and went on from it.
        restored = (f"restored private state v1 from {gpu_state} "
                    f"(digest {state_digest(saved['trainer'])})")
        assert restored in dep.log_text("gpu-host", run=1)
        assert torch.load(gpu_state, weights_only=False)["version"] == 2

        # Misconfigured devices: one error line naming the key, no traceback, the run went on.
        for name, key in (("bad-device", "'device'"), ("bad-data", "'data-path'")):
            log = dep.log_text(name)
            errors = [line for line in log.splitlines() if "pfedes ClientApp:" in line]
            assert errors and all(f"node-config {key}" in line for line in errors), log[-2000:]
            assert "Traceback" not in log
            assert (f"dropped the reply of node {node_ids[name]}: client error: node-config {key}"
                    in server_log)


def test_make_certs_writes_what_flower_loads(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from cryptography.x509 import DNSName, IPAddress, SubjectAlternativeName, load_pem_x509_certificate
    from flwr.cli.supernode.register import try_load_public_key

    out = tmp_path / "certs"
    subprocess.run(["bash", str(ROOT / "scripts" / "make_certs.sh"), str(out), "phone", "edge-1"],
                   check=True, capture_output=True, timeout=120, env={"SUPERLINK_HOSTS": "fl.example.org 10.0.0.7",
                                                                       "PATH": "/usr/bin:/bin"})
    subprocess.run(["openssl", "verify", "-CAfile", out / "ca.crt", out / "superlink.crt"], check=True,
                   capture_output=True)
    cert = load_pem_x509_certificate((out / "superlink.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(SubjectAlternativeName).value
    assert set(san.get_values_for_type(DNSName)) == {"localhost", "superlink", "fl.example.org"}
    assert {str(ip) for ip in san.get_values_for_type(IPAddress)} == {"127.0.0.1", "::1", "10.0.0.7"}
    for name in ("phone", "edge-1"):
        key = load_ssh_private_key((out / "supernode-keys" / name).read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
        assert try_load_public_key(out / "supernode-keys" / f"{name}.pub")  # what `flwr supernode register` reads
        assert (out / "supernode-keys" / name).stat().st_mode & 0o077 == 0  # private keys: owner only
    assert (out / "superlink.key").stat().st_mode & 0o077 == 0


def test_make_certs_rejects_a_bad_node_name(tmp_path):
    result = subprocess.run(["bash", str(ROOT / "scripts" / "make_certs.sh"), str(tmp_path), "a b/c"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "make_certs.sh: node name 'a b/c' may hold only letters, digits, '-' and '_'"]


COMPOSE = ROOT / "docker" / "compose.yml"


def flwr_version() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d.split("==")[1] for d in deps if d.startswith("flwr[") or d.startswith("flwr=="))


def parse_node_config(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in shlex.split(text))


def volume_paths(volume: str) -> tuple[str, str]:
    """(host, container) of a short-syntax volume; the host part may hold ${VAR:-default}."""
    volume = re.sub(r":(ro|rw)$", "", volume)
    host, container = volume.rsplit(":", 1)
    return host, container


def test_compose_runs_tls_and_node_auth_with_one_data_and_state_volume_per_device():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    version = flwr_version()
    link = services["superlink"]
    assert link["image"] == f"flwr/superlink:{version}"
    assert "--insecure" not in link["command"] and "--enable-supernode-auth" in link["command"]
    assert {"--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"} <= set(link["command"])
    assert link["ports"] == ["8000:8000"]
    assert services["superexec-serverapp"]["build"]["args"]["FLWR_VERSION"] == version
    assert re.search(rf"ARG FLWR_VERSION={re.escape(version)}\nFROM flwr/superexec:\$\{{FLWR_VERSION\}}",
                     (ROOT / "docker" / "Dockerfile").read_text())
    host_dirs = []
    for device in DEVICES:
        node, executor = services[f"supernode-{device}"], services[f"superexec-{device}"]
        assert node["image"] == f"flwr/supernode:{version}"
        args = node["command"]
        assert "--insecure" not in args and "--root-certificates" in args
        assert args[args.index("--superlink") + 1] == "superlink:8000"
        assert args[args.index("--auth-supernode-private-key") + 1]
        config = parse_node_config(args[args.index("--node-config") + 1])
        assert config["device"] == device
        # The ClientApp runs in the SuperExec container: the node-config paths are mounted there.
        mounts = dict(reversed(volume_paths(v)) for v in executor["volumes"])
        assert config["data-path"] in mounts and config["state-dir"] in mounts
        host_dirs += [mounts[config["data-path"]], mounts[config["state-dir"]]]
    assert len(set(host_dirs)) == 2 * len(DEVICES)  # nothing shared between devices


def compose_command() -> list[str] | None:
    """`docker-compose`, or `docker compose` where that plugin answers; None if neither works."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_compose_file_passes_compose_config(tmp_path):
    """`config` parses and validates the file without a Docker engine."""
    compose = compose_command()
    if compose is None:
        pytest.skip("no working docker-compose or `docker compose` client here")
    result = subprocess.run([*compose, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT / "docker")
    assert result.returncode == 0, result.stderr

