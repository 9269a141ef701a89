"""`pfedes-trial`: a localhost deployment in one command; a bad setting stops it before anything starts."""

import json
import shutil
import subprocess

import pytest

from pfedes.trial import main


@pytest.mark.parametrize("config, message", [
    ("strategy.lam=-1", "pfedes-trial: strategy.lam must be >= 0, got -1"),
    ("strategy.name='fedproto' strategy.lam=-1", "pfedes-trial: strategy.lam must be >= 0, got -1"),
    ("bogus=1", "pfedes-trial: unknown setting(s) ['bogus']"),
    ("data.path='/nonexistent'", "pfedes-trial: data path '/nonexistent' is not a directory"),
])
def test_a_bad_setting_is_one_line_and_nothing_starts(tmp_path, capsys, config, message):
    assert main(["--dir", str(tmp_path / "trial"), "-c", config]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message)
    assert not (tmp_path / "trial").exists()


@pytest.mark.slow
def test_a_trial_runs_on_localhost_and_stops_everything(tmp_path, capsys):
    root = tmp_path / "trial"
    # with central DP on, which thereby also runs in a real deployment
    assert main(["--nodes", "2", "--dir", str(root), "-c",
                 "num_rounds=1 data.samples_per_client=60 privacy.noise_multiplier=0.5"]) == 0
    out = capsys.readouterr().out
    assert "round 1: acc_mean" in out and "finished" in out
    rounds = [json.loads(line) for line in (root / "results" / "metrics.jsonl").read_text().splitlines()]
    assert len(rounds) == 1 and rounds[0]["clients_trained"] == 2 and rounds[0]["server_metrics"]["dp_epsilon"] > 0
    assert sorted(p.name for p in (root / "state").iterdir()) == ["gateway-1", "phone-0"]
    if shutil.which("pgrep"):  # no SuperLink, SuperNode or app process of the trial is left
        assert subprocess.run(["pgrep", "-f", str(root)], capture_output=True).returncode == 1
