"""Helpers shared by the Typer commands."""
from __future__ import annotations

from typing import List

import typer


def given(ctx: typer.Context, *names: str) -> List[str]:
    """The options among ``names`` (parameter names) that the command line gives, spelled as in
    --help (``"--kinds"``): "was it given", never "does it differ from its default"."""
    opts = {p.name: p.opts[0] for p in ctx.command.params}
    # by name: recent Typer releases carry their own copy of click, whose ParameterSource is not click's
    return [opts[n] for n in names if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"]


def refuse_given(ctx: typer.Context, names: List[str], why: str, param_hint: str) -> None:
    """Exit 2 naming the options among ``names`` that the command line gives, as in
    ``--rails applies to the RDMA bed only (--rdma)`` (``why``: "to the RDMA bed only (--rdma)"):
    an option is never ignored without a word."""
    g = given(ctx, *names)
    if g:
        raise typer.BadParameter(f"{', '.join(g)} appl{'ies' if len(g) == 1 else 'y'} {why}", param_hint=param_hint)
