"""Own data through a real deployment (`pfedes-trial`: a SuperLink, SuperNodes and `flwr run`, each
a process of its own): the 28x28 grayscale 10-class dataset with pFedES, the 64x64 RGB 100-class
one with a heterogeneous baseline. The devices share one dataset as partitions (`pfedes-trial`
gives every SuperNode the run's data.path as its `data-path`, with its own `partition-id`); each
device reads it and builds its models for what it infers there."""

import json
from pathlib import Path

import pytest
import torch

from own_data import gray28, rgb64
from pfedes.data import image_format, num_classes_of
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

