"""Turn an exception raised by verl's own start-up code into one ``key=value: what is wrong: the fix`` line.

verl's messages rarely name the key a user typed (``AssertionError()`` from a dataclass, ``'NoneType' object
has no attribute 'split'``). The key is found where verl raised, in this order:

1. :data:`SITES`: raise sites whose key is not in the statement (``assert len(self.train_dataloader) >= 1``),
   each with the fix;
2. the statement itself: the config paths it reads (``self.lr_scheduler_type`` inside the dataclass built
   from ``actor_rollout_ref.actor.optim``; ``config.actor_rollout_ref.rollout.n`` where ``config`` is a node
   of the resolved config), resolved against the frame's own objects, so no list of keys is kept here;
3. dotted keys of the resolved config quoted in verl's message, else keys whose value it quotes (a path).

Where none is found the line is verl's own message with its ``file:line`` and the stage's nearest keys.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import linecache
import re
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verlflow.backends.verl.dryrun.keys import value_of
from verlflow.compat import verl as verl_sites
from verlflow.compat.omegaconf import child_node, full_key
from verlflow.errors import NO_VALUE, Problem

# ``name.attr.attr…`` in a statement; the first name is a local variable of the frame.
ATTRIBUTE_CHAIN = re.compile(r"\b([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)")
ASSIGNED_GET = re.compile(r"\b([A-Za-z_]\w*)\s*=\s*([A-Za-z_]\w*)\.get\(\s*[\"']([A-Za-z_]\w*)[\"']")
GET_CALL = re.compile(r"\b([A-Za-z_]\w*)\.get\(\s*[\"']([A-Za-z_]\w*)[\"']")
# Dotted words in a message that may be keys of the resolved config.
DOTTED_WORD = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+")


@dataclass(frozen=True)
class Blame:
    """One way a site can fail: a clue in verl's message, the key it blames and the fix."""

    clue: str
    key: str
    fix: str


# A reward function called with keyword arguments it does not take (0.9 reads reward.*, 0.5 the top level).
REWARD_KWARGS = (
    Blame("", "reward.custom_reward_function.reward_kwargs", "pass only keyword arguments the function takes"),
    Blame("", "custom_reward_function.reward_kwargs", "pass only keyword arguments the function takes"),
)
# verl's RLHFDataset turning a row into a prompt.
DATASET = (
    Blame("chat_template", "actor_rollout_ref.model.path", "its tokenizer has no chat template: use the model's "
                                                           "instruct tokenizer or add a chat_template"),
    Blame("larger than max_length", "data.max_prompt_length", "a prompt of the first batch is longer: raise it "
                                                              "(the guide: 1024), or set data.truncation=left, "
                                                              "right or middle"),
    Blame("longer than", "data.max_prompt_length", "a prompt of the first batch is longer: raise it (the guide: "
                                                   "1024), or set data.truncation=left, right or middle"),
    Blame("", "data.prompt_key", "the column must hold the chat messages (prompt, as preprocess writes it)"),
)
# verl's (path under verl/, function), named in verlflow.compat.verl, → the ways it fails, tried in order: the
# first whose clue is in verl's message (an empty clue always matches) and whose key the config has. Only sites
# whose statement names no config key belong here; every other key is read from the statement itself.
SITES: dict[tuple[str, str], tuple[Blame, ...]] = {
    verl_sites.DATALOADER: (
        Blame("num_workers", "data.dataloader_num_workers", "use 0 (load in the trainer) or more workers"),
        Blame("", "data.train_batch_size", "the training set must give at least one full batch (verl drops the "
                                           "last partial one): lower data.train_batch_size or give more rows"),
    ),
    verl_sites.RESUME: (
        Blame("hdfs", "trainer.default_hdfs_dir", "verl cannot resume from HDFS: set it to null"),
        Blame("str type", "trainer.resume_from_path", "resume_mode=resume_path needs the checkpoint folder: set "
                                                      "trainer.resume_from_path=<…/global_step_N>"),
        Blame("global_step", "trainer.resume_from_path", "name a checkpoint folder …/global_step_N"),
        Blame("checkpoint folder", "trainer.resume_from_path", "name an existing …/global_step_N folder"),
        Blame("invalid literal", "trainer.resume_from_path", "verl reads the step number from all that follows "
                                                             "'global_step_': name the …/global_step_N folder itself, "
                                                             "not a folder inside it (no /actor)"),
        Blame("", "trainer.resume_mode", "use auto (the newest checkpoint in trainer.default_local_dir, or a fresh "
                                         "start), disable, or resume_path with trainer.resume_from_path"),
    ),
    verl_sites.REWARD_CALL: REWARD_KWARGS,
    verl_sites.REWARD_WRAPPED: REWARD_KWARGS,
    verl_sites.DATASET_LENGTH: DATASET,
    verl_sites.POSTPROCESS: DATASET,
    verl_sites.DATASET_FILTER: DATASET,
    verl_sites.DATASET_ITEM: DATASET,
    verl_sites.DATASET_MESSAGES: DATASET,
    verl_sites.ADVANTAGE: (
        Blame("sum_pi_squared", "actor_rollout_ref.actor.calculate_sum_pi_squared",
              "the optimal token baseline needs the actor's sum of squared probabilities: set it True"),
        Blame("", "algorithm.adv_estimator", "verl's estimator fails on a batch of the configured shapes"),
    ),
    verl_sites.DEFAULT_SCORE: (
        Blame("", "data.reward_fn_key", "verl's default scorer knows no such data source: the column it names "
                                        "must hold one (openai/gsm8k for GSM8K), or give custom_reward_function"),
    ),
}


def blame(site: tuple[Blame, ...], message: str, cfg: DictConfig) -> Blame:
    """The first way of ``site`` whose clue is in ``message`` and whose key the config has."""
    fitting = [b for b in site if b.clue in message and _exists(cfg, b.key)]
    return fitting[0] if fitting else next((b for b in site if b.clue in message), site[-1])


def frames(exc: BaseException) -> list[tuple[Any, int]]:
    """(frame, line) of every level of ``exc``'s traceback, outermost first."""
    found = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        found.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return found


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception of ``exc``'s chain that was raised in verl (Hydra wraps dataclass errors)."""
    chain, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    for candidate in reversed(chain):
        if verl_frame(candidate) is not None:
            return candidate
    return exc


def _verl_root() -> Path:
    import verl

    return Path(verl.__file__).resolve().parent


def verl_frame(exc: BaseException) -> tuple[Any, int] | None:
    """The innermost frame of ``exc``'s traceback that is verl's code."""
    root = str(_verl_root())
    inside = [(f, line) for f, line in frames(exc) if str(Path(f.f_code.co_filename).resolve()).startswith(root)]
    return inside[-1] if inside else None


def where(frame: Any, line: int) -> str:
    """``path/under/verl.py:line`` of a verl frame."""
    path = Path(frame.f_code.co_filename).resolve().relative_to(_verl_root())
    return f"{path.as_posix()}:{line}"


def statement(frame: Any, line: int) -> str:
    """The whole statement (all its lines) that raised at ``line`` of ``frame``'s file."""
    filename = frame.f_code.co_filename
    source = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return linecache.getline(filename, line).strip()
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                                ast.If, ast.For, ast.While, ast.With, ast.Try)):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                if best is None or node.lineno >= best.lineno:
                    best = node
    if best is None:
        return linecache.getline(filename, line).strip()
    return " ".join(ast.get_source_segment(source, best).split())


def _node_key(node: Any) -> str | None:
    return full_key(node) if isinstance(node, (DictConfig, ListConfig)) else None


def keys_in_statement(frame: Any, text: str, cfg: DictConfig, *, section: str | None,
                      renamed: dict[str, str] | None = None) -> list[str]:
    """Config keys a statement reads, resolved against the frame's objects (see the module docstring).

    ``renamed`` maps a dataclass field to the key of ``section`` verl copied it from.
    """
    found: list[str] = []
    local = frame.f_locals
    for base, chain in ATTRIBUTE_CHAIN.findall(text):
        attrs = chain.lstrip(".").split(".")
        obj = local.get(base)
        prefix = None
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            if renamed and section and attrs[0] in renamed:
                found.append(f"{section}.{renamed[attrs[0]]}")
                continue
            prefix = dataclass_section(cfg, section or "", obj, attrs[0])
        rest = attrs
        while prefix is None and rest and obj is not None:
            prefix = _node_key(obj)
            if prefix is not None:
                break
            obj, rest = getattr(obj, rest[0], None), rest[1:]
        if prefix is None and isinstance(obj, (DictConfig, ListConfig)):
            prefix = _node_key(obj)
        if prefix is None:
            continue
        for depth in range(len(rest), 0, -1):
            key = ".".join(filter(None, [prefix, *rest[:depth]]))
            if _exists(cfg, key):
                found.append(key)
                break
    reads = GET_CALL.findall(text)  # node.get("seed", 1): the key is the node's, plus the name
    reads += [(base, name) for target, base, name in ASSIGNED_GET.findall(_function_source(frame))
              if re.search(rf"\b{target}\b", text)]  # seed = node.get("seed") earlier in the function
    for base, name in reads:
        obj = local.get(base)
        prefix = _node_key(obj) if isinstance(obj, DictConfig) else None
        key = ".".join(filter(None, [prefix, name])) if prefix is not None else ""
        if key and _exists(cfg, key):
            found.append(key)
    return list(dict.fromkeys(found))


def _function_source(frame: Any) -> str:
    try:
        return inspect.getsource(frame.f_code)
    except (OSError, TypeError):  # no source for this frame
        return ""


def dataclass_section(cfg: DictConfig, section: str, obj: Any, field: str) -> str | None:
    """The node under ``section`` ('' for anywhere) that ``obj``, a dataclass verl built, came from.

    Several nodes may build the same class (the actor's and the critic's optimizer): the one whose ``field``
    holds the value ``obj`` has wins.
    """
    if section and _exists(cfg, f"{section}.{field}") and not _targets(OmegaConf.select(cfg, section)):
        return section
    name, wanted = type(obj).__name__, getattr(obj, field, None)
    root = OmegaConf.select(cfg, section) if section else cfg
    matches = []
    pending = [(section, root)]
    while pending:
        path, node = pending.pop()
        if not isinstance(node, DictConfig):
            continue
        target = node.get("_target_") if "_target_" in node else None
        if isinstance(target, str) and target.rsplit(".", 1)[-1] == name and field in node:
            matches.append(path)
        pending += [(f"{path}.{k}" if path else str(k), child_node(node, k)) for k in node.keys() if isinstance(k, str)]
    same = [m for m in matches if value_of(cfg, f"{m}.{field}") == wanted]
    return (same or matches or [None])[0]


def _targets(node: Any) -> str | None:
    """The class name a node's ``_target_`` names, if any."""
    target = node.get("_target_") if isinstance(node, DictConfig) and "_target_" in node else None
    return target.rsplit(".", 1)[-1] if isinstance(target, str) else None


def keys_in_message(message: str, cfg: DictConfig, section: str | None = None) -> list[str]:
    """Dotted words of verl's message that are keys of the resolved config (or of ``section``:
    ``policy_loss.dro_beta`` in the actor's loss is ``actor_rollout_ref.actor.policy_loss.dro_beta``)."""
    found = []
    for word in DOTTED_WORD.findall(message):
        for key in (word, f"{section}.{word}" if section else None):
            if key and _exists(cfg, key):
                found.append(key)
                break
    return list(dict.fromkeys(found))


def keys_by_value(message: str, cfg: DictConfig) -> list[str]:
    """Keys whose string value (a path, a name of 4+ characters) verl quotes in its message, longest first."""
    found: list[tuple[int, str]] = []
    pending: list[tuple[str, Any]] = [("", OmegaConf.to_container(cfg, resolve=False))]
    while pending:
        path, node = pending.pop()
        if isinstance(node, dict):
            pending += [(f"{path}.{k}" if path else str(k), v) for k, v in node.items()]
        elif isinstance(node, str) and len(node) >= 4 and "${" not in node and node in message:
            found.append((len(node), path))
    return [key for _, key in sorted(found, reverse=True)]


def _exists(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node


def message_of(exc: BaseException) -> str:
    """verl's message on one line (the exception's type when it has none)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def to_problem(exc: BaseException, cfg: DictConfig, *, stage: str, section: str | None = None,
               nearest: tuple[str, ...] = (), renamed: dict[str, str] | None = None) -> Problem:
    """One line for an exception verl raised while rehearsing ``stage`` (see the module docstring).

    ``section`` is the config node a dataclass was built from (its ``self.x`` is ``section.x``);
    ``nearest`` are the stage's keys, named when nothing else points at one; ``renamed`` maps the fields of
    a dataclass verl built from renamed keys back to them (the reference policy's ``log_prob_*``).
    """
    cause = root_cause(exc)
    message = message_of(cause)
    for field, key in (renamed or {}).items():
        message = re.sub(rf"\b\w+\.{field}\b", f"{section}.{key}", message)
    found = verl_frame(cause)
    if found is None:
        keys = keys_in_message(message, cfg)
        if keys:
            return Problem(keys[0], value_of(cfg, keys[0]), f"{message[:300]}")
        near = f" (nearest keys: {', '.join(nearest)})" if nearest else ""
        return Problem(stage, NO_VALUE, f"{message[:300]}{near}")
    frame, line = found
    site_at = where(frame, line)
    text = statement(frame, line)
    site = SITES.get((site_at.rpartition(":")[0], frame.f_code.co_name))
    shown = message if message != type(cause).__name__ else f"verl's check `{text[:200]}` fails"
    if site is not None:
        chosen = blame(site, message, cfg)
        return Problem(chosen.key, value_of(cfg, chosen.key), f"{shown[:300]} ({site_at}): {chosen.fix}")
    keys = (keys_in_statement(frame, text, cfg, section=section, renamed=renamed)
            or keys_in_message(message, cfg, section) or keys_by_value(message, cfg))
    if keys:
        also = f" (with {', '.join(f'{k}={value_of(cfg, k)}' for k in keys[1:3])})" if len(keys) > 1 else ""
        return Problem(keys[0], value_of(cfg, keys[0]), f"{shown[:300]} ({site_at}){also}")
    if len(nearest) == 1:  # the stage reads one key (the model's path): that key is the one to change
        return Problem(nearest[0], value_of(cfg, nearest[0]), f"{shown[:300]} ({site_at})")
    near = f"; nearest keys: {', '.join(nearest)}" if nearest else ""
    return Problem(stage, NO_VALUE, f"{shown[:300]} ({site_at}{near})")
