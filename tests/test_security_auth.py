"""A tracking server that refuses the user says so: a real ``mlflow server --app-name basic-auth`` on 127.0.0.1.

A wrong password (HTTP 401) and a user with READ permission only (HTTP 403, creating a run) each get one line
naming the server, the user, the operation refused and the permission it needs; exit 2, no traceback, the
password nowhere in the output, no run left behind. (Before: "the tracking server failed a request to endpoint
after its retries ( 200. Response body: …): check the server's health".)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from conftest import MlflowServer, cli_in_process, stop_process_group, wait_for_http

ADMIN, ADMIN_PASSWORD = "admin", "Adm1n-Sturdy-Pw-42"
READER, READER_PASSWORD = "reader", "Reader-Sturdy-Pw-42"


class AuthServer(MlflowServer):
    """:class:`MlflowServer` with MLflow's basic-auth app and a fresh auth database of its own."""

    def start(self) -> None:
        pytest.importorskip("flask_wtf", reason="mlflow's basic-auth app needs Flask-WTF (the dev extra has it)")
        ini = self.root / "basic_auth.ini"
        ini.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{self.root / 'auth.db'}\n"
                       f"admin_username = {ADMIN}\nadmin_password = {ADMIN_PASSWORD}\n"
                       "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
        cmd = [str(Path(sys.executable).with_name("mlflow")), "server", "--app-name", "basic-auth", "--host",
               "127.0.0.1", "--port", str(self.port), "--workers", "1", "--backend-store-uri", self.backend_store_uri,
               "--artifacts-destination", str(self.root / "artifacts")]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_AUTH_CONFIG_PATH": str(ini),
               "MLFLOW_FLASK_SERVER_SECRET_KEY": "verlflow-test-csrf-key"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.root, env=env,
                                         start_new_session=True)
        if not wait_for_http(f"{self.url}/health", self.proc, timeout_s=120):
            stop_process_group(self.proc)
            pytest.fail(f"mlflow basic-auth server did not start: {self.log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = AuthServer(tmp_path_factory.mktemp("auth-server"))
    srv.start()
    try:
        created = requests.post(f"{srv.url}/api/2.0/mlflow/users/create", auth=(ADMIN, ADMIN_PASSWORD), timeout=30,
                                json={"username": READER, "password": READER_PASSWORD})
        assert created.ok, created.text  # a new user gets default_permission: READ on every experiment
        yield srv
    finally:
        stop_process_group(srv.proc)


def _preprocess_as(server: AuthServer, tmp_path: Path, user: str, password: str) -> tuple[int, str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": server.url, "MLFLOW_TRACKING_USERNAME": user,
           "MLFLOW_TRACKING_PASSWORD": password}
    env.pop("MLFLOW_RUN_ID", None)
    done = cli_in_process(["preprocess", "--source", "synthetic", "--output_dir", str(tmp_path / "data"),
                           "--limit", "8"],
                          env=env, cwd=tmp_path)
    return done.returncode, done.stdout + done.stderr


def _no_runs(server: AuthServer) -> None:
    found = requests.post(f"{server.url}/api/2.0/mlflow/runs/search", auth=(ADMIN, ADMIN_PASSWORD), timeout=30,
                          json={"experiment_ids": ["0"]})
    assert found.ok and not found.json().get("runs"), found.text


@pytest.mark.slow
def test_a_wrong_password_is_one_line_naming_server_and_user(server, tmp_path):
    rc, out = _preprocess_as(server, tmp_path, ADMIN, "Wrong-Password-77")
    errors = [ln for ln in out.splitlines() if ln.startswith("verlflow preprocess: error:")]
    assert rc == 2 and len(errors) == 1, out[-3000:]
    line = errors[0]
    assert f"tracking server {server.url}" in line and f"user '{ADMIN}'" in line and "HTTP 401" in line
    assert "MLFLOW_TRACKING_PASSWORD" in line and "server's health" not in line
    assert "Wrong-Password-77" not in out and "Traceback" not in out
    assert "could not check for dead RUNNING runs" not in out  # the refusal is said once
    _no_runs(server)


@pytest.mark.slow
def test_a_read_only_user_is_told_which_operation_needs_which_permission(server, tmp_path):
    rc, out = _preprocess_as(server, tmp_path, READER, READER_PASSWORD)
    errors = [ln for ln in out.splitlines() if ln.startswith("verlflow preprocess: error:")]
    assert rc == 2 and len(errors) == 1, out[-3000:]
    line = errors[0]
    assert f"tracking server {server.url}" in line and f"user '{READER}'" in line and "HTTP 403" in line
    assert "create a run" in line and "EDIT on the run's experiment" in line
    assert READER_PASSWORD not in out and "Traceback" not in out
    _no_runs(server)
