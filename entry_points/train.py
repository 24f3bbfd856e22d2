"""`mlflow run . -e train` → `verlflow train` (see verlflow.cli.STEPS)."""
import sys

from verlflow.cli import main

main(["train", *sys.argv[1:]])
