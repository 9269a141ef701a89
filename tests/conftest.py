"""Shared fixtures: small configs and small real data (the embedded CIFAR-10 sample)."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# datasets' imagefolder builder caches what it reads: the tests' own image folders stay out of ~/.cache
os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(tempfile.gettempdir(), "pfedes-tests-hf-datasets"))

import pytest
import torch

from pfedes.config import experiment_config
from pfedes.data import load_client_data

torch.set_num_threads(1)


def make_cfg(*overrides: str) -> dict:
    """The default experiment with hydra overrides, sized for tests."""
    return experiment_config(["data.samples_per_client=120", "train.batch_size=16", *overrides])


@pytest.fixture
def cfg_factory():
    return make_cfg


@pytest.fixture(scope="session")
def small_data():
    """Client 0 of 3 on the embedded sample: ~96 train / ~24 test images, 2 classes."""
    return load_client_data("embedded", "pathological", 3, 0, 0, 2, 0.3, 120, 0.2)


def make_reply(node_id: int, content, message_type: str = "train"):
    """A reply Message from `node_id`, as the ServerApp receives it from the grid."""
    from flwr.app import Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    instruction = Message(content=RecordDict(), dst_node_id=node_id, message_type=message_type)
    return Message(content=content, reply_to=instruction)


def train_reply(node_id: int, arrays: dict, num_examples: int, **metrics):
    """A train reply carrying `arrays` (name -> numpy array) and metrics."""
    from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

    record = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                         "metrics": MetricRecord({"num-examples": num_examples, **metrics})})
    return make_reply(node_id, record)
