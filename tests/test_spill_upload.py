"""A spill file is uploaded once, whatever happened to it: a damaged line, a torn last record, a second upload.

The file is written by verlflow's own spill writer into a real SQLite store's run, then damaged the way a crash
or a full disk leaves it, and uploaded with the command the step prints (``python -m verlflow.outage.metric_buffer``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from verlflow.outage import spill

ROOT = Path(__file__).resolve().parents[1]


def _upload(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verlflow.outage.metric_buffer", str(path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_a_damaged_spill_file_is_uploaded_once_with_its_final_status(tracking_uri, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    now_ms, now = int(time.time() * 1000), time.time()
    path = tmp_path / "metrics.spill.jsonl"
    spill.append(path, run_id, [("timing_s/step", 1.0 + step, now_ms + step, step) for step in range(1, 5)])
    spill.append(path, run_id, [{"kind": "summaries", "started_at": now - 60, "ended_at": now}])
    spill.append(path, run_id, [{"kind": "status", "status": "KILLED", "end_time": now_ms + 10}])
    lines = path.read_text().splitlines(keepends=True)
    # a garbage line in the middle (a disk error), and the last record torn after its status word (a crash)
    damaged = [*lines[:2], "\x00\x00garbage\n", *lines[2:-1], lines[-1][:lines[-1].index("KILLED") + 7]]
    assert '"status": "KILLED"' in damaged[-1] and not damaged[-1].endswith("}")
    path.write_text("".join(damaged))

    first = _upload(path)
    assert first.returncode == 0, first.stderr
    assert "line 3 is not a spill record" in first.stderr and "Traceback" not in first.stderr, first.stderr
    assert _steps(client, run_id, "timing_s/step") == [1, 2, 3, 4]
    assert client.get_run(run_id).info.status == "KILLED"  # before: points uploaded, status lost, RUNNING
    e2e = client.get_metric_history(run_id, "timing_s/e2e")
    assert len(e2e) == 1 and abs(e2e[0].value - 60) < 1e-3

    again = _upload(path)  # before: a FileNotFoundError traceback
    assert again.returncode == 0 and "already uploaded" in again.stdout, again.stdout + again.stderr

    spill.uploaded_marker(path).replace(path)  # the same file uploaded a second time
    second = _upload(path)
    assert second.returncode == 0, second.stderr
    assert "uploaded 0 metric points" in second.stdout
    assert _steps(client, run_id, "timing_s/step") == [1, 2, 3, 4]  # before: duplicates of every point
    assert len(client.get_metric_history(run_id, "timing_s/e2e")) == 1
