"""The end's replay after an outage is batched: no metric history is read per key, a checkpoint's step is linked in
one write, the timing summaries come from the sums the trainer kept, and a long record on a server that answers
again is waited for.

A real ``mlflow server`` on 127.0.0.1 behind a fault proxy (tests/fault_proxy.py) that answers every request 500
for the outage and lists the requests it saw. Before: the end read one history per key for the summaries and for
the models' links (~1 s each behind a slow proxy, 69 keys), ran out of its window and left a manual upload.
"""

from __future__ import annotations

import time

import mlflow
import pytest
from conftest import wait_until
from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric
from mlflow.tracking import MlflowClient

from verlflow.outage import logged_models, metric_buffer, spill
from verlflow.outage.metric_buffer import MetricBuffer
from verlflow.tracking import tracking

KEYS = [f"actor/metric_{index:02d}" for index in range(24)] + ["timing_s/step", "timing_s/gen"]
STEPS = 4


def _metrics(step: int) -> dict[str, float]:
    return {key: step + index / 100 for index, key in enumerate(KEYS)}


def _history_reads(paths: list[str]) -> list[str]:
    return [p for p in paths if "get-history" in p]


def _model(client: MlflowClient, run_id: str, name: str, step: int, status=LoggedModelStatus.READY) -> str:
    model = client.create_logged_model(experiment_id="0", name=name, source_run_id=run_id,
                                       tags={logged_models.CHECKPOINT_STEP_TAG: str(step)})
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=step)])
    if status is not None:
        client.finalize_logged_model(model.model_id, status)
    return model.model_id


@pytest.mark.slow
def test_the_ends_replay_links_and_summarises_without_reading_a_history(proxied_server, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    started_at = time.time()
    with metric_buffer.buffering(run_id, tmp_path) as buffer:
        for step in range(1, STEPS + 1):
            if step == 3:
                proxied_server.error_every = 1  # the outage, from step 3 on
            buffer.log(_metrics(step), step)
            if step == 2:
                assert buffer.flush(60)
                checkpoint = logged_models.record_checkpoint_model(run_id, tmp_path / "global_step_2", 2,
                                                                   link=metric_buffer.link_model)
        wait_until(lambda: buffer.written >= 0 and buffer.outage, 60, "the writer's report of the outage")
        assert tracking.log_run_summaries(run_id, started_at).keys() == {"timing_s/e2e"}  # deferred to the writer
        asked = len(proxied_server.paths)
        proxied_server.heal()
    assert buffer.close(wait_s=60) == 0
    assert not _history_reads(proxied_server.paths[asked:]), proxied_server.paths[asked:]
    run = client.get_run(run_id)
    mean = sum(_metrics(step)["timing_s/step"] for step in range(1, STEPS + 1)) / STEPS
    assert run.data.metrics["timing_s_mean/step"] == pytest.approx(mean)
    assert run.data.metrics["timing_s/e2e"] > 0
    linked = client.get_logged_model(checkpoint.model_id).metrics
    assert sorted((m.key, m.step, m.value) for m in linked) == sorted((k, 2, v) for k, v in _metrics(2).items())
    assert all(sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2, 3, 4] for key in KEYS[::8])
    assert not (tmp_path / "metrics.spill.jsonl").exists()


@pytest.mark.slow
def test_the_final_models_link_reads_the_run_once_and_no_model_is_left_unfinished(proxied_server, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    for step in range(1, STEPS + 1):
        client.log_batch(run_id, metrics=[Metric(k, v, 1_000_000 + step, step) for k, v in _metrics(step).items()])
    orphan = _model(client, run_id, logged_models.FINAL_MODEL, STEPS, status=None)  # a killed upload: PENDING
    final = _model(client, run_id, logged_models.FINAL_MODEL, STEPS)
    asked = len(proxied_server.paths)
    model = logged_models.replay_final_model(client, run_id, tmp_path / "unused", STEPS)
    assert model.model_id == final
    assert not _history_reads(proxied_server.paths[asked:]), proxied_server.paths[asked:]
    linked = client.get_logged_model(final).metrics
    assert sorted((m.key, m.value) for m in linked) == sorted(_metrics(STEPS).items())
    assert [m.model_id for m in client.search_logged_models(experiment_ids=["0"],
                                                           filter_string=f"source_run_id = '{run_id}'")] == [final]
    assert orphan != final


@pytest.mark.slow
def test_a_long_record_on_a_server_that_answers_again_is_waited_for(proxied_server, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    keys = [f"timing_s/phase_{index:02d}" for index in range(48)]
    for step in (1, 2):  # an earlier attempt's steps: a resumed run's summaries read them back
        client.log_batch(run_id, metrics=[Metric(k, float(step), 1_000_000 + step, step) for k in keys])
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.3, write_every_s=0.1)
    proxied_server.error_every = 1
    buffer.log({k: 3.0 for k in keys}, 3)
    buffer.log_record({"kind": "summaries", "started_at": 1.0, "ended_at": 2.0, **buffer.timing.as_record()})
    wait_until(lambda: buffer.written >= 0 and buffer.outage, 60, "the writer's report of the outage")
    proxied_server.heal()
    proxied_server.delay_s = 0.5  # back, but slow: the record's 49 reads take ~25 s, past the window and the writer's
    # 15 s grace to end its call (MetricBuffer._end_writer)
    assert buffer.close(wait_s=3) == 0  # before: the writer was killed mid-record, the rest left to an upload
    metrics = client.get_run(run_id).data.metrics
    assert all(metrics[f"timing_s_mean/{k.removeprefix('timing_s/')}"] == pytest.approx(2.0) for k in keys)
    assert not spill.uploaded_marker(tmp_path / "spill.jsonl").exists() and not (tmp_path / "spill.jsonl").exists()


def _traces(client: MlflowClient, run_id: str) -> list[tuple[str, str]]:
    mlflow.flush_trace_async_logging()
    traces = client.search_traces(locations=["0"], run_id=run_id, include_spans=False)
    return sorted((t.info.tags["step"], t.info.tags["sample_index"]) for t in traces)


@pytest.mark.slow
def test_rollout_traces_of_an_outage_are_sent_on_replay_and_by_the_upload(proxied_server, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    rows = [{"prompt": f"{n}+{n}?", "response": str(2 * n), "reward": 1.0} for n in range(2)]
    proxied_server.error_every = 1  # the outage
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.3, write_every_s=0.1)
    buffer.log({"loss": 1.0}, 1)
    buffer.log_record({"kind": "traces", "step": 1, "rows": rows})
    wait_until(lambda: buffer.written >= 0 and buffer.outage, 60, "the writer's report of the outage")
    proxied_server.heal()  # back before the end: the replay sends them
    assert buffer.close(wait_s=60) == 0
    assert _traces(client, run_id) == [("1", "0"), ("1", "1")]  # before: lost, never spilled

    proxied_server.error_every = 1  # down until after the end: the spill file keeps them, the upload sends them
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.3, write_every_s=0.1)
    buffer.log_record({"kind": "traces", "step": 2, "rows": rows})
    assert buffer.close(wait_s=2) == 1
    proxied_server.heal()
    spill.upload(tmp_path / "spill.jsonl")
    spill.uploaded_marker(tmp_path / "spill.jsonl").replace(tmp_path / "spill.jsonl")
    spill.upload(tmp_path / "spill.jsonl")  # a second upload makes none twice
    assert _traces(client, run_id) == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
