"""`mlflow run . -e doctor` → `verlflow doctor` (see verlflow.steps.STEPS)."""
import sys

from verlflow.cli import main

main(["doctor", *sys.argv[1:]])
