"""`mlflow run . -e main` → `verlflow main` (see verlflow.steps.STEPS)."""
import sys

from verlflow.cli import main

main(["main", *sys.argv[1:]])
