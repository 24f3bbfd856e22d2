"""`mlflow run . -e compare` → `verlflow compare` (see verlflow.cli.STEPS)."""
import sys

from verlflow.cli import main

main(["compare", *sys.argv[1:]])
