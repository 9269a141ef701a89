"""benchmarks/compression_curve.py: measured upload bytes against accuracy, paired with the fp32 runs."""

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import compression_curve as cc  # noqa: E402


def write_bench(directory: Path, rows: list[tuple[str, int, float, float]], **settings) -> None:
    """A pfedes-bench results.csv, and each run's summary.json with its settings."""
    directory.mkdir(parents=True)
    with (directory / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["strategy", "seed", "status", "acc_mean_last", "bytes_up_per_client_round"])
        for strategy, seed, acc, sent in rows:
            writer.writerow([strategy, seed, "ok", acc, sent])
            run = directory / strategy / f"seed{seed}"
            run.mkdir(parents=True)
            config = {"strategy": {"name": strategy, "proxy_epochs": settings.get("proxy_epochs", 10)},
                      "data": {"samples_per_client": 500}, "compression": settings.get("compression", {"quantize": "none"}),
                      "out_dir": str(run)}
            (run / "summary.json").write_text(json.dumps({"config": config}))


def test_each_option_is_paired_by_seed_with_fp32_and_local_and_a_missing_one_is_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(cc, "LOCAL_BENCH", tmp_path / "table")
    monkeypatch.setattr(cc, "OUT", tmp_path / "compression")
    write_bench(tmp_path / "table", [("local", 0, 0.60, 0), ("local", 1, 0.62, 0)])
    write_bench(tmp_path / "compression" / "fp32", [("pfedes", 0, 0.68, 4000), ("pfedes", 1, 0.70, 4000)])
    write_bench(tmp_path / "compression" / "int8", [("pfedes", 0, 0.67, 1000), ("pfedes", 1, 0.70, 1200)],
                compression={"quantize": "int8"})
    rows = {r["option"]: r for r in cc.curve(["int8", "top10"], full_bytes=100_000)}
    assert rows["fp32"]["pct_of_full_model"] == pytest.approx(4.0)
    assert rows["fp32"]["vs_local"]["mean"] == pytest.approx(0.08)
    assert rows["int8"]["upload_kib"] == pytest.approx(1100 / 1024)
    assert rows["int8"]["pct_of_full_model"] == pytest.approx(1.1)
    assert rows["int8"]["vs_fp32"]["by_seed"] == pytest.approx({0: -0.01, 1: 0.0})
    assert rows["int8"]["vs_local"]["by_seed"] == pytest.approx({0: 0.07, 1: 0.08})
    assert rows["top10"]["status"] == "not run"
    cc.write_csv(list(rows.values()), tmp_path / "curve.csv")
    cc.plot(list(rows.values()), tmp_path / "curve.png")
    written = list(csv.DictReader((tmp_path / "curve.csv").open()))
    assert [r["option"] for r in written] == ["fp32", "int8", "top10"]
    assert float(written[1]["vs_fp32_mean"]) == pytest.approx(-0.5)
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_an_option_made_with_other_settings_than_fp32_is_not_paired_and_says_which(tmp_path, monkeypatch):
    monkeypatch.setattr(cc, "LOCAL_BENCH", tmp_path / "table")
    monkeypatch.setattr(cc, "OUT", tmp_path / "compression")
    write_bench(tmp_path / "table", [("local", 0, 0.60, 0)])
    write_bench(tmp_path / "compression" / "fp32", [("pfedes", 0, 0.68, 4000)])
    write_bench(tmp_path / "compression" / "int8", [("pfedes", 0, 0.60, 1000)], proxy_epochs=5,
                compression={"quantize": "int8"})
    rows = {r["option"]: r for r in cc.curve(["int8"], full_bytes=100_000)}
    assert rows["int8"]["status"] == "other settings than fp32: strategy.proxy_epochs"
    assert "vs_fp32" not in rows["int8"]


def test_without_fp32_runs_the_curve_says_to_run_them(tmp_path, monkeypatch):
    monkeypatch.setattr(cc, "OUT", tmp_path / "compression")
    with pytest.raises(SystemExit, match="run the fp32 option first"):
        cc.curve(["int8"], full_bytes=100_000)


def test_the_bench_command_carries_the_option_and_the_reference_setting():
    command = cc.bench_command("int8+top10", [0, 1, 2])
    assert "compression.quantize=int8" in command and "compression.topk=0.1" in command
    assert "num_rounds=60" in command and "seeds=[0,1,2]" in command
    assert command[-1] == "out_dir=benchmarks/results/compression/int8+top10"
