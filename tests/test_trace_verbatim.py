"""A rollout trace shows the response as the model wrote it (issue 58, item 4).

MLflow's trace viewer renders a span's string fields as Markdown (``ModelTraceExplorerTextFieldRenderer``), so the
answer format GRPO teaches, ``#### 40``, read as a bold heading "40". The response is stored in a fenced code block;
these tests render it with a CommonMark renderer, as the viewer does, and read back the text a user sees.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from mlflow.tracking import MlflowClient

from verlflow.tracking import tracking
from verlflow.tracking.run_logger import DirectLogger


def shown(markdown: str) -> str:
    """What a CommonMark renderer shows of ``markdown`` when it is one code block: the block's text; else the HTML."""
    rendered = MarkdownIt("commonmark").render(markdown)
    block = re.fullmatch(r'<pre><code(?: class="[^"]*")?>(.*)</code></pre>\n', rendered, re.S)
    return html.unescape(block.group(1)).removesuffix("\n") if block else rendered


def _responses(client: MlflowClient, run_id: str) -> dict[tuple[str, str], str]:
    """The run's traced responses by (step, sample_index)."""
    experiment_id = client.get_run(run_id).info.experiment_id
    traces = client.search_traces(locations=[experiment_id], run_id=run_id)
    return {(t.info.tags["step"], t.info.tags["sample_index"]): t.data.spans[0].outputs["response"] for t in traces}


@pytest.mark.parametrize("response", [
    "6 times 7 is 42.\n#### 42",
    "# not a title *nor emphasis* <b>nor HTML</b>\n```\na fence the model wrote\n```\n#### 7",
])
def test_a_traced_response_reads_as_written_in_a_markdown_viewer(tracking_uri, response):
    with tracking.tracked_run() as run:
        DirectLogger(run.info.run_id).log_traces(3, [{"prompt": "6 x 7?", "response": response, "reward": 1.0}])
    traced = _responses(MlflowClient(), run.info.run_id)[("3", "0")]
    assert shown(traced) == response, MarkdownIt("commonmark").render(traced)


@pytest.mark.slow
def test_a_trained_runs_traces_read_as_its_samples_table(smoke_store, tmp_path):
    client = MlflowClient(smoke_store.tracking_uri)
    run_id = smoke_store.run_ids[0]
    responses = _responses(client, run_id)
    assert responses, "the tiny recipe traces 2 samples per logged step"
    for (step, index), traced in responses.items():
        table = json.loads(Path(client.download_artifacts(run_id, f"samples/step_{step}.json", str(tmp_path)))
                           .read_text())
        written = table["data"][int(index)][table["columns"].index("response")]
        # CommonMark shows a NUL (the tiny model writes some) as U+FFFD, in a code block too: its one change.
        assert shown(traced) == written.replace("\x00", "\ufffd"), (step, index, traced)
