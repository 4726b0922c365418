"""``railover-perf`` ranks in the guests of an RDMA bed.

Ranks are placed host by host (``ranks_per_host`` each: ranks 0..k-1 in A, k..2k-1 in B) and
run the current build's ``railover-perf`` and plugin from the bed's read-only share. They meet
through railover-perf's UNIX-socket rendezvous: each guest has its own rendezvous directory,
and ``railover-verbs-probe relay`` processes carry the connections to the other guest's ranks
over the management NIC (a UNIX listener at ``rank<R>.sock`` in the guest that does not own
rank R, a TCP listener on port ``RELAY_PORT_BASE + R`` in the guest that does). The plugin is
confined to the rail NICs with ``RAILOVER_IFNAMES`` and writes its event journal to
``/tmp/<run>/journal-rank<R>.jsonl``; results and journals are fetched into ``fetch_to``.

Example::

    res = run_perf(bed, ranks_per_host=2, workload="allreduce", maxbytes="1M", fetch_to="out")
    res.check()
"""
from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from railover import _paths
from railover.perf import PerfResult, RankResult, build_argv
from railover.testbed.netns import poll_until
from railover.testbed.rdma.bed import GuestProc, RdmaBed, RdmaBedError

__all__ = ["RELAY_PORT_BASE", "TCG_PLUGIN_ENV", "run_perf"]

#: TCP port of the relay for rank R is RELAY_PORT_BASE + R (management NIC only).
RELAY_PORT_BASE = 19300

#: Plugin timers for emulated (TCG) guests, where a rank can be descheduled for hundreds of
#: ms: with the defaults (20 ms x 5 probes) healthy paths were declared down (measured: "probe
#: timeout: no answer for 124 ms" on idle rails, 2 ranks per 1-vCPU guest, loaded host).
#: Detection becomes 250 ms x 40 = 10 s. The flow-stall rule (an RC QP whose HCA acknowledged
#: nothing with writes in flight) waits as long as the stall watch: in this bed the peer's "HCA"
#: is its guest's kernel, which a loaded host can leave unscheduled for hundreds of ms. Callers'
#: ``env`` overrides these.
TCG_PLUGIN_ENV: Dict[str, str] = {"RAILOVER_PROBE_INTERVAL_MS": "250", "RAILOVER_PROBE_MULT": "40",
                                  "RAILOVER_STALL_MS": "5000", "RAILOVER_FLOW_STALL_MS": "5000",
                                  "RAILOVER_TCP_USER_TIMEOUT_MS": "60000"}


def run_perf(bed: RdmaBed, ranks_per_host: int = 1, *, env: Optional[Mapping[str, str]] = None,
             per_rank_env: Optional[Mapping[int, Mapping[str, str]]] = None,
             timeout_s: float = 600.0, fetch_to: Union[str, Path, None] = None,
             **argv_options: Any) -> PerfResult:
    """Run ``2 * ranks_per_host`` ranks across the bed's guests and wait at most ``timeout_s``
    seconds (then the ranks are killed and ``timed_out`` is set). ``env`` is added to each
    rank's environment on top of the rail restriction, the journal path and (under TCG)
    :data:`TCG_PLUGIN_ENV`; ``per_rank_env[r]`` is added on top for rank r only. ``argv_options``
    go to :func:`railover.perf.build_argv`. Returns a :class:`PerfResult` (``workdir`` =
    ``fetch_to`` when given); does not raise on rank failure (call ``check()``). Raises
    :class:`RdmaBedError` when the relays cannot start."""
    if ranks_per_host < 1:
        raise ValueError("ranks_per_host must be >= 1")
    nranks = ranks_per_host * len(bed.hosts)
    tag = secrets.token_hex(3)
    wd = f"/tmp/rperf-{tag}"
    rv = f"{wd}/rv"
    owner = {r: bed.hosts[r // ranks_per_host] for r in range(nranks)}
    for h in bed.hosts:
        bed.run(h, ["mkdir", "-p", rv], check=True)
    relays: List[GuestProc] = []
    procs: Dict[int, GuestProc] = {}
    try:
        for r in range(nranks):
            home = owner[r]
            # Only higher ranks connect to rank r: relay when a higher rank lives elsewhere.
            users = {owner[q].name for q in range(r + 1, nranks)} - {home.name}
            if not users:
                continue
            relays.append(bed.spawn(home, ["railover-verbs-probe", "relay", "--listen-tcp", str(RELAY_PORT_BASE + r),
                                           "--connect-unix", f"{rv}/rank{r}.sock", "--deadline", str(timeout_s)]))
            for u in users:
                relays.append(bed.spawn(u, ["railover-verbs-probe", "relay", "--listen-unix", f"{rv}/rank{r}.sock",
                                            "--connect-tcp", f"{home.mgmt_addr}:{RELAY_PORT_BASE + r}",
                                            "--deadline", str(timeout_s)]))
        for p in relays:
            poll_until(lambda p=p: any(e.get("ev") == "ready" for e in p.json_lines()) or p.poll() is not None,
                       120, 0.2, f"relay in {p.host}")
            if p.returncode is not None:
                raise RdmaBedError(f"relay in {p.host} failed: {p.stderr().strip()}")
        opts = dict(argv_options)
        opts.setdefault("json_path", f"{wd}/rank%r.json")
        full_env = dict(bed.rail_env())
        if bed.accel != "kvm":
            full_env.update(TCG_PLUGIN_ENV)
        full_env.update(env or {})
        argvs = {}
        for r in range(nranks):
            argvs[r] = build_argv(r, nranks, rv, binary=f"/mnt/build/bin/{_paths.PERF_FILE}",
                                  plugin=f"/mnt/build/lib/{_paths.PLUGIN_FILE}", **opts)
            e = dict(full_env, RAILOVER_EVENT_LOG=f"{wd}/journal-rank{r}.jsonl")
            e.update((per_rank_env or {}).get(r, {}))
            procs[r] = bed.spawn(owner[r], argvs[r], env=e)
        deadline = time.monotonic() + timeout_s
        timed_out = False
        for r in range(nranks):
            try:
                procs[r].wait(max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                timed_out = True
                break
    finally:
        for p in list(procs.values()) + relays:
            if p.returncode is None:
                p.kill(9)
        for p in list(procs.values()) + relays:
            try:
                p.wait(60)
            except TimeoutError:
                pass
    out = Path(fetch_to) if fetch_to is not None else (bed.run_dir / f"perf-{tag}")  # type: ignore[operator]
    out.mkdir(parents=True, exist_ok=True)
    ranks = []
    for r in range(nranks):
        p = procs[r]
        res = RankResult(rank=r, returncode=p.returncode, stdout=p.stdout(), stderr=p.stderr())
        (out / f"rank{r}.out").write_text(res.stdout)
        (out / f"rank{r}.err").write_text(res.stderr)
        jpath = str(opts["json_path"]).replace("%r", str(r))
        for src, dst in ((jpath, out / f"rank{r}.json"), (f"{wd}/journal-rank{r}.jsonl", out / f"journal-rank{r}.jsonl")):
            try:
                bed.fetch(owner[r], src, dst)
            except RdmaBedError as e:
                res.stderr += f"\n[rdma perf] {e}"
        jf = out / f"rank{r}.json"
        if jf.exists():
            try:
                res.json = json.loads(jf.read_text())
            except ValueError as e:
                res.stderr += f"\n[rdma perf] cannot parse {jf}: {e}"
        ranks.append(res)
    for h in bed.hosts:
        bed.run(h, ["rm", "-rf", wd])
    return PerfResult(ranks=ranks, timed_out=timed_out, workdir=out, argv0=argvs.get(0, []))
