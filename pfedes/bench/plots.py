"""The bench's curves.png: each strategy's mean personalized accuracy by round, over seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .runs import Run


def plot_curves(path: Path, strategies: list[str], runs: list[Run]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = ["-", "--", ":", "-."]  # 10 colours repeat: the line style tells strategies apart
    for i, name in enumerate(strategies):
        curves: dict[int, list[float]] = {}
        for r in runs:
            if r.strategy == name and r.status == "ok":
                for rec in r.rounds:
                    if rec.get("acc_mean") is not None:
                        curves.setdefault(rec["round"], []).append(rec["acc_mean"])
        if curves:
            xs = sorted(curves)
            ax.plot(xs, [np.mean(curves[x]) for x in xs], marker="o", markersize=3, label=name,
                    color=f"C{i % 10}", linestyle=styles[(i // 10) % len(styles)])
    ax.set_xlabel("round")
    ax.set_ylabel("mean personalized accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=1, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


