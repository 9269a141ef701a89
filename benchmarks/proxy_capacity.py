"""How much can the shared proxy network learn at all? Centralised training, no federation.

Trains E_proxy + a linear classifier (each `proxy_norm`), and the phone's CNN3 + a linear head
for comparison, on the first N rows of train.parquet pooled in one place (N = what 10 clients
of 400 training samples hold together), with the project's SGD, batches and augmentation, and
reports accuracy on the unified test set (the first 1,000 rows of test.parquet) after each
epoch. A federated proxy cannot do better than this; if it is far below FedAvg's whole model
here too, the network (not the federation) is the limit.

    python benchmarks/proxy_capacity.py --epochs 15
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import default_data_path, write_result  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.01, 0.05])
    args = parser.parse_args()
    from pfedes.data import batches, decode_images, image_format, load_split, load_unified_test
    from pfedes.models import ProxyExtractor
    from pfedes.models.cnn import CNN3

    torch.set_num_threads(1)
    path = default_data_path()
    table = load_split(path, "train")
    rows = np.arange(min(args.samples, len(table)))
    fmt = image_format(path)
    x, decoded = decode_images(table, rows, fmt)
    y = torch.from_numpy(np.asarray(table.data.column("label").take(rows).to_numpy(), dtype=np.int64)[decoded])
    x_test, y_test = load_unified_test(path, 1000)
    models = {f"proxy ({norm})": (lambda norm=norm: nn.Sequential(ProxyExtractor(128, norm), nn.Linear(128, 10)))
              for norm in ("none", "group")}
    models["cnn3 (phone)"] = lambda: nn.Sequential(CNN3(256), nn.Linear(256, 10))
    results = []
    for name, build in models.items():
        for lr in args.lrs:
            torch.manual_seed(0)
            model = build()
            optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
            generator = torch.Generator().manual_seed(0)
            curve = []
            start = time.perf_counter()
            for _ in range(args.epochs):
                model.train()
                for xb, yb in batches(x, y, 32, generator, train=True, do_augment=True, fmt=fmt):
                    loss = F.cross_entropy(model(xb), yb)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                model.eval()
                with torch.no_grad():
                    correct = sum(int((model(xb).argmax(1) == yb).sum())
                                  for xb, yb in batches(x_test, y_test, 250, None, train=False,
                                                                   do_augment=False, fmt=fmt))
                curve.append(correct / len(y_test))
            params = sum(p.numel() for p in model.parameters())
            results.append({"model": name, "lr": lr, "params": params, "test_acc_by_epoch": curve,
                            "best": max(curve), "seconds": time.perf_counter() - start})
            print(f"{name:14s} lr {lr:<5} {params:>7d} params  unified-test accuracy by epoch: "
                  + " ".join(f"{100 * a:.0f}" for a in curve), flush=True)
    out = write_result("proxy_capacity", {"command": " ".join(["python", "benchmarks/proxy_capacity.py", *sys.argv[1:]]),
                                          "samples": len(rows), "epochs": args.epochs, "results": results})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
