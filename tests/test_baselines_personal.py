"""Client side of the personal-model baselines (Ditto, APFL, pFedMe, Per-FedAvg): each
trainer's defining update, checked against the formula, and what leaves the client."""

import copy

import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F

from test_baselines_trainers import batch, make, snapshot

EXACT = ("train.momentum=0", "train.weight_decay=0")  # plain SGD, so updates follow the formulas


def perturb(module, scale=0.02, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("name", ["ditto", "apfl", "pfedme"])
def test_the_personal_model_never_leaves_the_client(name, small_data):
    trainer = make(name)
    trainer.fit(small_data, torch.Generator().manual_seed(0))
    assert set(trainer.shared_state()) == set(trainer.model.state_dict())
    assert "personal" in trainer.private and not any(k.startswith("personal") for k in trainer.shared_keys)
    restored = make(name, seed=7)
    restored.load_state_dict(trainer.state_dict())
    for k, v in trainer.private.state_dict().items():
        torch.testing.assert_close(restored.private.state_dict()[k], v)


# -- Ditto ------------------------------------------------------------------------------------
def test_ditto_personal_gradient_includes_lam_times_v_minus_the_received_global(monkeypatch):
    lam = 0.7
    trainer = make("ditto", f"strategy.lam={lam}")
    trainer.begin_round()
    received = {k: p.detach().clone() for k, p in trainer.model.named_parameters()}
    torch.testing.assert_close(snapshot(trainer.personal)["head.weight"], received["head.weight"])  # v starts at w
    perturb(trainer.personal)
    x, y = batch()
    trainer.personal.zero_grad()
    F.cross_entropy(trainer.personal(x), y).backward()
    ce_grad = {k: p.grad.clone() for k, p in trainer.personal.named_parameters()}
    monkeypatch.setattr(trainer.personal_optimizer, "step", lambda *a, **k: None)
    trainer.train_step(x, y)  # the global model takes its FedAvg step first: w_t stays the received one
    for k, p in trainer.personal.named_parameters():
        torch.testing.assert_close(p.grad, ce_grad[k] + lam * (p.detach() - received[k]))
    x_test = batch(4, seed=3)[0]
    torch.testing.assert_close(trainer.predict(x_test), trainer.personal(x_test))
    assert not torch.allclose(trainer.predict(x_test), trainer.global_predict(x_test))


def test_ditto_initialises_v_only_once():
    trainer = make("ditto")
    trainer.begin_round()
    perturb(trainer.personal)
    v = snapshot(trainer.personal)
    trainer.begin_round()
    assert all(torch.equal(v[k], t) for k, t in trainer.personal.state_dict().items())


# -- APFL -------------------------------------------------------------------------------------
def test_apfl_updates_v_and_alpha_with_the_gradients_of_the_mixed_model():
    alpha = 0.3
    trainer = make("apfl", f"strategy.alpha_init={alpha}", *EXACT)
    lr = float(trainer.cfg["train"]["lr"])  # alpha_lr defaults to train.lr
    trainer.begin_round()
    perturb(trainer.personal)
    w = {k: p.detach().clone() for k, p in trainer.model.named_parameters()}
    v = {k: p.detach().clone().requires_grad_(True) for k, p in trainer.personal.named_parameters()}
    a = torch.tensor(alpha, requires_grad=True)
    x, y = batch()
    mixed = {k: a * v[k] + (1 - a) * w[k] for k in v}
    F.cross_entropy(functional_call(copy.deepcopy(trainer.model), mixed, (x,)), y).backward()
    # by hand: grad_v = alpha * g and grad_alpha = <g, v - w>, with g the gradient at v_bar
    grad_vbar = {k: v[k].grad / alpha for k in v}
    assert a.grad.item() == pytest.approx(sum((grad_vbar[k] * (v[k] - w[k])).sum().item() for k in v), rel=1e-4)
    trainer.train_step(x, y)
    assert trainer.personal.alpha.item() == pytest.approx(alpha - lr * a.grad.item(), rel=1e-5)
    for k, p in trainer.personal.named_parameters():
        torch.testing.assert_close(p.detach(), v[k].detach() - lr * v[k].grad)


def test_apfl_alpha_stays_in_the_unit_interval_and_mixes_the_two_models():
    trainer = make("apfl", "strategy.alpha_lr=1000")
    trainer.begin_round()
    perturb(trainer.personal)
    trainer.train_step(*batch())
    assert 0.0 <= trainer.personal.alpha.item() <= 1.0
    x = batch(4, seed=2)[0]
    trainer.exchange.eval(), trainer.private.eval()
    trainer.personal.alpha.fill_(1.0)
    torch.testing.assert_close(trainer.predict(x), trainer.personal(x))
    trainer.personal.alpha.fill_(0.0)
    torch.testing.assert_close(trainer.predict(x), trainer.model(x))


# -- pFedMe -----------------------------------------------------------------------------------
def test_pfedme_personal_model_minimises_the_envelope_objective_and_w_moves_toward_it():
    """On a smooth, strongly convex instance (softmax regression + the proximal term) the K inner
    steps must reach the envelope problem's minimiser, whose gradient vanishes."""
    lam, lr, personal_lr = 1.0, 0.05, 0.5
    trainer = make("pfedme", f"strategy.lam={lam}", "strategy.inner_steps=300",
                   f"strategy.personal_lr={personal_lr}", f"train.lr={lr}")
    torch.manual_seed(0)
    trainer.model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    trainer.personal = copy.deepcopy(trainer.model)
    trainer.begin_round()
    x, y = batch()
    x = 0.02 * x  # keeps the cross-entropy's curvature below 1 / personal_lr
    w_before = {k: p.detach().clone() for k, p in trainer.model.named_parameters()}

    def objective_and_grad_norm():
        objective, _ = trainer.envelope_objective(x, y)
        grads = torch.autograd.grad(objective, list(trainer.personal.parameters()))
        return objective.item(), torch.sqrt(sum(g.pow(2).sum() for g in grads)).item()

    at_w = objective_and_grad_norm()  # theta starts at w
    trainer.train_step(x, y)
    theta = {k: p.detach().clone() for k, p in trainer.personal.named_parameters()}
    # w <- w - lr * lam * (w - theta)
    for k, p in trainer.model.named_parameters():
        torch.testing.assert_close(p.detach(), w_before[k] - lr * lam * (w_before[k] - theta[k]))
    with torch.no_grad():  # score theta against the w it was solved for
        for k, p in trainer.model.named_parameters():
            p.copy_(w_before[k])
    at_theta = objective_and_grad_norm()
    assert at_theta[0] < at_w[0]
    assert at_theta[1] < 1e-4 * at_w[1]  # the minimiser of the envelope problem
    # and no other point near it does better
    with torch.no_grad():
        for p in trainer.personal.parameters():
            p.add_(1e-2 * torch.randn_like(p))
    assert objective_and_grad_norm()[0] > at_theta[0]


def test_pfedme_resets_theta_to_the_received_model_each_round_and_evaluates_theta():
    trainer = make("pfedme")
    trainer.begin_round()
    trainer.train_step(*batch())
    x = batch(4, seed=2)[0]
    assert not torch.allclose(trainer.predict(x), trainer.global_predict(x))
    trainer.begin_round()
    torch.testing.assert_close(trainer.predict(x), trainer.global_predict(x))


# -- Per-FedAvg -------------------------------------------------------------------------------
def test_perfedavg_step_is_first_order_maml_on_the_two_halves_of_the_batch():
    alpha, beta = 0.03, 0.05
    trainer = make("perfedavg", f"strategy.inner_lr={alpha}", f"train.lr={beta}", *EXACT)
    x, y = batch(8)
    ref = copy.deepcopy(trainer.model)
    w = {k: p.detach().clone() for k, p in ref.named_parameters()}
    g1 = torch.autograd.grad(F.cross_entropy(ref(x[:4]), y[:4]), list(ref.parameters()))
    adapted = {k: w[k] - alpha * g for k, g in zip(w, g1)}
    adapted_model = copy.deepcopy(ref)
    adapted_model.load_state_dict(adapted, strict=False)
    g2 = torch.autograd.grad(F.cross_entropy(adapted_model(x[4:]), y[4:]), list(adapted_model.parameters()))
    trainer.train_step(x, y)
    for (k, p), g in zip(trainer.model.named_parameters(), g2):
        torch.testing.assert_close(p.detach(), w[k] - beta * g)


def test_perfedavg_adapts_a_copy_with_one_step_before_evaluation(small_data):
    trainer = make("perfedavg")
    before = snapshot(trainer.model)
    adapted = trainer.adapted_model(small_data)
    assert set(k for k in before if not torch.equal(before[k], adapted.state_dict()[k]))
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    result = trainer.evaluate(small_data)
    assert 0.0 <= result["accuracy"] <= 1.0
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
