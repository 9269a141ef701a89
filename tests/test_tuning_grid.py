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
