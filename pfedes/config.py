"""The experiment configuration: hydra's conf/ is the one source; Flower's run config selects
and overrides it with the same dotted keys (`strategy.lam=0.7`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # omegaconf (and hydra) only where a configuration is composed: a ClientApp never does
    from omegaconf import DictConfig


class ConfigError(ValueError):
    """An override that the configuration does not accept; the message names it."""


def conf_dir() -> Path:
    """conf/ beside the package (source tree, editable install, FAB) or installed inside it."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"no conf/config.yaml next to or inside {here}")


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose conf/config.yaml with hydra override strings (`key=value`, `strategy=local`)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            return hydra_compose(config_name="config", overrides=list(overrides))
    except HydraException as exc:
        raise ConfigError(f"bad configuration override: {str(exc).splitlines()[0]}") from None


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    """A plain, resolved dict without hydra's own section."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    return plain


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def to_run_config_value(value: Any) -> Any:
    """Flower's run config holds scalars: lists travel as comma-separated strings, null as ""."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return PRESET_VALUE if value is None else value


PRESET_KEY = "strategy.name"  # the run-config key that chooses the preset (hydra: strategy=NAME)
PRESET_VALUE = ""  # a strategy key's run-config default: the chosen preset's own value
_NOT_SETTINGS = ("name", "method", "server", "trainer", "share", "defaults")  # choose, not configure


def strategy_setting_names() -> list[str]:
    """The settings of every preset in conf/strategy/, sorted."""
    from omegaconf import OmegaConf

    names: set[str] = set()
    for preset in sorted((conf_dir() / "strategy").glob("*.yaml")):
        names.update(k for k in OmegaConf.load(preset) if k not in _NOT_SETTINGS)
    return sorted(names)


def default_run_config() -> dict[str, Any]:
    """Every overridable key, as Flower's run config spells it: `strategy.name`, the preset (hydra's
    `strategy=NAME`), the default values of the keys every preset shares, and each preset's
    settings as `strategy.KEY = ""`. (`strategy.name` rather than `strategy`: `flwr run -c` reads
    TOML, where `strategy='fedprox' strategy.mu=0.1` would make `strategy` both a string and a
    table.)

    pyproject.toml's [tool.flwr.app.config] must equal this (a test checks it), since Flower
    accepts `-c` overrides only for keys it declares. A strategy key left at "" takes the value
    of the chosen preset (conf/strategy/NAME.yaml); a preset's defaults differ from one method to
    another (`strategy.lam` is 0 for pfedes, 1 for fedproto), so no one value could stand for all.
    """
    cfg = to_dict(compose())
    flat = {f"strategy.{k}": PRESET_VALUE for k in strategy_setting_names()}
    flat.update({k: to_run_config_value(v) for k, v in flatten(cfg).items() if not k.startswith("strategy.")})
    flat[PRESET_KEY] = cfg["strategy"]["name"]
    return flat


def _hydra_value(value: Any, default: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and isinstance(default, str) and "," in default:
        return "[" + value + "]"  # a list key written as "a,b,c"
    return str(value)


def overrides_from_run_config(run_config: Mapping[str, Any]) -> list[str]:
    """The hydra overrides that reproduce Flower's run config: only the keys whose value differs
    from its declared default, so the chosen preset's own values stand unless a key is set."""
    defaults = default_run_config()
    overrides = []
    strategy = run_config.get(PRESET_KEY, defaults[PRESET_KEY])
    if strategy != defaults[PRESET_KEY]:
        overrides.append(f"strategy={strategy}")
    for key, value in run_config.items():
        if key == PRESET_KEY or (key in defaults and defaults[key] == value):
            continue
        overrides.append(f"{key}={_hydra_value(value, defaults.get(key))}")
    return overrides


def experiment_config(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The resolved experiment as a plain dict, validated."""
    cfg = to_dict(compose(overrides))
    validate(cfg)
    return cfg


DEVICE_TRAIN_KEYS = {"lr": float, "local_epochs": int, "batch_size": int, "torch_threads": int,
                     "device": str, "amp": str}  # device, amp: checked by pfedes/devices.py


# What a client reads of the experiment; the rest (the aggregation rule, selection, privacy,
# logging, the server's paths and round counts) stays on the server.
CLIENT_KEYS = ("seed", "num_clients", "evaluate_in_train", "client_state_dir", "run_token",
               "strategy", "train", "data", "model", "clients", "simulation", "compression")


def client_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The part of cfg that travels to the clients in every message: CLIENT_KEYS, of the
    aggregation only `weighting` (it decides what a client reports: a validation score or FQI),
    and the privacy settings only when the clients add the noise (privacy.mode=local), with the
    noise a target epsilon asks for found here, so that a client needs no accountant."""
    sent = {k: cfg[k] for k in CLIENT_KEYS if k in cfg}
    if "aggregation" in cfg:
        sent["aggregation"] = {"weighting": cfg["aggregation"]["weighting"]}
    if (cfg.get("privacy") or {}).get("mode") == "local":
        from .privacy import Privacy  # flwr's DP helpers: only where local DP is asked for

        sent["privacy"] = Privacy.from_cfg(cfg).client_section()
    return sent


def learning_rate(cfg: dict[str, Any]) -> float:
    """The learning rate the run's method trains with: its own (strategy.lr), else train.lr."""
    own = (cfg.get("strategy") or {}).get("lr")
    return float(cfg["train"]["lr"] if own is None else own)


def for_device(cfg: dict[str, Any], device: str) -> dict[str, Any]:
    """cfg with `train` as a client of this device profile trains: the method's own learning rate
    (strategy.lr, where its preset sets one), then the profile's own values where train.by_device
    sets them (a device's lr wins over the method's)."""
    own = {k: v for k, v in ((cfg["train"].get("by_device") or {}).get(device) or {}).items() if v is not None}
    if (cfg.get("strategy") or {}).get("lr") is not None:
        own = {"lr": learning_rate(cfg), **own}
    return {**cfg, "train": {**cfg["train"], **own}} if own else cfg


def device_train_settings(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The values each device profile sets for itself (only those set)."""
    return {device: {k: v for k, v in (own or {}).items() if v is not None}
            for device, own in (cfg["train"].get("by_device") or {}).items()
            if any(v is not None for v in (own or {}).values())}


def validate(cfg: dict[str, Any]) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    need(int(cfg["num_clients"]) >= 1, f"num_clients must be >= 1, got {cfg['num_clients']}")
    need(int(cfg["num_rounds"]) >= 1, f"num_rounds must be >= 1, got {cfg['num_rounds']}")
    for key in ("fraction_train", "fraction_evaluate"):
        need(0.0 < float(cfg[key]) <= 1.0, f"{key} must be in (0, 1], got {cfg[key]}")
    need(0.0 < float(cfg["data"]["test_fraction"]) < 1.0,
         f"data.test_fraction must be in (0, 1), got {cfg['data']['test_fraction']}")
    val = float(cfg["data"].get("val_fraction", 0.0))
    need(0.0 <= val and val + float(cfg["data"]["test_fraction"]) < 1.0,
         f"data.val_fraction must be >= 0 and leave a train split beside data.test_fraction, got {val}")
    data = cfg["data"]
    for key in ("image_column", "label_column"):
        value = data.get(key)
        need(value is None or (isinstance(value, str) and value != ""),
             f"data.{key} must be a column name or null (detect it), got {value!r}")
    size = data.get("image_size")
    need(size is None or (isinstance(size, int) and not isinstance(size, bool) and size >= 16)
         or (isinstance(size, (list, tuple)) and len(size) == 2
             and all(isinstance(v, int) and not isinstance(v, bool) and v >= 16 for v in size)),
         f"data.image_size must be null, an integer >= 16 or [height, width] (each >= 16), got {size!r}")
    need(int(cfg["probe_every"]) >= 1, f"probe_every must be >= 1, got {cfg['probe_every']}")
    need(float(cfg["train"]["lr"]) > 0, f"train.lr must be > 0, got {cfg['train']['lr']}")
    need(int(cfg["train"]["batch_size"]) >= 2, "train.batch_size must be >= 2")
    devices = cfg["clients"]["devices"]
    need(isinstance(devices, list) and len(devices) > 0, "clients.devices must be a non-empty list")
    for device, own in (cfg["train"].get("by_device") or {}).items():
        need(device in cfg["model"]["profiles"], f"train.by_device.{device}: '{device}' is not a device profile "
                                                 f"(model.profiles has {sorted(cfg['model']['profiles'])})")
        for key, value in (own or {}).items():
            name = f"train.by_device.{device}.{key}"
            need(key in DEVICE_TRAIN_KEYS, f"{name} is unknown: a profile may set {sorted(DEVICE_TRAIN_KEYS)}")
            if value is None or DEVICE_TRAIN_KEYS[key] is str:
                continue
            need(isinstance(value, (int, float)) and not isinstance(value, bool)
                 and (DEVICE_TRAIN_KEYS[key] is float or float(value).is_integer()),
                 f"{name} must be a number{'' if DEVICE_TRAIN_KEYS[key] is float else ' (an integer)'}, got {value!r}")
            low = {"lr": 0.0, "local_epochs": 1, "batch_size": 2, "torch_threads": 0}[key]
            need(value > low if key == "lr" else value >= low,
                 f"{name} must be {'>' if key == 'lr' else '>='} {low}, got {value}")
    from .devices import setting_problem

    device_problem = setting_problem(cfg)
    need(device_problem is None, str(device_problem))
    from .compression import Codec
    from .methods import settings_of
    from .privacy import Privacy
    from .robust import Robustness
    from .selection import Selection

    try:
        Codec.from_cfg(cfg)
        Codec.downlink_from_cfg(cfg)
        robustness = Robustness.from_cfg(cfg)
        Privacy.from_cfg(cfg)
        Selection.from_cfg(cfg)
        settings = settings_of(cfg)  # the method's typed settings (pfedes/methods/)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for reads_val in (settings.needs_validation_split, robustness.needs_validation_split):
        need(reads_val is None or val > 0, f"{reads_val} needs a validation split: set data.val_fraction > 0")
    if cfg.get("logging", {}).get("tensorboard"):
        from .tensorboard_log import available

        need(available(), "logging.tensorboard=true needs the tensorboard package: "
                          "pip install -e \".[tensorboard]\" (or pip install tensorboard)")


LEGACY_METHOD_KEYS = ("server", "trainer", "share")  # a method's parts, in configs saved before pfedes/methods/


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def with_registered_method(saved: dict[str, Any]) -> dict[str, Any]:
    """A config saved before methods were registered names its method's strategy and trainer
    classes and its filter (`strategy.server`, `.trainer`, `.share`). Where they are those of the
    method its preset now chooses, the saved config is that method's (`strategy.method`, the three
    keys gone); otherwise it is returned as it is (another method: not the same run)."""
    strategy = saved.get("strategy") or {}
    if "method" in strategy or not any(k in strategy for k in LEGACY_METHOD_KEYS):
        return saved
    from .methods import get_method

    try:
        method = get_method(to_dict(compose([f"strategy={strategy['name']}"]))["strategy"]["method"])
    except (ConfigError, KeyError):  # a preset gone, or not moved to the registry
        return saved
    if (strategy.get("server") != _dotted(method.strategy) or strategy.get("trainer") != _dotted(method.trainer)
            or list(strategy.get("share", [])) != list(method.share)):
        return saved
    upgraded = {k: v for k, v in strategy.items() if k not in LEGACY_METHOD_KEYS}
    return {**saved, "strategy": {"name": strategy["name"], "method": method.name, **upgraded}}


def with_later_settings(saved: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """A run's saved config with the settings added to conf/ since it ran, at their defaults (its
    strategy's preset): a run from before a setting existed ran as its default does. A config
    from before methods were registered names its method as they do (`with_registered_method`)."""
    saved = with_registered_method(saved)

    def complete(have: dict[str, Any], want: dict[str, Any]) -> bool:
        return all(k in have and (not isinstance(v, dict) or not isinstance(have[k], dict) or complete(have[k], v))
                   for k, v in want.items())

    if complete(saved, wanted):
        return saved
    defaults = to_dict(compose([f"strategy={saved.get('strategy', {}).get('name', wanted['strategy']['name'])}"]))
    # the settings whose preset value is not what runs from before them did: before a method
    # could have its own learning rate, every method trained at train.lr
    defaults["strategy"]["lr"] = None
    # nor is the direction check's: runs from before 2026-12-06 ran without it
    defaults["aggregation"].update(direction_spread=0.0, direction_strikes=0)

    def fill(have: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
        out = dict(have)
        for key, value in default.items():
            if key not in out:
                out[key] = value
            elif isinstance(value, dict) and isinstance(out[key], dict):
                out[key] = fill(out[key], value)
        return out

    return fill(saved, {k: v for k, v in defaults.items() if k in wanted})
