"""Before any run: how heterogeneous the clients' label distributions are (mean pairwise
Jensen-Shannon divergence, per-client label histograms), exactly as the clients load them."""

from __future__ import annotations

from typing import Any

import numpy as np


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence (base 2, so in [0, 1]) of two distributions."""
    p, q = p / p.sum(), q / q.sum()
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> float:
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / m[mask])))

    return 0.5 * kl(p) + 0.5 * kl(q)


def mean_pairwise_jsd(histograms: np.ndarray) -> float:
    n = len(histograms)
    pairs = [js_divergence(histograms[i], histograms[j]) for i in range(n) for j in range(i + 1, n)]
    return float(np.mean(pairs)) if pairs else 0.0


def label_histograms(cfg: dict[str, Any]) -> np.ndarray:
    """Per client (rows) the count of each label (columns) in its local data, train and test,
    exactly as the clients of this configuration load it."""
    from ..data import DataSource, load_client_data

    d = cfg["data"]
    rows = []
    for pid in range(int(cfg["num_clients"])):
        data = load_client_data(DataSource.from_cfg(d), d["partition"], int(cfg["num_clients"]), pid, int(cfg["seed"]),
                                int(d["classes_per_client"]), float(d["alpha"]),
                                int(d["samples_per_client"]), float(d["test_fraction"]))
        labels = np.concatenate([data.y_train.numpy(), data.y_test.numpy()])
        rows.append(np.bincount(labels, minlength=data.num_classes))
    return np.stack(rows)


def heterogeneity_note(jsd: float) -> str:
    if jsd < 0.1:
        return "close to IID in labels: feature shift is the likelier problem"
    if jsd > 0.3:
        return "strong label skew"
    return "moderate label skew"


def histogram_table(histograms: np.ndarray) -> str:
    head = "| client | " + " | ".join(str(c) for c in range(histograms.shape[1])) + " | total |"
    rule = "|---" * (histograms.shape[1] + 2) + "|"
    body = [f"| {i} | " + " | ".join(str(int(v)) for v in row) + f" | {int(row.sum())} |"
            for i, row in enumerate(histograms)]
    return "\n".join([head, rule, *body])

