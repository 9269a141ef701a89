"""conf/ is the one source of configuration; Flower's run config mirrors its keys."""

import tomllib
from pathlib import Path

import pytest

from conftest import make_cfg
from pfedes.config import ConfigError, default_run_config, experiment_config, overrides_from_run_config

ROOT = Path(__file__).resolve().parents[1]


def pyproject_run_config():
    from flwr.common.config import flatten_dict

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return flatten_dict(data["tool"]["flwr"]["app"]["config"])


def test_pyproject_run_config_equals_the_default_preset():
    assert pyproject_run_config() == default_run_config()


def test_flower_run_config_overrides_mean_the_same_as_hydra_overrides():
    run_config = dict(pyproject_run_config(), **{"num_rounds": 3, "strategy.lam": 0.7,
                                                 "clients.devices": "phone,gpu-host"})
    via_flower = experiment_config(overrides_from_run_config(run_config))
    via_hydra = experiment_config(["num_rounds=3", "strategy.lam=0.7", "clients.devices=[phone,gpu-host]"])
    assert via_flower == via_hydra
    assert via_flower["strategy"]["lam"] == 0.7 and via_flower["clients"]["devices"] == ["phone", "gpu-host"]


@pytest.mark.parametrize("strategy, key, value", [
    ("fedprox", "mu", 0.1),        # a key only one preset has
    ("fedproto", "lam", 0.0),      # a key whose value is another preset's default (pfedes: 0)
    ("pfedes", "proxy_epochs", 2),
])
def test_every_presets_settings_can_be_set_by_run_config(strategy, key, value):
    run_config = dict(pyproject_run_config(), **{"strategy.name": strategy, f"strategy.{key}": value})
    via_flower = experiment_config(overrides_from_run_config(run_config))
    assert via_flower == experiment_config([f"strategy={strategy}", f"strategy.{key}={value}"])
    assert via_flower["strategy"][key] == value


def test_a_preset_key_left_unset_keeps_the_presets_own_value():
    cfg = experiment_config(overrides_from_run_config(dict(pyproject_run_config(), **{"strategy.name": "fedproto"})))
    assert cfg == experiment_config(["strategy=fedproto"])


def test_flowers_own_parser_reads_a_preset_and_its_settings_in_one_string():
    from flwr.common.config import parse_config_args

    run_config = dict(pyproject_run_config(), **parse_config_args(["strategy.name='fedprox' strategy.mu=0.1"]))
    assert experiment_config(overrides_from_run_config(run_config)) == experiment_config(
        ["strategy=fedprox", "strategy.mu=0.1"])


def test_selecting_another_strategy_by_run_config():
    cfg = experiment_config(overrides_from_run_config(dict(pyproject_run_config(), **{"strategy.name": "local"})))
    from pfedes.methods import method_of

    assert cfg["strategy"]["name"] == "local" and method_of(cfg).share == ()


def test_bad_overrides_give_a_one_line_error_naming_the_key():
    with pytest.raises(ConfigError, match="strategy.lam"):
        experiment_config(["strategy=local", "strategy.lam=0.3"])
    with pytest.raises(ConfigError, match="num_rounds"):
        experiment_config(["num_rounds=0"])


def test_a_device_profile_may_train_with_its_own_settings(small_data):
    import torch

    from pfedes.client_round import build_trainer
    from pfedes.config import for_device

    cfg = experiment_config(["strategy=local", "train.by_device.gpu-host.local_epochs=3",
                             "train.by_device.phone.lr=0.05", "train.batch_size=16"])
    assert for_device(cfg, "phone")["train"]["lr"] == 0.05 and for_device(cfg, "gateway") is cfg
    steps = {}
    for device in ("gateway", "gpu-host"):
        trainer = build_trainer(for_device(cfg, device), "cnn3", 10, 0)
        trainer.fit(small_data, torch.Generator().manual_seed(0))
        steps[device] = trainer.steps
    assert steps["gpu-host"] == 3 * steps["gateway"]
    assert build_trainer(for_device(cfg, "phone"), "cnn3", 10, 0).optimizer.param_groups[0]["lr"] == 0.05


def test_a_method_may_train_with_its_own_learning_rate_and_a_device_lr_wins():
    from pfedes.client_round import build_trainer
    from pfedes.config import for_device, learning_rate
    from pfedes.strategies.fedgh import FedGH

    cfg = experiment_config(["strategy=fedgh", "strategy.lr=0.005", "train.by_device.phone.lr=0.05"])
    assert learning_rate(cfg) == 0.005
    assert for_device(cfg, "gateway")["train"]["lr"] == 0.005 and for_device(cfg, "phone")["train"]["lr"] == 0.05
    assert build_trainer(for_device(cfg, "gateway"), "cnn3", 10, 0).optimizer.param_groups[0]["lr"] == 0.005
    assert FedGH(cfg).server_lr == 0.005  # server_lr null: the method's lr
    assert FedGH(experiment_config(["strategy=fedgh", "strategy.lr=null", "train.lr=0.02"])).server_lr == 0.02
    plain = experiment_config(["strategy=local", "strategy.lr=null"])
    assert for_device(plain, "gateway") is plain and learning_rate(plain) == plain["train"]["lr"]


def test_a_run_from_before_methods_had_their_own_lr_ran_at_train_lr():
    """with_later_settings fills a missing strategy.lr with null whatever the preset now says,
    so the bench never takes an old run for one at the method's own learning rate."""
    from pfedes.config import with_later_settings

    wanted = experiment_config(["strategy=fedgh", "strategy.lr=0.005"])
    saved = {**wanted, "strategy": {k: v for k, v in wanted["strategy"].items() if k != "lr"}}
    assert with_later_settings(saved, wanted)["strategy"]["lr"] is None


def test_the_bench_says_which_settings_each_profile_used():
    from pfedes.bench.tables import training_note

    note = training_note(experiment_config(["train.by_device.phone.local_epochs=2"]))
    assert note.endswith("1 local epoch(s) per round, device cpu; gpu-host: device auto; phone: local_epochs 2")


@pytest.mark.parametrize("override, message", [
    ("train.by_device.phone.lr=-1", "train.by_device.phone.lr must be > 0.0, got -1"),
    ("train.by_device.gpu-host.local_epochs=0", "train.by_device.gpu-host.local_epochs must be >= 1, got 0"),
    ("train.by_device.phone.batch_size=2.5", "train.by_device.phone.batch_size must be a number (an integer)"),
    ("+train.by_device.toaster.lr=0.1", "train.by_device.toaster: 'toaster' is not a device profile"),
    ("+train.by_device.phone.momentum=0.5", "train.by_device.phone.momentum is unknown"),
])
def test_a_bad_device_setting_is_one_line_naming_it(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        experiment_config([override])


def test_a_saved_config_gets_the_settings_added_since_at_their_defaults_in_every_section():
    import copy

    from pfedes.config import with_later_settings

    wanted = experiment_config(["strategy=pfedes", "num_rounds=7"])
    saved = copy.deepcopy(wanted)
    del saved["aggregation"]["quality_blend"]  # a setting added inside a section after the run
    del saved["strategy"]["proxy_epochs"]
    del saved["logging"]
    saved["num_rounds"] = 3  # what the run itself chose is kept
    filled = with_later_settings(saved, wanted)
    assert filled["aggregation"]["quality_blend"] == wanted["aggregation"]["quality_blend"]
    assert filled["strategy"]["proxy_epochs"] == wanted["strategy"]["proxy_epochs"] and filled["logging"] == wanted["logging"]
    assert filled["num_rounds"] == 3
    assert with_later_settings(wanted, wanted) is wanted
    only_nested = copy.deepcopy(wanted)  # every section there, one key inside one missing
    del only_nested["aggregation"]["quality_blend"]
    assert with_later_settings(only_nested, wanted) == wanted


@pytest.mark.parametrize("overrides", [
    ["strategy=pfedes", "aggregation.weighting=quality", "compression.quantize=int8"],
    ["strategy=fd", "evaluate_in_train=true"],
    ["strategy=fedavg", "clients.devices=[phone]", "compression.topk=0.5"],
])
def test_a_client_round_needs_only_the_client_settings(tmp_path, overrides):
    """What the server sends (client_settings) is all a ClientApp reads: a train round runs on
    it alone, and no server-only setting (aggregation rule, privacy, logging, paths) travels."""
    import json

    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

    from pfedes import client_app
    from pfedes.config import client_settings
    from pfedes.methods import method_of
    from flwr.supercore.task_identity import TaskIdentity

    from pfedes.models import resolve_architecture

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    cfg = {**make_cfg("num_clients=3", *overrides), "client_state_dir": str(tmp_path), "run_token": "t"}
    sent = client_settings(cfg)
    assert not {"out_dir", "privacy", "logging", "selection", "num_rounds", "probe_every"} & set(sent)
    assert sent.get("aggregation", {}) == {"weighting": cfg["aggregation"]["weighting"]}
    arch = resolve_architecture(cfg["clients"]["devices"][0], cfg["model"]["profiles"])
    initial = method_of(cfg).trainer.initial_shared(cfg, arch, 10)
    content = RecordDict({"arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in initial.items()}),
                          "config": ConfigRecord({"experiment": json.dumps(sent), "server-round": 1})})
    msg = Message(content=content, dst_node_id=1, message_type="train")
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 3},
                      state=RecordDict(), run_config={})
    reply = client_app.train(msg, context)
    assert not reply.has_error(), reply.error
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] > 0
    # each setting a client acts on reached it: the reply is what the server's settings ask for
    sent_bytes = sum(a.numpy().nbytes for a in reply.content["arrays"].values())
    fp32_bytes = sum(np.asarray(v).nbytes for v in initial.values())
    assert (sent_bytes < fp32_bytes / 2) == (cfg["compression"]["quantize"] != "none")
    assert ("fqi" in metrics) == (cfg["aggregation"]["weighting"] == "quality")
    assert (client_app.EVAL_IN_TRAIN_KEY in reply.content) == cfg["evaluate_in_train"]


def test_privacy_settings_travel_only_for_local_dp_with_the_noise_resolved():
    pytest.importorskip("dp_accounting", reason="the accountant: pip install -e '.[privacy]'")
    from pfedes.config import client_settings
    from pfedes.privacy import Privacy

    central = make_cfg("privacy.noise_multiplier=1.0", "num_clients=4")
    assert "privacy" not in client_settings(central)
    local = make_cfg("privacy.mode=local", "privacy.target_epsilon=8", "num_clients=4", "num_rounds=10")
    sent = client_settings(local)["privacy"]
    assert sent["mode"] == "local" and sent["target_epsilon"] == 0.0
    assert sent["noise_multiplier"] == Privacy.from_cfg(local).noise_multiplier > 0
    assert Privacy.from_cfg({"privacy": sent}) == Privacy.from_cfg(local).__class__(**sent)  # a client reads the same
