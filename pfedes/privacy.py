"""Central differential privacy on what is shared, for every strategy that averages arrays
(`privacy.*`): the DP-FedAvg mechanism with fixed clipping, built from Flower's own pieces.

Each round, on the server, after a reply is decoded and validated:

1. its update (what it sent minus what the server sent it) is clipped to L2 norm `clipping_norm`
   (Flower's `compute_clip_model_update`, floating entries only);
2. the clipped replies are averaged with equal weights (the sample-weighted mean would let a
   client with many samples move the mean by more than C / m);
3. Gaussian noise of standard deviation `noise_multiplier * clipping_norm / m` is added to the
   average, m being the number of replies averaged (Flower's `compute_stdv` and
   `add_gaussian_noise_inplace`: the noise comes from numpy's unseeded generator, so a DP run is
   not bit-for-bit repeatable, and must not be: noise anyone can regenerate protects nothing);
4. server momentum follows (post-processing).

Accounting: Flower's `RdpAccountant` (which wraps Google's `dp-accounting`: maintained, and the
one Flower's own DP wrappers use), one Gaussian release per round, client-level neighbouring (one
client's data added or removed), no amplification by sampling (conservative: our sampling is a
fixed-size subset). The (epsilon, delta) spent so far is in every round's record (`dp_epsilon`)
and in the summary. With `target_epsilon` > 0 the noise multiplier is the smallest that keeps
epsilon at delta within the target after num_rounds.

Why not Flower's strategy wrappers themselves: see docs/privacy.md. While privacy is on, the
norm-anomaly rejection is off (which replies count must not depend on their private content
beyond the clipping), and the aggregation rule must be the plain mean without groups (the robust
rules and two-tier weights have another sensitivity).
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.supercore.differential_privacy import (add_gaussian_noise_inplace, compute_clip_model_update,
                                                 compute_stdv, get_norm)

from .settings import Section

MAX_NOISE_MULTIPLIER = 1000.0


def accountant_available() -> bool:
    return importlib.util.find_spec("dp_accounting") is not None


def make_accountant(population: int, delta: float):
    """Flower's RDP accountant: client-level, add-or-remove-one, no sampling amplification."""
    from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    return RdpAccountant(PrivacyConfig(target_delta=delta, population_size=population,
                                       neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                       sampling_method=SamplingMethod.NO_AMPLIFICATION))


def epsilon_after(noise_multiplier: float, releases: list[int], population: int, delta: float) -> float:
    """Epsilon at delta after one Gaussian release per entry of `releases` (its sample size)."""
    from flwr.supercore.privacy_accounting import GaussianPrivacyEvent

    accountant = make_accountant(population, delta)
    for size, count in Counter(releases).items():
        accountant.compose(GaussianPrivacyEvent(noise_multiplier=noise_multiplier, sample_size=max(1, size),
                                                population_size=population), count=count)
    return float(accountant.get_privacy_spent().epsilon) if releases else 0.0


@dataclass(frozen=True)
class Privacy:
    noise_multiplier: float = 0.0
    clipping_norm: float = 1.0
    delta: float = 1e-5
    target_epsilon: float = 0.0

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any]) -> Privacy:
        """The run's settings, with the noise multiplier a target epsilon asks for; a bad setting
        raises ValueError naming it."""
        p = Section(cfg, "privacy")
        noise = p.number("noise_multiplier", 0.0, ">= 0", lambda v: v >= 0)
        clip = p.number("clipping_norm", 1.0, "> 0", lambda v: v > 0)
        delta = p.number("delta", 1e-5, "in (0, 1)", lambda v: 0 < v < 1)
        target = p.number("target_epsilon", 0.0, ">= 0 (0: none)", lambda v: v >= 0)
        privacy = cls(noise, clip, delta, target)
        if not privacy.enabled:
            return privacy
        agg = dict(cfg.get("aggregation") or {})
        if agg.get("rule", "mean") != "mean" or agg.get("groups", "none") != "none":
            raise ValueError("privacy needs aggregation.rule=mean and aggregation.groups=none (the noise is "
                             "calibrated for the plain mean of clipped updates)")
        if not accountant_available():
            raise ValueError("privacy needs the dp-accounting package (Flower's RDP accountant): "
                             "pip install -e \".[privacy]\"")
        if target:
            rounds, population = int(cfg["num_rounds"]), int(cfg["num_clients"])
            sample = max(1, int(float(cfg.get("fraction_train", 1.0)) * population))
            return cls(noise_for(target, rounds, sample, population, delta), clip, delta, target)
        return privacy

    @property
    def enabled(self) -> bool:
        return self.noise_multiplier > 0 or self.target_epsilon > 0

    def clip(self, arrays: dict[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The reply with its floating update clipped to `clipping_norm` (an entry without a
        reference counts whole, as an update from zero)."""
        keys = [k for k, v in arrays.items() if np.asarray(v).dtype.kind == "f"]
        sent = [np.asarray(arrays[k], np.float64) for k in keys]
        refs = [np.asarray(reference[k], np.float64) if k in reference and np.shape(reference[k]) == np.shape(arrays[k])
                else np.zeros(np.shape(arrays[k])) for k in keys]
        if get_norm([a - r for a, r in zip(sent, refs)]) > 0:  # Flower's clip divides by the norm
            compute_clip_model_update(sent, refs, self.clipping_norm)
        return {**arrays, **{k: v.astype(np.asarray(arrays[k]).dtype) for k, v in zip(keys, sent)}}

    def add_noise(self, mean: dict[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
        """The mean of `count` clipped replies with the Gaussian noise of the mechanism."""
        keys = [k for k, v in mean.items() if v.dtype.kind == "f"]
        noisy = [np.array(mean[k], copy=True) for k in keys]
        add_gaussian_noise_inplace(noisy, compute_stdv(self.noise_multiplier, self.clipping_norm, count))
        return {**mean, **dict(zip(keys, noisy))}


def noise_for(target: float, rounds: int, sample: int, population: int, delta: float) -> float:
    """The smallest noise multiplier (to 1 %) with epsilon <= target after `rounds` releases."""
    if epsilon_after(MAX_NOISE_MULTIPLIER, [sample] * rounds, population, delta) > target:
        raise ValueError(f"privacy.target_epsilon {target:g} is unreachable in {rounds} rounds: it needs a noise "
                         f"multiplier above {MAX_NOISE_MULTIPLIER:g}")
    low, high = 0.0, MAX_NOISE_MULTIPLIER
    while high - low > 0.01 * high:
        mid = (low + high) / 2
        if mid > 0 and epsilon_after(mid, [sample] * rounds, population, delta) <= target:
            high = mid
        else:
            low = mid
    return high
