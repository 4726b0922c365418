"""``railover bench rdma``: the plugin's RDMA verbs transport (``RAILOVER_TRANSPORT=rdma``) on
the RDMA test bed (two QEMU guests with Soft-RoCE, 2 rails each; see
:mod:`railover.testbed.rdma.bed`), measured side by side in one bed:

1. **Convergence per fault kind** under a checked ring all-reduce (railover-perf, 1 rank per
   guest, every byte checked, a duration run ended by a stop file): N faults per kind on
   guest A's primary rail NIC ``a0``, each applied once the comms are armed (both rails'
   paths up, or the previous fault's failback seen) and undone once the failover shows in
   both guests' journals (or a bounded wait ran out). Per kind: the journal's
   ``convergence_us`` of every ``failover`` (p50/p99/max, ms), the ``detection_us`` of the
   active paths' ``path_down``, fault -> first ``failover`` in guest A (guest A's clock: the
   fault's stamp and the journal share it; for faults run inside the guest, whose stamp is
   read after their command returned, from a clock reading just before the command), the
   ``failback`` convergence, faults without a failover, ``fatal`` events and wrong bytes. A
   guest kernel crash (6.1's rxe, about 1 in 25 admin downs) reboots the guests and the faults
   go on in a new checked run (at most 2 reboots); the fault it crashed under is listed, not
   measured.
2. **Bare RC timeout**: the same cable pull with ``RAILOVER_STANDBY=none`` (no standby path:
   what a plain RDMA transport does): time until the job errors (a ``fatal`` journal event
   or the ranks exiting), bounded; if nothing happened within the bound the cable is put back
   and whether the job then completes is reported.
3. **busbw side by side**, interleaved per round and size on the same rxe devices (rail 0):
   railover-perf sendrecv (2 ranks, ring: both directions at once, ``-c 0``) over
   ``RAILOVER_TRANSPORT=rdma``, one way (``--pattern oneway``: A sends, B receives, as
   ib_write_bw does), each also with ``--idle-sleep-us 50`` (the driver's progress thread
   sleeps when idle instead of spinning: shows whether busy polling starves rxe's kernel work
   on a 1-vCPU guest), ``RAILOVER_TRANSPORT=tcp``, and perftest ``ib_write_bw`` one way and
   bidirectional (``-b``; perftest prints the sum of both directions, its client adds the
   server's rate). Both guests' CPU split (user / system / softirq / idle from /proc/stat) is
   recorded for every measurement. Ratios: rdma / ib_write_bw (ring and one way, spinning and
   sleeping) and rdma / tcp.

The bed runs under TCG when the host has no KVM (1 vCPU per guest, 10-50x slower than
native); the plugin then runs with the bed's TCG timers
(:data:`railover.testbed.rdma.perf.TCG_PLUGIN_ENV`), recorded in the report. The targets are
the issue's (carrier and local port faults p99 <= 20 ms, silent and remote faults p99 <=
200 ms, busbw >= 0.9 x ib_write_bw at >= 1 MiB); they are judged on whatever the bed gives,
never adjusted to it.
"""
from __future__ import annotations

import json
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from rich.console import Console
from rich.table import Table

from railover import journal
from railover.bench import common as C
from railover.sizes import parse_size

#: fault kinds: what it is, the fault class name in railover.testbed.rdma.faults, the NIC, the
#: target class ("local": carrier/port faults the NIC's own guest sees; "silent": faults only
#: probes or the RC timeout reveal)
KINDS: Dict[str, Dict[str, str]] = {
    "cable-pull": {"what": "cable pulled at a0 (QEMU set_link off; A sees no carrier)", "cls": "CablePull",
                   "nic": "a0", "target": "local"},
    "admin-down": {"what": "ip link set eth1 down in A", "cls": "AdminDown", "nic": "a0", "target": "local"},
    "silent": {"what": "a0's wire black-holes both directions (nftables drops at the input of a0 and b0; "
                       "no link event)", "cls": "Silent", "nic": "a0",
               "target": "silent"},
    "one-way": {"what": "what leaves a0 is lost on the wire (nftables drops it at b0's input)", "cls": "OneWay",
                "nic": "a0", "target": "silent"},
    "remote-cable-pull": {"what": "cable pulled at b0 (A sees nothing on its NIC)", "cls": "CablePull", "nic": "b0",
                          "target": "silent"},
}
DEFAULT_KINDS = ("cable-pull", "admin-down", "silent")
#: issue targets for the convergence p99, ms, per target class
TARGET_MS = {"local": 20.0, "silent": 200.0}
#: busbw target: railover-rdma / ib_write_bw at sizes >= 1 MiB
BW_TARGET = 0.9
RDMA_ENV = {"RAILOVER_TRANSPORT": "rdma"}
#: the ``rdma_qps4`` busbw variant: 4 RC QPs per path, each chunk split over them
#: (NCCL_IB_QPS_PER_CONNECTION, as NCCL splits a message over its QPs)
RDMA_QPS4_ENV = {**RDMA_ENV, "NCCL_IB_QPS_PER_CONNECTION": "4"}
TCP_ENV = {"RAILOVER_TRANSPORT": "tcp"}


# --------------------------------------------------------------------------- pure logic

def parse_ib_write_bw(text: str, size: int) -> Optional[float]:
    """Average bandwidth in GB/s (1e9 B/s) of perftest's result line for ``size`` (columns bytes,
    iterations, BW peak, BW average, MsgRate), in the unit its header names: ``[MB/sec]`` (perftest's
    default: 2**20 B/s, printed with 2 decimals, so 0.04 % resolution at 25 MB/s) or ``[Gb/sec]``
    (``--report_gbits``: 1e9 bit/s, 2 decimals, only 5 % resolution at 0.2 Gb/s). None when the
    line or the header is missing."""
    unit = re.search(r"BW average\[(MB|Gb)/sec\]", text)
    m = re.search(rf"^\s*{size}\s+\d+\s+([\d.]+)\s+([\d.]+)\s+[\d.]+", text, re.M)
    if not unit or not m:
        return None
    return float(m.group(2)) * (0x100000 / 1e9 if unit.group(1) == "MB" else 1 / 8.0)


def cpu_split(before: Sequence[int], after: Sequence[int]) -> Dict[str, Optional[float]]:
    """Fractions of CPU time between two /proc/stat ``cpu`` lines (fields user nice system idle
    iowait irq softirq steal): ``user`` (user+nice), ``system``, ``softirq`` (irq+softirq),
    ``idle`` (idle+iowait), ``steal``. All None when no time passed."""
    d = [max(0, a - b) for a, b in zip(after, before)] + [0] * 8
    total = sum(d[:8])
    if total <= 0:
        return {"user": None, "system": None, "softirq": None, "idle": None, "steal": None}
    return {"user": (d[0] + d[1]) / total, "system": d[2] / total, "softirq": (d[5] + d[6]) / total,
            "idle": (d[3] + d[4]) / total, "steal": d[7] / total}


def new_events(events: Sequence[Mapping[str, Any]], since: int, name: str) -> List[Mapping[str, Any]]:
    """Events named ``name`` among ``events[since:]``."""
    return [e for e in events[since:] if e.get("event") == name]


def armed_on_primary(events: Sequence[Mapping[str, Any]], primary: str = "eth1", standby: str = "eth2") -> bool:
    """True when a guest's journal shows its send comm's traffic on ``primary`` with a send
    path on ``standby`` up too (the comm is armed for the next fault). Where the traffic is:
    the last send ``path_state`` transition to ``active`` (the engine's own word: a comm whose
    standby came up first may still start on the primary); in a journal without path states,
    the last failover/failback/recover, or with none the first send path up."""
    sends = [e for e in events if e.get("event") == "path_up" and e.get("dir") == "send"]
    if not {primary, standby} <= {e.get("nic") for e in sends}:
        return False
    active = [e for e in events if e.get("event") == "path_state" and e.get("dir") == "send" and e.get("to") == "active"]
    if active:
        return active[-1].get("nic") == primary
    moves = [e for e in events if e.get("event") in ("failover", "failback", "recover")]
    if moves:
        return moves[-1].get("to_nic") == primary
    return sends[0].get("nic") == primary


def cycle_record(i: int, applied_us: int, undone_us: Optional[int], new_a: Sequence[Mapping[str, Any]],
                 new_b: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """One fault's figures from the journal events that appeared in guest A (``new_a``) and B
    (``new_b``) from just before the fault until its failbacks (or a bounded wait) after the
    undo. ``applied_us`` is on guest A's clock (the faults here act on A's NIC, or for the
    remote kind their stamp is mapped from B's clock through the host's)."""
    fo = [e for e in list(new_a) + list(new_b) if e.get("event") == "failover"]
    fo_a = [e for e in new_a if e.get("event") == "failover"]
    downs = [e for e in list(new_a) + list(new_b) if e.get("event") == "path_down" and e.get("active")]
    fb = [e for e in list(new_a) + list(new_b) if e.get("event") == "failback"]
    # The receivers' RESUME answers (failovers and failbacks): how long each waited, and for the
    # ones that waited on the old path's fence, that fence's queue, run (and of the run, its wait
    # for a running grant of remote write) and the time from its end to the answer (journals of
    # plugins before 2026-12-04 lack these fields, those before the grant wait was journaled
    # lack fence_grant_wait_us: left out).
    res = [e for e in list(new_a) + list(new_b) if e.get("event") == "resume" and e.get("waited_us") is not None]
    waited = [e for e in res if e["waited_us"] > 0 and e.get("fence_us")]
    # Send paths (re)opened in the cycle: how long openSendPath held the caller's thread (NCCL's
    # at a retry); plugins before 2026-12-04 lack open_us.
    opens = [e for e in list(new_a) + list(new_b)
             if e.get("event") == "path_up" and e.get("dir") == "send" and e.get("open_us") is not None]
    return {
        "i": i, "applied_us": applied_us, "undone_us": undone_us,
        "failovers": len(fo), "failovers_a": len(fo_a), "failovers_b": len(fo) - len(fo_a),
        "convergence_ms": [e["convergence_us"] / 1e3 for e in fo if e.get("convergence_us") is not None],
        "detection_ms": [e["detection_us"] / 1e3 for e in downs if e.get("detection_us") is not None],
        "fault_to_failover_a_ms": ((min(e["t_us"] for e in fo_a) - applied_us) / 1e3) if fo_a else None,
        "failback_convergence_ms": [e["convergence_us"] / 1e3 for e in fb if e.get("convergence_us") is not None],
        "failbacks": len(fb),
        "resume_wait_ms": [e["waited_us"] / 1e3 for e in res],
        "resume_fence_queue_ms": [e["fence_queue_us"] / 1e3 for e in waited],
        "resume_fence_ms": [e["fence_us"] / 1e3 for e in waited],
        "resume_fence_grant_wait_ms": [e["fence_grant_wait_us"] / 1e3 for e in waited
                                       if e.get("fence_grant_wait_us") is not None],
        "resume_fence_to_answer_ms": [e["fence_to_answer_us"] / 1e3 for e in waited],
        "send_open_ms": [e["open_us"] / 1e3 for e in opens],
        "fatal": sum(1 for e in list(new_a) + list(new_b) if e.get("event") == "fatal"),
        "bytes_resent": sum(int(e.get("bytes_resent") or 0) for e in fo),
    }


def kind_summary(kind: str, cycles: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per-kind statistics over its fault cycles (every failover event counts once)."""
    conv = [x for c in cycles for x in c["convergence_ms"]]
    return {
        "what": KINDS.get(kind, {}).get("what", kind), "target_class": KINDS.get(kind, {}).get("target", "silent"),
        "faults": len(cycles),
        "faults_without_failover": sum(1 for c in cycles if c["failovers"] == 0),
        "faults_without_failback": sum(1 for c in cycles if c["failovers"] and c["failbacks"] == 0),
        "convergence_ms": C.summary(conv),
        "detection_ms": C.summary([x for c in cycles for x in c["detection_ms"]]),
        "fault_to_failover_a_ms": C.summary([c["fault_to_failover_a_ms"] for c in cycles]),
        "failback_convergence_ms": C.summary([x for c in cycles for x in c["failback_convergence_ms"]]),
        **{k: C.summary([x for c in cycles for x in c.get(k, ())])
           for k in ("resume_wait_ms", "resume_fence_queue_ms", "resume_fence_ms", "resume_fence_grant_wait_ms",
                     "resume_fence_to_answer_ms", "send_open_ms")},
        "fatal": sum(c["fatal"] for c in cycles),
        "bytes_resent": sum(c["bytes_resent"] for c in cycles),
        "cycles": list(cycles),
    }


def bw_ratios(rows: Sequence[Mapping[str, Any]]) -> Dict[int, Dict[str, Any]]:
    """Per size: median busbw (GB/s) of each variant over the rounds, and the ratios
    rdma / ib_write_bw (the ring's per-direction rate against perftest's one-way rate), rdma one
    way / ib_write_bw (like for like), rdma / ib_write_bw -b per direction (half its sum), rdma /
    tcp, rdma with idle sleep / rdma, rdma on 4 QPs per path / rdma and / ib_write_bw, rdma one way
    with the driver sleeping when idle / ib_write_bw and / rdma one way spinning (None where a
    variant was not measured; perftest has no sleeping mode for WRITE: ``-e`` answers "Events
    feature not available on WRITE verb"). ``rows``: ``{"size", "variant", "gbs"}`` (gbs may be None)."""
    out: Dict[int, Dict[str, Any]] = {}
    for size in sorted({int(r["size"]) for r in rows}):
        med = {}
        for v in sorted({r["variant"] for r in rows if int(r["size"]) == size}):
            med[v] = C.median([r["gbs"] for r in rows if int(r["size"]) == size and r["variant"] == v
                               and r["gbs"] is not None])
        bidi = med.get("ib_write_bw_bidi")
        out[size] = {
            "median_gbs": med,
            "rdma_vs_ib_write_bw": C.ratio(med.get("rdma"), med.get("ib_write_bw")),
            "rdma_oneway_vs_ib_write_bw": C.ratio(med.get("rdma_oneway"), med.get("ib_write_bw")),
            "rdma_oneway_idle_sleep_vs_ib_write_bw": C.ratio(med.get("rdma_oneway_idle_sleep"), med.get("ib_write_bw")),
            "rdma_oneway_idle_sleep_vs_rdma_oneway": C.ratio(med.get("rdma_oneway_idle_sleep"), med.get("rdma_oneway")),
            "rdma_vs_ib_write_bw_bidi_per_dir": C.ratio(med.get("rdma"), bidi / 2 if bidi is not None else None),
            "rdma_vs_tcp": C.ratio(med.get("rdma"), med.get("tcp")),
            "rdma_idle_sleep_vs_rdma": C.ratio(med.get("rdma_idle_sleep"), med.get("rdma")),
            "rdma_qps4_vs_rdma": C.ratio(med.get("rdma_qps4"), med.get("rdma")),
            "rdma_qps4_vs_ib_write_bw": C.ratio(med.get("rdma_qps4"), med.get("ib_write_bw")),
            "rdma_qps4_vs_ib_write_bw_qps4": C.ratio(med.get("rdma_qps4"), med.get("ib_write_bw_qps4")),
        }
    return out


def _resume_wait_detail(r: Mapping[str, Any]) -> str:
    """'; receivers' RESUME answers: ...' for a kind summary whose journals carry the split, else ''."""
    w, f = r.get("resume_wait_ms") or {}, r.get("resume_fence_ms") or {}
    if not w.get("n"):
        return ""
    out = f"; RESUME answers waited p50 {C.fmt(w['p50'], 1)}, max {C.fmt(w['max'], 1)} ms"
    if f.get("n"):
        q, a = r["resume_fence_queue_ms"], r["resume_fence_to_answer_ms"]
        g = r.get("resume_fence_grant_wait_ms") or {}
        grant = (f" (of it, waiting for a running grant of remote write {C.fmt(g['p50'], 1)}/{C.fmt(g['max'], 1)})"
                 if g.get("n") else "")
        out += (f" ({f['n']} of {w['n']} on the old path's fence: its queue p50/max {C.fmt(q['p50'], 1)}/"
                f"{C.fmt(q['max'], 1)}, run {C.fmt(f['p50'], 1)}/{C.fmt(f['max'], 1)}{grant}, end to answer "
                f"{C.fmt(a['p50'], 1)}/{C.fmt(a['max'], 1)} ms)")
    return out


def _open_detail(r: Mapping[str, Any]) -> str:
    """'; send path opens ...' for a kind summary whose journals carry open_us, else ''."""
    o = r.get("send_open_ms") or {}
    if not o.get("n"):
        return ""
    return (f"; {o['n']} send path opens held the caller p50 {C.fmt(o['p50'], 1)}, p99 {C.fmt(o['p99'], 1)}, "
            f"max {C.fmt(o['max'], 1)} ms")


def add_targets(rep: C.Report, kinds: Mapping[str, Mapping[str, Any]], bw: Mapping[int, Mapping[str, Any]],
                bare: Sequence[Mapping[str, Any]] = ()) -> None:
    """The issue's targets on the measured figures (judged as measured, whatever the bed)."""
    for kind, r in kinds.items():
        lim = TARGET_MS[r["target_class"]]
        c = r["convergence_ms"]
        rep.add_target(f"rdma: {kind} convergence (journal convergence_us), p99", c["p99"], "<=", lim, "ms",
                       detail=f"p50 {C.fmt(c['p50'], 1)}, max {C.fmt(c['max'], 1)} ms over {c['n']} failovers "
                              f"({r['faults']} faults); detection p50 {C.fmt(r['detection_ms']['p50'], 1)} ms; "
                              f"fault -> failover in A p50 {C.fmt(r['fault_to_failover_a_ms']['p50'], 1)} ms"
                              + _resume_wait_detail(r) + _open_detail(r))
        rep.add_target(f"rdma: {kind} faults without a failover", r["faults_without_failover"], "==", 0)
        rep.add_target(f"rdma: {kind} fatal errors", r["fatal"], "==", 0)
    for size, b in bw.items():
        if size >= 1 << 20:
            # Like for like where measured: one way against perftest's one way; else the ring.
            oneway = b.get("rdma_oneway_vs_ib_write_bw") is not None
            v = "rdma_oneway" if oneway else "rdma"
            rep.add_target(f"rdma: busbw {C.human_size(size)} railover-rdma{' one way' if oneway else ''} / ib_write_bw",
                           b[f"{v}_vs_ib_write_bw"], ">=", BW_TARGET,
                           detail=f"{v} {C.fmt(b['median_gbs'].get(v), 4)} GB/s, ib_write_bw "
                                  f"{C.fmt(b['median_gbs'].get('ib_write_bw'), 4)} GB/s (medians)")
            if b.get("rdma_oneway_idle_sleep_vs_ib_write_bw") is not None:
                m = b["median_gbs"]
                rep.add_target(f"rdma: busbw {C.human_size(size)} railover-rdma one way, driver sleeping when idle "
                               "/ ib_write_bw", b["rdma_oneway_idle_sleep_vs_ib_write_bw"], ">=", BW_TARGET,
                               detail=f"rdma_oneway_idle_sleep {C.fmt(m.get('rdma_oneway_idle_sleep'), 4)} GB/s, "
                                      f"ib_write_bw {C.fmt(m.get('ib_write_bw'), 4)} GB/s (medians)")


def _bw_row(size: Any, b: Mapping[str, Any], variants: Sequence[str], ratios: Sequence[Tuple[str, int]]) -> str:
    """One markdown row of a busbw table: the size, each variant's median in MB/s, then each
    ratio with its number of decimals ('-' where not measured)."""
    m = b["median_gbs"]
    cells = [C.human_size(int(size))]
    cells += [C.fmt(m.get(v) * 1e3 if m.get(v) is not None else None, 2) for v in variants]
    cells += [C.fmt(b.get(k), nd) for k, nd in ratios]
    return "| " + " | ".join(cells) + " |"


def markdown(data: Mapping[str, Any]) -> str:
    """The suite's section of docs/BENCHMARKS.md (tables; the prose is written by hand)."""
    s_ = data["settings"]
    res = data["results"]
    L = [f"Bed: {res.get('bed', {}).get('line', '?')}\n",
         f"Plugin environment in the guests (on top of `RAILOVER_TRANSPORT`): `{json.dumps(s_.get('plugin_env', {}))}`\n"]
    kinds = res.get("kinds", {})
    if kinds:
        L += [f"**Convergence** — {s_['faults_per_kind']} faults per kind on a0 under a checked ring all-reduce of "
              f"{s_['size']} (1 rank per guest, `RAILOVER_HOLD_DOWN_MS={s_['hold_down_ms']}`); ms, p50 / p99 / max.\n",
              "| kind | faults | failovers | journal convergence | detection (path_down) | fault → failover in A | "
              "failback convergence | no failover | fatal | target p99 |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for kind, r in kinds.items():
            s = lambda k: C.p50_p99_max(r[k], 1)
            L.append(f"| {kind} | {r['faults']} | {r['convergence_ms']['n']} | {s('convergence_ms')} | "
                     f"{s('detection_ms')} | {s('fault_to_failover_a_ms')} | {s('failback_convergence_ms')} | "
                     f"{r['faults_without_failover']} | {r['fatal']} | {TARGET_MS[r['target_class']]:g} ms |")
        measured = f"({sum(r['faults'] for r in kinds.values())} of {res.get('convergence_faults_planned', '?')} " \
                   "faults measured)"
        crashes = res.get("convergence_crashes") or []
        if crashes:
            L.append("\n**Guest kernel crashes** (the guests were rebooted and the faults went on in a new checked "
                     "run; a fault a crash interrupted ran again): " + "; ".join(f"{c['at']} ({c['error']})" for c in crashes) +
                     ("" if res.get("convergence_aborted") else f" {measured}."))
        if res.get("convergence_aborted"):
            L.append(f"\n**The convergence run did not finish**: {res['convergence_aborted']} {measured}.")
        wrong = res.get("convergence_wrong_bytes")
        unchecked = res.get("convergence_unchecked_faults") or 0
        L.append(f"\nWrong bytes in the convergence run: {'-' if wrong is None else wrong}; "
                 f"rank exit codes {res.get('convergence_exit_codes') or '-'}" +
                 (f"; {unchecked} fault(s) ran in a checked run whose ranks died with a crashed guest: their bytes "
                  "were not checked" if unchecked else "") + ".\n")
    bare = res.get("bare_rc", [])
    if bare:
        rc_ = s_.get("bare_retry_cnt")
        L += [f"**Bare RC** (`RAILOVER_STANDBY=none`, the same cable pull at a0, NCCL_IB_RETRY_CNT "
              f"{rc_ if rc_ is not None else '7 (default)'}):\n",
              "| fault | outcome | after (s) | after the cable was back |", "|---:|---|---:|---|"]
        for b in bare:
            L.append(f"| {b['i'] + 1} | {b['outcome']} | {C.fmt(b.get('after_s'), 1)} | {b.get('after_repair', '-')} |")
        L.append("")
    bw = res.get("busbw", {})
    if bw:
        L += [f"**busbw** on rail 0 (rxe0 <-> rxe0), {s_['bw_seconds']} s per measurement, {s_['rounds']} interleaved "
              "round(s), medians in MB/s (1 MB = 1e6 B); railover-perf sendrecv, 2 ranks, `-c 0` (ring: "
              "both directions at once; one way: `--pattern oneway`, A sends and B receives, as ib_write_bw).\n",
              "| size | rdma | rdma, one way | rdma, idle sleep | tcp | ib_write_bw | ib_write_bw -b (sum of both "
              "directions) | rdma / ib_write_bw | rdma one way / ib_write_bw | rdma / (ib_write_bw -b / 2) | "
              "rdma / tcp | idle sleep / spin |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for size, b in sorted(bw.items(), key=lambda kv: int(kv[0])):
            L.append(_bw_row(size, b, ("rdma", "rdma_oneway", "rdma_idle_sleep", "tcp", "ib_write_bw", "ib_write_bw_bidi"),
                             (("rdma_vs_ib_write_bw", 3), ("rdma_oneway_vs_ib_write_bw", 3),
                              ("rdma_vs_ib_write_bw_bidi_per_dir", 3), ("rdma_vs_tcp", 3),
                              ("rdma_idle_sleep_vs_rdma", 2))))
        if any(b["median_gbs"].get("rdma_qps4") is not None for b in bw.values()):
            L += ["\nSeveral QPs per path (`NCCL_IB_QPS_PER_CONNECTION=4`, each chunk split over the 4 QPs of "
                  "the path), in the same rounds:\n",
                  "| size | rdma, 1 QP | rdma, 4 QPs | ib_write_bw -q 4 | 4 QPs / 1 QP | 4 QPs / ib_write_bw | "
                  "4 QPs / ib_write_bw -q 4 |", "|---:|---:|---:|---:|---:|---:|---:|"]
            for size, b in sorted(bw.items(), key=lambda kv: int(kv[0])):
                L.append(_bw_row(size, b, ("rdma", "rdma_qps4", "ib_write_bw_qps4"),
                                 (("rdma_qps4_vs_rdma", 3), ("rdma_qps4_vs_ib_write_bw", 3),
                                  ("rdma_qps4_vs_ib_write_bw_qps4", 3))))
        if any(b["median_gbs"].get("rdma_oneway_idle_sleep") is not None for b in bw.values()):
            L += ["\nOne way, the driver busy-polling (`sched_yield` between passes, as NCCL's proxy thread) and "
                  "sleeping 50 µs after 64 idle passes (`--idle-sleep-us 50`), against ib_write_bw (which "
                  "busy-polls its CQ; it has no sleeping mode for WRITE), in the same rounds:\n",
                  "| size | rdma one way | rdma one way, idle sleep | ib_write_bw | one way / ib_write_bw | "
                  "one way idle sleep / ib_write_bw | idle sleep / spin (one way) |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
            for size, b in sorted(bw.items(), key=lambda kv: int(kv[0])):
                L.append(_bw_row(size, b, ("rdma_oneway", "rdma_oneway_idle_sleep", "ib_write_bw"),
                                 (("rdma_oneway_vs_ib_write_bw", 3), ("rdma_oneway_idle_sleep_vs_ib_write_bw", 3),
                                  ("rdma_oneway_idle_sleep_vs_rdma_oneway", 2))))
        for h, who in (("a", "A (sender; the ring sends both ways)"), ("b", "B (receiver; ib_write_bw's server only waits)")):
            cpu = res.get(f"cpu_{h}", {})
            if cpu:
                L += [f"\nGuest {who}: CPU during the measurements (medians of the fractions):\n",
                      "| variant | user | system | softirq | idle |", "|---|---:|---:|---:|---:|"]
                for v, c in sorted(cpu.items()):
                    L.append(f"| {v} | {C.fmt(c.get('user'), 2)} | {C.fmt(c.get('system'), 2)} | "
                             f"{C.fmt(c.get('softirq'), 2)} | {C.fmt(c.get('idle'), 2)} |")
    return "\n".join(L) + "\n"


def tables(data: Mapping[str, Any]) -> List[Table]:
    res = data["results"]
    out = []
    t = Table(title="rdma convergence (ms, p50 / p99 / max)")
    for c in ("kind", "faults", "failovers", "convergence", "detection", "fault->failover A", "failback conv",
              "no failover", "fatal"):
        t.add_column(c, justify="right")
    for kind, r in res.get("kinds", {}).items():
        t.add_row(kind, str(r["faults"]), str(r["convergence_ms"]["n"]), C.p50_p99_max(r["convergence_ms"]),
                  C.p50_p99_max(r["detection_ms"]), C.p50_p99_max(r["fault_to_failover_a_ms"]),
                  C.p50_p99_max(r["failback_convergence_ms"]), str(r["faults_without_failover"]), str(r["fatal"]))
    out.append(t)
    t = Table(title="bare RC (RAILOVER_STANDBY=none), cable pull at a0")
    for c in ("fault", "outcome", "after (s)", "after repair"):
        t.add_column(c)
    for b in res.get("bare_rc", []):
        t.add_row(str(b["i"] + 1), b["outcome"], C.fmt(b.get("after_s"), 1), str(b.get("after_repair", "-")))
    out.append(t)
    t = Table(title="busbw on rail 0 (MB/s, medians)")
    for c in ("size", "rdma", "rdma one way", "rdma idle-sleep", "tcp", "ib_write_bw", "ib_write_bw -b",
              "rdma/ib_write_bw", "one way/ib_write_bw", "rdma/tcp"):
        t.add_column(c, justify="right")
    for size, b in sorted(res.get("busbw", {}).items(), key=lambda kv: int(kv[0])):
        m = b["median_gbs"]
        mb = lambda v: C.fmt(m.get(v) * 1e3 if m.get(v) is not None else None, 2)
        t.add_row(C.human_size(int(size)), mb("rdma"), mb("rdma_oneway"), mb("rdma_idle_sleep"), mb("tcp"),
                  mb("ib_write_bw"), mb("ib_write_bw_bidi"), C.fmt(b["rdma_vs_ib_write_bw"], 3),
                  C.fmt(b.get("rdma_oneway_vs_ib_write_bw"), 3), C.fmt(b["rdma_vs_tcp"], 3))
    out.append(t)
    if any(b["median_gbs"].get("rdma_oneway_idle_sleep") is not None for b in res.get("busbw", {}).values()):
        t = Table(title="one way, driver spinning vs sleeping when idle (MB/s, medians)")
        for c in ("size", "rdma one way", "rdma one way idle-sleep", "ib_write_bw", "one way/ib_write_bw",
                  "idle-sleep/ib_write_bw"):
            t.add_column(c, justify="right")
        for size, b in sorted(res["busbw"].items(), key=lambda kv: int(kv[0])):
            m = b["median_gbs"]
            mb = lambda v: C.fmt(m.get(v) * 1e3 if m.get(v) is not None else None, 2)
            t.add_row(C.human_size(int(size)), mb("rdma_oneway"), mb("rdma_oneway_idle_sleep"), mb("ib_write_bw"),
                      C.fmt(b.get("rdma_oneway_vs_ib_write_bw"), 3),
                      C.fmt(b.get("rdma_oneway_idle_sleep_vs_ib_write_bw"), 3))
        out.append(t)
    return out


# --------------------------------------------------------------------------- bed helpers

def _journal(bed, host: str, wd: str) -> List[Dict[str, Any]]:
    """Journal events of the ranks running in ``host`` (one rank per guest here), in order,
    read by railover's journal parser (a line being written, or any garbled one, is skipped)."""
    rc, out, _ = bed.sh(host, f"cat {wd}/journal-rank*.jsonl 2>/dev/null || true", timeout_s=60)
    return [e for e in map(journal.parse_line, out.splitlines()) if e is not None]


def _fatal_events(paths: Sequence[Path]) -> int:
    """How many ``fatal`` events the journals ``paths`` hold (a missing one holds none)."""
    return sum(e["event"] == "fatal" for p in paths for e in journal.read(p))


def _proc_stat(bed, host: str) -> List[int]:
    rc, out, _ = bed.sh(host, "head -1 /proc/stat", timeout_s=60)
    return [int(x) for x in out.split()[1:9]] if out.startswith("cpu ") else []


class _PerfRun:
    """A railover-perf duration run in a thread, ended by a stop file in guest A (rank 0)."""

    def __init__(self, bed, env: Mapping[str, str], *, size: str, upper_s: float, check: bool = True,
                 workload: str = "allreduce", op_timeout: float = 240, fetch_to: Optional[Path] = None,
                 extra: Sequence[str] = ()):
        from railover.testbed.rdma import perf as rperf
        self.bed = bed
        self.stop_path = f"/tmp/rbench-stop-{secrets.token_hex(3)}"
        self.box: Dict[str, Any] = {}

        def run() -> None:
            try:
                self.box["res"] = rperf.run_perf(bed, ranks_per_host=1, timeout_s=upper_s + 600, workload=workload,
                                                 minbytes=size, duration=upper_s, warmup=1, channels=1,
                                                 op_timeout=op_timeout, rendezvous_timeout=300, check=check,
                                                 fetch_to=fetch_to, env=dict(env),
                                                 extra_args=["--stop-file", self.stop_path, *extra])
            except BaseException as e:  # reported by finish()
                self.box["error"] = e

        self.thread = threading.Thread(target=run, daemon=True, name="rdma-bench-perf")

    def start(self) -> "_PerfRun":
        self.thread.start()
        return self

    def wd(self) -> str:
        """The run's directory in the guests (``/tmp/rperf-<tag>``), once it exists."""
        rc, out, _ = self.bed.sh("A", "ls -dt /tmp/rperf-* 2>/dev/null | head -1", timeout_s=60)  # the newest
        return out.strip()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout_s: float = 600):
        """Touch the stop file; wait for the ranks; returns the PerfResult (BenchError when the
        run itself failed)."""
        if self.thread.is_alive():
            self.bed.run("A", ["touch", self.stop_path], timeout_s=60)
        self.thread.join(timeout_s)
        self.bed.run("A", ["rm", "-f", self.stop_path], timeout_s=60)
        if "error" in self.box:
            raise C.BenchError(f"railover-perf in the RDMA bed: {self.box['error']}")
        if "res" not in self.box:
            raise C.BenchError(f"railover-perf in the RDMA bed did not finish within {timeout_s:.0f} s of the stop file")
        return self.box["res"]


def _wait(pred: Callable[[], Any], timeout_s: float, interval_s: float = 1.0) -> Any:
    """Poll ``pred`` until truthy or ``timeout_s``; returns its last value (falsy on timeout)."""
    end = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v or time.monotonic() >= end:
            return v
        time.sleep(interval_s)


def _make_fault(bed, kind: str):
    from railover.testbed.rdma import faults as rf
    spec = KINDS[kind]
    return getattr(rf, spec["cls"])(bed, spec["nic"])


# --------------------------------------------------------------------------- phases

def convergence(bed, kinds: Sequence[str], n: int, size: str, hold_down_ms: int, work: Path,
                console: Console, conv_timeout_s: float, failback_timeout_s: float,
                crash_reboots: Optional[int] = 2, faults_per_run: Optional[int] = 10) -> Dict[str, Any]:
    """Phase 1: checked all-reduce runs, N faults per kind in turn (see the module doc).

    The faults run in checked runs (*segments*, work directories ``convergence``,
    ``convergence-2``, ...) of at most ``faults_per_run`` faults each (None: one run), each
    ended by its stop file and its bytes checked, so that a guest crash leaves at most that
    many faults with unchecked bytes.

    A guest kernel crash (6.1's rxe has crashed in ``rxe_skb_tx_dtor`` during ``ip link set
    down``, about 1 in 25 admin-down faults; a guest that stops answering counts as crashed
    when its console or QEMU says so) reboots the guests (:meth:`RdmaBed.reset`) and the
    faults go on in a new checked run, at most ``crash_reboots`` times (None: no reboot, the
    GuestCrash is raised to the caller, who owns the bed). The fault the guest crashed under
    (or before) is not measured and runs again in the new run; every crash is listed in
    ``convergence_crashes``. Any other bed failure, or one crash too many, stops the phase
    with what was measured so far (``convergence_aborted``). Wrong bytes and rank exit codes
    are summed / listed over the segments whose ranks finished; a crashed segment's ranks die
    with their guest (``result_lost`` in its ``convergence_segments`` entry; the journals of
    the guests still up are kept in its directory) and its faults' bytes were not checked
    (``convergence_unchecked_faults``). Each segment records both guests' clock offsets to the
    host at its start and end (``clock_offsets_us``, ``clock_offsets_end_us``: to put the two
    journals on one clock)."""
    if faults_per_run is not None and faults_per_run < 1:
        raise C.BenchError(f"faults per checked run must be >= 1, got {faults_per_run}")
    from railover.testbed.rdma.bed import GuestCrash, RdmaBedError
    from railover.testbed.faults import FaultError
    env = dict(RDMA_ENV, RAILOVER_HOLD_DOWN_MS=str(hold_down_ms))
    plan = [(kind, i) for kind in kinds for i in range(n)]
    per_kind: Dict[str, List[Dict[str, Any]]] = {k: [] for k in kinds}
    segments: List[Dict[str, Any]] = []
    crashes: List[Dict[str, Any]] = []
    results: List[Any] = []
    pos = 0
    aborted: Optional[str] = None

    def note_crash(e: BaseException, where: str, during_fault: bool, seg: Dict[str, Any]) -> None:
        nonlocal aborted
        first = str(e).splitlines()[0]
        crashes.append({"at": where, "during_fault": during_fault, "error": first})
        seg["ended"] = f"guest crash at {where}: {first}"
        console.print(f"  [red]{seg['ended']}[/]")
        if crash_reboots is not None and len(crashes) > crash_reboots:
            aborted = f"stopped at {where}: {first} (guest crash {len(crashes)}; {crash_reboots} reboot(s) allowed)"

    while pos < len(plan) and aborted is None:
        seg_dir = work / ("convergence" if not segments else f"convergence-{len(segments) + 1}")
        seg: Dict[str, Any] = {"dir": seg_dir.name, "first_fault": pos, "faults": 0, "ended": "completed",
                               "clock_offsets_us": _clock_offsets(bed)}
        segments.append(seg)
        state: Dict[str, Any] = {"pos": pos, "where": "the start of the checked run", "in_fault": False,
                                 "limit": faults_per_run, "wd": None}
        run = _PerfRun(bed, env, size=size, upper_s=3600, fetch_to=seg_dir).start()
        crash: Optional[BaseException] = None
        try:
            _fault_series(bed, run, plan, state, per_kind, seg, n, console, conv_timeout_s, failback_timeout_s)
        except GuestCrash as e:
            crash = e
        except (RdmaBedError, FaultError, C.BenchError, TimeoutError) as e:
            # a guest that stopped answering may have crashed; otherwise a fault that cannot
            # be applied, a run that ended, a bed that failed: the faults measured so far are
            # kept and reported, with where and why it stopped
            crash = _crashed_guest(bed) if isinstance(e, (TimeoutError, RdmaBedError)) else None
            if crash is None:
                aborted = f"stopped at {state['where']}: {e}"
        except BaseException:
            try:
                run.stop(timeout_s=60)
            except Exception:
                pass
            raise
        pos = state["pos"]
        if crash is not None:
            if crash_reboots is None:
                try:
                    run.stop(timeout_s=60)
                except Exception:
                    pass
                raise crash
            note_crash(crash, state["where"], state["in_fault"], seg)  # that fault runs again
        elif aborted is not None:
            seg["ended"] = aborted
            console.print(f"  [red]rdma convergence {aborted}[/]")
        try:
            res = run.stop(timeout_s=600 if crash is None and aborted is None else 60)
            results.append(res)
            seg.update(wrong_bytes=res.wrong_total, exit_codes=[r.returncode for r in res.ranks], ok=res.ok,
                       errors=res.errors[:5], clock_offsets_end_us=_clock_offsets(bed))
        except (RdmaBedError, C.BenchError, TimeoutError) as e:
            if crash is None and aborted is None:
                late = e if isinstance(e, GuestCrash) else _crashed_guest(bed)
                if late is None:
                    raise
                if crash_reboots is None:
                    raise late
                crash = late  # the guest died after the last fault of this run
                note_crash(late, "the end of the checked run", False, seg)
            seg["result_lost"] = str(e).splitlines()[0] if str(e) else type(e).__name__
            _keep_journals(bed, state["wd"], work / seg["dir"])
        if crash is not None and aborted is None:
            console.print("  [yellow]rebooting the guests; the faults go on in a new checked run[/]")
            try:
                for line in bed.reset():
                    console.print(f"  [dim]{line}[/]")
            except (RdmaBedError, TimeoutError) as e:
                aborted = f"stopped at {crashes[-1]['at']}: the guests did not come back after the crash: {e}"
    fatal = _fatal_events([work / seg["dir"] / f"journal-rank{r}.jsonl" for seg in segments for r in range(2)])
    complete = [s_ for s_ in segments if "wrong_bytes" in s_]
    out: Dict[str, Any] = {
        "kinds": {k: kind_summary(k, v) for k, v in per_kind.items() if v},
        "convergence_wrong_bytes": sum(s_["wrong_bytes"] for s_ in complete) if complete else None,
        "convergence_unchecked_faults": sum(s_["faults"] for s_ in segments if "wrong_bytes" not in s_),
        "convergence_exit_codes": [c for s_ in complete for c in s_["exit_codes"]] if complete else None,
        "convergence_fatal_total": fatal if not crashes and aborted is None else None,
        "convergence_busbw_gbs": ((results[0].ranks[0].json or {}).get("avg_busbw_gbps")
                                  if len(results) == 1 and len(segments) == 1 and results[0].ranks else None),
        "convergence_ok": (all(s_.get("ok") for s_ in complete) and len(complete) == len(segments)) if segments else None,
        "convergence_errors": [e for s_ in complete for e in s_["errors"]][:5],
        "convergence_crashes": crashes, "convergence_segments": segments,
    }
    if aborted is not None:
        out.update(convergence_aborted=aborted, convergence_faults_planned=len(plan))
    elif crashes:
        out["convergence_faults_planned"] = len(plan)
    return out


def _keep_journals(bed, wd: Optional[str], to: Path) -> None:
    """Copies the journals of a run whose ranks died with a crashed guest from the guests still
    up into ``to`` (``journal-rank<R>.jsonl``, rank 0 in guest A, rank 1 in B), best effort:
    the crashed guest's is gone with its /tmp."""
    if not wd:
        return
    for r, h in enumerate(("A", "B")):
        dst = to / f"journal-rank{r}.jsonl"  # replaces one an earlier bench left in the same --out
        try:
            rc, out, _ = bed.sh(h, f"cat {wd}/journal-rank*.jsonl", timeout_s=30)
        except Exception:  # the crashed guest (or one that stopped answering)
            continue
        if rc == 0 and out:
            to.mkdir(parents=True, exist_ok=True)
            dst.write_text(out)


def _crashed_guest(bed) -> Optional[BaseException]:
    """The GuestCrash of a guest whose QEMU exited or whose console shows a kernel crash, or
    None (a guest that is merely slow is not a crash)."""
    from railover.testbed.rdma.bed import GuestCrash
    check = getattr(bed, "_check_guest", None)
    if check is None:
        return None
    for h in ("A", "B"):
        try:
            check(h)
        except GuestCrash as e:
            return e
    return None


def _clock_offsets(bed) -> Optional[Dict[str, List[int]]]:
    """``{"A": [offset, error], "B": [...]}``, µs: each guest's CLOCK_MONOTONIC minus the host's
    (:meth:`RdmaBed.clock_offset_us`), so that the two guests' journals of a segment can be put
    on one clock (B's time - B's offset + A's offset = A's time, within the sum of the errors).
    None when a guest does not answer."""
    from railover.testbed.rdma.bed import RdmaBedError
    try:
        return {h: list(bed.clock_offset_us(h)) for h in ("A", "B")}
    except (RdmaBedError, TimeoutError):
        return None


def _fault_series(bed, run: "_PerfRun", plan: Sequence[Tuple[str, int]], state: Dict[str, Any],
                  per_kind: Dict[str, List[Dict[str, Any]]], seg: Dict[str, Any], n: int, console: Console,
                  conv_timeout_s: float, failback_timeout_s: float) -> None:
    """The faults ``plan[state["pos"]:]`` in one checked run, at most ``state["limit"]`` of
    them (None: all); advances ``state["pos"]`` after each fault measured, sets
    ``state["where"]``, ``state["in_fault"]`` (between applying a fault and recording it) and
    ``state["wd"]`` (the run's directory in the guests). Raises what the bed or the fault raises, BenchError when the
    run does not start, does not arm or ends."""
    wd = _wait(lambda: run.wd() if run.alive else "x", 300)
    if not wd or not run.alive:
        raise C.BenchError("railover-perf did not start in the RDMA bed")
    state["wd"] = wd

    def armed():
        return (armed_on_primary(_journal(bed, "A", wd)) and armed_on_primary(_journal(bed, "B", wd))) or not run.alive
    if not _wait(armed, 600) or not run.alive:
        raise C.BenchError("the comms did not come up on both rails with traffic on the primary within 600 s")
    while state["pos"] < len(plan):
        if state.get("limit") and seg["faults"] >= state["limit"]:
            return  # this checked run has had its faults: the next ones go in a new one
        kind, i = plan[state["pos"]]
        state["where"] = f"{kind} fault {i + 1}/{n}"
        if not _wait(armed, failback_timeout_s):
            console.print(f"  [yellow]{kind} {i + 1}/{n}: the comms are not back on the primary with a standby "
                          f"armed after {failback_timeout_s:.0f} s; faulting anyway[/]")
        base = {h: len(_journal(bed, h, wd)) for h in ("A", "B")}
        fault = _make_fault(bed, kind)
        # A fault run inside the guest stamps the clock after its command returned, which
        # under TCG can be after the plugin already reacted; fault -> failover is then
        # measured from a clock reading just before the command (an upper bound).
        # CablePull acts in QEMU and stamps the earliest moment of the change.
        t_before = None if KINDS[kind]["cls"] == "CablePull" else bed.guest_now_us(fault.guest)
        state["in_fault"] = True
        fault.apply()

        def failed_over():
            ja, jb = _journal(bed, "A", wd), _journal(bed, "B", wd)
            return (new_events(ja, base["A"], "failover") and new_events(jb, base["B"], "failover")) or not run.alive
        try:
            _wait(failed_over, conv_timeout_s)
        except BaseException:
            try:
                fault.undo()
            except Exception:  # the guest may be gone: the first error is the one to report
                pass
            raise
        fault.undo()
        # Everything since the pre-fault baseline: reading the journals right after the
        # undo would race a fast failback (it lands within ~1.5 s on the bed).
        def failed_back():
            ja, jb = _journal(bed, "A", wd), _journal(bed, "B", wd)
            fo = len(new_events(ja, base["A"], "failover")) + len(new_events(jb, base["B"], "failover"))
            fb = len(new_events(ja, base["A"], "failback")) + len(new_events(jb, base["B"], "failback"))
            return fb >= fo or not run.alive
        _wait(failed_back, failback_timeout_s)
        ja, jb = _journal(bed, "A", wd), _journal(bed, "B", wd)
        applied = t_before if t_before is not None else fault.applied_us
        applied = bed.map_clock_us(applied, fault.guest, "A", samples=5)[0]
        rec = cycle_record(i, applied, fault.undone_us, ja[base["A"]:], jb[base["B"]:])
        per_kind[kind].append(rec)
        state["pos"] += 1
        state["in_fault"] = False
        seg["faults"] += 1
        console.print(f"  {kind} {i + 1}/{n}: {rec['failovers']} failover(s), convergence "
                      f"{[round(x, 1) for x in rec['convergence_ms']]} ms, fault -> failover in A "
                      f"{C.fmt(rec['fault_to_failover_a_ms'], 0)} ms, {rec['failbacks']} failback(s)")
        if not run.alive:
            raise C.BenchError(f"railover-perf ended during {kind} fault {i + 1}")


def bare_rc(bed, n: int, size: str, bound_s: float, work: Path, console: Console,
            retry_cnt: Optional[int] = None) -> List[Dict[str, Any]]:
    """Phase 2: cable pull at a0 with RAILOVER_STANDBY=none, ``n`` times, a fresh run each;
    ``retry_cnt`` sets NCCL_IB_RETRY_CNT (None: the plugin's default, NCCL's 7, which rxe
    treats as "retry forever")."""
    out = []
    env = dict(RDMA_ENV, RAILOVER_STANDBY="none")
    if retry_cnt is not None:
        env["NCCL_IB_RETRY_CNT"] = str(retry_cnt)
    for i in range(n):
        # railover-perf's own stuck-request timer must not fire before the transport's
        run = _PerfRun(bed, env, size=size, upper_s=3600, op_timeout=bound_s * 3 + 120,
                       fetch_to=work / f"bare-{i}").start()
        rec: Dict[str, Any] = {"i": i, "bound_s": bound_s}
        try:
            wd = _wait(lambda: run.wd() if run.alive else "x", 300)
            _wait(lambda: any(e.get("event") == "path_up" and e.get("nic") == "eth1" for e in _journal(bed, "A", wd))
                  or not run.alive, 600)
            # traffic flowing: a few seconds of the all-reduce (the rank's progress is not
            # visible from outside; the journal's path_up came before the first message)
            t_up = time.monotonic()
            _wait(lambda: time.monotonic() - t_up >= 5, 10, 0.5)
            from railover.testbed.rdma import faults as rf
            fault = rf.CablePull(bed, "a0").apply()
            t0 = time.monotonic()

            def errored():
                if not run.alive:
                    return "ranks exited"
                evs = _journal(bed, "A", wd) + _journal(bed, "B", wd)
                f = [e for e in evs if e.get("event") == "fatal"]
                return f"fatal: {f[0].get('message', '')[:160]}" if f else None
            what = _wait(errored, bound_s)
            rec["after_s"] = time.monotonic() - t0 if what else None
            rec["outcome"] = (f"error after {rec['after_s']:.1f} s ({what})" if what
                              else f"no error within {bound_s:.0f} s (no fatal event, ranks running)")
            fault.undo()
        except Exception as e:
            rec["outcome"] = f"bench error: {e}"
        finally:
            try:
                res = run.stop(timeout_s=bound_s * 3 + 300)
                rec["exit_codes"] = [r.returncode for r in res.ranks]
                rec["wrong_bytes"] = res.wrong_total
                rec["after_repair"] = ("job completed, 0 wrong bytes" if res.ok and res.wrong_total == 0
                                       else f"job failed (exit codes {rec['exit_codes']}): "
                                            f"{'; '.join(res.errors[:2])[:200]}")
            except C.BenchError as e:
                rec["after_repair"] = str(e)
        console.print(f"  bare RC {i + 1}/{n}: {rec['outcome']}; {rec.get('after_repair')}")
        out.append(rec)
    return out


def _ib_write_bw(bed, size: int, seconds: int, bidi: bool, port: int, qps: int = 1) -> Tuple[Optional[float], str]:
    from railover.testbed.netns import poll_until
    a, b = bed.hosts[0].nics[0], bed.hosts[1].nics[0]
    # MB/sec (2**20 B/s, the default) rather than --report_gbits: 2 decimals of Gb/s are 5 % steps here
    args = ["-d", "DEV", "-x", "1", "-p", str(port), "-s", str(size), "-D", str(seconds), "-F"]
    if bidi:
        args.append("-b")
    if qps > 1:
        args += ["-q", str(qps)]  # perftest: that many QPs, the message stream spread over them
    srv = bed.spawn("B", ["ib_write_bw", *[b.rdma_dev if x == "DEV" else x for x in args]])

    def listening():
        if srv.poll() is not None:
            return True
        rc, out, _ = bed.run("B", ["ss", "-Hltn", f"sport = :{port}"], timeout_s=60)
        return rc == 0 and out.strip() != ""
    poll_until(listening, 180, 0.3, f"ib_write_bw listening on {port} in B")
    rc, out, err = bed.run("A", ["ib_write_bw", *[a.rdma_dev if x == "DEV" else x for x in args], b.addr],
                           timeout_s=seconds * 10 + 300)
    try:
        srv.wait(120)
    except TimeoutError:
        srv.kill(9)
    return parse_ib_write_bw(out, size), (out + err)[-600:]


def busbw(bed, sizes: Sequence[str], rounds: int, seconds: int, console: Console,
          variants: Sequence[str]) -> Tuple[List[Dict[str, Any]], Dict[str, Dict[str, Optional[float]]]]:
    """Phase 3: every variant at every size, ``rounds`` interleaved rounds."""
    from railover.testbed.rdma import perf as rperf
    rows: List[Dict[str, Any]] = []
    cpu: Dict[str, Dict[str, List[Dict[str, Optional[float]]]]] = {"A": {}, "B": {}}
    port = 18900
    for rnd in range(rounds):
        for s in sizes:
            size = parse_size(s)
            for v in variants:
                port += 1
                st0 = {h: _proc_stat(bed, h) for h in ("A", "B")}
                note = ""
                if v.startswith("ib_write_bw"):
                    gbs, note = _ib_write_bw(bed, size, seconds, v == "ib_write_bw_bidi", port,
                                             qps=4 if v == "ib_write_bw_qps4" else 1)
                else:
                    env = TCP_ENV if v == "tcp" else RDMA_QPS4_ENV if v == "rdma_qps4" else RDMA_ENV
                    extra = ((["--pattern", "oneway"] if v.startswith("rdma_oneway") else []) +
                             (["--idle-sleep-us", "50"] if v.endswith("idle_sleep") else []))
                    res = rperf.run_perf(bed, ranks_per_host=1, timeout_s=seconds + 900, workload="sendrecv",
                                         minbytes=size, duration=seconds, warmup=1, channels=1, op_timeout=240,
                                         rendezvous_timeout=300, check=False, env=env, extra_args=extra)
                    rws = res.ranks[0].json.get("rows", []) if res.ok and res.ranks[0].json else []
                    gbs = rws[-1]["busbw_gbps"] if rws else None
                    if gbs is None:
                        note = res.describe(600)
                st1 = {h: _proc_stat(bed, h) for h in ("A", "B")}
                split = {h: cpu_split(st0[h], st1[h]) if st0[h] and st1[h] else {} for h in ("A", "B")}
                for h in ("A", "B"):
                    cpu[h].setdefault(v, []).append(split[h])
                rows.append({"round": rnd, "size": size, "variant": v, "gbs": gbs, "cpu_a": split["A"],
                             "cpu_b": split["B"], **({"note": note} if gbs is None else {})})
                console.print(f"  busbw round {rnd + 1} {C.human_size(size)} {v}: "
                              f"{C.fmt(gbs * 1e3 if gbs is not None else None, 2)} MB/s; "
                              + "; ".join(f"{h} cpu " + ", ".join(f"{k} {C.fmt(x, 2)}" for k, x in split[h].items()
                                                                 if k != "steal") for h in ("A", "B")))
    cpu_med = {h: {v: {k: C.median([x.get(k) for x in xs if x.get(k) is not None])
                       for k in ("user", "system", "softirq", "idle")} for v, xs in per.items()}
               for h, per in cpu.items()}
    return rows, cpu_med


#: every busbw variant ``--bw-variants`` accepts; DEFAULT_BW_VARIANTS run unless told
BW_VARIANTS = ("rdma", "rdma_oneway", "rdma_idle_sleep", "rdma_oneway_idle_sleep", "rdma_qps4", "tcp",
               "ib_write_bw", "ib_write_bw_bidi", "ib_write_bw_qps4")
DEFAULT_BW_VARIANTS = ("rdma", "rdma_oneway", "rdma_idle_sleep", "rdma_oneway_idle_sleep", "tcp", "ib_write_bw",
                       "ib_write_bw_bidi")


def run(out: Path, quick: bool = False, faults: Optional[int] = None, kinds: Sequence[str] = DEFAULT_KINDS,
        size: str = "256K", bw_sizes: Optional[Sequence[str]] = None, rounds: Optional[int] = None,
        bare_faults: Optional[int] = None, bare_bound_s: Optional[float] = None, hold_down_ms: int = 1000,
        phases: Sequence[str] = ("convergence", "bare", "busbw"), console: Optional[Console] = None,
        bed=None, bw_variants: Sequence[str] = DEFAULT_BW_VARIANTS, bare_retry_cnt: Optional[int] = None,
        wire: str = "stream", faults_per_run: int = 10) -> Dict[str, Any]:
    """Run the suite (boots its own bed unless ``bed`` is given, with NIC wires ``wire``:
    ``stream`` lossless or ``udp`` lossy, see :class:`railover.testbed.rdma.RdmaBed`); the
    convergence faults run in checked runs of ``faults_per_run`` faults (0: one run); returns
    the report dict and writes ``<out>/rdma.json``. Raises BenchError when the bed cannot run."""
    console = console or Console()
    for k in kinds:
        if k not in KINDS:
            raise C.BenchError(f"unknown fault kind {k!r}; one of {', '.join(KINDS)}")
    for v in bw_variants:
        if v not in BW_VARIANTS:
            raise C.BenchError(f"unknown busbw variant {v!r}; one of {', '.join(BW_VARIANTS)}")
    from railover.testbed.rdma.bed import WIRES
    if wire not in WIRES:
        raise C.BenchError(f"unknown wire {wire!r}; one of {', '.join(WIRES)}")
    for p in phases:
        if p not in ("convergence", "bare", "busbw"):
            raise C.BenchError(f"unknown phase {p!r}; convergence, bare, busbw")
    n = faults or (5 if quick else 30)
    bw_sizes = list(bw_sizes or (["1M"] if quick else ["64K", "1M", "4M"]))
    for s in bw_sizes + [size]:
        try:
            parse_size(s)
        except ValueError as e:
            raise C.BenchError(str(e))
    rounds = rounds or (1 if quick else 2)
    bare_n = bare_faults if bare_faults is not None else 2
    bound = bare_bound_s or (45.0 if quick else 90.0)
    seconds = 5 if quick else 10
    from railover.testbed.rdma import bed as rbed
    from railover.testbed.rdma.perf import TCG_PLUGIN_ENV
    from railover.testbed.faults import FaultError
    if bare_n < 0 or bound <= 0 or n < 1:
        raise C.BenchError("--faults and --bare-bound-s must be positive, --bare-faults >= 0")
    if faults_per_run < 0:
        raise C.BenchError(f"--faults-per-run must be >= 0 (0: every fault in one checked run), got {faults_per_run}")
    if bare_retry_cnt is not None and not 0 <= bare_retry_cnt <= 7:
        raise C.BenchError(f"--bare-retry-cnt must be 0..7 (NCCL_IB_RETRY_CNT), got {bare_retry_cnt}")
    own = bed is None
    if own:
        try:
            bed = rbed.RdmaBed(rails=2, boot_timeout_s=600, wire=wire,
                               log=lambda m: console.print(f"[dim][rdma bed] {m}[/]")).up()
        except rbed.RdmaBedError as e:
            raise C.BenchError(f"the RDMA test bed could not start: {e}")
    plugin_env = dict(TCG_PLUGIN_ENV) if bed.accel != "kvm" else {}
    rep = C.Report("rdma", out, quick, {"faults_per_kind": n, "kinds": list(kinds), "size": size,
                                        "hold_down_ms": hold_down_ms, "bw_sizes": bw_sizes, "rounds": rounds,
                                        "bw_seconds": seconds, "bare_faults": bare_n, "bare_bound_s": bound,
                                        "bare_retry_cnt": bare_retry_cnt, "faults_per_run": faults_per_run,
                                        "plugin_env": plugin_env, "phases": list(phases), "check": True})
    work = Path(out) / "rdma-work"
    try:
        h = bed.hosts[0]
        rep.results["bed"] = {"accel": bed.accel, "accel_reason": getattr(bed, "accel_reason", ""),
                              "kernel": h.kernel, "smp": bed.smp or (1 if bed.accel != "kvm" else 2),
                              "mem_mib": bed.mem_mib, "boot_s": bed.boot_s, "wire": getattr(bed, "wire", "udp"),
                              "line": f"2 QEMU guests ({bed.accel}, {bed.smp or (1 if bed.accel != 'kvm' else 2)} vCPU, "
                                      f"{bed.mem_mib} MiB each, guest kernel {h.kernel}), rxe0/rxe1 on virtio-net "
                                      f"rails joined by " + ("QEMU UDP sockets on the host (lossy)"
                                                             if getattr(bed, "wire", "udp") == "udp"
                                                             else "QEMU unix stream sockets on the host (lossless)")}
        if "convergence" in phases:
            console.print(f"[bold]rdma convergence[/]: {n} faults per kind ({', '.join(kinds)}) under a checked "
                          f"all-reduce of {size}")
            rep.results.update(convergence(bed, kinds, n, size, hold_down_ms, work, console,
                                           conv_timeout_s=60.0, failback_timeout_s=120.0 + hold_down_ms / 1e3,
                                           faults_per_run=faults_per_run or None))
            if rep.results["convergence_wrong_bytes"] is not None:
                rep.add_wrong(rep.results["convergence_wrong_bytes"])
            aborted = rep.results.get("convergence_aborted")
            crashes = rep.results.get("convergence_crashes") or []
            if crashes and not aborted:
                done = sum(k["faults"] for k in rep.results["kinds"].values())
                lost = [c["at"] for c in crashes if c["during_fault"]]
                rep.add_target("rdma: convergence faults run", done, "==", n * len(kinds),
                               detail=f"{len(crashes)} guest kernel crash(es), rebooted and continued; "
                                      + (f"run again: {', '.join(lost)}" if lost else "no fault lost"))
                unchecked = rep.results.get("convergence_unchecked_faults") or 0
                rep.add_target("rdma: convergence faults whose bytes were not checked", unchecked, "==", 0,
                               detail="faults of checked runs whose ranks died with a crashed guest"
                                      + (f" (at most --faults-per-run {faults_per_run} per crash)" if faults_per_run
                                         else ""))
            if aborted:
                # Keep what was measured: judge it, write the report, then fail the run.
                done = sum(k["faults"] for k in rep.results["kinds"].values())
                rep.add_target("rdma: convergence faults run", done, "==", n * len(kinds), detail=aborted)
                add_targets(rep, rep.results["kinds"], {})
                rep.finish()
                raise C.BenchError(f"the convergence run {aborted}; the {done} fault(s) measured before are in "
                                   f"{Path(out) / 'rdma.json'}")
        if "bare" in phases and bare_n:
            console.print(f"[bold]rdma bare RC[/]: {bare_n} cable pulls with RAILOVER_STANDBY=none (bound {bound:.0f} s)")
            rep.results["bare_rc"] = bare_rc(bed, bare_n, size, bound, work, console, bare_retry_cnt)
        if "busbw" in phases:
            console.print(f"[bold]rdma busbw[/]: {', '.join(bw_variants)} at {', '.join(bw_sizes)}, {rounds} round(s)")
            rows, cpu_med = busbw(bed, bw_sizes, rounds, seconds, console, bw_variants)
            rep.results["busbw_rows"] = rows
            rep.results["busbw"] = {str(k): v for k, v in bw_ratios(rows).items()}
            rep.results["cpu_a"], rep.results["cpu_b"] = cpu_med["A"], cpu_med["B"]
        add_targets(rep, rep.results.get("kinds", {}), {int(k): v for k, v in rep.results.get("busbw", {}).items()})
    except (rbed.RdmaBedError, FaultError) as e:
        raise C.BenchError(f"the RDMA bed failed during the benchmark: {e}")
    finally:
        if own:
            bed.down()
    data = rep.finish()
    for t in tables(data):
        console.print(t)
    return data
