"""benchmarks/tuning_grid.py: a value is chosen on validation only, and the default stays unless beaten by > 1 point."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tuning_grid as tg  # noqa: E402


def finished_run(run_dir: Path, val: float, test: float) -> None:
    run_dir.mkdir(parents=True)
    rounds = [{"round": r, "val_acc_mean": val, "acc_mean": test} for r in range(1, 11)]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rounds) + "\n")
    (run_dir / "summary.json").write_text("{}")


def test_the_default_stays_unless_another_value_beats_it_by_more_than_one_point():
    assert tg.choose({0.1: 0.50, 1.0: 0.509, 15.0: 0.45}, default=0.1) == 0.1
    assert tg.choose({0.1: 0.50, 1.0: 0.52, 15.0: 0.55}, default=0.1) == 15.0
    assert tg.choose({1.0: 0.52}, default=0.1) is None


def test_the_record_reads_validation_accuracy_never_test_and_skips_unfinished_runs(tmp_path):
    grid = tg.Grid(tmp_path / "pfedme_lam", "one architecture", "strategy.lam", "lam", 0.1, "20")
    finished_run(grid.directory / "lam0.1" / "pfedme" / "seed100", val=0.40, test=0.90)
    finished_run(grid.directory / "lam15" / "pfedme" / "seed100", val=0.60, test=0.10)
    (grid.directory / "lam1" / "pfedme" / "seed100").mkdir(parents=True)  # still running: no summary
    finished_run(grid.directory / "lam1" / "pfedme" / "seed0", val=0.99, test=0.99)  # not the tuning seed
    lines = tg.write_record(grid)
    record = json.loads((tmp_path / "pfedme_lam.json").read_text())
    assert record["methods"]["pfedme"] == {"validation_accuracy": {"0.1": 0.40, "15.0": 0.60}, "chosen": 15.0}
    assert lines[-1] == "| pfedme | 40.0 | 60.0 | 15 |"
    assert (tmp_path / "pfedme_lam.md").read_text().splitlines()[-1] == lines[-1]


def test_a_grid_without_a_finished_run_writes_nothing(tmp_path):
    grid = tg.Grid(tmp_path / "cfl_eps", "one architecture", "strategy.eps2", "eps2_", 1.6, "40")
    assert tg.write_record(grid) == []
    assert not (tmp_path / "cfl_eps.json").exists()


def test_a_budget_record_parses_lr_and_value_from_the_cell_and_states_its_rounds(tmp_path):
    grid = tg.BudgetGrid(tmp_path / "cfl_budget", "cfl", "one architecture", "strategy.eps2", "eps2_", (0.01, 0.5),
                         rounds=40)
    finished_run(grid.directory / "lr0.01_eps2_0.5" / "cfl" / "seed100", val=0.50, test=0.90)
    finished_run(grid.directory / "lr0.02_eps2_0.5" / "cfl" / "seed100", val=0.505, test=0.10)  # under the margin
    finished_run(grid.directory / "lr0.0025_eps2_1.2" / "cfl" / "seed100", val=0.45, test=0.99)
    (grid.directory / "lr0.04_eps2_0.2" / "cfl" / "seed100").mkdir(parents=True)  # still running
    lines = tg.write_budget_record(grid)
    record = json.loads((tmp_path / "cfl_budget.json").read_text())
    assert record["validation_accuracy"] == [{"lr": 0.0025, "eps2": 1.2, "acc": 0.45},
                                             {"lr": 0.01, "eps2": 0.5, "acc": 0.50},
                                             {"lr": 0.02, "eps2": 0.5, "acc": 0.505}]
    assert record["chosen"] == {"lr": 0.01, "eps2": 0.5} and record["candidates"] == 3
    assert "40 rounds" in record["setting"] and "of 40 rounds" in lines[0]
    assert lines[-1] == "Chosen: lr 0.01, eps2 0.5"
