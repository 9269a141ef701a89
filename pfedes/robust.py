"""Robust aggregation, for every strategy (`aggregation.*`): which accepted replies count, and how
the server combines them before its server momentum.

- Norm-anomaly rejection (on by default): a reply whose update norm, ||sent - what the server sent
  it||, exceeds `norm_threshold` x the median of the round's non-zero norms is dropped, with a
  warning naming the node. It needs 3 non-zero norms or more (with 2, the median cannot tell which
  is the outlier).
- Direction-anomaly rejection (`min_cosine`, off by default): a reply whose update points away
  from the round's consensus, a cosine similarity with the coordinate-wise median of the round's
  other non-zero updates below `min_cosine`, is dropped with a warning naming the node. Sparse
  updates (top-k) are compared on the coordinates they sent, each against the median of the others
  that sent it: the plain median of top-10 % updates is 0 almost everywhere, their cosines with it
  lie at 0, and the round's floor then dropped about one honest reply a round. A
  sign-flipped update has an honest norm and passes the norm check; its cosine is about minus an
  honest one's. The median is robust to any minority of attackers and leaves the update itself
  out; it needs 3 non-zero updates or more, as the norm check. Only for replies that train the
  sent arrays further, all from the same arrays (not per-class means, not CFL's clusters, whose
  updates oppose each other by design). Not on by default: under strong label skew honest
  updates become near-orthogonal (README, "Robust aggregation"), and 0 would drop some of them.
- Direction check relative to the round (`direction_spread` k, on by default at 4): a reply whose
  cosine (as above) lies more than k robust standard deviations (1.4826 x the MAD of the round's
  cosines) below the round's median cosine is dropped. It needs no threshold on the cosine itself:
  near the plateau honest updates pull against each other (their sum is about zero) and every
  cosine turns slightly negative, while a flipped one stays far below the rest. A reply whose
  cosine is 0 or more still points toward the others and is never dropped by this floor (early
  on, when the updates agree, the spread is narrow and the floor would otherwise be positive). It
  needs 5 cosines or more (fewer give no spread).
- Memory of the direction checks (`direction_strikes` n, on by default at 3): a node whose reply the
  direction check dropped in n rounds or more, and in a share `strike_share` (a quarter by
  default) or more of the rounds it was checked in, is quarantined: its replies are set aside for
  the rest of the run (logged once, with the node id; the record is in the server checkpoint, so a
  resumed run keeps it). With `strike_spread` s (off by default) a round also counts against a
  node when its cosine lay more than s robust standard deviations below the round's median, and
  below 0, though not dropped: under strong label skew a flipped update can stay within the k
  spreads of each round, yet lie past s in many of its rounds (README, "Robust aggregation"). A check without
  memory lets a flipper back in: once its updates are set aside the federation settles where the
  honest updates cancel, and there a flipped update no longer stands out (README, "Robust
  aggregation"). An honest node is dropped now and then, never in a quarter of its rounds.
- The rule that combines the rest, per entry:
  - `mean`: the sample-weighted average (FedAvg's);
  - `trimmed_mean`: per coordinate, the mean after cutting `trim_fraction` of the values at each
    end (Flower's `fedtrimmedavg.trim_mean`);
  - `median`: the per-coordinate median (what Flower's FedMedian computes);
  - `krum` / `multikrum`: the replies Flower's `multikrum.select_multikrum` picks, tolerating
    `num_malicious` attackers (one reply for krum; n - f for multikrum), then their weighted average.
  The robust rules are unweighted, as Flower's are. Integer entries (counters) are rounded back.
- Contribution weighting (`weighting`): `samples` (the default); `val_score`, a softmax over
  the validation accuracy each client reports with its train reply (its personal model on its
  validation split after training; untrusted: a missing or non-finite score drops the reply, a
  score outside [0, 1] is clipped) at `temperature`; or `quality`, the FQI/DLI blend of
  pfedes/contribution.py, which decides the share `quality_blend` of the weight.
- Two-tier aggregation (`groups`: `device` or `arch`): the rule inside each group of replies
  first, then the groups' results averaged with `group_weighting` `equal` (a few GPU hosts weigh
  as much as many phones) or `samples` (with the mean rule, the same as no groups).

Flower's strategies FedTrimmedAvg, FedMedian, Krum and MultiKrum aggregate whole replies in their
own `aggregate_train`; ours carry partial payloads, extra records and a momentum step, so their
aggregation functions are reused here rather than the strategies themselves. Per-class payloads
(FedProto, FD, FedGH) are averaged per class over the clients that hold the class; the robust
rules do not apply to them, the norm rejection does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum

from .contribution import quality_weights
from .settings import Section

RULES = ("mean", "trimmed_mean", "median", "krum", "multikrum")
GROUPS = ("none", "device", "arch")  # two-tier aggregation: by device profile, or by architecture
GROUP_WEIGHTING = ("equal", "samples")
WEIGHTINGS = ("samples", "val_score", "quality")  # each reply's weight: its samples, softmax(score / T), FQI/DLI
SCORE_KEY = "val_score"  # the train reply's metric behind `val_score` weighting (untrusted: clipped to [0, 1])
MIN_REPLIES_FOR_NORM_CHECK = 3
MIN_COSINES_FOR_SPREAD = 5
MAD_TO_STD = 1.4826  # the MAD of normal samples times this estimates their standard deviation


@dataclass(frozen=True)
class Robustness:
    rule: str = "mean"
    trim_fraction: float = 0.1
    num_malicious: int = 0
    norm_threshold: float = 10.0
    min_cosine: float = -1.0
    direction_spread: float = 4.0
    direction_strikes: int = 3
    strike_spread: float = 0.0
    strike_share: float = 0.25
    groups: str = "none"
    group_weighting: str = "equal"
    weighting: str = "samples"
    temperature: float = 0.1
    quality_blend: float = 0.5

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any]) -> Robustness:
        """The run's settings; a bad one raises ValueError naming it."""
        a = Section(cfg, "aggregation")
        weighting = a.choice("weighting", "samples", WEIGHTINGS)
        robust = cls(a.choice("rule", "mean", RULES),
                     a.number("trim_fraction", 0.1, "in [0, 0.5)", lambda v: 0 <= v < 0.5),
                     a.integer("num_malicious", 0, 0),
                     a.number("norm_threshold", 10.0, "0 (off) or > 1", lambda v: v == 0 or v > 1),
                     a.number("min_cosine", -1.0, "in [-1, 1) (-1: off)", lambda v: -1 <= v < 1),
                     a.number("direction_spread", 4.0, ">= 0 (0: off)", lambda v: v >= 0),
                     a.integer("direction_strikes", 3, 0),
                     a.number("strike_spread", 0.0, ">= 0 (0: only drops count)", lambda v: v >= 0),
                     a.number("strike_share", 0.25, "in (0, 1]", lambda v: 0 < v <= 1),
                     a.choice("groups", "none", GROUPS), a.choice("group_weighting", "equal", GROUP_WEIGHTING),
                     weighting, a.number("temperature", 0.1, "> 0", lambda v: v > 0),
                     a.number("quality_blend", 0.5, "in [0, 1]", lambda v: 0 <= v <= 1))
        if robust.direction_strikes and not robust.checks_direction:
            a.fail("direction_strikes", f"= {robust.direction_strikes} counts the drops of a direction check and "
                   "none is on (aggregation.direction_spread=0, min_cosine=-1): set it to 0 as well")
        if robust.strike_spread and not robust.direction_strikes:
            a.fail("strike_spread", f"= {robust.strike_spread} decides which rounds count toward direction_strikes, "
                   "which is off (0): set it to 0 as well")
        return robust

    @property
    def needs_validation_split(self) -> str | None:
        """The setting that reads each client's validation split, if one does (config.validate
        then requires data.val_fraction > 0)."""
        return "aggregation.weighting=val_score" if self.weighting == "val_score" else None

    # -- what each reply weighs ---------------------------------------------------------------
    def reply_weights(self, metrics: list[Mapping[str, Any]], samples: list[float]) -> list[float]:
        """The weights of the accepted replies in the mean: their samples, or (`val_score`) a
        softmax over their reported validation scores, clipped to [0, 1], at `temperature`, or
        (`quality`) the FQI/DLI blend."""
        if self.weighting == "samples":
            return samples
        if self.weighting == "quality":
            return quality_weights(samples, metrics, self.quality_blend)
        scores = np.clip([float(m[SCORE_KEY]) for m in metrics], 0.0, 1.0) / self.temperature
        weights = np.exp(scores - scores.max())
        return list(weights / weights.sum())

    # -- which replies count --------------------------------------------------------------
    def norm_outliers(self, norms: list[float]) -> tuple[list[int], float]:
        """(indices of the norms above threshold x the median of the non-zero ones, that median).
        A reply that changed nothing (a client still warming up) says nothing about the scale."""
        moved = [n for n in norms if n > 0]
        if not self.norm_threshold or len(moved) < MIN_REPLIES_FOR_NORM_CHECK:
            return [], float("nan")
        median = float(np.median(moved))
        return [i for i, n in enumerate(norms) if n > self.norm_threshold * median], median

    @property
    def checks_direction(self) -> bool:
        return self.min_cosine > -1 or self.direction_spread > 0

    def direction_outliers(self, updates: list[np.ndarray]) -> tuple[list[int], list[float], float]:
        """(indices of the updates whose cosine with the coordinate-wise median of the other non-zero
        updates is below the floor; every update's cosine: nan for a zero update or when there are
        fewer than 3 non-zero ones; the floor: min_cosine or, with direction_spread k, the round's
        median cosine minus k robust standard deviations where that is higher and below 0). A zero
        update (a client still warming up) is never dropped. The median leaves the update itself
        out: with few replies it would otherwise lean toward each of them, a flipped one included.
        An update is compared on the coordinates it sent (its non-zero ones), each against the
        median of the others that sent it: the same as the plain median for dense updates."""
        moved = [i for i, u in enumerate(updates) if np.any(u)]
        cosines = [math.nan] * len(updates)
        if len(moved) < MIN_REPLIES_FOR_NORM_CHECK:
            return [], cosines, -1.0
        stacked = np.stack([updates[i] for i in moved])
        for i, others in zip(moved, medians_of_the_others(stacked)):
            others = np.where(updates[i] != 0, others, 0.0)  # on the coordinates the update sent
            scale = float(np.linalg.norm(others))
            if scale > 0:
                cosines[i] = float(updates[i] @ others) / (float(np.linalg.norm(updates[i])) * scale)
        floor = max(self.min_cosine, relative_floor(cosines, self.direction_spread))
        return [i for i, c in enumerate(cosines) if self.checks_direction and c < floor], cosines, floor

    def strikes(self, cosines: list[float], away: list[int]) -> list[bool]:
        """Per cosine of a direction check: whether the round counts against its node
        (`direction_strikes`): it was dropped (`away`), or, with `strike_spread` s, it lay more than s
        robust standard deviations below the round's median cosine, and below 0."""
        floor = relative_floor(cosines, self.strike_spread)
        return [i in away or c < floor for i, c in enumerate(cosines)]

    # -- how they combine ----------------------------------------------------------------
    def combine(self, arrays: list[dict[str, np.ndarray]], weights: list[float],
                groups: list[str] | None = None) -> dict[str, np.ndarray]:
        """The round's aggregate of the accepted entries under the rule; with `groups` (one name per
        reply) two-tier: the rule inside each group, then the groups' results averaged, each group
        weighing the same (`equal`) or its replies' summed weight (`samples`)."""
        if groups is None:
            return self.combine_flat(arrays, weights)
        members: dict[str, list[int]] = {}
        for i, group in enumerate(groups):
            members.setdefault(group, []).append(i)
        tiers = [self.combine_flat([arrays[i] for i in idx], [weights[i] for i in idx]) for idx in members.values()]
        across = [1.0 if self.group_weighting == "equal" else float(sum(weights[i] for i in idx))
                  for idx in members.values()]
        return weighted_average(tiers, across)

    def combine_flat(self, arrays: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
        """The rule over all the given replies."""
        if self.rule in ("krum", "multikrum"):
            keep = self.krum_selection(arrays)
            return weighted_average([arrays[i] for i in keep], [weights[i] for i in keep])
        if self.rule == "mean":
            return weighted_average(arrays, weights)
        out = {}
        for key, first in arrays[0].items():
            stacked = np.stack([a[key] for a in arrays]).astype(np.float64, copy=False)
            value = (np.median(stacked, axis=0) if self.rule == "median"
                     else trim_mean(stacked, self.trim_fraction))
            out[key] = _cast(np.asarray(value), first.dtype)
        return out

    def krum_selection(self, arrays: list[dict[str, np.ndarray]]) -> list[int]:
        """Indices of the replies Flower's (Multi-)Krum selects."""
        contents = [RecordDict({"arrays": ArrayRecord({k: Array(np.asarray(v, np.float64))
                                                       for k, v in a.items()})}) for a in arrays]
        count = 1 if self.rule == "krum" else max(1, len(arrays) - self.num_malicious)
        chosen = select_multikrum(contents, self.num_malicious, count)
        return sorted(i for i, c in enumerate(contents) if any(c is s for s in chosen))


class DirectionStrikes:
    """What the server remembers of each node's direction checks (`direction_strikes`): the rounds
    its reply was checked in, those that counted against it, and the nodes quarantined for the run."""

    def __init__(self, limit: int, share: float = 0.25) -> None:
        self.limit, self.share = limit, share
        self.checked: dict[int, int] = {}
        self.strikes: dict[int, int] = {}
        self.quarantined: set[int] = set()

    def record(self, node: int, struck: bool) -> bool:
        """Count one check of `node` (`struck`: it counts against it); True when this one quarantines it."""
        self.checked[node] = self.checked.get(node, 0) + 1
        self.strikes[node] = self.strikes.get(node, 0) + int(struck)
        if (self.limit and node not in self.quarantined and self.strikes[node] >= self.limit
                and self.strikes[node] >= self.share * self.checked[node]):
            self.quarantined.add(node)
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"checked": dict(self.checked), "strikes": dict(self.strikes), "quarantined": sorted(self.quarantined)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.checked = {int(k): int(v) for k, v in (state.get("checked") or {}).items()}
        self.strikes = {int(k): int(v) for k, v in (state.get("strikes") or {}).items()}
        self.quarantined = {int(n) for n in state.get("quarantined") or []}


def relative_floor(cosines: list[float], spreads: float) -> float:
    """The round's median cosine minus `spreads` robust standard deviations (1.4826 x the MAD of its
    finite cosines), where that is below 0 (an aligned update is never below it); -1 (nothing is
    below it) with `spreads` 0 or fewer than 5 finite cosines."""
    finite = np.array([c for c in cosines if math.isfinite(c)])
    if spreads <= 0 or len(finite) < MIN_COSINES_FOR_SPREAD:
        return -1.0
    median = float(np.median(finite))
    return min(0.0, median - spreads * MAD_TO_STD * float(np.median(np.abs(finite - median))))


def flat_update(arrays: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> np.ndarray:
    """arrays - reference over the floating entries, flattened in key order into one float64 vector
    (an entry without a reference counts whole)."""
    parts = []
    for key in sorted(arrays):
        value = np.asarray(arrays[key])
        if value.dtype.kind != "f":
            continue
        ref = reference.get(key)
        parts.append((value.astype(np.float64) - (ref if ref is not None and np.shape(ref) == value.shape else 0.0)
                      ).ravel())
    return np.concatenate(parts) if parts else np.zeros(0)


def medians_of_the_others(stacked: np.ndarray) -> np.ndarray:
    """Row i: per coordinate, the median of the other rows of `stacked` (n x d, n >= 3) that sent
    it (a non-zero value), 0 where none did; from one sort: the values a row did not send sort last,
    and leaving out a sent value of rank r shifts the ranks above it down by one. With no zeros, the
    plain coordinate-wise median of the others. A top-k sparse update sends a tenth of the
    coordinates: the plain median of ten such rows is 0 almost everywhere, and so says nothing."""
    n = len(stacked)
    sent = stacked != 0
    values = np.where(sent, stacked, np.inf)  # not sent: sorts last (replies are finite, checked before)
    order = np.sort(values, axis=0)
    rank = np.empty_like(stacked, dtype=np.int64)
    np.put_along_axis(rank, np.argsort(values, axis=0, kind="stable"), np.arange(n)[:, None], axis=0)
    count = sent.sum(axis=0) - sent  # how many of the others sent each coordinate

    def kept(q: np.ndarray) -> np.ndarray:  # the value at position q of each row's kept values
        q = np.clip(q, 0, n - 2)
        return np.where(rank > q, np.take_along_axis(order, q, axis=0), np.take_along_axis(order, q + 1, axis=0))

    middle = kept((count - 1) // 2)
    median = np.where(count % 2, middle, (kept(count // 2 - 1) + kept(count // 2)) / 2)
    return np.where(count > 0, median, 0.0)


def weighted_average(arrays: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
    """Sample-weighted mean per key, computed in float64 and cast back to each key's dtype."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    out = {}
    for key, first in arrays[0].items():
        stacked = np.stack([a[key] for a in arrays]).astype(np.float64, copy=False)
        out[key] = _cast(np.tensordot(w, stacked, axes=1), first.dtype)
    return out


def _cast(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.asarray(np.rint(value) if np.dtype(dtype).kind in "iub" else value).astype(dtype)
