"""train.device and train.amp (pfedes/devices.py): how a setting resolves, the one-line errors
for a device that does not exist, and that the device changes nothing on the wire or on disk.
Runs on the CPU; the tests that need CUDA say so and are skipped without it."""

import io
import json
import zipfile

import numpy as np
import pytest
import torch

from pfedes.config import ConfigError, experiment_config, for_device
from pfedes.devices import (DeviceError, Placement, check_simulation_devices, hidden_gpu_note, placement_for,
                            resolve_device)

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (none on this machine)")


@pytest.fixture
def machine(monkeypatch):
    """Pretend this machine has `cuda` CUDA devices and (or not) an MPS device, as pfedes.devices
    asks torch (patching torch.cuda.is_available itself would break torch._dynamo's import)."""
    from pfedes import devices

    def pretend(cuda: int = 0, mps: bool = False) -> None:
        monkeypatch.setattr(devices, "cuda_device_count", lambda: cuda)
        monkeypatch.setattr(devices, "mps_available", lambda: mps)

    return pretend


# -- resolution -------------------------------------------------------------------------------
@pytest.mark.parametrize("cuda, mps, expected", [(0, False, "cpu"), (0, True, "mps"), (2, True, "cuda")])
def test_auto_prefers_cuda_then_mps_then_the_cpu(machine, cuda, mps, expected):
    machine(cuda=cuda, mps=mps)
    assert resolve_device("train.device", "auto") == torch.device(expected)


def test_the_defaults_put_the_gpu_host_on_auto_and_phones_and_gateways_on_the_cpu(machine):
    machine(cuda=1)
    cfg = experiment_config([])
    devices = {p: placement_for(for_device(cfg, p), p).device for p in ("phone", "gateway", "gpu-host")}
    assert devices == {"phone": torch.device("cpu"), "gateway": torch.device("cpu"),
                       "gpu-host": torch.device("cuda")}


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: auto picks it")
def test_auto_picks_the_cpu_on_this_machine():
    assert placement_for(experiment_config([]), "gpu-host") == Placement(torch.device("cpu"), "none")


@pytest.mark.parametrize("value, message", [
    ("cuda", "train.by_device.gpu-host.device='cuda': no CUDA device is available on this machine"),
    ("cuda:2", "train.by_device.gpu-host.device='cuda:2': on this machine there are 2 CUDA device(s), "
               "cuda:0 to cuda:1"),
    ("mps", "train.by_device.gpu-host.device='mps': no MPS device is available on this machine"),
])
def test_a_device_this_machine_lacks_is_one_line_naming_the_setting(machine, value, message):
    machine(cuda=2 if value == "cuda:2" else 0)
    cfg = experiment_config([f"train.by_device.gpu-host.device={value}"])  # the spelling is fine anywhere
    with pytest.raises(DeviceError) as caught:
        placement_for(cfg, "gpu-host")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_device_that_exists_resolves_to_it(machine):
    machine(cuda=2)
    cfg = experiment_config(["train.device=cuda:1"])
    assert placement_for(for_device(cfg, "phone"), "phone").device == torch.device("cuda:1")


@pytest.mark.parametrize("override, message", [
    ("train.device=gpu", "train.device='gpu' is unknown: expected one of ['auto', 'cpu', 'cuda', 'cuda:N', 'mps']"),
    ("train.device=cuda:x", "train.device='cuda:x' is unknown"),
    ("train.by_device.phone.device=CUDA", "train.by_device.phone.device='CUDA' is unknown"),
    ("train.amp=fp16", "train.amp='fp16' is unknown: expected one of ['none', 'bf16']"),
    ("train.amp=bf16", "train.amp=bf16: bf16 autocast is offered on CUDA only"),
    ("train.by_device.phone.amp=bf16", "train.by_device.phone.amp=bf16: bf16 autocast is offered on CUDA only "
                                       "(on a CPU it is slower than float32 on most processors and changes the "
                                       "results), and profile 'phone' trains on train.device='cpu'"),
])
def test_a_bad_device_or_precision_setting_is_refused_on_any_machine(override, message):
    with pytest.raises(ConfigError) as caught:
        experiment_config([override])
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_bf16_is_refused_where_auto_falls_back_to_the_cpu_and_taken_on_cuda(machine, monkeypatch):
    cfg = experiment_config(["train.by_device.gpu-host.amp=bf16"])
    machine(cuda=0)
    with pytest.raises(DeviceError, match=r"train.by_device.gpu-host.amp=bf16: .* and "
                                          r"train.by_device.gpu-host.device='auto' resolves to cpu on this machine"):
        placement_for(cfg, "gpu-host")
    machine(cuda=1)
    monkeypatch.setattr(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    placement = placement_for(cfg, "gpu-host")
    assert placement == Placement(torch.device("cuda"), "bf16")
    with placement.autocast():  # the CUDA autocast context (entered without running anything on CUDA)
        assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


# -- the simulation: what Ray shows the clients -------------------------------------------------
def test_the_simulation_asks_ray_for_gpus_only_where_there_are_some(machine):
    machine(cuda=0)
    with pytest.raises(DeviceError, match=r"^simulation.num_gpus_per_client=0.5: no CUDA device is available on "
                                          r"this machine \(0 runs every client without a GPU\)$"):
        check_simulation_devices(experiment_config(["simulation.num_gpus_per_client=0.5"]))
    placements = check_simulation_devices(experiment_config([]))
    assert {p.device.type for p in placements.values()} == {"cpu"}


def test_a_gpu_that_ray_hides_is_not_used_by_auto_and_refused_when_named(machine):
    machine(cuda=1)
    hidden = experiment_config([])
    assert check_simulation_devices(hidden)["gpu-host"].device == torch.device("cpu")
    assert "profile(s) ['gpu-host'] with device auto train on the CPU" in hidden_gpu_note(hidden)
    with pytest.raises(DeviceError, match=r"train.device='cuda': no CUDA device is available to the simulated "
                                          r"clients \(simulation.num_gpus_per_client=0: Ray shows them no GPU\)"):
        check_simulation_devices(experiment_config(["train.device=cuda"]))
    shared = experiment_config(["simulation.num_gpus_per_client=0.1"])
    assert check_simulation_devices(shared)["gpu-host"].device == torch.device("cuda")
    assert hidden_gpu_note(shared) is None
    with pytest.raises(DeviceError, match=r"cuda:1'.*to each simulated client \(simulation.num_gpus_per_client=0.1\) "
                                          r"there is 1 CUDA device"):
        check_simulation_devices(experiment_config(["simulation.num_gpus_per_client=0.1", "train.device=cuda:1"]))


def test_the_bench_refuses_a_missing_device_before_its_first_run(machine, tmp_path):
    from pfedes.bench import bench

    machine(cuda=0)
    with pytest.raises(ConfigError, match=r"train.device='cuda': no CUDA device is available on this machine"):
        bench({"strategies": ["local", "pfedes"], "seeds": [0], "out_dir": str(tmp_path / "bench")},
              ["train.device=cuda"])
    assert not (tmp_path / "bench").exists()


def test_pfedes_sim_names_a_missing_device_in_one_line_before_ray_starts(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", "from pfedes.sim import main; main()", "train.device=cuda:7",
                             f"out_dir={tmp_path}/out"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pfedes-sim: train.device='cuda:7': no CUDA device is available "
                                                   "on this machine" if not CUDA else
                                                   "pfedes-sim: train.device='cuda:7': no CUDA device is available "
                                                   "to the simulated clients"), lines
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


# -- a deployed node: its client checks its own device --------------------------------------------
def node_message(cfg: dict, arrays: dict | None = None):
    """A train message as the ServerApp sends it: the experiment and the shared arrays."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    content = RecordDict({"arrays": ArrayRecord(arrays or {}), "config": ConfigRecord(
        {"experiment": json.dumps(cfg, sort_keys=True), "server-round": 1})})
    return Message(content=content, dst_node_id=1, message_type="train")


def node_context(profile: str, tmp_path):
    from flwr.app import Context, RecordDict

    return Context(run_id=1, node_id=1, node_config={"device": profile, "state-dir": str(tmp_path / "state")},
                   state=RecordDict(), run_config={})


def small_node_cfg(tmp_path, *overrides: str) -> dict:
    from pfedes.server_app import prepare

    return prepare(experiment_config(["data.samples_per_client=40", "train.batch_size=16",
                                      f"out_dir={tmp_path}/out", *overrides]))


def test_a_node_without_the_named_device_replies_with_an_error_naming_the_setting(machine, tmp_path):
    from pfedes.client_app import train

    machine(cuda=0)
    cfg = small_node_cfg(tmp_path, "train.by_device.gpu-host.device=cuda")
    reply = train(node_message(cfg), node_context("gpu-host", tmp_path))
    assert reply.has_error()
    assert reply.error.reason == ("train.by_device.gpu-host.device='cuda': no CUDA device is available on this "
                                  "machine (train.device=auto falls back to the CPU)")
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").glob("pfedes-p*.pt"))


def test_a_gpu_host_node_on_auto_trains_on_the_cpu_here_and_sends_cpu_float32(machine, tmp_path):
    """End to end through the ClientApp: the default gpu-host profile (auto) on a machine without
    CUDA trains on the CPU; the reply's arrays are float32 numpy, the private state is on the CPU."""
    from pfedes.client_app import STORE, train

    machine(cuda=0)
    from pfedes.methods import method_of

    cfg = small_node_cfg(tmp_path)
    initial = method_of(cfg).trainer.initial_shared(cfg, "cnn3", 10)  # what the server sends first
    reply = train(node_message(cfg, initial), node_context("gpu-host", tmp_path))
    assert not reply.has_error(), reply.error
    arrays = reply.content.array_records["arrays"]
    assert arrays and all(a.numpy().dtype == np.float32 for a in arrays.values())
    saved, = (tmp_path / "state").glob("pfedes-p*.pt")  # beside it: the decoded-data cache
    state = torch.load(saved, weights_only=False)  # no map_location: every tensor was saved on the CPU
    assert {t.device.type for t in state["trainer"]["exchange"].values()} == {"cpu"}
    trainer, _ = STORE.get(saved, int(state["version"]), lambda: None, cfg.get("run_token", ""))
    assert trainer.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in trainer.exchange.parameters())


# -- the wire and the disk do not depend on the device ----------------------------------------------
def test_on_the_cpu_a_round_is_bit_identical_to_the_loop_without_device_handling(small_data, cfg_factory):
    """The device plumbing (modules moved, batches moved, the autocast context) changes nothing on
    the CPU: Trainer.fit equals the bare loop over data.batches calling train_step on a twin."""
    from pfedes.client_round import build_trainer
    from pfedes.client_state import state_digest
    from pfedes.data import batches

    cfg = cfg_factory("strategy=local", "train.local_epochs=2")
    placed = build_trainer(cfg, "cnn3", 10, 0, placement=Placement(torch.device("cpu")))
    fitted = placed.fit(small_data, torch.Generator().manual_seed(5))
    twin = build_trainer(cfg, "cnn3", 10, 0)
    twin.model.train()
    generator, losses = torch.Generator().manual_seed(5), []
    for _ in range(2):
        for x, y in batches(small_data.x_train, small_data.y_train, 16, generator, train=True, do_augment=True,
                            fmt=twin.image):
            losses.append(twin.train_step(x, y)["train_loss"])
    assert fitted["train_loss"] == sum(losses) / len(losses)
    assert state_digest(placed.shared_state()) == state_digest(twin.shared_state())
    assert state_digest(placed.optimizer.state_dict()) == state_digest(twin.optimizer.state_dict())
    assert placed.accuracy(small_data.x_test, small_data.y_test, placed.predict) == \
        twin.accuracy(small_data.x_test, small_data.y_test, twin.predict)


def first_arrays(cfg: dict) -> dict:
    """What the server sends a cnn3 client in round 1."""
    from pfedes.methods import method_of

    return method_of(cfg).trainer.initial_shared(cfg, "cnn3", 10)


def saved_as_if_on_cuda(path):
    """Rewrite a torch.save file so that its tensors say they were saved on cuda:0, as a GPU host
    writes them (only the storage location tag changes)."""
    src = zipfile.ZipFile(io.BytesIO(path.read_bytes()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert b"X\x03\x00\x00\x00cpu" in data
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            dst.writestr(info.filename, data)
    path.write_bytes(out.getvalue())


@pytest.mark.skipif(CUDA, reason="proves a CUDA-saved state loads where CUDA is absent")
def test_private_state_saved_on_a_gpu_host_resumes_on_a_cpu(small_data, cfg_factory, tmp_path):
    from pfedes.client_round import build_trainer, train_round
    from pfedes.client_state import StateStore, state_digest

    cfg = cfg_factory("strategy=ditto")  # a private personal model and two optimizers' momentum
    trainer = build_trainer(cfg, "cnn3", 10, 0)
    train_round(trainer, first_arrays(cfg), small_data, cfg, 0, 1)
    path = tmp_path / "p0.pt"
    StateStore().save(path, trainer, 1)
    saved_as_if_on_cuda(path)
    with pytest.raises(RuntimeError, match="on a CUDA device"):  # the file is a GPU host's
        torch.load(path, weights_only=False)
    restored, version = StateStore().get(path, None, lambda: build_trainer(cfg, "cnn3", 10, 0))
    assert version == 1 and state_digest(restored.state_dict()) == state_digest(trainer.state_dict())
    assert restored.device.type == "cpu"
    assert {s["momentum_buffer"].device.type for s in restored.optimizer.state_dict()["state"].values()} == {"cpu"}


# -- on a GPU (skipped without one) ---------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("strategy", ["pfedes", "fedproto", "ditto", "pfedes_paper"])
def test_a_cuda_trainer_sends_what_a_cpu_trainer_sends(small_data, cfg_factory, strategy):
    from pfedes.client_round import build_trainer, train_round

    cfg = cfg_factory(f"strategy={strategy}")
    sent = {}
    for device in ("cpu", "cuda"):
        trainer = build_trainer(cfg, "cnn3", 10, 0, placement=Placement(torch.device(device)))
        sent[device], _ = train_round(trainer, first_arrays(cfg), small_data, cfg, 0, 1)
    assert {k: (v.device.type, v.dtype, v.shape) for k, v in sent["cuda"].items()} == \
           {k: ("cpu", v.dtype, v.shape) for k, v in sent["cpu"].items()}


@needs_cuda
def test_private_state_saved_on_the_cpu_resumes_on_cuda_and_back(small_data, cfg_factory, tmp_path):
    from pfedes.client_round import build_trainer, train_round
    from pfedes.client_state import StateStore, state_digest

    cfg = cfg_factory("strategy=ditto")
    trainer = build_trainer(cfg, "cnn3", 10, 0)
    train_round(trainer, first_arrays(cfg), small_data, cfg, 0, 1)
    StateStore().save(tmp_path / "cpu.pt", trainer, 1)
    on_cuda, _ = StateStore().get(tmp_path / "cpu.pt", None,
                                  lambda: build_trainer(cfg, "cnn3", 10, 0, placement=Placement(torch.device("cuda"))))
    assert next(on_cuda.exchange.parameters()).is_cuda
    assert state_digest(on_cuda.state_dict()) == state_digest(trainer.state_dict())
    train_round(on_cuda, first_arrays(cfg), small_data, cfg, 0, 2)
    StateStore().save(tmp_path / "cuda.pt", on_cuda, 2)
    back, _ = StateStore().get(tmp_path / "cuda.pt", None, lambda: build_trainer(cfg, "cnn3", 10, 0))
    assert state_digest(back.state_dict()) == state_digest(on_cuda.state_dict())


# -- end to end: a simulation, and the GPU smoke script's CPU side --------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(CUDA, reason="proves that auto picks the CPU where there is no CUDA")
def test_a_simulation_with_every_profile_on_auto_trains_on_the_cpu_here(tmp_path):
    from conftest import make_cfg

    from pfedes.sim import simulate

    summary = simulate(make_cfg("num_clients=3", "num_rounds=1", "data.samples_per_client=60", "train.device=auto",
                                f"out_dir={tmp_path}"))
    assert summary["config"]["train"]["device"] == "auto"
    states = sorted((tmp_path / "client_state").glob("pfedes-p*.pt"))
    assert len(states) == 3
    for path in states:  # no map_location: every tensor a client saved is a CPU tensor
        assert {t.device.type for t in torch.load(path, weights_only=False)["trainer"]["exchange"].values()} == {"cpu"}


def run_smoke(*args: str, timeout: int):
    """benchmarks/gpu_smoke.py from the repository root, importing this checkout's pfedes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(CUDA, reason="checks what the smoke script does without a GPU")
def test_the_gpu_smoke_script_says_in_one_line_that_there_is_no_gpu(tmp_path):
    result = run_smoke("--out", str(tmp_path / "smoke.json"), timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == [
        "gpu_smoke: no CUDA device on this machine (torch.cuda.is_available() is False): nothing to compare, "
        "nothing written; --cpu-only runs the CPU side alone"]
    assert not (tmp_path / "smoke.json").exists()


@pytest.mark.slow
def test_the_gpu_smoke_scripts_cpu_side_runs_at_tiny_size(tmp_path):
    out = tmp_path / "smoke.json"
    result = run_smoke("--cpu-only", "--rounds", "1", "--clients", "3", "--out", str(out),
                       "--work-dir", str(tmp_path / "runs"), "data.samples_per_client=60", timeout=1200)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(out.read_text())
    cpu = written["sides"]["cpu"]
    assert set(written["sides"]) == {"cpu"} and cpu["num_clients"] == 3 and cpu["samples_per_client"] == 60
    assert len(cpu["seconds_by_round"]) == 1 and len(cpu["acc_by_client_last"]) == 3 and cpu["clients_dropped"] == 0
