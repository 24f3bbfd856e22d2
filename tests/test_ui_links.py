"""Every link a step prints opens its page in the Model-training view: main, train, search, compare, register,
evaluate and promote on a real `mlflow server`.

The session's tiny chain (tests/tiny_chain.py: main, a standalone train, a 2-trial search, a compare of two train
runs, a register, an evaluate of its version and a promote, in process on one real server) kept what each step
printed; each URL is then fetched (the UI answers it on the served port) and the run, experiment or model version
its route names is read back from the same server.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from verlflow.tracking import ui_links

STEPS = ("main", "train", "search", "compare", "register", "evaluate", "promote")
URL = re.compile(r"http://127\.0\.0\.1:\d+/#\S+")


@pytest.fixture
def printed(tiny_chain):
    """(server, {step: what it printed}) after each step of the session's tiny chain ran once against the server."""
    return tiny_chain.server, tiny_chain.printed


def _check_route(client: MlflowClient, route: str) -> str:
    """Read back what the UI route names; returns the kind of page."""
    path, _, query = route.partition("?")
    params = urllib.parse.parse_qs(query)
    parts = path.strip("/").split("/")
    # A fresh browser opens the GenAI view on any page without it.
    assert params.get("workflowType") == ["machine_learning"], route
    if parts[0] == "experiments" and len(parts) == 3:
        assert client.get_experiment(parts[1]).lifecycle_stage == "active"
        return "runs table"
    if parts[0] == "experiments" and len(parts) == 4:
        assert client.get_run(parts[3]).info.experiment_id == parts[1], route
        return "run"
    if parts == ["compare-runs"]:
        runs, experiments = json.loads(params["runs"][0]), json.loads(params["experiments"][0])
        assert len(runs) == 2 and {client.get_run(r).info.experiment_id for r in runs} <= set(experiments)
        return "compare runs"
    if parts[0] == "models" and parts[2] == "versions":
        assert client.get_model_version(urllib.parse.unquote(parts[1]), parts[3]).status == "READY"
        return "model version"
    raise AssertionError(f"a printed link to no known page: {route}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_printed_link_opens_a_page_that_names_what_exists(printed):
    server, out = printed
    client = MlflowClient(server.url)
    kinds: dict[str, set[str]] = {}
    for step in STEPS:
        urls = URL.findall(out[step])
        assert urls, f"{step} printed no link:\n{out[step][-2000:]}"
        for url in urls:
            base, _, route = url.partition("/#")
            assert base == server.url
            with urllib.request.urlopen(base + "/", timeout=30) as page:  # the fragment is the UI's to route
                assert page.status == 200 and b"<div id=\"root\"" in page.read()
            kinds.setdefault(step, set()).add(_check_route(client, route))
    assert kinds["main"] == {"runs table", "run", "model version"}
    assert {"run", "runs table"} <= kinds["train"]
    assert {"runs table", "run", "model version"} <= kinds["search"]
    assert {"run", "compare runs"} <= kinds["compare"]
    assert kinds["register"] == {"model version", "run"}
    assert kinds["evaluate"] == {"run", "runs table", "model version"}
    assert kinds["promote"] == {"run", "model version"}
    # On a server, no step asks the user to start a UI of their own.
    assert not any("mlflow ui" in text for text in out.values())


def test_a_file_store_gets_the_command_that_serves_the_links_first(monkeypatch):
    monkeypatch.setenv(ui_links.UI_PORT_ENV, "5123")
    lines = ui_links.link_lines("main", [("runs", ui_links.experiment_route("3"))], "sqlite:///mlflow.db")
    assert lines[0] == "main: open in the MLflow UI after starting it with: mlflow ui --backend-store-uri " \
                       "sqlite:///mlflow.db --port 5123"
    assert lines[1] == "main: runs: http://127.0.0.1:5123/#/experiments/3/runs?workflowType=machine_learning"
    secret = ui_links.link_lines("x", [("run", ui_links.run_route("1", "r"))], "http://u:pw@host:5000/")
    assert secret == ["x: run: http://***@host:5000/#/experiments/1/runs/r?workflowType=machine_learning"]


@pytest.mark.slow
def test_the_printed_ui_command_serves_the_links_when_5000_is_taken(tmp_path, monkeypatch):
    """Something already on 5000 (another UI): the command names a free port and the links use it; the UI that
    command starts answers them."""
    import socket
    import subprocess
    import sys

    from conftest import stop_process_group, wait_until

    monkeypatch.delenv(ui_links.UI_PORT_ENV, raising=False)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", ui_links.DEFAULT_UI_PORT))
        except OSError:
            pass  # already taken by someone else: the same case
        lines = ui_links.link_lines("train", [("this run", ui_links.run_route("0", "r"))], store)
    command = lines[0].split("starting it with: ", 1)[1]
    port = int(command.rsplit("--port ", 1)[1])
    assert port != ui_links.DEFAULT_UI_PORT
    assert lines[1] == f"train: this run: http://127.0.0.1:{port}/#/experiments/0/runs/r?workflowType=machine_learning"
    argv = [sys.executable, "-m", "mlflow", *command.split()[1:]]
    ui = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def answers() -> bool:
            try:
                with urllib.request.urlopen(lines[1].split(": ", 2)[2].split("#")[0], timeout=5) as page:
                    return page.status == 200
            except OSError:
                return False

        wait_until(answers, 180, "the printed mlflow ui command to serve its links", poll_s=0.5, watch=[ui])
    finally:
        stop_process_group(ui)


def _artifact_files(client: MlflowClient, run_id: str, path: str = "") -> list[str]:
    files = []
    for item in client.list_artifacts(run_id, path):
        files += _artifact_files(client, run_id, item.path) if item.is_dir else [item.path]
    return files


@pytest.mark.slow
def test_every_html_artifact_renders_offline(printed, tmp_path):
    """Search plots and the compare report: no script from the web, images inside the page."""
    server, _ = printed
    client = MlflowClient(server.url)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=500)
    pages = [(run.info.run_id, path) for run in runs for path in _artifact_files(client, run.info.run_id)
             if path.endswith((".html", ".htm"))]
    assert {path for _, path in pages} >= {"search/plots/interactive.html", "compare/report.html"}
    for run_id, path in pages:
        text = Path(client.download_artifacts(run_id, path, str(tmp_path))).read_text()
        assert not re.search(r"<script[^>]*\bsrc=", text), (path, "loads a script from elsewhere")
        assert not re.search(r"<img[^>]*\bsrc=\"(?!data:)", text), (path, "an image outside the page")
        if path == "compare/report.html":
            assert "<table>" in text and 'src="data:image/png;base64,' in text and "![" not in text


def test_the_search_run_shows_its_best_models_full_evaluation(printed):
    server, _ = printed
    client = MlflowClient(server.url)
    (search,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                   "tags.`verlflow.step` = 'search'")
    (evaluation,) = client.search_runs([search.info.experiment_id],
                                       f"tags.`mlflow.parentRunId` = '{search.info.run_id}' "
                                       "and tags.`verlflow.step` = 'evaluate'")
    assert search.data.metrics["eval/gsm8k/accuracy"] == evaluation.data.metrics["eval/gsm8k/accuracy"]
    assert search.data.metrics["eval/gsm8k/num_samples"] == 128  # the whole test split, not the trials' 64
    assert "test problems; registered as tiny-qwen3-gsm8k-tiny version" in search.data.tags["mlflow.note.content"]


def test_the_local_trainers_completions_are_traces_of_its_run(printed, tiny_chain):
    """The default trainer fills the run's Traces tab, as verl >= 0.9 does: prompt in, response and reward out."""
    server, _ = printed
    client = MlflowClient(server.url)
    train = client.get_run(_first_main(client, tiny_chain).data.tags["verlflow.run_id.train"])
    traces = client.search_traces(locations=[train.info.experiment_id], run_id=train.info.run_id)
    # verlflow.rollout_traces (2) per step that logged its samples table.
    logged = sorted(a.path.removeprefix("samples/step_").removesuffix(".json")
                    for a in client.list_artifacts(train.info.run_id, "samples"))
    assert logged and sorted(t.info.tags["step"] for t in traces) == sorted(logged * 2)
    span = traces[0].data.spans[0]
    assert set(span.inputs) == {"prompt"} and set(span.outputs) == {"response", "reward"}


def _first_main(client: MlflowClient, tiny_chain):
    """The chain's first ``main`` run (the one that trained and registered; the second reused it), read back."""
    mains = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.`verlflow.step` = 'main'")
    (first,) = [run for run in mains if run.info.run_id == tiny_chain.results["main"].parent_run_id]
    return first


def test_main_and_its_model_version_describe_their_result_in_one_line(printed, tiny_chain):
    server, _ = printed
    client = MlflowClient(server.url)
    main = _first_main(client, tiny_chain)
    note = main.data.tags["mlflow.note.content"]
    assert note.startswith("tiny-qwen3-gsm8k-tiny v1: accuracy ") and "champion = version 1 (" in note
    assert "device cpu, recipe tiny" in note
    described = client.get_model_version("tiny-qwen3-gsm8k-tiny", "1").description
    assert described.startswith("accuracy ") and "on 128 test problems" in described
    assert f"from train run {main.data.tags['verlflow.run_id.train']}" in described


def test_register_and_compare_runs_are_filed_with_the_runs_they_act_on(printed):
    """Not in Default, where they took the chart view's slots without the train runs they relate to."""
    server, _ = printed
    client = MlflowClient(server.url)
    recipe = client.get_experiment_by_name("verlflow/tiny").experiment_id
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=500)
    filed = {(r.data.tags.get("verlflow.step"), r.info.experiment_id) for r in runs}
    assert {step for step, _ in filed} >= {"register", "compare", "train", "main"}
    assert {experiment for _, experiment in filed} == {recipe}


def test_standalone_steps_and_main_are_named_apart_at_the_default_column_width(printed):
    """`evaluate · @challenger · 16`, `register · <model> v<N>`, `promote · <model> @champion`, `main · …`."""
    server, _ = printed
    client = MlflowClient(server.url)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=500)
    standalone = {r.data.tags.get("verlflow.step"): r.info.run_name for r in runs
                  if "mlflow.parentRunId" not in r.data.tags}
    model = "tiny-qwen3-gsm8k-tiny"
    assert standalone["evaluate"] == "evaluate · @challenger · 16"
    assert re.fullmatch(rf"register · {model} v\d+", standalone["register"]), standalone
    assert standalone["promote"] == f"promote · {model} @champion"
    assert re.fullmatch(rf"main · {model} · \d\d-\d\d \d\d:\d\d", standalone["main"]), standalone
    trials = [r.info.run_name for r in runs if r.data.tags.get("optuna.trial_number")]
    assert sorted(name.split(" · ")[0] for name in trials) == ["t0", "t1"] and all("n=" in n for n in trials)
