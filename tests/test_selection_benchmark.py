"""benchmarks/selection.py: each selection mode paired by seed with uniform sampling and Local-only."""

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import selection as sb  # noqa: E402


def write_bench(directory: Path, runs: dict[tuple[str, int], tuple[list[float], float]]) -> None:
    """A pfedes-bench directory: results.csv (last-5 means, worst client) and each run's metrics.jsonl."""
    directory.mkdir(parents=True)
    with (directory / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["strategy", "seed", "status", "acc_mean_last", "acc_worst_last"])
        for (strategy, seed), (accs, worst) in runs.items():
            writer.writerow([strategy, seed, "ok", sum(accs[-5:]) / 5, worst])
            run = directory / strategy / f"seed{seed}"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text("".join(json.dumps({"round": i + 1, "acc_mean": a}) + "\n"
                                                       for i, a in enumerate(accs)))
            (run / "summary.json").write_text(json.dumps({"config": {"data": {"samples_per_client": sb.SAMPLES}}}))


def test_each_mode_is_paired_with_uniform_and_with_its_own_local_only(tmp_path, monkeypatch):
    monkeypatch.setattr(sb, "OUT", tmp_path)
    write_bench(tmp_path / "uniform", {("local", 0): ([0.5] * 10, 0.1), ("local", 1): ([0.6] * 10, 0.2),
                                       ("pfedes", 0): ([0.4] * 5 + [0.7] * 5, 0.3), ("pfedes", 1): ([0.7] * 10, 0.3)})
    write_bench(tmp_path / "power_of_choice", {("local", 0): ([0.55] * 10, 0.2), ("local", 1): ([0.6] * 10, 0.2),
                                               ("pfedes", 0): ([0.72] * 10, 0.4)})
    rows = {(r["option"], r["method"]): r for r in sb.table(["uniform", "power_of_choice"])}
    assert rows["uniform", "pfedes"]["vs_uniform"] is None
    assert rows["uniform", "pfedes"]["vs_local"]["by_seed"] == pytest.approx({0: 0.2, 1: 0.1})
    assert rows["uniform", "pfedes"]["rounds_to_uniform_local"] == {0: 7, 1: 5}
    assert rows["uniform", "local"]["vs_local"] is None
    assert rows["power_of_choice", "local"]["vs_uniform"]["by_seed"] == pytest.approx({0: 0.05, 1: 0.0})
    # only the seeds both runs have are paired
    assert rows["power_of_choice", "pfedes"]["vs_uniform"]["by_seed"] == pytest.approx({0: 0.02})
    assert rows["power_of_choice", "pfedes"]["vs_local"]["by_seed"] == pytest.approx({0: 0.17})
    assert rows["power_of_choice", "pfedes"]["worst_client"]["mean"] == pytest.approx(0.4)
    sb.write_csv(list(rows.values()), tmp_path / "selection.csv")
    sb.plot(["uniform", "power_of_choice"], tmp_path / "selection.png")
    written = list(csv.DictReader((tmp_path / "selection.csv").open()))
    assert [(r["option"], r["method"]) for r in written] == [
        ("uniform", "local"), ("uniform", "pfedes"), ("power_of_choice", "local"), ("power_of_choice", "pfedes")]
    assert float(written[3]["vs_uniform_mean"]) == pytest.approx(2.0)
    assert (tmp_path / "selection.png").stat().st_size > 0


def test_a_mode_without_runs_is_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(sb, "OUT", tmp_path)
    rows = sb.table(["uniform", "power_of_choice"])
    assert {r["status"] for r in rows} == {"not run"}


def test_the_bench_command_carries_the_mode_and_the_partial_participation():
    command = sb.bench_command("power_of_choice", [0, 1, 2])
    assert "selection.mode=power_of_choice" in command
    assert "num_clients=100" in command and "fraction_train=0.1" in command and "seeds=[0,1,2]" in command
    assert "strategies=[local,pfedes]" in command
    assert command[-1] == "out_dir=benchmarks/results/selection/power_of_choice"
