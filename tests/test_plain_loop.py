"""The Flower path and the plain loop compute the same thing (what makes the overhead
benchmark honest)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_cfg
from pfedes.server_app import CHECKPOINT
from pfedes.sim import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from plain_loop import run_plain  # noqa: E402


@pytest.mark.slow
def test_flower_and_plain_loop_give_identical_proxies(tmp_path):
    cfg = make_cfg("num_clients=3", "num_rounds=2", "data.samples_per_client=100", "seed=3",
                   "simulation.num_cpus_per_client=1", "train.torch_threads=1", f"out_dir={tmp_path}")
    simulate(cfg)
    flower = torch.load(tmp_path / CHECKPOINT, weights_only=False)["arrays"]
    plain = run_plain(cfg, threads=1)
    assert set(flower) == set(plain["arrays"]) and flower
    for key in flower:
        np.testing.assert_array_equal(flower[key], plain["arrays"][key], err_msg=key)
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["acc_mean"] for r in rounds] == pytest.approx([r["acc_mean"] for r in plain["rounds"]])
