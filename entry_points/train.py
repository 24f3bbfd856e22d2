"""`mlflow run . -e train` → `verlflow train` (see verlflow.steps.STEPS)."""
import sys

from verlflow.cli import main

main(["train", *sys.argv[1:]])
