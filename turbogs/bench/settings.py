"""FIELD=VALUE settings on a TrainConfig: `turbogs bench --set`, the settings a scene spec
carries (bench/scenes.py), and the benchmark scripts that try a variant of a preset.

A variant of a preset is one or two fields changed, and trying one should not need a new
preset, a new flag or a script with its own parser. So every field is reachable by its path:
`density.opacity_decay=0.6` reaches into the config's parts, values are Python literals
(`ast.literal_eval`; a text field also takes bare text), and `density=NAME` / `optimizer=NAME`
swap that part for another kind at its defaults, which later settings may then edit.

A mistake is one line naming the setting: an unknown field (with the fields there are), a value
that is not a literal, or one of the wrong type (an int where a float is wanted is fine). A
wrong type is caught here rather than as a traceback somewhere in training. The fields that size
a run (`steps`, `budget_seconds`, `world_size`) are the bench's flags' to set.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from typing import Iterable, List, Tuple

from turbogs.errors import InputError
from turbogs.training.config import DENSITY_CONFIGS, OPTIMIZER_CONFIGS, TrainConfig

PARTS = {"density": DENSITY_CONFIGS, "optimizer": OPTIMIZER_CONFIGS}
SIZING_FIELDS = ("steps", "budget_seconds", "world_size")  # --steps / --budget-seconds, and the ranks


def split_setting(item: str) -> Tuple[str, str]:
    """"density.opacity_decay=0.6" -> ("density.opacity_decay", "0.6")."""
    name, equals, text = item.partition("=")
    name = name.strip()
    if not equals or not name:
        raise InputError(f"setting '{item}': expected FIELD=VALUE, e.g. density.opacity_decay=0.6")
    return name, text.strip()


def apply_settings(cfg: TrainConfig, items: Iterable[str]) -> TrainConfig:
    """Set each FIELD=VALUE of `items` on `cfg`, in order (in place; returned)."""
    for item in items:
        name, text = split_setting(item)
        if name in SIZING_FIELDS:
            raise InputError(f"setting '{item}': {name} sizes the run; use --steps N or --budget-seconds S")
        if name in PARTS:
            kinds = PARTS[name]
            if text not in kinds:
                raise InputError(f"setting '{item}': no {name} named '{text}' (choose from: {', '.join(kinds)})")
            setattr(cfg, name, kinds[text]())
            continue
        *parents, last = name.split(".")
        target, where = cfg, "TrainConfig"
        for depth, parent in enumerate(parents):
            if not _has_field(target, parent) or not dataclasses.is_dataclass(getattr(target, parent)):
                raise InputError(f"setting '{item}': {where} has no part '{parent}' (parts: "
                                 f"{', '.join(_parts(target)) or 'none'})")
            target = getattr(target, parent)
            where = f"{'.'.join(parents[:depth + 1])} ({type(target).__name__})"
        if not _has_field(target, last):
            raise InputError(f"setting '{item}': {where} has no field '{last}' (fields: {', '.join(_fields(target))})")
        setattr(target, last, _value(item, target, last, text))
    return cfg


def config_record(cfg: TrainConfig) -> dict:
    """The config as plain data for a JSON record, its density and optimizer named by kind
    (the settings object's class says which; asdict alone would drop that)."""
    data = dataclasses.asdict(cfg)
    for part in PARTS:
        data[part] = {"kind": getattr(cfg, part).name, **data[part]}
    return data


def _fields(target) -> List[str]:
    return [f.name for f in dataclasses.fields(target)]


def _has_field(target, name: str) -> bool:
    return dataclasses.is_dataclass(target) and name in _fields(target)


def _parts(target) -> List[str]:
    return [name for name in _fields(target) if dataclasses.is_dataclass(getattr(target, name))]


def _value(item: str, target, field: str, text: str):
    """The literal in `text`, checked against the field's declared type."""
    current = getattr(target, field)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        if isinstance(current, str):  # a text field: bare text is meant as the text
            return text
        raise InputError(f"setting '{item}': '{text}' is not a Python literal (a number, True/False, None, "
                         "a tuple, or 'quoted text')") from None
    try:
        hint = typing.get_type_hints(type(target)).get(field)
    except (NameError, TypeError):  # an annotation that does not resolve: take the value as it is
        return value
    return _typed(item, value, hint)


def _typed(item: str, value, hint):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        if len(others) != 1:
            return value
        hint, origin, args = others[0], typing.get_origin(others[0]), typing.get_args(others[0])
    wrong = None
    if hint is bool:
        wrong = not isinstance(value, bool)
    elif hint is int:
        wrong = isinstance(value, bool) or not isinstance(value, int)
    elif hint is float:
        wrong = isinstance(value, bool) or not isinstance(value, (int, float))
        value = value if wrong else float(value)
    elif hint is str:
        wrong = not isinstance(value, str)
    elif origin is tuple:
        wrong = not isinstance(value, (tuple, list))
        value = value if wrong else tuple(value)
    if wrong:
        name = getattr(hint, "__name__", str(hint))
        raise InputError(f"setting '{item}': wants {'a' if name[0] not in 'aeiou' else 'an'} {name}, "
                         f"got {value!r}")
    return value
