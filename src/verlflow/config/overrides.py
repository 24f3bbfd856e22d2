"""verl-style ``key=value`` overrides: parsed into typed values, rendered back as verl's Hydra reads them.

    python -c "from verlflow.config.overrides import parse_overrides as p; print(p('a.b=5e-7 +c.d=[1,2] ~e'))"

Overrides use verl's dotted form (``actor_rollout_ref.rollout.n=8``) with Hydra's prefixes: ``+key=value``
adds a key verl's config does not have, ``++key=value`` adds or overrides, ``~key`` deletes. Nothing here
knows verl's schema (that is :mod:`verlflow.config.verl_schema`): this module is the syntax only —
parsing, flattening trees to dotted keys, and quoting values so Hydra reads them back unchanged.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import yaml

from verlflow.errors import VerlflowError

# Hydra's override prefixes: add a new key, add-or-override, delete.
ADD, FORCE_ADD, DELETE_PREFIX = "+", "++", "~"


class _Delete:
    """The value of a ``~key`` override: the key is removed from verl's config."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()


def flatten_tree(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten a nested mapping to dotted keys; lists stay values (verl's command-line form)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_tree(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def parse_overrides(overrides: str | list[str] | tuple[str, ...] | None) -> dict[str, Any]:
    """Parse ``key=value`` overrides (a shell-quoted string or a list) into dotted key → typed value.

    Values are read as YAML scalars/lists, so ``5e-7`` is a float, ``True`` a bool and
    ``['console','mlflow']`` a list, as Hydra reads them on verl's command line. Hydra's prefixes stay
    on the key (``+key``, ``++key``); ``~key`` maps to :data:`DELETE` (``~key=value`` to that value,
    which Hydra deletes only when it matches).
    """
    if overrides is None:
        return {}
    items = _split(overrides) if isinstance(overrides, str) else list(overrides)
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        bare = key.lstrip("+~")
        if key.startswith(DELETE_PREFIX) and bare and key == DELETE_PREFIX + bare:
            parsed[key] = _yaml_value(raw) if sep else DELETE
            continue
        if not sep or not bare or key not in (bare, ADD + bare, FORCE_ADD + bare):
            raise VerlflowError(f"override '{item}' is not key=value, +key=value, ++key=value or ~key "
                                "(e.g. actor_rollout_ref.rollout.n=8)")
        parsed[key] = _yaml_value(raw)
        if raw.lstrip()[:1] in ("[", "{") and isinstance(parsed[key], str):
            kind = "list" if raw.lstrip()[0] == "[" else "mapping"
            raise VerlflowError(f"override '{item}': {raw} is not a valid {kind}: close its brackets and quote "
                                "values holding , : [ ] { } (e.g. trainer.logger=[console,mlflow])")
        if _holds_non_finite(parsed[key]):
            raise VerlflowError(f"override '{item}': {bare} must be a finite number, not NaN or infinity")
    return parsed


def _split(text: str) -> list[str]:
    """``text`` split into overrides as a shell would; an unbalanced quote or a lone trailing ``\\`` is one line."""
    try:
        return shlex.split(text)
    except ValueError as exc:  # shlex says "No closing quotation" or "No escaped character"
        if "escaped" in str(exc):
            raise VerlflowError(f"overrides {text!r} end in a lone \\: write it as \\\\ or inside '…'") from None
        raise VerlflowError(f"overrides {text!r} have an unbalanced quote: close every ' and \" you open (a value "
                            "with spaces: trainer.experiment_name='my run'; a quote inside the other kind: "
                            "\"it's\")") from None


def is_non_finite(value: Any) -> bool:
    """Whether ``value`` is NaN or an infinity: a float, or text Python reads as one (``nan``, ``-inf``)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, str) and value.strip().lower().lstrip("+-.") in ("nan", "inf", "infinity"):
        return True
    return False


def _holds_non_finite(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_non_finite(v) for v in value.values())
    return is_non_finite(value)


def split_prefix(key: str) -> tuple[str, str]:
    """``'++a.b'`` → ``('++', 'a.b')``: Hydra's prefix of an override key and the dotted key itself."""
    bare = key.lstrip("+~")
    return key[: len(key) - len(bare)], bare


def _yaml_value(raw: str) -> Any:
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        return raw
    # YAML 1.1 reads 5e-7 as a string where verl's Hydra reads a float.
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def to_hydra_value(value: Any) -> str:
    """Render a value the way verl's Hydra command line expects it (``True``, ``5e-07``, ``['a','b']``).

    A string Hydra would not read back unchanged as a bare word (a space, ``/`` next to other symbols,
    non-ASCII letters: experiment names such as ``Qwen3 GRPO/A3 对比``) is quoted, and a :class:`LiteralText`
    always is.
    """
    if isinstance(value, LiteralText):
        return hydra_quote(value)
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_quoted(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ",".join(f"{k}:{to_hydra_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, str) and not _BARE_WORD.fullmatch(value) and not _INTERPOLATION.fullmatch(value):
        return hydra_quote(value)
    return str(value)


# Strings Hydra reads back unchanged without quotes: words, numbers-as-text, absolute/relative paths, URLs.
_BARE_WORD = re.compile(r"[A-Za-z0-9_\-+.:/@%]*")
_INTERPOLATION = re.compile(r"\$\{[^{}]*\}")


def hydra_quote(text: str) -> str:
    """``text`` as a Hydra single-quoted string that verl's Hydra and OmegaConf read back exactly.

    Hydra's own quoting (``QuotedString.with_quotes``) escapes the quotes and the backslashes before them (a
    trailing ``\\`` included); every ``${`` is escaped for OmegaConf, with the backslashes before it doubled,
    so it stays text instead of becoming an interpolation.
    """
    from hydra.core.override_parser.types import Quote, QuotedString

    escaped = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    return QuotedString(text=escaped, quote=Quote.single).with_quotes()


class LiteralText(str):
    """A string verl must read back exactly as written (MLflow experiment and run names): always quoted, never
    read as a number, a boolean, ``null`` or an interpolation."""


def _quoted(value: Any) -> str:
    return hydra_quote(value) if isinstance(value, str) else to_hydra_value(value)
