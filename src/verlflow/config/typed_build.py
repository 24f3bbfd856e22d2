"""Mappings (a YAML block, ``key=value`` overrides) → the typed dataclasses of verlflow's schemas, field by field.

    python -c "from verlflow.config.typed_build import build; from verlflow.config.schema import VerlflowBlock as B; \
print(build(B, {'val_limit': '8'}).val_limit)"

:func:`build` makes a dataclass of :mod:`verlflow.config.schema` or of the search config from a mapping: a key
that is not a field is one line from :func:`unknown_key` — the one message for an unknown key anywhere, naming
the nearest valid key — and each value gets the field's declared type (``"true"`` → ``True``, ``"8"`` → ``8``)
or one line naming key and value. :func:`with_overrides` applies dotted ``verlflow.<key>=…`` /
``profile.<field>=…`` overrides to such a dataclass the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from verlflow.errors import VerlflowError

T = TypeVar("T")


def nearest(key: str, candidates: Iterable[str], n: int = 1) -> list[str]:
    """Up to ``n`` candidates closest to ``key`` (difflib, best first); none when nothing is close."""
    return difflib.get_close_matches(key, list(candidates), n=n, cutoff=0.6)


def _located(message: str, where: str) -> VerlflowError:
    return VerlflowError(f"{where}: {message}" if where else message)


def unknown_key(key: str, valid: Sequence[str], *, what: str = "", prefix: str = "", where: str = "") -> VerlflowError:
    """The one-line error for a key no schema knows, naming it and the nearest valid key.

    ``key`` is compared with ``valid`` (the keys allowed at that level); ``prefix`` is the dotted path of
    that level as the user wrote it (``verlflow.``, ``sampler.``), ``what`` the kind of key (``recipe``) and
    ``where`` the file, when there is one. For example::

        unknown recipe key 'verlflow.rollout_trace': did you mean 'verlflow.rollout_traces'? valid: verlflow.{…}
    """
    near = nearest(key, valid)
    hint = f": did you mean '{prefix}{near[0]}'?" if near else ":"
    listed = ", ".join(valid)
    choices = f"{prefix}{{{listed}}}" if prefix else listed
    kind = f"{what} key" if what else "key"
    return _located(f"unknown {kind} '{prefix}{key}'{hint} valid: {choices}", where)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _describe(tp: Any) -> str:
    """What a value of type ``tp`` looks like, for error messages."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in typing.get_args(tp) if arm is not type(None))
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "text"
    if origin in (list, tuple):
        return "a list"
    return "a mapping"


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _convert_union(value: Any, tp: Any, key: str, ctx: _Context) -> Any:
    """``value`` as the first arm of the union ``tp`` that takes it (None where the union admits it)."""
    arms = typing.get_args(tp)
    if value is None and type(None) in arms:
        return None
    for arm in arms:
        if arm is type(None):
            continue
        try:
            return _convert(value, arm, key, ctx)
        except VerlflowError:
            if _is_dataclass_type(arm) and isinstance(value, Mapping):
                raise  # a mapping meant as that record: its own error (a bad field), not "expects a mapping"
            continue
    raise ctx.bad_value(key, value, tp)


def _convert(value: Any, tp: Any, key: str, ctx: _Context) -> Any:
    """``value`` as type ``tp`` (the declared type of ``key``); a one-line error when it cannot be."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _convert_union(value, tp, key, ctx)
    if _is_dataclass_type(tp):
        return build(tp, value, what=ctx.what, prefix=f"{key}.", where=ctx.where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower() if isinstance(value, (str, int)) else None
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, (str, int, float)):  # a bool is an int: True → "True", as str() always gave
            return str(value)
    elif isinstance(tp, type) and issubclass(tp, str):  # a StrEnum (Device): its class checks the name
        if isinstance(value, str):
            return value
    elif origin is dict:
        if isinstance(value, Mapping):
            _, value_type = typing.get_args(tp) or (str, Any)
            return {str(k): _convert(v, value_type, f"{key}.{k}", ctx) for k, v in value.items()}
    elif origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            item_type = (typing.get_args(tp) or (Any,))[0]
            items = [_convert(v, item_type, f"{key}[{i}]", ctx) for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
    else:
        raise TypeError(f"build() cannot convert to {tp!r} (field '{key}')")
    raise ctx.bad_value(key, value, tp)


@dataclass(frozen=True)
class _Context:
    """How to word an error: the kind of key (``recipe``) and the file (empty for overrides)."""

    what: str
    where: str

    def bad_value(self, key: str, value: Any, tp: Any) -> VerlflowError:
        kind = f"{self.what} key" if self.what else "key"
        return _located(f"{kind} '{key}' expects {_describe(tp)}, got {value!r}", self.where)


def build(cls: type[T], data: Any, *, what: str = "", prefix: str = "", where: str = "",
          fixed: Mapping[str, Any] | None = None) -> T:
    """Make the dataclass ``cls`` from ``data``, a mapping of its field names: checked, typed, defaults filled.

    Why: one reader for every schema, so a typo fails the same way in a recipe, a profile, a search config
    or an override — at once, naming the key (``prefix`` + field) and its nearest valid key — instead of
    being silently ignored. Each value is converted to the field's declared type (nested dataclasses,
    ``dict[str, X]``, ``list[X]``, ``X | None`` included); a YAML null takes the field's default; a field
    without a default is required. ``fixed`` fields are set by the caller and are not keys of ``data``.
    """
    ctx = _Context(what, where)
    if not isinstance(data, Mapping):
        block = prefix.rstrip(".") or "the file"
        raise _located(f"'{block}' must be a mapping, got {data!r}", where)
    fixed = dict(fixed or {})
    hints = typing.get_type_hints(cls)
    declared = [f for f in dataclasses.fields(cls) if f.init]
    valid = [f.name for f in declared if f.name not in fixed]
    for key in data:
        if str(key) not in valid:
            raise unknown_key(str(key), valid, what=what, prefix=prefix, where=where)
    kwargs = dict(fixed)
    for f in declared:
        if f.name in fixed:
            continue
        value = data.get(f.name)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if value is None and hints[f.name] is not Any and type(None) not in typing.get_args(hints[f.name]):
            if not has_default:
                raise _located(f"'{prefix}{f.name}' is required", where)
            continue
        kwargs[f.name] = _convert(value, hints[f.name], f"{prefix}{f.name}", ctx)
    return cls(**kwargs)


def _plain(value: Any) -> Any:
    """A nested dataclass (a profile's ``accelerator``) as the mapping :func:`build` reads back; else the value."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


def with_overrides(obj: T, updates: Mapping[str, Any], *, what: str, prefix: str,
                   fixed: Sequence[str] = ()) -> T:
    """A copy of the dataclass ``obj`` with dotted ``updates`` applied (``env.OMP_NUM_THREADS`` sets one entry).

    Why: ``verlflow.<key>=…`` and ``profile.<field>=…`` overrides go through :func:`build` like the file
    did, so they are checked and typed the same way. ``fixed`` fields cannot be overridden.
    """
    holder = {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name not in fixed}
    valid = list(holder)
    for dotted, value in updates.items():
        head, _, rest = dotted.partition(".")
        if head not in holder:
            raise unknown_key(head, valid, what=what, prefix=prefix)
        if rest:
            target = holder[head]
            if not isinstance(target, dict):
                raise VerlflowError(f"{what} key '{prefix}{head}' is not a mapping, cannot set '{prefix}{dotted}'")
            holder[head] = {**target, rest: value}
        else:
            holder[head] = value
    return build(type(obj), holder, what=what, prefix=prefix, fixed={k: getattr(obj, k) for k in fixed})
