"""What Flower (and Ray under it) prints that a user of this app cannot act on, kept off the
console; everything else passes untouched.

- the strategy's start dumps both ConfigRecords, i.e. the whole experiment twice: one line says
  where the settings are instead (summary.json, and the per-round line of the run log);
- "MetricRecord: None" / "Initial global evaluation results: None": a method with nothing to
  score on the server;
- the "Final results" dump of every round's metrics: they are in metrics.jsonl, and the run log
  has one line per round;
- "fraction_evaluate is set to 0.0. Federated evaluation will be skipped": what
  evaluate_in_train=true does on purpose (the strategy says it in its own words);
- `run_simulation`'s deprecation notice: pfedes-sim calls it on purpose (in-process simulation,
  with hydra's overrides); `flwr run` is the other entry point, and both run the same ServerApp;
- Ray's FutureWarning about the accelerator env var (a note for Ray's own future default).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

from flwr.common.logger import FLOWER_LOGGER

_DROPPED = {
    "\t%s",  # the lines of Flower's "Final results" dump
    "Final results:",
    # evaluate_in_train=true sets it (the evaluation comes with the train reply): the strategy
    # says so instead; a user's own fraction_evaluate must be > 0
    "fraction_evaluate is set to 0.0. Federated evaluation will be skipped.",
}
_DROPPED_WHEN_NONE = {"\t└──> MetricRecord: %s", "Initial global evaluation results: %s"}
_CONFIG_DUMP = ("\t├── ConfigRecord (train): %s", "\t├── ConfigRecord (evaluate): %s")


class FlowerNotices(logging.Filter):
    """Drops or shortens the records listed in the module's docstring."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        if msg in _DROPPED or (record.levelno >= logging.WARNING
                               and "`run_simulation` function is deprecated" in record.getMessage()):
            return False
        if msg in _DROPPED_WHEN_NONE and record.args in ((None,), None):
            return False
        if msg == _CONFIG_DUMP[1]:
            return False
        if msg == _CONFIG_DUMP[0]:
            record.msg, record.args = "\t├── Settings: the experiment's (out_dir/summary.json)", ()
        return True


@contextlib.contextmanager
def quiet_flower() -> Iterator[None]:
    """Within the block, Flower's and Ray's notices above stay off the console."""
    notices = FlowerNotices()
    FLOWER_LOGGER.addFilter(notices)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
            yield
    finally:
        FLOWER_LOGGER.removeFilter(notices)
