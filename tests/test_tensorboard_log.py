"""logging.tensorboard=true writes every number of each round's record as a TensorBoard scalar."""

import json

import pytest

from conftest import make_cfg
from pfedes.config import ConfigError, experiment_config
from pfedes.recording import RunRecorder
from pfedes.tensorboard_log import scalars


def test_scalars_are_the_finite_numbers_of_a_record_by_key_path():
    record = {"round": 3, "acc_mean": 0.5, "acc_worst": None, "acc_by_device": {"phone": 0.4},
              "acc_by_client": {"0": 0.4}, "train_metrics": {"align_loss": 0.1, "nan": float("nan")},
              "bytes_up": 1024, "proxy_collapsed": True}
    assert scalars(record) == {"acc_mean": 0.5, "acc_by_device/phone": 0.4,
                               "train_metrics/align_loss": 0.1, "bytes_up": 1024.0}


def read_events(directory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def stats(acc):
    return {"eval": [{"accuracy": acc, "device": "phone", "partition": 0}], "train": {"train_loss": 1.0},
            "clients_trained": 1}


def test_a_run_writes_its_rounds_to_tensorboard_and_a_resumed_run_continues_them(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = make_cfg("logging.tensorboard=true", "num_rounds=3")
    recorder = RunRecorder(tmp_path, cfg)
    recorder.record(1, stats(0.5), {"proxy_std": 0.2})
    recorder.record(2, stats(0.6))
    recorder.finish({})
    curves = read_events(tmp_path / "tensorboard")
    assert curves["acc_mean"] == [(1, 0.5), (2, pytest.approx(0.6))]
    assert curves["acc_by_device/phone"][-1] == (2, pytest.approx(0.6))
    assert curves["proxy_std"] == [(1, pytest.approx(0.2))]
    assert "train_metrics/train_loss" in curves
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    resumed = RunRecorder(tmp_path, cfg, resume_rounds=rounds)
    resumed.record(3, stats(0.7))
    resumed.finish({})
    assert [step for step, _ in read_events(tmp_path / "tensorboard")["acc_mean"]] == [1, 2, 3]


def test_off_by_default_and_nothing_is_written(tmp_path):
    RunRecorder(tmp_path, make_cfg()).finish({})
    assert not (tmp_path / "tensorboard").exists()


def test_without_the_tensorboard_package_the_setting_is_one_line(monkeypatch):
    monkeypatch.setattr("pfedes.tensorboard_log.available", lambda: False)
    with pytest.raises(ConfigError, match=r"^logging.tensorboard=true needs the tensorboard package"):
        experiment_config(["logging.tensorboard=true"])
