"""TensorBoard event files beside metrics.jsonl (`logging.tensorboard=true`): every number of a
round's record, tagged by its key path (`acc_mean`, `acc_by_device/phone`, `train_metrics/align_loss`,
`proxy_std`, `bytes_up_per_client`, ...), at step = the round. View with
`tensorboard --logdir outputs`. Uses the standard `torch.utils.tensorboard` writer, which needs the
`tensorboard` package (`pip install -e ".[tensorboard]"`)."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SKIPPED = ("round", "acc_by_client")  # the step itself, and one curve per client (in metrics.jsonl)


def available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def scalars(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a round record, by tag."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if not prefix and key in SKIPPED:
            continue
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(scalars(value, tag + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[tag] = float(value)
    return out


class TensorBoardLog:
    """Writes each round's record to out_dir/tensorboard; a resumed run continues its curves."""

    def __init__(self, out_dir: Path, first_round: int = 1) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"), purge_step=first_round)

    def write(self, record: Mapping[str, Any]) -> None:
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, global_step=int(record["round"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
