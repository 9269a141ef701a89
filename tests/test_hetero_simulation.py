"""End to end through Flower's simulation engine: each model-heterogeneous baseline runs with
the three device profiles (phone, gateway, gpu-host) on real data, and its traffic is counted."""

import json

import pytest

from conftest import make_cfg
from pfedes.sim import simulate

METHODS = ("pfedes_paper", "lgfedavg", "fedproto", "fd", "fedgh", "fml")


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_method_runs_with_three_device_profiles(name, tmp_path):
    summary = simulate(make_cfg(f"strategy={name}", "num_clients=3", "num_rounds=2",
                                "data.samples_per_client=100", f"out_dir={tmp_path}"))
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert set(r["acc_by_device"]) == {"phone", "gateway", "gpu-host"}
        assert r["clients_trained"] == 3 and r["clients_dropped"] == 0
        assert r["bytes_up_per_client"] > 0
        assert 0.0 <= r["acc_worst"] <= r["acc_mean"] <= 1.0
        assert r["train_loss"] is not None
    # Down goes what the server holds: nothing before the first per-class average exists.
    no_state_yet = name in ("fedproto", "fd")
    assert (rounds[0]["bytes_down_per_client"] == 0) == no_state_yet
    assert rounds[1]["bytes_down_per_client"] > 0
    assert summary["strategy"] == name
    assert len(list((tmp_path / "client_state").glob(f"{name}-p*.pt"))) == 3
    smallest_model_bytes = 4 * min(summary["model_params_by_device"].values())
    assert rounds[-1]["bytes_up_per_client"] < smallest_model_bytes  # never a whole model
    if name == "fml":  # the meme is a whole model: its accuracy on the unified test set
        assert all(0.0 <= r["global_acc"] <= 1.0 for r in rounds)
