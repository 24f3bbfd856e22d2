"""`mlflow run . -e register` → `verlflow register` (see verlflow.steps.STEPS)."""
import sys

from verlflow.cli import main

main(["register", *sys.argv[1:]])
