"""benchmarks/rerun_compare.py: a re-run table against the committed one, paired by seed."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rerun_compare as rc  # noqa: E402


def test_changes_and_gains_are_paired_by_seed_over_the_seeds_both_tables_have():
    committed = {"local": {0: 0.60, 1: 0.62, 2: 0.64}, "pfedes": {0: 0.68, 1: 0.69, 2: 0.70}}
    rerun = {"local": {0: 0.61, 1: 0.61}, "pfedes": {0: 0.70, 1: 0.66}}
    rows = rc.compare(committed, rerun)
    assert rows["local"]["seeds"] == [0, 1]
    assert rows["local"]["change"]["by_seed"] == pytest.approx({0: 0.01, 1: -0.01})
    assert rows["local"]["within_noise"]
    assert rows["pfedes"]["change"]["by_seed"] == pytest.approx({0: 0.02, 1: -0.03})
    assert rows["pfedes"]["change"]["mean"] == pytest.approx(-0.005)
    assert rows["pfedes"]["gain_then"]["mean"] == pytest.approx((0.08 + 0.07) / 2)
    assert rows["pfedes"]["gain_now"]["mean"] == pytest.approx((0.09 + 0.05) / 2)
    assert "gain_then" not in rows["local"]


def test_a_change_of_two_points_is_beyond_noise():
    rows = rc.compare({"local": {0: 0.60}}, {"local": {0: 0.62}})
    assert not rows["local"]["within_noise"]
