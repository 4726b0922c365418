"""The ``railover`` command line (Typer). Sub-commands live in their own modules and
register themselves here through a ``register(app)`` function."""
from __future__ import annotations

import typer

from railover import __version__, envvars

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="railover: transparent NIC failover for NCCL. Plugin tools, test bed, demo, benchmarks.")


@app.command("env")
def env_cmd(shell: bool = typer.Option(False, "--shell", help="print 'export K=V' lines for scripts and job specs")):
    """Print the environment that makes NCCL load railover (NCCL_NET_PLUGIN, NCCL_NET,
    LD_LIBRARY_PATH, and the NCCL 2.28/2.29 reload-bug workaround)."""
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
from railover.bench import cli as bench_cli  # noqa: E402
from railover.bench import soak as soak_cli  # noqa: E402
from railover.ops import cli as ops_cli  # noqa: E402
from railover.testbed import cli as testbed_cli  # noqa: E402

for _mod in (testbed_cli, demo, bench_cli, soak_cli, ops_cli):
    _mod.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
