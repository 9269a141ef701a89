"""Where a client trains: `train.device` (auto | cpu | cuda | cuda:N | mps), resolved to a torch
device on the machine that trains, and `train.amp` (none | bf16), the precision of its steps;
each may be set per device profile (`train.by_device.<profile>.device`, `.amp`).

`auto` is CUDA where torch sees a CUDA device, else MPS where there is one, else the CPU.
`amp=bf16` runs the training steps and evaluation forwards under bfloat16 autocast, on CUDA
only: on a CPU, bf16 autocast is slower than float32 on most processors and changes the
results, so a profile that trains on the CPU (or MPS) and asks for it is refused.

A setting is checked in two places. Its spelling, and bf16 against an explicit cpu/mps device,
wherever the configuration is validated (`setting_problem`, on any machine, the server's
included). Whether the device exists only on the machine that trains: by the simulation before
anything starts (`check_simulation_devices`, for the profiles it runs and the GPUs Ray gives
them), and by a deployed SuperNode when its client first sets up (`placement_for`): the node's
error, not the server's. Each failure is one line naming the setting.

torch is imported inside the functions that need it: validating a configuration stays light.
"""

from __future__ import annotations

import math
import re
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .config import ConfigError

if TYPE_CHECKING:
    import torch

DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N", "mps")
AMP_MODES = ("none", "bf16")
_DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
BF16_ON_CUDA_ONLY = ("bf16 autocast is offered on CUDA only (on a CPU it is slower than float32 on most "
                     "processors and changes the results)")


class DeviceError(ConfigError):
    """A device setting that is misspelt or names a device this machine does not have; the
    message names the setting."""


@dataclass(frozen=True)
class Placement:
    """The torch device a client trains on and the precision of its steps."""

    device: torch.device
    amp: str = "none"

    def autocast(self):
        """The context the training steps and evaluation forwards run in. A method's step is one
        function (forward, backward, optimizer step), so the whole of it runs inside: PyTorch
        advises autocast around the forwards only, but backward ops run in their forward's
        dtypes either way, and bf16 needs no gradient scaling."""
        if self.amp == "bf16":
            import torch

            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()


def cpu_placement() -> Placement:
    import torch

    return Placement(torch.device("cpu"))


def setting_name(cfg: dict[str, Any], profile: str | None, key: str) -> str:
    """The dotted key a profile's `key` comes from: its own train.by_device entry if set, else train's."""
    own = ((cfg["train"].get("by_device") or {}).get(profile) or {}) if profile is not None else {}
    return f"train.by_device.{profile}.{key}" if own.get(key) is not None else f"train.{key}"


def effective(cfg: dict[str, Any], profile: str | None, key: str, default: str) -> str:
    """A profile's value of train.`key` (its own, else train's, else `default`)."""
    own = ((cfg["train"].get("by_device") or {}).get(profile) or {}) if profile is not None else {}
    value = own.get(key)
    return str(cfg["train"].get(key, default) if value is None else value)


def spelling_problem(name: str, value: Any) -> str | None:
    """Why `value` is no device setting (`name` its dotted key), or None."""
    if not isinstance(value, str) or not _DEVICE_PATTERN.fullmatch(value):
        return f"{name}='{value}' is unknown: expected one of {list(DEVICE_NAMES)}"
    return None


def setting_problem(cfg: dict[str, Any]) -> str | None:
    """Why the device and precision settings cannot be right on any machine, or None: a misspelt
    device or amp, or amp=bf16 for a profile that trains on an explicit cpu or mps device."""
    profiles = [*dict.fromkeys([*cfg["model"]["profiles"], *cfg["clients"]["devices"]]), None]
    for profile in profiles:
        device_key, amp_key = setting_name(cfg, profile, "device"), setting_name(cfg, profile, "amp")
        device, amp = effective(cfg, profile, "device", "cpu"), effective(cfg, profile, "amp", "none")
        problem = spelling_problem(device_key, device)
        if problem:
            return problem
        if amp not in AMP_MODES:
            return f"{amp_key}='{amp}' is unknown: expected one of {list(AMP_MODES)}"
        if amp == "bf16" and device in ("cpu", "mps"):
            who = f"profile '{profile}'" if profile is not None else "a client without a profile of its own"
            return (f"{amp_key}=bf16: {BF16_ON_CUDA_ONLY}, and {who} trains on {device_key}='{device}'; "
                    f"set amp per profile, e.g. train.by_device.gpu-host.amp=bf16")
    return None


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(name: str, value: str, cuda_devices: int | None = None,
                   where: str = "on this machine") -> torch.device:
    """The torch device `value` means here (`cuda_devices`: the CUDA devices a client sees,
    default torch's count); one DeviceError line naming `name` if it does not exist."""
    import torch

    problem = spelling_problem(name, value)
    if problem:
        raise DeviceError(problem)
    count = cuda_device_count() if cuda_devices is None else cuda_devices
    if value == "auto":
        return torch.device("cuda" if count else "mps" if mps_available() else "cpu")
    if value.startswith("cuda"):
        index = int(value.split(":")[1]) if ":" in value else 0
        if count == 0:
            raise DeviceError(f"{name}='{value}': no CUDA device is available {where} "
                              f"(train.device=auto falls back to the CPU)")
        if index >= count:
            raise DeviceError(f"{name}='{value}': {where} there {'is' if count == 1 else 'are'} {count} CUDA "
                              f"device(s), cuda:0 to cuda:{count - 1}")
        return torch.device(value)
    if value == "mps" and not mps_available():
        raise DeviceError(f"{name}='mps': no MPS device is available on this machine")
    return torch.device(value)


def placement_for(cfg: dict[str, Any], profile: str | None = None, cuda_devices: int | None = None,
                  where: str = "on this machine") -> Placement:
    """Where a client of `profile` trains on this machine, from cfg (as `config.for_device` gives
    it, or the whole configuration: the profile's own values are read either way)."""
    device = resolve_device(setting_name(cfg, profile, "device"), effective(cfg, profile, "device", "cpu"),
                            cuda_devices, where)
    amp_key, amp = setting_name(cfg, profile, "amp"), effective(cfg, profile, "amp", "none")
    if amp not in AMP_MODES:
        raise DeviceError(f"{amp_key}='{amp}' is unknown: expected one of {list(AMP_MODES)}")
    if amp == "bf16" and device.type != "cuda":
        raise DeviceError(f"{amp_key}=bf16: {BF16_ON_CUDA_ONLY}, and {setting_name(cfg, profile, 'device')}="
                          f"'{effective(cfg, profile, 'device', 'cpu')}' resolves to {device.type} {where}")
    return Placement(device, amp)


def gpus_seen_in_simulation(num_gpus_per_client: float) -> int:
    """The CUDA devices one simulated client sees: Ray hides every GPU from a client that asks
    for none, and shows a client ceil(num_gpus) of them (a fraction shares one)."""
    if num_gpus_per_client <= 0:
        return 0
    return min(math.ceil(num_gpus_per_client), cuda_device_count())


def check_simulation_devices(cfg: dict[str, Any]) -> dict[str, Placement]:
    """Before a simulation starts: the placement of every profile in clients.devices as its
    clients will see the machine through Ray, or one DeviceError line. Asking Ray for GPUs the
    machine lacks is refused too (Ray would wait for them for ever)."""
    gpus = float(cfg["simulation"]["num_gpus_per_client"])
    if gpus < 0:
        raise DeviceError(f"simulation.num_gpus_per_client must be >= 0, got {gpus:g}")
    if gpus > 0 and cuda_device_count() == 0:
        raise DeviceError(f"simulation.num_gpus_per_client={gpus:g}: no CUDA device is available on this "
                          "machine (0 runs every client without a GPU)")
    seen = gpus_seen_in_simulation(gpus)
    if gpus > 0:
        where = f"to each simulated client (simulation.num_gpus_per_client={gpus:g})"
    elif cuda_device_count():
        where = "to the simulated clients (simulation.num_gpus_per_client=0: Ray shows them no GPU)"
    else:
        where = "on this machine"
    return {profile: placement_for(cfg, profile, seen, where) for profile in dict.fromkeys(cfg["clients"]["devices"])}


def hidden_gpu_note(cfg: dict[str, Any]) -> str | None:
    """A note for a simulation on a machine with a GPU that its clients will not see (Ray shows
    none to a client that asks for none), where a profile would take it with `auto`; else None."""
    if float(cfg["simulation"]["num_gpus_per_client"]) > 0 or cuda_device_count() == 0:
        return None
    auto = [p for p in dict.fromkeys(cfg["clients"]["devices"]) if effective(cfg, p, "device", "cpu") == "auto"]
    if not auto:
        return None
    return (f"this machine has a CUDA device, but simulation.num_gpus_per_client=0 hides it from the clients: "
            f"profile(s) {auto} with device auto train on the CPU (simulation.num_gpus_per_client=0.1 lets "
            f"ten clients share it)")
