"""`mlflow run . -e doctor` → `verlflow doctor` (see verlflow.cli.STEPS)."""
import sys

from verlflow.cli import main

main(["doctor", *sys.argv[1:]])
