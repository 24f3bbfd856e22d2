"""`mlflow run . -e preprocess` → `verlflow preprocess` (see verlflow.steps.STEPS)."""
import sys

from verlflow.cli import main

main(["preprocess", *sys.argv[1:]])
