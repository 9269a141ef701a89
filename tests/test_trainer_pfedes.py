"""The client side of pFedES in its seed form: what each step touches, and what leaves the client."""

import torch

from conftest import make_cfg
from pfedes.trainers.pfedes import PFedESTrainer


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed(before, module):
    after = module.state_dict()
    return {k for k in before if not torch.equal(before[k], after[k])}


def make_trainer(arch="cnn3", **over):
    cfg = make_cfg("strategy=pfedes_seed", *(f"strategy.{k}={v}" for k, v in over.items()))
    trainer = PFedESTrainer(cfg, arch, num_classes=10, seed=0)
    trainer.begin_round()
    return trainer


def test_private_step_leaves_the_proxy_untouched_and_proxy_step_leaves_the_model_untouched(monkeypatch):
    trainer = make_trainer(warmup_steps=0)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    proxy_before, model_before = snapshot(trainer.proxy), snapshot(trainer.model)
    # Run steps 1-3 alone: stop the proxy's own optimizer.
    monkeypatch.setattr(trainer.proxy_optimizer, "step", lambda *a, **k: None)
    trainer.train_step(x, y)
    assert not changed(proxy_before, trainer.proxy)
    moved = changed(model_before, trainer.model)
    assert {k.split(".")[0] for k in moved} == {"backbone", "head", "projection"}
    monkeypatch.undo()
    # Step 4 alone: stop the private optimizer.
    trainer = make_trainer(warmup_steps=0)
    proxy_before, model_before = snapshot(trainer.proxy), snapshot(trainer.model)
    monkeypatch.setattr(trainer.optimizer, "step", lambda *a, **k: None)
    trainer.train_step(x, y)
    assert not changed(model_before, trainer.model)
    assert changed(proxy_before, trainer.proxy)


def test_warmup_freezes_the_backbone_and_the_proxy():
    trainer = make_trainer(warmup_steps=5)
    model_before, proxy_before = snapshot(trainer.model), snapshot(trainer.proxy)
    trainer.train_step(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    moved = changed(model_before, trainer.model)
    assert {k.split(".")[0] for k in moved} == {"head", "projection"}
    assert not changed(proxy_before, trainer.proxy)


def test_the_alignment_gradient_reaches_the_backbone_only_through_the_projection():
    trainer = make_trainer(warmup_steps=0, lam=1.0)
    x = torch.randn(4, 3, 32, 32)
    z = trainer.model.backbone(x)
    with torch.no_grad():
        target = trainer.proxy(x)
    torch.nn.functional.mse_loss(trainer.model.projection(z), target).backward()
    assert all(p.grad is None for p in trainer.proxy.parameters())
    assert trainer.model.projection[0].weight.grad is not None


def test_reply_holds_only_proxy_keys(small_data):
    for arch in ("cnn3", "resnet_bn", "vit_small"):
        trainer = make_trainer(arch)
        shared = trainer.shared_state()
        assert shared and all(k.startswith("proxy.") for k in shared)
        assert set(shared) == {f"proxy.{k}" for k in trainer.proxy.state_dict()}
    trainer.fit(small_data, torch.Generator().manual_seed(0))
    assert all(k.startswith("proxy.") for k in trainer.shared_state())


def test_all_devices_share_the_same_proxy_keys_and_shapes():
    shapes = [{k: tuple(v.shape) for k, v in make_trainer(a).shared_state().items()}
              for a in ("cnn3", "resnet_bn", "vit_small", "mobilenet_v3_small")]
    assert all(s == shapes[0] for s in shapes)


def test_private_state_round_trips_bit_for_bit(small_data):
    trainer = make_trainer("resnet_bn")
    trainer.fit(small_data, torch.Generator().manual_seed(0))
    clone = make_trainer("resnet_bn")
    clone.load_state_dict(trainer.state_dict())
    for k, v in trainer.exchange.state_dict().items():
        assert torch.equal(v, clone.exchange.state_dict()[k])
    assert clone.steps == trainer.steps
