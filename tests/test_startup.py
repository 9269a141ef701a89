"""A deployed ClientApp is a new process per message (Flower 1.42): what it imports and what its
optimiser does. The import checks run in a fresh interpreter, since this one has imported much."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from pfedes.optim import UNGUARDED, LocalSGD

ROOT = Path(__file__).resolve().parents[1]
# What a ClientApp of a deployment needs neither at import nor, with its partition decoded on disk,
# for a train message: the data stack, the plotting stack, the configuration composer, torch.compile.
HEAVY = ("torch._dynamo", "datasets", "flwr_datasets", "pyarrow", "PIL", "torchvision", "matplotlib", "pandas",
         "scipy", "omegaconf", "hydra", "ray")

CHILD = r"""
import json, sys
spec = json.loads(sys.argv[1])
import pfedes.client_app as client_app
at_import = [m for m in spec["watched"] if m in sys.modules]
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
import torch
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
msg = Message(content=RecordDict({"arrays": ArrayRecord(torch.load(spec["arrays"], weights_only=True)),
                                  "config": ConfigRecord({"experiment": spec["experiment"], "server-round": 2})}),
              dst_node_id=1, message_type="train")
ctx = Context(run_id=1, node_id=1, node_config=spec["node_config"], state=RecordDict(), run_config={})
reply = client_app.train(msg, ctx)
assert not reply.has_error(), reply.error.reason
print(json.dumps({"at_import": at_import, "after_train": [m for m in spec["watched"] if m in sys.modules]}))
"""


def test_a_client_process_imports_no_data_stack_and_no_dynamo_when_its_partition_is_cached(tmp_path):
    """The steady state of a deployed device: the decoded partition is in its state-dir (the
    first process wrote it); a fresh process imports the ClientApp, trains one round, and never
    imports `datasets`, torchvision or `torch._dynamo` (torch.optim's would, pfedes/optim.py)."""
    from pfedes.client_round import load_node_data
    from pfedes.config import client_settings, experiment_config
    from pfedes.methods import method_of
    from pfedes.server_app import prepare

    cfg = prepare(experiment_config(["num_clients=3", "data.samples_per_client=40", "train.batch_size=16",
                                     "evaluate_in_train=true", f"out_dir={tmp_path}/out"]))
    state = tmp_path / "state"
    data = load_node_data(cfg, "embedded", 1, 3, state)  # what the device's first process leaves on disk
    assert len(list(state.glob("decoded-*.pt"))) == 1
    torch.save(method_of(cfg).trainer.initial_shared(cfg, "cnn3", data.num_classes, image=data.image_format),
               tmp_path / "arrays.pt")
    spec = {"experiment": json.dumps(client_settings(cfg), sort_keys=True), "arrays": str(tmp_path / "arrays.pt"),
            "node_config": {"device": "phone", "state-dir": str(state), "partition-id": 1, "num-partitions": 3},
            "watched": list(HEAVY)}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["at_import"] == [] and seen["after_train"] == []
    assert list(state.glob("pfedes-p1.pt")), "the round's private state was saved"


# -- LocalSGD is torch.optim.SGD ------------------------------------------------------------------
def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def _train(optimizer_cls, steps: int, start=None, **settings):
    """(model state, optimizer state) after `steps` steps, from `start` if given."""
    net = _net()
    optimizer = optimizer_cls(net.parameters(), **settings)
    if start is not None:  # a copy: torch's load_state_dict keeps the momentum buffers it is given
        net.load_state_dict(start[0])
        optimizer.load_state_dict(copy.deepcopy(start[1]))
    generator = torch.Generator().manual_seed(len(start[0]) if start else 1)
    for _ in range(steps):
        x, y = torch.randn(5, 3, 8, 8, generator=generator), torch.randint(0, 3, (5,), generator=generator)
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    return net.state_dict(), optimizer.state_dict()


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_the_installed_torch_has_the_wrappers_local_sgd_steps_beneath():
    assert UNGUARDED, "torch.optim's dynamo wrappers moved: LocalSGD fell back to torch.optim.SGD (correct, slower)"
    assert LocalSGD is not torch.optim.SGD and issubclass(LocalSGD, torch.optim.SGD)


@pytest.mark.parametrize("settings", [dict(lr=0.05, momentum=0.9, weight_decay=5e-4), dict(lr=0.1),
                                      dict(lr=0.05, momentum=0.9, nesterov=True, dampening=0.0),
                                      dict(lr=0.05, momentum=0.5, dampening=0.1, maximize=True)])
def test_local_sgd_trains_bit_for_bit_as_torch_sgd_with_the_same_state_dict(settings):
    ours, theirs = _train(LocalSGD, 6, **settings), _train(torch.optim.SGD, 6, **settings)
    assert _equal(ours, theirs)


def test_optimizer_states_move_between_local_sgd_and_torch_sgd():
    """A private state saved by torch's SGD (an older pfedes) resumes under LocalSGD, and back."""
    settings = dict(lr=0.05, momentum=0.9, weight_decay=5e-4)
    half = _train(torch.optim.SGD, 3, **settings)
    assert _equal(_train(LocalSGD, 3, start=half, **settings), _train(torch.optim.SGD, 3, start=half, **settings))
    half = _train(LocalSGD, 3, **settings)
    assert _equal(_train(torch.optim.SGD, 3, start=half, **settings), _train(LocalSGD, 3, start=half, **settings))


def test_local_sgd_keeps_torchs_step_hooks_and_zero_grad():
    net = _net()
    optimizer = LocalSGD(net.parameters(), lr=0.1)
    calls = []
    optimizer.register_step_pre_hook(lambda *args: calls.append("pre"))
    optimizer.register_step_post_hook(lambda *args: calls.append("post"))
    net(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    assert calls == ["pre", "post"] and all(p.grad is None for p in net.parameters())
    net(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in net.parameters())


def test_local_sgd_steps_without_autograd_and_restores_the_callers_grad_mode():
    net = _net()
    optimizer = LocalSGD(net.parameters(), lr=0.1)
    net(torch.randn(2, 3, 8, 8)).sum().backward()
    with torch.enable_grad():
        optimizer.step()  # an in-place update of a leaf that requires grad: fails under autograd
        assert torch.is_grad_enabled()
    with torch.no_grad():
        optimizer.step()
        assert not torch.is_grad_enabled()
