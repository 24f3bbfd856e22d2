"""The pins of a second constraints file that the first does not have, one ``name==version`` a line.

    python scripts/pins_that_differ.py constraints.txt constraints-mlflow-lowest.txt

scripts/test_lowest_mlflow.sh installs these (and only these) into the lowest-MLflow venv, which reads the rest
from the README's venv.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)")


def pins(path: Path) -> dict[str, str]:
    """Each ``name==version`` line of a pip constraints file, by its normalised name."""
    found = {}
    for line in path.read_text().splitlines():
        if match := PIN.match(line.strip()):
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return found


def differing(base: Path, other: Path) -> list[str]:
    """``other``'s pins that ``base`` lacks or pins at another version."""
    have = pins(base)
    return [f"{name}=={version}" for name, version in sorted(pins(other).items()) if have.get(name) != version]


if __name__ == "__main__":
    print("\n".join(differing(Path(sys.argv[1]), Path(sys.argv[2]))))
