"""Client side of the FedAvg family (FedAvg, FedProx, FedBN, FedPer, FedRep, CFL): each
trainer's defining property, and what leaves the client."""

import pytest
import torch
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _NormBase

from conftest import make_cfg
from pfedes.methods import method_of

HOMOGENEOUS = ["fedavg", "fedprox", "fedbn", "fedper", "fedrep", "ditto", "apfl", "pfedme", "perfedavg",
               "lora", "cfl"]


def make(name, *overrides, arch="cnn3", seed=0):
    cfg = make_cfg(f"strategy={name}", *overrides)
    return method_of(cfg).trainer(cfg, arch, num_classes=10, seed=seed)


def batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed(before, module):
    after = module.state_dict()
    return {k for k in before if not torch.equal(before[k], after[k])}


def bn_keys(trainer):
    norms = {n for n, m in trainer.exchange.named_modules() if isinstance(m, _NormBase)}
    return {k for k in trainer.exchange.state_dict() if k.rsplit(".", 1)[0] in norms}


@pytest.mark.parametrize("name", HOMOGENEOUS)
def test_homogeneous_methods_need_one_architecture_and_never_ship_the_pfedes_projection(name):
    trainer = make(name)
    assert type(trainer).requires_same_architecture
    assert trainer.shared_keys and not any(k.startswith("projection.") for k in trainer.shared_keys)


def test_only_methods_whose_shared_entries_form_a_whole_model_claim_a_global_model():
    flags = {name: method_of(make_cfg(f"strategy={name}")).trainer.has_global_model
             for name in HOMOGENEOUS}
    assert {n for n, f in flags.items() if not f} == {"fedbn", "fedper", "fedrep", "cfl"}


def test_fedavg_shares_the_whole_model_including_batchnorm():
    trainer = make("fedavg", arch="resnet_bn")
    assert set(trainer.shared_keys) == set(trainer.exchange.state_dict())
    assert bn_keys(trainer) <= set(trainer.shared_keys)


def test_fedprox_gradient_is_the_cross_entropy_gradient_plus_mu_times_w_minus_w_global(monkeypatch):
    mu = 0.5
    trainer = make("fedprox", f"strategy.mu={mu}")
    trainer.begin_round()  # w_global = the model as received
    w_global = {k: p.detach().clone() for k, p in trainer.model.named_parameters()}
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    x, y = batch()
    trainer.model.zero_grad()
    F.cross_entropy(trainer.model(x), y).backward()
    ce_grad = {k: p.grad.clone() for k, p in trainer.model.named_parameters()}
    monkeypatch.setattr(trainer.optimizer, "step", lambda *a, **k: None)
    trainer.train_step(x, y)
    for k, p in trainer.model.named_parameters():
        torch.testing.assert_close(p.grad, ce_grad[k] + mu * (p.detach() - w_global[k]))


def test_fedprox_term_covers_shared_parameters_only_never_batchnorm_statistics(monkeypatch):
    from dataclasses import replace

    from pfedes.methods import METHODS

    trainer = make("fedprox", arch="resnet_bn")
    prox = set(trainer.proximal_parameters())
    assert prox == {k for k, _ in trainer.exchange.named_parameters()}
    assert not any("running_" in k or "num_batches_tracked" in k for k in prox)
    # FedProx with FedBN's filter: a method registered for this test only
    monkeypatch.setitem(METHODS, "fedprox_no_bn", replace(METHODS["fedprox"], name="fedprox_no_bn",
                                                          share=("all", "no-bn")))
    no_bn = make("fedprox", "strategy.method=fedprox_no_bn", arch="resnet_bn")
    assert not (set(no_bn.proximal_parameters()) & bn_keys(no_bn))


def test_fedbn_replies_contain_no_batchnorm_key(small_data):
    trainer = make("fedbn", arch="resnet_bn")
    bn = bn_keys(trainer)
    assert bn and any(k.endswith("running_mean") for k in bn)
    trainer.fit(small_data, torch.Generator().manual_seed(0))
    sent = set(trainer.shared_state())
    assert sent and not (sent & bn)
    assert sent == set(trainer.exchange.state_dict()) - bn


@pytest.mark.parametrize("name", ["fedper", "fedrep"])
def test_fedper_and_fedrep_share_the_backbone_and_keep_the_head(name):
    trainer = make(name)
    assert set(trainer.shared_keys) == {f"backbone.{k}" for k in trainer.model.backbone.state_dict()}


def test_fedrep_head_does_not_change_during_the_body_phase_nor_the_body_during_the_head_phase():
    trainer = make("fedrep")  # momentum and weight decay on: a frozen part must still not move
    x, y = batch()
    trainer.set_phase("head")
    body, head = snapshot(trainer.model.backbone), snapshot(trainer.model.head)
    trainer.train_step(x, y)
    assert not changed(body, trainer.model.backbone) and changed(head, trainer.model.head)
    trainer.set_phase("body")
    body, head = snapshot(trainer.model.backbone), snapshot(trainer.model.head)
    for _ in range(2):  # the head's momentum buffer is non-zero now
        trainer.train_step(x, y)
    assert not changed(head, trainer.model.head) and changed(body, trainer.model.backbone)


def test_fedrep_round_trains_the_head_first_then_the_body(small_data, monkeypatch):
    trainer = make("fedrep", "strategy.head_epochs=2", "train.local_epochs=1")
    phases = []
    step = trainer.train_step
    monkeypatch.setattr(trainer, "train_step", lambda x, y: phases.append(trainer.phase) or step(x, y))
    metrics = trainer.fit(small_data, torch.Generator().manual_seed(0))
    per_epoch = phases.count("body")
    assert per_epoch > 0 and phases == ["head"] * (2 * per_epoch) + ["body"] * per_epoch
    assert {"head_loss", "train_loss"} <= set(metrics)


def test_fedrep_head_optimizer_state_survives_persistence():
    trainer = make("fedrep")
    trainer.set_phase("head")
    trainer.train_step(*batch())
    restored = make("fedrep", seed=5)
    restored.load_state_dict(trainer.state_dict())
    assert restored.head_optimizer.state_dict()["state"].keys() == trainer.head_optimizer.state_dict()["state"].keys()
