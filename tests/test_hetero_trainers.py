"""The client side of the model-heterogeneous baselines: each method's defining property, and
exactly what leaves the client."""

import numpy as np
import pytest
import torch

from conftest import make_cfg
from pfedes.class_payload import weighted_class_average
from pfedes.data import to_input
from pfedes.trainers.base import SharedStateError
from pfedes.trainers.fd import FDTrainer
from pfedes.trainers.fedgh import FedGHTrainer
from pfedes.trainers.fedproto import FedProtoTrainer
from pfedes.trainers.fml import FMLTrainer
from pfedes.trainers.lgfedavg import LGFedAvgTrainer
from pfedes.trainers.pfedes_paper import PFedESPaperTrainer

ARCHS = ("cnn3", "resnet_bn", "vit_small")  # phone, gateway, gpu-host
NUM_CLASSES = 10


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed(before, module):
    after = module.state_dict()
    return {k for k in before if not torch.equal(before[k], after[k])}


def make(cls, name, arch="cnn3", *over):
    return cls(make_cfg(f"strategy={name}", *over), arch, num_classes=NUM_CLASSES, seed=0)


def batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, NUM_CLASSES, (n,), generator=g)


def grads(module):
    return {k: p.grad.clone() for k, p in module.named_parameters() if p.grad is not None}


def weight_keys(trainer):
    return set(trainer.exchange.state_dict())


# -- pFedES, paper form -----------------------------------------------------------------------

def test_generator_has_443_parameters_and_keeps_the_image_shape():
    trainer = make(PFedESPaperTrainer, "pfedes_paper")
    assert sum(p.numel() for p in trainer.generator.parameters()) == 443
    x, _ = batch()
    assert trainer.generator(x).shape == x.shape


def test_phase_one_leaves_g_alone_and_phase_two_leaves_f_alone(small_data, monkeypatch):
    trainer = make(PFedESPaperTrainer, "pfedes_paper", "resnet_bn")  # BatchNorm: buffers count too
    g_before, f_before = snapshot(trainer.generator), snapshot(trainer.model)
    at_phase_two = {}
    generator_step = trainer.generator_step

    def spy(x, y):
        if not at_phase_two:
            at_phase_two["g"], at_phase_two["f"] = snapshot(trainer.generator), snapshot(trainer.model)
        return generator_step(x, y)

    monkeypatch.setattr(trainer, "generator_step", spy)
    metrics = trainer.fit(small_data, torch.Generator().manual_seed(0))
    # Phase 1 trained F (weights and BN statistics) and left G exactly as received.
    assert not {k for k in g_before if not torch.equal(g_before[k], at_phase_two["g"][k])}
    assert {k for k in f_before if not torch.equal(f_before[k], at_phase_two["f"][k])}
    # Phase 2 trained G and left F (weights and BN statistics) exactly as phase 1 left it.
    assert not changed(at_phase_two["f"], trainer.model)
    assert changed(at_phase_two["g"], trainer.generator)
    assert {"train_loss", "generated_loss", "generator_loss"} <= set(metrics)
    assert all(p.requires_grad for p in trainer.model.parameters())  # F is trainable again


def test_phase_one_loss_mixes_both_inputs_with_mu():
    trainer = make(PFedESPaperTrainer, "pfedes_paper", "cnn3", "strategy.mu=0.25")
    x, y = batch()
    f = torch.nn.functional.cross_entropy
    with torch.no_grad():
        expected_generated = f(trainer.model(trainer.generator(x)), y).item()
        expected_plain = f(trainer.model(x), y).item()
    trainer.begin_round()
    metrics = trainer.train_step(x, y)
    assert metrics["generated_loss"] == pytest.approx(expected_generated, rel=1e-5)
    assert metrics["train_loss"] == pytest.approx(expected_plain, rel=1e-5)


def test_inference_never_calls_g(small_data):
    trainer = make(PFedESPaperTrainer, "pfedes_paper")
    calls = []
    trainer.generator.register_forward_hook(lambda *a: calls.append(1))
    trainer.evaluate(small_data)
    trainer.predict(batch()[0])
    assert not calls


def test_only_g_leaves_the_client_and_every_device_sends_the_same_shapes(small_data):
    shapes = []
    for arch in ARCHS:
        trainer = make(PFedESPaperTrainer, "pfedes_paper", arch)
        shared = trainer.shared_state()
        assert set(shared) == {f"proxy.{k}" for k in trainer.generator.state_dict()}
        shapes.append({k: tuple(v.shape) for k, v in shared.items()})
    assert all(s == shapes[0] for s in shapes)


def test_paper_form_rejects_a_bad_mu():
    with pytest.raises(ValueError, match="strategy.mu"):
        make(PFedESPaperTrainer, "pfedes_paper", "cnn3", "strategy.mu=0")


# -- LG-FedAvg ----------------------------------------------------------------------------------

def test_lgfedavg_shares_only_the_head_with_one_shape_on_every_device(small_data):
    shapes = []
    for arch in ARCHS:
        trainer = make(LGFedAvgTrainer, "lgfedavg", arch)
        shared = trainer.shared_state()
        assert set(shared) == {"head.weight", "head.bias"}
        shapes.append({k: tuple(v.shape) for k, v in shared.items()})
    assert all(s == {"head.weight": (NUM_CLASSES, 128), "head.bias": (NUM_CLASSES,)} for s in shapes)
    trainer.fit(small_data, torch.Generator().manual_seed(0))
    assert set(trainer.shared_state()) == {"head.weight", "head.bias"}


def test_lgfedavg_body_never_leaves_and_cannot_be_overwritten():
    trainer = make(LGFedAvgTrainer, "lgfedavg", "resnet_bn")
    body = {k: v for k, v in trainer.exchange.state_dict().items() if not k.startswith("head.")}
    assert body and not set(body) & set(trainer.shared_state())
    with pytest.raises(SharedStateError):
        trainer.load_shared({**trainer.shared_state(), **body})


def test_lgfedavg_head_reads_the_projection_output():
    trainer = make(LGFedAvgTrainer, "lgfedavg", "vit_small")
    trainer.exchange.eval()
    x, _ = batch(4)
    m = trainer.model
    with torch.no_grad():
        torch.testing.assert_close(trainer.predict(x), m.head(m.projection(m.backbone(x))))


# -- FedProto -----------------------------------------------------------------------------------

def test_fedproto_sends_only_prototypes_and_counts_never_weights(small_data):
    for arch in ARCHS:
        trainer = make(FedProtoTrainer, "fedproto", arch)
        assert trainer.shared_state() == {}  # nothing before local training
    trainer.fit(small_data, torch.Generator().manual_seed(0))
    sent = trainer.shared_state()
    present = sorted(set(small_data.y_train.tolist()))
    assert set(sent) == {"counts"} | {f"class.{c}" for c in present}
    assert not set(sent) & weight_keys(trainer)
    np.testing.assert_array_equal(sent["counts"].numpy(),
                                  np.bincount(small_data.y_train.numpy(), minlength=NUM_CLASSES))
    # Each prototype is the mean of P(F(x)) over the class's train samples, in eval mode.
    trainer.exchange.eval()
    with torch.no_grad():
        embeddings = trainer.model.embed(to_input(small_data.x_train, trainer.image))
    for c in present:
        assert sent[f"class.{c}"].shape == (128,)
        torch.testing.assert_close(sent[f"class.{c}"], embeddings[small_data.y_train == c].mean(0),
                                   rtol=1e-4, atol=1e-5)


def test_fedproto_regulariser_is_the_distance_to_the_global_prototype_of_the_label():
    trainer = make(FedProtoTrainer, "fedproto", "cnn3", "model.proxy_dim=2")
    out = torch.tensor([[1.0, 1.0], [0.0, 2.0], [5.0, 5.0]])
    y = torch.tensor([0, 3, 7])
    trainer.load_shared({})  # first round: no global prototypes, no regulariser
    assert trainer.distance_to_global(out, y).item() == 0.0
    glob = weighted_class_average([({0: np.array([1.0, 3.0]), 3: np.array([0.0, 0.0])},
                                    np.array([1, 0, 0, 2, 0, 0, 0, 0, 0, 0]))])
    trainer.load_shared({k: torch.from_numpy(v) for k, v in glob.items()})
    # class 7 has no global prototype: only samples 0 and 1 count.
    # squared errors: sample 0 (0, 4), sample 1 (0, 4) -> mean over 4 elements = 2
    assert trainer.distance_to_global(out, y).item() == pytest.approx(2.0)


def test_fedproto_rejects_a_bad_server_payload():
    trainer = make(FedProtoTrainer, "fedproto", "cnn3", "model.proxy_dim=2")
    bad = {"class.0": torch.tensor([float("nan"), 0.0]), "counts": torch.tensor([1] + [0] * 9)}
    with pytest.raises(SharedStateError, match="NaN"):
        trainer.load_shared(bad)
    with pytest.raises(SharedStateError, match="counts"):
        trainer.load_shared({"head.weight": torch.zeros(10, 2)})


def test_fedproto_step_uses_the_regulariser_only_once_prototypes_exist():
    trainer = make(FedProtoTrainer, "fedproto", "cnn3")
    x, y = batch()
    trainer.load_shared({})
    assert trainer.train_step(x, y)["proto_loss"] == 0.0
    glob = {"counts": torch.ones(NUM_CLASSES, dtype=torch.int64)}
    glob.update({f"class.{c}": torch.full((128,), 3.0) for c in range(NUM_CLASSES)})
    trainer.load_shared(glob)
    assert trainer.train_step(x, y)["proto_loss"] > 0.0


# -- FD -----------------------------------------------------------------------------------------

def test_fd_sends_per_class_average_logits_and_counts_only(small_data):
    trainer = make(FDTrainer, "fd", "resnet_bn")
    trainer.load_shared({})
    trainer.fit(small_data, torch.Generator().manual_seed(0))
    sent = trainer.shared_state()
    present = sorted(set(small_data.y_train.tolist()))
    assert set(sent) == {"counts"} | {f"class.{c}" for c in present}
    assert not set(sent) & weight_keys(trainer)
    trainer.exchange.eval()
    with torch.no_grad():
        logits = trainer.model(to_input(small_data.x_train, trainer.image))
    for c in present:
        assert sent[f"class.{c}"].shape == (NUM_CLASSES,)
        torch.testing.assert_close(sent[f"class.{c}"], logits[small_data.y_train == c].mean(0),
                                   rtol=1e-4, atol=1e-5)


def test_fd_distillation_targets_the_global_logits_of_the_label():
    trainer = make(FDTrainer, "fd")
    glob = {"counts": torch.tensor([2] + [0] * 9), "class.0": torch.arange(10.0)}
    trainer.load_shared(glob)
    logits = torch.arange(10.0).repeat(2, 1)
    logits[1] += 1.0
    # sample 0 matches class 0's average logits; sample 1 is off by 1 everywhere; the class-5
    # sample has no global target: MSE = (0 * 10 + 1 * 10) / 20 = 0.5
    out = torch.cat([logits, torch.zeros(1, 10)])
    assert trainer.distance_to_global(out, torch.tensor([0, 0, 5])).item() == pytest.approx(0.5)


# -- FedGH --------------------------------------------------------------------------------------

def test_fedgh_receives_the_head_and_sends_only_prototypes(small_data):
    cfg = make_cfg("strategy=fedgh")
    head = FedGHTrainer.initial_shared(cfg, "cnn3", NUM_CLASSES)
    assert set(head) == {"head.weight", "head.bias"} and head["head.weight"].shape == (NUM_CLASSES, 128)
    trainer = FedGHTrainer(cfg, "vit_small", NUM_CLASSES, seed=1)
    global_head = {k: torch.full_like(v, 0.01) for k, v in head.items()}
    trainer.load_shared(global_head)
    torch.testing.assert_close(trainer.model.head.weight, global_head["head.weight"])
    with pytest.raises(SharedStateError):
        trainer.load_shared({"head.weight": head["head.weight"]})  # head.bias missing
    trainer.fit(small_data, torch.Generator().manual_seed(0))
    sent = trainer.shared_state()
    assert set(sent) == {"counts"} | {f"class.{c}" for c in set(small_data.y_train.tolist())}
    assert not set(sent) & weight_keys(trainer)
    assert all(v.shape == (128,) for k, v in sent.items() if k != "counts")


# -- FML ----------------------------------------------------------------------------------------

def test_fml_shares_only_the_meme_and_both_models_learn_from_each_other(monkeypatch):
    trainer = make(FMLTrainer, "fml", "resnet_bn")
    shared = trainer.shared_state()
    assert set(shared) == {f"proxy.{k}" for k in trainer.meme.state_dict()}
    trainer.begin_round()
    private_before, meme_before = snapshot(trainer.model), snapshot(trainer.meme)
    trainer.train_step(*batch())
    assert changed(private_before, trainer.model) and changed(meme_before, trainer.meme)


def test_fml_losses_with_alpha_0_and_beta_1_private_learns_only_from_the_meme(monkeypatch):
    from pfedes.trainers.fml import mutual_kl

    trainer = make(FMLTrainer, "fml", "cnn3", "strategy.alpha=0", "strategy.beta=1")
    trainer.begin_round()
    monkeypatch.setattr(trainer.optimizer, "step", lambda *a, **k: None)
    monkeypatch.setattr(trainer.meme_optimizer, "step", lambda *a, **k: None)
    x, y = batch()
    trainer.train_step(x, y)
    got_private, got_meme = grads(trainer.model), grads(trainer.meme)
    assert {k.split(".")[0] for k in got_private} == {"backbone", "head"}  # P_k is unused here
    # Expected: private <- KL(meme || private) only; meme <- CE(meme, y) only (teachers detached).
    trainer.model.zero_grad()
    trainer.meme.zero_grad()
    mutual_kl(trainer.model(x), trainer.meme(x)).backward()
    torch.nn.functional.cross_entropy(trainer.meme(x), y).backward()
    for got, module in ((got_private, trainer.model), (got_meme, trainer.meme)):
        expected = grads(module)
        assert set(got) == set(expected)
        for k in got:
            torch.testing.assert_close(got[k], expected[k])
    logits = torch.randn(4, NUM_CLASSES)
    assert mutual_kl(logits, logits).item() == pytest.approx(0.0, abs=1e-6)


def test_fml_global_model_is_the_meme_and_personal_model_is_private():
    trainer = make(FMLTrainer, "fml")
    assert FMLTrainer.has_global_model
    trainer.exchange.eval()
    x, _ = batch(4)
    with torch.no_grad():
        torch.testing.assert_close(trainer.global_predict(x), trainer.meme(x))
        torch.testing.assert_close(trainer.predict(x), trainer.model(x))


def test_every_method_builds_and_round_trips_its_private_state_on_every_device(small_data):
    for cls, name in ((PFedESPaperTrainer, "pfedes_paper"), (LGFedAvgTrainer, "lgfedavg"),
                      (FedProtoTrainer, "fedproto"), (FDTrainer, "fd"), (FedGHTrainer, "fedgh"),
                      (FMLTrainer, "fml")):
        for arch in ARCHS:
            trainer = make(cls, name, arch)
            clone = make(cls, name, arch)
            for p in trainer.exchange.parameters():
                torch.nn.init.normal_(p)
            clone.load_state_dict(trainer.state_dict())
            for k, v in trainer.exchange.state_dict().items():
                assert torch.equal(v, clone.exchange.state_dict()[k]), (name, arch, k)
