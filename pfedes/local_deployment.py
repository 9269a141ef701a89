"""A real Flower deployment on 127.0.0.1 for a first trial (`pfedes-trial`), tests and
measurements: one SuperLink, SuperNodes and the `flwr` CLI, each a process of its own, optionally
with TLS and SuperNode authentication made by scripts/make_certs.sh. A thin layer over Flower's own
CLIs: it starts them, waits for them (every wait is bounded), and `close()` kills every process
group it started. Everything it writes stays under its root directory (the CLI's FLWR_HOME too).
Needs the source checkout (it packs the app from it).

    with LocalDeployment(tmp_path) as dep:
        dep.start_superlink()
        dep.register("phone")
        dep.start_supernode("phone", {"device": "phone", "data-path": ..., "state-dir": ...})
        run_id = dep.submit({"num_rounds": 3, ...})
        status = dep.wait_run(run_id)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
APP_NAME = "pfedes-app"  # `flwr build` wants the app directory to be a valid app name
APP_FILES = ("pyproject.toml", "LICENSE", "pfedes", "conf")
CONNECTION = "pfedes-local"


class DeploymentError(RuntimeError):
    """A deployment step failed or did not finish in time; the message says which."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def key_values(config: dict[str, Any]) -> str:
    """`k=v` pairs as `--node-config` and `--run-config` parse them."""
    return " ".join(f"{k}={toml_value(v)}" for k, v in config.items())


def wait_until(condition, timeout: float, what: str, interval: float = 0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        result = condition()
        if result:
            return result
        time.sleep(interval)
    raise DeploymentError(f"timed out after {timeout:.0f}s waiting for {what}")


class LocalDeployment:
    """SuperLink + SuperNodes + CLI under one directory; see the module docstring."""

    def __init__(self, root: Path, *, tls: bool = True, node_auth: bool = True,
                 node_names: tuple[str, ...] = ("phone", "gateway", "gpu-host", "intruder")) -> None:
        if node_auth and not tls:
            raise ValueError("SuperNode authentication needs TLS")
        self.root = Path(root)
        self.tls, self.node_auth = tls, node_auth
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.certs = self.root / "certs"
        self.app = self.root / APP_NAME
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.log_files: dict[str, list[Path]] = {}
        self.env = dict(os.environ,
                        FLWR_HOME=str(self.root / "flwr-cli"),
                        FLWR_DISABLE_UPDATE_CHECK="1",
                        FLWR_TELEMETRY_ENABLED="0",
                        HF_HUB_OFFLINE="1",
                        PYTHONUNBUFFERED="1")
        if tls:
            subprocess.run(["bash", str(ROOT / "scripts" / "make_certs.sh"), str(self.certs), *node_names],
                           check=True, capture_output=True, timeout=120)
        self._copy_app()
        self._write_connection()

    # -- setup -------------------------------------------------------------------------
    def _copy_app(self) -> None:
        """The app as `flwr run` packs it, outside the repository (the CLI rewrites the
        pyproject.toml of an app that still holds [tool.flwr.federations])."""
        self.app.mkdir(parents=True, exist_ok=True)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.parquet")
        for name in APP_FILES:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, self.app / name, ignore=ignore, dirs_exist_ok=True)
            else:
                shutil.copy2(src, self.app / name)

    def _write_connection(self) -> None:
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]",
                 f'address = "{self.address}"']
        lines.append(f'root-certificates = "{self.certs / "ca.crt"}"' if self.tls else "insecure = true")
        (home / "config.toml").write_text("\n".join(lines) + "\n")

    def tls_args(self) -> list[str]:
        return ["--root-certificates", str(self.certs / "ca.crt")] if self.tls else ["--insecure"]

    # -- processes ---------------------------------------------------------------------
    def _start(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
               cwd: Path | None = None) -> subprocess.Popen:
        if name in self.procs and self.procs[name].poll() is None:
            raise DeploymentError(f"'{name}' is already running")
        runs = self.log_files.setdefault(name, [])
        log_path = self.logs / f"{name}.{len(runs)}.log"
        runs.append(log_path)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env or self.env,
                                    cwd=cwd or self.root, start_new_session=True)
        self.procs[name] = proc
        return proc

    def log_text(self, name: str, run: int = -1) -> str:
        return self.log_files[name][run].read_text(errors="replace")

    def start_superlink(self, timeout: float = 60) -> None:
        cmd = ["flower-superlink", "--host", "127.0.0.1", "--port", str(self.port),
               "--database", str(self.root / "superlink.db"), "--disable-runtime-dependency-installation"]
        if self.tls:
            cmd += ["--ssl-ca-certfile", str(self.certs / "ca.crt"),
                    "--ssl-certfile", str(self.certs / "superlink.crt"),
                    "--ssl-keyfile", str(self.certs / "superlink.key")]
        else:
            cmd += ["--insecure"]
        if self.node_auth:
            cmd += ["--enable-supernode-auth"]
        proc = self._start("superlink", cmd, cwd=self.root)

        def listening():
            if proc.poll() is not None:
                raise DeploymentError(f"flower-superlink exited ({proc.returncode}):\n"
                                      f"{self.log_text('superlink')[-2000:]}")
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0

        wait_until(listening, timeout, "the SuperLink to listen")

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(["flwr", *args], env=self.env, cwd=self.root, capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise DeploymentError(f"`flwr {' '.join(args)}` failed ({result.returncode}):\n"
                                  f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        return result

    def cli_json(self, *args: str, timeout: float = 120) -> dict[str, Any]:
        out = self.cli(*args, "--format", "json", timeout=timeout).stdout
        start = out.find("{")
        if start < 0:
            raise DeploymentError(f"`flwr {' '.join(args)}` printed no JSON:\n{out[-2000:]}")
        return json.loads(out[start:])

    def register(self, name: str) -> int:
        """Register the SuperNode key pair `name` with the SuperLink; returns its node id."""
        reply = self.cli_json("supernode", "register", str(self.certs / "supernode-keys" / f"{name}.pub"),
                              CONNECTION)
        return int(reply["node-id"])

    def start_supernode(self, name: str, node_config: dict[str, Any], *, key: str | None = None,
                        port: int | None = None, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        """A SuperNode authenticated by the key pair `key` (default: `name`)."""
        cmd = ["flower-supernode", "--superlink", self.address, *self.tls_args(),
               "--port", str(port or free_port()), "--node-config", key_values(node_config)]
        if self.node_auth:
            cmd += ["--auth-supernode-private-key", str(self.certs / "supernode-keys" / (key or name))]
        home = self.root / f"flwr-{name}"  # each device installs the FAB in its own home
        env = dict(self.env, FLWR_HOME=str(home), **(extra_env or {}))
        return self._start(name, cmd, env=env)

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        """Kill the process group of `name` (the process and what it started)."""
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)  # start_new_session=True: the group id is the pid
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)

    def close(self) -> None:
        for name in reversed(list(self.procs)):
            self.kill(name)

    def __enter__(self) -> LocalDeployment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- runs --------------------------------------------------------------------------
    def connected_nodes(self) -> list[dict[str, Any]]:
        return self.cli_json("supernode", "ls", CONNECTION).get("nodes", [])

    def wait_nodes_online(self, count: int, timeout: float = 120) -> None:
        wait_until(lambda: sum(n.get("status") == "online" for n in self.connected_nodes()) >= count,
                   timeout, f"{count} SuperNodes online", interval=2)

    def submit(self, run_config: dict[str, Any]) -> int:
        """`flwr run APP CONNECTION -c ...`; returns the run id."""
        args = ["run", str(self.app), CONNECTION]
        if run_config:
            args += ["--run-config", key_values(run_config)]
        reply = self.cli_json(*args, timeout=300)
        if not reply.get("success", False) or "run-id" not in reply:
            raise DeploymentError(f"`flwr run` did not start a run: {reply}")
        return int(reply["run-id"])

    def run_status(self, run_id: int) -> dict[str, Any]:
        reply = self.cli_json("ls", CONNECTION, "--run-id", str(run_id))
        runs = reply.get("runs", [])
        if not runs:
            raise DeploymentError(f"`flwr ls --run-id {run_id}` knows no such run: {reply}")
        return runs[0]

    def wait_run(self, run_id: int, timeout: float) -> dict[str, Any]:
        """Wait until the run leaves pending/starting/running; returns its `flwr ls` entry."""
        def finished():
            run = self.run_status(run_id)
            return run if str(run.get("status", "")).startswith("finished") else None

        try:
            return wait_until(finished, timeout, f"run {run_id} to finish", interval=2)
        except DeploymentError as exc:
            raise DeploymentError(f"{exc}\n{self.run_log(run_id)[-3000:]}") from None

    def run_log(self, run_id: int, timeout: float = 30) -> str:
        """The ServerApp's log as `flwr log` prints it (without following)."""
        result = self.cli("log", str(run_id), CONNECTION, "--show", timeout=timeout, check=False)
        return result.stdout + result.stderr

