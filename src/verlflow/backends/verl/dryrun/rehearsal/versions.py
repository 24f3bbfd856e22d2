"""Which verl a rule is judged against: the cluster's (the profile's stack names it), not only the installed one.

The rehearsal runs the installed verl's code; the cluster runs the verl its image holds
(``config/stacks/<name>.yaml``: ``verl: {version: …}``). A few settings are fatal in one and legal in the
other. Each is a :class:`VersionRule`, checked in both verls' source: below ``legal_from`` the setting fails
as ``fatal_at`` says; from it on it is legal and ``legal_at`` says what that verl does instead (a warning,
since the user probably meant something else). When the two verls differ the dry run says so once
(:func:`versions_note`), and a rule's line names both.

- ``rollout.max_model_len`` below prompt + response: 0.5.0 hands the engine a request longer than it holds
  (vLLM refuses it at the first rollout); 0.9.1 caps ``max_tokens`` to what is left
  (``workers/rollout/vllm_rollout/vllm_async_server.py:vLLMHttpServer.generate``).
- ``data.max_prompt_length + max_response_length`` over the model's positions (no ``rollout.max_model_len``):
  0.5.0's vLLM rollout asserts they fit (``vllm_rollout_spmd.py:120``); 0.9.1 sets ``max_model_len`` to the
  positions and caps each response to what is left (``vllm_async_server.py:1105``, ``:593``).
- ``ref.strategy`` that names no engine (``fsdp_2``): 0.9.1's reference worker builds its engine with it
  (``workers/engine/base.py:401`` asserts the backend); 0.5.0 never reads it (the reverse: fatal on the newer).
- a dynamic batch's token budget × sequence parallel below prompt + response: 0.5.0 pads every sequence to
  that length, so ``rearrange_micro_batches`` asserts at the first batch; 0.9.1 packs them and asserts only on a
  batch holding a sequence that long (a warning).
- ``trainer.device`` not the profile's: 0.5.0 asks Ray for those devices (``RayPPOTrainer.device_name``) and
  waits for ever; 0.9.1 resets it to the platform it detects (``utils/device.py:auto_set_device``).
- the top-level ``custom_reward_function``: 0.5.0 loads it (``trainer/ppo/reward.py:get_custom_reward_fn``);
  0.9.1's trainer reads only ``reward.custom_reward_function`` (``migrate_legacy_reward_impl`` runs only in
  the fully-async trainer), so the function is never used.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from verlflow.backends.verl.dryrun.keys import ACTOR, REF, ROLLOUT
from verlflow.errors import Problem

LEGACY_REWARD = "custom_reward_function"


@dataclass(frozen=True)
class VerlVersions:
    """The cluster's verl (from the profile's stack; None when no stack names one) and the installed one."""

    cluster: str | None
    installed: str
    stack: str

    @property
    def judged(self) -> str:
        """The verl the rules are judged against: the cluster's when the stack names it."""
        return self.cluster or self.installed

    @property
    def differ(self) -> bool:
        """Whether the cluster's verl is another release than the installed one."""
        return bool(self.cluster) and _release(self.cluster) != _release(self.installed)


@dataclass(frozen=True)
class VersionRule:
    """A setting fatal before ``legal_from`` (as ``fatal_at`` says) and legal from it (``legal_at``)."""

    key: str
    legal_from: str
    fatal_at: str
    legal_at: str
    clue: str = ""  # only the lines on ``key`` whose fix says this (another check may name the same key)
    # Fatal from ``legal_from`` on and legal (ignored) before it: a key the older verl never reads.
    inverted: bool = False

    def covers(self, problem: Problem) -> bool:
        """Whether ``problem`` is this rule's line."""
        same_key = problem.key == self.key or (self.key.startswith(LEGACY_REWARD)
                                               and problem.key.startswith(f"{LEGACY_REWARD}."))
        return same_key and self.clue in problem.fix


RULES = (
    VersionRule(f"{ROLLOUT}.max_model_len", "0.9.1",
                "verl 0.5.0 asks the engine for more tokens than it holds: vLLM refuses it at the first rollout",
                "verl 0.9.1 caps max_tokens to what is left (vllm_async_server.py:vLLMHttpServer.generate), "
                "so long prompts get shorter responses"),
    VersionRule("data.max_response_length", "0.9.1",
                "verl 0.5.0's vLLM rollout asserts max_position_embeddings >= prompt + response when it starts "
                "(workers/rollout/vllm_rollout/vllm_rollout_spmd.py:120)",
                "verl 0.9.1 sets rollout.max_model_len to the model's positions (vllm_async_server.py:1105) and "
                "caps each response to what is left (:593), so long prompts get shorter responses",
                clue="max_position_embeddings"),
    VersionRule(f"{REF}.strategy", "0.9.1",
                "verl 0.9.1 builds the reference model's engine for it (workers/engine/base.py:401)",
                "verl 0.5.0 never reads it: the reference is built with the actor's strategy "
                "(workers/fsdp_workers.py:369); a 0.9.1 image would refuse it", inverted=True),
    *(VersionRule(key, "0.9.1", "verl 0.5.0 pads every sequence to prompt + response, so "
                                "rearrange_micro_batches asserts at the first batch (utils/seqlen_balancing.py:277)",
                  "verl 0.9.1 packs sequences first (ray_trainer.py:1255) and asserts only on a batch holding one "
                  "longer than the budget × sp (utils/seqlen_balancing.py:384): it fails when a response runs that "
                  "long", clue="verl 0.5.0 pads every sequence")
      for key in (f"{ACTOR}.ppo_max_token_len_per_gpu", f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
                  f"{REF}.log_prob_max_token_len_per_gpu")),
    VersionRule("trainer.device", "0.9.1",
                "verl 0.5.0 asks Ray for these devices (RayPPOTrainer.device_name) and waits for ever",
                "verl 0.9.1 resets it to the platform it detects on the nodes (utils/device.py:auto_set_device)"),
    VersionRule(f"{LEGACY_REWARD}.path", "0.9.1",
                "verl 0.5.0 loads the reward function from it (trainer/ppo/reward.py:get_custom_reward_fn)",
                "verl 0.9.1's trainer never reads the top-level custom_reward_function (only "
                "reward.custom_reward_function): move it there"),
)


def _release(version: str) -> Version | None:
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return None


@functools.lru_cache(maxsize=8)
def verl_versions(stack: str) -> VerlVersions:
    """The profile's stack's verl and the installed verl."""
    import verl

    cluster = None
    if stack:
        from verlflow.device.stacks import load_stack

        try:
            cluster = load_stack(stack).version("verl")
        except Exception:  # an unreadable stack is doctor's to report; here it names no verl
            cluster = None
    label = stack.rsplit("/", 1)[-1].removesuffix(".yaml") if stack else ""
    return VerlVersions(cluster=cluster, installed=str(verl.__version__), stack=label)


def versions_note(versions: VerlVersions) -> list[str]:
    """One note when the cluster's verl differs from the installed one (the rehearsal runs the installed one)."""
    if not versions.differ:
        return []
    return [f"the {versions.stack} image runs verl {versions.cluster}, this machine has verl {versions.installed}: "
            f"the rehearsal runs {versions.installed}'s code; the settings the two treat differently are judged "
            f"for {versions.cluster}"]


def _legal(rule: VersionRule, version: str) -> bool:
    judged, boundary = _release(version), _release(rule.legal_from)
    return judged is not None and boundary is not None and (judged >= boundary) != rule.inverted


def judge(problems: list[Problem], versions: VerlVersions) -> tuple[list[Problem], list[str]]:
    """``problems`` with each version rule's line judged for the cluster's verl: kept (naming the other verl's
    behaviour when the installed one differs) or turned into a warning."""
    kept, warnings = [], []
    for problem in problems:
        rule = next((r for r in RULES if r.covers(problem)), None)
        if rule is None:
            kept.append(problem)
        elif _legal(rule, versions.judged):
            warnings.append(Problem(problem.key, problem.value, f"{rule.legal_at}{_other(versions)}").line())
        else:
            other = (f" (judged for the {versions.stack} image's verl {versions.judged}; {rule.legal_at}, the verl "
                     "installed here)" if versions.differ and _legal(rule, versions.installed) else "")
            kept.append(Problem(problem.key, problem.value, f"{problem.fix}{other}"))
    return kept, warnings


def legacy_reward_warnings(path: object, already: list[str], versions: VerlVersions) -> list[str]:
    """The top-level reward function set where the cluster's verl never reads it (a file that exists too)."""
    rule = next(r for r in RULES if r.key == f"{LEGACY_REWARD}.path")
    if not path or not _legal(rule, versions.judged) or any(w.startswith(f"{LEGACY_REWARD}.") for w in already):
        return []
    return [f"{rule.key}={path}: {rule.legal_at}{_other(versions)}"]


def _other(versions: VerlVersions) -> str:
    return f" (judged for the {versions.stack} image's verl {versions.judged})" if versions.cluster else ""
