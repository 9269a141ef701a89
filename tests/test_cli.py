"""The command line fails early with one line that names the problem."""

import subprocess
import sys


def run_sim(*args):
    return subprocess.run([sys.executable, "-c", "from pfedes.sim import main; main()", *args],
                          capture_output=True, text=True, timeout=120)


def test_missing_data_path_is_one_line_naming_it(tmp_path):
    result = run_sim(f"data.path={tmp_path}/missing", f"out_dir={tmp_path}/out")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"pfedes-sim: data path '{tmp_path}/missing' is not a directory (expected Parquet files or an "
        "image folder in it), nor a Hugging Face hub dataset name"]


def test_bad_value_is_one_line_naming_the_key(tmp_path):
    result = run_sim("train.lr=-1", f"out_dir={tmp_path}/out")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["pfedes-sim: train.lr must be > 0, got -1"]


def test_more_classes_per_client_than_the_data_has_is_one_line(tmp_path):
    result = run_sim("data.classes_per_client=20", f"out_dir={tmp_path}/out")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "pfedes-sim: data.classes_per_client must be in [1, 10] (the data's classes), got 20"]
