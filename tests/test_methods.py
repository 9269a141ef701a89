"""Methods are registered units (pfedes/methods/): each preset chooses one, and a bad value of
each kind of its settings (negative, out of range, unknown name, wrong type) is one line naming
the key when the configuration is composed, before Ray, the SuperLink or any client starts."""

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pfedes.config import ConfigError, conf_dir, experiment_config
from pfedes.methods import METHODS, get_method, method_of, settings_of

PRESETS = sorted(p.stem for p in (Path(conf_dir()) / "strategy").glob("*.yaml"))


def rejected(preset: str, *overrides: str) -> str:
    """The one-line error of composing `preset` with `overrides`."""
    with pytest.raises(ConfigError) as info:
        experiment_config([f"strategy={preset}", *overrides])
    message = str(info.value)
    assert "\n" not in message
    return message


# -- the registry ------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_chooses_a_registered_method_and_only_sets_its_settings(preset):
    raw = OmegaConf.load(Path(conf_dir()) / "strategy" / f"{preset}.yaml")
    assert not {"server", "trainer", "share"} & set(raw), "a preset chooses a method, it names no class"
    cfg = experiment_config([f"strategy={preset}", "data.val_fraction=0.15"])  # some presets read one
    method = method_of(cfg)
    assert METHODS[method.name] is method
    settings = settings_of(cfg)
    assert isinstance(settings, method.settings)
    for key, value in cfg["strategy"].items():
        if key not in ("name", "method"):
            assert getattr(settings, key) == value, key


def test_variants_of_one_method_share_its_parts():
    seed, ensemble, default = (method_of(experiment_config([f"strategy={p}"]))
                               for p in ("pfedes_seed", "pfedes_ensemble", "pfedes"))
    assert seed is ensemble is default is get_method("pfedes")


def test_an_unknown_method_or_setting_is_one_line():
    assert rejected("pfedes", "strategy.method=nosuch").startswith("strategy.method 'nosuch' is unknown")
    assert rejected("fedrep", "++strategy.lam=0.5").startswith("strategy.lam is not a setting of method 'fedrep'")


def test_settings_are_frozen_and_typed():
    settings = settings_of(experiment_config(["strategy=fedrep", "strategy.head_epochs=3.0"]))
    assert settings.head_epochs == 3 and isinstance(settings.head_epochs, int)
    with pytest.raises(AttributeError):
        settings.head_epochs = 4


def test_every_filter_a_method_shares_through_exists():
    import torch

    from pfedes.filters import FILTER_NAMES, _make_filters

    assert tuple(_make_filters(torch.nn.Linear(1, 1))) == FILTER_NAMES
    assert all(set(m.share) <= set(FILTER_NAMES) for m in METHODS.values())


# -- bad values, one per kind and method --------------------------------------------------------
# (preset, override, the start of the one-line error): for every method, a negative value, one
# out of range, an unknown choice or a value of the wrong type where it has such settings; the
# unknown setting name of every preset is tested below.
BAD = [
    # every method: its own learning rate (methods/base.py Settings.lr)
    ("local", "strategy.lr=-0.1", "strategy.lr must be > 0, got -0.1"),
    ("fedavg", "strategy.lr=0", "strategy.lr must be > 0, got 0"),
    ("fedbn", "strategy.lr=fast", "strategy.lr must be a finite number, got 'fast'"),
    ("fedper", "strategy.lr=-1", "strategy.lr must be > 0, got -1"),
    ("fedgh", "strategy.server_lr=0", "strategy.server_lr must be > 0, got 0"),
    ("apfl", "strategy.alpha_init=-0.1", "strategy.alpha_init must be in [0, 1], got -0.1"),
    ("apfl", "strategy.alpha_init=1.5", "strategy.alpha_init must be in [0, 1], got 1.5"),
    ("apfl", "strategy.alpha_lr=-1", "strategy.alpha_lr must be > 0, got -1"),
    ("cfl", "strategy.eps1=-1", "strategy.eps1 must be > 0, got -1"),
    ("cfl", "strategy.eps2=0", "strategy.eps2 must be > 0, got 0"),
    ("cfl", "strategy.min_split_size=1", "strategy.min_split_size must be >= 2, got 1"),
    ("cfl", "strategy.min_split_size=three", "strategy.min_split_size must be an integer, got 'three'"),
    ("ditto", "strategy.lam=-1", "strategy.lam must be >= 0, got -1"),
    ("ditto", "strategy.lam=abc", "strategy.lam must be a finite number, got 'abc'"),
    ("fd", "strategy.lam=-1", "strategy.lam must be >= 0, got -1"),
    ("fd", "strategy.lam=inf", "strategy.lam must be a finite number, got inf"),
    ("fedgh", "strategy.server_lr=-0.1", "strategy.server_lr must be > 0, got -0.1"),
    ("fedgh", "strategy.server_epochs=0", "strategy.server_epochs must be >= 1, got 0"),
    ("fedproto", "strategy.lam=-1", "strategy.lam must be >= 0, got -1"),
    ("fedproto", "strategy.lam=[1]", "strategy.lam must be a finite number, got [1]"),
    ("fedprox", "strategy.mu=-0.1", "strategy.mu must be >= 0, got -0.1"),
    ("fedprox", "strategy.mu=true", "strategy.mu must be a finite number, got True"),
    ("fedrep", "strategy.head_epochs=-1", "strategy.head_epochs must be >= 0, got -1"),
    ("fedrep", "strategy.head_epochs=2.5", "strategy.head_epochs must be an integer, got 2.5"),
    ("fedrep", "strategy.head_epochs=five", "strategy.head_epochs must be an integer, got 'five'"),
    ("fml", "strategy.alpha=-0.5", "strategy.alpha must be in [0, 1], got -0.5"),
    ("fml", "strategy.beta=1.5", "strategy.beta must be in [0, 1], got 1.5"),
    ("fml", "strategy.server_momentum=1", "strategy.server_momentum 1 is outside [0, 1)"),
    ("lgfedavg", "strategy.server_momentum=-0.5", "strategy.server_momentum -0.5 is outside [0, 1)"),
    ("lgfedavg", "strategy.server_momentum=1.0", "strategy.server_momentum 1 is outside [0, 1)"),
    ("lora", "strategy.rank=0", "strategy.rank must be >= 1, got 0"),
    ("lora", "strategy.alpha=-1", "strategy.alpha must be > 0, got -1"),
    ("lora", "strategy.conv=maybe", "strategy.conv must be true or false, got 'maybe'"),
    ("perfedavg", "strategy.inner_lr=-0.01", "strategy.inner_lr must be > 0, got -0.01"),
    ("perfedavg", "strategy.inner_lr=0", "strategy.inner_lr must be > 0, got 0"),
    ("pfedes", "strategy.lam=-1", "strategy.lam must be >= 0, got -1"),
    ("pfedes", "strategy.server_momentum=1.5", "strategy.server_momentum 1.5 is outside [0, 1)"),
    ("pfedes", "strategy.fusion=mixture", "strategy.fusion 'mixture' is unknown"),
    ("pfedes", "strategy.predict_with=global", "strategy.predict_with 'global' is unknown"),
    ("pfedes", "strategy.temperature=abc", "strategy.temperature must be a finite number, got 'abc'"),
    ("pfedes_seed", "strategy.proxy_lr_scale=0", "strategy.proxy_lr_scale must be > 0, got 0"),
    ("pfedes_seed", "strategy.variance_weight=-1", "strategy.variance_weight must be >= 0, got -1"),
    ("pfedes_seed", "strategy.fusion=sum", "strategy.fusion 'sum' is unknown"),
    ("pfedes_unshared", "strategy.proxy_width=0", "strategy.proxy_width must be >= 1, got 0"),
    ("pfedes_unshared", "strategy.proxy_norm=layer", "strategy.proxy_norm 'layer' is unknown"),
    ("pfedes_unshared", "strategy.distill_weight=-1", "strategy.distill_weight must be >= 0, got -1"),
    ("pfedes_ensemble", "strategy.warmup_steps=-1", "strategy.warmup_steps must be >= 0, got -1"),
    ("pfedes_ensemble", "strategy.server_momentum=-0.1", "strategy.server_momentum -0.1 is outside [0, 1)"),
    ("pfedes_ensemble", "strategy.align=l1", "strategy.align 'l1' is unknown"),
    ("pfedes_paper", "strategy.mu=0", "strategy.mu must be in (0, 1], got 0"),
    ("pfedes_paper", "strategy.mu=1.5", "strategy.mu must be in (0, 1], got 1.5"),
    ("pfedes_paper", "strategy.generator_epochs=0", "strategy.generator_epochs must be >= 1, got 0"),
    ("pfedes_paper", "strategy.grad_clip=-1", "strategy.grad_clip must be > 0, got -1"),
    ("pfedes_paper", "strategy.server_momentum=2", "strategy.server_momentum 2 is outside [0, 1)"),
    ("pfedme", "strategy.lam=-0.1", "strategy.lam must be > 0, got -0.1"),
    ("pfedme", "strategy.inner_steps=0", "strategy.inner_steps must be >= 1, got 0"),
    ("pfedme", "strategy.personal_lr=-1", "strategy.personal_lr must be > 0, got -1"),
    ("pfedme", "strategy.beta=2.5", "strategy.beta 2.5 is outside (0, 2]"),
]


def test_every_method_has_its_bad_values_here():
    with_settings = {m.name for m in METHODS.values() if fields(m.settings)}
    tested = {method_of(experiment_config([f"strategy={preset}"])).name for preset, _, _ in BAD}
    assert with_settings <= tested


@pytest.mark.parametrize("preset", PRESETS)
def test_an_unknown_setting_name_is_one_line(preset):
    method = method_of(experiment_config([f"strategy={preset}", "data.val_fraction=0.15"])).name
    assert rejected(preset, "++strategy.no_such_setting=1").startswith(
        f"strategy.no_such_setting is not a setting of method '{method}'")


@pytest.mark.parametrize("preset, override, message", BAD)
def test_a_bad_value_is_one_line_naming_the_key(preset, override, message):
    assert rejected(preset, override).startswith(message)


def test_a_bad_method_setting_stops_pfedes_sim_before_anything_starts(tmp_path):
    result = subprocess.run([sys.executable, "-c", "from pfedes.sim import main; main()", "strategy=pfedes",
                             "strategy.lam=-1", f"out_dir={tmp_path}/out"],
                            capture_output=True, text=True, timeout=600)  # a guard against a hang only
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["pfedes-sim: strategy.lam must be >= 0, got -1"]
    assert result.stdout.strip() == ""  # no simulation started: Flower and Ray log there
    assert not (tmp_path / "out" / "client_state").exists()


# -- configs saved before the registry ------------------------------------------------------------
LEGACY = {"fedrep": ("pfedes.strategies.fedavg.FedAvg", "pfedes.trainers.fedrep.FedRepTrainer", ["base-only"]),
          "pfedes_unshared": ("pfedes.strategies.local.LocalOnly", "pfedes.trainers.pfedes.PFedESTrainer", [])}


def saved_before_the_registry(preset: str, **strategy) -> dict:
    """cfg as summary.json stored it when presets named their classes and filter."""
    cfg = experiment_config([f"strategy={preset}"])
    server, trainer, share = LEGACY[preset]
    old = {k: v for k, v in cfg["strategy"].items() if k != "method"}
    return {**cfg, "strategy": {**old, "server": server, "trainer": trainer, "share": share, **strategy}}


@pytest.mark.parametrize("preset", sorted(LEGACY))
def test_a_config_saved_before_the_registry_is_the_method_it_names(preset, tmp_path):
    import json

    from pfedes.bench.runs import finished_rounds
    from pfedes.config import with_later_settings, with_registered_method

    cfg = experiment_config([f"strategy={preset}", "num_rounds=1", f"out_dir={tmp_path}"])
    saved = saved_before_the_registry(preset)
    assert with_registered_method(saved)["strategy"] == experiment_config([f"strategy={preset}"])["strategy"]
    (tmp_path / "summary.json").write_text(json.dumps({"config": {**saved, "num_rounds": 1,
                                                                  "out_dir": str(tmp_path)}}))
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n')
    assert finished_rounds(tmp_path, cfg) == [{"round": 1}]  # the bench reuses it
    other = saved_before_the_registry(preset, share=["all"])  # another filter: another run
    assert with_registered_method(other) is other
    assert with_later_settings(other, cfg)["strategy"] != cfg["strategy"]


# -- no side effects at import time or in a constructor ----------------------------------------
def test_importing_the_package_leaves_the_environment_alone():
    import os

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    code = ("import os, pfedes.data, pfedes.client_app, pfedes.server_app; "
            "print(os.environ.get('HF_HUB_OFFLINE'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert result.stdout.strip() == "None", result.stderr


def test_a_trainer_leaves_torchs_global_generator_as_it_found_it():
    import torch

    cfg = experiment_config(["strategy=pfedes"])
    method = method_of(cfg)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = method.trainer(cfg, "cnn3", 10, seed=7)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.randn(100)  # the global generator elsewhere does not change what a seed builds
    b = method.trainer(cfg, "cnn3", 10, seed=7)
    state_a, state_b = a.exchange.state_dict(), b.exchange.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
