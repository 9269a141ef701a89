"""Robust aggregation (pfedes/robust.py): norm- and direction-anomaly rejection, trimmed mean, median and
(Multi-)Krum through Flower's functions, with server momentum after them."""

import logging

import numpy as np
import pytest

from conftest import make_cfg, train_reply
from pfedes.config import ConfigError, experiment_config
from pfedes.robust import DirectionStrikes, Robustness, flat_update, medians_of_the_others, weighted_average
from pfedes.strategies.pfedes import PFedES

CURRENT = {"w": np.zeros((2, 3), np.float32), "n": np.array(4, np.int64)}


def client(value, n=4):
    return {"w": np.full((2, 3), value, np.float32), "n": np.array(n, np.int64)}


def strategy(*overrides, beta=0.0):
    s = PFedES(make_cfg("num_clients=5", f"strategy.server_momentum={beta}", *overrides))
    s.current = {k: v.copy() for k, v in CURRENT.items()}
    return s


def aggregate(s, values, weights=None):
    weights = weights or [1] * len(values)
    replies = [train_reply(i + 1, client(v), w, train_loss=1.0) for i, (v, w) in enumerate(zip(values, weights))]
    arrays, _ = s.aggregate_train(1, replies)
    return {k: a.numpy() for k, a in arrays.items()}


def test_flat_update_is_the_change_from_what_was_sent_over_floating_entries():
    assert np.linalg.norm(flat_update(client(2.0), CURRENT)) == pytest.approx(np.sqrt(6 * 4.0))
    assert np.linalg.norm(flat_update({"x": np.ones(4, np.float32)}, {})) == pytest.approx(2.0)  # no reference: whole


def test_a_scaled_update_is_dropped_by_name_and_the_round_goes_on(caplog):
    s = strategy()
    with caplog.at_level(logging.WARNING):
        new = aggregate(s, [1.0, 1.2, 0.8, 1.1, 100.0])
    assert "dropped the reply of node 5: update norm" in caplog.text and "norm_threshold" in caplog.text
    np.testing.assert_allclose(new["w"], np.mean([1.0, 1.2, 0.8, 1.1]), rtol=1e-6)
    assert s.round_stats["clients_dropped"] == 1 and s.round_stats["clients_trained"] == 4


def test_clients_that_changed_nothing_do_not_set_the_scale():
    # three clients still warming up (no change) and three that trained: none is an outlier
    new = aggregate(strategy(), [0.0, 0.0, 0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(new["w"], 1.0)


def test_norm_rejection_is_off_at_zero_and_with_fewer_than_three_replies():
    assert aggregate(strategy("aggregation.norm_threshold=0"), [1.0, 1.0, 100.0])["w"][0, 0] == pytest.approx(34.0)
    assert aggregate(strategy(), [1.0, 100.0])["w"][0, 0] == pytest.approx(50.5)


def noisy_updates(count, seed=0):
    """Honest updates of one 10x10 entry: a shared direction plus as much noise again."""
    rng = np.random.default_rng(seed)
    common = rng.normal(size=(10, 10))
    return [common + rng.normal(size=(10, 10)) for _ in range(count)]


def test_a_sign_flipped_update_passes_the_norm_check_and_is_dropped_by_its_direction(caplog):
    updates = noisy_updates(5)
    updates[4] = -updates[4]  # node 5 flips its update: its norm is an honest one
    replies = [train_reply(i + 1, {"w": u.astype(np.float32)}, 1, train_loss=1.0) for i, u in enumerate(updates)]

    def aggregated(*overrides):
        s = strategy(*overrides)
        s.current = {"w": np.zeros((10, 10), np.float32)}
        return s, s.aggregate_train(1, replies)[0]["w"].numpy()

    with caplog.at_level(logging.WARNING):
        s, new = aggregated("aggregation.min_cosine=0")
    assert "node 5: its update's cosine with the round's median update is -" in caplog.text
    assert "min_cosine" in caplog.text and "update norm" not in caplog.text
    np.testing.assert_allclose(new, np.mean(updates[:4], axis=0), atol=1e-5)
    assert s.round_stats["clients_dropped"] == 1 and s.round_stats["update_cosine_min"] < 0
    assert s.round_stats["update_cosines"]["5"] == pytest.approx(s.round_stats["update_cosine_min"], abs=1e-4)
    assert s.round_stats["update_cosine_floor"] == 0.0
    np.testing.assert_allclose(aggregated()[1], np.mean(updates[:4], axis=0), atol=1e-5)  # the default's floor too
    no_direction_check = ("aggregation.direction_spread=0", "aggregation.direction_strikes=0")
    np.testing.assert_allclose(aggregated(*no_direction_check)[1], np.mean(updates, axis=0), atol=1e-5)


def test_direction_outliers_are_the_cosines_with_the_others_median_below_the_threshold():
    updates = [np.array([1.0, 0.0]), np.array([2.0, 1.0]), np.array([1.0, 1.0]), np.array([-1.0, -1.0]),
               np.zeros(2)]  # the medians of the other non-zero three that sent each coordinate:
    # (1, 1), (1, 0), (1, 0), (1, 1); the first update is compared on the coordinate it sent: (1, 0)
    away, cosines, floor = Robustness(min_cosine=0.0).direction_outliers(updates)
    assert away == [3] and floor == 0.0
    np.testing.assert_allclose(cosines[:4], [1.0, 2 / np.sqrt(5), 1 / np.sqrt(2), -1.0])
    assert np.isnan(cosines[4])  # a client still warming up is never dropped
    assert Robustness(min_cosine=0.8).direction_outliers(updates)[0] == [2, 3]
    assert Robustness(min_cosine=-1.0).direction_outliers(updates)[0] == []
    assert Robustness().direction_outliers(updates[:2] + [np.zeros(2)])[0] == []  # fewer than 3 moved


def test_the_direction_spread_drops_a_cosine_far_below_the_rounds_where_a_fixed_zero_drops_honest_ones():
    """Near the plateau honest updates are near-orthogonal: their cosines with the others' median
    scatter around 0, so min_cosine=0 drops most of them; a flipped one lies far below the round's
    spread, and the floor that follows the round drops it alone."""
    rng = np.random.default_rng(0)
    noise, shared = rng.normal(size=(8, 4096)), np.ones(4096)
    updates = [noise[i] + 0.05 * shared for i in range(7)] + [-(noise[7] + shared)]
    away, cosines, floor = Robustness(direction_spread=4.0).direction_outliers(updates)
    assert away == [7] and cosines[7] < floor < min(cosines[:7])
    spread = 1.4826 * np.median(np.abs(np.array(cosines) - np.median(cosines)))
    assert floor == pytest.approx(np.median(cosines) - 4.0 * spread)
    aligned = [noise[i] + 0.5 * shared for i in range(7)] + [noise[7] + 0.1 * shared]  # agreeing, one less so
    away, cosines, floor = Robustness(direction_spread=4.0).direction_outliers(aligned)
    assert median_minus_spread(cosines, 4.0) > cosines[7] > 0 and away == [] and floor == 0.0  # never an aligned one
    assert len(Robustness(min_cosine=0.0).direction_outliers(updates)[0]) == 7  # a fixed 0 drops honest ones
    assert Robustness().direction_outliers(updates)[0] == [7]  # the default: k = 4
    assert Robustness(direction_spread=0, direction_strikes=0).direction_outliers(updates)[0] == []  # off
    assert Robustness(direction_spread=4.0).direction_outliers(updates[4:])[0] == []  # 5 cosines needed


def median_minus_spread(cosines, k):
    return np.median(cosines) - k * 1.4826 * np.median(np.abs(np.array(cosines) - np.median(cosines)))


def test_a_node_dropped_in_enough_of_its_rounds_is_quarantined_and_an_occasional_drop_is_forgiven():
    strikes = DirectionStrikes(limit=3)
    assert [strikes.record(1, True) for _ in range(3)] == [False, False, True]  # 3 of 3 rounds
    for _ in range(20):
        strikes.record(2, False)
    assert not any(strikes.record(2, True) for _ in range(3))  # 3 of 23 rounds: under a quarter
    assert strikes.quarantined == {1}
    restored = DirectionStrikes(limit=3)
    restored.load_state_dict(strikes.state_dict())
    assert (restored.quarantined, restored.strikes, restored.checked) == ({1}, strikes.strikes, strikes.checked)
    assert not any(DirectionStrikes(limit=0).record(3, True) for _ in range(10))  # 0: no memory
    half = DirectionStrikes(limit=3, share=0.5)
    assert [half.record(4, struck) for struck in (True, False, True, False, False, False, True)] == [False] * 7
    assert half.record(4, True)  # 3 of 7 is under half, 4 of 8 is half


def test_a_quarantined_node_stays_out_when_its_update_looks_honest_again_and_a_restart_keeps_it(caplog):
    """Node 5 flips for 3 rounds and is dropped each time; then it sends an honest update, which is
    set aside all the same; the record travels in the strategy's checkpointed state."""
    honest = noisy_updates(5)
    flipped = [*honest[:4], -honest[4]]

    def round_of(s, server_round, updates):
        s.current = {"w": np.zeros((10, 10), np.float32)}
        s.reset_round_stats()
        replies = [train_reply(i + 1, {"w": u.astype(np.float32)}, 1, train_loss=1.0) for i, u in enumerate(updates)]
        s.aggregate_train(server_round, replies)
        return s.round_stats["clients_dropped"]

    s = strategy("aggregation.direction_spread=0", "aggregation.min_cosine=0", "aggregation.direction_strikes=3")
    with caplog.at_level(logging.WARNING):
        assert [round_of(s, r, flipped) for r in (1, 2, 3)] == [1, 1, 1]
    assert "node 5 is quarantined for the rest of the run" in caplog.text
    assert round_of(s, 4, honest) == 1
    resumed = strategy("aggregation.min_cosine=0", "aggregation.direction_strikes=3")
    resumed.load_common_state_dict(s.common_state_dict())
    assert round_of(resumed, 5, honest) == 1
    assert round_of(strategy("aggregation.min_cosine=0", "aggregation.direction_strikes=3"), 1, honest) == 0



def test_with_a_strike_spread_a_round_far_below_the_median_counts_against_a_node_though_not_dropped():
    """Under strong label skew a flipped update can stay within the k spreads the check drops at;
    with `strike_spread` s such a round still counts toward the quarantine, and one at or above 0
    never does."""
    cosines = [0.10, 0.12, 0.08, 0.11, 0.09, 0.10, -0.02, float("nan")]  # median 0.10, spread 0.0148
    robust = Robustness(direction_spread=10.0, strike_spread=2.0)
    assert robust.strikes(cosines, away=[]) == [False] * 6 + [True, False]  # -0.02 < min(0, 0.10 - 2 x 0.0148)
    assert robust.strikes([c + 0.05 for c in cosines], away=[]) == [False] * 8  # 0.03 points toward the others
    assert Robustness().strikes(cosines, away=[2]) == [False, False, True] + [False] * 5  # 0: the drops alone
    assert robust.strikes(cosines[4:], away=[]) == [False] * 4  # 5 finite cosines needed for a spread


def test_a_node_far_below_the_round_in_its_rounds_is_quarantined_though_never_dropped(caplog):
    honest = noisy_updates(5)
    flipped = [*honest[:4], -honest[4]]

    def dropped(*overrides):
        s = strategy("aggregation.direction_spread=100", *overrides)  # the spread check drops nothing
        counts = []
        for server_round in (1, 2, 3, 4):
            s.current = {"w": np.zeros((10, 10), np.float32)}
            s.reset_round_stats()
            s.aggregate_train(server_round, [train_reply(i + 1, {"w": u.astype(np.float32)}, 1, train_loss=1.0)
                                             for i, u in enumerate(flipped)])
            counts.append(s.round_stats["clients_dropped"])
        return counts

    assert dropped() == [0, 0, 0, 0]
    with caplog.at_level(logging.WARNING):
        assert dropped("aggregation.strike_spread=2") == [0, 0, 0, 1]  # quarantined in round 3, set aside from 4
    assert "node 5 is quarantined for the rest of the run: the direction check counted 3 of its 3 rounds" in caplog.text

def test_the_medians_of_the_others_come_from_one_sort():
    rng = np.random.default_rng(1)
    for n in (3, 4, 7):
        stacked = rng.normal(size=(n, 5))
        stacked[:, 0] = 1.0  # ties
        expected = [np.median(np.delete(stacked, i, axis=0), axis=0) for i in range(n)]
        np.testing.assert_allclose(medians_of_the_others(stacked), expected)


def test_the_medians_of_the_others_count_only_the_rows_that_sent_a_coordinate():
    rng = np.random.default_rng(2)
    for n in (3, 4, 7, 10):
        stacked = rng.normal(size=(n, 40))
        stacked[:, 0] = 1.0  # ties
        stacked[rng.random(stacked.shape) < 0.6] = 0.0  # not sent
        stacked[:, 1] = 0.0  # sent by nobody
        stacked[1:, 2] = 0.0  # by one row only: nobody else sent it
        expected = [[np.median(col[col != 0]) if np.any(col) else 0.0 for col in np.delete(stacked, i, axis=0).T]
                    for i in range(n)]
        np.testing.assert_allclose(medians_of_the_others(stacked), expected)


def top_share(update: np.ndarray, share: float) -> np.ndarray:
    """The update with all but its largest `share` of entries (by magnitude) set to 0, as top-k sends it."""
    return np.where(np.abs(update) >= np.quantile(np.abs(update), 1 - share), update, 0.0)


def test_top_k_sparse_updates_are_compared_on_what_they_sent():
    """Top-10 % updates near the plateau, where honest ones are near-orthogonal: against the plain
    median of the others (0 almost everywhere) their cosines lie at 0, and the round's floor
    (capped at 0) dropped 8 of these 100 honest replies; compared on the coordinates each sent, with
    the median of the others that sent them, none is dropped. Where the clients agree, two
    sign-flipped ones stand out (against the plain median, all ten cosines lay within 0.03 of 0)."""
    rng = np.random.default_rng(3)
    honest_drops = sum(len(Robustness().direction_outliers([top_share(u, 0.1) for u in rng.normal(size=(10, 20000))])[0])
                       for _ in range(10))
    assert honest_drops == 0
    noise, shared = rng.normal(size=(10, 20000)), rng.normal(size=20000)
    flipped = [top_share(noise[i] + 0.3 * shared, 0.1) for i in range(8)] + [
        top_share(-(noise[i] + 0.3 * shared), 0.1) for i in (8, 9)]
    away, cosines, _ = Robustness().direction_outliers(flipped)
    assert away == [8, 9] and min(cosines[:8]) > 0.1 and max(cosines[8:]) < -0.1


def test_clusters_whose_updates_oppose_each_other_are_not_a_direction_anomaly():
    """CFL splits its clients exactly on opposing updates, and per-class payloads are not updates."""
    from pfedes.strategies.cfl import ClusteredFL
    from pfedes.strategies.fedproto import FedProto

    assert not ClusteredFL.one_consensus and not FedProto.replies_start_from_sent
    assert PFedES.one_consensus and PFedES.replies_start_from_sent


def test_trimmed_mean_and_median_per_coordinate_on_hand_computed_numbers():
    values = [0.0, 1.0, 2.0, 3.0, -50.0]  # a sign-flipped, scaled update the anomaly checks let through when off
    off = ("aggregation.norm_threshold=0", "aggregation.min_cosine=-1")
    trimmed = aggregate(strategy("aggregation.rule=trimmed_mean", "aggregation.trim_fraction=0.2", *off), values)
    np.testing.assert_allclose(trimmed["w"], 1.0)  # cut -50 and 3: mean of 0, 1, 2
    median = aggregate(strategy("aggregation.rule=median", *off), values)
    np.testing.assert_allclose(median["w"], 1.0)
    assert median["n"].dtype == np.int64 and median["n"] == 4  # counters are rounded back


def test_momentum_is_applied_after_the_robust_rule():
    new = aggregate(strategy("aggregation.rule=median", "aggregation.norm_threshold=0", beta=0.5),
                    [2.0, 2.0, 2.0, 40.0])
    np.testing.assert_allclose(new["w"], 0.5 * 0.0 + 0.5 * 2.0)


def test_krum_picks_a_central_reply_and_multikrum_averages_the_closest():
    arrays = [client(v) for v in (1.0, 1.1, 0.9, 1.05, 30.0)]
    krum = Robustness(rule="krum", num_malicious=1)
    assert krum.krum_selection(arrays) in ([0], [3])  # the reply closest to the others
    multi = Robustness(rule="multikrum", num_malicious=1)
    assert multi.krum_selection(arrays) == [0, 1, 2, 3]
    np.testing.assert_allclose(multi.combine(arrays, [1] * 5)["w"], np.mean([1.0, 1.1, 0.9, 1.05]), rtol=1e-6)


def test_the_mean_rule_is_the_sample_weighted_average():
    arrays = [client(1.0), client(3.0)]
    np.testing.assert_allclose(Robustness().combine(arrays, [1, 3])["w"], 2.5)
    np.testing.assert_allclose(weighted_average(arrays, [1, 3])["w"], 2.5)


@pytest.mark.parametrize("override, message", [
    ("aggregation.rule=mode", "aggregation.rule 'mode' is unknown"),
    ("aggregation.trim_fraction=0.5", r"aggregation.trim_fraction must be in \[0, 0.5\), got 0.5"),
    ("aggregation.num_malicious=-1", "aggregation.num_malicious must be an integer >= 0, got -1"),
    ("aggregation.norm_threshold=0.5", r"aggregation.norm_threshold must be 0 \(off\) or > 1, got 0.5"),
    ("aggregation.min_cosine=1", r"aggregation.min_cosine must be in \[-1, 1\) \(-1: off\), got 1"),
    ("aggregation.min_cosine=-1.5", r"aggregation.min_cosine must be in \[-1, 1\) \(-1: off\), got -1.5"),
    ("aggregation.direction_spread=-1", r"aggregation.direction_spread must be >= 0 \(0: off\), got -1"),
    ("aggregation.direction_strikes=-1", r"aggregation.direction_strikes must be an integer >= 0, got -1"),
    ("aggregation.strike_share=0", r"aggregation.strike_share must be in \(0, 1\], got 0"),
    ("aggregation.strike_spread=-1", r"aggregation.strike_spread must be >= 0 \(0: only drops count\), got -1"),
    ("aggregation.direction_strikes=0 aggregation.strike_spread=2",
     r"aggregation.strike_spread = 2.0 decides which rounds count toward direction_strikes, which is off"),
    ("aggregation.groups=region", "aggregation.groups 'region' is unknown"),
    ("aggregation.group_weighting=loss", "aggregation.group_weighting 'loss' is unknown"),
    ("aggregation.weighting=loss", "aggregation.weighting 'loss' is unknown"),
    ("aggregation.temperature=0", "aggregation.temperature must be > 0, got 0"),
])
def test_a_bad_aggregation_setting_is_one_line(override, message):
    with pytest.raises(ConfigError, match=message):
        experiment_config(override.split())


def test_strikes_without_a_direction_check_are_refused():
    with pytest.raises(ValueError, match=r"aggregation.direction_strikes = 3 counts the drops of a direction check and none is on"):
        experiment_config(["aggregation.direction_spread=0"])



DIRICHLET = ["data.partition=dirichlet", "data.alpha=1.0"]  # honest updates share a direction


@pytest.mark.slow
def test_a_scaled_attacker_wrecks_the_undefended_run_and_the_default_drops_it_and_a_flipping_one(tmp_path):
    """benchmarks/poisoning.py's attacker ClientApp, 4 clients, 2 rounds, partition 0 attacking."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import poisoning

    common = ["num_clients=4", "num_rounds=2", "data.samples_per_client=120", "strategy.warmup_steps=0",
              "data.path=embedded"]
    undefended = poisoning.run_condition("scale", "none", 0, [0], tmp_path, common)
    defended = poisoning.run_condition("scale", "default", 0, [0], tmp_path, common)
    assert [r["clients_dropped"] for r in undefended] == [0, 0]
    assert [r["clients_dropped"] for r in defended] == [1, 1]
    assert defended[-1]["acc_mean"] > undefended[-1]["acc_mean"] + 0.2
    flipped = poisoning.run_condition("flip", "direction", 0, [0], tmp_path, [*common, *DIRICHLET])
    assert [r["clients_dropped"] for r in flipped] == [1, 1]
    assert all(r["update_cosine_min"] < 0 for r in flipped)


def test_poisoning_takes_the_norm_check_clean_run_from_the_reference_table_and_nothing_else(tmp_path, monkeypatch):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import poisoning
    from _common import experiment

    overrides = ["num_rounds=2", "data.path=embedded"]
    reference = tmp_path / "reference" / "pfedes" / "seed0"
    reference.mkdir(parents=True)
    (reference / "summary.json").write_text(json.dumps(
        {"config": experiment(overrides, seed=0, out_dir=str(reference))}))
    (reference / "metrics.jsonl").write_text("\n".join(json.dumps({"round": r, "acc_mean": 0.5}) for r in (1, 2)))
    monkeypatch.setattr(poisoning, "REFERENCE_BENCH", tmp_path / "reference")
    simulated = []
    monkeypatch.setattr("pfedes.sim.simulate", lambda cfg, **_: simulated.append(cfg) or (_ for _ in ()).throw(
        RuntimeError("simulated")))
    # the reference table was made with the norm check alone (its config has no direction check keys)
    saved = json.loads((reference / "summary.json").read_text())
    for entry in ("direction_spread", "direction_strikes"):
        del saved["config"]["aggregation"][entry]
    (reference / "summary.json").write_text(json.dumps(saved))
    assert [r["round"] for r in poisoning.run_condition("clean", "norm_check", 0, [0], tmp_path / "out",
                                                        overrides)] == [1, 2]
    assert simulated == []
    for attack, defence, extra in [("clean", "default", []), ("flip", "norm_check", []), ("clean", "multikrum", []),
                                   ("clean", "norm_check", ["num_rounds=3"])]:
        with pytest.raises(RuntimeError, match="simulated"):
            poisoning.run_condition(attack, defence, 0, [0], tmp_path / "out", [*overrides, *extra])
    assert len(simulated) == 4


def test_poisoning_runs_the_chosen_conditions_beside_the_clean_default(tmp_path, monkeypatch):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import poisoning

    ran = []
    # per client (partitions 0-2; partition 0 attacks): the attacker loses 9 points, the others 3
    by_client = {("clean", "default"): [0.6, 0.6, 0.6], ("flip", "default"): [0.51, 0.57, 0.57]}
    monkeypatch.setattr(poisoning, "run_condition", lambda attack, defence, seed, *_: ran.append(
        (attack, defence, seed)) or [{"acc_mean": float(np.mean(by_client[attack, defence])), "clients_dropped": 0,
                                      "acc_by_client": dict(enumerate(by_client[attack, defence]))}] * 5)
    poisoning.main(["--seeds", "0", "1", "--attackers", "0", "--conditions", "flip:default", "--out", str(tmp_path),
                    "num_rounds=60"])
    assert ran == [("clean", "default", 0), ("flip", "default", 0), ("clean", "default", 1), ("flip", "default", 1)]
    result = json.loads((tmp_path / "poisoning.json").read_text())
    assert [(s["attack"], s["defence"]) for s in result["summary"]] == [("clean", "default"), ("flip", "default")]
    assert result["summary"][1]["vs_clean_mean"] == pytest.approx(-5.0)
    assert result["summary"][1]["honest_acc_mean"] == pytest.approx(57.0)
    assert result["summary"][1]["honest_vs_clean_mean"] == pytest.approx(-3.0)
    assert "--conditions flip:default" in result["command"] and result["command"].endswith("num_rounds=60")


def device_reply(node, value, device, n=1):
    from flwr.app import ConfigRecord

    reply = train_reply(node, client(value), n, train_loss=1.0)
    reply.content["info"] = ConfigRecord({"device": device, "arch": f"net-{device}", "partition-id": node})
    return reply


def test_two_tier_aggregation_lets_a_few_clients_of_one_profile_weigh_as_much_as_many():
    """Three phones at 1.0 and one gpu-host at 5.0: flat mean 2.0; by device with equal group
    weights (1.0 + 5.0) / 2 = 3.0; with the groups weighted by samples, the flat mean again."""
    fleet = [(1, 1.0, "phone"), (2, 1.0, "phone"), (3, 1.0, "phone"), (4, 5.0, "gpu-host")]
    results = {}
    for name, extra in [("flat", []), ("equal", ["aggregation.groups=device"]),
                        ("samples", ["aggregation.groups=arch", "aggregation.group_weighting=samples"])]:
        s = strategy("aggregation.norm_threshold=0", *extra)
        arrays, _ = s.aggregate_train(1, [device_reply(*client_spec) for client_spec in fleet])
        results[name] = float(arrays["w"].numpy()[0, 0])
    assert results == pytest.approx({"flat": 2.0, "equal": 3.0, "samples": 2.0})


def test_two_tier_applies_the_robust_rule_inside_each_group():
    arrays = [client(v) for v in (1.0, 1.2, 100.0, 3.0)]
    robust = Robustness(rule="median", groups="device")
    combined = robust.combine(arrays, [1, 1, 1, 1], ["phone", "phone", "phone", "gateway"])
    np.testing.assert_allclose(combined["w"], (1.2 + 3.0) / 2)  # the phones' median, then the groups' mean


def scored(node, value, score, n=1):
    return train_reply(node, client(value), n, train_loss=1.0, val_score=score)


def test_val_score_weighting_is_a_softmax_over_the_clipped_scores():
    s = strategy("data.val_fraction=0.15", "aggregation.weighting=val_score", "aggregation.temperature=0.5",
                 "aggregation.norm_threshold=0")
    arrays, _ = s.aggregate_train(1, [scored(1, 0.0, 0.2, n=100), scored(2, 1.0, 0.7), scored(3, 2.0, 5.0)])
    w = np.exp(np.array([0.2, 0.7, 1.0]) / 0.5)  # 5.0 is clipped to 1.0; samples do not count
    np.testing.assert_allclose(arrays["w"].numpy(), (w @ [0.0, 1.0, 2.0]) / w.sum(), rtol=1e-6)


def test_a_missing_or_non_finite_score_drops_the_reply(caplog):
    s = strategy("data.val_fraction=0.15", "aggregation.weighting=val_score", "aggregation.norm_threshold=0")
    with caplog.at_level(logging.WARNING):
        arrays, _ = s.aggregate_train(1, [scored(1, 1.0, 0.5), scored(2, 9.0, float("nan")),
                                          train_reply(3, client(9.0), 1, train_loss=1.0)])
    np.testing.assert_allclose(arrays["w"].numpy(), 1.0)
    assert "node 2: 'val_score' is nan" in caplog.text and "node 3: 'val_score' is None" in caplog.text


def test_val_score_weighting_needs_a_validation_split_and_an_array_averaging_method():
    from pfedes.server_app import check_method_settings

    with pytest.raises(ConfigError, match="aggregation.weighting=val_score needs a validation split"):
        experiment_config(["aggregation.weighting=val_score"])
    with pytest.raises(ConfigError, match="strategy 'fedproto' averages per class"):
        check_method_settings(make_cfg("strategy=fedproto", "data.val_fraction=0.15", "aggregation.weighting=val_score"))


def test_a_client_reports_its_validation_score_when_the_server_weighs_by_it():
    from pfedes.client_round import build_trainer, train_round
    from pfedes.data import load_client_data

    cfg = make_cfg("strategy=local", "data.val_fraction=0.15", "aggregation.weighting=val_score")
    data = load_client_data("embedded", "pathological", 3, 0, 0, 2, 0.3, 120, 0.2, val_fraction=0.15)
    _, metrics = train_round(build_trainer(cfg, "cnn3", 10, 0), {}, data, cfg, 0, 1)
    assert 0.0 <= metrics["val_score"] <= 1.0
    assert "val_score" not in train_round(build_trainer(make_cfg("strategy=local"), "cnn3", 10, 0), {}, data,
                                          make_cfg("strategy=local"), 0, 1)[1]


def quality_reply(node, value, fqi, dist, n=1):
    return train_reply(node, client(value), n, train_loss=1.0, fqi=fqi, label_dist=dist)


def test_quality_weighting_blends_sample_weights_with_fqi_and_dli_on_hand_computed_numbers():
    from pfedes.contribution import quality_weights

    metrics = [{"fqi": 0.5, "label_dist": [1.0, 0.0]}, {"fqi": 2.0, "label_dist": [0.5, 0.5]}]
    weights = quality_weights([1.0, 3.0], metrics, blend=0.4)
    federation = np.array([0.25 + 0.375, 0.375])  # (1 * [1, 0] + 3 * [.5, .5]) / 4
    kl = [np.log(1.0 / federation[0]), 0.5 * np.log(0.5 / federation[0]) + 0.5 * np.log(0.5 / federation[1])]
    q = 0.6 * np.array([0.5, 1.0]) + 0.4 * np.exp(-np.array(kl))  # fqi 2.0 is clipped to 1
    expected = 0.6 * np.array([0.25, 0.75]) + 0.4 * q / q.sum()
    np.testing.assert_allclose(weights, expected)
    assert sum(weights) == pytest.approx(1.0)
    np.testing.assert_allclose(quality_weights([1.0, 3.0], metrics, blend=0.0), [0.25, 0.75])


def test_quality_weighting_drops_a_reply_with_a_bad_report(caplog):
    s = strategy("aggregation.weighting=quality", "aggregation.norm_threshold=0")
    s.num_classes = 2
    with caplog.at_level(logging.WARNING):
        arrays, metrics = s.aggregate_train(1, [
            quality_reply(1, 1.0, 0.5, [0.5, 0.5]), quality_reply(2, 9.0, float("inf"), [0.5, 0.5]),
            quality_reply(3, 9.0, 0.5, [0.2, 0.3, 0.5]), quality_reply(4, 9.0, 0.5, [-1.0, 2.0]),
            train_reply(5, client(9.0), 1, train_loss=1.0)])
    np.testing.assert_allclose(arrays["w"].numpy(), 1.0)
    assert "node 2: 'fqi' is inf" in caplog.text and "node 5: 'fqi' is None" in caplog.text
    assert "node 3: 'label_dist' is not a list of 2" in caplog.text and "node 4: 'label_dist' has a negative" in caplog.text
    assert "label_dist" not in dict(metrics)  # a report, not a figure the round averages


def test_quality_weighting_needs_a_shared_feature_extractor_and_a_blend_in_range():
    from pfedes.server_app import check_method_settings

    with pytest.raises(ConfigError, match="aggregation.quality_blend must be in \\[0, 1\\], got 1.5"):
        experiment_config(["aggregation.weighting=quality", "aggregation.quality_blend=1.5"])
    with pytest.raises(ConfigError, match="aggregation.weighting=quality: strategy 'fedavg' shares no feature"):
        check_method_settings(make_cfg("strategy=fedavg", "clients.devices=[phone]", "aggregation.weighting=quality"))
    check_method_settings(make_cfg("strategy=pfedes", "aggregation.weighting=quality"))


def test_a_pfedes_client_reports_fqi_and_its_label_distribution_under_quality_weighting():
    from pfedes.client_round import build_trainer, train_round
    from pfedes.contribution import feature_quality
    from pfedes.data import load_client_data

    cfg = make_cfg("strategy=pfedes", "aggregation.weighting=quality")
    data = load_client_data("embedded", "pathological", 3, 0, 0, 2, 0.3, 120, 0.2)
    trainer = build_trainer(cfg, "cnn3", 10, 0)
    _, metrics = train_round(trainer, trainer.shared_state(), data, cfg, 0, 1)
    assert 0.0 <= metrics["fqi"] <= 1.0
    counts = np.bincount(data.y_train.numpy(), minlength=10)
    np.testing.assert_allclose(metrics["label_dist"], counts / counts.sum())
    # identical features within each class are perfectly compact
    trainer.shared_features = lambda x: x.float().mean(dim=(2, 3)) * 0 + 1.0
    assert feature_quality(trainer, data.x_train, data.y_train) == pytest.approx(1.0)


def test_poisoning_outlier_shares_count_each_nodes_rounds_far_below_the_round_median():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import poisoning

    honest = {str(n): -0.1 + 0.01 * n for n in range(2, 10)}  # median ~ -0.055, spread ~ 0.03
    rounds = [{"update_cosines": {**honest, "0": -0.5, "1": -0.5 if r % 2 else -0.06}} for r in range(4)]
    rounds += [{"update_cosines": None}, {"update_cosines": {"0": -0.9, "1": 0.0, "2": 0.1, "3": 0.2}}]  # unchecked
    shares = poisoning.outlier_shares(rounds)
    assert shares[0] == 1.0 and shares[1] == 0.5 and all(shares[n] == 0.0 for n in range(2, 10))
    assert poisoning.outlier_summary(rounds, [0]) == {"outlier_share_attackers": 1.0, "outlier_share_honest_max": 0.5}
    assert poisoning.outlier_summary([{"update_cosines": None}], [0]) == {
        "outlier_share_attackers": None, "outlier_share_honest_max": None}
    assert poisoning.by_seed([{"x": 0.5}, {"x": None}], "x") == "0.50 / -"


def test_poisoning_replays_the_memory_with_a_strike_spread_on_a_runs_recorded_cosines():
    """How STRIKE_SPREAD is chosen on a tuning seed: the recorded drops alone give the run's own
    quarantines; with a strike spread, rounds far below the median count as well."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import poisoning

    honest = {str(n): -0.1 + 0.01 * n for n in range(2, 10)}  # median ~ -0.055, spread ~ 0.03
    rounds = [{"round": r + 1, "update_cosine_floor": -0.6,  # node 0 far below, but above the floor
               "update_cosines": {**honest, "0": -0.5, "1": -0.7 if r == 0 else -0.06}} for r in range(4)]
    assert poisoning.replayed_quarantines(rounds, 0.0) == {}  # node 1 dropped once: forgiven
    assert poisoning.replayed_quarantines(rounds, 2.0) == {0: 3}  # 3 rounds of 3 count against node 0
    assert poisoning.replayed_quarantines(rounds, 0.0, strike_share=0.5) == {}
    for r in rounds[:3]:
        r["update_cosine_floor"] = -0.4  # node 0 dropped in rounds 1-3
    assert poisoning.replayed_quarantines(rounds, 0.0) == {0: 3}
