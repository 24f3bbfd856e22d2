"""verlflow's command line, suffering a real fault at a safe point: ``python tests/fault_cli.py <fault> <step> …``.

The fault (``tests/faults.py``: ``bad_alloc``, ``abort``, ``segv``, ``kill``, ``memory``, each optionally ``@run``
or ``@run:N``) is handed to :func:`verlflow.stopping.on_safe_point`, then the step runs as ``verlflow <step> …`` does,
in this process (its watcher included): the product itself reads no fault variable.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # not on import: the step's spawned helpers re-import the main module
    from faults import inject

    from verlflow import cli, stopping

    spec = sys.argv.pop(1)
    stopping.on_safe_point(lambda: inject(spec))
    cli.main()
