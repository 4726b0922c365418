"""Every command's --help reads well in a narrow terminal: nothing cut with an ellipsis (a
default that is a comma list wraps), and a docstring paragraph is one paragraph (rich keeps
the docstring's line breaks in all but the first, unless railover reflows them)."""
from __future__ import annotations

from typing import List

import pytest
import typer
from typer.testing import CliRunner

from railover.cli import app


def _commands(cmd=None, path=()) -> List[tuple]:
    cmd = cmd or typer.main.get_command(app)
    out = [path]
    for name, sub in getattr(cmd, "commands", {}).items():
        out += _commands(sub, path + (name,))
    return out


COMMANDS = _commands()


def test_the_walk_finds_the_commands():
    assert ("bench", "failover") in COMMANDS and ("launch",) in COMMANDS and ("testbed", "up") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "railover")
def test_help_at_80_columns_cuts_nothing(path):
    r = CliRunner().invoke(app, list(path) + ["--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "…" not in r.output, r.output
    assert "``" not in r.output, r.output   # reStructuredText quotes are for the API docs, not --help


def test_a_later_docstring_paragraph_flows_as_one_paragraph():
    r = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "Exit status: 0 when the railover run survived" in ln]
    assert lines and "2 when its test bed failed." in lines[0], r.output


def test_a_comma_list_default_is_shown_whole():
    r = CliRunner().invoke(app, ["bench", "failover", "--help"], env={"COLUMNS": "80"})
    text = " ".join(r.output.replace("│", " ").split())
    assert "[default: (port-down, host-down, addr-del, silent, one-way)]" in text, r.output
