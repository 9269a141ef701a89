"""End to end through Flower's simulation engine: each one-architecture baseline runs on
phone clients and real data, with its traffic counted and its own server figures recorded."""

import json

import pytest

from conftest import make_cfg
from pfedes.sim import simulate

WITH_GLOBAL_MODEL = ("fedprox", "ditto", "apfl", "pfedme", "perfedavg", "lora")
WITHOUT = ("fedbn", "fedper", "fedrep", "cfl")


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_GLOBAL_MODEL + WITHOUT)
def test_one_architecture_method_runs_on_phone_clients(name, tmp_path):
    summary = simulate(make_cfg(f"strategy={name}", "clients.devices=[phone]", "num_clients=3",
                                "num_rounds=2", "data.samples_per_client=100", f"out_dir={tmp_path}"))
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    model_bytes = 4 * summary["model_params_by_device"]["phone"]
    for r in rounds:
        assert r["clients_trained"] == 3 and r["clients_dropped"] == 0
        assert 0.0 <= r["acc_worst"] <= r["acc_mean"] <= 1.0
        assert r["train_loss"] is not None
        assert 0 < r["bytes_up_per_client"] <= 1.01 * model_bytes  # + each array's .npy header
        assert ("global_acc" in r) == (name in WITH_GLOBAL_MODEL)
    if name == "lora":  # only the adapters travel
        assert rounds[-1]["bytes_up_per_client"] < model_bytes / 4
    if name == "cfl":  # the cluster count and what the split criterion read, per round
        for r in rounds:
            server = r["server_metrics"]
            assert server["clusters"] >= 1
            assert len(server["mean_update_norm"]) == len(server["max_update_norm"]) >= 1
            assert all(m <= x + 1e-9 for m, x in zip(server["mean_update_norm"], server["max_update_norm"]))
    else:
        assert all(r["server_metrics"] == {} for r in rounds)
    assert summary["strategy"] == name
