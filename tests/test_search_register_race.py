"""Two search workers that summarise at the same moment register the study's best run once, not twice."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

WORKER = """
import sys
from verlflow.search.results import register_best
print(register_best(sys.argv[1], sys.argv[2]).version)
"""


@pytest.mark.slow
def test_concurrent_registration_of_the_best_run_leaves_one_version(smoke_store, tmp_path):
    shutil.copy(smoke_store.workdir / "mlflow.db", tmp_path / "mlflow.db")  # a copy: the shared store stays as is
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    best = smoke_store.run_ids[0]
    workers = [client.create_run("0", tags={"verlflow.step": "search"}).info.run_id for _ in range(2)]
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("MLFLOW_RUN_ID", None)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, best, w], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for w in workers]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]

    versions = client.search_model_versions(f"tags.source_run_id = '{best}'")
    assert len(versions) == 1, [v.version for v in versions]
    assert {out.strip().splitlines()[-1] for out, _ in outputs} == {str(versions[0].version)}
    model = client.get_registered_model(versions[0].name)
    # the search's own alias; challenger and champion belong to register / main / promote
    assert str(model.aliases.get("search-best")) == str(versions[0].version) and "challenger" not in model.aliases
    tags = {client.get_run(w).data.tags["search.registered"] for w in workers}
    assert any(t.startswith(f"version {versions[0].version}") for t in tags)
