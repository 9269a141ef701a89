"""The global accuracy of finished runs' last shared model, from their server checkpoints: for
runs made before a method reported it per round (e.g. pFedES's proxy with its shared classifier,
scored since the default shares one). The unified test set and the scoring are the ServerApp's.
Server checkpoints are not committed (.gitignore): this reads the runs made on this machine.

    python benchmarks/score_global.py benchmarks/results/hetero_dirichlet_val [more bench dirs]

Prints one line per run and the mean ± std per strategy; writes <dir>/global_accuracy.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from pfedes.config import with_registered_method
from pfedes.data import DataSource, image_format, load_unified_test, num_classes_of
from pfedes.methods import method_of
from pfedes.models import resolve_architecture


def score(run_dir: Path) -> float | None:
    """Global accuracy of the run's last shared model, None if the method has no global model."""
    cfg = with_registered_method(json.loads((run_dir / "summary.json").read_text())["config"])
    arrays = torch.load(run_dir / "server_checkpoint.pt", map_location="cpu", weights_only=False)["arrays"]
    source = DataSource.from_cfg(cfg["data"])
    num_classes = num_classes_of(source)
    arch = resolve_architecture(cfg["clients"]["devices"][0], cfg["model"]["profiles"])
    trainer = method_of(cfg).trainer(cfg, arch, num_classes, seed=int(cfg["seed"]), image=image_format(source))
    if not trainer.has_global_model:
        return None
    trainer.load_shared({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()})
    x, y = load_unified_test(source, int(cfg["data"]["unified_test_samples"]))
    return trainer.accuracy(x, y, trainer.global_predict)["accuracy"]


def main(dirs: list[str]) -> None:
    for bench_dir in map(Path, dirs):
        found: dict[str, dict[str, float]] = {}
        for summary in sorted(bench_dir.glob("*/seed*/summary.json")):
            run = summary.parent
            if not (run / "server_checkpoint.pt").is_file():  # nothing shared (Local-only)
                continue
            acc = score(run)
            if acc is not None:
                found.setdefault(run.parent.name, {})[run.name] = acc
                print(f"{run.parent.name} {run.name}: global accuracy {100 * acc:.1f}%", flush=True)
        for strategy, accs in found.items():
            values = 100 * np.array(list(accs.values()))
            print(f"{bench_dir.name} {strategy}: {values.mean():.1f} ± {values.std(ddof=1) if len(values) > 1 else 0:.1f}"
                  f" over {len(values)} seeds")
        (bench_dir / "global_accuracy.json").write_text(json.dumps(
            {"command": "python benchmarks/score_global.py " + " ".join(dirs), "global_accuracy": found}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
