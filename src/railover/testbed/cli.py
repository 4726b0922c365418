"""``railover testbed`` sub-commands: ``up``, ``down``, ``list``.

``railover.cli`` imports this module and calls :func:`register`.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from railover._cliutil import given, refuse_combined, refuse_given
from railover.testbed import netns as _tb

# Not a terminal (pipes, CI logs): rich would use 80 columns and crop addresses.
_console = Console(width=shutil.get_terminal_size((120, 24)).columns)


def topology_table(tb: "_tb.TestBed") -> Table:
    """A rich table with one row per NIC of ``tb``."""
    t = Table(title=f"test bed {tb.prefix} ({tb.layout}, mode {tb.mode}, fabric {tb.fabric_ns})")
    for col in ("host", "netns", "nic", "ifname", "address", "rail", "bridge", "switch port"):
        t.add_column(col, no_wrap=True)
    for h in tb.hosts:
        for n in h.nics:
            t.add_row(h.name, h.ns, n.name, n.ifname, n.cidr, str(n.rail), n.bridge, n.port)
    return t


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _topology(ctx: typer.Context, layout: str, hosts: Optional[int], nics: Optional[int]) -> "_tb.Topology":
    """The namespace bed that --layout and the --hosts/--nics overrides describe, refused up
    front (exit 2, naming the option) when it is unknown, does not fit, or has 1 NIC per
    host: no standby NIC, so nothing can fail over. One host is a bed (ranks on one host talk
    over their own NICs, as in ``bench healthy``'s loopback network)."""
    try:
        t = _tb.Topology.from_layout(layout)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--layout")
    t = _tb.Topology(hosts if hosts is not None else t.hosts, nics if nics is not None else t.nics, t.flat)
    hint = " / ".join(given(ctx, "layout", "hosts", "nics")) or "--layout"
    try:
        t.validate()
    except ValueError as e:
        msg = str(e)
        raise typer.BadParameter(msg if msg.startswith(t.name) else f"{t.name}: {msg}", param_hint=hint)
    if t.nics < 2:
        raise typer.BadParameter(f"{t.name}: 1 NIC per host leaves no standby NIC, so nothing can fail over; "
                                 "give at least 2 (e.g. T2 or 2x2)", param_hint="--layout")   # --nics itself is >= 2
    return t


def up_cmd(
    ctx: typer.Context,
    layout: str = typer.Option("T2", "--layout", "-l",
                               help="T2, T2-flat, T3, T3-flat or <hosts>x<nics>[-flat], nics 2 or more"),
    hosts: Optional[int] = typer.Option(None, min=1, max=254, help="override the number of hosts"),
    nics: Optional[int] = typer.Option(None, min=2, max=99, help="override the NICs per host (a standby NIC "
                                                                 "needs 2 or more)"),
    base: int = typer.Option(0, min=0, max=255, help="second address octet: addresses are 10.<base>.x.y"),
    prefix: Optional[str] = typer.Option(None, help="use this prefix ('ro' + 4 lowercase letters/digits) instead of a random one"),
    detach: bool = typer.Option(False, "--detach", "-d",
                                help="leave the bed up and exit (remove it with 'railover testbed down')"),
    no_policy_routing: bool = typer.Option(False, "--no-policy-routing",
                                           help="flat layouts: no per-NIC policy routing (main table only)"),
    rdma: bool = typer.Option(False, "--rdma", help="QEMU guests with Soft-RoCE (rxe) NICs instead of namespaces "
                                                     "(2 hosts; see docs/RDMA-TESTBED.md)"),
    rails: int = typer.Option(2, "--rails", min=2, max=8, help="with --rdma: rail NICs per guest (a standby rail "
                                                                "needs 2 or more)"),
    kernel: str = typer.Option("6.1", "--kernel", help="with --rdma: guest kernel series, 6.1 or 6.12"),
    accel: str = typer.Option("auto", "--accel", help="with --rdma: auto, kvm or tcg"),
    wire: str = typer.Option("stream", "--wire", help="with --rdma: NIC wires, stream (lossless) or udp (lossy "
                                                       "when the host's socket buffers overflow)"),
) -> None:
    """Build a test bed, print its topology, and keep it until SIGINT (Ctrl-C) or SIGTERM
    (or --detach)."""
    if not detach and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # A shell starts a background job ('railover testbed up &' in a script) with SIGINT
        # ignored, and the ignore survives exec. This command waits for SIGINT to tear down,
        # so it restores the default (KeyboardInterrupt) before the bed's handler chains to it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if rdma:
        refuse_given(ctx, ["layout", "hosts", "nics", "no_policy_routing"],
                     "to the network-namespace beds only, not to the RDMA bed (--rdma)")
        if detach:
            _fail("--detach is not supported with --rdma (the guests live as long as this command)")
        from railover.testbed.rdma import cli as _rcli
        _rcli.up(rails=rails, kernel=kernel, accel=accel, base=base, prefix=prefix, console=_console, fail=_fail,
                  wire=wire)
        return
    refuse_given(ctx, ["rails", "kernel", "accel", "wire"], "to the RDMA bed only (add --rdma)")
    _topology(ctx, layout, hosts, nics)
    tb: Optional[_tb.TestBed] = None
    try:
        if no_policy_routing and "flat" not in layout:
            _fail("--no-policy-routing applies to flat layouts only (e.g. --layout T2-flat)")
        tb = _tb.TestBed(layout, hosts=hosts, nics=nics, base=base, prefix=prefix,
                         policy_routing=not no_policy_routing)
        tb.up()
    except (ValueError, _tb.TestBedError) as e:
        _fail(str(e))
    except KeyboardInterrupt:  # TestBed.up() removed what it had made (a failed removal is a TestBedError)
        _fail(f"interrupted while building {f'test bed {tb.prefix}' if tb is not None else 'the test bed'}; "
              "what it had created was removed", 130)
    assert tb is not None
    try:
        _console.print(topology_table(tb))
        typer.echo(f"mode: {tb.mode}")
        typer.echo(f"prefix: {tb.prefix}")
        if detach:
            try:
                tb.detach()
            except _tb.TestBedError as e:
                _fail(str(e))
            typer.echo(f"detached; remove with: railover testbed down --prefix {tb.prefix}")
            return
        if sys.stdin is not None and sys.stdin.isatty():
            typer.echo("up; press Ctrl-C to tear it down", err=True)
        else:
            typer.echo(f"up; tear it down with: kill -INT {os.getpid()} (or kill {os.getpid()}), or "
                       f"railover testbed down --prefix {tb.prefix}", err=True)
        while True:
            signal.pause()  # SIGINT/SIGTERM raise (handlers installed by TestBed.up)
    except KeyboardInterrupt:
        pass
    finally:
        if tb.is_up and not tb.detached:
            tb.down()
            typer.echo(f"torn down: {tb.prefix}", err=True)


def down_cmd(
    ctx: typer.Context,
    prefix: Optional[str] = typer.Option(None, help="remove only this bed (whatever its state)"),
    all_: bool = typer.Option(False, "--all", help="also remove beds whose owner process still runs"),
) -> None:
    """Remove leftover test beds (crashed runs, detached beds); processes inside are killed.

    Beds are found from state files (/run/railover-testbed or the temp dir) and by sweeping namespaces named ro????-ns*."""
    refuse_combined(ctx, "prefix", ["all_"], "--prefix removes that one bed whatever its state; --all, without "
                    "--prefix, also removes every bed whose owner still runs")
    if prefix is not None and not _tb.PREFIX_RE.match(prefix):
        raise typer.BadParameter(f"{prefix!r} is not a test bed prefix: 'ro' + 4 of [a-z0-9], as 'railover testbed "
                                 "list' shows", param_hint="--prefix")
    if _tb.privilege_mode() == "none":
        _fail("removing namespaces needs root (beds made in user-namespace mode vanish with "
              "their process anyway)")
    from railover.testbed.rdma import bed as _rbed
    known = {i.prefix for i in _tb.list_testbeds()} | {i.prefix for i in _rbed.list_rdma_beds()}
    if prefix is not None and prefix not in known:
        _fail(f"no test bed with prefix {prefix!r}", 1)
    removed = _tb.cleanup_leftovers(prefix, include_live=all_) + _rbed.cleanup_rdma_leftovers(prefix, include_live=all_)
    if removed:
        for ns in removed:  # the RDMA bed's lines already say "removed ..."
            typer.echo(ns if ns.startswith("removed ") else f"removed {ns}")
    else:
        typer.echo("nothing to remove")
    infos = _tb.list_testbeds()
    live = [i for i in infos if i.alive and not i.detached] + [i for i in _rbed.list_rdma_beds() if i.alive]
    unknown = [i for i in infos if i.owner_unknown_in_use]
    if live and not all_ and prefix is None:
        typer.echo("kept (owner still running; use --all to remove): " +
                   ", ".join(f"{i.prefix} (pid {i.pid})" for i in live), err=True)
    if unknown and not all_ and prefix is None:
        typer.echo("kept (no state file here, but processes still run inside: maybe a live bed whose state file "
                   "is elsewhere, e.g. another RAILOVER_TESTBED_STATE; use --prefix P or --all to remove): " +
                   ", ".join(f"{i.prefix} (pids {' '.join(map(str, i.pids_inside[:5]))}"
                             f"{' ...' if len(i.pids_inside) > 5 else ''})" for i in unknown), err=True)


def list_cmd() -> None:
    """List test beds: live, detached and leftovers of crashed runs (namespace and RDMA beds)."""
    from railover.testbed.rdma import bed as _rbed
    infos = _tb.list_testbeds()
    rinfos = _rbed.list_rdma_beds()
    if not infos and not rinfos:
        typer.echo("no test beds")
        return
    if rinfos:
        rt = Table(title="railover RDMA test beds (QEMU guests)")
        for col in ("prefix", "kernel", "hosts x rails", "owner pid", "state", "QEMU pids", "run dir"):
            rt.add_column(col)
        for i in rinfos:
            rt.add_row(i.prefix, i.kernel or "?", f"{i.hosts}x{i.rails}", str(i.pid or "-"),
                       "live" if i.alive else "leftover", " ".join(map(str, i.qemu_pids)) or "-", i.run_dir or "-")
        _console.print(rt)
    if not infos:
        return
    t = Table(title="railover test beds")
    for col in ("prefix", "layout", "mode", "owner pid", "state", "namespaces"):
        t.add_column(col)
    for i in infos:
        state = "detached" if i.detached else ("live" if i.alive else
                                                ("in use, owner unknown" if i.owner_unknown_in_use else "leftover"))
        t.add_row(i.prefix, i.layout or "?", i.mode or "?", str(i.pid or "-"), state,
                  " ".join(i.namespaces) or "-")
    _console.print(t)


def register(app: typer.Typer) -> None:
    """Add the ``testbed`` sub-app (up/down/list) to the main Typer ``app``."""
    sub = typer.Typer(no_args_is_help=True,
                      help="Test beds: network namespaces (hosts x NICs wired through per-rail bridges), "
                           "or with --rdma QEMU guests with Soft-RoCE NICs.")
    sub.command("up")(up_cmd)
    sub.command("down")(down_cmd)
    sub.command("list")(list_cmd)
    app.add_typer(sub, name="testbed")
