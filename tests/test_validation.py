"""The one array check (pfedes/validation.py), used on replies, per-class payloads and the
server's arrays on a client."""

import numpy as np
import pytest
import torch

from pfedes.validation import arrays_problem

EXPECTED = {"w": np.zeros((2, 3), np.float32), "n": np.zeros((), np.int64)}


@pytest.mark.parametrize("arrays, problem", [
    ({"w": np.ones((2, 3), np.float32), "n": np.array(4)}, None),
    ({"w": torch.ones(2, 3), "n": torch.tensor(4)}, None),  # tensors too
    ({"w": np.ones((2, 3), np.float32)}, "keys differ from the expected ones (missing ['n'], extra [])"),
    ({"w": np.ones((3, 2), np.float32), "n": np.array(4)}, "'w' has shape (3, 2), expected (2, 3)"),
    ({"w": np.ones((2, 3), np.float64), "n": np.array(4)}, "'w' has dtype float64, expected float32"),
    ({"w": np.full((2, 3), np.nan, np.float32), "n": np.array(4)}, "'w' holds NaN or Inf"),
])
def test_each_kind_of_mismatch_is_named(arrays, problem):
    assert arrays_problem(arrays, EXPECTED) == problem


def test_dtype_and_finiteness_checks_can_be_left_to_the_caller():
    arrays = {"w": np.full((2, 3), np.inf, np.float64), "n": np.array(4)}
    assert arrays_problem(arrays, EXPECTED, dtypes=False, finite=False) is None
