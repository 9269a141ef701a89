"""benchmarks/aggregation_options.py: each aggregation option paired by seed with flat aggregation."""

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import aggregation_options as ao  # noqa: E402


def write_bench(directory: Path, runs: dict[tuple[str, int], list[float]], **settings) -> None:
    """A pfedes-bench directory: results.csv (last-5 means), each run's metrics.jsonl and its
    summary.json with the settings it was made with."""
    directory.mkdir(parents=True)
    with (directory / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["strategy", "seed", "status", "acc_mean_last"])
        for (strategy, seed), accs in runs.items():
            writer.writerow([strategy, seed, "ok", sum(accs[-5:]) / 5])
            run = directory / strategy / f"seed{seed}"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text("".join(json.dumps({"round": i + 1, "acc_mean": a}) + "\n"
                                                       for i, a in enumerate(accs)))
            config = {"data": {"samples_per_client": 500}, "strategy": {"proxy_epochs": settings.get("passes", 10)},
                      "aggregation": {"groups": settings.get("groups", "none")}}
            (run / "summary.json").write_text(json.dumps({"config": config}))


def test_rounds_to_reach_is_the_first_trailing_mean_at_the_target():
    assert ao.rounds_to_reach([0.1] * 4 + [0.5] * 6, 0.5) == 9  # rounds 5-9
    assert ao.rounds_to_reach([0.1] * 4 + [0.7] * 6, 0.5) == 8  # (0.1 + 4 * 0.7) / 5 = 0.58; round 7: 0.46
    assert ao.rounds_to_reach([0.1] * 10, 0.5) is None


def test_each_option_is_paired_by_seed_with_flat_and_local_and_a_missing_one_is_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(ao, "LOCAL_BENCH", tmp_path / "table")
    monkeypatch.setattr(ao, "OUT", tmp_path / "aggregation")
    write_bench(tmp_path / "table", {("local", 0): [0.5] * 10, ("local", 1): [0.6] * 10})
    write_bench(tmp_path / "aggregation" / "flat", {("pfedes", 0): [0.4] * 5 + [0.7] * 5, ("pfedes", 1): [0.8] * 10})
    write_bench(tmp_path / "aggregation" / "two_tier", {("pfedes", 0): [0.72] * 10, ("pfedes", 1): [0.79] * 10},
                groups="device")
    rows = {r["option"]: r for r in ao.table(["two_tier", "quality"])}
    assert rows["flat"]["vs_flat"] is None
    assert rows["flat"]["vs_local"]["by_seed"] == pytest.approx({0: 0.2, 1: 0.2})
    assert rows["flat"]["rounds_to_local_plateau"] == {0: 7, 1: 5}
    assert rows["two_tier"]["vs_flat"]["by_seed"] == pytest.approx({0: 0.02, 1: -0.01})
    assert rows["two_tier"]["vs_local"]["mean"] == pytest.approx(0.205)
    assert rows["two_tier"]["rounds_to_local_plateau"] == {0: 5, 1: 5}
    assert rows["quality"]["status"] == "not run"
    ao.write_csv(list(rows.values()), tmp_path / "options.csv")
    monkeypatch.setattr(ao, "OPTIONS", {"flat": [], "two_tier": [], "quality": []})
    ao.plot(["flat", "two_tier", "quality"], tmp_path / "options.png")
    written = list(csv.DictReader((tmp_path / "options.csv").open()))
    assert [r["option"] for r in written] == ["flat", "two_tier", "quality"]
    assert float(written[1]["vs_flat_mean"]) == pytest.approx(0.5)
    assert written[1]["rounds_to_local_plateau_by_seed"] == "5 / 5"
    assert (tmp_path / "options.png").stat().st_size > 0


def test_an_option_made_with_other_settings_than_flat_besides_its_own_is_not_paired(tmp_path, monkeypatch):
    monkeypatch.setattr(ao, "LOCAL_BENCH", tmp_path / "table")
    monkeypatch.setattr(ao, "OUT", tmp_path / "aggregation")
    write_bench(tmp_path / "table", {("local", 0): [0.5] * 10})
    write_bench(tmp_path / "aggregation" / "flat", {("pfedes", 0): [0.7] * 10})
    write_bench(tmp_path / "aggregation" / "two_tier", {("pfedes", 0): [0.72] * 10}, groups="device", passes=5)
    rows = {r["option"]: r for r in ao.table(["two_tier"])}
    assert rows["two_tier"]["status"] == "other settings than flat: strategy.proxy_epochs"


def test_the_bench_command_carries_the_option_and_the_reference_setting():
    command = ao.bench_command("quality", [0, 1, 2])
    assert "aggregation.weighting=quality" in command
    assert "num_rounds=60" in command and "seeds=[0,1,2]" in command
    assert command[-1] == "out_dir=benchmarks/results/aggregation/quality"
    assert not any(o.startswith("aggregation.") for o in ao.bench_command("flat", [0])), "flat is conf/'s default"


def test_without_flat_runs_the_table_stops_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(ao, "OUT", tmp_path / "aggregation")
    with pytest.raises(SystemExit, match="no flat runs"):
        ao.table(["two_tier"])
