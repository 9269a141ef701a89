"""Private client state on disk: atomic writes, restore within a run, never across runs."""

import torch

from conftest import make_cfg
from pfedes.client_state import StateStore, atomic_torch_save
from pfedes.trainers.pfedes import PFedESTrainer


def trainer():
    return PFedESTrainer(make_cfg(), "cnn3", 10, seed=0)


def trained(small_data):
    t = trainer()
    t.fit(small_data, torch.Generator().manual_seed(0))
    return t


def test_a_restarted_client_restores_its_state_bit_for_bit(tmp_path, small_data):
    path = tmp_path / "p0.pt"
    original = trained(small_data)
    StateStore().save(path, original, version=3, run_token="run-a")
    restored, version = StateStore().get(path, None, trainer, run_token="run-a")  # a new process
    assert version == 3 and restored.steps == original.steps
    for key, value in original.state_dict()["exchange"].items():
        assert torch.equal(value, restored.state_dict()["exchange"][key]), key


def test_a_new_run_does_not_pick_up_the_state_of_an_old_one(tmp_path, small_data):
    path = tmp_path / "p0.pt"
    StateStore().save(path, trained(small_data), version=3, run_token="old-run")
    fresh, version = StateStore().get(path, None, trainer, run_token="new-run")
    assert version == 0 and fresh.steps == 0


def test_a_failed_write_leaves_the_previous_file_intact(tmp_path):
    path = tmp_path / "state.pt"
    atomic_torch_save({"v": 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("crash mid-write")

    try:
        atomic_torch_save({"v": Unpicklable()}, path)
    except RuntimeError:
        pass
    assert torch.load(path, weights_only=False) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]


def test_a_diverged_training_hands_the_next_message_the_saved_state_not_its_own(tmp_path, monkeypatch):
    """In one process (a simulation's actor) a failed train message must not leave its half-updated
    trainer in the cache: the next message gets the saved state, as a new deployed process would."""
    import pytest
    from test_devices import node_context, node_message, small_node_cfg

    from pfedes import client_app
    from pfedes.client_state import state_digest
    from pfedes.methods import method_of
    from pfedes.trainers.base import Trainer

    cfg = small_node_cfg(tmp_path, "strategy=local")
    context = node_context("phone", tmp_path)
    assert not client_app.train(node_message(cfg), context).has_error()
    saved, = (tmp_path / "state").glob("local-p*.pt")
    on_disk = torch.load(saved, weights_only=False)

    def diverge(self, x, y):  # a step that breaks the weights and reports a non-finite loss
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(float("nan"))
        return {"train_loss": float("nan")}

    monkeypatch.setattr(Trainer, "train_step", diverge)
    with pytest.raises(FloatingPointError, match="local training diverged"):
        client_app.train(node_message(cfg), context)
    build = lambda: method_of(cfg).trainer(cfg, "cnn3", 10, seed=0)  # noqa: E731
    trainer, version = client_app.STORE.get(saved, int(on_disk["version"]), build, cfg.get("run_token", ""))
    assert version == on_disk["version"]
    assert state_digest(trainer.state_dict()) == state_digest(on_disk["trainer"])


def test_a_training_that_diverges_in_the_shared_proxy_only_keeps_the_private_learning(tmp_path, monkeypatch):
    """A proxy broken by noise makes pFedES's shared branch non-finite while the private model's
    step stays finite: the client keeps that step (saved, version bumped), predicts with its private
    branch where the shared one is not finite, and replies with no update. A round that breaks what
    the client keeps is still dropped whole (the test above)."""
    import pytest
    from test_devices import node_context, node_message, small_node_cfg

    from pfedes import client_app
    from pfedes.methods import method_of
    from pfedes.trainers.base import SharedUpdateDiverged
    from pfedes.trainers.pfedes import PFedESTrainer

    cfg = small_node_cfg(tmp_path, "strategy=pfedes", "strategy.warmup_steps=0")
    context = node_context("phone", tmp_path)
    initial = method_of(cfg).trainer.initial_shared(cfg, "cnn3", 10)
    assert not client_app.train(node_message(cfg, initial), context).has_error()
    saved, = (tmp_path / "state").glob("pfedes-p*.pt")
    before = torch.load(saved, weights_only=False)
    broken = {k: torch.full_like(v, float("inf")) if k.endswith("weight") else v for k, v in initial.items()}

    with pytest.raises(SharedUpdateDiverged, match="in the shared entries only"):
        client_app.train(node_message(cfg, broken), context)
    after = torch.load(saved, weights_only=False)
    assert after["version"] == before["version"] + 1
    private_before, private_after = before["trainer"]["exchange"], after["trainer"]["exchange"]
    changed = [k for k in private_after if k.startswith("backbone.")
               and not torch.equal(private_before[k], private_after[k])]
    assert changed and all(private_after[k].isfinite().all() for k in changed)

    trainer, _ = client_app.STORE.get(saved, int(after["version"]), lambda: None, cfg.get("run_token", ""))
    x = torch.rand(4, 3, 32, 32)
    assert torch.equal(trainer.predict(x).argmax(1), trainer.model(x).argmax(1))  # the private branch alone

    def diverge_everywhere(self, x, y):  # the private model breaks as well: nothing is kept
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(float("nan"))
        return {"train_loss": float("nan")}

    monkeypatch.setattr(PFedESTrainer, "train_step", diverge_everywhere)
    with pytest.raises(FloatingPointError) as raised:
        client_app.train(node_message(cfg, initial), context)
    assert not isinstance(raised.value, SharedUpdateDiverged)
    assert torch.load(saved, weights_only=False)["version"] == after["version"]
