"""A metric writer that replaces a dead one takes over the artifact records the dead one kept (parked) in the spill
file: the trainer had counted them written, so before, the new writer's end rewrote the spill file without them and
the refused table was lost for good. A real ``mlflow server`` whose artifact folder refuses writes, then takes them.
"""

from __future__ import annotations

import os
import signal

import pytest
from conftest import wait_until
from test_artifact_faults import logging_while_artifacts_are_refused, server  # noqa: F401  (the server fixture)

from verlflow.outage import spill


@pytest.mark.slow
def test_a_replacement_writer_keeps_and_writes_the_dead_writers_parked_artifact(server, tmp_path):  # noqa: F811
    with logging_while_artifacts_are_refused(server, tmp_path) as (client, run_id, path, buffer):
        buffer.log_record({"kind": "table", "artifact_file": "samples/step_1.json",
                           "data": {"prompt": ["1+1?"], "response": ["2"], "reward": [1.0]}})
        buffer.log({"loss": 0.5}, 2)
        wait_until(lambda: buffer.flush(wait_s=1) and buffer.parked == 1, 60, "the table parked, the points written")
        dead = buffer.writer_pid
        os.kill(dead, signal.SIGKILL)  # the writer dies holding the parked table
        wait_until(lambda: not buffer.writing, 30, "the writer gone")
        buffer.log({"loss": 0.25}, 3)  # the trainer notices and starts a new writer
        wait_until(lambda: buffer.flush(wait_s=1) and buffer.writers_started == 2, 60, "a new writer, all written")
        assert [r["kind"] for r in spill._records(path)[0]] == ["table"]  # still kept while the store refuses
        assert buffer.parked == 1  # the new writer says it holds it
    assert buffer.close(wait_s=60) == 0  # the store takes writes again: the new writer writes the old one's table
    assert [a.path for a in client.list_artifacts(run_id, "samples")] == ["samples/step_1.json"]
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2, 3]
    assert not path.exists()
