"""The run log's summary figures."""

import json

import pytest

from conftest import make_cfg
from pfedes.recording import RunRecorder


def test_summary_says_how_many_rounds_its_last5_means_average(tmp_path):
    cfg = make_cfg("strategy=local", "num_rounds=3", f"out_dir={tmp_path}")
    recorder = RunRecorder(tmp_path, cfg)
    for r, acc in enumerate([0.2, 0.4, 0.6], start=1):
        recorder.record(r, {"eval": [{"accuracy": acc, "device": "phone", "partition": 0}], "clients_trained": 1})
    summary = recorder.finish({})
    assert summary["acc_mean_last5"] == pytest.approx(0.4) and summary["last5_rounds_averaged"] == 3
    assert json.loads((tmp_path / "summary.json").read_text())["last5_rounds_averaged"] == 3


def test_bytes_per_client_are_per_client_asked_even_when_replies_are_dropped():
    from pfedes.recording import round_record

    # 10 clients asked (10 x 100 bytes sent); 2 replied with 50 bytes each, and both were dropped
    record = round_record(1, {"bytes_down": 1000, "bytes_up": 100, "clients_asked": 10, "clients_trained": 0,
                              "clients_dropped": 2}, 1.0)
    assert record["bytes_down_per_client"] == 100 and record["bytes_up_per_client"] == 10
    assert record["clients_asked"] == 10 and record["clients_trained"] == 0
