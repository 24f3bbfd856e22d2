"""`mlflow run . -e evaluate` → `verlflow evaluate` (see verlflow.steps.STEPS)."""
import sys

from verlflow.cli import main

main(["evaluate", *sys.argv[1:]])
