"""`mlflow run . -e compare` → `verlflow compare` (see verlflow.steps.STEPS)."""
import sys

from verlflow.cli import main

main(["compare", *sys.argv[1:]])
