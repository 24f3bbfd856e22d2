"""`mlflow run . -e promote` → `verlflow promote` (see verlflow.steps.STEPS)."""
import sys

from verlflow.cli import main

main(["promote", *sys.argv[1:]])
