"""verl's resolved-config dump reaches the log whole and the console as one line.

verl's trainer ``pprint``s its whole config before it trains (929 of 1,055 console lines on a CPU launch of the
tiny recipe): the launch's console filter replaces a dump that parses whole with one line naming the log; every
other line, another Ray worker's line in the middle of the dump included, is printed as it came.
"""

from __future__ import annotations

import pprint

from verlflow.backends.verl.console import ConsoleFilter

CONFIG = {"actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}, "strategy": "fsdp2"},
                                "model": {"path": "/data/weights/Qwen3-4B",
                                          "custom_chat_template": "{% for m in messages %}{{ m['content'] }}}}"}},
          "algorithm": {"adv_estimator": "grpo"}, "data": {"train_files": ["/data/gsm8k/train.parquet"] * 20}}


def _lines(prefix: str) -> list[str]:
    return [f"{prefix}{line}\n" for line in pprint.pformat(CONFIG, width=60).splitlines()]


def _console(lines: list[str]) -> list[str]:
    console = ConsoleFilter("/runs/r1/verl.log")
    shown = [out for line in lines for out in console(line)]
    return shown + console.flush()


def test_a_dump_in_a_ray_worker_is_one_line_and_other_lines_pass():
    dump = _lines("(TaskRunner pid=41) ")
    assert len(dump) > 10
    other = "(WorkerDict pid=57) loading weights\n"
    lines = ["before\n", *dump[:3], other, *dump[3:], "(TaskRunner pid=41) step:1 - timing_s/step:2.0\n"]
    shown = _console(lines)
    summary = f"(TaskRunner pid=41) verlflow: verl's resolved config ({len(dump)} lines) is in /runs/r1/verl.log"
    assert shown[0] == "before\n" and shown[1] == other
    assert shown[2].startswith(summary) and shown[3:] == ["(TaskRunner pid=41) step:1 - timing_s/step:2.0\n"]


def test_a_dump_that_never_ends_is_printed_as_it_came():
    cut = _lines("")[:-2]  # the process died in the middle of it
    assert _console(["x\n", *cut]) == ["x\n", *cut]


def test_a_line_that_only_looks_like_a_dump_start_is_not_lost():
    lines = ["{'actor_rollout_ref': is what verl calls it\n", "next\n"]
    assert _console(lines) == lines
