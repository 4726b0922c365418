#!/usr/bin/env python3
"""Validate railover under stock NCCL + PyTorch: two ranks on ONE GPU, a real link fault.

Each rank gets its own NCCL_HOSTID, so NCCL believes the two processes sit on two hosts:
the duplicate-GPU check passes, P2P/SHM are refused, and every byte between them goes
through the network transport: railover ('plugin' mode) or NCCL's own Socket transport
('control' mode). 'dry' runs the same phases with gloo on the CPU, to test this script on a
machine without a GPU.

With ``--testbed PREFIX`` (a detached ``railover testbed up --layout 2x3``) rank 0 runs in
host namespace A and rank 1 in B. NICs 0 and 1 of each host are railover's rails
(RAILOVER_IFNAMES); NIC 2 carries only the out-of-band traffic that NCCL and PyTorch do not
protect (NCCL bootstrap via NCCL_SOCKET_IFNAME, the c10d TCP store, gloo). The fault is real:
rank 0 sets the *switch port* of the railover NIC that carries the most traffic down
(``ip -n <fabric ns> link set <port> down``) mid-run and up again later.

  orchestrator: gpu_validate.py --mode {plugin,control,dry} --work DIR [options]
  worker:       started by the orchestrator with --worker RANK (same options)

Results: ``<work>/summary-<mode>.json`` (verdict, log checks, per-phase results, journal
summary of the fault), ``<work>/fault.csv`` (per-iteration timeline of the fault phase).
The checks are pure functions (``check_logs``, ``journal_summary``, ``verdict``,
``bench_text``) tested in tests/unit/test_ops_gpu_validate.py.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

WORLD = 2
PLUGIN_NAME = "railover"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["plugin", "control", "dry"], required=True)
    p.add_argument("--work", required=True, help="scratch directory for logs and results")
    p.add_argument("--plugin-so", default="", help="path of libnccl-net-railover.so (plugin mode)")
    p.add_argument("--plugin-env", action="append", default=[], help="KEY=VALUE passed to both ranks")
    p.add_argument("--testbed", default="", help="prefix of a detached 2x3 test bed: run each rank in its own host netns")
    p.add_argument("--max-bytes", type=int, default=256 << 20, help="largest all-reduce of the sweep, bytes")
    p.add_argument("--fault-at", type=float, default=8.0, help="seconds into the fault phase when the port goes down")
    p.add_argument("--heal-at", type=float, default=16.0, help="seconds into the fault phase when it comes back")
    p.add_argument("--fault-duration", type=float, default=26.0, help="length of the fault phase, seconds")
    p.add_argument("--fault-bytes", type=int, default=16 << 20, help="all-reduce size during the fault phase, bytes")
    p.add_argument("--op-timeout", type=int, default=60, help="collective timeout of the process group, seconds")
    p.add_argument("--deadline", type=float, default=200.0, help="the orchestrator kills the workers after this, seconds")
    p.add_argument("--skip", default="", help="comma list of phases to skip: correct,sweep,colls,fault,reinit")
    p.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- pure checks

def check_logs(texts: Mapping[int, str], mode: str, plugin_name: str = PLUGIN_NAME,
               expected_abi: Optional[int] = None) -> Tuple[bool, Dict[str, Any]]:
    """Prove from NCCL's own INFO lines (``texts[rank]`` = that rank's NCCL_DEBUG_FILE) which
    network carried the traffic. Required in every mode: the NCCL_HOSTID override took, 2
    nodes with 1 local rank each, ``Using network <name>``, channels ``via NET/<name>``;
    forbidden: ``via P2P``, ``via SHM``, ``Duplicate GPU``. Plugin mode also needs ``Loaded
    net plugin railover (vN)`` (and N == ``expected_abi`` when given) and railover's own
    ``railover: NIC`` lines. Returns ``(all ok, per-rank details)``."""
    name = "Socket" if mode == "control" else plugin_name
    q = re.escape(name)
    required = {
        "hostid_override": r"NCCL_HOSTID set by environment to gpuval-node",
        "two_nodes": r"nRanks 2 nNodes 2 localRanks 1",
        "using_network": r"Using network " + q + r"\b",
        "channels_via_net": r"via NET/" + q + r"/",
    }
    if mode == "plugin":
        required["plugin_loaded"] = r"Loaded net plugin " + q + r" \(v\d+\)"
        required["railover_nic_lines"] = r"railover: NIC \d+ "
    forbidden = {"no_p2p": r"via P2P", "no_shm": r"via SHM", "no_duplicate_gpu": r"Duplicate GPU"}
    out: Dict[str, Any] = {}
    ok = True
    for r in range(WORLD):
        text = texts.get(r, "")
        res: Dict[str, Any] = {k: bool(re.search(v, text)) for k, v in required.items()}
        res.update({k: not re.search(v, text) for k, v in forbidden.items()})
        ok = ok and all(res.values())
        m = re.search(r"Loaded net plugin \S+ \((v\d+)\)", text)
        res["plugin_api"] = m.group(1) if m else None
        if mode == "plugin" and expected_abi is not None:
            res["abi_matches_nccl"] = res["plugin_api"] == f"v{expected_abi}"
            ok = ok and res["abi_matches_nccl"]
        m = re.search(r"NCCL version (\S+)", text)
        res["nccl_version_line"] = m.group(1) if m else None
        res["warn_lines"] = len(re.findall(r"NCCL WARN", text))
        res["unload_lines"] = len(re.findall(r"Unloading plugin", text))
        res["networks_used"] = sorted(set(re.findall(r"Using network (\S+)", text)))
        out["rank%d" % r] = res
    return ok, out


def journal_summary(events: Iterable[Mapping[str, Any]], fault_mono_us: Optional[int] = None,
                    heal_mono_us: Optional[int] = None) -> Dict[str, Any]:
    """What railover's journals (all ranks) say about the fault phase: counts of failover,
    failback, flap and fatal events after the fault, the first detection and failover
    (ms after ``fault_mono_us``, CLOCK_MONOTONIC µs) and the first failback (ms after
    ``heal_mono_us``)."""
    evs = sorted((e for e in events if fault_mono_us is None or e.get("t_us", 0) >= fault_mono_us),
                 key=lambda e: e.get("t_us", 0))
    s: Dict[str, Any] = {k: sum(1 for e in evs if e.get("event") == k) for k in ("failover", "failback", "flap", "fatal")}
    s["bytes_resent"] = sum(int(e.get("bytes_resent", 0)) for e in evs if e.get("event") in ("failover", "failback"))
    first = lambda kinds, since: next((e for e in evs if e.get("event") in kinds and e.get("t_us", 0) >= since), None)  # noqa: E731
    if fault_mono_us is not None:
        d = first(("nic_down", "pair_down", "path_down"), fault_mono_us)
        s["detection_ms"] = round((d["t_us"] - fault_mono_us) / 1e3, 3) if d else None
        f = first(("failover",), fault_mono_us)
        s["first_failover_ms"] = round((f["t_us"] - fault_mono_us) / 1e3, 3) if f else None
        s["convergence_us"] = [int(e.get("convergence_us", 0)) for e in evs if e.get("event") == "failover"]
    if heal_mono_us is not None:
        b = first(("failback",), heal_mono_us)
        s["first_failback_ms"] = round((b["t_us"] - heal_mono_us) / 1e3, 3) if b else None
    s["fatal_messages"] = [e.get("message") for e in evs if e.get("event") == "fatal"][:5]
    return s


def verdict(summary: Mapping[str, Any]) -> Tuple[str, List[str]]:
    """``("PASS"|"FAIL", reasons)`` for one mode's summary: every rank exited 0, the log checks
    passed (not in dry mode), 0 wrong elements, all phases done, a fault injected when one was
    expected (``fault_expected``: a test bed and the fault phase not skipped), and when a fault was injected:
    its commands succeeded, 0 errors during it and (plugin mode) the journals show a failover
    and a failback and no fatal error."""
    reasons = []
    if summary.get("exit_codes") != [0] * WORLD:
        reasons.append(f"exit codes {summary.get('exit_codes')}")
    if summary.get("mode") != "dry" and not summary.get("logs_ok", False):
        reasons.append("NCCL log checks failed")
    r0 = summary.get("rank0", {})
    if not r0.get("done"):
        reasons.append("rank 0 did not finish every phase")
    if r0.get("wrong_total", 1) != 0:
        reasons.append(f"{r0.get('wrong_total')} wrong elements")
    fault = r0.get("fault")
    if summary.get("fault_expected") and not (isinstance(fault, dict) and fault.get("injected")):
        reasons.append("no fault was injected although a test bed was given and the fault phase was not skipped")
    if isinstance(fault, dict) and fault.get("injected"):
        if fault.get("errors", 1) != 0:
            reasons.append(f"{fault.get('errors')} wrong elements during the fault")
        bad = [e for e in fault.get("events", []) if e.get("rc") not in (0, None)]
        if bad:
            reasons.append(f"fault command failed: {bad}")
        if summary.get("mode") == "plugin":
            j = summary.get("journal", {})
            if j.get("failover", 0) < 1:
                reasons.append("no failover in railover's journals")
            if j.get("failback", 0) < 1:
                reasons.append("no failback in railover's journals")
            if j.get("fatal", 0):
                reasons.append(f"fatal errors: {j.get('fatal_messages')}")
    return ("FAIL" if reasons else "PASS"), reasons


def bench_text(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """nccl-tests style table of every mode's all-reduce sweep."""
    out = []
    for m, s in summaries.items():
        rows = s.get("rank0", {}).get("sweep", [])
        if not rows:
            continue
        out.append("# in-place all_reduce, 2 ranks on one GPU, mode %s, nccl %s" % (m, s["rank0"].get("nccl", "-")))
        out.append("# %10s %12s %6s %6s %10s %8s %8s %6s" % ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"))
        out.append("# %10s %12s %6s %6s %10s %8s %8s %6s" % ("(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""))
        for r in rows:
            out.append("  %10d %12d %6s %6s %10.1f %8.3f %8.3f %6d" % (r["size"], r["count"], r["type"], r["redop"],
                                                                   r["time_us"], r["algbw"], r["busbw"], r["wrong"]))
        out.append("# Avg bus bandwidth    : %.4f\n#" % s["rank0"].get("avg_busbw", 0))
    return "\n".join(out) + "\n"


def trim(text: str, head: int = 400_000, tail: int = 200_000) -> str:
    """Keep the first ``head`` and last ``tail`` characters (NCCL's proof lines are at the start
    of its log, failures at the end)."""
    if len(text) <= head + tail:
        return text
    return text[:head] + "\n[... %d characters cut ...]\n" % (len(text) - head - tail) + text[-tail:]


def busiest_nic(state: Optional[Mapping[str, Any]], candidates: List[str]) -> str:
    """The candidate NIC with the most active paths in a railover state file (the first
    candidate when there is no state)."""
    counts = {n: 0 for n in candidates}
    for c in (state or {}).get("comms", []):
        for p in c.get("paths", []):
            if p.get("state") == "active" and p.get("nic") in counts:
                counts[p["nic"]] += 1
    return max(candidates, key=lambda n: (counts[n], -candidates.index(n)))


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    except OSError:
        pass
    return out


# ----------------------------------------------------------------------------- orchestrator

def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def bed_layout(prefix: str) -> Dict[str, Any]:
    """Names and addresses of a detached test bed (via railover.testbed.netns): per rank its host
    netns, railover NICs with their switch ports, the out-of-band NIC and address; and the
    fabric netns. Raises RuntimeError when the bed is not a 2-host, 3-NIC one."""
    from railover.testbed.netns import TestBed
    tb = TestBed.attach(prefix)
    if len(tb.hosts) != 2 or len(tb.hosts[0].nics) != 3:
        raise RuntimeError(f"test bed {prefix} is {tb.layout}; gpu_validate needs --layout 2x3")
    ranks = []
    for h in tb.hosts:
        ranks.append({"ns": h.ns, "data": [n.ifname for n in h.nics[:2]], "ports": [n.port for n in h.nics[:2]],
                      "oob_if": h.nics[2].ifname, "oob_addr": h.nics[2].addr})
    return {"prefix": prefix, "fabric_ns": tb.fabric_ns, "ranks": ranks}


def worker_env(a, rank: int, port: int, port2: int, bed: Optional[Dict[str, Any]]) -> Dict[str, str]:
    env = dict(os.environ)
    master = bed["ranks"][0]["oob_addr"] if bed else "127.0.0.1"
    env.update(MASTER_ADDR=master, MASTER_PORT=str(port), MASTER_PORT2=str(port2), RANK=str(rank),
               WORLD_SIZE=str(WORLD), LOCAL_RANK="0", PYTHONUNBUFFERED="1")
    if bed:
        env["GLOO_SOCKET_IFNAME"] = bed["ranks"][rank]["oob_if"]
        env["GPUVAL_FAULT"] = json.dumps({"fabric_ns": bed["fabric_ns"], "nics": bed["ranks"][0]["data"],
                                          "ports": bed["ranks"][0]["ports"]})
    if a.mode == "dry":
        return env
    env.update({
        "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES", "0"),
        "NCCL_HOSTID": "gpuval-node%d" % rank,             # a different host hash per rank
        "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",   # belt and braces
        "NCCL_MNNVL_ENABLE": "0", "NCCL_NVLS_ENABLE": "0",
        "NCCL_SOCKET_IFNAME": ("=" + bed["ranks"][rank]["oob_if"]) if bed else "lo",  # NCCL bootstrap
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
        "NCCL_DEBUG_FILE": os.path.join(a.work, "%s.r%d.log" % (a.mode, rank)),
    })
    if a.mode == "control":
        env.update(NCCL_NET="Socket", NCCL_NET_PLUGIN="none")
        return env
    so = os.path.abspath(a.plugin_so)
    libdir = os.path.dirname(so)
    env.update(NCCL_NET_PLUGIN=PLUGIN_NAME, NCCL_NET=PLUGIN_NAME, NCCL_NET_PLUGIN_REF_COUNT="1",
               LD_LIBRARY_PATH=":".join([libdir] + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]),
               RAILOVER_IFNAMES=("=" + ",".join(bed["ranks"][rank]["data"])) if bed else "lo",
               RAILOVER_STATE_DIR=os.path.join(a.work, "state"),
               RAILOVER_EVENT_LOG=os.path.join(a.work, "events-r%d.jsonl" % rank),
               RAILOVER_HOLD_DOWN_MS="1000")
    for kv in a.plugin_env:
        k, v = kv.split("=", 1)
        env[k] = v
    return env


def expected_abi(nccl: Optional[str]) -> Optional[int]:
    """Net ABI that NCCL ``"2.28.9"`` looks for first (see railover.ops.doctor.nccl_abi)."""
    if not nccl:
        return None
    try:
        from railover.ops.doctor import nccl_abi
        return nccl_abi([int(x) for x in nccl.split(".")[:2]])
    except (ImportError, ValueError):
        return None


def orchestrate(a) -> int:
    os.makedirs(a.work, exist_ok=True)
    if a.mode == "plugin":
        os.makedirs(os.path.join(a.work, "state"), exist_ok=True)
    bed = bed_layout(a.testbed) if a.testbed else None
    port, port2 = free_port(), free_port()
    me = os.path.abspath(__file__)
    procs: List[subprocess.Popen] = []

    def on_term(*_):  # `timeout` sends SIGTERM: take the workers down with us
        for p in procs:
            if p.poll() is None:
                p.kill()
        sys.exit(124)
    signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(a.work, "%s.workers.log" % a.mode), "w") as log:
        for r in range(WORLD):
            pre = ["ip", "netns", "exec", bed["ranks"][r]["ns"]] if bed else []
            procs.append(subprocess.Popen(pre + [sys.executable, me] + sys.argv[1:] + ["--worker", str(r)],
                                          env=worker_env(a, r, port, port2, bed), stdout=log, stderr=subprocess.STDOUT))
        end = time.monotonic() + a.deadline
        while time.monotonic() < end and any(p.poll() is None for p in procs):
            try:
                procs[0].wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        killed = [p.poll() is None for p in procs]
        for p in procs:
            if p.poll() is None:
                p.kill()
        rcs = [p.wait() for p in procs]
    summary: Dict[str, Any] = {"mode": a.mode, "exit_codes": rcs, "killed_at_deadline": killed,
                               "testbed": bed, "fault_expected": bool(bed) and "fault" not in set(a.skip.split(","))}
    path = os.path.join(a.work, "%s.r0.json" % a.mode)
    if os.path.exists(path):
        with open(path) as f:
            summary["rank0"] = json.load(f)
    r0 = summary.get("rank0", {})
    if a.mode != "dry":
        texts = {}
        for r in range(WORLD):
            p = os.path.join(a.work, "%s.r%d.log" % (a.mode, r))
            texts[r] = open(p, errors="replace").read() if os.path.exists(p) else ""
        summary["expected_abi"] = expected_abi(r0.get("nccl")) if a.mode == "plugin" else None
        summary["logs_ok"], summary["log_checks"] = check_logs(texts, a.mode, PLUGIN_NAME, summary["expected_abi"])
    if a.mode == "plugin":
        evs = []
        for r in range(WORLD):
            for e in read_jsonl(os.path.join(a.work, "events-r%d.jsonl" % r)):
                e["rank"] = r
                evs.append(e)
        evs.sort(key=lambda e: e.get("t_us", 0))
        with open(os.path.join(a.work, "events.jsonl"), "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in evs)
        fe = {e["event"]: e.get("t_mono_us") for e in (r0.get("fault") or {}).get("events", [])}
        summary["journal"] = journal_summary(evs, fe.get("down"), fe.get("up"))
    summary["verdict"], summary["reasons"] = verdict(summary)
    with open(os.path.join(a.work, "summary-%s.json" % a.mode), "w") as f:
        json.dump(summary, f, indent=1)
    print("[%s] verdict %s exit codes %s %s" % (a.mode, summary["verdict"], rcs, "; ".join(summary["reasons"])))
    if summary["verdict"] != "PASS":  # show why, so it lands in run.log
        print(json.dumps({k: summary.get(k) for k in ("log_checks", "journal")}, indent=1))
        print(open(os.path.join(a.work, "%s.workers.log" % a.mode), errors="replace").read()[-4000:])
    return 0 if summary["verdict"] == "PASS" else 1


# ----------------------------------------------------------------------------- worker

def _fault_plan() -> Optional[Dict[str, Any]]:
    raw = os.environ.get("GPUVAL_FAULT")
    return json.loads(raw) if raw else None


def _own_state() -> Optional[Dict[str, Any]]:
    d = os.environ.get("RAILOVER_STATE_DIR")
    if not d:
        return None
    try:
        with open(os.path.join(d, "railover-%d.json" % os.getpid())) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_worker(a) -> None:
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    rank = a.worker
    dry = a.mode == "dry"
    dev = torch.device("cpu") if dry else torch.device("cuda", 0)
    if not dry:
        torch.cuda.set_device(dev)
    master = os.environ["MASTER_ADDR"]
    kw = dict(backend="gloo" if dry else "nccl", rank=rank, world_size=WORLD,
              init_method="tcp://%s:%s" % (master, os.environ["MASTER_PORT"]),
              timeout=timedelta(seconds=a.op_timeout))
    if not dry:
        kw["device_id"] = dev  # eager communicator creation: fail fast at init
    t_init = time.time()
    dist.init_process_group(**kw)
    sync = (lambda: None) if dry else torch.cuda.synchronize
    skip = set(filter(None, a.skip.split(",")))
    tri = WORLD * (WORLD + 1) // 2  # sum over ranks of (rank+1)
    res: Dict[str, Any] = {"rank": rank, "mode": a.mode, "torch": torch.__version__, "wrong_total": 0, "done": False}
    if not dry:
        v = torch.cuda.nccl.version()
        res["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    out_json = os.path.join(a.work, "%s.r%d.json" % (a.mode, rank))

    def save():
        with open(out_json, "w") as f:
            json.dump(res, f, indent=1)

    def base(n, salt, floating):
        i = torch.arange(n, device=dev, dtype=torch.int64)
        if floating:  # small integers: sums are exact even in bf16/fp16
            return (i * 7 + salt) % 31 + 1
        return (i * 1000003 + salt * 7919) % (1 << 40)

    def mine(n, salt, dtype, r=None):
        r = rank if r is None else r
        return (base(n, salt, dtype.is_floating_point) * (r + 1)).to(dtype)

    def summed(n, salt, dtype):
        return (base(n, salt, dtype.is_floating_point) * tri).to(dtype)

    def nwrong(x, y):
        return int((x != y).sum().item())

    x = torch.ones(1, device=dev)
    dist.all_reduce(x)
    sync()
    res["init_s"] = round(time.time() - t_init, 2)
    save()

    # 1) correctness: odd and even sizes, several dtypes, two salts each (catches stale data)
    if "correct" not in skip:
        plan = [(torch.float32, [1, 2, 3, 7, 8, 17, 255, 256, 1023, 4097, 65535, 65536, 131071, 262147,
                                 1 << 20, (1 << 20) + 7, 1 << 22, a.max_bytes // 4]),
                (torch.bfloat16, [1, 3, 4097, 1 << 20, (1 << 22) + 1]),
                (torch.float16, [9, 1 << 16]),
                (torch.int64, [1, 5, 65537, 1 << 20])]
        corr = []
        for dtype, sizes in plan:
            for n in sizes:
                for salt in (1, 2):
                    x = mine(n, salt, dtype)
                    dist.all_reduce(x)
                    w = nwrong(x, summed(n, salt, dtype))
                    corr.append([str(dtype).replace("torch.", ""), n, salt, w])
                    res["wrong_total"] += w
        res["correctness"] = {"cases": len(corr), "wrong": [c for c in corr if c[3]]}
        save()

    # 2) nccl-tests style sweep: in-place all-reduce, float32, sum; algbw = S/t, busbw = algbw*2(n-1)/n
    if "sweep" not in skip:
        rows, size = [], 8
        while size <= a.max_bytes:
            n = max(1, size // 4)
            iters = 20 if size <= (1 << 20) else (10 if size <= (32 << 20) else 5)
            x = mine(n, 3, torch.float32)
            for _ in range(2 if size > (1 << 20) else 5):
                dist.all_reduce(x)
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            sync()
            t = torch.tensor([(time.perf_counter() - t0) / iters], device=dev, dtype=torch.float64)
            dist.all_reduce(t)  # average over ranks, as nccl-tests does by default
            sec = t.item() / WORLD
            x = mine(n, 4, torch.float32)
            dist.all_reduce(x)
            w = nwrong(x, summed(n, 4, torch.float32))
            res["wrong_total"] += w
            algbw = n * 4 / 1e9 / sec
            rows.append({"size": n * 4, "count": n, "type": "float", "redop": "sum", "time_us": sec * 1e6,
                         "algbw": algbw, "busbw": algbw * 2 * (WORLD - 1) / WORLD, "wrong": w})
            size *= 2
        res["sweep"] = rows
        res["avg_busbw"] = statistics.mean(r["busbw"] for r in rows)
        save()

    # 3) other collectives and point-to-point (p2p uses other NCCL connections and buffers)
    if "colls" not in skip:
        cw = {}
        f = torch.float32
        for n in (4099, 1 << 20):
            x = mine(n, 5, f, r=0) if rank == 0 else torch.zeros(n, device=dev, dtype=f)
            dist.broadcast(x, src=0)
            cw["broadcast_%d" % n] = nwrong(x, mine(n, 5, f, r=0))
            out = torch.empty(WORLD * n, device=dev, dtype=f)
            dist.all_gather_into_tensor(out, mine(n, 6, f))
            cw["all_gather_%d" % n] = sum(nwrong(out[r * n:(r + 1) * n], mine(n, 6, f, r=r)) for r in range(WORLD))
            inp = torch.cat([mine(n, 10 + j, f) for j in range(WORLD)])
            out = torch.empty(n, device=dev, dtype=f)
            dist.reduce_scatter_tensor(out, inp)
            cw["reduce_scatter_%d" % n] = nwrong(out, summed(n, 10 + rank, f))
            inp = torch.cat([mine(n, 20 + j, f) for j in range(WORLD)])
            out = torch.empty(WORLD * n, device=dev, dtype=f)
            dist.all_to_all_single(out, inp)
            cw["all_to_all_%d" % n] = sum(nwrong(out[r * n:(r + 1) * n], mine(n, 20 + rank, f, r=r)) for r in range(WORLD))
        for n in (1 << 10, 1 << 20, 1 << 24):
            peer = 1 - rank
            send, recv = mine(n, 30, f), torch.empty(n, device=dev, dtype=f)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)])
            for q in reqs:
                q.wait()
            sync()
            cw["sendrecv_%d" % n] = nwrong(recv, mine(n, 30, f, r=peer))
        res["collectives"] = cw
        res["wrong_total"] += sum(cw.values())
        save()

    # 4) a real link fault while all-reduce runs: rank 0 sets a switch port down and up again
    plan = _fault_plan()
    if "fault" not in skip and plan:
        n = a.fault_bytes // 4
        events, lock = [], threading.Lock()
        chosen: Dict[str, str] = {}

        def fire(tag, t_ref):
            if tag == "down":
                nic = busiest_nic(_own_state(), plan["nics"])
                chosen["nic"], chosen["port"] = nic, plan["ports"][plan["nics"].index(nic)]
            cmd = ["ip", "-n", plan["fabric_ns"], "link", "set", chosen.get("port", ""), tag]
            mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            cp = subprocess.run(cmd, capture_output=True, text=True)
            with lock:
                events.append({"event": tag, "t": round(time.time() - t_ref, 3), "t_mono_us": mono,
                               "cmd": " ".join(cmd), "nic": chosen.get("nic"), "rc": cp.returncode,
                               "stderr": cp.stderr[-300:]})

        timeline, t0 = [], time.time()
        timers = []
        if rank == 0:
            timers = [threading.Timer(a.fault_at, fire, ("down", t0)), threading.Timer(a.heal_at, fire, ("up", t0))]
            for tm in timers:
                tm.start()
        k = 0
        try:
            while True:
                x = mine(n, 100 + k, torch.float32)
                ts = time.time()
                dist.all_reduce(x)
                sync()
                te = time.time()
                w = nwrong(x, summed(n, 100 + k, torch.float32))
                timeline.append((k, round(ts - t0, 4), round((te - ts) * 1e3, 3), w))
                go = torch.tensor([0.0 if (rank == 0 and te - t0 >= a.fault_duration) else 1.0], device=dev)
                dist.all_reduce(go, op=dist.ReduceOp.MIN)
                if go.item() == 0.0:
                    break
                k += 1
        finally:
            for tm in timers:
                tm.cancel()
            if rank == 0 and chosen.get("port") and not any(e["event"] == "up" for e in events):
                fire("up", t0)  # never leave the port down
        errs = torch.tensor([sum(t[3] for t in timeline)], device=dev, dtype=torch.int64)
        dist.all_reduce(errs)
        fault = {"iterations": len(timeline), "errors": int(errs.item()), "events": events,
                 "injected": any(e["event"] == "down" for e in events)}
        pre = [t[2] for t in timeline if t[1] + t[2] / 1e3 < a.fault_at]
        hit = [t for t in timeline if t[1] + t[2] / 1e3 >= a.fault_at]
        if pre and hit:
            med = statistics.median(pre)
            fault["baseline_ms"] = med
            fault["max_stall_ms"] = max(t[2] for t in hit)
            rec = [t for t in hit if t[1] >= a.fault_at and t[2] <= 2 * med]
            fault["recovered_after_s"] = round(rec[0][1] + rec[0][2] / 1e3 - a.fault_at, 3) if rec else None
            for tag, lo, hi in (("before", 0, a.fault_at), ("during", a.fault_at, a.heal_at), ("after", a.heal_at, 1e9)):
                s = [t for t in timeline if lo <= t[1] < hi]
                if s:
                    fault["algbw_%s" % tag] = n * 4 * len(s) / 1e9 / (sum(t[2] for t in s) / 1e3)
        res["fault"] = fault
        res["wrong_total"] += fault["errors"] if rank == 0 else 0
        if rank == 0:
            with open(os.path.join(a.work, "fault.csv"), "w") as fh:
                fh.write("iter,start_s,dur_ms,wrong\n")
                fh.writelines("%d,%s,%s,%d\n" % t for t in timeline)
        save()

    # 5) destroy and re-create the process group in the same process: exercises the plugin's
    #    finalize and NCCL's unload/reload. Reported, not part of the verdict.
    if "reinit" not in skip:
        dist.destroy_process_group()
        info: Dict[str, Any] = {}
        try:
            kw["init_method"] = "tcp://%s:%s" % (master, os.environ["MASTER_PORT2"])
            dist.init_process_group(**kw)
            x = mine(1 << 20, 40, torch.float32)
            dist.all_reduce(x)
            info["wrong"] = nwrong(x, summed(1 << 20, 40, torch.float32))
            info["ok"] = info["wrong"] == 0
        except Exception as e:  # e.g. DistBackendError when the reload picks another library
            info["ok"], info["error"] = False, repr(e)[-600:]
        res["reinit"] = info
    res["done"] = True
    save()
    if dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    a = parse_args()
    if a.mode == "plugin" and not a.plugin_so:
        sys.exit("--mode plugin needs --plugin-so")
    if a.worker >= 0:
        run_worker(a)
    else:
        sys.exit(orchestrate(a))


if __name__ == "__main__":
    main()
