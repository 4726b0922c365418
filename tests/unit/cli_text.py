"""What a CLI run printed, as one line: rich draws usage errors in a box whose borders and
wrapping would split the words a test looks for."""
from __future__ import annotations

import re

_BOX = re.compile(r"[\u2500-\u257f]")


def flat(s: str) -> str:
    """``s`` without box-drawing characters, its whitespace runs as single spaces."""
    return " ".join(_BOX.sub(" ", s).split())


def text(r) -> str:
    """The output of a Typer/click ``CliRunner`` result as one line (see :func:`flat`)."""
    return flat(r.output)
