"""A resume's lease: of several takers of one run at once exactly one wins, and a dead holder's lease is taken over.

Real processes race on a real SQLite store (the store's param key is the compare-and-swap); no timing is
assumed: every taker starts after a shared barrier file appears.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import fresh_store, wait_until
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.process import lease

ROOT = Path(__file__).resolve().parents[1]
TAKER = textwrap.dedent(
    """
    import pathlib, signal, sys, time
    from verlflow.errors import VerlflowError
    from verlflow.process import lease
    go = pathlib.Path(sys.argv[2])
    while not go.exists():
        time.sleep(0.01)
    try:
        lease.take_lease(sys.argv[1])
    except VerlflowError as exc:
        print("refused", exc)
        sys.exit(2)
    print("took", flush=True)
    signal.pause()  # hold the lease until the test kills this holder
    """
)


@pytest.mark.slow
def test_of_four_takers_at_once_exactly_one_wins(tmp_path):
    uri = fresh_store(tmp_path)
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("lease")).info.run_id
    go = tmp_path / "go"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT / "src")}
    takers = [subprocess.Popen([sys.executable, "-c", TAKER, run_id, str(go)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
    go.touch()
    wait_until(lambda: sum(t.poll() is not None for t in takers) >= 3, 300, "three takers to be refused",
               watch=[])
    outcomes = [t.poll() for t in takers]
    assert sorted(code for code in outcomes if code is not None) == [2, 2, 2], [t.stderr.read() for t in takers]
    winner = next(t for t in takers if t.poll() is None)
    for taker in takers:
        if taker is not winner:
            assert "is being resumed by process" in taker.stdout.read()
    held = json.loads(client.get_run(run_id).data.params["verlflow.lease.1"])
    assert held["pid"] == winner.pid
    winner.kill()
    winner.wait()
    # The holder is dead: the next resume takes the run over with the next lease.
    lease.take_lease(run_id, client=client)
    params = client.get_run(run_id).data.params
    assert json.loads(params["verlflow.lease.2"])["pid"] == os.getpid()
    try:
        lease.take_lease(run_id, client=client)  # this very process holds it now and is alive
    except VerlflowError as exc:
        assert "one attempt at a time" in str(exc)
    else:
        raise AssertionError("a live holder's lease was taken again")
