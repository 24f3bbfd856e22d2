"""A full disk, a missing file and input that cannot train are one line naming what and where, with the fix
(issue 56, items 6 and 7), where they were a traceback, a FAILED run with MLflow's made-up name, or a training at
reward 0.

A disk cannot be filled on cue here: a write past a file-size limit (``RLIMIT_FSIZE``, ``ulimit -f``) fails the way
a full disk does (EFBIG; Python ignores SIGXFSZ, so the write returns the error instead of the process dying), in
this process where no other file the step writes grows past the limit. A cgroup's memory limit is read from recorded
cgroup files (tests/fixtures/cgroup: the hardware boundary).
"""

from __future__ import annotations

import io
import json
import logging
import random
import re
import shutil
import signal
import string
from pathlib import Path

import optuna
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import cli_in_process, every_experiment, file_size_limit
from mlflow.tracking import MlflowClient

from verlflow.data import gsm8k

TRAIN = ["train", "--recipe", "tiny", "--device", "cpu"]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return gsm8k.preprocess("synthetic", tmp_path_factory.mktemp("data"), 8, log_to_mlflow=False).output_dir


def _error_line(done, step: str) -> str:
    """The step's one error line; no traceback anywhere."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith(f"verlflow {step}: error: ")]
    return line.removeprefix(f"verlflow {step}: error: ")


def _runs() -> list:
    client = MlflowClient()
    return client.search_runs(every_experiment(client))


# --- 7: input that cannot train is refused before a run opens ---------------------------------------------------


def test_grpo_with_one_response_per_prompt_is_refused_with_verls_reason(tracking_uri, data_dir):
    # Before: accepted; a group of one has no mean or std, so GRPO trained on no group advantage at all.
    done = cli_in_process([*TRAIN, "--data_dir", str(data_dir), "--overrides", "actor_rollout_ref.rollout.n=1"])
    assert _error_line(done, "train") == (
        "actor_rollout_ref.rollout.n=1: algorithm.adv_estimator=grpo normalises each response's reward by its "
        "prompt's group of n responses, so the group size must be >= 2 (verl: \"> 1 for grpo\"); with one there is "
        "no group advantage: use n >= 2 (the guide uses 5)")
    assert _runs() == []


def test_a_split_whose_every_ground_truth_verl_cannot_match_is_refused_naming_the_file_and_a_row(
        tracking_uri, data_dir, tmp_path):
    # Before: trained, every reward 0, no word. "72 dollars" is text verl's strict GSM8K scorer never extracts.
    bad = tmp_path / "bad"
    bad.mkdir()
    for split in ("train", "test"):
        rows = pq.read_table(data_dir / f"{split}.parquet").to_pylist()
        for row in rows:
            row["reward_model"]["ground_truth"] += " dollars"
        pq.write_table(pa.Table.from_pylist(rows), bad / f"{split}.parquet")
    first = pq.read_table(bad / "train.parquet").to_pylist()[0]["reward_model"]["ground_truth"]
    done = cli_in_process([*TRAIN, "--data_dir", str(bad)])
    assert _error_line(done, "train") == (
        f"data.train_files={bad / 'train.parquet'}: no row's reward_model.ground_truth is a number verl's GSM8K "
        f"scorer can match (row 0: {first!r}), so every reward would be 0: give plain numbers such as '72' (as "
        "`verlflow preprocess` writes them), or a scorer of your own in reward.custom_reward_function.path")
    assert _runs() == []
    from verlflow.data.checks import check_ground_truths

    check_ground_truths(data_dir / "train.parquet")  # preprocess's own numbers pass


def _model_without_tokenizer(tiny_workdir: Path, tmp_path: Path) -> Path:
    """The tiny model's folder copied as a checkpoint copied without its tokenizer: config and weights only."""
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    folder = Path(shutil.copytree(resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache"), tmp_path / "model"))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink()
    assert sorted(path.name for path in folder.iterdir()) == ["config.json", "generation_config.json",
                                                              "model.safetensors"]
    return folder


NO_TOKENIZER = ("model folder '{folder}' has no tokenizer files (tokenizer.json or tokenizer_config.json or "
                "tokenizer.model or vocab.json): copy them from the model it was trained from "
                "(AutoTokenizer.from_pretrained(<base>).save_pretrained(<this folder>))")


def test_evaluate_of_a_model_folder_without_tokenizer_files_names_them(tracking_uri, data_dir, tiny_workdir,
                                                                       tmp_path):
    # Before: a FAILED run and transformers' "ValueError: Cannot use chat template functions because
    # tokenizer.chat_template is not set", which asks for a template when the whole tokenizer is missing.
    folder = _model_without_tokenizer(tiny_workdir, tmp_path)
    done = cli_in_process(["evaluate", "--model_uri", str(folder), "--data_dir", str(data_dir)])
    assert _error_line(done, "evaluate") == NO_TOKENIZER.format(folder=folder)
    assert _runs() == []


def test_train_on_a_model_folder_without_tokenizer_files_names_them_and_the_setting(tracking_uri, data_dir,
                                                                                   tiny_workdir, tmp_path):
    folder = _model_without_tokenizer(tiny_workdir, tmp_path)
    done = cli_in_process([*TRAIN, "--data_dir", str(data_dir), "--model", str(folder)])
    also = ", or name a folder that has them in actor_rollout_ref.model.tokenizer_path"
    assert _error_line(done, "train") == NO_TOKENIZER.format(folder=folder) + also
    assert _runs() == []


# --- 6: a full disk is one line naming the folder and its free space; the run is named for the failure ------------


def _big_source(folder: Path, rows: int = 24, size: int = 100_000) -> Path:
    """A local GSM8K folder whose questions are long random text, so the parquet it becomes is megabytes (random
    letters do not compress away) while the tracking store stays the size it is."""
    chooser = random.Random(0)
    folder.mkdir()
    for split in ("train", "test"):
        with (folder / f"{split}.jsonl").open("w") as lines:
            for index in range(rows):
                question = "".join(chooser.choices(string.ascii_letters + " ", k=size))
                lines.write(json.dumps({"question": question, "answer": f"so #### {index}"}) + "\n")
    return folder


def test_preprocess_into_a_full_disk_is_one_line_and_a_run_named_for_the_failure(tracking_uri, tmp_path):
    # Before: pyarrow's "OSError: [Errno 27] Error writing bytes to file" as a traceback, in a FAILED run that
    # MLflow named (skittish-sow-161).
    source, out = _big_source(tmp_path / "source"), tmp_path / "out"
    limit = (tmp_path / "mlflow.db").stat().st_size + 2 * 2**20  # the store may grow, a split may not fit
    with file_size_limit(limit):
        done = cli_in_process(["preprocess", "--source", str(source), "--output_dir", str(out)])
    line = _error_line(done, "preprocess")
    assert re.fullmatch(
        rf"the train split could not be written \(File too large\) to {re.escape(str(out))} \(\d+ MiB free there, "
        rf"and a file-size limit of {limit / 2**20:.1f} MiB \(ulimit -f\)\): free space \(or raise the file-size "
        r"limit, ulimit -f\) or give an output_dir on a larger disk \(-P output_dir=…\), then preprocess again",
        line), line
    assert list(out.iterdir()) == []  # no half-written split, no temporary file
    (run,) = _runs()
    assert run.info.status == "FAILED"
    assert run.info.run_name.startswith("preprocess · failed: the train split could not be written (File too large)")
    assert run.data.tags["verlflow.error"].endswith(line)


def test_a_checkpoint_safetensors_cannot_write_is_one_line_naming_the_folder_and_its_free_space(tiny_workdir,
                                                                                               tmp_path):
    # Before: safetensors' SafetensorError ("Error while serializing: … File too large"), neither OSError nor
    # RuntimeError, escaped the handling of a full disk as a traceback.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verlflow.backends.local.checkpoint import save_checkpoint
    from verlflow.errors import VerlflowError
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    folder = resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    root = tmp_path / "checkpoints"
    with file_size_limit(64 * 1024), pytest.raises(VerlflowError) as failed:  # below the tiny model's weights
        save_checkpoint(root, 2, model, tokenizer, {"global_step": 2})
    assert re.fullmatch(
        rf"the step-2 checkpoint could not be written to {re.escape(str(root))} \(File too large; \d+ MiB free "
        r"there, and a file-size limit of 0\.1 MiB \(ulimit -f\)\): free space \(or raise the file-size limit, "
        r"ulimit -f\) or point trainer.default_local_dir / verlflow.output_dir at a larger disk; resume with "
        r"--resume once it has room", str(failed.value)), str(failed.value)
    assert list(root.iterdir()) == []  # no half checkpoint for a resume to pick up


def test_a_search_trial_stopped_by_sigterm_is_optunas_line_without_a_traceback():
    # Before: Optuna logged "Trial 0 failed … RunInterrupted('interrupted by SIGTERM')" with the traceback of where
    # the stop was taken, above the step's own "interrupted" line.
    from verlflow.search.study import quiet_stopped_trials
    from verlflow.stopping import RunInterrupted

    def stopped(trial: optuna.Trial) -> float:
        trial.suggest_float("lr", 1e-6, 1e-4)
        raise RunInterrupted(signal.SIGTERM)

    said = io.StringIO()
    handler = logging.StreamHandler(said)
    optuna_logger = logging.getLogger("optuna")
    optuna_logger.addHandler(handler)
    try:
        quiet_stopped_trials()
        with pytest.raises(RunInterrupted):
            optuna.create_study().optimize(stopped, n_trials=1)
    finally:
        optuna_logger.removeHandler(handler)
    text = said.getvalue()
    assert "Trial 0 failed with parameters: {'lr': " in text
    assert "because of the following error: RunInterrupted('interrupted by SIGTERM')." in text
    assert "Traceback" not in text, text


# --- 7d: an OOM kill quotes the cgroup's limit, not the machine's memory --------------------------------------------


@pytest.mark.parametrize("version, limit_file", [
    ("v1", "memory/process_api/c3856dc9da3a871fdaaa0f77ce5cb7f0/verlflow-record/memory.limit_in_bytes"),
    ("v2", "system.slice/run-r5a4b2c.scope/memory.max"),
])
def test_an_oom_kill_in_a_memory_cgroup_quotes_the_cgroups_limit(version, limit_file, monkeypatch):
    # Before: "the machine has 23.5 GiB" for a step the kernel killed at its cgroup's 450 MiB.
    from verlflow import out_of_memory
    from verlflow.fatal_end import Death, death_line

    recorded = FIXTURES / "cgroup" / version
    monkeypatch.setattr(out_of_memory, "PROC_CGROUP", str(recorded / "proc-self-cgroup.txt"))
    monkeypatch.setattr(out_of_memory, "CGROUP_ROOT", str(recorded / "sys-fs-cgroup"))
    line = death_line("train", Death(signal.SIGKILL, "killed by the kernel's OOM killer, SIGKILL", ""),
                      {"data/train_batch_size": "64", "actor_rollout_ref/rollout/n": "8"})
    assert line == ("out of memory in train (killed by the kernel's OOM killer, SIGKILL) with "
                    "data.train_batch_size=64, actor_rollout_ref.rollout.n=8; its cgroup may use 450 MiB "
                    f"({recorded / 'sys-fs-cgroup' / limit_file}): lower one of them, e.g. -P "
                    "overrides=\"data.train_batch_size=32\", or give the process more memory")
