"""Read verlflow's YAML files — recipes, device profiles, search configs — by name or path, into typed schemas.

    python -c "from verlflow.config.loading import load_recipe; print(load_recipe('smoke')[1])"

A shipped file is named by its stem (``smoke`` → ``config/recipes/smoke.yaml``); a user's own file by a
``.yaml`` path. Every kind is read by :func:`load_named_yaml`, so every kind fails the same way: an unknown
name lists the shipped ones, broken YAML names its file, line and column, and an empty or binary file, a
top level that is not a mapping, an alias that contains itself or a non-finite number (``.nan``) says so.

Each file's mapping becomes its typed schema through :func:`verlflow.config.typed_build.build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from verlflow.config.overrides import is_non_finite
from verlflow.config.schema import Profile, VerlflowBlock
from verlflow.config.typed_build import build
from verlflow.errors import VerlflowError
from verlflow.util import first_line

# The folder holding recipes/, profiles/, search/ and stacks/.
CONFIG_ROOT = Path(__file__).parent
RECIPES_DIR = CONFIG_ROOT / "recipes"
PROFILES_DIR = CONFIG_ROOT / "profiles"
SEARCH_DIR = CONFIG_ROOT / "search"
# The recipe's own block, and the prefix of its keys on the command line (verlflow.<key>=…).
OWN_BLOCK = "verlflow"

T = TypeVar("T")


def list_named(folder: Path) -> list[str]:
    """Names of the shipped YAML files in ``folder`` (file stems, sorted)."""
    return sorted(p.stem for p in folder.glob("*.yaml"))


def list_recipes() -> list[str]:
    """Names of the shipped recipes (file stems under ``config/recipes``)."""
    return list_named(RECIPES_DIR)


def list_profiles() -> list[str]:
    """Names of the shipped device profiles (file stems under ``config/profiles``)."""
    return list_named(PROFILES_DIR)


@dataclass(frozen=True)
class NamedYaml:
    """A YAML file found by name or path: its name (the file stem), where it is, and its top-level mapping."""

    name: str
    path: Path
    data: dict[str, Any]


def load_named_yaml(kind: str, name: str, folder: Path) -> NamedYaml:
    """Load a shipped YAML of ``kind`` by name (a stem in ``folder``), or a user's by ``.yaml`` path.

    One line, naming the file, when the name is unknown (listing the shipped names), the file is empty or
    not UTF-8, the YAML is broken (with line and column), its top level is not a mapping, or a value could
    not be used (an alias containing itself, a NaN or infinity).
    """
    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = folder / f"{name}.yaml"
        if not path.is_file():
            known = ", ".join(list_named(folder))
            raise VerlflowError(f"unknown {kind} '{name}': choose one of {known} or give a .yaml path")
    try:
        text = path.read_text(encoding="utf-8")
        if bomb := _alias_expansion(text):
            raise VerlflowError(f"{kind} file {path}:{bomb}")
        data = yaml.safe_load(text)
    except UnicodeDecodeError as exc:
        raise VerlflowError(f"{kind} file {path} is not UTF-8 text (byte {exc.start}): give a YAML file") from None
    except yaml.YAMLError as exc:
        raise VerlflowError(f"{kind} file {_yaml_place(path, exc)} is not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        raise VerlflowError(f"{kind} file {path} is empty: give a {kind} with its keys (examples: {folder})")
    if not isinstance(data, dict):
        raise VerlflowError(f"{kind} file {path} must hold a mapping, not {type(data).__name__}")
    if bad := _first_unusable(data):
        raise VerlflowError(f"{kind} file {path}: {bad}")
    return NamedYaml(name=path.stem, path=path, data=data)


# A config's values with its aliases expanded: verl's whole ppo_trainer has about a thousand. Each level of nested
# aliases multiplies the values (a 1 KB file of 7 levels of 9 holds 9**7); every later walk pays for each one.
MAX_EXPANDED_VALUES = 100_000


def _alias_expansion(text: str) -> str | None:
    """``line: what`` when the YAML's aliases expand to more than :data:`MAX_EXPANDED_VALUES` values (the line of
    the first top-level key holding too many), else None. Counts YAML's node graph, where an alias is the node it
    names, so the count costs the file's size, not the expansion's."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        return None
    sizes: dict[int, int] = {}

    def expanded(node: yaml.Node, visiting: frozenset[int] = frozenset()) -> int:
        if id(node) in sizes or id(node) in visiting:  # an alias of itself is refused later, by name
            return sizes.get(id(node), 1)
        children = [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else (
            node.value if isinstance(node, yaml.SequenceNode) else [])
        sizes[id(node)] = 1 + sum(expanded(child, visiting | {id(node)}) for child in children)
        return sizes[id(node)]

    if expanded(root) <= MAX_EXPANDED_VALUES:
        return None
    heavy = [key for key, value in (root.value if isinstance(root, yaml.MappingNode) else [])
             if sizes[id(value)] > MAX_EXPANDED_VALUES]
    line = heavy[0].start_mark.line + 1 if heavy else 1
    return (f"{line}: its aliases expand to {sizes[id(root)]:,} values, more than {MAX_EXPANDED_VALUES:,} (nested "
            "aliases multiply): write the values out, or alias fewer levels deep")


def _yaml_place(path: Path, exc: yaml.YAMLError) -> str:
    """``path:line:column`` (1-based, as editors count) of a YAML error, or the path where PyYAML gives none."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What PyYAML found wrong, in its own words, on one line."""
    parts = [getattr(exc, "problem", None), getattr(exc, "context", None)]
    text = "; ".join(p for p in parts if p) or first_line(exc)
    return " ".join(text.split())


def _first_unusable(data: Any, key: str = "", path: tuple[int, ...] = ()) -> str | None:
    """Why the loaded YAML cannot be used, or None: an alias that contains itself (which would recurse
    forever when the tree is copied or flattened) or a number that is not finite, naming its key."""
    if isinstance(data, (dict, list)):
        if id(data) in path:
            return f"'{key}' is a YAML alias of a block that contains it (endless): write the value out instead"
        items = data.items() if isinstance(data, dict) else enumerate(data)
        for name, value in items:
            sub = f"{key}[{name}]" if isinstance(data, list) else (f"{key}.{name}" if key else str(name))
            if bad := _first_unusable(value, sub, (*path, id(data))):
                return bad
    elif is_non_finite(data):
        return f"{key}={data} is not a finite number: give a real value"
    return None


def load_recipe(name: str) -> tuple[str, VerlflowBlock, dict[str, Any]]:
    """Return (name, ``verlflow:`` block, verl tree) of a recipe given by name or path.

    The ``verlflow:`` block is checked here (an unknown key fails naming the nearest valid one); the verl
    tree is checked against the installed verl when composed (:func:`verlflow.config.compose.compose`).
    """
    recipe = load_named_yaml("recipe", name, RECIPES_DIR)
    tree = dict(recipe.data)
    if OWN_BLOCK in tree and (not isinstance(tree[OWN_BLOCK], dict) or not tree[OWN_BLOCK]):
        raise VerlflowError(f"recipe file {recipe.path}: its '{OWN_BLOCK}:' block is empty "
                            f"({tree[OWN_BLOCK]!r}): give its keys (model_name, data_source, …) or remove the line")
    raw_block = tree.pop(OWN_BLOCK, None) or {}
    block = build(VerlflowBlock, raw_block, what="recipe", prefix=f"{OWN_BLOCK}.", where=f"recipe file {recipe.path}")
    return recipe.name, block, tree


def load_profile(name: str) -> Profile:
    """Return the device profile given by name or path, checked field by field (see :class:`Profile`)."""
    profile = load_named_yaml("profile", name, PROFILES_DIR)
    # The name is the file's, not a key in it.
    loaded = build(Profile, profile.data, what="profile", where=f"profile file {profile.path}",
                   fixed={"name": profile.name})
    # A stack given as a path is read from the profile's folder, wherever the command runs.
    stack = Path(loaded.stack)
    if stack.suffix in (".yaml", ".yml") and not stack.is_absolute():
        loaded.stack = str((profile.path.parent / stack).resolve())
    return loaded

