"""`railover --version` and `railover version` print the package's version."""
from __future__ import annotations

from typer.testing import CliRunner

from railover import __version__
from railover.cli import app


def test_version_option_and_command_print_the_version():
    r = CliRunner()
    for args in (["--version"], ["version"]):
        res = r.invoke(app, args)
        assert res.exit_code == 0, res.output
        assert res.output.strip() == __version__


def test_bench_options_say_what_they_take():
    res = CliRunner().invoke(app, ["bench", "failover", "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0
    assert "remote-cable-pull" in res.output, "--kinds lists the fault kinds"
    assert "[default: -1]" not in res.output, "a sentinel shown as the default"
