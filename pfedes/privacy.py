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

Why not Flower's strategy wrappers themselves: see docs/privacy.md. While central privacy is on,
the norm-anomaly rejection is off (which replies count must not depend on their private content
beyond the clipping), and the aggregation rule must be the plain mean without groups (the robust
rules and two-tier weights have another sensitivity).

`privacy.mode=local` moves the mechanism onto each client: Flower's own `LocalDpMod` clips the
client's update (what it sends minus what it received) and adds Gaussian noise to its train reply
before the reply leaves the device (`local_dp_mod`, the ClientApp's train mod, which calls it when
the run asks for it). The server then aggregates as without privacy (whatever it does with the
noisy replies is post-processing). Neighbouring relation: one client's whole local dataset
replaced by any other; its clipped update may then move anywhere in the ball of radius C around
what it received, so the L2 sensitivity is 2C, and the noise std is sigma * 2C. The epsilon
reported bounds what anyone who sees the client's replies, the server included, learns of its
dataset, composed over one release per round (the worst-case client, one that takes part in every
round; no amplification by sampling, which the server, choosing the sample, would see through).
It covers the shared arrays only: the metrics a reply carries (sample count, losses, accuracies,
device) are outside it.

`privacy.clipping=per_model` sets each reply's clipping norm from the size of what it shares:
C_i = clipping_norm * sqrt(n_i / reference_params), n_i its floating entries. The square root,
not the count: an update whose entries have a given typical size has an L2 norm that grows as the
square root of their number, so C_i clips payloads of different sizes alike. The central noise is
calibrated to the largest C_i of the round (one client moves the mean by at most max C_i / m), so
the guarantee holds whatever the mix; locally each client's noise is calibrated to its own C_i.
In the methods there are today, every reply of a run shares the same entries (the methods that
allow several architectures share an architecture-independent part: pFedES's proxy, the paper
form's generator, LG-FedAvg's head; those whose payload depends on the architecture need one), so
per_model sets one C per method and architecture, not one per reply.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Error, Message
from flwr.clientapp.mod import LocalDpMod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.constant import ErrorCode
from flwr.compat.common.parameter import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.supercore.differential_privacy import (add_gaussian_noise_inplace, add_localdp_gaussian_noise_to_params,
                                                 compute_clip_model_update, compute_stdv, get_norm)

from .settings import Section

MAX_NOISE_MULTIPLIER = 1000.0
MODES = ("central", "local")
CLIPPINGS = ("fixed", "per_model")


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


def floating_size(arrays: Mapping[str, Any]) -> int:
    """How many floating entries `arrays` (numpy arrays, or an ArrayRecord's Arrays) holds: what
    clipping and noise apply to."""
    values = [v.numpy() if isinstance(v, Array) else np.asarray(v) for v in arrays.values()]
    return int(sum(v.size for v in values if v.dtype.kind == "f"))


@dataclass(frozen=True)
class Privacy:
    noise_multiplier: float = 0.0
    clipping_norm: float = 1.0
    delta: float = 1e-5
    target_epsilon: float = 0.0
    mode: str = "central"
    clipping: str = "fixed"
    reference_params: int = 100_000

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any]) -> Privacy:
        """The run's settings, with the noise multiplier a target epsilon asks for; a bad setting
        raises ValueError naming it."""
        p = Section(cfg, "privacy")
        noise = p.number("noise_multiplier", 0.0, ">= 0", lambda v: v >= 0)
        clip = p.number("clipping_norm", 1.0, "> 0", lambda v: v > 0)
        delta = p.number("delta", 1e-5, "in (0, 1)", lambda v: 0 < v < 1)
        target = p.number("target_epsilon", 0.0, ">= 0 (0: none)", lambda v: v >= 0)
        mode = p.choice("mode", "central", MODES)
        clipping = p.choice("clipping", "fixed", CLIPPINGS)
        reference = p.integer("reference_params", 100_000, 1)
        privacy = cls(noise, clip, delta, target, mode, clipping, reference)
        if not privacy.enabled:
            return privacy
        if mode == "central":
            agg = dict(cfg.get("aggregation") or {})
            if agg.get("rule", "mean") != "mean" or agg.get("groups", "none") != "none":
                raise ValueError("privacy needs aggregation.rule=mean and aggregation.groups=none (the noise is "
                                 "calibrated for the plain mean of clipped updates)")
        else:
            from .compression import Codec

            if Codec.from_cfg(cfg).active:
                raise ValueError("privacy.mode=local needs compression off (compression.quantize=none, delta=false, "
                                 "topk=1): Flower's LocalDpMod clips the reply against the arrays received, key by "
                                 "key, and a compressed reply carries their encoding instead")
        if not accountant_available():
            raise ValueError("privacy needs the dp-accounting package (Flower's RDP accountant): "
                             "pip install -e \".[privacy]\"")
        if target:
            rounds, population = int(cfg["num_rounds"]), int(cfg["num_clients"])
            sample = max(1, int(float(cfg.get("fraction_train", 1.0)) * population))
            return cls(noise_for(target, rounds, sample, population, delta), clip, delta, target, mode, clipping,
                       reference)
        return privacy

    def client_section(self) -> dict[str, Any]:
        """The `privacy` settings a client adds local noise with: the noise multiplier resolved
        (no target epsilon left to solve for)."""
        return {**asdict(self), "target_epsilon": 0.0}

    @property
    def enabled(self) -> bool:
        return self.noise_multiplier > 0 or self.target_epsilon > 0

    @property
    def central(self) -> bool:
        """Clipping and noise on the server (privacy.mode=central, privacy on)."""
        return self.enabled and self.mode == "central"

    @property
    def local(self) -> bool:
        """Clipping and noise on each client (privacy.mode=local, privacy on)."""
        return self.enabled and self.mode == "local"

    def clip_norm_for(self, arrays: Mapping[str, Any]) -> float:
        """C_i of a reply sharing `arrays`: clipping_norm, or with per_model clipping
        clipping_norm * sqrt(floating entries / reference_params)."""
        if self.clipping == "fixed":
            return self.clipping_norm
        return self.clipping_norm * math.sqrt(floating_size(arrays) / self.reference_params)

    def clip(self, arrays: dict[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The reply with its floating update clipped to its C_i (`clip_norm_for`; an entry without
        a reference counts whole, as an update from zero)."""
        keys = [k for k, v in arrays.items() if np.asarray(v).dtype.kind == "f"]
        # flat: Flower's in-place scaling leaves a 0-d entry unscaled (np.subtract of two gives a scalar)
        sent = [np.asarray(arrays[k], np.float64).reshape(-1) for k in keys]
        refs = [np.asarray(reference[k], np.float64).reshape(-1) if k in reference
                and np.shape(reference[k]) == np.shape(arrays[k]) else np.zeros(np.size(arrays[k])) for k in keys]
        if get_norm([a - r for a, r in zip(sent, refs)]) > 0:  # Flower's clip divides by the norm
            compute_clip_model_update(sent, refs, self.clip_norm_for(arrays))
        return {**arrays, **{k: v.reshape(np.shape(arrays[k])).astype(np.asarray(arrays[k]).dtype)
                             for k, v in zip(keys, sent)}}

    def add_noise(self, mean: dict[str, np.ndarray], count: int, clip_norm: float | None = None) -> dict[str, np.ndarray]:
        """The mean of `count` clipped replies with the Gaussian noise of the mechanism: standard
        deviation noise_multiplier * clip_norm / count, clip_norm the largest C_i of the replies
        (default clipping_norm)."""
        keys = [k for k, v in mean.items() if v.dtype.kind == "f"]
        noisy = [np.array(mean[k], copy=True) for k in keys]
        norm = self.clipping_norm if clip_norm is None else clip_norm
        add_gaussian_noise_inplace(noisy, compute_stdv(self.noise_multiplier, norm, count))
        return {**mean, **dict(zip(keys, noisy))}

    def local_mod(self, received: Mapping[str, Any]) -> LocalDpMod:
        """Flower's LocalDpMod for a reply sharing `received`'s entries: clipping norm C_i,
        sensitivity 2 C_i (any two clipped updates are within 2 C_i), and the epsilon argument that
        makes its noise std (sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon) sigma * 2 C_i. That
        epsilon is the classic one-release calibration, valid only below 1; the epsilon reported
        is the accountant's over all rounds."""
        norm = self.clip_norm_for(received)
        return LocalDpMod(clipping_norm=norm, sensitivity=2 * norm,
                          epsilon=math.sqrt(2 * math.log(1.25 / self.delta)) / self.noise_multiplier, delta=self.delta)

    def local_noise_std(self, received: Mapping[str, Any]) -> float:
        """The standard deviation of each entry's local noise: sigma * 2 C_i."""
        return 2 * self.noise_multiplier * self.clip_norm_for(received)


@functools.lru_cache(maxsize=4)
def privacy_of_experiment(text: str) -> Privacy:
    """The privacy settings of a run's experiment JSON (a target epsilon's noise found once)."""
    return Privacy.from_cfg(json.loads(text))


_ZERO_UPDATE = "pfedes: the update is zero"


def local_dp_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """The ClientApp's train mod: Flower's LocalDpMod on the reply when the run's privacy.mode is
    local (the settings travel in the message, so the mod is chosen per message), else nothing.

    Around Flower's mod, without changing its math: it sees the floating entries only, in the
    order received and flattened (counters travel as they are, as with central DP; Flower's
    in-place scaling would leave a 0-d entry unclipped); an update of norm 0 (a
    client whose shared part did not train this round, such as pFedES's proxy during warm-up),
    which Flower's clipping cannot divide by, gets the same noise from Flower's
    `add_localdp_gaussian_noise_to_params` (clipping it changes nothing)."""
    config = msg.content.config_records.get("config")
    if config is None or "experiment" not in config or len(msg.content.array_records) != 1:
        return call_next(msg, ctxt)
    privacy = privacy_of_experiment(str(config["experiment"]))
    if not privacy.local:
        return call_next(msg, ctxt)
    name, received = next(iter(msg.content.array_records.items()))
    floating = [k for k, a in received.items() if a.numpy().dtype.kind == "f"]
    stash: dict[str, Any] = {}

    def flat(arrays: ArrayRecord) -> ArrayRecord:
        return ArrayRecord({k: Array(np.ascontiguousarray(arrays[k].numpy().reshape(-1))) for k in floating})

    def shaped(noisy: list[np.ndarray], arrays: ArrayRecord) -> ArrayRecord:
        """The reply's entries with the noisy floating ones, in their shapes, in the reply's order."""
        values = {k: Array(np.asarray(v).reshape(arrays[k].numpy().shape)) for k, v in zip(floating, noisy)}
        return ArrayRecord({k: values.get(k, a) for k, a in arrays.items()})

    def handler(inner: Message, context: Context) -> Message:
        msg.content[name] = received  # the handler gets every entry the server sent
        reply = call_next(msg, context)
        if reply.has_error() or len(reply.content.array_records) != 1:
            return reply  # Flower's mod passes an error on and refuses a reply without one ArrayRecord
        key, arrays = next(iter(reply.content.array_records.items()))
        if set(arrays) != set(received):
            return reply  # Flower's mod refuses it by name (keys differ from those received)
        stash.update(reply=reply, key=key, arrays=arrays)
        numbers = {k: a.numpy() for k, a in arrays.items()}
        update = [numbers[k].astype(np.float64) - received[k].numpy().astype(np.float64) for k in floating]
        if get_norm(update) == 0:
            return Message(Error(code=ErrorCode.UNKNOWN, reason=_ZERO_UPDATE), reply_to=inner)
        reply.content[key] = flat(arrays)
        return reply

    msg.content[name] = flat(received)  # what Flower's mod clips against
    try:
        out = privacy.local_mod(msg.content[name])(msg, ctxt, handler)
    finally:
        msg.content[name] = received
    if out.has_error() and out.error.reason == _ZERO_UPDATE:
        reply, key, arrays = stash["reply"], stash["key"], stash["arrays"]
        mod = privacy.local_mod(flat(received))
        noisy = parameters_to_ndarrays(add_localdp_gaussian_noise_to_params(
            ndarrays_to_parameters(flat(arrays).to_numpy_ndarrays()), mod.sensitivity, mod.epsilon, mod.delta))
        reply.content[key] = shaped(noisy, arrays)
        return reply
    if out.has_error() or "arrays" not in stash:
        return out
    noisy = next(iter(out.content.array_records.values()))
    out.content[stash["key"]] = shaped([noisy[k].numpy() for k in floating], stash["arrays"])
    return out


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
