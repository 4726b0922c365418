"""Operator commands: ``railover status``, ``exporter``, ``doctor``, ``launch``, ``drill``.

``railover.cli`` imports this module and calls :func:`register`. The logic lives in
``state``, ``exporter``, ``doctor`` and ``drill``; this module parses options and renders.

Exit codes: 0 success; 1 ``doctor`` found a blocking problem / ``drill`` ran but railover did
not behave (no failover, no failback, a fatal error); 2 usage errors and refusals (``drill``
without ``--yes``, or with no railover process on the NIC and no ``--force``; ``launch`` with
conflicting NCCL settings); 3 ``drill`` could not restore the NIC; 126 ``launch`` found the
command but cannot run it (not executable, a directory, no program); 127 ``launch`` could not
find it (or the interpreter its ``#!`` line names).
"""
from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from railover import _paths, envvars, params
from railover._cliutil import finite, positive, refuse_given
from railover.ops import state as st

_console = Console(width=max(100, shutil.get_terminal_size((140, 24)).columns))
_STYLE = {"OK": "green", "WARN": "yellow", "FAIL": "bold red", "INFO": "cyan"}
_HEALTH_STYLE = {"ok": "green", "failed-over": "yellow", "unprotected": "yellow", "down": "bold red", "fatal": "bold red"}


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _dirs(state_dir: Optional[List[Path]]) -> List[Path]:
    return list(state_dir) if state_dir else st.default_state_dirs()


def _existing_dirs(value: Optional[List[Path]]) -> Optional[List[Path]]:
    """Typer callback of ``status --state-dir``: a directory the user names must be one (exit
    2 naming it), or status would report "no state files" for a typo. A missing default
    directory (no job ever ran here) and a missing ``$RAILOVER_STATE_DIR`` stay warnings."""
    for d in value or ():
        kind, why = st.path_kind(d)
        if kind != "dir":
            raise typer.BadParameter(f"{d}: " + {"file": "not a directory", "missing": "no such directory"}.get(
                kind, f"cannot be looked at ({why}): is a directory above it closed to this user?"))
    return value


def _watch_interval(value: float) -> float:
    """Typer callback of ``status --interval``: a finite number of seconds, 0.1 to 86400 (a
    day). A smaller one redrew the screen in a busy loop (1e-9 was taken); nan was refused as
    "should be <= 86400" (found by a fresh-user trial)."""
    finite(value)
    if not 0.1 <= value <= 86400:
        raise typer.BadParameter(f"{value:g} is not in the range 0.1<=x<=86400 (seconds).")
    return value


def _path_warnings(state_dir: Optional[List[Path]], dirs: List[Path], journal: Optional[List[Path]]) -> List[str]:
    """Problems with the directories and journals the user named (``--state-dir``,
    ``RAILOVER_STATE_DIR``, ``--journal``): missing, or a state dir that is a file. The
    plugin's default directories may be missing (no job ran there): not a warning."""
    out = []
    named = state_dir or os.environ.get("RAILOVER_STATE_DIR", "").strip(" \t")
    for d in dirs if named else []:
        kind, why = st.path_kind(d)
        if kind == "missing":
            out.append(f"state dir {d} does not exist")
        elif kind == "file":
            out.append(f"state dir {d} is not a directory")
        elif kind == "unreachable":
            out.append(f"state dir {d} cannot be looked at ({why}): is a directory above it closed to this user?")
    for j in journal or ():
        try:
            j.stat()
        except (FileNotFoundError, NotADirectoryError):
            out.append(f"journal {j} does not exist")
        except OSError:  # e.g. EACCES: the readers report it (railover.ops.state.journal_files)
            pass
    return out


def _ms(us: Any) -> str:
    """A time in µs as milliseconds for a table cell: '-' when absent, not positive or not a
    finite number (a garbled journal's Infinity or NaN, an int beyond a float's range)."""
    try:
        v = int(us)
        return "-" if v <= 0 else f"{v / 1000:.1f}"
    except (TypeError, ValueError, OverflowError):
        return "-"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# --------------------------------------------------------------------------- status

def render_status(snap: Dict[str, Any], show_comms: bool = False) -> Group:
    """Rich renderables for a :func:`railover.ops.state.snapshot`: per host a NIC table and a
    process table (and every comm with ``show_comms``; otherwise only comms that are not
    ok), then the recent journal events."""
    parts: List[Any] = []
    tot = snap["totals"]
    parts.append(Text(f"state dirs: {', '.join(snap['state_dirs']) or '(none)'}   live processes: {tot['processes']}   "
                      f"stale files: {tot['stale_processes']}   comms: {tot['comms']} "
                      f"(failed over {tot['failed_over']}, unprotected {tot['unprotected']})   "
                      f"failovers {tot['failovers']} failbacks {tot['failbacks']} flaps {tot['flaps']} "
                      f"fatal {tot['fatal_errors']}"))
    if not snap["hosts"]:
        if snap["errors"]:
            msg = f"no readable railover state file: {len(snap['errors'])} could not be read (see below)"
        elif not snap["state_dirs"]:
            msg = ("state files are off (RAILOVER_STATE_DIR=off): railover processes write none; "
                   "pass --state-dir to read a directory")
        else:
            msg = "no railover state files found (is a job running? is RAILOVER_STATE_DIR the same as the job's?)"
        parts.append(Text(msg, style="yellow"))
    for host, h in sorted(snap["hosts"].items()):
        if all(p["stale"] for p in h["processes"]):
            parts.append(Text(f"host {host}: no live railover process", style="dim"))
            for p in h["processes"]:
                parts.append(Text(f"stale state file: pid {p['pid']}: {p['stale_reason']}", style="dim"))
            continue
        t = Table(title=Text(f"host {host}: NICs"), title_justify="left")
        # With RDMA, the HCA port behind each NIC with its state, and its GID (RoCE) or LID
        # (InfiniBand); without, the table is as before.
        rdma = any(n.get("rdma") for n in h["nics"])
        for c in ("NIC", "address", "rail", "link") + (("HCA port", "GID / LID") if rdma else ()) + \
                 ("active paths", "standby paths", "failed paths", "pairs down", "processes"):
            t.add_column(c, no_wrap=True)
        for n in h["nics"]:
            port_cells: Tuple[Any, ...] = ()
            if rdma:
                rd = n.get("rdma")
                hca, addr = st.rdma_port_text(rd)
                if not rd and n.get("transport") == "tcp":  # RAILOVER_TRANSPORT=rdma+tcp: no RDMA port behind it
                    hca = "tcp (no RDMA port)"
                port_cells = (Text(hca) if not rd else Text.assemble(
                    hca + " ", ("ACTIVE", "green") if rd.get("port_active") else ("not ACTIVE", "bold red")), addr)
            t.add_row(*_lit(n["name"], n["addr"], str(n["rail"]), Text("up", "green") if n["up"] else Text("DOWN", "bold red"),
                      *port_cells,
                      str(n["active"]), str(n["standby"]), Text(str(n["failed"]), "red" if n["failed"] else ""),
                      Text(", ".join(n["pairs_down"]) or "-", "red" if n["pairs_down"] else ""), str(n["processes"])))
        parts.append(t)
        pt = Table(title=Text(f"host {host}: processes"), title_justify="left")
        for c in ("process", "transport", "comms", "ok", "failed over", "unprotected", "fatal", "failovers", "failbacks",
                  "flaps", "resent"):
            pt.add_column(c, no_wrap=True)
        stale = []
        comm_rows = []
        for p in h["processes"]:
            who = f"rank {p['rank']} (pid {p['pid']})" if p.get("rank") is not None else f"pid {p['pid']}"
            if p["stale"]:
                stale.append(f"{who}: {p['stale_reason']}")
                continue
            cs = p["comms"]
            cnt = {k: sum(1 for c in cs if c["health"] == k) for k in ("ok", "failed-over", "unprotected", "fatal")}
            tt = p["totals"]
            pt.add_row(*_lit(who, str(p.get("transport") or "?"), str(len(cs)), str(cnt["ok"]), Text(str(cnt["failed-over"]), "yellow" if cnt["failed-over"] else ""),
                       Text(str(cnt["unprotected"]), "yellow" if cnt["unprotected"] else ""),
                       Text(str(cnt["fatal"]), "bold red" if cnt["fatal"] else ""), str(tt.get("failovers", 0)),
                       str(tt.get("failbacks", 0)), str(tt.get("flaps", 0)), _bytes(int(tt.get("bytes_resent", 0)))))
            for c in cs:
                if show_comms or c["health"] != "ok":
                    comm_rows.append((who, c))
        parts.append(pt)
        if comm_rows:
            ct = Table(title=Text(f"host {host}: comms" + ("" if show_comms else " that are not ok (--comms shows all)")),
                       title_justify="left")
            for c in ("process", "comm", "dir", "peer", "traffic on", "health", "standby", "failovers/backs/flaps",
                      "last detect/converge ms"):
                ct.add_column(c, overflow="fold")
            for who, c in comm_rows:
                standby = ", ".join(p["nic"] for p in c.get("paths", []) if p.get("state") == "standby") or "-"
                on = c["active_nic"] or "-"
                if c["active_nic"] != c["primary_nic"]:
                    on += f" (primary {c['primary_nic']})"
                ct.add_row(*_lit(who, str(c["id"]), c["dir"], c["peer"], on, Text(c["health"], _HEALTH_STYLE.get(c["health"], "")),
                           standby, f"{c['failovers']}/{c['failbacks']}/{c['flaps']}",
                           f"{_ms(c.get('last_detection_us'))}/{_ms(c.get('last_convergence_us'))}"))
            parts.append(ct)
        for s in stale:
            parts.append(Text(f"stale state file: {s}", style="dim"))
    if snap["events"]:
        et = Table(title="recent events (journals)", title_justify="left")
        for c in ("age", "process", "event", "details"):
            et.add_column(c, no_wrap=False)
        for e in snap["events"]:
            who = f"rank {e['rank']}" if e.get("rank") is not None else \
                f"pid {e['pid']}" if e.get("pid") is not None else "-"   # an event without a pid: absent
            style = "red" if e["event"] in ("nic_down", "pair_down", "path_down", "fatal") else \
                "yellow" if e["event"] in ("failover", "flap") else ""
            age = f"{e['age_s']:.1f}s" + ("*" if e.get("age_from") else "")
            et.add_row(*_lit(age, who, Text(e["event"], style), st.format_event(e)))
        parts.append(et)
        if any(e.get("age_from") for e in snap["events"]):
            parts.append(Text("* from a journal written with another clock (another host, or a QEMU guest): "
                              "its age is taken from the file's modification time", style="dim"))
    for err in snap["errors"]:
        parts.append(Text(f"unreadable: {err}", style="red"))
    j = snap.get("journal", {})
    if j.get("garbled"):
        parts.append(Text(f"journal lines skipped (partial, not a JSON event, or a field of the wrong type): {j['garbled']}", style="yellow"))
    if j.get("unknown"):
        parts.append(Text("journal events this railover does not know (a newer plugin?): " +
                          ", ".join(f"{k} x{v}" for k, v in sorted(j["unknown"].items())), style="yellow"))
    return Group(*parts)


def status_cmd(
    ctx: typer.Context,
    state_dir: Optional[List[Path]] = typer.Option(None, "--state-dir", callback=_existing_dirs,
                                                   help="directory of state files (repeatable; default: "
                                                   "$RAILOVER_STATE_DIR, else /run/railover and /tmp/railover-<uid>)"),
    journal: Optional[List[Path]] = typer.Option(None, "--journal", help="extra event journal file or directory (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document instead of tables"),
    watch: bool = typer.Option(False, "--watch", "-w", help="refresh until Ctrl-C"),
    interval: float = typer.Option(1.0, "--interval", callback=_watch_interval,
                                   help="refresh interval of --watch, seconds (0.1 to 86400)"),
    events: int = typer.Option(15, "--events", min=0, help="how many recent journal events to show (0: none)"),
    all_events: bool = typer.Option(False, "--all-events", help="include routine events (path_state: every path "
                                    "transition) in the recent events"),
    comms: bool = typer.Option(False, "--comms", help="list every comm, not only those that are not ok"),
    prune: bool = typer.Option(False, "--prune", help="delete the state files of exited processes first"),
) -> None:
    """Show railover's live state on this host: NICs and their health (with RDMA: the HCA port
    behind each, whether it is ACTIVE, its GID or LID), comms per NIC (active vs standby paths),
    failover counters, recent journal events."""
    if not watch:
        refuse_given(ctx, ["interval"], "with --watch only (add --watch)")
    dirs = _dirs(state_dir)
    for w in _path_warnings(state_dir, dirs, journal):
        typer.echo(f"warning: {w}", err=True)
    if prune:
        try:
            for p in st.prune_stale(dirs):
                typer.echo(f"removed stale {p}", err=True)
        except OSError as e:
            _fail(f"cannot remove a stale state file: {e}")
    take = lambda: st.snapshot(dirs, journal or (), events=events, all_events=all_events)  # noqa: E731
    if as_json and not watch:
        typer.echo(json.dumps(take(), indent=1))
        return
    if not watch:
        _console.print(render_status(take(), comms))
        return
    try:
        if as_json:
            while True:
                typer.echo(json.dumps(take()))
                sys.stdout.flush()
                time.sleep(interval)  # refresh period chosen by the user
        from rich.live import Live
        with Live(render_status(take(), comms), console=_console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(interval)  # refresh period chosen by the user
                live.update(render_status(take(), comms))
    except KeyboardInterrupt:
        return


# --------------------------------------------------------------------------- exporter

def _interrupt(sig: int, frame: Any) -> None:
    """SIGTERM handler: unwind like Ctrl-C so servers close cleanly."""
    raise KeyboardInterrupt

DEFAULT_EXPORTER_PORT = 9477


def _bind_addr(addr: str) -> str:
    """--addr as bind() takes it: an IPv6 address in URL brackets (``[::1]``) without them;
    an empty one refused (exit 2): getaddrinfo would read it as "every address"; so is one
    with a port (``0.0.0.0:9477``, ``[::]:9477``), naming --port: it was looked up as a host
    name ("Name or service not known")."""
    a = addr.strip()
    m = re.fullmatch(r"(\[[^\]]*\]|[^:\[\]]*):(\d+)", a)
    if m:
        raise typer.BadParameter(f"{addr!r}: an address with a port; give the address alone and the port with "
                                 f"--port, e.g. --addr {m.group(1) or '0.0.0.0'} --port {m.group(2)}")
    if a.startswith("[") and a.endswith("]"):
        a = a[1:-1].strip()
    if not a:
        raise typer.BadParameter(f"{addr!r}: empty address; give one to bind, e.g. 127.0.0.1 or ::1")
    return a


def exporter_cmd(
    port: int = typer.Option(DEFAULT_EXPORTER_PORT, "--port", min=0, max=65535, help="TCP port of /metrics (0: any free port)"),
    addr: str = typer.Option("127.0.0.1", "--addr", callback=_bind_addr,
                             help="address to bind (IPv4 or IPv6, also as [::1]); 0.0.0.0 or :: exposes it to the network"),
    state_dir: Optional[List[Path]] = typer.Option(None, "--state-dir", help="directory of state files (repeatable)"),
    journal: Optional[List[Path]] = typer.Option(None, "--journal", help="extra event journal file or directory (repeatable)"),
) -> None:
    """Serve Prometheus metrics (node level) from the state files and journals until SIGINT/SIGTERM."""
    from railover.ops import exporter as ex
    dirs = _dirs(state_dir)
    try:
        srv = ex.serve(dirs, journal or (), addr, port)
    except OSError as e:
        _fail(f"cannot listen on {f'[{addr}]' if ':' in addr else addr}:{port}: {e.strerror or e}")
    # The handlers are in place before the URL line: whoever waits for that line (a script, a
    # test) may signal at once, and a SIGINT still ignored then was lost.
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # A script's background job ('railover exporter &') starts with SIGINT ignored, and the
        # ignore survives exec: 'kill -INT' did nothing. This command runs until SIGINT.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        typer.echo(f"railover exporter: {srv.url} (state dirs: {', '.join(map(str, dirs)) or 'none'})")
        if not dirs:
            typer.echo("railover exporter: warning: state files are off (RAILOVER_STATE_DIR=off): only journals given "
                       "with --journal are read; use --state-dir", err=True)
        for w in _path_warnings(state_dir, dirs, journal):
            typer.echo(f"railover exporter: warning: {w}", err=True)
        sys.stdout.flush()
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        srv.close()


# --------------------------------------------------------------------------- doctor

def render_doctor(rep: Any) -> Group:
    """Rich tables for a :class:`railover.ops.doctor.Report`. Cells wrap, and a word longer
    than its column (a path, ``LD_LIBRARY_PATH=...``) is folded, never cut short."""
    from railover.ops import doctor as dr
    t = Table(title="interfaces", title_justify="left")
    for c in ("interface", "selected", "why", "addresses", "link", "rail"):
        t.add_column(c, overflow="fold")
    for n in rep.nics:
        link = "up" if n["admin_up"] and n["carrier"] else ("admin down" if not n["admin_up"] else "no carrier")
        t.add_row(*_lit(n["name"], Text("yes", "green") if n["selected"] else "no", n["reason"], ", ".join(n["addrs"]) or "-",
                  Text(link, "" if link == "up" else ("red" if n["selected"] else "dim")),
                  "-" if n["rail"] is None else str(n["rail"])))
    parts: List[Any] = [t]
    r = getattr(rep, "rdma", None) or {}
    if r.get("nics"):
        use = "NCCL init would fail" if r.get("transport") == "error" else f"the job would use {r.get('transport', '?')}"
        rt = Table(title=f"RDMA (RAILOVER_TRANSPORT={r.get('setting', '?')}: {use})", title_justify="left")
        for col in ("NIC", "HCA port", "link layer", "state", "rate", "GID", "why"):
            rt.add_column(col, overflow="fold")
        for n in r["nics"]:
            chosen = n.get("choice") in ("chosen", "down")  # down: chosen, its port not ACTIVE now
            gid = (f"{n.get('gid_index')} {n.get('gid', '')}" if n.get("gid_index", -1) >= 0
                   else ("LID" if chosen else "-"))
            rt.add_row(*_lit(n.get("nic", "?"), f"{n.get('hca')} port {n.get('port')}" if chosen else Text(n.get("choice", "?"), "yellow"),
                       n.get("link_layer") or "-", Text(n.get("state") or "-", "green" if n.get("state") == "ACTIVE" else "red"),
                       dr.rate_text(n.get("rate_mbps", 0)), gid, n.get("why", "")))
        parts.append(rt)
    c = Table(title="checks", title_justify="left")
    for col in ("", "area", "subject", "finding", "what to do"):
        c.add_column(col, overflow="fold")
    for ch in rep.checks:
        c.add_row(*_lit(Text(ch.status, _STYLE.get(ch.status, "")), ch.section, ch.what, ch.detail, ch.fix))
    nfail = sum(1 for ch in rep.checks if ch.status == "FAIL")
    nwarn = sum(1 for ch in rep.checks if ch.status == "WARN")
    verdict = Text(f"{'FAIL' if nfail else 'OK'}: {nfail} blocking problem(s), {nwarn} warning(s)",
                   "bold red" if nfail else "bold green")
    return Group(*parts, c, verdict)


def doctor_cmd(
    peer: Optional[List[str]] = typer.Option(None, "--peer", help="IP address of a peer host's NIC to probe (repeatable)"),
    probe_port: int = typer.Option(22, "--probe-port", min=1, max=65535, help="TCP port for the reachability probe (a refusal counts as reachable)"),
    plugin: Optional[Path] = typer.Option(None, "--plugin", help="plugin .so to check (default: the installed one)"),
    no_torch: bool = typer.Option(False, "--no-torch", help="do not ask PyTorch for its NCCL version"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
) -> None:
    """Check this host before a job: NIC selection, addresses, link state, rails, ARP flux and
    reverse-path filtering of NICs sharing a subnet (every IPv4 interface of the host that can
    share a link counts, selected or not), source routing, reachability of peers, NCCL
    settings, the plugin's exports, the RDMA transport (HCA port, state and GID per NIC, the
    transport RAILOVER_TRANSPORT gives, GPUDirect), PyTorch's NCCL. Exit 1 on a blocking
    problem."""
    from railover.ops import doctor as dr
    try:
        facts = dr.gather(plugin=plugin, check_torch=not no_torch)
        rep = dr.diagnose(facts, peer or (), probe=lambda s, d, i: dr.tcp_probe(s, d, probe_port, ifname=i))
    except ValueError as e:
        _fail(f"bad --peer: {e}")
    except OSError as e:
        _fail(f"cannot inspect this host: {e}")
    if as_json:
        typer.echo(json.dumps(rep.to_json(), indent=1))
    else:
        _terminal_console().print(render_doctor(rep))
    raise typer.Exit(0 if rep.ok else 1)


def _terminal_console() -> Console:
    """A console as wide as the terminal (rich's own choice: the terminal, COLUMNS, else 80),
    at least 40 columns: wider than the terminal, every line would wrap."""
    c = Console()
    return c if c.width >= 40 else Console(width=40)


# --------------------------------------------------------------------------- launch

class LaunchConflict(Exception):
    """The user's environment selects another NCCL network or plugin, or has values the plugin
    rejects (message says which); ``warnings``: the other findings, to show with it."""

    def __init__(self, msg: str, warnings: Sequence[str] = ()):
        super().__init__(msg)
        self.warnings = list(warnings)


def _our_entry(plugin_value: str) -> Optional[str]:
    """The first entry of ``NCCL_NET_PLUGIN=plugin_value`` that opens a railover build (a
    name, the file name or a path; NCCL 2.27+ read the value as a list), else None."""
    from railover.ops.doctor import is_railover_entry, plugin_entries
    return next((p for p in plugin_entries(plugin_value) if is_railover_entry(p)), None)


def _plugin_by_path(value: str) -> Optional[Path]:
    """The file ``NCCL_NET_PLUGIN=value`` names when its railover entry (:func:`_our_entry`)
    is a path to a railover build (``.../libnccl-net-railover.so``), else None (a name, or
    another plugin)."""
    v = _our_entry(value)
    return Path(v) if v is not None and "/" in v else None


def _on_ld_library_path(ld: str) -> Optional[Path]:
    """The ``libnccl-net-railover.so`` that the dynamic loader finds first through
    ``LD_LIBRARY_PATH`` ``ld`` (NCCL opens ``NCCL_NET_PLUGIN=railover`` by file name, and
    ``LD_LIBRARY_PATH`` comes before the system's directories), or None. As for ld.so, ``:``
    and ``;`` separate the entries and an empty entry is the current directory."""
    for d in re.split(r"[:;]", ld) if ld else ():
        p = Path(d or ".") / _paths.PLUGIN_FILE
        if st.path_kind(p)[0] == "file":  # an entry this user cannot search is skipped, as ld.so does
            return p
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def launch_env(base: Mapping[str, str], force: bool = False,
               notes: Optional[List[str]] = None) -> Tuple[Dict[str, str], List[str]]:
    """The environment ``railover launch`` runs a command with: ``base`` plus
    :func:`railover.envvars.nccl_env` (the user's ``RAILOVER_*`` and an explicit
    ``NCCL_NET_PLUGIN_REF_COUNT`` are kept). Returns ``(env, warnings)``.

    ``NCCL_NET_PLUGIN`` set to the path of a railover build (``/x/libnccl-net-railover.so``)
    is the user's choice of build: it is kept as given (the command then does not get
    railover's own build on ``LD_LIBRARY_PATH``) and the variables are validated by that
    build, when it loads; one that does not load is a conflict.

    With ``NCCL_NET_PLUGIN=railover`` (or unset), a ``libnccl-net-railover.so`` that the
    user's ``LD_LIBRARY_PATH`` already resolves (:func:`_on_ld_library_path`) is the user's
    build too: ``LD_LIBRARY_PATH`` is kept as given and the variables are validated by that
    build; one that does not load is a conflict (with ``force``: railover's own build goes
    first). Only when ``LD_LIBRARY_PATH`` has none is railover's own build's directory put
    first. When the user's build is not railover's own, a line appended to ``notes`` says
    which build the command gets.

    ``NCCL_NET_PLUGIN`` listing several plugins, railover among them (``railover,ib``: NCCL
    2.27+ read a list), is kept as given, in the user's order (with ``NCCL_NET=railover`` NCCL
    uses railover alone, wherever it stands); a warning says what NCCL makes of the list
    (:func:`railover.ops.doctor.plugin_list_note`). Its railover entry decides the build as
    above.

    Raises LaunchConflict when ``NCCL_NET`` or ``NCCL_NET_PLUGIN`` select something else (a
    list without a railover entry; an entry with blanks around it, which NCCL does not trim), or
    a variable the plugin reads (``RAILOVER_*``, ``NCCL_SOCKET_IFNAME``, ``NCCL_SOCKET_FAMILY``)
    has a value the plugin rejects, unless ``force``. With ``force``: ``NCCL_NET`` and
    ``NCCL_NET_PLUGIN`` are replaced by railover's values, and each invalid variable is
    removed from the command's environment so the plugin uses its default; a warning says
    which. A ``RAILOVER_*`` name railover does not read (a typo) and a NIC listed twice in
    ``RAILOVER_RAILS`` are warnings (:func:`railover.ops.doctor.unknown_var_checks`,
    :func:`~railover.ops.doctor.duplicate_rail_checks`, as in doctor), and so is a plugin that
    cannot be loaded here (nothing could be validated). Raises FileNotFoundError when the
    plugin is not installed (and the user named no build of their own)."""
    from railover.ops.doctor import (duplicate_rail_checks, known_vars, plugin_list_note, plugin_list_problem,
                                     ref_count_keeps_plugin, unknown_var_checks, validate_config)
    env = dict(base)
    problems: List[str] = []
    forced: List[str] = []    # what --force does about each problem
    warnings: List[str] = []  # the other findings (also shown with a refusal)

    def conflict(msg: str, var: str, value: str) -> None:
        problems.append(msg)
        forced.append(f"{msg}: replaced by {var}={value} (--force)")

    # an empty value is unset (railover's convention): it selects nothing, and railover's value replaces it
    if env.get("NCCL_NET") and env["NCCL_NET"].lower() != _paths.PLUGIN_NAME:
        conflict(f"NCCL_NET={env['NCCL_NET']} selects another network", "NCCL_NET", _paths.PLUGIN_NAME)
    native: Optional[params.Native] = None
    users = _plugin_by_path(env.get("NCCL_NET_PLUGIN", ""))
    if users is not None:
        try:
            native = params.load(users)
        except OSError as e:  # FileNotFoundError included
            users = None
            conflict(f"NCCL_NET_PLUGIN={env['NCCL_NET_PLUGIN']} is not a loadable railover plugin ({e})",
                     "NCCL_NET_PLUGIN", _paths.PLUGIN_NAME)
        add = {"NCCL_NET": _paths.PLUGIN_NAME, "NCCL_NET_PLUGIN_REF_COUNT": "1"}
    elif env.get("NCCL_NET_PLUGIN") and _our_entry(env["NCCL_NET_PLUGIN"]) is None:
        conflict(plugin_list_problem(env["NCCL_NET_PLUGIN"]) or "", "NCCL_NET_PLUGIN", _paths.PLUGIN_NAME)
    # a list naming railover (NCCL 2.27+) is the user's: kept as given, in their order (unless
    # its railover entry is a path that does not load, replaced with --force)
    note = plugin_list_note(env["NCCL_NET_PLUGIN"]) if _our_entry(env.get("NCCL_NET_PLUGIN", "")) else None
    keep_list = note is not None and (users is not None or _plugin_by_path(env["NCCL_NET_PLUGIN"]) is None)
    if keep_list:
        warnings.append(f"{note}; kept as given, in your order")
    # by name: the loader's search finds it, LD_LIBRARY_PATH first
    theirs = _on_ld_library_path(env.get("LD_LIBRARY_PATH", "")) if users is None else None
    if theirs is not None:
        try:
            native = params.load(theirs)
        except OSError as e:
            msg = (f"LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']} resolves {_paths.PLUGIN_FILE} to {theirs}, which is not "
                   f"a loadable railover plugin ({e})")
            problems.append(msg)
            forced.append(f"{msg}: railover's own build is put first on LD_LIBRARY_PATH (--force)")
            theirs = None
    if theirs is not None:  # the user's build, found by name: LD_LIBRARY_PATH stays as given
        add = {"NCCL_NET_PLUGIN": _paths.PLUGIN_NAME, "NCCL_NET": _paths.PLUGIN_NAME, "NCCL_NET_PLUGIN_REF_COUNT": "1"}
        try:
            ours: Optional[Path] = _paths.plugin_path()
        except FileNotFoundError:
            ours = None
        if ours is not None and not _same_file(ours, theirs) and notes is not None:
            notes.append(f"using the railover plugin your LD_LIBRARY_PATH resolves, {theirs}, not this railover's "
                         f"own {ours} (LD_LIBRARY_PATH is kept as given; remove that directory from it to use "
                         "railover's own)")
    elif users is None:  # railover's own build
        add = envvars.nccl_env(env)
        try:
            native = params.load()
        except OSError as e:
            warnings.append("could not validate the RAILOVER_* settings (nor NCCL_SOCKET_IFNAME/NCCL_SOCKET_FAMILY): "
                            f"the plugin could not be loaded: {e}")
    invalid = []
    for c in validate_config(env, native) if native is not None else ():
        if c.status == "FAIL":
            problems.append(c.detail)
            if c.what in env:
                invalid.append(c.what)
                forced.append(f"{c.detail}: removed from the command's environment (--force), the plugin uses its "
                              "default")
    if native is not None:
        warnings += [c.detail for c in unknown_var_checks(env, known_vars(native.describe["params"]))]
    if "RAILOVER_RAILS" not in invalid:
        warnings += [c.detail for c in duplicate_rail_checks(env)]
    if problems and not force:
        raise LaunchConflict("; ".join(problems), warnings)
    warnings = forced + warnings
    for var in invalid:
        env.pop(var, None)
    if "NCCL_NET_PLUGIN_REF_COUNT" in env:
        add.pop("NCCL_NET_PLUGIN_REF_COUNT")
        if not ref_count_keeps_plugin(env["NCCL_NET_PLUGIN_REF_COUNT"]):
            warnings.append(f"keeping NCCL_NET_PLUGIN_REF_COUNT={env['NCCL_NET_PLUGIN_REF_COUNT']}: NCCL 2.28/2.29 may then "
                            "lose the plugin after the last communicator is destroyed")
    if keep_list:
        add.pop("NCCL_NET_PLUGIN", None)
    env.update(add)
    return env, warnings


def launch_cmd(
    command: List[str] = typer.Argument(..., help="the command to run, after '--' (e.g. -- torchrun ... train.py)"),
    force: bool = typer.Option(False, "--force", help="run anyway: NCCL_NET/NCCL_NET_PLUGIN that select something else "
                               "are replaced by railover's, and variables with values the plugin rejects are removed "
                               "(the plugin then uses its defaults); a warning names each"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the environment changes and the command, run nothing"),
) -> None:
    """Run a command (e.g. torchrun) with NCCL's environment set for railover, as in
    'railover launch -- torchrun --nproc-per-node 8 train.py'."""
    if not command or command[0] == "":
        _fail("empty command: give the command to run after '--' (e.g. -- torchrun ... train.py)")
    notes: List[str] = []
    try:
        env, warnings = launch_env(os.environ, force, notes)
    except LaunchConflict as e:
        for n in notes:
            typer.echo(f"note: {n}", err=True)
        for w in e.warnings:
            typer.echo(f"warning: {w}", err=True)
        _fail(f"{e}. Fix or unset it, or pass --force (railover's NCCL_NET/NCCL_NET_PLUGIN replace others, "
              "railover's own build goes first on LD_LIBRARY_PATH before one that does not load, invalid "
              "variables are removed so the plugin uses its defaults).")
    except FileNotFoundError as e:
        _fail(str(e))
    for n in notes:
        typer.echo(f"note: {n}", err=True)
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    if dry_run:
        for k in sorted(env):
            if os.environ.get(k) != env[k]:
                typer.echo(f"{k}={shlex.quote(env[k])}")
        for k in sorted(set(os.environ) - set(env)):
            typer.echo(f"unset {k}")
        typer.echo("exec: " + shlex.join(command))
        return
    exe = shutil.which(command[0], path=env.get("PATH"))
    if exe is None:
        # which() passes over files that exist but cannot be run: name those, as a shell does (126)
        dirs = [""] if "/" in command[0] else [d for d in env.get("PATH", os.defpath).split(os.pathsep) if d]
        there = next((p for p in (os.path.join(d, command[0]) for d in dirs) if os.path.exists(p)), None)
        if there is not None:
            _fail(f"{there}: {'is a directory' if os.path.isdir(there) else 'not executable'}", 126)
        _fail(f"command not found: {command[0]}", 127)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(exe, command, env)
    except OSError as e:  # found and executable, yet the kernel cannot run it: as a shell, 127 or 126
        _fail(f"{exe}: cannot run it: {_exec_error(exe, e)}", 127 if e.errno == errno.ENOENT else 126)


def _exec_error(exe: str, e: OSError) -> str:
    """Why execve of the file ``exe`` failed, in words: ENOENT for a file that is there means
    its ``#!`` interpreter is missing (named, from the file's first line); ENOEXEC a file that
    is no program the kernel runs; else the system's message."""
    if e.errno == errno.ENOENT:
        try:
            with open(exe, "rb") as f:
                first = f.readline(256)
        except OSError:
            first = b""
        if first.startswith(b"#!"):
            # the kernel runs the line's first word (blanks around it skipped); the rest is one
            # argument, not part of the name. A \r stays: it is in the name
            interp = first[2:].rstrip(b"\n").decode(errors="replace").strip(" \t").replace("\t", " ").split(" ", 1)[0]
            return (f"its interpreter {interp!r} (the #! line) was not found"
                    + (" (the line ends in \\r: Windows line endings)" if interp.endswith("\r") else ""))
        return "its interpreter or a library it needs was not found"
    if e.errno == errno.ENOEXEC:
        return "not a program this machine runs (a script needs a #! line, e.g. #!/bin/sh)"
    return e.strerror or str(e)


# --------------------------------------------------------------------------- drill

def _lit(*cells: Any) -> List[Any]:
    """Table cells: plain strings as literal text, rich objects as they are. Names and values
    from state files, journals and interfaces may hold '[' (an interface may be named
    ``e[red]x``), which rich would read as markup: a MarkupError traceback, or the name shown
    without it (found by a fresh-user trial)."""
    return [Text(c) if isinstance(c, str) else c for c in cells]


def _cell(v: Any) -> str:
    """A journal field as a table cell: '-' when the event lacks it (absent or null), as
    ``status`` shows a missing value, never "None"."""
    return "-" if v is None else str(v)


def _resent(n: Any) -> str:
    """``bytes_resent`` of a journal event as a cell: '-' when absent or not a count."""
    return _bytes(n) if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else "-"


def render_drill(res: Any) -> Group:
    """Rich rendering of a :class:`railover.ops.drill.DrillResult`. A field that a journal
    event lacks is '-' in the table and left out of the lines, never "None"."""
    parts: List[Any] = []
    where = f" (netns {res.netns})" if res.netns else ""
    parts.append(Text(f"drill: {res.nic}{where} down for {res.down_for_s:g} s; railover processes using it: "
                      f"{', '.join(res.users) or 'none'}"))
    if res.detection:
        d = res.detection
        fields = st.format_event(d)
        parts.append(Text(f"detection: {d['event']} after {d['since_down_ms']:.1f} ms" +
                          (f" ({fields})" if fields else "") +
                          (f" in pid {d['pid']}" if d.get("pid") is not None else "")))
    t = Table(title="what railover did", title_justify="left")
    for c in ("event", "pid", "comm", "to NIC", "peer", "after NIC down ms", "after NIC up ms", "convergence ms",
              "resent"):
        t.add_column(c, no_wrap=True)
    for e in res.failovers + res.failbacks:
        t.add_row(*_lit(e["event"], _cell(e.get("pid")), _cell(e.get("comm")), _cell(e.get("to_nic")), _cell(e.get("peer")),
                  f"{e['since_down_ms']:.1f}", f"{e['since_up_ms']:.1f}" if "since_up_ms" in e else "-",
                  _ms(e.get("convergence_us")), _resent(e.get("bytes_resent"))))
    parts.append(t)
    for e in res.flaps:
        who = f"pid {e['pid']}" if e.get("pid") is not None else ""
        parts.append(Text("flap: " + " ".join(x for x in (who, st.format_event(e)) if x), "yellow"))
    b, a = res.counters_before, res.counters_after
    if a:
        parts.append(Text("state counters (before -> after): " + ", ".join(f"{k} {b.get(k, 0)} -> {a.get(k, 0)}"
                                                                          for k in a)))
    if res.problems:
        for p in res.problems:
            parts.append(Text(f"PROBLEM: {p}", "bold red"))
    else:
        parts.append(Text("OK: railover detected the failure, moved the traffic and moved it back", "bold green"))
    return Group(*parts)


def drill_cmd(
    nic: str = typer.Option(..., "--nic", help="interface to take down"),
    down_for: float = typer.Option(..., "--down-for", callback=positive, help="how long the NIC stays down, seconds (> 0)"),
    yes: bool = typer.Option(False, "--yes", help="really do it (the NIC goes down on this host)"),
    netns: Optional[str] = typer.Option(None, "--netns", help="the NIC lives in this named network namespace"),
    state_dir: Optional[List[Path]] = typer.Option(None, "--state-dir", help="directory of state files (repeatable)"),
    journal: Optional[List[Path]] = typer.Option(None, "--journal", help="extra event journal file or directory (repeatable)"),
    wait_failback: float = typer.Option(30.0, "--wait-failback", min=0, callback=finite, help="after the NIC is back, wait this long (s) at most for failback"),
    force: bool = typer.Option(False, "--force", help="take the NIC down even when no running railover process uses "
                               "it (nothing to observe)"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Rehearse a NIC failure: take NIC down for --down-for seconds while a job runs, bring it
    back, and report from the journals (every one read: the peers' failovers are the drill's
    effect too) what railover did (detection, convergence, failback).
    Needs --yes; refuses when no railover process uses the NIC (unless --force), and when a
    --journal, --state-dir or RAILOVER_STATE_DIR path does not exist. The NIC is restored on
    Ctrl-C/SIGTERM."""
    from railover.ops import drill as dl
    if not yes:
        where = f" in network namespace {netns}" if netns else " on this host"
        _fail(f"refusing to run: the drill takes {nic}{where} DOWN for {down_for:g} s, cutting every connection "
              "over it (railover should move its traffic to another NIC). Rerun with --yes to do it.", 2)
    dirs = _dirs(state_dir)
    # before the NIC goes down: a mistyped --journal would silently leave the peers' failovers
    # out of the report (status and exporter only warn: they change nothing)
    bad_paths = _path_warnings(state_dir, dirs, journal)
    if bad_paths:
        _fail("refusing to run: " + "; ".join(bad_paths) + " (fix the path given with --journal, --state-dir or "
              "RAILOVER_STATE_DIR, or leave it out)", 2)
    progress = (lambda m: typer.echo(m, err=True))
    try:
        res = dl.run_drill(nic, down_for, netns=netns, state_dirs=dirs, journals=journal or (),
                           wait_failback_s=wait_failback, force=force, progress=progress)
    except dl.RestoreError as e:
        _fail(str(e), 3)
    except dl.DrillError as e:
        _fail(str(e), 2)
    except (KeyboardInterrupt, SystemExit) as e:  # SIGINT / SIGTERM: the NIC was restored before we got here
        typer.echo(f"interrupted; {nic} was set up again", err=True)
        raise typer.Exit(130 if isinstance(e, KeyboardInterrupt) else 143)
    if as_json:
        typer.echo(json.dumps(res.to_json(), indent=1))
    else:
        _console.print(render_drill(res))
    raise typer.Exit(0 if res.ok else 1)


def register(app: typer.Typer) -> None:
    """Add status, exporter, doctor, launch and drill to the main Typer ``app``."""
    app.command("status")(status_cmd)
    app.command("exporter")(exporter_cmd)
    app.command("doctor")(doctor_cmd)
    app.command("launch", context_settings={"allow_interspersed_args": False})(launch_cmd)
    app.command("drill")(drill_cmd)
