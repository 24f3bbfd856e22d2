"""`mlflow run . -e search` → `verlflow search` (see verlflow.steps.STEPS)."""
import sys

from verlflow.cli import main

main(["search", *sys.argv[1:]])
