"""The clients' optimiser: torch.optim.SGD without the `torch._dynamo` import.

In torch 2.14 every public method of `torch.optim.Optimizer` (`add_param_group`, which the
constructor calls, `zero_grad`, `state_dict`, `load_state_dict`, and each optimiser's `step`) is
wrapped so that `torch.compile` does not trace into it, and that wrapper imports `torch._dynamo`
on its first call: about 1.3 s of CPU in every new process (more than `import pfedes.client_app`
beyond torch itself), which a deployed ClientApp pays every round since Flower 1.42 starts one
process per message.

`LocalSGD` is torch.optim.SGD whose methods call torch's own functions beneath that wrapper
(their `__wrapped__`): the same code, so the same updates bit for bit on every device (torch's
own choice of its single-tensor, foreach or fused kernels is untouched), the same state_dict
format, and an instance of torch.optim.SGD for GradScaler and the rest. pfedes never compiles;
while torch.compile traces, each method takes torch's wrapped path as before. Where the
installed torch does not have the expected wrappers, `LocalSGD` is torch.optim.SGD itself.
"""

from __future__ import annotations

import torch
from torch.optim import SGD, Optimizer

_GUARDED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _layers(cls: type, name: str, qualname: str):
    """(torch's dynamo-guarded method, the function beneath it), or None if torch's layout is not
    the expected one. An optimiser's class `step` may also carry Optimizer's profiling hook (set
    on the class by the first instance), which is outside the guard."""
    guarded = cls.__dict__.get(name)
    if getattr(guarded, "hooked", False):
        guarded = getattr(guarded, "__wrapped__", None)
    inner = getattr(guarded, "__wrapped__", None)
    if inner is None or getattr(inner, "__qualname__", "") != qualname:
        return None
    return guarded, inner


_METHODS = {name: _layers(Optimizer, name, f"Optimizer.{name}") for name in _GUARDED}
_METHODS["step"] = _layers(SGD, "step", "SGD.step")
UNGUARDED = all(layers is not None for layers in _METHODS.values())


if UNGUARDED:
    def _call(name: str, *args, **kwargs):
        guarded, inner = _METHODS[name]
        return (guarded if torch.compiler.is_compiling() else inner)(*args, **kwargs)

    class LocalSGD(SGD):
        """torch.optim.SGD, same arguments and results, without importing torch._dynamo."""

        def add_param_group(self, param_group):
            return _call("add_param_group", self, param_group)

        def zero_grad(self, set_to_none: bool = True) -> None:
            return _call("zero_grad", self, set_to_none)

        def state_dict(self):
            return _call("state_dict", self)

        def load_state_dict(self, state_dict) -> None:
            return _call("load_state_dict", self, state_dict)

        def step(self, closure=None):
            if torch.compiler.is_compiling():
                return _METHODS["step"][0](self, closure)
            # What torch's wrapper does around the step, less its graph breaks (for tracing only).
            with torch.set_grad_enabled(self.defaults["differentiable"]):
                return _METHODS["step"][1](self, closure)
else:  # another torch: its SGD as it is
    LocalSGD = SGD
