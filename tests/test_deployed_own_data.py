"""Own data through a real deployment (a SuperLink, SuperNodes and `flwr run`, each a process of its
own): the 28x28 grayscale 10-class dataset with pFedES, the 64x64 RGB 100-class one with a
heterogeneous baseline, both through `pfedes-trial`, whose devices share one dataset as partitions
(it gives every SuperNode the run's data.path as its `data-path`, with its own `partition-id`);
then devices each with their own data (`data-path` a directory of its own, holding some of the
run's classes), through pfedes/local_deployment.py. Each device reads its data and builds its
models for what it infers there, in the run's classes."""

import json
from pathlib import Path

import pytest
import torch

from own_data import gray28, make_images, rgb64, write_image_folder
from pfedes.data import image_format, num_classes_of
from pfedes.local_deployment import LocalDeployment
from pfedes.methods import method_of
from pfedes.models import resolve_architecture
from pfedes.trial import main

pytestmark = pytest.mark.slow


def deployed(tmp_path: Path, data: Path, nodes: int, settings: str) -> tuple[Path, list[dict], dict]:
    """A `pfedes-trial` run on `data`: its directory, metrics.jsonl's rounds and summary.json."""
    root = tmp_path / "trial"
    assert main(["--nodes", str(nodes), "--dir", str(root), "--timeout", "1500", "-c",
                 f"data.path='{data}' data.partition='iid' train.torch_threads=1 {settings}"]) == 0
    results = root / "results"
    rounds = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
    return root, rounds, json.loads((results / "summary.json").read_text())


def shapes(state: dict) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in state.items()}


def assert_built_for_the_data(root: Path, summary: dict, data: Path, expected: tuple[int, int, int, int]):
    """The server's shared entries and each device's saved models have the shapes of models built
    for the data's channels, size and classes, and not those of the 3x32x32 10-class default."""
    fmt, classes = image_format(str(data)), num_classes_of(str(data))
    assert (fmt.channels, fmt.height, fmt.width, classes) == expected
    cfg = summary["config"]
    trainer = method_of(cfg).trainer
    server = torch.load(root / "results" / "server_checkpoint.pt", weights_only=False)["arrays"]
    assert shapes(server) == shapes(trainer.initial_shared(cfg, resolve_architecture("phone", cfg["model"]["profiles"]),
                                                           classes, fmt))
    assert summary["proxy_params"] == sum(v.size for v in server.values())
    for state_dir in sorted((root / "state").iterdir()):
        device = state_dir.name.rsplit("-", 1)[0]
        arch = resolve_architecture(device, cfg["model"]["profiles"])
        (saved,) = state_dir.glob(f"{cfg['strategy']['name']}-p*.pt")
        saved = torch.load(saved, weights_only=False)["trainer"]
        built = trainer(cfg, arch, classes, seed=0, image=fmt).state_dict()
        default = trainer(cfg, arch, 10, seed=0).state_dict()
        assert saved["arch"] == arch
        for part in ("exchange", "private"):
            assert shapes(saved[part]) == shapes(built[part]), (device, part)
        assert [shapes(saved[p]) for p in ("exchange", "private")] != \
            [shapes(default[p]) for p in ("exchange", "private")], device  # not the default's models
        assert summary["model_params_by_device"][device] == sum(
            v.numel() for v in trainer(cfg, arch, classes, seed=0, image=fmt).model.parameters())


def test_a_28x28_grayscale_10_class_parquet_dataset_trains_pfedes_on_a_deployment(tmp_path):
    data = gray28(tmp_path / "data", "hf_parquet")
    root, rounds, summary = deployed(tmp_path, data, 2, "num_rounds=2 data.samples_per_client=40 "
                                                       "data.unified_test_samples=20 strategy.warmup_steps=0")
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["clients_trained"] == 2 and r["clients_dropped"] == 0 for r in rounds)
    assert sorted(rounds[-1]["acc_by_device"]) == ["gateway", "phone"]  # cnn3 and resnet_bn
    assert summary["strategy"] == "pfedes" and 0.0 <= summary["acc_mean_last5"] <= 1.0
    assert_built_for_the_data(root, summary, data, (1, 28, 28, 10))


def test_a_64x64_rgb_100_class_image_folder_trains_lgfedavg_on_a_deployment(tmp_path):
    data = rgb64(tmp_path / "data", "imagefolder", n=200)
    root, rounds, summary = deployed(tmp_path, data, 2, "num_rounds=1 strategy.name='lgfedavg' "
                                                       "data.samples_per_client=50")
    assert len(rounds) == 1 and rounds[0]["clients_trained"] == 2 and rounds[0]["clients_dropped"] == 0
    assert sorted(rounds[0]["acc_by_device"]) == ["gateway", "phone"]
    assert summary["strategy"] == "lgfedavg" and 0.0 <= summary["acc_mean_last5"] <= 1.0
    server = torch.load(root / "results" / "server_checkpoint.pt", weights_only=False)["arrays"]
    assert any(v.shape[0] == 100 for v in server.values())  # the shared head has one row per class
    assert_built_for_the_data(root, summary, data, (3, 64, 64, 100))


def test_devices_with_their_own_data_and_some_of_the_classes_train_pfedes_on_a_deployment(tmp_path):
    """The real case: each SuperNode its own image folder (node config data-path, no partition),
    the phone classes 0-4 of the run's ten, the gateway 5-9; the run's data.path (the server's)
    has all ten. Each device builds its models for the ten and reads class007 as class 7."""
    data = gray28(tmp_path / "run-data", "imagefolder")
    images, labels = make_images(80, 10, (28, 28), "L", seed=7)
    own = {}
    for device, classes in (("phone", range(5)), ("gateway", range(5, 10))):
        keep = [i for i, label in enumerate(labels) if label in classes]
        own[device] = write_image_folder(tmp_path / f"{device}-data", [images[i] for i in keep],
                                         [labels[i] for i in keep])
        assert num_classes_of(str(own[device])) == 5
    out_dir = tmp_path / "results"
    with LocalDeployment(tmp_path / "deploy", tls=False, node_auth=False, node_names=tuple(own)) as dep:
        dep.start_superlink()
        for device, path in own.items():
            dep.start_supernode(device, {"device": device, "data-path": str(path),
                                         "state-dir": str(tmp_path / "state" / device)})
        dep.wait_nodes_online(2)
        run_id = dep.submit({"num_clients": 2, "num_rounds": 1, "data.path": str(data), "data.partition": "iid",
                             "data.samples_per_client": 40, "evaluate_in_train": True, "train.torch_threads": 1,
                             "strategy.warmup_steps": 0, "out_dir": str(out_dir)})
        status = dep.wait_run(run_id, timeout=1500)
        assert status["status"] == "finished:completed", dep.run_log(run_id)[-3000:]
        logs = {device: dep.log_text(device)[-3000:] for device in own}
    (record,) = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["clients_trained"] == 2 and record["clients_dropped"] == 0, logs
    assert sorted(record["acc_by_device"]) == ["gateway", "phone"]
    summary = json.loads((out_dir / "summary.json").read_text())
    cfg = summary["config"]
    fmt = image_format(str(own["phone"]))
    for device in own:
        saved = torch.load(tmp_path / "state" / device / "pfedes-p0.pt", weights_only=False)["trainer"]
        built = method_of(cfg).trainer(cfg, saved["arch"], 10, seed=0, image=fmt).state_dict()
        for part in ("exchange", "private"):
            assert shapes(saved[part]) == shapes(built[part]), (device, part)
