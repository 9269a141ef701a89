"""Local training throughput against the physical limit, per device profile: samples/s of the
method's local training through the app (real data: decoding done once, batching, augmentation,
the trainer) against the same trainer's steps on random tensors of the same shape (no data
pipeline at all). Epochs of the two alternate and the best of each counts, so that a busy
machine slows both sides alike.

    python benchmarks/throughput.py [hydra overrides]
"""

from __future__ import annotations

import os
import sys
import time

import torch

from _common import default_data_path, experiment, print_table, write_result


def main(argv: list[str]) -> None:
    from pfedes.client_round import build_trainer, load_node_data
    from pfedes.models import resolve_architecture

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    # No pFedES warm-up: its frozen-backbone steps are cheaper and would flatter the app's side.
    cfg = experiment(argv, num_clients=10, **{"data.samples_per_client": 500,
                                              "data.path": default_data_path(),
                                              "strategy.warmup_steps": 0})
    epochs = 5
    rows = []
    for p, device in enumerate(cfg["clients"]["devices"]):
        arch = resolve_architecture(device, cfg["model"]["profiles"])
        data = load_node_data(cfg, cfg["data"]["path"], p, int(cfg["num_clients"]))
        trainer = build_trainer(cfg, arch, data.num_classes, p, image=data.image_format)
        trainer.fit(data, torch.Generator().manual_seed(0))  # warm-up (allocator, first calls)
        bs = int(cfg["train"]["batch_size"])
        n_batches = -(-data.num_train // bs)
        x = torch.randn(bs, *data.x_train.shape[1:])
        y = torch.randint(0, data.num_classes, (bs,))
        # Interleaved epochs, best of each: a busy machine slows both sides alike.
        app_times, limit_times = [], []
        for e in range(epochs):
            t0 = time.perf_counter()
            trainer.fit(data, torch.Generator().manual_seed(e + 1))
            app_times.append(time.perf_counter() - t0)
            trainer.model.train()
            trainer.begin_round()
            t0 = time.perf_counter()
            for _ in range(n_batches):
                trainer.train_step(x, y)
            limit_times.append(time.perf_counter() - t0)
        app = data.num_train / min(app_times)
        limit = n_batches * bs / min(limit_times)
        rows.append({"device": device, "arch": arch, "app_samples_per_s": app,
                     "random_tensor_samples_per_s": limit, "ratio": app / limit})
    print_table(rows, ["device", "arch", "app_samples_per_s", "random_tensor_samples_per_s", "ratio"])
    print(f"\nthreads {threads}; target ratio >= 0.85 per profile")
    path = write_result("throughput", {"overrides": argv, "threads": threads, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
