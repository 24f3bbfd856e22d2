"""verl's rollout traces made readable: the root span carries the prompt, the response, the reward and the step.

    VERL_USE_EXTERNAL_MODULES=verlflow.backends.verl.cpu_plugin …   # the plugin calls install() in every verl process

verl (>= 0.9, ``actor_rollout_ref.rollout.trace.backend=mlflow``) opens one MLflow trace per traced rollout in its
agent-loop workers. Its root span, ``agent_loop`` (``verl.utils.rollout_trace.rollout_trace_attr``), has no inputs,
outputs or attributes: the step goes to a trace tag only, and the text sits two spans down
(``LLMServerClient.generate`` with ``token2text``), so MLflow's Traces tab shows ID, time and state and nothing to
read. The local trainer's traces show prompt, response and reward on the root span
(:mod:`verlflow.backends.local.traces`); this makes verl's the same:

- inputs ``{"prompt": …}``: the prompt's text, as the dataset gave it (the chat messages' contents);
- outputs ``{"response": …, "reward": …}``: the decoded response (in a fenced code block, so the trace viewer
  shows ``#### 42`` as written, not as a Markdown heading) and the reward verl scored it with;
- attributes ``step``, ``sample_index``, ``rollout_n``, ``validate``: verl's own trace attributes.

verl offers no hook on that span, so :func:`install` wraps ``AgentLoopWorker._agent_loop_postprocess`` (private,
and on its subclasses, Ray's actor class among them), the one method that runs inside the root span after the reward
is computed, and reads verl's trace attributes from
``verl.utils.rollout_trace._trace_attributes`` (private). Checked on verl 0.9.1. It patches lazily, when an agent-loop
worker calls ``RolloutTraceConfig.init`` (public), so a process that never traces imports nothing more. Fallback:
where a name is gone, nothing is patched and verl's traces stay as verl makes them; a span that cannot be filled
costs its fields, never the rollout.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

from verlflow.text_safety import markdown_verbatim

log = logging.getLogger(__name__)

CHECKED_ON = "verl 0.9.1"
ROOT_SPAN = "agent_loop"
_AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
_ATTRIBUTES = ("step", "sample_index", "rollout_n", "validate")
_MARK = "_verlflow_trace_fields"


def install() -> bool:
    """Make verl's agent-loop workers fill their traces' root spans (idempotent); False where this verl cannot."""
    try:
        from verl.utils.rollout_trace import RolloutTraceConfig
    except ImportError:  # verl < 0.9 has no rollout tracer
        return False
    original = RolloutTraceConfig.__dict__.get("init")
    if not isinstance(original, classmethod):
        return False
    if getattr(original.__func__, _MARK, False):
        return True

    @functools.wraps(original.__func__)
    def init(cls, *args, **kwargs):
        _patch_agent_loop_worker()
        return original.__func__(cls, *args, **kwargs)

    setattr(init, _MARK, True)
    RolloutTraceConfig.init = classmethod(init)
    return True


def _patch_agent_loop_worker() -> None:
    """Wrap ``_agent_loop_postprocess`` where ``AgentLoopWorker`` and each of its subclasses define it (its module is
    loaded: a worker is calling init). The subclasses matter: Ray's actor class is one, and Ray sets a wrapper of
    every method on it as it loads the actor, which a patch of ``AgentLoopWorker`` alone would never reach."""
    worker = getattr(sys.modules.get(_AGENT_LOOP_MODULE), "AgentLoopWorker", None)
    if worker is None or not hasattr(worker, "_agent_loop_postprocess"):
        log.debug("this verl has no AgentLoopWorker._agent_loop_postprocess (checked on %s): traces left as verl "
                  "makes them", CHECKED_ON)
        return
    classes, seen = [worker], set()
    while classes:
        cls = classes.pop()
        if cls in seen:
            continue
        seen.add(cls)
        classes += cls.__subclasses__()
        original = cls.__dict__.get("_agent_loop_postprocess")
        if original is not None and not getattr(original, _MARK, False):
            cls._agent_loop_postprocess = _filling(original)


def _filling(original):
    """``original`` (an ``_agent_loop_postprocess``) that fills the root span once the rollout is scored."""

    @functools.wraps(original)
    async def _agent_loop_postprocess(self, output, *args, **kwargs):
        result = await original(self, output, *args, **kwargs)
        fill_root_span(getattr(self, "tokenizer", None), output, kwargs.get("raw_prompt"))
        return result

    setattr(_agent_loop_postprocess, _MARK, True)
    return _agent_loop_postprocess


def fill_root_span(tokenizer: Any, output: Any, raw_prompt: Any) -> bool:
    """Set the active ``agent_loop`` root span's prompt, response, reward and step; whether it did.

    ``output`` is verl's ``AgentLoopOutput`` (``response_ids``, ``reward_score``) once scored. Never raises: the
    rollout matters more than its trace."""
    try:
        from verl.utils import rollout_trace

        if rollout_trace.RolloutTraceConfig.get_backend() != "mlflow":
            return False
        import mlflow

        span = mlflow.get_current_active_span()
        if span is None or span.parent_id is not None or span.name != ROOT_SPAN:
            return False
        attributes = rollout_trace._trace_attributes.get() or {}
        response = tokenizer.decode(list(output.response_ids), skip_special_tokens=True) if tokenizer else None
        span.set_inputs({"prompt": prompt_text(raw_prompt)})
        shown = markdown_verbatim(response) if response is not None else None  # MLflow renders strings as Markdown
        span.set_outputs({"response": shown, "reward": output.reward_score})
        span.set_attributes({key: attributes[key] for key in _ATTRIBUTES if key in attributes})
        return True
    except Exception as exc:  # noqa: BLE001 - any failure here must leave verl's rollout alone
        log.debug("rollout trace's root span not filled: %s", exc)
        return False


def prompt_text(raw_prompt: Any) -> str:
    """The prompt as text: a chat's message contents one per line (verl's ``raw_prompt``), else ``str``."""
    if isinstance(raw_prompt, str):
        return raw_prompt
    try:
        messages = list(raw_prompt)
    except TypeError:
        return str(raw_prompt)
    if messages and all(isinstance(m, dict) and "content" in m for m in messages):
        return "\n".join(str(m["content"]) for m in messages)
    return str(raw_prompt)
