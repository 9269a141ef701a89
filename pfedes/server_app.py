"""The ServerApp: compose the experiment from conf/ (Flower's run config overrides it), start
the method's strategy with its initial shared entries, and log every round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from hydra.utils import get_class

from .config import experiment_config, overrides_from_run_config
from .data import load_split, load_unified_test, num_classes_of
from .models import resolve_architecture
from .recording import RunRecorder
from .strategies.base import experiment_json

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = experiment_config(overrides_from_run_config(dict(context.run_config)))
    run_experiment(grid, cfg)


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """Fix paths that clients read (absolute out_dir, client_state_dir) into the config."""
    cfg = dict(cfg)
    out_dir = Path(cfg["out_dir"]).expanduser().resolve()
    cfg["out_dir"] = str(out_dir)
    cfg.setdefault("client_state_dir", str(out_dir / "client_state"))
    return cfg


def run_experiment(grid: Grid, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg = prepare(cfg)
    strategy_cls = get_class(cfg["strategy"]["server"])
    trainer_cls = get_class(cfg["strategy"]["trainer"])
    num_classes = num_classes_of(load_split(cfg["data"]["path"], "train"))
    arch = resolve_architecture(cfg["clients"]["devices"][0], cfg["model"]["profiles"])
    initial = trainer_cls.initial_shared(cfg, arch, num_classes)
    strategy = strategy_cls(cfg)
    recorder = RunRecorder(Path(cfg["out_dir"]), cfg)

    global_model = trainer_cls(cfg, arch, num_classes, seed=int(cfg["seed"])) \
        if trainer_cls.has_global_model else None

    def after_round(server_round: int, arrays: ArrayRecord):
        """Flower's server-side evaluation hook: global accuracy (if any), then the run log."""
        if server_round == 0:
            return None
        extra = None
        if global_model is not None and len(arrays):
            x, y = load_unified_test(cfg["data"]["path"], int(cfg["data"]["unified_test_samples"]))
            global_model.load_shared(arrays.to_torch_state_dict())
            extra = {"global_acc": global_model.accuracy(x, y, global_model.global_predict)["accuracy"]}
        recorder.record(server_round, strategy.pop_round_stats(), extra)
        return MetricRecord(extra) if extra else None

    exp = ConfigRecord({"experiment": experiment_json(cfg)})
    strategy.start(grid=grid, initial_arrays=ArrayRecord(initial), num_rounds=int(cfg["num_rounds"]),
                   train_config=exp, evaluate_config=ConfigRecord(dict(exp)), evaluate_fn=after_round)
    model_params = {}
    for device in sorted(set(cfg["clients"]["devices"])):
        device_arch = resolve_architecture(device, cfg["model"]["profiles"])
        model = trainer_cls(cfg, device_arch, num_classes, seed=0)
        model_params[device] = sum(p.numel() for p in model.model.parameters())
    return recorder.finish({
        "proxy_params": int(sum(v.numel() for v in initial.values())),
        "shared_keys": list(initial),
        "model_params_by_device": model_params,
    })
