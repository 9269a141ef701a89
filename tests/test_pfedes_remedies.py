"""pFedES's anti-collapse remedies and fusion modes: their math on hand-computed numbers, what
each one trains, what leaves the client, and the server's collapse diagnostics."""

import logging
import math

import pytest
import torch
from torch.nn import functional as F

from conftest import make_cfg
from pfedes.proxy_monitor import ProxyMonitor, feature_std, linear_probe
from pfedes.trainers.alignment import align_loss, anti_collapse, covariance_penalty, variance_hinge
from pfedes.trainers.pfedes import LabelPrior, PFedESTrainer, best_weight, mixture, mutual_distillation


def trainer(arch="cnn3", *extra, **over):
    """The seed form with `over` as its settings; `extra`: other overrides."""
    cfg = make_cfg("strategy=pfedes_seed", *extra, *(f"++strategy.{k}={v}" for k, v in over.items()))
    t = PFedESTrainer(cfg, arch, num_classes=10, seed=0)
    t.begin_round()
    return t


# -- the losses ------------------------------------------------------------------------------
def test_infonce_on_hand_computed_numbers():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    b = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    # cosines: row 0 -> [1, 1/sqrt2], row 1 -> [0, 1/sqrt2]; divided by t = 0.5
    t = 0.5
    s = 1 / math.sqrt(2)
    expected = 0.5 * ((-1 / t + math.log(math.exp(1 / t) + math.exp(s / t)))
                      + (-s / t + math.log(math.exp(0) + math.exp(s / t))))
    assert align_loss(a, b, "infonce", t).item() == pytest.approx(expected, rel=1e-5)


def test_infonce_cannot_be_satisfied_by_a_constant_map():
    x = torch.eye(16)  # every sample points its own way
    constant = torch.ones(16, 16)
    # a constant target makes every sample equally likely: the loss is log(batch), not 0
    assert align_loss(x, constant, "infonce", 0.1).item() == pytest.approx(math.log(16), rel=1e-4)
    assert align_loss(x, x, "infonce", 0.1).item() < 0.1
    # while MSE to a constant is minimised by the constant itself
    assert align_loss(constant, constant, "mse").item() == 0.0
    assert align_loss(torch.randn(16, 8), constant[:, :8], "infonce", 0.1).item() == pytest.approx(math.log(16), rel=1e-4)


def test_variance_hinge_and_covariance_penalty_on_hand_computed_numbers():
    z = torch.tensor([[0.0, 0.0], [2.0, 2.0]])  # var 2 per dim (unbiased): std > 1, no hinge
    assert variance_hinge(z).item() == 0.0
    collapsed = torch.ones(5, 3)
    assert variance_hinge(collapsed).item() == pytest.approx(1 - math.sqrt(1e-4))
    # centred: [[-1,-1],[1,1]]; cov = [[2,2],[2,2]]; off-diagonal squares 2*4 = 8, / d = 2 -> 4
    assert covariance_penalty(z).item() == pytest.approx(4.0)
    assert anti_collapse(z, 0.0, 0.0).item() == 0.0
    assert anti_collapse(collapsed, 2.0, 1.0).item() == pytest.approx(2 * (1 - math.sqrt(1e-4)))


# -- what each setting trains and shares ------------------------------------------------------
def test_proxy_classifier_is_shared_and_learns_from_labels():
    t = trainer(proxy_ce_weight=1.0, warmup_steps=0, proxy_align_weight=0.0, lam=0.0)
    shared = t.shared_state()
    assert "proxy.classifier.weight" in shared and all(k.startswith("proxy.") for k in shared)
    before = t.proxy.classifier.weight.detach().clone()
    metrics = t.train_step(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    assert "proxy_ce" in metrics
    assert not torch.equal(before, t.proxy.classifier.weight)


def test_without_a_classifier_the_shared_keys_are_the_seed_forms():
    assert not any("classifier" in k for k in trainer().shared_state())


def test_concat_fusion_feeds_the_proxy_into_the_private_head():
    t = trainer(fusion="concat", warmup_steps=0)
    assert t.model.head.in_features == t.model.backbone.out_dim + 128
    assert t.exchange["head"] is t.model.head
    x = torch.randn(4, 3, 32, 32)
    z, e = t.model.backbone(x), t.proxy(x)
    torch.testing.assert_close(t.predict(x), t.model.head(torch.cat([z, e], 1)))
    # the personal CE reaches E_proxy
    F.cross_entropy(t.predict(x), torch.zeros(4, dtype=torch.long)).backward()
    assert t.proxy.out.weight.grad is not None and t.proxy.out.weight.grad.abs().sum() > 0
    assert not any(k.startswith("head") for k in t.shared_state())


def test_ensemble_prediction_is_the_mean_of_the_two_branches_probabilities():
    t = trainer(fusion="ensemble")
    t.exchange.eval()
    t.private.eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        p_private = F.softmax(t.model.head(t.model.backbone(x)), 1)
        p_proxy = F.softmax(t.private["proxy_head"](t.proxy(x)), 1)
        torch.testing.assert_close(t.predict(x).exp(), 0.5 * (p_private + p_proxy))
    # the private proxy head never leaves the client, and is persisted with it
    assert not any("proxy_head" in k for k in t.shared_state())
    assert any("proxy_head" in k for k in t.state_dict()["private"])


def test_mutual_distillation_on_hand_computed_numbers_and_in_the_private_loss():
    a, b = torch.tensor([[0.0, math.log(3.0)]]), torch.tensor([[0.0, 0.0]])  # p_a = (1/4, 3/4), p_b = (1/2, 1/2)
    kl_b_a = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # KL(p_b || p_a)
    kl_a_b = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert mutual_distillation(a, b).item() == pytest.approx(kl_b_a + kl_a_b, rel=1e-5)
    assert mutual_distillation(a, a).item() == pytest.approx(0.0, abs=1e-7)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    grads = []
    for weight in (0.0, 1.0):
        t = trainer(fusion="ensemble", warmup_steps=0, proxy_align_weight=0, lam=0, distill_weight=weight)
        t.train_step(x, y)
        grads.append(t.model.head.weight.grad.clone())
    assert not torch.allclose(grads[0], grads[1])  # the other branch's prediction reaches H_k


def test_the_seed_form_keeps_the_proxy_out_of_the_private_gradient():
    t = trainer(warmup_steps=0)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    before = {k: v.clone() for k, v in t.proxy.state_dict().items()}
    t.proxy_optimizer.step = lambda *a, **k: None  # only the private optimiser steps
    t.train_step(x, y)
    assert all(torch.equal(before[k], v) for k, v in t.proxy.state_dict().items())


@pytest.mark.parametrize("norm", ["group", "batch"])
def test_normalised_proxies_share_the_same_keys_on_every_architecture(norm):
    shapes = [{k: tuple(v.shape) for k, v in trainer(a, proxy_norm=norm).shared_state().items()}
              for a in ("cnn3", "resnet_bn", "vit_small")]
    assert shapes[0] == shapes[1] == shapes[2]


@pytest.mark.parametrize("setting, value, message", [
    ("lam", -1, "strategy.lam must be >= 0, got -1"),
    ("temperature", 0, "strategy.temperature must be > 0, got 0"),
    ("variance_weight", -0.5, "strategy.variance_weight must be >= 0"),
    ("proxy_ce_weight", -1, "strategy.proxy_ce_weight must be >= 0"),
    ("fusion", "mixture", "strategy.fusion 'mixture' is unknown"),
    ("align", "l1", "strategy.align 'l1' is unknown"),
    ("proxy_norm", "layer", "strategy.proxy_norm 'layer' is unknown"),
    ("distill_weight", -1, "strategy.distill_weight must be >= 0"),
    ("distill_weight", 1, "strategy.distill_weight needs fusion: ensemble"),
    ("proxy_schedule", "alternate", "strategy.proxy_schedule 'alternate' is unknown"),
    ("proxy_schedule", "rep", "strategy.proxy_schedule 'rep' needs fusion: ensemble"),
    ("proxy_head_epochs", 2, "strategy.proxy_head_epochs needs proxy_schedule: rep"),
    ("proxy_head_epochs", -1, "strategy.proxy_head_epochs must be >= 0"),
    ("proxy_head", "global", "strategy.proxy_head 'global' is unknown"),
    ("proxy_head", "shared", "strategy.proxy_head 'shared' needs fusion: ensemble"),
    ("predict_with", "global", "strategy.predict_with 'global' is unknown"),
    ("predict_with", "received", "strategy.predict_with 'received' needs a fusion"),
    ("proxy_width", 0, "strategy.proxy_width must be >= 1"),
    ("proxy_classifier", "frozen", "strategy.proxy_classifier 'frozen' is unknown"),
    ("proxy_classifier", "fixed", "strategy.proxy_classifier 'fixed' needs a shared classifier"),
    ("proxy_feature_ce_weight", -1, "strategy.proxy_feature_ce_weight must be >= 0"),
    ("proxy_feature_ce_weight", 1, "strategy.proxy_feature_ce_weight needs a shared classifier"),
    ("ensemble_weight", "learned", "strategy.ensemble_weight 'learned' is unknown"),
    ("ensemble_weight", "validated", "strategy.ensemble_weight 'validated' needs fusion: ensemble"),
])
def test_a_bad_setting_is_named(setting, value, message):
    with pytest.raises(ValueError, match=message):
        trainer(**{setting: value})


# -- the server's diagnostics -----------------------------------------------------------------
def test_linear_probe_separates_separable_features_and_not_noise():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(400) % 4
    separable = F.one_hot(labels, 4).float() * 3 + 0.1 * torch.randn(400, 4, generator=g)
    noise = torch.randn(400, 4, generator=g)
    assert linear_probe(separable, labels, 4) > 0.95
    assert linear_probe(noise, labels, 4) < 0.45


def test_monitor_warns_once_when_the_proxy_collapses(caplog):
    cfg = make_cfg("data.unified_test_samples=64", "num_rounds=10", "probe_every=2")
    t = PFedESTrainer(cfg, "cnn3", num_classes=10, seed=0)
    monitor = ProxyMonitor(cfg, t, 10)
    first = monitor(1, t.shared_state())
    assert first["proxy_std"] > 0 and not first["proxy_collapsed"] and "probe_acc" not in first
    second = monitor(2, t.shared_state())
    assert second["probe_acc"] == pytest.approx(second["probe_acc_fresh"])  # same proxy, same probe
    # shrink the output map: every feature moves toward the bias, so the std falls by 100x
    squeezed = {k: (v * 0.01 if k == "proxy.out.weight" else v) for k, v in t.shared_state().items()}
    with caplog.at_level(logging.WARNING):
        third = monitor(3, squeezed)
        monitor(4, squeezed)
    assert third["proxy_collapsed"]
    assert third["proxy_std"] == pytest.approx(0.01 * first["proxy_std"], rel=1e-3)
    assert sum("has collapsed" in r.getMessage() for r in caplog.records) == 1


def test_feature_std_is_the_mean_per_dimension_std():
    f = torch.tensor([[0.0, 1.0], [2.0, 1.0]])
    assert feature_std(f) == pytest.approx(math.sqrt(2) / 2)


def test_proxy_epochs_train_only_the_shared_branch(small_data):
    plain = trainer(fusion="ensemble", warmup_steps=0, proxy_norm="group")
    extra = trainer(fusion="ensemble", warmup_steps=0, proxy_norm="group", proxy_epochs=2)
    plain.fit(small_data, torch.Generator().manual_seed(0))
    metrics = extra.fit(small_data, torch.Generator().manual_seed(0))
    assert "extra_proxy_branch_ce" in metrics
    # the joint pass is the same; the extra passes moved the proxy and G_k, and nothing else
    for name in ("backbone", "head", "projection"):
        a, b = getattr(plain.model, name).state_dict(), getattr(extra.model, name).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert not torch.equal(plain.proxy.out.weight, extra.proxy.out.weight)
    assert not torch.equal(plain.private["proxy_head"].weight, extra.private["proxy_head"].weight)
    assert extra.steps > plain.steps


def test_the_unshared_control_is_the_default_client_with_nothing_shared():
    from pfedes.config import experiment_config
    from pfedes.methods import method_of
    from pfedes.strategies.local import LocalOnly

    default_cfg, unshared_cfg = experiment_config([]), experiment_config(["strategy=pfedes_unshared"])
    default, unshared = default_cfg["strategy"], unshared_cfg["strategy"]
    assert set(default) == set(unshared)
    assert {k for k in default if default[k] != unshared[k]} == {"name", "method"}  # the same settings
    pfedes, control = method_of(default_cfg), method_of(unshared_cfg)
    assert control.trainer is pfedes.trainer and control.settings is pfedes.settings  # the same client
    assert control.strategy is LocalOnly and control.strategy is not pfedes.strategy  # another server
    assert control.share == () and pfedes.share == ("proxy-only",)


def test_rep_schedule_fits_the_private_head_to_the_received_proxy_then_trains_the_proxy(small_data):
    t = trainer(fusion="ensemble", warmup_steps=0, proxy_norm="group", proxy_epochs=1,
                proxy_schedule="rep", proxy_head_epochs=1, predict_with="received", proxy_align_weight=0,
                lam=0)
    received = {k: v.clone() for k, v in t.proxy.state_dict().items()}
    head_after = {}
    original_step = t.proxy_step

    def proxy_step(x, y):  # the proxy's passes start once G_k has been fitted to the received proxy
        if not head_after:
            assert all(torch.equal(received[k], v) for k, v in t.proxy.state_dict().items())
            head_after.update({k: v.clone() for k, v in t.private["proxy_head"].state_dict().items()})
        return original_step(x, y)

    t.proxy_step = proxy_step
    metrics = t.fit(small_data, torch.Generator().manual_seed(0))
    assert "head_proxy_branch_ce" in metrics and "extra_proxy_branch_ce" in metrics
    # G_k learnt in the joint and head passes, and stayed fixed while the proxy learnt
    assert all(torch.equal(head_after[k], v) for k, v in t.private["proxy_head"].state_dict().items())
    # the proxy that is sent is the trained one; the prediction uses the one received
    assert not torch.equal(t.shared_state()["proxy.out.weight"], received["out.weight"])
    assert torch.equal(t.private["received_proxy"].out.weight, received["out.weight"])
    t.exchange.eval()
    t.private.eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        p_private = F.softmax(t.model.head(t.model.backbone(x)), 1)
        p_proxy = F.softmax(t.private["proxy_head"](t.private["received_proxy"](x)), 1)
        torch.testing.assert_close(t.predict(x).exp(), 0.5 * (p_private + p_proxy))
    # the received proxy is private state: persisted with the client, never sent
    assert not any("received_proxy" in k for k in t.shared_state())
    assert any("received_proxy" in k for k in t.state_dict()["private"])


def test_label_prior_is_the_smoothed_label_distribution():
    prior = LabelPrior(4)
    torch.testing.assert_close(prior.log_prior.exp(), torch.full((4,), 0.25))
    prior.fit_to(torch.tensor([0, 0, 0, 1, 1, 3]))  # counts + 1 = 4, 3, 1, 2 of 10
    torch.testing.assert_close(prior.log_prior.exp(), torch.tensor([0.4, 0.3, 0.1, 0.2]))
    torch.testing.assert_close(prior(torch.zeros(1, 4)), torch.tensor([[0.4, 0.3, 0.1, 0.2]]).log())


def test_shared_proxy_head_is_trained_with_the_clients_label_prior_and_sent(small_data):
    t = trainer(fusion="ensemble", warmup_steps=0, proxy_norm="group", proxy_head="shared",
                proxy_align_weight=0, lam=0)
    assert "proxy_head" not in t.private and "proxy.classifier.weight" in t.shared_state()
    assert not any("label_prior" in k for k in t.shared_state())  # the label mix stays home
    t.fit(small_data, torch.Generator().manual_seed(0))
    counts = torch.bincount(small_data.y_train, minlength=10).float() + 1
    torch.testing.assert_close(t.private["label_prior"].log_prior, (counts / counts.sum()).log())
    x, y = torch.randn(4, 3, 32, 32), small_data.y_train[:4]
    e = t.proxy(x)
    adjusted = t.proxy.classify(e) + t.private["label_prior"].log_prior
    torch.testing.assert_close(t.branch_logits(e), adjusted)
    # the branch's loss is the logit-adjusted CE, and its gradient reaches the shared classifier
    t.optimizer.zero_grad()
    t.proxy_optimizer.zero_grad()
    t.proxy_step(x, y)
    assert t.proxy.classifier.weight.grad is not None


def test_a_fixed_shared_classifier_stays_as_received_while_the_proxy_learns(small_data):
    t = trainer(fusion="ensemble", warmup_steps=0, proxy_norm="group", proxy_head="shared",
                proxy_classifier="fixed", proxy_epochs=1, proxy_align_weight=0, lam=0)
    received = {k: v.clone() for k, v in t.shared_state().items()}
    t.fit(small_data, torch.Generator().manual_seed(0))
    sent = t.shared_state()
    assert "proxy.classifier.weight" in sent  # still sent, unchanged: the server's mean keeps it
    for key in ("proxy.classifier.weight", "proxy.classifier.bias"):
        assert torch.equal(sent[key], received[key])
    assert not torch.equal(sent["proxy.out.weight"], received["proxy.out.weight"])


def test_the_feature_ce_moves_only_the_proxy_and_counts_every_class_as_a_negative():
    t = trainer(fusion="ensemble", warmup_steps=0, proxy_norm="group", proxy_head="shared",
                proxy_feature_ce_weight=1.0, proxy_align_weight=0, lam=0)
    x, y = torch.randn(6, 3, 32, 32), torch.tensor([0, 1, 0, 1, 0, 1])
    e = t.proxy(x)
    metrics: dict[str, float] = {}
    loss = t.proxy_loss(x, y, e, None, metrics)
    # the plain CE over all 10 classes (no label prior), with C's weights as they are
    logits = e @ t.proxy.classifier.weight.T + t.proxy.classifier.bias
    assert metrics["proxy_feature_ce"] == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
    loss.backward()
    assert t.proxy.classifier.weight.grad is None  # C is held fixed in this term
    assert t.proxy.out.weight.grad is not None and t.proxy.out.weight.grad.abs().sum() > 0
    # a class this client never sees still gets probability mass the features are pushed from
    assert F.softmax(logits, 1)[:, 2:].sum().item() > 0.1


def test_predict_with_received_uses_the_proxy_the_server_sent(small_data):
    t = trainer(fusion="ensemble", warmup_steps=0, proxy_norm="group", proxy_head="shared",
                predict_with="received", proxy_epochs=1, proxy_align_weight=0, lam=0)
    received = {k: v.clone() for k, v in t.shared_state().items()}
    t.fit(small_data, torch.Generator().manual_seed(0))
    assert not torch.equal(t.shared_state()["proxy.out.weight"], received["proxy.out.weight"])
    kept = t.private["received_proxy"]
    assert all(torch.equal(received[f"proxy.{k}"], v) for k, v in kept.state_dict().items())
    t.exchange.eval()
    t.private.eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        p_private = F.softmax(t.model.head(t.model.backbone(x)), 1)
        p_shared = F.softmax(kept.classify(kept(x)) + t.private["label_prior"].log_prior, 1)
        torch.testing.assert_close(t.predict(x).exp(), 0.5 * (p_private + p_shared))


def test_the_proxy_with_its_shared_classifier_is_scored_as_a_global_model():
    default = PFedESTrainer(make_cfg("strategy=pfedes"), "resnet_bn", num_classes=10, seed=0)
    assert default.has_global_model  # C travels with the proxy: together a model of the federation
    x = torch.randn(4, 3, 32, 32)
    default.exchange.eval()
    with torch.no_grad():  # without the label prior: the unified test set is balanced
        torch.testing.assert_close(default.global_predict(x), default.proxy.classify(default.proxy(x)))
    assert not trainer().has_global_model  # the seed form shares a feature extractor only
    assert not PFedESTrainer(make_cfg("strategy=pfedes_ensemble"), "cnn3", 10, seed=0).has_global_model


def test_best_weight_is_the_mixture_right_most_often_and_ties_go_to_the_even_one():
    labels = torch.tensor([0, 0, 1])
    right = torch.tensor([[0.6, 0.4], [0.6, 0.4], [0.4, 0.6]]).log()  # logits: right, unsure
    wrong = torch.tensor([[0.05, 0.95], [0.05, 0.95], [0.95, 0.05]]).log()  # wrong, sure
    assert best_weight(right, wrong, labels) == 1.0  # a sure, wrong shared branch: private only
    assert best_weight(wrong, right, labels) == 0.0
    assert best_weight(right, right, labels) == 0.5  # every weight is right: the even mixture
    # private confident on sample 0 only, shared on samples 1 and 2: the even mixture gets all three
    p = torch.tensor([[0.99, 0.01], [0.4, 0.6], [0.6, 0.4]]).log()
    q = torch.tensor([[0.3, 0.7], [0.95, 0.05], [0.05, 0.95]]).log()
    assert best_weight(p, q, labels) == 0.5


def test_the_mixture_weighs_the_branches_and_ignores_a_shared_branch_that_is_not_finite():
    p, q = torch.tensor([[0.8, 0.2], [0.3, 0.7]]), torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    torch.testing.assert_close(mixture(p.log(), q.log(), 0.25).exp(), 0.25 * p + 0.75 * q)
    torch.testing.assert_close(mixture(p.log(), q.log(), 1.0).exp(), p)
    broken = torch.tensor([[float("nan"), 1.0], [1e3, -1e3]])  # sample 0's shared logits are not finite
    torch.testing.assert_close(mixture(p.log(), broken, 0.5)[0].exp(), p[0])
    torch.testing.assert_close(mixture(p.log(), broken, 0.5)[1].exp(), 0.5 * p[1] + 0.5 * torch.tensor([1.0, 0.0]))
    assert best_weight(p.log(), torch.full((2, 2), float("inf")), torch.tensor([0, 1])) == 0.5  # all private


def test_a_validated_ensemble_weight_is_picked_on_validation_used_and_kept_private():
    from pfedes.data import load_client_data

    data = load_client_data("embedded", "pathological", 3, 0, 0, 2, 0.3, 120, 0.2, None, 0.2)
    validated = dict(fusion="ensemble", proxy_norm="group", proxy_head="shared", predict_with="received",
                     proxy_align_weight=0, lam=0, ensemble_weight="validated")
    t = trainer("cnn3", "data.val_fraction=0.2", warmup_steps=0, **validated)
    # a shared branch that is always wrong on this client: its classifier says an absent class
    with torch.no_grad():
        t.proxy.classifier.weight.zero_()
        t.proxy.classifier.bias.copy_(torch.arange(10.0) * 0 - 100)
        absent = next(c for c in range(10) if c not in set(data.y_train.tolist()))
        t.proxy.classifier.bias[absent] = 100.0
    t.begin_round()
    metrics = t.fit(data, torch.Generator().manual_seed(0))
    assert metrics["ensemble_weight"] == 1.0 == float(t.private["ensemble_weight"].value)
    t.exchange.eval()
    t.private.eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():  # the prediction is the private model's alone
        torch.testing.assert_close(t.predict(x).exp(), F.softmax(t.model.head(t.model.backbone(x)), 1))
    assert "ensemble_weight.value" in t.state_dict()["private"]  # persisted with the client
    assert not any("ensemble_weight" in k for k in t.shared_state())  # never sent
    restarted = trainer("cnn3", "data.val_fraction=0.2", **validated)
    restarted.load_state_dict(t.state_dict())
    assert float(restarted.private["ensemble_weight"].value) == 1.0


def test_a_validated_ensemble_weight_needs_a_validation_split():
    from pfedes.config import ConfigError, experiment_config

    with pytest.raises(ConfigError, match=r"strategy.ensemble_weight=validated needs a validation split: "
                                          r"set data.val_fraction > 0"):
        experiment_config(["strategy=pfedes", "strategy.ensemble_weight=validated"])
    experiment_config(["strategy=pfedes", "strategy.ensemble_weight=validated", "data.val_fraction=0.15"])


def test_a_broken_proxy_does_not_reach_the_private_model_without_alignment(small_data):
    """With lam = 0 (the default) the alignment is a diagnostic: a proxy whose features are not
    finite (broken by noise) makes its own loss NaN but leaves the private model's step finite."""
    t = PFedESTrainer(make_cfg("strategy=pfedes", "strategy.warmup_steps=0"), "cnn3", 10, seed=0)
    with torch.no_grad():
        t.proxy.out.weight.fill_(float("inf"))
    t.begin_round()
    x, y = small_data.x_train[:8].float() / 255, small_data.y_train[:8]
    metrics = t.train_step(x, y)
    assert not math.isfinite(metrics["align_loss"])
    assert all(torch.isfinite(p).all() for p in t.model.parameters())
