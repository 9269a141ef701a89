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
