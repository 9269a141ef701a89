"""End to end through Flower's simulation engine: 3 heterogeneous clients, 2 rounds, real data."""

import json

import pytest

from conftest import make_cfg
from pfedes.sim import simulate


@pytest.mark.slow
def test_pfedes_simulation_with_three_device_profiles(tmp_path):
    cfg = make_cfg("num_clients=3", "num_rounds=2", "data.samples_per_client=150",
                   f"out_dir={tmp_path}")
    summary = simulate(cfg)
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        for key in ("acc_mean", "acc_worst", "acc_by_device", "train_loss", "align_loss",
                    "bytes_up", "bytes_down", "seconds"):
            assert r[key] is not None, key
        assert set(r["acc_by_device"]) == {"phone", "gateway", "gpu-host"}
        assert 0.0 <= r["acc_worst"] <= r["acc_mean"] <= 1.0
        assert r["clients_trained"] == 3 and r["clients_dropped"] == 0
    # Only the proxy travels: per client and round, up == down == the proxy's bytes.
    assert rounds[0]["bytes_up_per_client"] == rounds[0]["bytes_down_per_client"] > 0
    assert all(k.startswith("proxy.") for k in summary["shared_keys"])
    assert summary["proxy_params"] < min(summary["model_params_by_device"].values())
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "accuracy.png").stat().st_size > 0
    assert len(list((tmp_path / "client_state").glob("pfedes-p*.pt"))) == 3


@pytest.mark.slow
def test_resume_continues_from_the_checkpoint_with_the_same_proxy(tmp_path):
    import torch

    from pfedes.server_app import CHECKPOINT

    common = ["num_clients=2", "clients.devices=[phone,gateway]", "data.samples_per_client=100",
              f"out_dir={tmp_path}"]
    simulate(make_cfg("num_rounds=1", *common))
    saved = torch.load(tmp_path / CHECKPOINT, weights_only=False)
    assert saved["round"] == 1
    summary = simulate(make_cfg("num_rounds=2", "resume=true", *common))
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2] and summary["rounds"] == 2
    resumed = torch.load(tmp_path / CHECKPOINT, weights_only=False)
    assert resumed["round"] == 2
    # The second run started from the saved proxy: it differs from it after one more round.
    assert set(resumed["arrays"]) == set(saved["arrays"])


@pytest.mark.slow
def test_evaluating_in_the_train_reply_gives_the_evaluate_rounds_figures(tmp_path):
    """pFedES's evaluation does not use the new proxy, so the personal model evaluated right
    after training is the one the evaluate round sees: same figures, one message less."""
    common = ["num_clients=3", "num_rounds=2", "data.samples_per_client=100"]
    runs = {}
    for flag in ("false", "true"):
        simulate(make_cfg(*common, f"evaluate_in_train={flag}", f"out_dir={tmp_path / flag}"))
        runs[flag] = [json.loads(line) for line in (tmp_path / flag / "metrics.jsonl").read_text().splitlines()]
    for separate, folded in zip(runs["false"], runs["true"]):
        assert folded["acc_by_client"] == separate["acc_by_client"]
        assert folded["acc_mean"] == separate["acc_mean"] and folded["clients_trained"] == 3
