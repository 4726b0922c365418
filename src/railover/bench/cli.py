"""``railover bench <suite>``: the benchmarks behind docs/BENCHMARKS.md.

Suites (each runs on network-namespace test beds, as root or in a user namespace, prints tables and writes
``<out>/<suite>.json`` plus PNG plots; ``--quick`` is a tiny version for smoke tests):

* ``healthy``        busbw and small-message latency: armed vs RAILOVER_STANDBY=none vs iperf3,
                     loopback and veth, 2 and 4 ranks, and the RAILOVER_NSTREAMS measurement
* ``failover``       N faults per kind under a checked all-reduce: detection, convergence,
                     stall, bytes resent (p50/p99/max)
* ``degraded``       busbw during a fault relative to before, 2 and 4 NICs per host, spread
                     over the survivors vs one buddy
* ``failback``       repair -> traffic back on the primary, minus the hold-down; busbw after
                     failback relative to before the fault
* ``false-failover`` congestion, a rate-limited rail, a receiver that stops posting, a stopped
                     peer: failovers counted (target 0)
* ``scale``          2..2048 comms per process: connect time, memory, idle CPU, convergence
* ``rdma``           the RDMA verbs transport on the RDMA test bed (QEMU + Soft-RoCE): convergence
                     per fault kind, the bare RC timeout, busbw vs tcp vs ib_write_bw (not in ``all``)
* ``all``            every suite, then ``summary.md`` (the tables of docs/BENCHMARKS.md)

``--transport rdma`` on ``healthy`` (busbw), ``failover`` (convergence and the bare RC timeout)
and ``failback`` (fault cycles with the failback convergence) runs that part of ``rdma`` on the
RDMA test bed; ``degraded``, ``false-failover`` and ``scale`` refuse it with what exists instead.
* ``report``         rebuild ``summary.md`` from the JSON files in --out

Exit status: 0 when every figure meets its target, 1 when some miss, 2 when a suite could
not run (no privileges, a rank failed...), 130 after Ctrl-C (143 after SIGTERM, 129 after
SIGHUP): the running suite's finished parts are then kept in ``<suite>.json``, marked
``"interrupted"`` (docs/BENCHMARKS.md says which parts each suite keeps).
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from railover._cliutil import (SIGNAL_EXITS, csv_list, finite, given, out_dir_problem, plugin_range, positive,
                               refuse_combined, refuse_given, signals_unwind)
from railover import params
from railover.bench import common as C
from railover.sizes import check_size

SUITES = ("healthy", "failover", "degraded", "failback", "false-failover", "scale")
#: reports ``report`` and ``summary.md`` include when their JSON exists: the suites, railover
#: side by side with Linux MPTCP (``failover --peer mptcp`` writes ``failover-peers.json``) and
#: ``rdma`` (it needs QEMU, so ``all`` runs neither)
REPORT_SUITES = SUITES + ("failover-peers", "rdma")


def _module(suite: str):
    import importlib
    return importlib.import_module({
        "healthy": "railover.bench.healthy",
        "failover": "railover.bench.failover",
        "degraded": "railover.bench.degraded",
        "failback": "railover.bench.failback",
        "false-failover": "railover.bench.false_failover",
        "scale": "railover.bench.scale",
        "rdma": "railover.bench.rdma",
    }[suite])


def _markdown(suite: str):
    """The function that draws report ``suite``'s tables as markdown."""
    if suite == "failover-peers":
        return _module("failover").peer_markdown
    return _module(suite).markdown


def targets_table(reports: List[Dict[str, Any]], only_misses: bool = False) -> Table:
    t = Table(title="targets" + (" missed" if only_misses else ""))
    for c in ("figure", "value", "target", "met", "detail"):
        t.add_column(c, overflow="fold")
    for rep in reports:
        for x in rep.get("targets", []):
            if only_misses and x["met"] is True:
                continue
            met = {True: "[green]yes[/]", False: "[red]NO[/]", None: "[yellow]no value[/]"}[x["met"]]
            t.add_row(x["figure"], C.fmt(x["value"], 3) if isinstance(x["value"], float) else str(x["value"]),
                      x["target"], met, x.get("detail", ""))
    return t


def load_reports(out: Path, skipped: Optional[List[str]] = None) -> List[Tuple[str, Dict[str, Any]]]:
    """``(suite, report)`` for every suite whose JSON is in ``out``; a file that cannot be read
    is left out and its error appended to ``skipped``."""
    reports = []
    for s in REPORT_SUITES:
        try:
            r = C.load_report(out, s)
        except C.BenchError as e:
            if skipped is not None:
                skipped.append(str(e))
            continue
        if r:
            reports.append((s, r))
    return reports


def summary_markdown(out: Path, skipped: Optional[List[str]] = None) -> str:
    """Markdown of every suite's latest JSON in ``out``: machine, commands, missed targets,
    then each suite's tables and plots (unreadable files are left out, see :func:`load_reports`)."""
    reports = load_reports(out, skipped)
    if not reports:
        return "(no results)\n"
    m0 = reports[0][1]["machine"]
    L = [f"Machine: {C.machine_line(m0)}\n",
         f"Plugin: `{m0['plugin']}` (sha256 {m0.get('plugin_sha256')}…, built {m0.get('plugin_mtime')}"
         + (f", from commit {m0['native_commit']}" if m0.get("native_commit") else "") + ")\n"]
    L.append("| suite | command | started | took | load average at start / end (1 min) |")
    L.append("|---|---|---|---:|---|")
    for s, r in reports:
        m = r["machine"]
        took = f"{r['elapsed_s']:.0f} s" + (f" (**interrupted**, {r['interrupted']})" if r.get("interrupted") else "")
        L.append(f"| {s} | `{r['command']}` | {r['started']} | {took} | "
                 f"{m['loadavg_at_start'][0]} / {m.get('loadavg_at_end', ['-'])[0]} |")
    L.append("\n### Targets missed\n")
    miss = [(s, t) for s, r in reports for t in C.misses(r)]
    cut = [(s, r) for s, r in reports if r.get("interrupted")]
    for s, r in cut:
        L.append(f"- **{s}: interrupted ({r['interrupted']}) after {r['elapsed_s']:.0f} s**: a partial report, "
                 + ("its targets not evaluated" if not r.get("targets") else "only the targets added before the "
                    "interrupt") + ": not a full run.")
    if not miss and not cut:
        L.append("None.\n")
    for s, t in miss:
        v = t["value"]
        vs = C.fmt(v, 3) if isinstance(v, float) else str(v)
        L.append(f"- **{t['figure']}**: {vs} (target {t['target']}). {t.get('detail', '')}")
    L.append("\n### Every target\n")
    L.append("| figure | value | target | met |")
    L.append("|---|---:|---|---|")
    for s, r in reports:
        for t in r.get("targets", []):
            v = t["value"]
            vs = C.fmt(v, 3) if isinstance(v, float) else str(v)
            L.append(f"| {t['figure']} | {vs} | {t['target']} | {'yes' if t['met'] else ('**no**' if t['met'] is False else 'no value')} |")
    for s, r in reports:
        L.append(f"\n## {s}\n")
        checked = r["settings"].get("check", True)
        L.append(f"`{r['command']}` — {r['elapsed_s']:.0f} s, "
                 + (f"wrong bytes {r['wrong_bytes']}\n" if checked is not False else "data not checked (-c 0)\n"))
        if r.get("inherited_env"):
            L.append("Plugin variables from the caller's environment, in every rank unless the suite sets its own: "
                     + ", ".join(f"`{k}={v}`" for k, v in r["inherited_env"].items()) + "\n")
        if r.get("interrupted"):
            parts = C.completed_parts(r)
            L.append(f"**Interrupted ({r['interrupted']}) after {r['elapsed_s']:.0f} s: a partial report**"
                     + ("" if r.get("targets") else ", its targets not evaluated")
                     + ". Parts finished: " + ("; ".join(parts) if parts else "none") + ".\n")
            if not parts:
                continue
            try:  # a suite's tables expect every part; draw them when the finished parts suffice
                L.append(_markdown(s)(r))
            except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
                L.append(f"(tables not drawn from the partial results: {type(e).__name__} {e}; the JSON keeps them)\n")
            continue
        L.append(_markdown(s)(r))
        for p in r.get("plots", []):
            L.append(f"![{p}](bench/{p})")
    return "\n".join(L) + "\n"


def _run_suite(suite: str, out: Path, quick: bool, console: Console, **kw) -> Optional[Dict[str, Any]]:
    from railover.testbed.netns import PrivilegeError
    problem = out_dir_problem(out)  # before any bed is built: a bad -o must not cost a boot and end in a traceback
    if problem:
        console.print(f"[red]cannot use -o {escape(str(out))}:[/] {escape(problem)}")
        raise typer.Exit(2)
    mark = C.report_mark()
    inherited = {} if suite in C._OWN_ENV_SUITES else C.inherited_plugin_env()
    try:
        problem = params.refusal(inherited) if inherited else None
    except OSError:  # no loadable plugin: the suite says so itself
        problem = None
    if problem:  # before a bed is built: every rank would fail its init
        console.print(f"[red]{suite} cannot run:[/] {escape(problem)} (unset it, or give a value it accepts)")
        raise typer.Exit(2)
    if inherited:  # the numbers are not the defaults': say so before they are measured
        console.print(f"[yellow]{suite}: the ranks inherit "
                      + ", ".join(f"{k}={v}" for k, v in inherited.items())
                      + " from this shell[/] (unless the suite sets its own): the results are not the plugin "
                      "defaults'; unset them (or run without sudo -E) to measure the defaults. The report lists them.")
    try:
        with signals_unwind():
            return _module(suite).run(out, quick=quick, console=console, **kw)
    except KeyboardInterrupt:
        _keep_interrupted(suite, "SIGINT", console, mark)
        raise typer.Exit(130)
    except SystemExit as e:  # SIGTERM/SIGHUP (signals_unwind, or a test bed's handler while it is up)
        if e.code in SIGNAL_EXITS:
            _keep_interrupted(suite, SIGNAL_EXITS[e.code], console, mark)
        raise
    except PrivilegeError as e:
        console.print(f"[red]cannot build the test bed:[/] {escape(str(e))}\nrun as root (network namespaces need CAP_NET_ADMIN)")
        raise typer.Exit(2)
    except C.BenchError as e:
        console.print(f"[red]{suite} could not run:[/] {escape(str(e))}")
        raise typer.Exit(2)
    except OSError as e:
        # A file error while the suite was stopping after an interrupt (its output directory
        # removed under it): say so instead of a traceback that hides the interrupt. Any other
        # OSError is the entry point's to report (a missing native file: one line, exit 2).
        ctx = e.__context__
        if isinstance(ctx, KeyboardInterrupt):
            was = "Ctrl-C"
        elif isinstance(ctx, SystemExit) and ctx.code in SIGNAL_EXITS:
            was = SIGNAL_EXITS[ctx.code]
        else:
            raise
        console.print(f"[red]{suite} could not stop cleanly after {was}:[/] {escape(str(e))}")
        _keep_interrupted(suite, was if was != "Ctrl-C" else "SIGINT", console, mark)
        raise typer.Exit(2)


def _keep_interrupted(suite: str, why: str, console: Console, mark: int) -> None:
    """Write the partial report (its finished parts) of every report created since ``mark``
    (:func:`C.report_mark` when the suite started) and not finished, and say where. The test
    bed was torn down before the interrupt got here (TestBed's ``with``). A report with no
    finished part writes nothing: an earlier report of the suite stays as it was."""
    since = C.reports_since(mark)
    reps = [r for r in since if not r.finished]
    if not reps:
        done = [r for r in since if r.finished]
        if done:
            console.print(f"[yellow]{suite} interrupted ({why}) after its report was written[/]: "
                          + ", ".join(escape(str(r.path)) for r in done) + " (complete; its tables were not printed: "
                          "`railover bench report` draws them)")
        else:
            console.print(f"[yellow]{suite} interrupted ({why}) before it had results: nothing written[/]")
    for rep in reps:
        try:
            path, kept = rep.save_interrupted(why)
        except OSError as e:
            console.print(f"[red]{rep.suite} interrupted ({why}); its partial report could not be written:[/] "
                          f"{escape(e.strerror or str(e))}")
            continue
        took = f"after {rep.data['elapsed_s']:.0f} s" if rep.data.get("elapsed_s") is not None else ""
        if path is None:
            console.print(f"[yellow]{rep.suite} interrupted ({why}) before any part finished[/]: nothing written"
                          + (f"; {escape(str(rep.path))} (an earlier run's) is left as it was" if rep.path.exists()
                             else ""))
            continue
        parts = C.completed_parts(rep.data)
        console.print(f"[yellow]{rep.suite} interrupted ({why}) {took}[/]: partial report {escape(str(path))} ("
                      + "; ".join(parts) + ")" + ("" if rep.data.get("targets") else "; targets not evaluated")
                      + (f"; the earlier complete report is kept as {escape(str(kept))}" if kept else ""))


def _finish(reports: List[Dict[str, Any]], console: Console) -> None:
    misses = targets_table(reports, only_misses=True)
    if misses.row_count:  # an empty "targets missed" table (its header alone) said nothing
        console.print(misses)
    wrong = sum(r["wrong_bytes"] for r in reports)
    missed = sum(len(C.misses(r)) for r in reports)
    console.print(f"wrong bytes: {wrong}; targets missed: {missed}")
    raise typer.Exit(1 if missed or wrong else 0)


def _console() -> Console:
    return Console(width=max(160, shutil.get_terminal_size((160, 24)).columns))


def register(app: typer.Typer) -> None:
    bench = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="Benchmarks (as root, or in an unprivileged user namespace where the kernel allows one): healthy overhead, failover, degraded bandwidth, failback, "
                             "false failovers, scale. Results: <out>/<suite>.json and PNG plots. Exit status: 0 "
                             "when every figure meets its target, 1 when some miss, 2 when a suite could not run, "
                             "130 after Ctrl-C (143 SIGTERM, 129 SIGHUP) with the finished parts kept in "
                             "<out>/<suite>.json, marked interrupted. Ranks on the network-namespace beds inherit "
                             "the RAILOVER_*/NCCL_* plugin variables of this shell (listed as inherited_env in each "
                             "report).")
    app.add_typer(bench, name="bench")

    OUT = typer.Option(Path("railover-bench"), "--out", "-o", help="output directory")
    QUICK = typer.Option(False, "--quick", help="tiny sizes and counts (smoke test)")

    def _csv_ints(s: str, option: str, lo: int = 1, hi: Optional[int] = None) -> List[int]:
        """A comma list of integers lo..hi (exit 2 naming ``option`` otherwise, or when empty)."""
        try:
            vals = [int(x) for x in csv_list(s, option)]
        except ValueError:
            vals = []
        if not vals or min(vals) < lo or (hi is not None and max(vals) > hi):
            what = f"integers {lo}..{hi}" if hi is not None else "positive integers"
            raise typer.BadParameter(f"{s!r}: expected a comma list of {what}, e.g. 1,64,256", param_hint=option)
        return vals

    def _plugin_ints(s: str, option: str, variable: str) -> List[int]:
        """:func:`_csv_ints`, each value also in the range of the plugin's ``variable`` (its
        parameter table), which the ranks get it as: exit 2 naming ``option`` otherwise."""
        vals = _csv_ints(s, option)
        check = plugin_range(variable)
        try:
            for v in vals:
                check(v)
        except typer.BadParameter as e:
            raise typer.BadParameter(e.message, param_hint=option) from None
        return vals

    def _csv(s: str, option: Optional[str] = None) -> List[str]:
        """A comma list's items; with ``option`` an empty list is refused (exit 2) naming it."""
        if option is not None:
            return csv_list(s, option)
        return [x.strip() for x in s.split(",") if x.strip()]

    def _tcp_only(ctx: typer.Context, transport: str, *names: str) -> None:
        """Refuse (exit 2) the options among ``names`` given with --transport rdma."""
        if transport == "rdma":
            refuse_given(ctx, list(names), "to the TCP beds only, not to --transport rdma")

    def _rdma_kinds(kinds: str) -> List[str]:
        """``--kinds`` for the RDMA test bed: refused (exit 2) when empty or naming a kind it has not."""
        from railover.bench import rdma as R
        ks = _csv(kinds)
        bad = [k for k in ks if k not in R.KINDS]
        if bad or not ks:
            raise typer.BadParameter(f"{', '.join(bad) or 'no kind given'}: not a fault kind of the RDMA test bed "
                                     f"(--transport rdma); its kinds: {', '.join(R.KINDS)}", param_hint="--kinds")
        return ks

    TRANSPORT = typer.Option("tcp", "--transport", help="tcp (network-namespace beds) or rdma (the RDMA test bed: "
                             "2 QEMU guests with Soft-RoCE; runs this suite's part of `railover bench rdma`)")

    def _rdma_part(suite: str, transport: str, console: Console, out: Path, quick: bool, phases: List[str],
                   **kw) -> bool:
        """--transport: False for tcp (the caller runs its own suite); for rdma runs the part of
        the rdma suite that measures what ``suite`` measures and exits; a suite with no RDMA
        counterpart yet is refused with what exists instead."""
        if transport == "tcp":
            return False
        if transport != "rdma":
            raise typer.BadParameter(f"unknown transport {transport!r}; tcp or rdma", param_hint="--transport")
        if not phases:
            raise typer.BadParameter(
                f"`bench {suite}` is not measured on the RDMA test bed yet; on RDMA, `railover bench rdma` measures "
                "convergence, the bare RC timeout and busbw, and tests/rdma/test_rdma_transport.py checks congestion "
                "and a stopped peer (no failover)", param_hint="--transport")
        console.print(f"[dim]bench {suite} --transport rdma: `railover bench rdma --phases {','.join(phases)}` "
                      f"on the RDMA test bed[/]")
        rep = _run_suite("rdma", out, quick, console, phases=phases, **kw)
        _finish([rep], console)
        return True

    @bench.command("healthy")
    def healthy_cmd(ctx: typer.Context, out: Path = OUT, quick: bool = QUICK,
                    rounds: int = typer.Option(0, "--rounds", min=0, help="interleaved rounds (0: 3, or 1 with --quick)"),
                    networks: str = typer.Option("loopback,veth", "--networks", help="loopback, veth"),
                    ranks: str = typer.Option("2,4", "--ranks", help="rank counts"),
                    workloads: str = typer.Option("sendrecv,allreduce", "--workloads", help="sendrecv, allreduce"),
                    nstreams: str = typer.Option("1,2,4", "--nstreams", help="RAILOVER_NSTREAMS values to compare (2 ranks)"),
                    against: Optional[Path] = typer.Option(None, "--against", help="another railover plugin (the .so, or "
                                                           "the build directory holding it), e.g. from before a change: "
                                                           "measured interleaved, ratios armed/against"),
                    transport: str = TRANSPORT):
        """busbw 8 B..256 MiB and small-message latency: standby armed vs RAILOVER_STANDBY=none vs
        iperf3 (same flows, same stream count), loopback and veth, 2 and 4 ranks; NSTREAMS 1/2/4;
        with --against, this build vs another one side by side. --transport rdma: busbw of the
        RDMA transport vs TCP vs ib_write_bw on the RDMA test bed (only --rounds applies)."""
        console = _console()
        _tcp_only(ctx, transport, "networks", "ranks", "workloads", "nstreams", "against")
        if _rdma_part("healthy", transport, console, out, quick, ["busbw"], rounds=rounds or None):
            return
        rep = _run_suite("healthy", out, quick, console, rounds=rounds or None, networks=_csv(networks, "--networks"),
                         ranks=_csv_ints(ranks, "--ranks"), workloads=_csv(workloads, "--workloads"),
                         nstreams=_plugin_ints(nstreams, "--nstreams", "RAILOVER_NSTREAMS"), against=against)
        _finish([rep], console)

    @bench.command("failover")
    def failover_cmd(ctx: typer.Context, out: Path = OUT, quick: bool = QUICK,
                     faults: int = typer.Option(0, "--faults", "-n", min=0, max=1000, help="faults per kind (0: 50, or 3 with --quick)"),
                     kinds: str = typer.Option("port-down,host-down,addr-del,silent,one-way", "--kinds",
                                               help="port-down, host-down, addr-del, silent, one-way; with --transport "
                                                    "rdma: cable-pull, admin-down, silent, one-way, remote-cable-pull"),
                     size: str = typer.Option("1M", "--size", help="all-reduce size (with --transport rdma: 256K "
                                              "unless given)"),
                     peer: str = typer.Option("", "--peer", help="'mptcp': the same faults, same bed, same run, against "
                                              "Linux MPTCP with a backup subflow (kinds port-down,silent)"),
                     outage_s: Optional[float] = typer.Option(None, "--outage-s", callback=positive, show_default=False,
                                                              help="with --peer: rail-0 outage before the "
                                                    "second fault (default 60, or 5 with --quick)"),
                     against: Optional[Path] = typer.Option(None, "--against", help="another railover plugin (the .so, "
                                                            "or a build directory holding it): the same faults, "
                                                            "interleaved, compared per kind"),
                     transport: str = TRANSPORT):
        """N injected faults per kind under a checked ring all-reduce: detection, convergence,
        stall, bytes resent (p50/p99/max), wrong bytes. With --peer mptcp: railover and MPTCP
        side by side (survived, stall, failback, a second fault after a long outage). With
        --against: this build and another one, the same faults interleaved, compared per kind.
        --transport rdma: convergence per fault kind on the RDMA test bed and the bare RC timeout
        (kinds cable-pull, admin-down, silent, one-way, remote-cable-pull; default the first three;
        --faults and --size apply)."""
        console = _console()
        check_size(size)  # before any bed is built
        _tcp_only(ctx, transport, "peer", "outage_s", "against")
        # On rdma the suite's own defaults apply unless given: its fault kinds, and 256K (TCG guests).
        kw: Dict[str, Any] = {}
        if transport == "rdma" and given(ctx, "kinds"):
            kw["kinds"] = _rdma_kinds(kinds)
        if transport == "rdma" and given(ctx, "size"):
            kw["size"] = size
        if _rdma_part("failover", transport, console, out, quick, ["convergence", "bare"], faults=faults or None, **kw):
            return
        if peer and against:
            raise typer.BadParameter("--peer and --against cannot be combined: run them one at a time")
        if not peer and given(ctx, "outage_s"):
            raise typer.BadParameter("--outage-s applies with --peer mptcp only", param_hint="--outage-s")
        if peer:
            if peer != "mptcp":
                raise typer.BadParameter(f"unknown peer {peer!r}; the only peer is 'mptcp'")
            from railover.bench import failover as fo
            pk = list(fo.PEER_KINDS)
            if given(ctx, "kinds"):
                pk = _csv(kinds, "--kinds")
                bad = [k for k in pk if k not in fo.PEER_KINDS]
                if not pk:
                    raise typer.BadParameter("no kind given", param_hint="--kinds")
                if bad:
                    raise typer.BadParameter(f"--kinds {kinds} cannot be combined with --peer mptcp: "
                                             f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not run against "
                                             f"MPTCP (its kinds: {', '.join(fo.PEER_KINDS)})")
            mark = C.report_mark()
            try:
                from railover.bench.mptcp import MptcpError
                with signals_unwind():
                    rep = fo.run_peers(out, quick=quick, faults=faults or None, kinds=pk, size=size,
                                       outage_s=outage_s, console=console)
            except KeyboardInterrupt:
                _keep_interrupted("failover-peers", "SIGINT", console, mark)
                raise typer.Exit(130)
            except SystemExit as e:
                if e.code in SIGNAL_EXITS:
                    _keep_interrupted("failover-peers", SIGNAL_EXITS[e.code], console, mark)
                raise
            except MptcpError as e:
                console.print(f"[red]the MPTCP peer could not run:[/] {escape(str(e))}")
                # railover's half, measured before MPTCP was set up, stays readable
                _keep_interrupted("failover-peers", f"the MPTCP peer could not run: {e}", console, mark)
                raise typer.Exit(2)
            except C.BenchError as e:
                console.print(f"[red]failover --peer mptcp could not run:[/] {escape(str(e))}")
                raise typer.Exit(2)
            _finish([rep], console)
        rep = _run_suite("failover", out, quick, console, faults=faults or None, kinds=_csv(kinds, "--kinds"), size=size,
                         against=against)
        _finish([rep], console)

    @bench.command("degraded")
    def degraded_cmd(out: Path = OUT, quick: bool = QUICK,
                     nics: str = typer.Option("2,4", "--nics", help="NICs per host"),
                     rate: str = typer.Option("200mbit", "--rate", help="line rate of every NIC (tc tbf); 'none' for unshaped veth"),
                     transport: str = TRANSPORT):
        """busbw during a NIC fault relative to before, 2 and 4 NICs per host, comms spread over
        the survivors (default) vs all onto one buddy (explicit RAILOVER_STANDBY pairs)."""
        console = _console()
        _rdma_part("degraded", transport, console, out, quick, [])
        ns = _csv_ints(nics, "--nics")
        if min(ns) < 2:
            raise typer.BadParameter(f"{nics}: 1 NIC per host leaves no standby NIC to fail over to, so nothing is "
                                     "degraded; give 2 or more per host (e.g. 2,4)", param_hint="--nics")
        rep = _run_suite("degraded", out, quick, console, nics=ns, rate=rate)
        _finish([rep], console)

    @bench.command("failback")
    def failback_cmd(ctx: typer.Context, out: Path = OUT, quick: bool = QUICK,
                     faults: int = typer.Option(0, "--faults", "-n", min=0, max=1000, help="repairs per kind (0: 10, or 2 with --quick)"),
                     kinds: str = typer.Option("port-down,silent", "--kinds", help="port-down, host-down, addr-del, silent, one-way; "
                                               "with --transport rdma: as bench failover --transport rdma"),
                     hold_down_ms: int = typer.Option(3000, "--hold-down-ms", min=0, callback=plugin_range("RAILOVER_HOLD_DOWN_MS"), help="RAILOVER_HOLD_DOWN_MS of the runs, ms "
                                                      "(3000 is the plugin's default; with --transport rdma: 1000, "
                                                      "the RDMA suite's, unless given)"),
                     transport: str = TRANSPORT):
        """Repair -> traffic back on the primary, minus the hold-down; busbw after failback
        relative to before the fault. --transport rdma: the RDMA test bed's fault cycles, whose
        table has the failback convergence per kind (--faults, --hold-down-ms apply; kinds as
        `bench failover --transport rdma`)."""
        console = _console()
        # On rdma the suite's own defaults apply unless given: its fault kinds, and its hold-down (1000 ms).
        kw: Dict[str, Any] = {}
        if transport == "rdma" and given(ctx, "kinds"):
            kw["kinds"] = _rdma_kinds(kinds)
        if transport == "rdma" and given(ctx, "hold_down_ms"):
            kw["hold_down_ms"] = hold_down_ms
        if _rdma_part("failback", transport, console, out, quick, ["convergence"], faults=faults or None, **kw):
            return
        rep = _run_suite("failback", out, quick, console, faults=faults or None, kinds=_csv(kinds, "--kinds"),
                         hold_down_ms=hold_down_ms)
        _finish([rep], console)

    @bench.command("false-failover")
    def false_cmd(out: Path = OUT, quick: bool = QUICK, transport: str = TRANSPORT):
        """Congestion (iperf3 -P 4 on the primary rail), a tbf-limited rail, a receiver that
        stops posting for 5 s, a SIGSTOPped peer: failovers counted (target 0)."""
        console = _console()
        _rdma_part("false-failover", transport, console, out, quick, [])
        rep = _run_suite("false-failover", out, quick, console)
        _finish([rep], console)

    @bench.command("scale")
    def scale_cmd(ctx: typer.Context, out: Path = OUT, quick: bool = QUICK,
                  comms: str = typer.Option("1,32,128,512,1024", "--channels", "--comms",
                                            help="channels per process; each is 1 send + 1 receive comm (targets judged at 512 = 1024 comms)"),
                  idle_s: float = typer.Option(0.0, "--idle-seconds", min=0, callback=finite, help="idle CPU window (0: 10, or 1 with --quick)"),
                  transport: str = TRANSPORT):
        """2..2048 comms per process (1..1024 channels): connect time, memory per comm, CPU of idle standby probing,
        time until every comm on a failed NIC has converged."""
        console = _console()
        _rdma_part("scale", transport, console, out, quick, [])
        from railover.bench.scale import MAX_CHANNELS
        channels = _csv_ints(comms, "--channels", hi=MAX_CHANNELS)
        big = [c for c in channels if c > 16]
        if quick and big and given(ctx, "comms"):
            raise typer.BadParameter(f"--channels {','.join(map(str, big))} cannot be combined with --quick: --quick "
                                     "runs at most 16 channels per process (drop one or the other)")
        rep = _run_suite("scale", out, quick, console, comms=channels, idle_s=idle_s or None)
        _finish([rep], console)

    from railover.bench.rdma import DEFAULT_BW_VARIANTS as DEFAULT_RDMA_BW_VARIANTS

    @bench.command("rdma")
    def rdma_cmd(ctx: typer.Context, out: Path = OUT, quick: bool = QUICK,
                 faults: int = typer.Option(0, "--faults", "-n", min=0, max=1000, help="faults per kind (0: 30, or 5 with --quick)"),
                 kinds: str = typer.Option("cable-pull,admin-down,silent", "--kinds",
                                           help="cable-pull, admin-down, silent, one-way, remote-cable-pull"),
                 size: str = typer.Option("256K", "--size", help="all-reduce size of the convergence run"),
                 faults_per_run: int = typer.Option(10, "--faults-per-run", min=0, help="faults per checked run (a guest "
                                                    "crash leaves at most this many faults with unchecked bytes); 0: "
                                                    "all in one run"),
                 bw_sizes: str = typer.Option("", "--bw-sizes", help="busbw sizes (default 64K,1M,4M, or 1M with --quick)"),
                 rounds: int = typer.Option(0, "--rounds", min=0, help="interleaved busbw rounds (0: 2, or 1 with --quick)"),
                 bare: int = typer.Option(2, "--bare-faults", min=0, help="cable pulls with RAILOVER_STANDBY=none"),
                 bare_bound_s: float = typer.Option(0, "--bare-bound-s", min=0, callback=finite, help="wait for the bare RC error (0: 90 s, or 45 with --quick)"),
                 bare_retry_cnt: Optional[int] = typer.Option(None, "--bare-retry-cnt", min=0, max=7, show_default=False,
                                                              help="NCCL_IB_RETRY_CNT for the bare RC "
                                                    "runs (default: the plugin's, NCCL's 7 = retry forever on rxe)"),
                 phases: str = typer.Option("convergence,bare,busbw", "--phases", help="convergence, bare, busbw"),
                 bw_variants: str = typer.Option(",".join(DEFAULT_RDMA_BW_VARIANTS), "--bw-variants",
                                                 help="busbw variants: rdma (ring, both ways), rdma_oneway (A to B "
                                                      "only, like ib_write_bw), rdma_idle_sleep, rdma_oneway_idle_sleep "
                                                      "(the driver sleeps 50 us when idle), rdma_qps4 (4 QPs per path), "
                                                      "tcp, ib_write_bw, ib_write_bw_bidi, ib_write_bw_qps4 (-q 4)"),
                 wire: str = typer.Option("stream", "--wire", help="the bed's NIC wires: stream (lossless, as RoCE "
                                          "with PFC) or udp (drops frames when the host's socket buffer overflows)")):
        """The RDMA verbs transport on the RDMA test bed (2 QEMU guests, Soft-RoCE): convergence per
        fault kind under a checked all-reduce, the bare RC timeout (RAILOVER_STANDBY=none), busbw of
        rdma vs tcp vs ib_write_bw on the same rxe devices."""
        check_size(size, what="the convergence all-reduce")  # before the guests boot
        for s in _csv(bw_sizes):
            check_size(s, "--bw-sizes", "a busbw measurement")
        # an option of a phase that does not run is a contradiction, not something to drop
        ph = _csv(phases, "--phases")
        for phase, names in (("convergence", ["faults", "kinds", "faults_per_run"]),
                             ("bare", ["bare", "bare_bound_s", "bare_retry_cnt"]),
                             ("busbw", ["bw_sizes", "rounds", "bw_variants"])):
            if phase not in ph:
                refuse_combined(ctx, "phases", names, f"--phases {phases} leaves out the {phase} phase they set")
        if "convergence" not in ph and "bare" not in ph:
            refuse_combined(ctx, "phases", ["size"], f"--phases {phases} leaves out the convergence and bare phases "
                                                     "it sets")
        if bare == 0:
            refuse_combined(ctx, "bare", ["bare_bound_s", "bare_retry_cnt"], "--bare-faults 0 runs no bare RC fault")
        console = _console()
        kind_list = _csv(kinds, "--kinds")
        variants = _csv(bw_variants, "--bw-variants")
        rep = _run_suite("rdma", out, quick, console, faults=faults or None, kinds=kind_list, size=size,
                         bw_sizes=_csv(bw_sizes) or None, rounds=rounds or None, bare_faults=bare,
                         bare_bound_s=bare_bound_s or None, phases=ph,
                         bare_retry_cnt=bare_retry_cnt,
                         bw_variants=variants, wire=wire, faults_per_run=faults_per_run)
        _finish([rep], console)

    @bench.command("all")
    def all_cmd(out: Path = OUT, quick: bool = QUICK,
                suites: str = typer.Option(",".join(SUITES), "--suites", help="comma list of suites")):
        """Every suite in turn, then <out>/summary.md (the tables of docs/BENCHMARKS.md)."""
        console = _console()
        reports = []
        chosen = _csv(suites, "--suites")
        for s in chosen:
            if s not in SUITES:
                raise typer.BadParameter(f"unknown suite {s!r}; one of {', '.join(SUITES)}", param_hint="--suites")
        def write_summary() -> None:
            skipped: List[str] = []
            (Path(out) / "summary.md").write_text(summary_markdown(Path(out), skipped))
            for e in skipped:
                console.print(f"[yellow]left out of summary.md:[/] {escape(str(e))}")
            console.print(f"wrote {escape(str(Path(out) / 'summary.md'))}")

        for s in chosen:
            t0 = time.monotonic()
            console.rule(f"railover bench {s}")
            try:
                with signals_unwind():  # SIGTERM/SIGHUP between suites too
                    reports.append(_run_suite(s, out, quick, console))
            except typer.Exit as e:
                if e.exit_code == 130:  # Ctrl-C: the suites run so far and the partial one stay readable
                    write_summary()
                raise
            except SystemExit as e:
                if e.code in SIGNAL_EXITS:
                    write_summary()
                raise
            console.print(f"{s}: {time.monotonic() - t0:.0f} s")
        write_summary()
        _finish(reports, console)

    @bench.command("report")
    def report_cmd(out: Path = OUT):
        """Rebuild <out>/summary.md from the suites' JSON files and list the missed targets."""
        console = _console()
        out = Path(out)
        if not out.is_dir():
            raise typer.BadParameter(f"{out}: {'not a directory' if out.exists() else 'no such directory'}",
                                     param_hint="--out")
        skipped: List[str] = []
        reports = [r for _s, r in load_reports(out, skipped)]
        for e in skipped:
            console.print(f"[yellow]skipped:[/] {escape(str(e))}")
        if not reports:
            console.print(f"[red]no results in {out}[/]: " + ("no suite's JSON could be read" if skipped else
                          "none of " + ", ".join(f"{s}.json" for s in REPORT_SUITES) + " is there (run a suite with "
                          f"--out {out} first)"))
            raise typer.Exit(2)
        try:
            text = summary_markdown(out)
            misses = targets_table(reports, only_misses=True)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            # load_report checks a report's top-level fields only; a hand-made or hand-edited
            # file can still lack what a suite's tables read
            what = f"field {e.args[0]!r} missing" if isinstance(e, KeyError) and e.args else f"{type(e).__name__}: {e}"
            console.print(f"[red]cannot summarise {escape(str(out))}:[/] a suite's JSON is not as railover bench "
                          f"writes it ({escape(what)}); run the suite again or remove that file")
            raise typer.Exit(2)
        try:
            (out / "summary.md").write_text(text)
        except OSError as e:
            console.print(f"[red]cannot write {out / 'summary.md'}:[/] {e.strerror or e}")
            raise typer.Exit(2)
        console.print(f"wrote {escape(str(out / 'summary.md'))} ({len(reports)} suite(s))")
        for r in reports:
            if r.get("interrupted"):
                parts = C.completed_parts(r)
                console.print(f"[yellow]{r['suite']}.json is a partial report[/] (interrupted, {r['interrupted']}, after "
                              f"{r['elapsed_s']:.0f} s; finished: {'; '.join(parts) or 'nothing'})"
                              + ("" if r.get("targets") else ": its targets were not evaluated")
                              + "; summary.md lists it under the targets missed")
        console.print(misses)
