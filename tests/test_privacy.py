"""Central DP on what is shared (pfedes/privacy.py): clipping bounds each update, the noise has the
configured scale, the accountant matches the Gaussian mechanism's known RDP bound, and bad
settings are one line before anything starts."""

import json

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
    scalar = privacy.clip({"w": np.full(4, 10.0, np.float32), "s": np.array(10.0, np.float32)},
                          {"w": REF["w"], "s": np.array(0.0, np.float32)})  # a 0-d entry is clipped too
    assert np.sqrt((scalar["w"] ** 2).sum() + scalar["s"] ** 2) == pytest.approx(2.0, rel=1e-6)
    assert scalar["s"].shape == () and scalar["s"] == pytest.approx(2.0 / np.sqrt(5), rel=1e-6)


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


# -- local DP (privacy.mode=local): Flower's LocalDpMod on each client's reply --------------------------

def train_message(cfg, arrays):
    """A train instruction as a ClientApp receives it: the shared arrays and the run's experiment."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from pfedes.config import client_settings

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                          "config": ConfigRecord({"experiment": json.dumps(client_settings(cfg)), "server-round": 1})})
    return Message(content=content, dst_node_id=1, message_type="train")


def run_mod(cfg, received, sent):
    """local_dp_mod around a handler that replies `sent` (and metrics): the reply's arrays."""
    from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

    from pfedes.privacy import local_dp_mod

    seen = {}

    def handler(msg, context):
        seen.update({k: a.numpy() for k, a in msg.content["arrays"].items()})
        return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in sent.items()}),
                                   "metrics": MetricRecord({"num-examples": 10})}), reply_to=msg)

    msg = train_message(cfg, received)
    reply = local_dp_mod(msg, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}), handler)
    assert set(seen) == set(received)  # the handler got every entry the server sent, counters included
    assert set(msg.content["arrays"]) == set(received)  # and the message is left as it came
    return reply


LOCAL = ["privacy.mode=local", "privacy.clipping_norm=2.0"]
BIG = {"w": np.zeros(100_000, np.float32), "n": np.array(3, np.int64)}


def test_local_dp_clips_the_update_to_C_and_leaves_counters():
    cfg = make_cfg(*LOCAL, "privacy.noise_multiplier=1e-9")
    received = {"a": np.zeros((2, 2), np.float32), "n": np.array(3, np.int64), "b": np.ones(4, np.float32),
                "s": np.array(0.0, np.float32)}  # a 0-d entry: Flower's in-place scaling alone would skip it
    sent = {"a": np.full((2, 2), 10.0, np.float32), "n": np.array(7, np.int64), "b": np.ones(4, np.float32),
            "s": np.array(10.0, np.float32)}
    reply = run_mod(cfg, received, sent)
    arrays = {k: a.numpy() for k, a in reply.content["arrays"].items()}
    assert list(arrays) == ["a", "n", "b", "s"] and arrays["n"] == 7 and arrays["a"].dtype == np.float32
    assert arrays["a"].shape == (2, 2) and arrays["s"].shape == ()
    update = np.concatenate([(arrays[k] - received[k]).ravel() for k in ("a", "b", "s")])
    assert np.linalg.norm(update) == pytest.approx(2.0, rel=1e-5)  # clipped to C, direction kept
    np.testing.assert_allclose(arrays["a"], 2.0 / np.sqrt(5), rtol=1e-5)
    assert reply.content["metrics"]["num-examples"] == 10


def test_local_dp_noise_is_sigma_times_2C_on_a_trained_and_on_an_unchanged_reply():
    cfg = make_cfg(*LOCAL, "privacy.noise_multiplier=0.5")
    trained = {"w": np.full(100_000, 0.001, np.float32), "n": np.array(5, np.int64)}  # norm 0.32 < C: not clipped
    for sent in (trained, BIG):  # BIG: the update is zero (the proxy during warm-up)
        arrays = {k: a.numpy() for k, a in run_mod(cfg, BIG, sent).content["arrays"].items()}
        noise = arrays["w"] - sent["w"]
        assert noise.std() == pytest.approx(0.5 * 2 * 2.0, rel=0.02)  # sigma * 2C
        assert abs(noise.mean()) < 0.05 and arrays["n"] == sent["n"]


def test_local_dp_is_off_in_central_mode_and_refuses_a_reply_with_other_keys():
    central = make_cfg("privacy.noise_multiplier=1.0")
    sent = {"w": np.full(100_000, 10.0, np.float32), "n": np.array(3, np.int64)}
    arrays = run_mod(central, BIG, sent).content["arrays"]
    np.testing.assert_array_equal(arrays["w"].numpy(), sent["w"])  # the server clips and noises instead
    reply = run_mod(make_cfg(*LOCAL, "privacy.noise_multiplier=1.0"), BIG, {"other": np.ones(3, np.float32)})
    assert reply.has_error() and "LocalDpMod expects the keys" in reply.error.reason


def test_per_model_clipping_scales_C_with_the_root_of_the_shared_size():
    privacy = Privacy(noise_multiplier=1.0, clipping_norm=2.0, clipping="per_model", reference_params=100)
    small, large = {"w": np.zeros(25, np.float32)}, {"w": np.zeros(400, np.float32), "n": np.array(1)}
    assert privacy.clip_norm_for(small) == pytest.approx(1.0)  # 2 * sqrt(25 / 100)
    assert privacy.clip_norm_for(large) == pytest.approx(4.0)  # 2 * sqrt(400 / 100); counters do not count
    for ref in (small, large):
        clipped = privacy.clip({"w": np.full(ref["w"].shape, 5.0, np.float32)}, ref)
        assert np.linalg.norm(clipped["w"]) == pytest.approx(privacy.clip_norm_for(ref), rel=1e-6)
    assert Privacy(clipping_norm=2.0).clip_norm_for(large) == 2.0  # fixed


def test_per_model_central_noise_is_sigma_times_the_largest_C_over_m():
    s = PFedES(make_cfg("num_clients=4", "privacy.noise_multiplier=0.5", "privacy.clipping_norm=1.0",
                        "privacy.clipping=per_model", "privacy.reference_params=50000"))
    s.current = {"w": np.zeros(200_000, np.float32)}
    replies = [train_reply(i, {"w": np.full(200_000, 0.0, np.float32)}, 10, train_loss=1.0) for i in (1, 2)]
    arrays, _ = s.aggregate_train(1, replies)
    assert arrays["w"].numpy().std() == pytest.approx(0.5 * 1.0 * 2.0 / 2, rel=0.02)  # C_i = 1 * sqrt(4) = 2, m = 2


def test_local_mode_server_aggregates_as_without_privacy_and_accounts_every_round():
    s = strategy("privacy.mode=local", "privacy.noise_multiplier=1.0")
    replies = [train_reply(1, {"w": np.full(4, 10.0, np.float32), "n": np.array(3)}, 3, train_loss=1.0),
               train_reply(2, {"w": np.full(4, 1.0, np.float32), "n": np.array(3)}, 1, train_loss=1.0)]
    arrays, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["w"].numpy(), (3 * 10.0 + 1.0) / 4, rtol=1e-6)  # no server clip or noise
    assert s.round_stats["server"]["dp_epsilon"] == pytest.approx(epsilon_after(1.0, [2], 4, 1e-5))
    s.pop_round_stats()
    bad = [train_reply(1, {"w": np.full(4, np.nan, np.float32), "n": np.array(3)}, 3, train_loss=1.0)]
    assert s.aggregate_train(2, bad) == (None, None)  # nothing usable, but the client did release
    assert s.round_stats["server"]["dp_epsilon"] == pytest.approx(epsilon_after(1.0, [2, 1], 4, 1e-5))


@pytest.mark.parametrize("overrides, message", [
    (["privacy.mode=secure"], r"privacy.mode 'secure' is unknown: expected one of \['central', 'local'\]"),
    (["privacy.clipping=adaptive"], r"privacy.clipping 'adaptive' is unknown"),
    (["privacy.reference_params=0"], "privacy.reference_params must be an integer >= 1, got 0"),
    (["privacy.mode=local", "privacy.noise_multiplier=1", "compression.quantize=int8"],
     "privacy.mode=local needs compression off"),
    (["privacy.mode=local", "privacy.target_epsilon=1e-9"], "privacy.target_epsilon 1e-09 is unreachable"),
])
def test_a_bad_local_or_per_model_setting_is_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        experiment_config(overrides)


def test_local_dp_allows_the_robust_rules_central_dp_refuses():
    assert Privacy.from_cfg(experiment_config(["privacy.mode=local", "privacy.noise_multiplier=1",
                                               "aggregation.rule=median"])).local
    with pytest.raises(ConfigError, match="strategy 'fedproto' shares per-class means"):
        check_method_settings(make_cfg("strategy=fedproto", "privacy.mode=local", "privacy.noise_multiplier=1"))


@pytest.mark.slow
def test_a_local_dp_simulation_noises_the_replies_and_reports_epsilon_every_round(tmp_path):
    """Two rounds, three clients, the embedded data: Flower's LocalDpMod runs in the real ClientApp
    (pFedES's proxy is still in warm-up: every update is zero, and still gets its noise)."""
    import json

    import torch

    from pfedes.methods import method_of
    from pfedes.models import resolve_architecture
    from pfedes.sim import simulate

    cfg = make_cfg("num_clients=3", "num_rounds=2", "privacy.mode=local", "privacy.noise_multiplier=1.0",
                   f"out_dir={tmp_path}")
    summary = simulate(cfg)
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    eps = [r["server_metrics"]["dp_epsilon"] for r in rounds]
    assert eps == pytest.approx([epsilon_after(1.0, [3] * r, 3, 1e-5) for r in (1, 2)])
    assert summary["dp_epsilon"] == pytest.approx(eps[1]) and all(r["clients_dropped"] == 0 for r in rounds)
    initial = method_of(cfg).trainer.initial_shared(cfg, resolve_architecture("phone", cfg["model"]["profiles"]), 10)
    final = torch.load(tmp_path / "server_checkpoint.pt", weights_only=False)["arrays"]
    change = np.concatenate([(final[k] - initial[k].numpy()).ravel() for k in initial])
    # each client's noise has std sigma * 2C = 2; two rounds of a weighted mean of three: > 1 per entry
    assert change.std() > 1.0


def test_the_client_apps_train_handler_runs_local_dp_on_its_reply(tmp_path, monkeypatch):
    """The real ClientApp (without Ray), its training replaced by an update of norm 10 per entry:
    with privacy.mode=local the reply leaves clipped to C; in central mode as trained."""
    from flwr.app import Context, RecordDict

    from pfedes import client_app
    from pfedes.methods import method_of
    from pfedes.models import resolve_architecture
    from pfedes.server_app import prepare

    def trained(trainer, arrays, *args):
        return {k: v + 10.0 if v.is_floating_point() else v for k, v in arrays.items()}, {"num-examples": 5}

    monkeypatch.setattr(client_app, "train_round", trained)
    for mode, expected in (("local", 2.0), ("central", None)):
        cfg = prepare(make_cfg("num_clients=3", f"privacy.mode={mode}", "privacy.noise_multiplier=1e-9",
                               "privacy.clipping_norm=2.0", f"out_dir={tmp_path / mode}"))
        cfg["run_token"] = mode
        initial = method_of(cfg).trainer.initial_shared(cfg, resolve_architecture("phone", cfg["model"]["profiles"]), 10)
        msg = train_message(cfg, {k: v.numpy() for k, v in initial.items()})
        context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 3},
                          state=RecordDict(), run_config={})
        reply = client_app.app(msg, context)
        assert not reply.has_error()
        arrays = reply.content["arrays"]
        assert list(arrays) == list(initial)
        norm = float(np.sqrt(sum(((arrays[k].numpy() - v.numpy()) ** 2).sum() for k, v in initial.items())))
        if expected is None:
            assert norm == pytest.approx(10.0 * np.sqrt(sum(v.numel() for v in initial.values())), rel=1e-5)
        else:
            assert norm == pytest.approx(expected, rel=1e-4)


@pytest.mark.slow
def test_a_deployed_local_dp_run_noises_on_the_devices_and_reports_epsilon(tmp_path):
    """`pfedes-trial`: a SuperLink, two SuperNodes and `flwr run`, privacy.mode=local. The settings
    travel in the messages to each device, whose ClientApp runs Flower's LocalDpMod on its reply
    (its own log lines, in the SuperNode's log); the server accounts one release per reply."""
    import torch

    from pfedes.methods import method_of
    from pfedes.models import resolve_architecture
    from pfedes.trial import main

    root = tmp_path / "trial"
    settings = ("num_rounds=1 data.samples_per_client=60 strategy.warmup_steps=0 train.torch_threads=1 "
                "privacy.mode='local' privacy.noise_multiplier=0.5 privacy.clipping_norm=2.0")
    assert main(["--nodes", "2", "--dir", str(root), "--timeout", "1500", "-c", settings]) == 0
    results = root / "results"
    rounds = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
    assert len(rounds) == 1 and rounds[0]["clients_trained"] == 2 and rounds[0]["clients_dropped"] == 0
    eps = rounds[0]["server_metrics"]["dp_epsilon"]
    assert eps == pytest.approx(epsilon_after(0.5, [2], 2, 1e-5))
    summary = json.loads((results / "summary.json").read_text())
    assert summary["dp_epsilon"] == pytest.approx(eps) and summary["config"]["privacy"]["mode"] == "local"
    for device in ("phone-0", "gateway-1"):  # Flower's mod ran on each device: clipped to C, std sigma * 2C
        log = (root / "logs" / f"{device}.0.log").read_text()
        assert "LocalDpMod: parameters are clipped by value: 2.0000" in log, device
        assert "LocalDpMod: local DP noise with 2.0000 stddev added to parameters" in log, device
    cfg = summary["config"]
    initial = method_of(cfg).trainer.initial_shared(cfg, resolve_architecture("phone", cfg["model"]["profiles"]), 10)
    final = torch.load(results / "server_checkpoint.pt", weights_only=False)["arrays"]
    change = np.concatenate([(final[k] - initial[k].numpy()).ravel() for k in initial])
    assert change.std() > 0.7  # the mean of two replies, each noised with std 2 per entry
