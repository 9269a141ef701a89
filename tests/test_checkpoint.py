"""A checkpoint resumes only the configuration that wrote it, settings added to conf/ since at their
defaults included (a run from before a setting existed ran as its default does)."""

import json

import pytest
import torch

from conftest import make_cfg
from pfedes.config import ConfigError
from pfedes.server_app import config_fingerprint, load_checkpoint, prepare


def old_run(tmp_path):
    """A checkpoint and summary.json written before `compression` existed (no config inside)."""
    cfg = prepare(make_cfg("num_rounds=2", f"out_dir={tmp_path}"))
    old = {k: v for k, v in cfg.items() if k != "compression"}
    torch.save({"round": 2, "fingerprint": config_fingerprint(old), "run_token": "t"}, tmp_path / "ckpt.pt")
    (tmp_path / "summary.json").write_text(json.dumps({"config": dict(old, out_dir="shown/relative")}))
    return cfg


def test_an_older_checkpoint_resumes_with_a_later_setting_at_its_default(tmp_path):
    cfg = old_run(tmp_path)
    assert load_checkpoint(tmp_path / "ckpt.pt", dict(cfg, num_rounds=4))["round"] == 2


def test_a_later_setting_off_its_default_or_a_changed_one_is_refused(tmp_path):
    cfg = old_run(tmp_path)
    with pytest.raises(ConfigError, match="another configuration"):
        load_checkpoint(tmp_path / "ckpt.pt", dict(cfg, compression=dict(cfg["compression"], quantize="fp16")))
    with pytest.raises(ConfigError, match="another configuration"):
        load_checkpoint(tmp_path / "ckpt.pt", dict(cfg, seed=1))


def test_a_new_checkpoint_carries_its_configuration(tmp_path):
    from flwr.app import ArrayRecord

    from pfedes.server_app import save_checkpoint

    class NoState:
        def state_dict(self):
            return {}

        def common_state_dict(self):
            return {"dp_releases": [3]}

    cfg = dict(prepare(make_cfg(f"out_dir={tmp_path}")), run_token="t")
    save_checkpoint(tmp_path / "ckpt.pt", 1, ArrayRecord(), NoState(), [], cfg)
    checkpoint = load_checkpoint(tmp_path / "ckpt.pt", cfg)
    assert checkpoint["config"] == cfg and checkpoint["common"] == {"dp_releases": [3]}  # and the privacy spent
