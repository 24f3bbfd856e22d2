"""A run given secrets everywhere a user can put one leaves none of them in any byte, while verl still gets them.

Planted: under override keys (``+trainer.wandb_password``, an AWS secret key with ``/`` under
``+trainer.aws_secret_access_key``, and keys named by their last word: ``dbPassword``, ``wandb_pass``,
``ssh_passphrase``, ``hmac_key``, ``session_cookie``, ``pw``), in override values (``postgresql://bob:<pw>@…``, a
JWT under a plain key, a URL with ``?session=``), in the profile's environment (``WANDB_API_KEY``, ``DB_PASS2``, a
dashboard URL with ``?token=``), and in this process's environment (an allowlisted ``VLLM_`` URL with
``?api_key=``, ``HF_TOKEN``). The launch is verl's command line run by the stand-in
(tests/standins/verl_main_standin.py), which logs its params through verl's real ``Tracking`` and prints its
resolved config as verl's main_ppo does. Scanned: the SQLite store, every artifact and output file, the console,
and the launched process's command line as ``ps`` shows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

STANDIN = Path(__file__).parent / "standins" / "verl_main_standin.py"
SECRETS = {
    "override key": "Summer2024!xyz",
    "aws key with /": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "override value url": "Pg5ecretPw",
    "profile env": "WandbSecret123456",
    "profile env url": "RayTok3nValue",
    "process env url": "VllmKey9876",
    "process env token": "hf_" + "Zq3xK9pL2mN8vB4cR7tY1wE6uI0oPaSd",
    # Named by a key's last word, or by the value's shape (round 3).
    "camelCase key": "CamelPw0rdValue",
    "pass key": "ShortPass77",
    "passphrase key": "open-sesame-42",
    "hmac key": "HmacK3yMaterial",
    "cookie key": "C00kieJarValue",
    "pw key": "PwOnlyValue9",
    "jwt value": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2aWN0aW0ifQ.c2lnbmF0dXJlLXZhbHVl",
    "profile env pass2": "ProfilePass2Value",
    "session query": "S3ssionTok3n",
}


@pytest.fixture(scope="module")
def tiny_model(tiny_workdir) -> Path:
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    return Path(resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache"))


def _overrides(tmp_path: Path) -> str:
    return (f"verlflow.launch_module={STANDIN} verlflow.skip_preflight=true trainer.n_gpus_per_node=1 "
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1 "
            f"verlflow.output_dir={tmp_path / 'outputs'} verlflow.system_metrics_interval=1 "
            f"+trainer.wandb_password={SECRETS['override key']} "
            f"+trainer.aws_secret_access_key={SECRETS['aws key with /']} "
            f"+trainer.db_url=postgresql://bob:{SECRETS['override value url']}@db.example/x "
            f"profile.env.WANDB_API_KEY={SECRETS['profile env']} "
            f"profile.env.RAY_DASHBOARD_URL=http://head:8265/?token={SECRETS['profile env url']} "
            f"+trainer.dbPassword={SECRETS['camelCase key']} +trainer.wandb_pass={SECRETS['pass key']} "
            f"+trainer.ssh_passphrase={SECRETS['passphrase key']} +trainer.hmac_key={SECRETS['hmac key']} "
            f"+trainer.session_cookie={SECRETS['cookie key']} +trainer.pw={SECRETS['pw key']} "
            f"+trainer.note={SECRETS['jwt value']} profile.env.DB_PASS2={SECRETS['profile env pass2']} "
            f"+trainer.board=https://board.example/x?session={SECRETS['session query']}")


def _found(data: bytes) -> list[str]:
    return [what for what, secret in SECRETS.items() if secret.encode() in data]


@pytest.mark.slow
def test_planted_secrets_reach_verl_and_nothing_else(tracking_uri, tmp_path, tiny_model):
    received = tmp_path.parent / f"{tmp_path.name}-received.json"  # outside everything the run leaves
    env = {**os.environ, "VERLFLOW_STANDIN_RECEIVED": str(received), "VERLFLOW_STANDIN_MODE": "fail",
           "VLLM_API_URL": f"https://vllm.example/v1?api_key={SECRETS['process env url']}",
           "HF_TOKEN": SECRETS["process env token"]}
    argv = [sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "gpu", "--backend", "verl",
            "--model", str(tiny_model), "--data_dir", str(tmp_path / "data"), "--overrides", _overrides(tmp_path)]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, timeout=600)
    console = done.stdout + done.stderr
    assert b"stand-in failure after step 2" in console, console[-3000:].decode(errors="replace")

    # verl got every secret, through its environment, and none on its command line.
    got = json.loads(received.read_text())
    trainer = got["config"]["trainer"]
    assert trainer["wandb_password"] == SECRETS["override key"]
    assert trainer["aws_secret_access_key"] == SECRETS["aws key with /"]
    assert trainer["db_url"] == f"postgresql://bob:{SECRETS['override value url']}@db.example/x"
    assert (trainer["dbPassword"], trainer["note"]) == (SECRETS["camelCase key"], SECRETS["jwt value"])
    assert got["env"]["DB_PASS2"] == SECRETS["profile env pass2"]
    assert got["env"]["WANDB_API_KEY"] == SECRETS["profile env"]
    assert got["env"]["RAY_DASHBOARD_URL"].endswith(SECRETS["profile env url"])
    assert got["env"]["HF_TOKEN"] == SECRETS["process env token"]
    assert _found(got["cmdline"].encode()) == []

    # Nothing the run left holds one: console, store, artifacts, outputs, logs, spill files.
    assert _found(console) == [], console.decode(errors="replace")[-3000:]
    leaks = {str(p.relative_to(tmp_path)): _found(p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()}
    assert {path: what for path, what in leaks.items() if what} == {}
    run = MlflowClient().search_runs([e.experiment_id for e in MlflowClient().search_experiments()])[0]
    assert run.info.status == "FAILED"
    # The params verl logged are there, masked, so a reader sees which keys were set.
    assert run.data.params["trainer/wandb_password"] == "***"
    assert run.data.params["trainer/db_url"] == "postgresql://***@db.example/x"
    assert run.data.params["actor_rollout_ref/actor/optim/lr"]  # verl's logging was not switched off
