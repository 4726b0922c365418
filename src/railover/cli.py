"""The ``railover`` command line (Typer). Sub-commands live in their own modules and
register themselves here through a ``register(app)`` function."""
from __future__ import annotations

import json
import os
import stat
import sys
from typing import Optional, Tuple

import typer

from railover import __version__, envvars, params
from railover._cliutil import refuse_combined

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="railover: transparent NIC failover for NCCL. Plugin tools, test bed, demo, benchmarks.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="print railover's version and exit")) -> None:
    """railover: transparent NIC failover for NCCL. Plugin tools, test bed, demo, benchmarks."""


@app.command("env")
def env_cmd(ctx: typer.Context,
            shell: bool = typer.Option(False, "--shell", help="print 'export K=V' lines for scripts and job specs"),
            list_: bool = typer.Option(False, "--list", help="list every variable railover reads: default, accepted "
                                       "values, meaning (from the plugin's parameter table)"),
            events: bool = typer.Option(False, "--events", help="list the event journal's events and their fields"),
            as_json: bool = typer.Option(False, "--json", help="with --list/--events: JSON"),
            markdown: bool = typer.Option(False, "--markdown", help="with --list/--events: a Markdown table (the docs' one)")):
    """Print the environment that makes NCCL load railover (NCCL_NET_PLUGIN, NCCL_NET,
    LD_LIBRARY_PATH, and the NCCL 2.28/2.29 reload-bug workaround); with --list, every
    variable railover reads; with --events, the journal's events."""
    refuse_combined(ctx, "shell", ["list_", "events", "as_json", "markdown"],
                    "--shell prints the environment as export lines, not the listings")
    refuse_combined(ctx, "as_json", ["markdown"], "pick one output format")
    if (as_json or markdown) and not (list_ or events):
        typer.echo("error: --json and --markdown go with --list or --events", err=True)
        raise typer.Exit(2)
    if list_ or events:
        try:
            d = params.describe()
        except OSError as e:  # FileNotFoundError included: no plugin built/installed
            typer.echo(f"error: cannot read railover's parameter table from the plugin: {e}", err=True)
            raise typer.Exit(2)
        if as_json:
            out = {}
            if list_:
                out.update(empty_values=d["empty_values"], params=d["params"])
            if events:
                out.update(journal=d["journal"])
            typer.echo(json.dumps(out, indent=2, ensure_ascii=False))
        elif markdown:
            parts = []
            if list_:
                parts.append(params.render_markdown(d["params"], d["empty_values"]))
            if events:
                parts.append(params.render_events_markdown(d))
            typer.echo("\n\n".join(parts))
        else:
            if list_:
                from rich.console import Console
                console = Console(soft_wrap=False)
                if console.width < 1:  # COLUMNS=0 (or negative): nothing would print; rich's default width
                    console = Console(soft_wrap=False, width=80)
                console.print(params.render_table(d["params"], console.width))
                console.print(d["empty_values"], markup=False, highlight=False)
            if events:
                for e in d["journal"]["events"]:
                    typer.echo(f"{e['name']}: {e['meaning']}")
                    for f in e["fields"]:
                        typer.echo(f"    {f['name']} ({f['type']}): {f['meaning']}")
        return
    try:
        env = envvars.nccl_env()
    except FileNotFoundError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if shell:
        typer.echo(envvars.render_shell(env))
    else:
        for k, v in env.items():
            typer.echo(f"{k}={v}")


@app.command("version")
def version_cmd():
    """Print railover's version."""
    typer.echo(__version__)


# Sub-command modules, each with register(app): declared here, imported eagerly, so a missing
# or broken module is an error at start-up, never a silently absent command.
from railover import demo  # noqa: E402
from railover._cliutil import tidy_help  # noqa: E402
from railover.bench import cli as bench_cli  # noqa: E402
from railover.bench import soak as soak_cli  # noqa: E402
from railover.ops import cli as ops_cli  # noqa: E402
from railover.testbed import cli as testbed_cli  # noqa: E402

for _mod in (testbed_cli, demo, bench_cli, soak_cli, ops_cli):
    _mod.register(app)
tidy_help(app)


def main() -> None:
    """Console entry point ``railover``. A native file that cannot be found (no build, or a
    ``RAILOVER_NATIVE_DIR`` that does not hold it) is a one-line error and exit status 2 in
    every command, also in those that do not report it themselves."""
    from railover._paths import NativeFileNotFound
    pipe = _stdout_pipe()
    try:
        app()
    except NativeFileNotFound as e:
        typer.echo(f"railover: error: {e}", err=True)
        raise SystemExit(2)
    except BrokenPipeError:
        _closed_pipe()
    except SystemExit as e:
        # rich and click turn a write to a closed pipe (EPIPE) into exit 1: rich after pointing
        # stdout (fd 1) at /dev/null, click after wrapping sys.stdout in its PacifyFlushWrapper
        # (by name: Typer may carry its own copy of click). A genuine exit 1 does neither.
        if e.code == 1 and (type(sys.stdout).__name__ == "PacifyFlushWrapper"
                            or (pipe is not None and _stdout_pipe() != pipe)):
            _closed_pipe()
        raise


def _stdout_pipe() -> Optional[Tuple[int, int]]:
    """The pipe fd 1 writes to (device, inode), or None when it is no pipe."""
    try:
        st = os.fstat(1)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISFIFO(st.st_mode) else None


def _closed_pipe() -> None:
    """Exit 0 without a word when the reader of stdout went away (``railover env --list |
    head -1``), as Unix tools do: what is left unwritten has no reader."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # the interpreter's final flush must not fail again
    except (OSError, ValueError):
        pass
    raise SystemExit(0)


if __name__ == "__main__":
    main()
