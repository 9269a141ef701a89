"""Methods are registered units (pfedes/methods/): each preset chooses one, and a bad value of
each kind of its settings (negative, out of range, unknown name, wrong type) is one line naming
the key when the configuration is composed, before Ray, the SuperLink or any client starts."""

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pfedes.config import ConfigError, conf_dir, experiment_config
from pfedes.methods import METHODS, get_method, method_of, settings_of

MOVED = ("fedrep", "pfedes", "pfedes_ensemble", "pfedes_seed", "pfedes_unshared")  # the rest follow
PRESETS = sorted(p.stem for p in (Path(conf_dir()) / "strategy").glob("*.yaml") if p.stem in MOVED)


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
    cfg = experiment_config([f"strategy={preset}"])
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
# (preset, override, the start of the one-line error)
BAD = [
    ("pfedes", "strategy.lam=-1", "strategy.lam must be >= 0, got -1"),
    ("pfedes", "strategy.server_momentum=1.5", "strategy.server_momentum 1.5 is outside [0, 1)"),
    ("pfedes", "strategy.fusion=mixture", "strategy.fusion 'mixture' is unknown"),
    ("pfedes", "strategy.temperature=abc", "strategy.temperature must be a finite number, got 'abc'"),
    ("pfedes_seed", "strategy.proxy_lr_scale=0", "strategy.proxy_lr_scale must be > 0, got 0"),
    ("pfedes_unshared", "strategy.proxy_width=0", "strategy.proxy_width must be >= 1, got 0"),
    ("pfedes_unshared", "strategy.proxy_norm=layer", "strategy.proxy_norm 'layer' is unknown"),
    ("pfedes_ensemble", "strategy.warmup_steps=-1", "strategy.warmup_steps must be >= 0, got -1"),
    ("pfedes_ensemble", "strategy.server_momentum=-0.1", "strategy.server_momentum -0.1 is outside [0, 1)"),
    ("pfedes_ensemble", "strategy.align=l1", "strategy.align 'l1' is unknown"),
    ("fedrep", "strategy.head_epochs=-1", "strategy.head_epochs must be >= 0, got -1"),
    ("fedrep", "strategy.head_epochs=2.5", "strategy.head_epochs must be an integer, got 2.5"),
    ("fedrep", "strategy.head_epochs=five", "strategy.head_epochs must be an integer, got 'five'"),
]


@pytest.mark.parametrize("preset, override, message", BAD)
def test_a_bad_value_is_one_line_naming_the_key(preset, override, message):
    assert rejected(preset, override).startswith(message)


def test_a_bad_method_setting_stops_pfedes_sim_before_anything_starts(tmp_path):
    result = subprocess.run([sys.executable, "-c", "from pfedes.sim import main; main()", "strategy=pfedes",
                             "strategy.lam=-1", f"out_dir={tmp_path}/out"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["pfedes-sim: strategy.lam must be >= 0, got -1"]
    assert result.stdout.strip() == ""  # no simulation started: Flower and Ray log there
    assert not (tmp_path / "out" / "client_state").exists()
