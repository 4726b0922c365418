"""``railover demo --transport rdma``: the demo's story on the RDMA test bed.

Two QEMU guests with Soft-RoCE (rxe) on 2 rails each (:mod:`railover.testbed.rdma.bed`) run a
ring all-reduce through the plugin's verbs transport (``RAILOVER_TRANSPORT=rdma``, one rank per
guest, every byte generated and checked). Each fault in ``--faults`` (kinds of
``railover bench rdma``: cable-pull, admin-down, silent, one-way, remote-cable-pull) is applied
to the primary rail once both guests' comms are armed (traffic on the primary, a standby path
up), kept until both guests journaled their ``failover`` (bounded), then repaired, and the demo
waits for the ``failback``. The fault cycle is the benchmark's
(:func:`railover.bench.rdma.convergence` with one fault per kind), so the demo and the
benchmark measure the same way.

Output: one row per fault (failovers and their convergence, fault -> first failover in guest A,
failbacks), then ranks, wrong bytes and the all-reduce's busbw; ``<out>/demo-rdma-report.json``
and the journals in ``<out>/demo-rdma-journals/``.

Exit status: 0 when every fault moved traffic to the standby and back with 0 wrong bytes, no
fatal error and both ranks exiting 0; 1 when not; 2 when the bed cannot run here (missing
tools, no Debian 12 apt sources for the guest image, bad options).

The guests run under TCG when the host has no KVM: booting takes 1-3 minutes, and every
figure is that of an emulated machine 10-50x slower than native (the plugin then runs with the
bed's TCG probe timers, reported).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

#: The demo's faults when --faults is not given: a carrier loss and a silent black hole on
#: guest A's primary rail.
DEFAULT_FAULTS = "cable-pull,silent"


class DemoError(Exception):
    """The RDMA demo cannot run (message for the user)."""


def parse_faults(spec: str) -> List[str]:
    """``"cable-pull,silent"`` -> kinds, checked against ``railover bench rdma``'s kinds."""
    from railover.bench.rdma import KINDS
    items = [k.strip() for k in spec.split(",")]
    kinds = [k for k in items if k]
    if not kinds:
        raise DemoError("--faults is empty; give a comma list of " + ", ".join(KINDS))
    if len(kinds) != len(items):
        raise DemoError(f"--faults {spec!r} has an empty item (two commas, or one at an end); "
                        "give a comma list of " + ", ".join(KINDS))
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise DemoError(f"unknown RDMA fault kind(s) {', '.join(map(repr, bad))}; one of {', '.join(KINDS)} "
                        "(the TCP demo's KIND:NIC faults do not apply to --transport rdma)")
    if len(set(kinds)) != len(kinds):
        raise DemoError(f"--faults names a kind twice: {spec!r}")
    return kinds


def verdict(results: Mapping[str, Any]) -> List[str]:
    """Why the run did not survive (empty: it did). ``results`` is what
    :func:`railover.bench.rdma.convergence` returns."""
    why = []
    if results.get("convergence_aborted"):
        why.append(f"the run did not finish: {results['convergence_aborted']}")
    lost = [c["at"] for c in results.get("convergence_crashes") or [] if c.get("during_fault")]
    if lost:
        why.append(f"a guest kernel crash under {', '.join(lost)} (run again)")
    if results.get("convergence_unchecked_faults"):
        why.append(f"{results['convergence_unchecked_faults']} fault(s) whose bytes were not checked (a crashed guest)")
    for kind, r in results.get("kinds", {}).items():
        if r["faults_without_failover"]:
            why.append(f"{kind}: no failover")
        if r["faults_without_failback"]:
            why.append(f"{kind}: no failback after the repair")
    if results.get("convergence_wrong_bytes"):
        why.append(f"{results['convergence_wrong_bytes']} wrong bytes")
    if results.get("convergence_fatal_total"):
        why.append(f"{results['convergence_fatal_total']} fatal error(s) in the journals")
    codes = results.get("convergence_exit_codes") or []
    if any(c != 0 for c in codes) or not codes:
        why.append("ranks exited " + (", ".join(map(str, codes)) or "(none)"))
    return why


def story_table(results: Mapping[str, Any]) -> Table:
    t = Table(title="railover over RDMA: what each fault did")
    for c in ("fault", "failovers", "convergence (ms, per comm)", "fault -> failover in A (ms)", "failbacks",
              "failback (ms)"):
        t.add_column(c, justify="right" if c != "fault" else "left")
    for kind, r in results.get("kinds", {}).items():
        for c in r["cycles"]:
            fa = c.get("fault_to_failover_a_ms")
            t.add_row(kind, str(c["failovers"]),
                      ", ".join(f"{x:.1f}" for x in c["convergence_ms"]) or "-",
                      f"{fa:.0f}" if fa is not None else "-", str(c["failbacks"]),
                      ", ".join(f"{x:.1f}" for x in c["failback_convergence_ms"]) or "-")
    return t


def run_rdma_demo(fault_spec: str = DEFAULT_FAULTS, size: str = "1M", out: Path = Path("railover-demo"),
                  hold_down_ms: int = 2000, quiet: bool = False, bed=None) -> int:
    """Runs the RDMA demo (boots its own bed unless ``bed`` is given); returns the exit status."""
    from railover.bench import common as C
    from railover.bench import rdma as brdma
    from railover.demo import check_plugin, prepare_out
    from railover.testbed.faults import FaultError
    from railover.testbed.rdma import bed as rbed
    from railover.testbed.rdma import image as rimg
    from railover.testbed.rdma.perf import TCG_PLUGIN_ENV
    from railover.sizes import parse_size
    console = Console(quiet=quiet, width=max(120, shutil.get_terminal_size((120, 24)).columns))
    try:
        kinds = parse_faults(fault_spec)
        parse_size(size)
    except (DemoError, ValueError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        return 2
    try:
        check_plugin()  # the guests run the host's build: one that does not load here is no use there
    except OSError as e:
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    out = Path(out)
    lock = prepare_out(out)  # noqa: F841 (held open: the flock lasts as long as the process)
    own = bed is None
    if own:
        if shutil.which("qemu-system-x86_64") is None:
            console.print("[red]error:[/] the RDMA test bed needs QEMU: apt-get install qemu-system-x86 "
                          "(and cpio kmod binutils; `railover doctor` lists what is missing)")
            return 2
        console.print("[bold]railover demo --transport rdma[/]: booting two QEMU guests with Soft-RoCE "
                      "(1-3 minutes without KVM; the guest image is built from Debian 12 packages at first use)")
        try:
            bed = rbed.RdmaBed(rails=2, boot_timeout_s=600, log=lambda m: console.print(f"[dim]\\[rdma bed] {escape(m)}[/]")).up()
        except (rbed.RdmaBedError, rimg.ImageError, ValueError) as e:
            console.print(f"[red]the RDMA test bed could not start:[/] {escape(str(e))}")
            return 2
    work = out / "demo-rdma-run"
    if work.exists():
        shutil.rmtree(work)
    try:
        accel = bed.accel
        console.print(f"bed {bed.prefix}: {accel}; ring all-reduce of {size} over RAILOVER_TRANSPORT=rdma, one rank "
                      "per guest, every byte checked. Faults, in turn:")
        for k in kinds:
            console.print(f"  {k}: {brdma.KINDS[k]['what']}")
        if accel != "kvm":
            env = TCG_PLUGIN_ENV
            console.print(f"[yellow]emulated CPUs (TCG):[/] figures are those of a machine 10-50x slower than native, "
                          f"and the plugin runs with the bed's probe timers ({env['RAILOVER_PROBE_INTERVAL_MS']} ms x "
                          f"{env['RAILOVER_PROBE_MULT']}), so a silent fault takes about "
                          f"{int(env['RAILOVER_PROBE_INTERVAL_MS']) * int(env['RAILOVER_PROBE_MULT']) / 1000:.0f} s "
                          "to be detected here (defaults: 20 ms x 5)")
        try:
            # A guest kernel crash is raised, not rebooted past (crash_reboots=None): the demo
            # tells one fault per kind, and a caller's bed is the caller's to reboot and retry.
            # The story is one checked run (faults_per_run=None).
            results = brdma.convergence(bed, kinds, 1, size, hold_down_ms, work, console,
                                        conv_timeout_s=60.0, failback_timeout_s=120.0 + hold_down_ms / 1e3,
                                        crash_reboots=None, faults_per_run=None)
        except C.BenchError as e:
            console.print(f"[red]the demo could not run:[/] {escape(str(e))}")
            return 1
        except (rbed.RdmaBedError, FaultError) as e:
            if not own and isinstance(e, rbed.GuestCrash):
                raise  # the caller's bed: the caller may reboot it and retry
            console.print(f"[red]the RDMA bed failed during the demo:[/] {escape(str(e))}")
            return 1
    finally:
        if own:
            bed.down()
    report = {"transport": "rdma", "faults": kinds, "size": size, "hold_down_ms": hold_down_ms, "accel": accel,
              "plugin_env": dict(TCG_PLUGIN_ENV) if accel != "kvm" else {}, **results}
    why = verdict(results)
    report["survived"] = not why
    (out / "demo-rdma-report.json").write_text(json.dumps(report, indent=1, default=str))
    journals = out / "demo-rdma-journals"
    journals.mkdir(exist_ok=True)
    segs = [sg["dir"] for sg in results.get("convergence_segments") or []] or ["convergence"]
    for d in segs:  # one checked run, or one per segment after a guest crash
        for j in (work / d).glob("journal-rank*.jsonl"):
            shutil.copy(j, journals / (j.name if len(segs) == 1 else f"{d}-{j.name}"))
    console.print(story_table(results))
    bw = results.get("convergence_busbw_gbs")
    console.print(f"ranks: exit {', '.join(map(str, results.get('convergence_exit_codes') or [])) or '-'}; "
                  f"wrong bytes: {results.get('convergence_wrong_bytes')}; all-reduce busbw "
                  + (f"{bw * 1e3:.2f} MB/s" if isinstance(bw, (int, float)) else "-")
                  + " (average over the whole run, faults and waits included)")
    console.print(f"wrote {out / 'demo-rdma-report.json'}, {journals}/")
    if not why:
        console.print("[green bold]every fault survived on RDMA: moved to the standby HCA and back, 0 wrong bytes[/]")
        return 0
    console.print("[red bold]NOT survived[/]: " + "; ".join(why) + f" (journals in {journals})")
    return 1
