"""Every command's --help reads well in a narrow terminal: nothing cut with an ellipsis (a
default that is a comma list wraps), a docstring paragraph is one paragraph (rich keeps
the docstring's line breaks in all but the first, unless railover reflows them), a flag
shows no type and a comma-list default no parentheses."""
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
    r = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "700"})
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "Exit status: 0 when the railover run survived" in ln]
    assert lines and "2 when its test bed failed." in lines[0], r.output


def test_a_comma_list_default_is_shown_whole():
    r = CliRunner().invoke(app, ["bench", "failover", "--help"], env={"COLUMNS": "80"})
    text = " ".join(r.output.replace("│", " ").split())
    assert "[default: port-down, host-down, addr-del, silent, one-way]" in text, r.output


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "railover")
def test_help_shows_no_type_for_a_flag_and_no_tuple_for_a_default(path):
    """Recent Typer releases showed a flag's type as <bool> (a flag takes no value), and a
    comma-list default as "(a, b)", which reads as a Python tuple."""
    r = CliRunner().invoke(app, list(path) + ["--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "<bool>" not in r.output and "bool" not in r.output.lower().replace("boolean", ""), r.output
    text = " ".join(r.output.replace("│", " ").split())
    assert "[default: (" not in text and "[default: [" not in text, r.output
    flags = [ln for ln in r.output.splitlines() if "--help" in ln]
    assert flags and all("<" not in ln for ln in flags), flags


def test_a_flag_row_has_its_help_right_after_its_name():
    r = CliRunner().invoke(app, ["bench", "failover", "--help"], env={"COLUMNS": "80"})
    text = " ".join(r.output.replace("│", " ").split())
    assert "--quick tiny sizes and counts (smoke test)" in text, r.output
    assert "--out -o <path> output directory" in text, r.output   # an option with a value keeps its type


def test_the_test_bed_commands_do_not_claim_to_need_root():
    """demo and bench said '(needs root)'/'(need root)', but without root they build their beds
    in an unprivileged user namespace (testbed.netns.ensure_privileges; 'railover demo' as uid
    65534 ran and survived its faults, 'test bed ... (T2, userns)')."""
    from typer.testing import CliRunner

    from railover.cli import app
    for cmd in (["demo", "--help"], ["bench", "--help"]):
        r = CliRunner().invoke(app, cmd, env={"COLUMNS": "200"})
        text = " ".join(r.output.split())
        assert r.exit_code == 0 and "need root" not in text and "needs root" not in text, text
        assert "unprivileged user namespace" in text, text
