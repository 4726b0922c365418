"""``railover demo``: a training-style ring all-reduce over the plugin on a network-namespace
test bed (2 hosts x 2 NICs, one switch per rail, 2 ranks per host), surviving real NIC
faults with every byte checked.

Default fault sequence (each repair is followed by a visible failback after the hold-down):
  1. switch port down on host A's primary NIC (carrier loss), repaired 5 s later;
  2. silent black hole on host B's primary NIC at the switch (no carrier event), repaired 5 s later.

It prints live progress, then a timeline table per fault (detection, convergence, stall,
bytes resent, failback) and bandwidth before/during/after; it writes a PNG plot, a JSON
report and the plugin's event journals to the output directory. Exit status: 0 when every
fault was survived with 0 wrong bytes; 1 otherwise; 2 for bad options, a missing system
program (``ip``, ``nft``: named with the Debian package to install) or native file, a plugin
that does not load (all checked before anything is built), and when the test bed cannot be built.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from railover import _paths, params, prereqs
from railover.perf import MAX_TIMESERIES_S
from railover._cliutil import SIGNAL_EXITS, finite, out_dir_problem, plugin_range, signals_unwind
from railover.sizes import check_size
from railover.testbed import faults as F
from railover.testbed.scenario import (BED_ENV, ScenarioError, ScenarioResult, Step, bed_overrides, read_journal,
                                       run_scenario)
from railover.testbed.netns import PrivilegeError, TestBed, TestBedError, Topology, host_label

FAULT_KINDS = {
    "port-down": (F.PortDown, "switch port down (carrier loss)"),
    "host-down": (F.HostDown, "host NIC admin down"),
    "silent": (F.Silent, "silent black hole at the switch"),
    "addr-del": (F.AddrDel, "address removed"),
}


def fault_start_s(i: int, fault_for: float, hold_down_ms: int) -> float:
    """When the demo applies its ``i``-th fault, seconds after the all-reduce starts: 3 s of
    healthy traffic, then one fault per ``fault_for`` + hold-down + a healthy stretch: the
    failback (at the end of the hold-down, up to about a second later after a silent fault,
    whose repair the probes find) and then at least 3 s and more than the hold-down before the
    next fault. The plugin counts a path that fails again within its hold-down after it became
    active as a flap and doubles its hold-down: with a fixed 3 s stretch, --hold-down-ms 3000
    and above made the demo's own next fault a flap, whose failback then took twice the
    hold-down (or never came before the run ended)."""
    return 3.0 + i * (fault_for + hold_down_ms / 1000 + max(3.0, hold_down_ms / 1000 + 1.5))


def check_args(layout: str, size: str, duration: float, specs: List[tuple], fault_for: float = 5.0,
               hold_down_ms: int = 2000) -> None:
    """Reject a bad layout (1 NIC per host included: no standby NIC), size, duration (one
    that ends before the last fault is applied: that fault would never happen, and the run
    would count as surviving it) or a fault on a NIC the layout lacks before anything is
    built. Raises typer.BadParameter naming the option."""
    try:
        topo = Topology.from_layout(layout)
        topo.validate()
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--layout")
    if topo.nics < 2:
        raise typer.BadParameter(f"{layout}: 1 NIC per host leaves no standby NIC, so nothing can fail over; "
                                 "give at least 2 (e.g. T2 or 2x2)", param_hint="--layout")
    check_size(size)
    if duration < 0:
        raise typer.BadParameter(f"{duration:g}: must be >= 0 (0 = fit the faults)", param_hint="--duration")
    if duration > MAX_TIMESERIES_S:
        raise typer.BadParameter(f"{duration:g}: at most {MAX_TIMESERIES_S} s (24 h: railover-perf keeps a 1 ms "
                                 "delivery time series, 8 bytes per ms)", param_hint="--duration")
    last = fault_start_s(len(specs) - 1, fault_for, hold_down_ms)
    if duration and specs and duration <= last:
        kind, nic = specs[-1]
        raise typer.BadParameter(f"{duration:g} s ends before fault {kind}:{nic} is applied, {last:g} s after the "
                                 f"start: give more than {last:g} s, or 0 to fit the faults", param_hint="--duration")
    names = {f"{host_label(h, topo.hosts).lower()}{n}" for h in range(topo.hosts) for n in range(topo.nics)}
    for kind, nic in specs:
        if nic.lower() not in names:
            raise typer.BadParameter(f"fault {kind}:{nic}: layout {layout} has no NIC {nic} (it has "
                                     f"{', '.join(sorted(names))})", param_hint="--faults")


#: Options of the TCP demo that the RDMA demo does not take -> why, and what it does instead.
#: Given with --transport rdma they are a usage error (they used to be ignored silently).
RDMA_UNTAKEN = {
    "layout": ("--layout", "its bed is fixed: two QEMU guests with 2 rails each (Soft-RoCE)"),
    "ranks_per_host": ("--ranks-per-host", "it runs one rank per guest"),
    "duration": ("--duration", "the all-reduce runs until every fault in --faults has moved traffic to the "
                               "standby and back (one fault per kind), then stops"),
    "fault_for": ("--fault-for", "each fault is repaired once both guests journaled their failover (at most 60 s "
                                 "after it was applied)"),
}


def check_rdma_options(given: Dict[str, Any]) -> None:
    """Reject the options of the TCP demo that ``--transport rdma`` does not take
    (:data:`RDMA_UNTAKEN`) when given (``given``: parameter name -> value, None when not
    given). Raises typer.BadParameter (exit 2) naming each and what the RDMA demo does instead."""
    bad = [RDMA_UNTAKEN[g] for g in RDMA_UNTAKEN if given.get(g) is not None]
    if bad:
        raise typer.BadParameter("; ".join(f"the RDMA demo (--transport rdma) does not take {opt}: {why}"
                                           for opt, why in bad), param_hint=[opt for opt, _ in bad])


class _OutLock:
    """An flock held on the output directory itself (no lock file is left in it); released
    by :meth:`close`, or when the object goes away."""

    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    __del__ = close


def prepare_out(out: Path) -> _OutLock:
    """Create the output directory ``out`` (parents too) and lock it, before the test bed is
    built. Returns the lock (hold it while writing; :meth:`_OutLock.close` releases it). Raises
    typer.BadParameter naming ``--out`` and the problem: a path that exists and is not a
    directory, one that cannot be created (e.g. under /proc), one that is not writable, or a
    directory another demo is writing to."""
    out = Path(out)
    problem = out_dir_problem(out)
    if problem:
        raise typer.BadParameter(problem, param_hint="--out")
    lock = _OutLock(os.open(out, os.O_RDONLY | os.O_DIRECTORY))
    try:
        fcntl.flock(lock.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise typer.BadParameter(f"another railover demo is writing to {out}; wait for it or use another --out",
                                 param_hint="--out")
    return lock


def needed_tools(specs: List[tuple]) -> List[str]:
    """Programs the demo runs: ``ip`` (namespaces), ``nft`` when a fault is nftables-based."""
    tools = ["ip"]
    if any(issubclass(FAULT_KINDS[k][0], F.NftFault) for k, _ in specs):
        tools.append("nft")
    return tools


def check_plugin() -> None:
    """The plugin is found and loads (as NCCL will load it in the ranks). Raises
    FileNotFoundError naming where it looked, OSError saying why it does not load."""
    try:
        params.load()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise OSError(f"the railover plugin cannot be loaded: {e}") from None


def check_system(specs: List[tuple], path: Optional[str] = None) -> None:
    """Before anything is built: the programs the demo runs (see :func:`needed_tools`) and
    the native files (the plugin, which must load, and railover-perf). Raises
    prereqs.MissingTools naming each missing program and its Debian package (or the
    directory to add to PATH),
    FileNotFoundError naming a missing native file, OSError when the plugin does not load."""
    prereqs.require(needed_tools(specs), "railover demo", path)
    check_plugin()
    _paths.perf_path()
    check_env()


def check_env(env: Optional[Dict[str, str]] = None) -> None:
    """Every plugin variable set in ``env`` (default: this process's environment, which the
    ranks inherit, less the variables the bed sets itself, :data:`BED_ENV`) has a value the
    plugin accepts, checked by the plugin itself before a bed is built: otherwise every rank
    would fail its init. Raises ValueError naming each variable and what it accepts. Empty
    values are the same as unset (the default applies)."""
    problem = params.refusal({**os.environ, **BED_ENV} if env is None else env)
    if problem:
        raise ValueError(problem)


def parse_faults(spec: str) -> List[tuple]:
    """'port-down:a0,silent:b0' -> [(kind, nic)]. Raises typer.BadParameter naming the bad item."""
    out = []
    items = [x.strip() for x in spec.split(",")]
    if any(items) and not all(items):
        raise typer.BadParameter(f"{spec!r} has an empty item (two commas, or one at an end); give a comma list "
                                 "of KIND:NIC, e.g. port-down:a0", param_hint="--faults")
    for item in filter(None, items):
        kind, _, nic = item.partition(":")
        if kind not in FAULT_KINDS or not nic:
            raise typer.BadParameter(f"bad fault {item!r}: expected KIND:NIC with KIND one of "
                                     f"{', '.join(FAULT_KINDS)} and NIC like a0 or b1", param_hint="--faults")
        out.append((kind, nic))
    if not out:
        raise typer.BadParameter(f"no fault given ({spec!r}); give a comma list of KIND:NIC, e.g. port-down:a0",
                                 param_hint="--faults")
    return out


def _bandwidth(res: ScenarioResult, t0: int, t1: int) -> Optional[float]:
    """Bytes rank 0 received per second between two instants, in GB/s (1e9 B/s)."""
    if t1 <= t0 or not res.buckets or not res.buckets[0]:
        return None
    return res.delivered(t0, t1) / ((t1 - t0) / 1e6) / 1e9


def after_window(undo_us: int, failback_ms: Optional[float], hold_down_ms: int, next_apply_us: Optional[int],
                 end_us: int) -> Optional[tuple]:
    """The stretch a fault's "after" bandwidth is measured over: from 1 s after its failback
    (after the hold-down when there was none) for 2 s, cut at the next fault and at the end of
    the run's data; None when less than 0.5 s of it is left (a run that ended first measured
    nothing there). It used to be a fixed 3-5 s after the repair: before the failback with a
    hold-down over 3 s, into the next fault with one under 2 s, and 0 GB/s past the run's end."""
    back = max(hold_down_ms * 1e3, (failback_ms or 0) * 1e3)
    a = undo_us + int(back) + 1_000_000
    b = min([a + 2_000_000, end_us] + ([next_apply_us] if next_apply_us is not None else []))
    return (a, b) if b - a >= 500_000 else None


def build_report(res: ScenarioResult, fault_specs: List[tuple], baseline: bool,
                 hold_down_ms: int = 2000) -> Dict[str, Any]:
    rows = res.analyze()
    # the 1 ms buckets of rank 0: the last one ends 1 ms after its start
    end = max((t for t, _ in res.buckets[0]), default=0) + 1000 if res.buckets and res.buckets[0] else 0
    applies = sorted(r["t_us"] for r in rows)
    for r in rows:
        t0, t1 = r["t_us"], r.get("undo_t_us") or end
        r["bw_before_gbs"] = _bandwidth(res, t0 - 2_000_000, t0)
        r["bw_during_gbs"] = _bandwidth(res, t0 + 200_000, t1)
        win = after_window(t1, r.get("failback_ms"), hold_down_ms, next((x for x in applies if x > t0), None),
                           end) if r.get("undo_t_us") else None
        r["bw_after_gbs"] = _bandwidth(res, *win) if win else None
    ranks = res.perf.ranks
    # every fault applied (a run that ended before one never tested it) and, with railover, failed over
    survived = res.ok and res.wrong_bytes == 0 and len(rows) == len(fault_specs) and \
        (baseline or all(r["failovers"] >= 1 for r in rows))
    return {
        "mode": "baseline (RAILOVER_STANDBY=none)" if baseline else "railover",
        "survived": survived,
        "wrong_bytes": res.wrong_bytes,
        "ranks": [{"rank": r.rank, "exit_code": r.returncode,
                   "iterations": (r.json or {}).get("rows", [{}])[0].get("iters") if r.json else None,
                   "bytes_verified": (r.json or {}).get("stats", {}).get("bytes_received")} for r in ranks],
        "faults": [dict(r, kind=k, nic=n) for r, (k, n) in zip(rows, fault_specs)],
        "failovers": res.count("failover"),
        "failbacks": res.count("failback"),
        "workdir": str(res.workdir),
        "meta": res.meta,
    }


def plot(res: ScenarioResult, report: Dict[str, Any], path: Path) -> None:
    """Delivered bandwidth of rank 0 vs time (50 ms bins) with fault, failover and failback marks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = res.buckets[0] if res.buckets else []
    fig, ax = plt.subplots(figsize=(11, 4.2))
    if b:
        t_first = b[0][0]
        binsz = 50_000
        bins: Dict[int, int] = {}
        for t, n in b:
            bins[(t - t_first) // binsz] = bins.get((t - t_first) // binsz, 0) + n
        xs = sorted(bins)
        ax.plot([x * binsz / 1e6 for x in xs], [bins[x] / (binsz / 1e6) / 1e9 for x in xs], lw=1.2,
                color="tab:blue", label="delivered (rank 0)")
        for s in res.steps:
            if s.do == "apply" and s.t_us:
                undo = next((u for u in res.steps if u.do == "undo" and u.fault is s.fault and u.t_us), None)
                x0 = (s.t_us - t_first) / 1e6
                x1 = ((undo.t_us if undo else b[-1][0]) - t_first) / 1e6
                ax.axvspan(x0, x1, color="tab:red", alpha=0.12)
                ax.text(x0, ax.get_ylim()[1] * 0.02, " " + (s.label or s.fault.code), color="tab:red", fontsize=8,
                        rotation=90, va="bottom")
        for ev, color, mark in (("failover", "tab:red", "v"), ("failback", "tab:green", "^")):
            ts = [(e["t_us"] - t_first) / 1e6 for e in res.select(ev)]
            if ts:
                top = ax.get_ylim()[1]
                ax.scatter(ts, [top * 0.95] * len(ts), marker=mark, color=color, s=28, label=ev, zorder=3)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("GB/s received by rank 0")
    ax.set_title(f"railover demo ({report['mode']}): ring all-reduce through NIC faults, "
                 f"{report['wrong_bytes']} wrong bytes")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(v: Optional[float], unit: str = "", nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}{unit}"


def _failback_cell(r: Dict[str, Any]) -> str:
    """First failback after the repair (hold-down included), and how many of the comms that
    failed over came back before the next fault ("-" for a fault never undone)."""
    if r.get("undo_t_us") is None:
        return "-"
    cell = _fmt(r.get("failback_ms"), " ms", 0)
    if r["failovers"]:
        cell += f" ({r.get('failbacks', 0)} of {r['failovers']})"
    return cell


def timeline_table(report: Dict[str, Any]) -> Table:
    t = Table(title=f"Faults and what railover did ({report['mode']})")
    for c in ("fault", "detect", "converge", "stall (normal)", "resent B", "failback", "GB/s before/during/after"):
        t.add_column(c, overflow="fold")  # wrapped where too narrow (a pipe: 120 columns), never cut with '…'
    for r in report["faults"]:
        t.add_row(f"{r['label']} {r['nic']}", _fmt(r["detection_ms"], " ms", 2), _fmt(r["convergence_ms"], " ms", 2),
                  f"{_fmt(r['stall_ms'], ' ms', 0)} ({_fmt(r['baseline_gap_ms'], ' ms', 0)})",
                  f"{r['bytes_resent']:,}" + (f" +{r['failback_bytes_resent']:,} back"
                                              if r.get("failback_bytes_resent") else ""), _failback_cell(r),
                  f"{_fmt(r['bw_before_gbs'], '', 3)} / {_fmt(r['bw_during_gbs'], '', 3)} / {_fmt(r['bw_after_gbs'], '', 3)}")
    return t


def live_view(tb: TestBed, workdir: Path, nranks: int, elapsed: float, duration: float, steps: List[Step]) -> Table:
    t = Table(title=f"railover demo: {elapsed:5.1f} s of {duration:.0f} s", expand=False)
    t.add_column("rank")
    t.add_column("host")
    t.add_column("send comm on NIC")
    t.add_column("failovers")
    t.add_column("failbacks")
    t.add_column("last event")
    for r in range(nranks):
        ev = read_journal(workdir / f"events-rank{r}.jsonl")
        nic = "-"
        for e in ev:
            if e["event"] in ("failover", "failback"):
                nic = e.get("to_nic", nic)
            elif e["event"] == "path_up" and e.get("dir") == "send" and nic == "-":
                nic = e.get("nic", nic)
        last = next((e for e in reversed(ev) if e["event"] not in ("pair_up", "path_up")), None)
        t.add_row(str(r), tb.hosts[r % len(tb.hosts)].name, nic,
                  str(sum(e["event"] == "failover" for e in ev)), str(sum(e["event"] == "failback" for e in ev)),
                  f"{last['event']} {last.get('nic', last.get('to_nic', ''))}" if last else "")
    active = [s for s in steps if s.do == "apply" and s.t_us and s.fault.active]
    t.caption = "fault active: " + ", ".join(s.label for s in active) if active else "no fault active"
    return t


def run_demo(layout: str = "T2", ranks_per_host: int = 2, fault_spec: str = "port-down:a0,silent:b0",
             duration: float = 0.0, size: str = "4M", out: Path = Path("railover-demo"), hold_down_ms: int = 2000,
             fault_for: float = 5.0, baseline: bool = False, quiet: bool = False) -> int:
    console = Console(quiet=quiet, width=max(120, shutil.get_terminal_size((120, 24)).columns))
    specs = parse_faults(fault_spec)
    check_args(layout, size, duration, specs, fault_for, hold_down_ms)
    if not duration:
        duration = fault_start_s(len(specs), fault_for, hold_down_ms) + 2.0
    try:
        check_system(specs)
    except (prereqs.MissingTools, OSError, ValueError) as e:  # OSError: a missing file, a plugin that does not
        # load; ValueError: a plugin variable of the environment the plugin refuses
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    ignored = bed_overrides()
    if ignored:
        console.print("[yellow]note:[/] the test bed sets its own " + ", ".join(
            f"{k}={BED_ENV[k] or '(unset)'} (yours: {v})" for k, v in ignored.items()) + ": they describe this "
            "host's NICs, not the bed's (veths with IPv4 addresses, TCP; --transport rdma runs the RDMA demo)",
            soft_wrap=True)
    out = Path(out)
    lock = prepare_out(out)  # noqa: F841 (held open: the flock lasts as long as the process)
    env = {"RAILOVER_HOLD_DOWN_MS": str(hold_down_ms), "RAILOVER_STATE_DIR": "off"}
    if baseline:
        env.update(RAILOVER_STANDBY="none", RAILOVER_FATAL_TIMEOUT=str(int(fault_for + 30)))
    built = False  # a bed that cannot be built is "no test bed" (exit 2), not a failed demo
    try:
        with TestBed(layout) as tb:
            built = True
            console.print(f"[bold]railover demo[/]: test bed {tb.prefix} ({tb.layout}, {tb.mode}), "
                          f"{len(tb.hosts)} hosts x {len(tb.hosts[0].nics)} NICs, {ranks_per_host} "
                          f"rank{'s' if ranks_per_host != 1 else ''} per host, "
                          f"ring all-reduce of {size} for {duration:.0f} s"
                          + (", [yellow]failover disabled (baseline)[/]" if baseline else ""))
            steps = []
            for i, (kind, nic) in enumerate(specs):
                cls, desc = FAULT_KINDS[kind]
                try:
                    f = cls(tb.nic(nic))
                except (KeyError, TestBedError, ValueError) as e:
                    raise typer.BadParameter(f"fault {kind}:{nic}: {e}")
                t0 = fault_start_s(i, fault_for, hold_down_ms)
                steps += [Step(t0, "apply", f, label=kind), Step(t0 + fault_for, "undo", f, label=kind)]
                console.print(f"  at {t0:4.1f} s: {desc} on {nic} ({tb.nic(nic).ifname}) for {fault_for:.0f} s")
            nranks = len(tb.hosts) * ranks_per_host
            workdir = out / ("baseline-run" if baseline else "run")
            if workdir.exists():
                shutil.rmtree(workdir)
            start = time.monotonic()
            with Live(console=console, refresh_per_second=4, transient=True) as live:
                def tick(now_s: float) -> None:
                    live.update(live_view(tb, workdir, nranks, time.monotonic() - start, duration, steps))
                res = run_scenario(tb, steps, duration_s=duration, size=size, ranks_per_host=ranks_per_host,
                                   env=env, workdir=workdir, expect_failure=True, on_tick=tick)
    except PrivilegeError as e:
        console.print(f"[red]cannot build the test bed:[/] {escape(str(e))}\nrun as root (network namespaces need CAP_NET_ADMIN)")
        return 2
    except (ScenarioError, TestBedError) as e:  # TestBedError includes a fault that failed to apply
        if not built:
            console.print(f"[red]cannot build the test bed:[/] {escape(str(e))}")
            return 2
        console.print(f"[red]the demo could not run:[/] {escape(str(e))}")
        return 1
    report = build_report(res, specs, baseline, hold_down_ms)
    name = "baseline" if baseline else "demo"
    (out / f"{name}-report.json").write_text(json.dumps(report, indent=1))
    journals = out / f"{name}-journals"
    journals.mkdir(exist_ok=True)
    for j in res.workdir.glob("events-rank*.jsonl"):
        shutil.copy(j, journals / j.name)
    plot(res, report, out / f"{name}-bandwidth.png")
    console.print(timeline_table(report))
    verified = sum(r["bytes_verified"] or 0 for r in report["ranks"])
    exits = ", ".join(f"{r['rank']}:exit {r['exit_code']}" for r in report["ranks"])
    console.print(f"ranks: {exits}; "
                  f"{verified / 1e9:.2f} GB received and checked; wrong bytes: {report['wrong_bytes']}; "
                  f"failovers {report['failovers']}, failbacks {report['failbacks']}")
    console.print(f"wrote {out / (name + '-bandwidth.png')}, {out / (name + '-report.json')}, {journals}/")
    if report["survived"]:
        console.print("[green bold]every fault survived, 0 wrong bytes[/]" if not baseline else
                      "[yellow]baseline finished: compare its stalls with the railover run[/]")
        return 0
    if baseline:
        console.print("[yellow]baseline did not survive the faults, as expected without failover[/]: " + ("; ".join(
            f"rank {r['rank']} exited {r['exit_code']}" for r in report["ranks"] if r["exit_code"] != 0) or
            "see the stalls") + f" (details in {res.workdir})")
        return 1
    unapplied = [f"{k}:{n}" for k, n in specs[len(report["faults"]):]]
    console.print("[red bold]NOT survived[/]: " + ("; ".join(
        f"rank {r['rank']} exited {r['exit_code']}" for r in report["ranks"] if r["exit_code"] != 0) or
        (f"the run ended before {', '.join(unapplied)} was applied" if unapplied else "a fault caused no failover"))
        + f" (details in {res.workdir})")
    return 1


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo_cmd(
        layout: Optional[str] = typer.Option(None, "--layout", "-l", help="test-bed layout: T2, T2-flat, T3, T3-flat "
                                                                            "or <hosts>x<nics>[-flat] (default T2; tcp "
                                                                            "only)"),
        ranks_per_host: Optional[int] = typer.Option(None, "--ranks-per-host", "-r", min=1, max=4,
                                                     help="ranks per host (default 2; tcp only: the RDMA demo runs "
                                                          "1 per guest)"),
        faults: Optional[str] = typer.Option(None, "--faults",
                                             help="comma list KIND:NIC, KIND in port-down, host-down, silent, addr-del "
                                                  "(default port-down:a0,silent:b0); with --transport rdma a comma "
                                                  "list of cable-pull, admin-down, silent, one-way, remote-cable-pull "
                                                  "(default cable-pull,silent)"),
        transport: str = typer.Option("tcp", "--transport",
                                      help="tcp: namespace test bed; rdma: two QEMU guests with Soft-RoCE (the plugin's "
                                           "verbs transport; 1 rank per guest)"),
        fault_for: Optional[float] = typer.Option(None, "--fault-for", min=0.5, callback=finite,
                                                  help="seconds each fault lasts before repair (default 5; tcp only)"),
        duration: Optional[float] = typer.Option(None, "--duration", min=0, callback=finite,
                                                 help="seconds of all-reduce (default 0 = fit the faults; tcp only)"),
        size: Optional[str] = typer.Option(None, "--size", help="all-reduce size in bytes (8, 64K, 4M, ...; "
                                                                "default 4M, with --transport rdma 1M)"),
        hold_down_ms: int = typer.Option(2000, "--hold-down-ms", min=0, callback=plugin_range("RAILOVER_HOLD_DOWN_MS"),
                                         help="RAILOVER_HOLD_DOWN_MS for the run"),
        out: Path = typer.Option(Path("railover-demo"), "--out", "-o", help="output directory"),
        baseline: bool = typer.Option(False, "--baseline",
                                      help="then run the same faults with failover disabled (RAILOVER_STANDBY=none) and "
                                           "print the stalls side by side. The baseline is expected to stall or fail; "
                                           "that does not change the exit status (see below)"),
    ):
        """Run a ring all-reduce through real NIC faults on a namespace test bed and show what
        railover did (as root, or in an unprivileged user namespace where the kernel allows
        one). Writes a plot, a JSON report and the event journals.

        Exit status: 0 when the railover run survived every fault with 0 wrong bytes; 1 when it
        did not; 2 for bad options, a bad RAILOVER_*/NCCL_* value in the environment, missing
        system tools or no test bed; 130 after Ctrl-C (143 SIGTERM, 129 SIGHUP), the bed removed. With --baseline the
        baseline's stalls and failed ranks are expected and do not count; it makes the status 1
        only when it could not run or counted a wrong byte, 2 when its test bed failed."""
        if transport not in ("tcp", "rdma"):
            raise typer.BadParameter(f"unknown transport {transport!r}; tcp or rdma", param_hint="--transport")
        if transport == "rdma":
            if baseline:
                raise typer.BadParameter("--baseline is for --transport tcp; on RDMA, `railover bench rdma` measures "
                                         "the bare RC timeout without a standby", param_hint="--baseline")
            check_rdma_options({"layout": layout, "ranks_per_host": ranks_per_host, "duration": duration,
                                "fault_for": fault_for})
            # "was it given" (None), not "is it empty": an empty value is refused, never the default
            size = "1M" if size is None else size
            check_size(size)
            from railover import demo_rdma
            faults = demo_rdma.DEFAULT_FAULTS if faults is None else faults
            try:
                demo_rdma.parse_faults(faults)
            except demo_rdma.DemoError as e:
                raise typer.BadParameter(str(e), param_hint="--faults")
            with _interrupt_note(out / "demo-rdma-run"):
                rc = demo_rdma.run_rdma_demo(faults, size, out, hold_down_ms)
            raise typer.Exit(rc)
        faults = "port-down:a0,silent:b0" if faults is None else faults
        size = "4M" if size is None else size
        layout = "T2" if layout is None else layout
        ranks_per_host = 2 if ranks_per_host is None else ranks_per_host
        duration = 0.0 if duration is None else duration
        fault_for = 5.0 if fault_for is None else fault_for
        with _interrupt_note(out / "run"):
            rc = run_demo(layout, ranks_per_host, faults, duration, size, out, hold_down_ms, fault_for, False)
        if baseline and rc != 2:  # 2: the railover run could not start (tools, test bed): nor could the baseline
            with _interrupt_note(out / "baseline-run"):
                rc_b = run_demo(layout, ranks_per_host, faults, duration, size, out, hold_down_ms, fault_for, True)
            b_report = _load_report(out / "baseline-report.json") if rc_b in (0, 1) else None
            if rc == 0 or rc == 1:
                _compare(out)
            rc = exit_code_with_baseline(rc, rc_b, b_report)
        raise typer.Exit(rc)


@contextlib.contextmanager
def _interrupt_note(workdir: Path):
    """Ctrl-C (or SIGTERM, SIGHUP) during a demo run: the test bed is already removed
    (TestBed's ``with``, the RDMA bed's ``finally``) when the interrupt gets here; say so and
    where this run's event journals and rank logs are (files written since it started, not an
    earlier run's), then exit 130 (click would print "Aborted!" and exit 1), or re-raise the
    SystemExit of SIGTERM/SIGHUP (143/129)."""
    started = time.time()

    def note(why: str) -> None:
        new = [p for p in workdir.glob("*") if p.stat().st_mtime >= started - 1] if workdir.is_dir() else []
        Console(stderr=True).print(
            f"[yellow]demo interrupted ({why})[/]: the test bed is removed and the run cut short. "
            + (f"Its journals and rank logs so far are in {escape(str(workdir))}/ ({len(new)} files)"
               if new else "It had written no journal yet."), soft_wrap=True)
    try:
        with signals_unwind():
            yield
    except KeyboardInterrupt:
        note("SIGINT")
        raise typer.Exit(130)
    except SystemExit as e:
        if e.code in SIGNAL_EXITS:
            note(SIGNAL_EXITS[e.code])
        raise


def exit_code_with_baseline(rc_railover: int, rc_baseline: int, baseline_report: Optional[Dict[str, Any]]) -> int:
    """Exit status of ``railover demo --baseline``. The baseline runs the same faults with
    failover disabled, so it is expected to stall or fail (its ranks may time out): its
    survival does not count. Rules, in order:

    * the railover run's status when it is not 0 (1 not survived, 2 no test bed);
    * 2 when the baseline could not build its test bed (``rc_baseline`` 2);
    * 1 when the baseline did not produce a report (it could not run), or its report
      counts wrong bytes (a wrong byte is never expected, failover or not);
    * else 0.
    """
    if rc_railover != 0:
        return rc_railover
    if rc_baseline == 2:
        return 2
    if rc_baseline not in (0, 1) or baseline_report is None:
        return 1
    return 1 if baseline_report.get("wrong_bytes", 0) else 0


def _load_report(path: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _compare(out: Path) -> None:
    console = Console()
    a = _load_report(out / "demo-report.json")
    b = _load_report(out / "baseline-report.json")
    if a is None or b is None:
        console.print("[red]no side-by-side comparison: the " + ("railover" if a is None else "baseline")
                      + " run wrote no report[/]")
        return
    t = Table(title="railover vs failover disabled (same faults)")
    for c in ("fault", "stall with railover", "stall without", "ranks OK with / without"):
        t.add_column(c)
    ok_a = all(r["exit_code"] == 0 for r in a["ranks"])
    ok_b = all(r["exit_code"] == 0 for r in b["ranks"])
    for fa, fb in zip(a["faults"], b["faults"]):
        t.add_row(f"{fa['label']} {fa['nic']}", _fmt(fa["stall_ms"], " ms", 0), _fmt(fb["stall_ms"], " ms", 0),
                  f"{'yes' if ok_a else 'no'} / {'yes' if ok_b else 'no'}")
    console.print(t)
