"""Compressed uploads (pfedes/compression.py): round trips, bounded error, top-k with error
feedback, a residual that survives a restart, and malformed encodings rejected by the server."""

import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from conftest import make_cfg, train_reply
from pfedes.client_app import encode_upload
from pfedes.client_state import StateStore
from pfedes.compression import Codec, EncodingError, top_count
from pfedes.config import ConfigError, experiment_config
from pfedes.strategies.base import arrays_nbytes
from pfedes.strategies.pfedes import PFedES
from pfedes.trainers.pfedes import PFedESTrainer

rng = np.random.default_rng(0)
REF = {"w": rng.normal(size=(8, 27)).astype(np.float32), "b": rng.normal(size=8).astype(np.float32),
       "steps": np.array(7, np.int64)}
NEW = {"w": REF["w"] + 0.05 * rng.normal(size=(8, 27)).astype(np.float32),
       "b": REF["b"] + 0.05 * rng.normal(size=8).astype(np.float32), "steps": np.array(9, np.int64)}


def round_trip(codec, values=NEW, reference=REF, residual=None):
    encoded, kept = codec.encode(values, reference, residual or {})
    return codec.decode(encoded, reference), encoded, kept


def test_no_compression_is_inactive_and_delta_alone_is_exact():
    assert not Codec().active
    decoded, encoded, _ = round_trip(Codec(delta=True))
    assert set(encoded) == {"w|v", "b|v", "steps"}  # the counter travels as it is
    for key in NEW:
        np.testing.assert_allclose(decoded[key], NEW[key], atol=1e-6)
        assert decoded[key].dtype == NEW[key].dtype


@pytest.mark.parametrize("quantize, bound", [("fp16", 1e-3), ("int8", None), ("int8_channel", None)])
def test_quantization_error_is_bounded(quantize, bound):
    decoded, encoded, _ = round_trip(Codec(quantize=quantize))
    for key in ("w", "b"):
        err = np.abs(decoded[key] - NEW[key])
        if quantize == "fp16":
            assert err.max() <= bound * np.abs(NEW[key]).max()
        else:  # half a quantization step: (max - min) / 255 / 2 per tensor, or per slice
            rows = NEW[key].reshape(len(NEW[key]) if quantize == "int8_channel" and NEW[key].ndim > 1 else 1, -1)
            step = (rows.max(1) - rows.min(1)) / 255
            assert (err.reshape(len(step), -1) <= step[:, None] / 2 + 1e-6).all()
    assert encoded["w|v"].dtype == {"fp16": np.float16}.get(quantize, np.uint8)


def test_per_channel_int8_beats_per_tensor_on_slices_of_different_scale():
    values = {"w": (rng.normal(size=(4, 50)) * np.array([[0.01], [0.1], [1.0], [10.0]])).astype(np.float32)}
    errors = {q: np.abs(round_trip(Codec(quantize=q), values, {})[0]["w"] - values["w"])[0].max()
              for q in ("int8", "int8_channel")}
    assert errors["int8_channel"] < errors["int8"] / 100  # the small slice keeps its resolution


def test_topk_sends_the_largest_changes_and_a_mask():
    codec = Codec(topk=0.1)
    decoded, encoded, kept = round_trip(codec)
    change = NEW["w"] - REF["w"]
    count = top_count(change.size, 0.1)
    assert encoded["w|v"].shape == (count,) and encoded["w|mask"].shape == ((change.size + 7) // 8,)
    sent = decoded["w"] != REF["w"]
    assert sent.sum() == count
    assert np.abs(change[sent]).min() >= np.abs(change[~sent]).max()  # the largest in magnitude
    np.testing.assert_allclose(decoded["w"][sent], NEW["w"][sent], atol=1e-6)
    np.testing.assert_allclose(kept["w"], np.where(sent, 0.0, change), atol=1e-6)  # the rest is kept


def test_error_feedback_accumulates_until_every_change_is_sent():
    """A constant change u each round: with feedback, what arrived plus what is held back is
    exactly rounds * u, and most of it has arrived; without it, the small entries never do."""
    codec, plain = Codec(topk=0.25), Codec(topk=0.25, error_feedback=False)
    u = {"w": rng.normal(size=(5, 20)).astype(np.float32)}
    zero = {"w": np.zeros((5, 20), np.float32)}
    total, total_plain, residual = np.zeros((5, 20)), np.zeros((5, 20)), {}
    for _ in range(12):
        encoded, residual = codec.encode(u, zero, residual)
        total += codec.decode(encoded, zero)["w"]
        total_plain += plain.decode(plain.encode(u, zero, {})[0], zero)["w"]
    np.testing.assert_allclose(total + residual["w"], 12 * u["w"], rtol=1e-4, atol=1e-4)  # nothing lost
    missed = np.abs(total - 12 * u["w"]).sum()
    assert missed < 0.25 * np.abs(total_plain - 12 * u["w"]).sum()  # feedback delivers most of it
    assert (total_plain == 0).mean() >= 0.75  # without feedback three quarters never get through


def test_a_key_without_a_reference_is_sent_densely():
    decoded, encoded, _ = round_trip(Codec(topk=0.1, quantize="fp16"), reference={})
    assert "w|mask" not in encoded and encoded["w|v"].shape == NEW["w"].shape
    np.testing.assert_allclose(decoded["w"], NEW["w"], atol=1e-2)


def test_encoded_bytes_are_what_travels():
    ref = {"w": rng.normal(size=(64, 288)).astype(np.float32)}
    new = {"w": ref["w"] + rng.normal(size=(64, 288)).astype(np.float32)}
    raw = arrays_nbytes(ArrayRecord({k: torch.from_numpy(v) for k, v in new.items()}))
    for codec, at_most in [(Codec(quantize="fp16"), 0.51), (Codec(quantize="int8"), 0.26),
                           (Codec(quantize="int8", topk=0.1), 0.07)]:
        encoded, _ = codec.encode(new, ref, {})
        record = ArrayRecord({k: torch.from_numpy(v) for k, v in encoded.items()})
        assert arrays_nbytes(record) <= at_most * raw  # npy headers are counted too


def test_the_residual_is_private_state_that_survives_a_restart(tmp_path):
    cfg = make_cfg("compression.topk=0.1")
    trainer = PFedESTrainer(cfg, "cnn3", 10, seed=0)
    received = ArrayRecord({k: v.clone() for k, v in trainer.shared_state().items()})
    with torch.no_grad():
        for p in trainer.proxy.parameters():
            p.add_(0.01)
    record = encode_upload(Codec.from_cfg(cfg), trainer, trainer.shared_state(), received)
    assert trainer.upload_residual and all(torch.any(v != 0) for v in trainer.upload_residual.values())
    floating = {k for k, v in trainer.shared_state().items() if v.is_floating_point()}
    assert set(trainer.upload_residual) == floating and {f"{k}|mask" for k in floating} <= set(record)
    path = tmp_path / "state.pt"
    StateStore().save(path, trainer, 1, "run")
    restored, version = StateStore().get(path, None, lambda: PFedESTrainer(cfg, "cnn3", 10, seed=1), "run")
    assert version == 1
    for key, value in trainer.upload_residual.items():
        torch.testing.assert_close(restored.upload_residual[key], value)


@pytest.mark.parametrize("tamper, reason", [
    (lambda e: e.update({"w|v": e["w|v"].astype(np.float32)}), "dtype"),
    (lambda e: e.pop("w|q"), "parts"),
    (lambda e: e.update({"w|q": np.array([[0.0], [0.0]], np.float32)}), "non-positive scale"),
    (lambda e: e.update({"w|q": np.array([[np.nan], [0.0]], np.float32)}), "non-finite"),
    (lambda e: e.update({"w|v": e["w|v"][:-1]}), "values"),
    (lambda e: e.update({"w|mask": np.zeros(3, np.uint8)}), "mask"),
    (lambda e: e.update({"steps|v": np.zeros(1, np.uint8)}), "both raw and encoded"),
    (lambda e: e.update({"x": np.zeros(3, np.float32)}), "raw floats"),
    (lambda e: e.update({"w|z": np.zeros(3, np.uint8)}), "unknown part"),
])
def test_a_malformed_encoding_is_named(tamper, reason):
    codec = Codec(quantize="int8", topk=0.2)
    encoded, _ = codec.encode(NEW, REF, {})
    tamper(encoded)
    with pytest.raises(EncodingError, match=reason):
        codec.decode(encoded, REF)


def test_the_server_decodes_good_replies_and_drops_a_malformed_one(caplog):
    s = PFedES(make_cfg("compression.quantize=fp16", "compression.delta=true", "num_clients=3"))
    s.current = {k: v for k, v in REF.items() if k != "steps"}
    codec = s.codec
    values = {k: v for k, v in NEW.items() if k != "steps"}
    good = codec.encode(values, s.current, {})[0]
    bad = dict(good, **{"b|v": good["b|v"].astype(np.float32)})
    with caplog.at_level(logging.WARNING):
        arrays, _ = s.aggregate_train(1, [train_reply(1, good, 1, train_loss=1.0),
                                          train_reply(2, good, 1, train_loss=1.0),
                                          train_reply(3, bad, 1, train_loss=1.0)])
    assert "dropped the reply of node 3: bad encoding" in caplog.text
    np.testing.assert_allclose(arrays["w"].numpy(), values["w"], atol=1e-3)
    assert s.round_stats["clients_dropped"] == 1


@pytest.mark.parametrize("override, message", [
    ("compression.quantize=int4", "compression.quantize 'int4' is unknown"),
    ("compression.topk=0", "compression.topk must be in (0, 1], got 0"),
    ("compression.topk=1.5", "compression.topk must be in (0, 1], got 1.5"),
    ("compression.downlink=topk", "compression.downlink 'topk' is unknown: expected one of"),
])
def test_a_bad_compression_setting_is_one_line(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        experiment_config([override])


@pytest.mark.slow
def test_a_compressed_simulation_sends_fewer_bytes_and_drops_no_client(tmp_path):
    import json

    from pfedes.sim import simulate

    common = ["num_clients=3", "num_rounds=2", "data.samples_per_client=150", "strategy.warmup_steps=0"]
    first = {}
    for name, extra in [("fp32", []), ("int8_top10", ["compression.quantize=int8", "compression.topk=0.1"])]:
        simulate(make_cfg(*common, *extra, f"out_dir={tmp_path / name}"))
        rounds = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert all(r["clients_trained"] == 3 and r["clients_dropped"] == 0 for r in rounds)
        first[name] = rounds[-1]
    assert first["int8_top10"]["bytes_up_per_client"] < 0.15 * first["fp32"]["bytes_up_per_client"]
    assert first["int8_top10"]["bytes_down_per_client"] == first["fp32"]["bytes_down_per_client"]
