"""Where the test suite's time goes: wall and CPU seconds by test file, by fixture set-up and by subprocess launched.

    python bench/test_time.py [--record DIR] [--top N] [-- PYTEST ARGS]   # runs pytest, then prints the tables
    python bench/test_time.py --record DIR --report-only                  # prints the tables of an earlier record

Runs ``python -m pytest --time-record DIR PYTEST ARGS`` (default: the README's ``-n 2 --dist loadfile``) and adds
up what tests/time_record.py wrote. Figures only, for a closing note or a before/after table: no test asserts a
duration. On a shared 2-core machine the figures move with the load, so the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def read_events(folder: Path) -> list[dict]:
    """Every event every worker wrote into ``folder``."""
    events = []
    for path in sorted(folder.glob("*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return events


def _table(title: str, rows: list[tuple], header: tuple) -> str:
    lines = [f"\n## {title}", " | ".join(header), " | ".join("---" for _ in header)]
    lines += [" | ".join(str(cell) for cell in row) for row in rows]
    return "\n".join(lines)


def by_file(events: list[dict], top: int) -> str:
    """Each test file's tests (set-ups included), slowest first: wall, CPU, how many, how many slow."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0, 0.0])
    for e in events:
        if e["kind"] == "test":
            row = totals[e["file"]]
            row[0] += e["wall"]
            row[1] += e["cpu"]
            row[2] += 1
            row[3] += int(e["slow"])
            if not e["slow"]:
                row[4] += e["wall"]
    ordered = sorted(totals.items(), key=lambda kv: -kv[1][0])
    rows = [(f, f"{w:.1f}", f"{c:.1f}", n, s, f"{fast:.1f}") for f, (w, c, n, s, fast) in ordered[:top]]
    return _table(f"by file (top {top} of {len(totals)})", rows,
                  ("file", "wall s", "CPU s", "tests", "slow", "wall s of not-slow tests"))


def by_fixture(events: list[dict], top: int) -> str:
    """Each fixture's set-ups, most wall time first: how often it was set up and where it was first asked for."""
    totals: dict[tuple, list] = defaultdict(lambda: [0.0, 0.0, 0, ""])
    for e in events:
        if e["kind"] == "fixture":
            row = totals[(e["fixture"], e["scope"])]
            row[0] += e["wall"]
            row[1] += e["cpu"]
            row[2] += 1
            row[3] = row[3] or e["file"]
    ordered = sorted(totals.items(), key=lambda kv: -kv[1][0])
    rows = [(name, scope, f"{w:.1f}", f"{c:.1f}", n, first) for (name, scope), (w, c, n, first) in ordered[:top]]
    return _table(f"by fixture set-up (top {top} of {len(totals)})", rows,
                  ("fixture", "scope", "wall s", "CPU s", "set-ups", "first for"))


def _command_kind(args: str) -> str:
    """A launch's command with what differs between launches of the same kind (ports, run ids) left out."""
    words = " ".join(args.split())
    return re.sub(r"\b[0-9a-f]{32}\b|\b\d{4,5}\b|\bm-[0-9a-f]{32}\b", "…", words)[:100]


def by_subprocess(events: list[dict], top: int) -> str:
    """The subprocesses tests launched, grouped by command, most CPU first."""
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0.0, 0, set()])
    for e in events:
        if e["kind"] == "subprocess":
            row = totals[_command_kind(e["args"])]
            row[0] += e["wall"]
            row[1] += e["cpu"]
            row[2] += 1
            row[3].add(e["file"])
    ordered = sorted(totals.items(), key=lambda kv: -kv[1][1])
    rows = [(args, f"{w:.1f}", f"{c:.1f}", n, len(files)) for args, (w, c, n, files) in ordered[:top]]
    return _table(f"by subprocess (top {top} of {len(totals)} commands)", rows,
                  ("command", "wall s", "CPU s", "launches", "files"))


def summary(events: list[dict]) -> str:
    """The whole: tests, slow and not, collection, subprocess CPU."""
    tests = [e for e in events if e["kind"] == "test"]
    fast = [e for e in tests if not e["slow"]]
    collection = [e for e in events if e["kind"] == "collection"]
    launched = [e for e in events if e["kind"] == "subprocess"]
    return "\n".join([
        f"tests: {len(tests)} ({len(tests) - len(fast)} slow); summed over workers: "
        f"wall {sum(e['wall'] for e in tests):.0f} s, CPU {sum(e['cpu'] for e in tests):.0f} s",
        f"not-slow tests: wall {sum(e['wall'] for e in fast):.0f} s, CPU {sum(e['cpu'] for e in fast):.0f} s",
        "collection per worker: " + ", ".join(f"{e['wall']:.0f} s wall / {e['cpu']:.0f} s CPU" for e in collection),
        f"subprocesses: {len(launched)} launches, {sum(e['cpu'] for e in launched):.0f} CPU s",
    ])


def main() -> int:
    """Run the suite with the time record (or read an earlier record) and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, default=None, help="folder of the record (default: a new temp folder)")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    parser.add_argument("--report-only", action="store_true", help="print an earlier record, run nothing")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: -n 2 --dist loadfile)")
    args = parser.parse_args()
    folder = args.record or Path(tempfile.mkdtemp(prefix="test-time-"))
    if not args.report_only:
        pytest_args = args.pytest_args or ["-n", "2", "--dist", "loadfile"]
        load_before = os.getloadavg()
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", f"--time-record={folder}", *pytest_args], cwd=REPO)
        print(f"\npytest {' '.join(pytest_args)}: exit {done.returncode}, {time.monotonic() - started:.0f} s wall; "
              f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    events = read_events(folder)
    print(f"record: {folder}")
    print(summary(events))
    print(by_file(events, args.top))
    print(by_fixture(events, args.top))
    print(by_subprocess(events, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
