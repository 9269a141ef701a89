"""The one mechanism that decides which entries of a client's state leave the client.

A filter spec is a list of filter names; an entry is shared only if every filter in the list
admits it (an empty list shares nothing). Filters look at module types, not at key spellings,
wherever a type decides (BatchNorm running statistics are buffers, so state_dict keys are
filtered, not named_parameters).
"""

from collections.abc import Callable, Iterable, Sequence

from torch import nn
from torch.nn.modules.batchnorm import _NormBase

HEAD_MODULES = ("head",)
PROXY_MODULES = ("proxy",)
LORA_MARKERS = ("lora_A", "lora_B")
FILTER_NAMES = ("all", "proxy-only", "no-bn", "base-only", "head-only", "lora-only")


def _module_of(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else ""


def _bn_prefixes(model: nn.Module) -> set[str]:
    return {name for name, m in model.named_modules() if isinstance(m, _NormBase)}


def _under(key: str, roots: Iterable[str]) -> bool:
    return any(key == r or key.startswith(r + ".") for r in roots)


def _make_filters(model: nn.Module) -> dict[str, Callable[[str], bool]]:
    bn = _bn_prefixes(model)
    return {
        "all": lambda k: True,
        "proxy-only": lambda k: _under(k, PROXY_MODULES),
        "no-bn": lambda k: _module_of(k) not in bn,
        "base-only": lambda k: not _under(k, HEAD_MODULES),
        "head-only": lambda k: _under(k, HEAD_MODULES),
        "lora-only": lambda k: any(m in k.split(".") for m in LORA_MARKERS),
    }



def shared_keys(model: nn.Module, spec: Sequence[str]) -> list[str]:
    """The state_dict keys of `model` that the filters in `spec` let leave the client."""
    filters = _make_filters(model)
    unknown = [name for name in spec if name not in filters]
    if unknown:
        raise ValueError(f"unknown parameter filter(s) {unknown}: expected some of {list(filters)}")
    if not spec:
        return []
    checks = [filters[name] for name in spec]
    return [k for k in model.state_dict() if all(check(k) for check in checks)]
