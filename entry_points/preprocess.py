"""`mlflow run . -e preprocess` → `verlflow preprocess` (see verlflow.cli.STEPS)."""
import sys

from verlflow.cli import main

main(["preprocess", *sys.argv[1:]])
