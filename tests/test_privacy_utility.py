"""benchmarks/privacy_utility.py on fake bench directories: which runs it reads, what it pairs, and
what it says of the runs that are not there."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import privacy_utility as pu  # noqa: E402


def fake_run(directory: Path, strategy: str, seed: int, acc: float, *, eps: float = math.inf, mode: str = "central",
             devices=("phone",), rounds: int = pu.ROUNDS, reported: float | None = None) -> None:
    run = directory / strategy / f"seed{seed}"
    run.mkdir(parents=True)
    privacy = {"mode": mode, "delta": 1e-5, "noise_multiplier": 0.0 if math.isinf(eps) else 1.3,
               "target_epsilon": 0.0 if math.isinf(eps) else eps}
    summary = {"rounds": rounds, "acc_mean_last5": acc, "acc_worst_last5": acc - 0.2,
               "dp_epsilon": None if math.isinf(eps) else 0.5,
               "config": {"privacy": privacy, "clients": {"devices": list(devices)}}}
    (run / "summary.json").write_text(json.dumps(summary))
    server = {} if reported is None else {"dp_epsilon": reported}
    # the last 2 rounds released no aggregate (every reply dropped): no epsilon in them
    (run / "metrics.jsonl").write_text("\n".join(json.dumps({"round": r + 1, "server_metrics": server if r < rounds - 2 else {}})
                                                 for r in range(rounds)) + "\n")


@pytest.fixture
def benches(tmp_path):
    root, reference = tmp_path / "privacy_utility", tmp_path / "reference"
    zoo = ("phone", "gateway", "gpu-host")
    for seed, (fedavg, pfedes) in enumerate([(0.60, 0.65), (0.62, 0.66), (0.58, 0.64)]):
        fake_run(root / "phone_epsinf", "fedavg", seed, fedavg)
        fake_run(root / "phone_epsinf", "pfedes", seed, pfedes)
        fake_run(root / "phone_central_eps8", "fedavg", seed, fedavg - 0.10, eps=8, reported=7.9)
        fake_run(root / "phone_central_eps8", "pfedes", seed, pfedes - 0.02 * (seed + 1), eps=8, reported=7.95)
        fake_run(reference, "pfedes", seed, 0.70, devices=zoo)  # the zoo's non-private runs
        fake_run(reference, "local", seed, 0.60 + 0.01 * seed, devices=zoo)
    for seed in (0, 1):
        fake_run(tmp_path / "local_phone", "local", seed, 0.50)
    fake_run(root / "zoo_central_eps4", "pfedes", 0, 0.61, eps=4, devices=zoo, reported=3.9)
    fake_run(root / "zoo_central_eps4", "pfedes", 1, 0.99, eps=4, devices=zoo, rounds=30)  # stopped early
    fake_run(root / "zoo_central_eps4", "pfedes", 2, 0.99, eps=8, devices=zoo)  # another epsilon
    fake_run(root / "phone_central_eps4", "fedavg", 0, 0.99, eps=4, mode="local")  # another mode
    # the fallback form on the zoo: the reference table has no non-private run of it
    fake_run(root / "zoo_central_eps8", "pfedes_validated", 0, 0.62, eps=8, devices=zoo, reported=7.99)
    return root, reference, tmp_path / "out"


def test_it_pairs_each_private_run_with_the_non_private_one_by_seed(benches):
    root, reference, out = benches
    result = pu.main(["--root", str(root), "--reference", str(reference), "--out", str(out),
                      "--local-phone", str(root.parent / "local_phone")])
    phone = result["panels"][0]["methods"]
    assert phone["fedavg"]["inf"]["accuracy"]["mean"] == pytest.approx(0.60)
    assert phone["fedavg"]["8"]["vs_nonprivate"]["mean"] == pytest.approx(-0.10)
    assert phone["pfedes"]["8"]["vs_nonprivate"]["by_seed"] == {0: pytest.approx(-0.02), 1: pytest.approx(-0.04),
                                                                2: pytest.approx(-0.06)}
    assert phone["pfedes"]["8"]["epsilon_reported"] == pytest.approx(7.95)  # metrics.jsonl's last round that reports one
    # pFedES loses 0.04 on average where FedAvg loses 0.10: +0.06 in pFedES's favour
    assert result["panels"][0]["loss_difference"]["pfedes"]["8"]["mean"] == pytest.approx(0.06)
    assert "pfedes_validated" not in result["panels"][0]["loss_difference"]  # not run: no difference
    zoo = result["panels"][1]["methods"]["pfedes"]
    assert zoo["inf"]["seeds"] == [0, 1, 2] and zoo["inf"]["accuracy"]["mean"] == pytest.approx(0.70)  # the reference's
    assert zoo["4"]["seeds"] == [0] and zoo["4"]["vs_nonprivate"]["by_seed"] == {0: pytest.approx(-0.09)}
    assert "ran 30 rounds" in zoo["4"]["missing"][1] and "target_epsilon 8, not 4" in zoo["4"]["missing"][2]
    assert "privacy.mode local" in phone["fedavg"]["4"]["missing"][0]
    assert phone["fedavg"]["1"]["status"] == "not run" and "no summary.json" in phone["fedavg"]["1"]["missing"][0]
    local = result["panels"][2]["methods"]  # its non-private runs are the same as the central panel's
    assert local["pfedes"]["inf"]["accuracy"] == phone["pfedes"]["inf"]["accuracy"]
    assert all(m[e]["status"] == "not run" for m in local.values() for e in ("8", "4", "1"))
    assert result["panels"][0]["local_only"]["seeds"] == [0, 1]  # Local-only beside every panel
    # each cell against Local-only on the seeds both have: the floor a private method should keep
    assert phone["pfedes"]["8"]["vs_local_only"]["by_seed"] == {0: pytest.approx(0.13), 1: pytest.approx(0.12)}
    assert zoo["4"]["vs_local_only"]["by_seed"] == {0: pytest.approx(0.01)}
    assert result["panels"][1]["local_only"]["accuracy"]["mean"] == pytest.approx(0.61)
    validated = result["panels"][1]["methods"]["pfedes_validated"]
    assert validated["inf"]["status"] == "not run" and validated["8"]["vs_nonprivate"] is None
    assert validated["8"]["vs_local_only"]["by_seed"] == {0: pytest.approx(0.02)}  # compared with Local-only only
    assert not (result["panels"][1]["loss_difference"] or {}).get("pfedes_validated")
    table = (out / "privacy_utility.md").read_text()
    assert "Local-only (shares nothing, so no privacy cost): 50.0 ± 0.0, seeds [0, 1]" in table
    assert "| fedavg | 60.0 ± 2.0 | 50.0 ± 2.0 (-10.0 ± 0.0), ε 7.90 | not run | not run |" in table
    assert "seeds [0]" in table and "ε = 8: +6.0 ± 2.0" in table
    assert "pfedes against Local-only (points, paired by seed): ε = ∞: +15.5 ± 0.7 (+15.0 / +16.0), " \
           "ε = 8: +12.5 ± 0.7 (+13.0 / +12.0)" in table
    assert json.loads((out / "privacy_utility.json").read_text())["benchmark"] == "privacy_utility"
    assert (out / "privacy_utility.png").stat().st_size > 0


def test_with_no_run_at_all_every_cell_says_not_run(tmp_path):
    result = pu.main(["--root", str(tmp_path / "none"), "--reference", str(tmp_path / "none"),
                      "--local-phone", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    cells = [c for p in result["panels"] for m in p["methods"].values() for c in m.values()]
    assert cells and all(c["status"] == "not run" and c["accuracy"] is None for c in cells)
    assert all(p["loss_difference"] is None for p in result["panels"])
    assert all(p["local_only"]["accuracy"] is None for p in result["panels"])
    assert "not run" in (tmp_path / "out" / "privacy_utility.md").read_text()
