"""LoRA adapters: the start equals the base, only A/B train and leave the client, and the
shared factors are normalised so that clients with different alpha average correctly."""

import pytest
import torch
from torch import nn

from pfedes.models.lora import LoRA, attach_lora, lora_modules
from test_baselines_trainers import batch, make, snapshot


def test_b_starts_at_zero_a_is_gaussian_and_the_adapted_model_equals_its_base():
    base = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(5, 64)
    before = base(x)
    names = attach_lora(base, rank=8, alpha=16)
    assert names == ["0", "2"]
    for m in lora_modules(base):
        assert torch.count_nonzero(m.lora_B) == 0
        assert m.lora_A.shape[0] == 8 and m.lora_A.std().item() == pytest.approx(1 / 8, rel=0.2)
        assert m.scale == 2.0
    torch.testing.assert_close(base(x), before)
    assert {n for n, p in base.named_parameters() if p.requires_grad} == {
        f"{i}.parametrizations.weight.0.lora_{f}" for i in (0, 2) for f in "AB"}


def test_the_adapted_weight_is_w0_plus_alpha_over_r_times_b_a():
    layer = nn.Linear(6, 3)
    w0 = layer.weight.detach().clone()
    attach_lora(layer, rank=2, alpha=3)
    lora = lora_modules(layer)[0]
    with torch.no_grad():
        lora.lora_B.copy_(torch.arange(6.0).view(3, 2))
    torch.testing.assert_close(layer.weight, w0 + 1.5 * lora.lora_B.detach() @ lora.lora_A.detach())
    conv = nn.Conv2d(3, 4, 3)
    with pytest.raises(ValueError, match="no layer"):
        attach_lora(conv, rank=2, alpha=2)  # Conv2d only when asked for
    attach_lora(conv, rank=2, alpha=2, conv=True)
    assert [tuple(m.lora_A.shape) for m in lora_modules(conv)] == [(2, 27)]
    x = torch.randn(1, 3, 5, 5)
    torch.testing.assert_close(conv(x), nn.functional.conv2d(x, conv.parametrizations.weight.original, conv.bias))


def test_shared_factors_carry_no_alpha_over_r_scale_so_different_alphas_average_correctly():
    torch.manual_seed(0)
    layers = [nn.Linear(6, 3), nn.Linear(6, 3)]
    layers[1].load_state_dict(layers[0].state_dict())
    attach_lora(layers[0], rank=2, alpha=2)   # scale 1
    attach_lora(layers[1], rank=2, alpha=8)   # scale 4
    a = torch.randn(2, 6)
    deltas = [torch.ones(3, 2), 3 * torch.ones(3, 2)]  # the weight changes B' @ A each client made
    for layer, delta in zip(layers, deltas):
        m = lora_modules(layer)[0]
        with torch.no_grad():
            m.lora_A.copy_(a)
            m.lora_B.copy_(delta / m.scale)  # raw B, which the forward multiplies by the scale
        torch.testing.assert_close(layer.weight - layer.parametrizations.weight.original, delta @ a)
    states = [layer.state_dict() for layer in layers]
    key = "parametrizations.weight.0.lora_B"
    for state, delta in zip(states, deltas):
        torch.testing.assert_close(state[key], delta)  # normalised: B' = scale * B
    average = {k: (states[0][k] + states[1][k]) / 2 for k in states[0]}
    for layer in layers:  # each client loads the average and applies the same weight change
        layer.load_state_dict(average)
        torch.testing.assert_close(layer.weight - layer.parametrizations.weight.original,
                                   (deltas[0] + deltas[1]) / 2 @ a)


def test_lora_trainer_shares_only_a_and_b_and_keeps_the_base_frozen(small_data):
    trainer = make("lora", "strategy.rank=4")
    assert trainer.shared_keys and all(k.rsplit(".", 1)[1] in ("lora_A", "lora_B") for k in trainer.shared_keys)
    assert all(v.shape[1] == 4 or v.shape[0] == 4 for v in trainer.shared_state().values())
    base = {k: v for k, v in snapshot(trainer.exchange).items() if "lora_" not in k}
    trainer.load_shared(type(trainer).initial_shared(trainer.cfg, "cnn3", 10))
    trainer.fit(small_data, torch.Generator().manual_seed(0))
    after = trainer.exchange.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())
    assert any(torch.count_nonzero(v) for k, v in trainer.shared_state().items() if k.endswith("lora_B"))
    assert set(trainer.shared_state()) == set(trainer.shared_keys)


def test_every_client_builds_the_same_frozen_base_and_conv_layers_are_optional():
    a, b = make("lora", seed=1), make("lora", seed=2)
    base_a = {k: v for k, v in a.exchange.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(v, b.exchange.state_dict()[k]) for k, v in base_a.items())
    assert not any(isinstance(m, nn.Conv2d) and hasattr(m, "parametrizations") for m in a.exchange.modules())
    with_conv = make("lora", "strategy.conv=true")
    assert any(isinstance(m, nn.Conv2d) and hasattr(m, "parametrizations") for m in with_conv.exchange.modules())


def test_lora_base_can_come_from_a_checkpoint_with_the_whole_model(tmp_path):
    source = make("fedavg", seed=3)
    torch.save({"arrays": {k: v.numpy() for k, v in source.shared_state().items()}}, tmp_path / "c.pt")
    trainer = make("lora", f"strategy.base_checkpoint={tmp_path / 'c.pt'}")
    x = batch(4)[0]
    trainer.exchange.eval(), source.model.eval()
    torch.testing.assert_close(trainer.model(x), source.model(x))  # B = 0: the loaded base itself
    torch.save({"arrays": {k: v.numpy() for k, v in source.shared_state().items() if k.startswith("head.")}},
               tmp_path / "head.pt")
    with pytest.raises(ValueError, match="lacks"):
        make("lora", f"strategy.base_checkpoint={tmp_path / 'head.pt'}")


def test_lora_rejects_a_bad_rank():
    with pytest.raises(ValueError, match="rank"):
        LoRA(torch.zeros(3, 4), rank=0, alpha=1)
