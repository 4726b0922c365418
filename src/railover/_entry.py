"""Console entry point ``railover`` (pyproject's ``[project.scripts]``).

Kept free of imports beyond the standard library's ``sys``, so that a Ctrl-C while Python
loads the command line (Typer, rich, click: a few hundred ms on a busy host) ends as every
other interrupt of railover does, exit status 130 and one line, instead of a traceback from
inside the import machinery.
"""
from __future__ import annotations

import sys


def main() -> None:
    """Loads :mod:`railover.cli` and runs its ``main``; an interrupt while loading exits 130."""
    try:
        from railover import cli
    except KeyboardInterrupt:
        sys.stderr.write("\nrailover: interrupted while starting (Ctrl-C)\n")
        raise SystemExit(130) from None
    cli.main()
