"""benchmarks/tune.py: one tuning candidate's record (validation accuracy, and for a method that
shares a feature extractor the validation probe of the final extractor beside a fresh one's)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tune  # noqa: E402


def run_candidate(monkeypatch, tmp_path, *overrides):
    record = tmp_path / "record.jsonl"
    monkeypatch.setattr(tune, "default_data_path", lambda: "embedded")
    monkeypatch.setattr(tune, "SETTING", {**tune.SETTING, "num_clients": 3, "data.samples_per_client": 60,
                                          "num_rounds": 1})
    monkeypatch.setattr(sys, "argv", ["tune.py", "candidate", *overrides, "train.batch_size=16",
                                      "--record", str(record)])
    tune.main()
    return json.loads(record.read_text().splitlines()[-1])


def test_a_feature_sharing_method_is_probed_on_validation_and_the_record_says_its_setting(monkeypatch, tmp_path):
    line = run_candidate(monkeypatch, tmp_path, "strategy=pfedes", "data.partition=pathological")
    assert line["setting"]["data.partition"] == "pathological" and line["setting"]["num_clients"] == 3
    assert len(line["val_acc_by_round"]) == 1
    for key in ("probe_val", "probe_val_fresh"):
        assert 0.0 <= line[key] <= 1.0
    assert line["proxy_std_val"] > 0


def test_a_method_without_a_shared_extractor_has_no_probe(monkeypatch, tmp_path):
    line = run_candidate(monkeypatch, tmp_path, "strategy=local")
    assert "probe_val" not in line and line["val_acc_last5"] == pytest.approx(line["val_acc_by_round"][0])
