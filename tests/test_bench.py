"""pfedes-bench: the heterogeneity figures, the comparison table, and one end-to-end run."""

import csv
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

from conftest import make_cfg
from pfedes.bench.heterogeneity import js_divergence, mean_pairwise_jsd
from pfedes.bench.runs import Run, execute, needs_one_architecture, split_overrides
from pfedes.bench.tables import device_table, plateau, plateau_note, results_table
from pfedes.config import ConfigError


def test_jensen_shannon_divergence_on_hand_computed_values():
    assert js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)
    assert js_divergence(np.array([3.0, 1.0]), np.array([6.0, 2.0])) == pytest.approx(0.0)
    # p = (.5, .5), q = (1, 0), m = (.75, .25): KL(p||m) = .5 log2(2/3) + .5 log2(2) = 0.207519,
    # KL(q||m) = log2(4/3) = 0.415037; JSD = (0.207519 + 0.415037) / 2
    assert js_divergence(np.array([5.0, 5.0]), np.array([2.0, 0.0])) == pytest.approx(0.311278, abs=1e-6)
    hist = np.array([[4.0, 0.0], [0.0, 4.0], [2.0, 2.0]])
    assert mean_pairwise_jsd(hist) == pytest.approx((1.0 + 2 * 0.311278) / 3, abs=1e-6)


def test_bench_keys_are_taken_out_and_strategy_keys_go_only_where_a_preset_has_them():
    common, per = split_overrides(["strategies=[local,fedprox]", "seeds=[0,1]", "out_dir=x", "num_rounds=3",
                                   "strategy.mu=0.1", "data.samples_per_client=50"])
    assert common == ["num_rounds=3", "data.samples_per_client=50"]
    assert per == [("mu", "strategy.mu=0.1")]
    with pytest.raises(ConfigError, match="strategies"):
        split_overrides(["strategy=fedavg"])
    with pytest.raises(ConfigError, match="seeds"):
        split_overrides(["seed=1"])


def fake_run(name, seed, accs, worst=None, **extra):
    rounds = [{"round": i + 1, "acc_mean": a, "acc_worst": (worst or a) - 0.1, "bytes_up_per_client": 100,
               "bytes_down_per_client": 200, "seconds": 1.0, **extra} for i, a in enumerate(accs)]
    return Run(name, seed, Path("/nowhere"), status="ok", rounds=rounds)


def row(table, name):
    return next(line for line in table.splitlines() if line.startswith(f"| {name} |")).split(" | ")


def test_table_means_the_last_five_rounds_pairs_gains_by_seed_and_reports_losers():
    runs = [fake_run("local", 0, [0.0, 0.5, 0.5, 0.5, 0.5, 0.5]), fake_run("local", 1, [0.0, 0.7, 0.7, 0.7, 0.7, 0.7]),
            fake_run("fedavg", 0, [0.9, 0.4, 0.4, 0.4, 0.4, 0.4], global_acc=0.3),
            fake_run("fedavg", 1, [0.9, 0.6, 0.6, 0.6, 0.6, 0.6], global_acc=0.5),
            fake_run("good", 0, [0.6] * 6), fake_run("good", 1, [0.8] * 6),
            Run("homog", 0, Path("/nowhere"), status="skipped", note="needs one architecture (x)")]
    table = results_table(["local", "fedavg", "good", "homog"], runs)
    fedavg = row(table, "fedavg")
    assert fedavg[1] == "50.0 ± 14.1"      # mean of 0.4 and 0.6; sample std 0.1414
    assert fedavg[3] == "-10.0 ± 0.0"      # 0.4 - 0.5 and 0.6 - 0.7
    assert fedavg[5] == "40.0 ± 14.1"      # global accuracy, only where reported
    assert "**loses**" in fedavg[-1]
    good = row(table, "good")
    assert good[3] == "+10.0 ± 0.0" and good[4] == "+20.0 ± 0.0" and "beats" in good[-1]
    assert good[5] == "—"                  # no global model
    assert row(table, "local")[-1].startswith("reference")
    assert "needs one architecture" in row(table, "homog")[1]
    equal = results_table(["local", "tie"], runs[:2] + [fake_run("tie", 0, [0.5] * 5)])
    assert "**loses**" in row(equal, "tie")[-1]  # not beating Local-only is losing
    small = results_table(["local", "small"], runs[:2] + [fake_run("small", 0, [0.51] * 5)])
    assert row(small, "small")[-1].startswith("level")  # +1 point over seeds is within noise
    unfinished = results_table(["local"], runs[:2] + [Run("local", 2, Path("/nowhere"))])
    assert "(1 of 3 seeds did not run: pending)" in unfinished


def test_device_table_pairs_each_profile_with_local_only_by_seed():
    def run(name, seed, phone, gateway):
        rounds = [{"round": 1, "acc_by_device": {"phone": 0.0, "gateway": 0.0}}] + [
            {"round": i, "acc_by_device": {"phone": phone, "gateway": gateway}} for i in range(2, 7)]
        return Run(name, seed, Path("/nowhere"), status="ok", rounds=rounds)

    runs = [run("local", 0, 0.5, 0.6), run("local", 1, 0.7, 0.6), run("x", 0, 0.6, 0.5), run("x", 1, 0.8, 0.5)]
    table = device_table(["local", "x"], runs)
    assert table.splitlines()[0] == "| strategy | gateway % (gain vs Local-only) | phone % (gain vs Local-only) |"
    assert row(table, "local")[1:] == ["60.0 ± 0.0", "60.0 ± 14.1 |"]
    assert row(table, "x")[1:] == ["50.0 ± 0.0 (-10.0 ± 0.0)", "70.0 ± 14.1 (+10.0 ± 0.0) |"]
    one_profile = [Run("local", 0, Path("/nowhere"), status="ok", rounds=[{"acc_by_device": {"phone": 0.5}}])]
    assert device_table(["local"], one_profile) is None


def test_a_homogeneous_method_is_skipped_on_mixed_devices_without_running(tmp_path):
    cfg = make_cfg("strategy=fedavg", "clients.devices=[phone,gateway]", f"out_dir={tmp_path}")
    assert "needs one architecture" in needs_one_architecture(cfg)
    run = Run("fedavg", 0, tmp_path)
    execute(run, cfg)
    assert run.status == "skipped" and not (tmp_path / "metrics.jsonl").exists()
    assert needs_one_architecture(make_cfg("strategy=local", "clients.devices=[phone,gateway]")) is None


def test_the_console_script_is_the_bench():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("pfedes-bench") == "pfedes.bench:main"


def test_a_finished_run_with_the_same_config_is_reused_and_any_other_is_not(tmp_path, monkeypatch):
    """Long benches resume: a run finished in its directory with the same configuration is read
    back; an unfinished one, another configuration, or rerun=true runs again."""
    cfg = make_cfg("strategy=local", "num_rounds=2", f"out_dir={tmp_path}")
    rounds = [{"round": 1, "acc_mean": 0.5}, {"round": 2, "acc_mean": 0.6}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    saved = {**cfg, "run_token": "abc", "client_state_dir": "elsewhere"}
    (tmp_path / "summary.json").write_text(json.dumps({"config": saved}))
    simulated = []
    monkeypatch.setattr("pfedes.sim.simulate", lambda c: simulated.append(c) or
                        (tmp_path / "metrics.jsonl").write_text(json.dumps(rounds[0]) + "\n"))

    run = Run("local", 0, tmp_path)
    execute(run, cfg)
    assert simulated == [] and run.status == "ok" and run.rounds == rounds
    execute(Run("local", 0, tmp_path), make_cfg("strategy=local", "num_rounds=2", "train.lr=0.5",
                                                 f"out_dir={tmp_path}"))
    assert len(simulated) == 1 and not (tmp_path / "summary.json").exists()  # other config: ran again
    (tmp_path / "summary.json").write_text(json.dumps({"config": saved}))
    execute(Run("local", 0, tmp_path), cfg, rerun=True)
    assert len(simulated) == 2
    (tmp_path / "summary.json").write_text(json.dumps({"config": saved}))  # but only 1 round logged
    execute(Run("local", 0, tmp_path), cfg)
    assert len(simulated) == 3


def test_a_stopped_or_shorter_run_with_the_same_config_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """A run that stopped, or finished with fewer rounds than asked for now, continues from its
    server checkpoint and client states; a checkpoint of another configuration starts afresh."""
    import torch

    from pfedes.server_app import CHECKPOINT, config_fingerprint, prepare

    short = make_cfg("strategy=local", "num_rounds=2", f"out_dir={tmp_path}")
    (tmp_path / "client_state").mkdir()
    torch.save({"round": 2, "fingerprint": config_fingerprint(prepare(short))}, tmp_path / CHECKPOINT)
    (tmp_path / "summary.json").write_text(json.dumps({"config": short}))
    simulated = []
    monkeypatch.setattr("pfedes.sim.simulate", lambda c: simulated.append(c) or
                        (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 1, "acc_mean": 0.5}) + "\n"))
    execute(Run("local", 0, tmp_path), make_cfg("strategy=local", "num_rounds=5", f"out_dir={tmp_path}"))
    assert simulated[-1]["resume"] is True and simulated[-1]["num_rounds"] == 5
    assert (tmp_path / "client_state").is_dir() and not (tmp_path / "summary.json").exists()
    execute(Run("local", 0, tmp_path), make_cfg("strategy=local", "num_rounds=5", "train.lr=0.5",
                                                 f"out_dir={tmp_path}"))
    assert simulated[-1]["resume"] is False and not (tmp_path / "client_state").exists()


def test_a_run_from_before_a_setting_existed_still_extends(tmp_path, monkeypatch):
    """Its checkpoint holds only a fingerprint of its config (no `selection` then): the bench finds
    that config in the run's summary.json, which it must read before removing it."""
    import torch

    from pfedes.server_app import CHECKPOINT, config_fingerprint, prepare

    old = {k: v for k, v in prepare(make_cfg("strategy=local", "num_rounds=2", f"out_dir={tmp_path}")).items()
           if k != "selection"}
    (tmp_path / "client_state").mkdir()
    torch.save({"round": 2, "fingerprint": config_fingerprint(old)}, tmp_path / CHECKPOINT)
    (tmp_path / "summary.json").write_text(json.dumps({"config": old}))
    simulated = []
    monkeypatch.setattr("pfedes.sim.simulate", lambda c: simulated.append(c) or
                        (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 1, "acc_mean": 0.5}) + "\n"))
    execute(Run("local", 0, tmp_path), make_cfg("strategy=local", "num_rounds=5", f"out_dir={tmp_path}"))
    assert simulated[-1]["resume"] is True
    # the ServerApp then loads the checkpoint with the summary gone: it carries its config now
    from pfedes.server_app import load_checkpoint

    assert load_checkpoint(tmp_path / CHECKPOINT, prepare(simulated[-1]))["round"] == 2


def test_plateau_is_the_rise_of_the_seed_mean_line_over_the_last_ten_rounds():
    rising = [fake_run("local", s, [0.3] * 5 + [0.5 + 0.01 * i for i in range(10)]) for s in (0, 1)]
    p = plateau(rising)
    assert p["rise"] == pytest.approx(0.09) and p["rise_by_seed"] == pytest.approx([0.09, 0.09])
    assert not p["plateaued"] and "still rising" in plateau_note(rising, 15)
    falling = [fake_run("local", 0, [0.6 - 0.01 * i for i in range(10)])]
    assert "falling" in plateau_note(falling, 10)
    flat = [fake_run("local", 0, [0.6, 0.62] * 5), fake_run("local", 1, [0.62, 0.6] * 5)]
    assert plateau(flat)["plateaued"] and abs(plateau(flat)["rise"]) < 1e-9  # the seed mean is flat
    assert "rounds 1-10" in plateau_note(flat, 10)
    assert plateau([fake_run("local", 0, [0.5] * 9)]) is None  # fewer than 10 rounds: nothing to say


@pytest.mark.slow
def test_pfedes_bench_end_to_end_two_strategies_two_rounds(tmp_path):
    out = tmp_path / "bench"
    command = [shutil.which("pfedes-bench")] if shutil.which("pfedes-bench") else [sys.executable, "-m", "pfedes.bench"]
    args = ["strategies=[local,fedavg]", "seeds=[0]", "num_clients=2", "num_rounds=2", "clients.devices=[phone]",
            "data.samples_per_client=150", "strategy.lr=0.02", f"out_dir={out}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command + args, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mean pairwise JSD" in result.stdout
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["strategy"], r["seed"], r["status"]) for r in rows] == [("local", "0", "ok"), ("fedavg", "0", "ok")]
    for r in rows:
        assert 0.0 <= float(r["acc_worst_last"]) <= float(r["acc_mean_last"]) <= 1.0
        assert int(r["rounds"]) == 2
    fedavg = rows[1]
    assert float(fedavg["bytes_up_per_client_round"]) > 0 and fedavg["global_acc_last"] != ""
    assert float(rows[0]["bytes_up_per_client_round"]) == 0 and rows[0]["global_acc_last"] == ""
    assert float(fedavg["gain_vs_local"]) == pytest.approx(float(fedavg["acc_mean_last"]) - float(rows[0]["acc_mean_last"]))
    md = (out / "results.md").read_text()
    assert "| local |" in md and "| fedavg |" in md and "Jensen-Shannon" in md
    assert "fedavg trains at its own lr 0.02 (strategy.lr)" in md  # strategy.KEY reaches every preset with KEY
    assert (out / "curves.png").stat().st_size > 0
    diagnosis = json.loads((out / "heterogeneity.json").read_text())
    assert np.asarray(diagnosis["0"]["label_histograms"]).sum() == 2 * 150
    # The identical partition and local splits: both runs saw the same clients with the same test sizes.
    summaries = [json.loads((out / s / "seed0" / "summary.json").read_text()) for s in ("local", "fedavg")]
    assert summaries[0]["config"]["data"] == summaries[1]["config"]["data"]
    sizes = [{k: v for k, v in s["final"]["acc_by_client"].items()} for s in summaries]
    assert set(sizes[0]) == set(sizes[1]) == {"0", "1"}
    # Asking for one more round continues the finished runs from their checkpoints.
    args = [a if a != "num_rounds=2" else "num_rounds=3" for a in args]
    result = subprocess.run(command + args, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("resuming after round 2 of 3") == 2
    rounds = [json.loads(line) for line in (out / "fedavg" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2, 3]


def test_records_show_paths_inside_the_working_directory_relative(tmp_path, monkeypatch):
    from pfedes.recording import shown_path

    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "bench" / "local" / "seed0") == "bench/local/seed0"
    assert shown_path("/elsewhere/x") == "/elsewhere/x"


def test_proxy_table_reads_the_last_probe_and_the_std_ratio():
    from pfedes.bench.tables import proxy_table

    rounds = [{"proxy_std": 0.2}, {"proxy_std": 0.01}, {"proxy_std": 0.1, "probe_acc": 0.6, "probe_acc_fresh": 0.4}]
    runs = [Run("pfedes", s, Path("/x"), status="ok", rounds=rounds) for s in (0, 1)]
    runs.append(Run("local", 0, Path("/x"), status="ok", rounds=[{"acc_mean": 0.5}]))
    table = proxy_table(["local", "pfedes"], runs)
    cells = [c.strip() for c in table.splitlines()[-1].strip("|").split("|")]
    assert cells == ["pfedes", "60.0 ± 0.0", "40.0 ± 0.0", "+20.0 ± 0.0", "0.1000", "0.05"]
    assert "local" not in table  # no diagnostics recorded: no row
    assert proxy_table(["local"], runs[2:]) is None


def test_sample_sweep_pairs_each_size_s_gains_with_local_only_by_seed(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from sample_sweep import sweep_of

    def bench(name, accs):  # accs: {strategy: [acc of seed 0, acc of seed 1]}
        d = tmp_path / name
        d.mkdir()
        with (d / "results.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["strategy", "seed", "status", "acc_mean_last"])
            writer.writeheader()
            for strategy, values in accs.items():
                for seed, acc in enumerate(values):
                    writer.writerow({"strategy": strategy, "seed": seed, "status": "ok", "acc_mean_last": acc})
        return f"{d}"

    sweep = sweep_of([f"100={bench('a', {'local': [0.4, 0.5], 'pfedes': [0.5, 0.58]})}",
                      f"500={bench('b', {'local': [0.6, 0.7], 'pfedes': [0.6, 0.72]})}"])
    assert sweep[100]["pfedes"]["gain_vs_local"]["mean"] == pytest.approx(0.09)  # +0.10 and +0.08
    assert sweep[500]["pfedes"]["gain_vs_local"]["mean"] == pytest.approx(0.01)
    assert sweep[100]["local"]["accuracy"]["mean"] == pytest.approx(0.45)
    assert sweep[500]["local"]["gain_vs_local"] is None


def test_ablation_reads_only_runs_that_reached_the_reference_rounds_and_pairs_by_seed(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from ablation import ROUNDS, accuracies, paired

    for seed, (rounds, acc) in enumerate([(ROUNDS, 0.70), (ROUNDS, 0.64), (ROUNDS - 20, 0.9)]):
        run = tmp_path / "pfedes" / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps(
            {"rounds": rounds, "acc_mean_last5": acc, "acc_worst_last5": acc - 0.1}))
    runs = accuracies(tmp_path, "pfedes", None, {})
    assert sorted(runs) == [0, 1]  # seed 2 stopped early: left out
    gain = paired({s: v["acc"] for s, v in runs.items()}, {0: 0.6, 1: 0.6, 2: 0.1})
    assert gain["mean"] == pytest.approx(0.07) and gain["by_seed"] == {0: pytest.approx(0.1), 1: pytest.approx(0.04)}
    assert paired({0: 0.5}, {1: 0.5}) is None


def test_ablation_leaves_out_a_single_setting_run_made_before_the_default_changed(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from ablation import ROUNDS, accuracies

    from pfedes.config import experiment_config

    default = experiment_config(["strategy=pfedes"])
    defaults = {seed: {"config": dict(default, out_dir=f"ref/seed{seed}")} for seed in (0, 1, 2)}
    row = {0: ["strategy.proxy_norm=none"],  # the row's one change: kept
           1: ["strategy.proxy_norm=none", "strategy.proxy_epochs=3"],  # an older default besides: left out
           2: []}  # not the row's change at all: left out
    for seed, overrides in row.items():
        run = tmp_path / "pfedes" / f"seed{seed}"
        run.mkdir(parents=True)
        config = dict(experiment_config(["strategy=pfedes", *overrides]), out_dir=str(run), run_token=str(seed))
        (run / "summary.json").write_text(json.dumps(
            {"rounds": ROUNDS, "acc_mean_last5": 0.6, "acc_worst_last5": 0.5, "config": config}))
    assert sorted(accuracies(tmp_path, "pfedes", "proxy_norm", defaults)) == [0]


def test_scale_counts_each_trained_clients_state_and_the_servers_bytes_per_known_node(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import torch
    from scale import client_state, server_state

    from pfedes.selection import ClientHistory

    state = tmp_path / "client_state"
    state.mkdir()
    for name, size in (("pfedes-p0.pt", 100), ("pfedes-p3.pt", 300), ("pfedes-p4.pt", 200),
                       ("fedavg-p1.pt", 999), ("decoded-ab.pt", 50), ("pfedes-p5.pt.x.tmp", 7)):
        (state / name).write_bytes(b"x" * size)
    got = client_state(state, "pfedes", ["phone", "gateway", "gpu-host"])
    assert got["clients_trained"] == 3 and got["client_state_bytes"] == 600
    assert got["client_state_bytes_per_trained"] == 200
    assert got["client_state_bytes_by_device"] == {"gateway": 200.0, "phone": 200.0}  # p0, p3: phone
    assert got["data_cache_files"] == 1 and got["data_cache_bytes"] == 50
    history = ClientHistory()
    for node in (11, 12):
        history.remember(node, 1.0, "phone")
    torch.save({"common": {"history": history.state_dict()}}, tmp_path / "server_checkpoint.pt")
    server = server_state(tmp_path)
    assert server["clients_known_to_server"] == 2 and 0 < server["server_bytes_per_known_client"] < 32
