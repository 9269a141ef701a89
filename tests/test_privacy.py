"""Central DP on what is shared (pfedes/privacy.py): clipping bounds each update, the noise has the
configured scale, the accountant matches the Gaussian mechanism's known RDP bound, and bad
settings are one line before anything starts."""

import numpy as np
import pytest

from conftest import make_cfg, train_reply
from pfedes.config import ConfigError, experiment_config
from pfedes.privacy import Privacy, epsilon_after
from pfedes.server_app import check_method_settings
from pfedes.strategies.pfedes import PFedES

REF = {"w": np.zeros(4, np.float32), "n": np.array(3, np.int64)}


def test_clipping_bounds_the_update_norm_and_leaves_small_updates_and_counters():
    privacy = Privacy(noise_multiplier=1.0, clipping_norm=2.0)
    big = privacy.clip({"w": np.full(4, 10.0, np.float32), "n": np.array(9, np.int64)}, REF)
    assert np.linalg.norm(big["w"] - REF["w"]) == pytest.approx(2.0, rel=1e-6)
    np.testing.assert_allclose(big["w"], 1.0)  # the direction is kept: (10, 10, 10, 10) scaled to norm 2
    assert big["n"] == 9 and big["w"].dtype == np.float32
    small = privacy.clip({"w": np.full(4, 0.5, np.float32)}, REF)  # norm 1 < 2: unchanged
    np.testing.assert_allclose(small["w"], 0.5)
    unchanged = privacy.clip({"w": REF["w"].copy()}, REF)  # a client still warming up: norm 0
    np.testing.assert_array_equal(unchanged["w"], REF["w"])


def test_the_noise_has_the_configured_scale():
    privacy = Privacy(noise_multiplier=1.5, clipping_norm=2.0)
    noisy = privacy.add_noise({"w": np.zeros(200_000, np.float32), "n": np.array(3, np.int64)}, count=4)
    assert noisy["w"].std() == pytest.approx(1.5 * 2.0 / 4, rel=0.02)  # sigma * C / m
    assert noisy["n"] == 3


def test_the_accountant_matches_the_gaussian_mechanisms_rdp_bound():
    """T releases of the Gaussian mechanism with multiplier sigma are (alpha, T alpha / (2 sigma^2))-RDP;
    the classic conversion gives eps = min_alpha T alpha / (2 sigma^2) + log(1/delta) / (alpha - 1).
    Flower's accountant (dp-accounting) converts more tightly, so it must be at or a little below."""
    rounds, sigma, delta = 60, 1.0, 1e-5
    alpha = np.linspace(1.01, 200, 400_000)
    classic = float((rounds * alpha / (2 * sigma**2) + np.log(1 / delta) / (alpha - 1)).min())
    eps = epsilon_after(sigma, [10] * rounds, population=10, delta=delta)
    assert 0.9 * classic <= eps <= classic
    assert epsilon_after(2 * sigma, [10] * rounds, 10, delta) < eps  # more noise, less spent


def test_a_target_epsilon_chooses_the_smallest_noise_that_meets_it():
    cfg = experiment_config(["privacy.target_epsilon=8", "num_rounds=30", "num_clients=10"])
    sigma = Privacy.from_cfg(cfg).noise_multiplier
    assert epsilon_after(sigma, [10] * 30, 10, 1e-5) <= 8
    assert epsilon_after(0.97 * sigma, [10] * 30, 10, 1e-5) > 8


def strategy(*overrides):
    s = PFedES(make_cfg("num_clients=4", "privacy.noise_multiplier=1e-9", "privacy.clipping_norm=1.0", *overrides))
    s.current = {k: v.copy() for k, v in REF.items()}
    return s


def test_the_server_averages_clipped_updates_with_equal_weights_and_reports_epsilon():
    s = strategy()
    replies = [train_reply(1, {"w": np.full(4, 10.0, np.float32), "n": np.array(3)}, 100, train_loss=1.0),
               train_reply(2, {"w": np.full(4, 0.1, np.float32), "n": np.array(3)}, 1, train_loss=1.0),
               train_reply(3, {"w": np.full(4, -0.1, np.float32), "n": np.array(3)}, 1, train_loss=1.0)]
    arrays, _ = s.aggregate_train(1, replies)
    # clipped: (0.5, 0.5, 0.5, 0.5), (0.1, ...), (-0.1, ...); equal weights: 0.5 / 3; the x100
    # client is neither dropped by the norm check (off under DP) nor weighted by its samples
    np.testing.assert_allclose(arrays["w"].numpy(), 0.5 / 3, atol=1e-6)
    assert s.round_stats["clients_dropped"] == 0
    assert s.round_stats["server"]["dp_epsilon"] > 0 and s.dp_releases == [3]


@pytest.mark.parametrize("override, message", [
    ("privacy.noise_multiplier=-1", "privacy.noise_multiplier must be >= 0, got -1"),
    ("privacy.clipping_norm=0", "privacy.clipping_norm must be > 0, got 0"),
    ("privacy.delta=1", r"privacy.delta must be in \(0, 1\), got 1"),
    ("privacy.target_epsilon=-2", "privacy.target_epsilon must be >= 0"),
    ("privacy.target_epsilon=1e-9", "privacy.target_epsilon 1e-09 is unreachable in 5 rounds"),
])
def test_a_bad_privacy_setting_is_one_line(override, message):
    with pytest.raises(ConfigError, match=message):
        experiment_config([override])


def test_privacy_with_a_robust_rule_or_a_per_class_method_is_refused_by_name():
    with pytest.raises(ConfigError, match="privacy needs aggregation.rule=mean"):
        experiment_config(["privacy.noise_multiplier=1", "aggregation.rule=median"])
    with pytest.raises(ConfigError, match="strategy 'fedproto' shares per-class means"):
        check_method_settings(make_cfg("strategy=fedproto", "privacy.noise_multiplier=1"))


@pytest.mark.slow
def test_a_private_simulation_reports_epsilon_every_round_and_resumes_the_account(tmp_path):
    import json

    from pfedes.sim import simulate

    common = ["num_clients=3", "data.samples_per_client=120", "strategy.warmup_steps=0",
              "privacy.noise_multiplier=1.0", f"out_dir={tmp_path}"]
    simulate(make_cfg("num_rounds=1", *common))
    summary = simulate(make_cfg("num_rounds=2", "resume=true", *common))
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    eps = [r["server_metrics"]["dp_epsilon"] for r in rounds]
    assert eps[0] == pytest.approx(epsilon_after(1.0, [3], 3, 1e-5))
    assert eps[1] == pytest.approx(epsilon_after(1.0, [3, 3], 3, 1e-5)) and eps[1] > eps[0]
    assert summary["dp_epsilon"] == pytest.approx(eps[1])
