"""`mlflow run . -e compare` → `verlflow compare` (see verlflow.steps.STEPS)."""
import sys

from verlflow.project_entry import main

if __name__ == "__main__":  # run as a script only: a spawned process re-imports this module
    main(["compare", *sys.argv[1:]])
