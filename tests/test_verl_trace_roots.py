"""verl's rollout traces read like the local trainer's: the root span ``agent_loop`` carries the prompt, the response,
the reward and the step (verlflow.compat.verl_traces, installed in every verl process by the cpu-verl plugin).

Here verl's own tracer (``RolloutTraceConfig``, ``rollout_trace_attr``) writes one trace into a real SQLite store in a
process that imported verl with the plugin, as an agent-loop worker does; tests/test_verl_cpu_launch.py shows the same
on a real verl launch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import fresh_store
from mlflow.tracking import MlflowClient

from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

WORKER = textwrap.dedent("""
    import asyncio, sys
    import verl  # loads verlflow.backends.verl.cpu_plugin (VERL_USE_EXTERNAL_MODULES), as in every verl process
    import mlflow
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker
    from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr
    from verlflow.compat import verl_traces

    from ray.actor import _modify_class
    from ray.util.tracing.tracing_helper import _inject_tracing_into_class

    # What Ray does to the actor class as a worker process loads it, before __init__: a subclass whose every method
    # is Ray's wrapper, set on the subclass itself.
    actor_class = _modify_class(AgentLoopWorker)
    _inject_tracing_into_class(actor_class)
    RolloutTraceConfig.init("verlflow/traces", "t · tiny", "mlflow", True, 2)  # what each AgentLoopWorker does
    for cls in (AgentLoopWorker, actor_class):
        assert getattr(cls._agent_loop_postprocess, "_verlflow_trace_fields", False), f"{cls} not patched"
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    ids = tokenizer.encode("6 times 7 is 42. #### 42")
    output = AgentLoopOutput(prompt_ids=[1, 2, 3], response_ids=ids, response_mask=[1] * len(ids),
                             reward_score=1.0, metrics=AgentLoopMetrics())

    async def rollout():
        with rollout_trace_attr(step=3, sample_index=5, rollout_n=1, validate=False, name="agent_loop"):
            assert verl_traces.fill_root_span(tokenizer, output, [{"role": "user", "content": "What is 6 x 7?"}])

    asyncio.run(rollout())
    mlflow.flush_trace_async_logging()
""")


@pytest.mark.slow  # verl's agent loop imported in a fresh process: tens of seconds on 2 busy cores
def test_verls_root_span_carries_prompt_response_reward_and_step(tmp_path, tiny_workdir):
    uri = fresh_store(tmp_path)
    model = resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache")
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "VERL_PLATFORM": "cpu",
           "VERL_USE_EXTERNAL_MODULES": "verlflow.backends.verl.cpu_plugin"}
    done = subprocess.run([sys.executable, "-c", WORKER, model], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("verlflow/traces")
    (trace,) = client.search_traces(locations=[experiment.experiment_id])
    (root,) = [span for span in trace.data.spans if span.parent_id is None]
    assert root.name == "agent_loop"
    assert root.inputs == {"prompt": "What is 6 x 7?"}
    # in a fenced block, so MLflow's Markdown viewer shows "#### 42" as written, not as a heading
    assert root.outputs == {"response": "```text\n6 times 7 is 42. #### 42\n```", "reward": 1.0}
    assert {key: root.attributes.get(key) for key in ("step", "sample_index", "rollout_n", "validate")} == {
        "step": 3, "sample_index": 5, "rollout_n": 1, "validate": False}
    assert trace.info.tags["step"] == "3"  # verl's own tag, kept
