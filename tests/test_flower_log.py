"""The console shows what a user can act on: Flower's notices that are not are kept off it."""

import logging
import warnings

from flwr.common.logger import FLOWER_LOGGER, log, warn_deprecated_feature

from pfedes.data import classes_in_no_partition, embedded_dir
from pfedes.flower_log import quiet_flower


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def logged(emit):
    handler = Collect()
    FLOWER_LOGGER.addHandler(handler)
    try:
        with quiet_flower():
            emit()
    finally:
        FLOWER_LOGGER.removeHandler(handler)
    return handler.lines


def test_config_dumps_none_records_and_the_final_dump_are_dropped_the_rest_passes():
    def emit():
        log(logging.INFO, "\t├── ConfigRecord (train): %s", "{'experiment': '...'}")
        log(logging.INFO, "\t├── ConfigRecord (evaluate): %s", "{'experiment': '...'}")
        log(logging.INFO, "Initial global evaluation results: %s", None)
        log(logging.INFO, "\t└──> MetricRecord: %s", None)
        log(logging.INFO, "\t└──> MetricRecord: %s", {"global_acc": 0.5})
        log(logging.INFO, "Final results:")
        log(logging.INFO, "\t%s", "{1: {'acc_mean': 0.5}}")
        warn_deprecated_feature("The `run_simulation` function is deprecated and will be removed")
        log(logging.WARNING, "fraction_evaluate is set to 0.0. Federated evaluation will be skipped.")
        log(logging.WARNING, "a node did not reply")
    assert logged(emit) == ["\t├── Settings: the experiment's (out_dir/summary.json)",
                            "\t└──> MetricRecord: {'global_acc': 0.5}", "a node did not reply"]


def test_outside_the_block_flower_logs_everything():
    handler = Collect()
    FLOWER_LOGGER.addHandler(handler)
    try:
        log(logging.INFO, "\t└──> MetricRecord: %s", None)
    finally:
        FLOWER_LOGGER.removeHandler(handler)
    assert handler.lines == ["\t└──> MetricRecord: None"]


def test_rays_accelerator_tip_is_silenced_and_other_warnings_are_not():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_flower():
            warnings.warn("Tip: In future versions of Ray, Ray will no longer override", FutureWarning)
            warnings.warn("something else", FutureWarning)
    assert [str(w.message) for w in caught] == ["something else"]


def test_classes_in_no_clients_data_are_found_once_on_the_server():
    path = str(embedded_dir())
    few = classes_in_no_partition(path, "pathological", 2, seed=0, classes_per_client=2)
    assert len(few) >= 6  # 2 clients x 2 classes hold at most 4 of the 10
    assert all(isinstance(c, int) and 0 <= c < 10 for c in few)
    assert classes_in_no_partition(path, "pathological", 10, seed=0, classes_per_client=10) == []
    assert classes_in_no_partition(path, "iid", 4, seed=0) == []


def test_finding_classes_in_no_client_stops_once_every_class_is_held(monkeypatch):
    import pfedes.data as data

    read = []
    real = data.partition_indices
    monkeypatch.setattr(data, "partition_indices", lambda *a, **k: read.append(a[3]) or real(*a, **k))
    path = str(embedded_dir())
    assert classes_in_no_partition(path, "pathological", 200, seed=0, classes_per_client=2) == []
    # first-deterministic: partitions 0..9 start at classes 0..9, so at most those ten are read
    assert read == list(range(len(read))) and len(read) <= 10
    read.clear()
    assert len(classes_in_no_partition(path, "pathological", 3, seed=0, classes_per_client=2)) >= 4
    assert read == [0, 1, 2]  # classes are missing: every partition is read
