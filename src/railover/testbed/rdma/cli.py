"""``railover testbed up --rdma``: boot an RDMA bed, print its topology, keep it until
Ctrl-C/SIGTERM. Called by :mod:`railover.testbed.cli` (which owns the Typer options)."""
from __future__ import annotations

import signal
import time
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from railover.testbed.rdma import bed as _bed
from railover.testbed.rdma import image as _img


def topology_table(bed: "_bed.RdmaBed") -> Table:
    """One row per NIC (management included) of ``bed``."""
    img = bed.image
    t = Table(title=f"RDMA test bed {bed.prefix} (2 QEMU guests, kernel {img.kernel_version if img else '?'}, "
                    f"{bed.accel.upper()}, {bed.wire} wires)")
    for col in ("host", "nic", "ifname", "address", "rail", "rdma dev", "RoCE v2 GID (index 1)", "QEMU netdev"):
        t.add_column(col, no_wrap=True)
    for r in bed.describe():
        t.add_row(r["host"], r["nic"], r["ifname"], r["address"], r["rail"], r["rdma"], r["gid"], r["qemu"])
    return t


def up(*, rails: int, kernel: str, accel: str, base: int, prefix: Optional[str], console: Console,
       fail: Callable[[str], None], wire: str = "stream") -> None:
    """Boot the bed and block until SIGINT/SIGTERM; errors go through ``fail`` (exit 2)."""
    def log(msg: str) -> None:
        typer.echo(msg, err=True)

    try:
        bed = _bed.RdmaBed(rails=rails, kernel=kernel, accel=accel, base=base, prefix=prefix, log=log, wire=wire)
    except ValueError as e:
        fail(str(e))
        return
    t0 = time.monotonic()
    try:
        bed.up()
    except (_bed.RdmaBedError, _img.ImageError) as e:
        fail(str(e))
        return
    except KeyboardInterrupt:
        typer.echo("interrupted; torn down", err=True)
        raise typer.Exit(130)
    try:
        console.print(topology_table(bed))
        img = bed.image
        assert img is not None
        typer.echo(f"accelerator: {bed.accel} ({bed.accel_reason})")
        typer.echo(f"image: {img.initrd.parent} ({'built now in' if img.built else 'cached, built in'} "
                   f"{img.build_s:.1f} s)")
        typer.echo(f"boot: {bed.boot_s:.1f} s (" + ", ".join(f"{h.name} {h.boot_s:.1f} s" for h in bed.hosts) +
                   f"); up in {time.monotonic() - t0:.1f} s in all")
        typer.echo(f"prefix: {bed.prefix}")
        typer.echo(f"run dir: {bed.run_dir} (consoles: <host>/console.log, QEMU monitors: <host>/hmp.sock)")
        typer.echo("up; press Ctrl-C to tear it down", err=True)
        while True:
            signal.pause()  # SIGINT/SIGTERM raise (handlers installed by RdmaBed.up)
    except KeyboardInterrupt:
        pass
    finally:
        if bed.is_up:
            bed.down()
            typer.echo(f"torn down: {bed.prefix}", err=True)
