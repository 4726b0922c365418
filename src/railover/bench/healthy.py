"""``railover bench healthy``: what railover costs while nothing fails.

For every network (``loopback``: one host with 2 NICs, so every byte goes through the
kernel's loopback device; ``veth``: 2 hosts x 2 NICs through per-rail bridges), workload
(sendrecv, ring all-reduce) and rank count (2, 4), railover-perf sweeps 8 B .. 256 MiB
(-c 0: no data generation or checking, so the CPU goes to moving bytes) with

* ``armed``: railover as shipped (standby paths connected and probed),
* ``none``: ``RAILOVER_STANDBY=none`` (the same plugin without standby paths),
* ``armed2`` (full runs, 2 ranks): a second, identical armed run: an A/A control whose
  ratio to ``armed`` is the noise floor of this machine,
* ``nstreams=1`` / ``nstreams=4`` (2 ranks): ``RAILOVER_NSTREAMS`` other than the default 2,
* ``baseline``: the same railover-perf runs through ``libnccl-net-baseline.so``
  (native/tools/baseline): the same buffers, slot sizes, requests in flight, number of TCP
  streams and NICs, with no failover machinery at all: the physical limit of this data
  movement. ``armed/baseline`` is what the plugin costs; ``armed/iperf3`` (kept) compares with
  iperf3, whose one small buffer stays in the CPU cache,

interleaved round by round (the order alternates), so every ratio compares runs made side
by side; ranks are pinned (rank r on CPU r % nproc). Latency: every iteration of the small
sizes is timed; each run gives a p50 and a p99 per size, and the table shows their median over
the runs (3 per round), because one run's latency depends on where the scheduler put its
threads. iperf3 runs the same flows (rank r's host -> rank r+1's host, the same addresses,
all flows at once, ``-P`` = the number of streams) after every block of runs, pinned like the
ranks and unpinned; the better of the two is the reference. Small sizes (8 B .. 8 KiB) run many
iterations and record every iteration's latency (p50/p99). A separate checked run per
combination (data generated and verified) shows 0 wrong bytes.

busbw is nccl-tests' bus bandwidth (GB/s = 1e9 B/s); the iperf3 figure is the receiver's
throughput per flow, the same per-link quantity.
"""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rich.console import Console
from rich.table import Table

from railover.bench import common as C
from railover.testbed.netns import TestBed

DEFAULT_NSTREAMS = 2
#: The config that runs railover-perf through libnccl-net-baseline.so (native/tools/baseline):
#: the same buffers, slots, requests in flight, streams (RAILOVER_NSTREAMS) and NICs as railover,
#: over plain TCP sockets with no failover machinery: the physical limit of this data movement.
BASELINE = "baseline"
#: The config that runs another build of railover (``--against``: e.g. the plugin from before
#: a change), interleaved with the others, so "new vs old" is measured side by side in one run.
AGAINST = "against"


def against_path(p: Path) -> Path:
    """The plugin ``--against`` names: a libnccl-net-railover.so file, or a directory (build
    tree or package folder) that holds one, that loads and exports an NCCL net plugin table
    (``ncclNetPlugin_v7`` .. ``_v12``: any railover build, older ones included). Checked before
    a bed is built. Raises BenchError naming what is missing or wrong."""
    from railover import params
    p = Path(p)
    cand = p / "libnccl-net-railover.so" if p.is_dir() else p
    if not cand.is_file():
        raise C.BenchError(f"--against {p}: no libnccl-net-railover.so there (give the plugin file or the build "
                           f"directory that holds it)")
    problem = params.net_plugin_problem(cand.resolve())
    if problem:
        raise C.BenchError(f"--against {p}: {problem}")
    return cand.resolve()


def baseline_path() -> Path:
    """libnccl-net-baseline.so, next to the railover plugin (build tree or package)."""
    from railover import _paths
    p = _paths.plugin_path().parent / "libnccl-net-baseline.so"
    if not p.is_file():
        raise C.BenchError(f"{p} not found: build it (cmake --build build --target nccl-net-baseline)")
    return p


#: railover-perf's workloads the suite measures
WORKLOADS = ("sendrecv", "allreduce")
NETWORKS = {
    "loopback": dict(hosts=1, nics=2),   # one host: traffic between its own addresses uses lo
    "veth": dict(hosts=2, nics=2),       # T2: two hosts, one bridge per rail
}


def _segments(quick: bool) -> List[Dict[str, Any]]:
    """Sweep segments: (sizes, iterations) chosen so that small sizes give many latency
    samples and large ones do not take minutes."""
    if quick:
        return [dict(name="small", minbytes=8, maxbytes=64, stepfactor=8, iters=30, warmup=5),
                dict(name="mid", minbytes="1M", maxbytes="1M", iters=3, warmup=1),
                dict(name="large", minbytes="4M", maxbytes="4M", iters=3, warmup=1)]
    return [dict(name="small", minbytes=8, maxbytes="8K", iters=400, warmup=40),
            dict(name="mid", minbytes="16K", maxbytes="4M", iters=20, warmup=5),
            dict(name="large", minbytes="8M", maxbytes="256M", iters=5, warmup=1)]


def _configs(nranks: int, quick: bool, nstreams: Sequence[int], against: bool = False) -> List[Tuple[str, Dict[str, str]]]:
    cfgs = [("armed", {}), ("none", {"RAILOVER_STANDBY": "none"}), (BASELINE, {})]
    if against:
        cfgs.insert(1, (AGAINST, {}))
    if nranks == 2:
        if not quick:
            cfgs.append(("armed2", {}))
        for ns in nstreams:
            if ns != DEFAULT_NSTREAMS:
                cfgs.append((f"nstreams={ns}", {"RAILOVER_NSTREAMS": str(ns)}))
    return cfgs


def _iperf_pairs(tb: TestBed, nranks: int) -> List[Tuple[Any, Any, str, str]]:
    H = len(tb.hosts)
    pairs = []
    for r in range(nranks):
        a, b = tb.hosts[r % H], tb.hosts[((r + 1) % nranks) % H]
        pairs.append((a.name, b.name, a.nics[0].addr, b.nics[0].addr))
    return pairs


def run(out: Path, quick: bool = False, rounds: Optional[int] = None, networks: Sequence[str] = ("loopback", "veth"),
        ranks: Sequence[int] = (2, 4), workloads: Sequence[str] = WORKLOADS,
        nstreams: Sequence[int] = (1, 2, 4), iperf_s: Optional[float] = None,
        console: Optional[Console] = None, against: Optional[Path] = None) -> Dict[str, Any]:
    """Runs the healthy suite; ``against``: another railover plugin (file or directory) measured
    interleaved as config ``against`` (ratios armed/against per size)."""
    console = console or Console()
    bad = [n for n in networks if n not in NETWORKS]
    if bad or not networks:
        raise C.BenchError(f"--networks: unknown network(s) {', '.join(map(repr, bad)) or '(none given)'}; "
                           f"known: {', '.join(NETWORKS)}")
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad or not workloads:
        raise C.BenchError(f"--workloads: unknown workload(s) {', '.join(map(repr, bad)) or '(none given)'}; "
                           f"known: {', '.join(WORKLOADS)}")
    against_so = against_path(against) if against else None
    rounds = rounds or (1 if quick else 3)
    small_repeats = 1 if quick else 3
    iperf_s = iperf_s or (1.0 if quick else 3.0)
    segs = _segments(quick)
    rep = C.Report("healthy", out, quick, {
        "rounds": rounds, "small_runs_per_round": small_repeats, "networks": list(networks), "ranks": list(ranks), "workloads": list(workloads),
        "nstreams": list(nstreams), "iperf_seconds": iperf_s, "segments": segs, "check": "bandwidth and latency runs -c 0; one checked run per combination",
        "default_nstreams": DEFAULT_NSTREAMS, "pinned": "rank r (and iperf3 flow r's client) on CPU r % nproc",
        "against": str(against_so) if against_so else None,
        "against_sha256": C._sha256(against_so)[:16] if against_so else None,
    })
    work = Path(out) / "healthy-work"
    # raw[(net, wl, n, cfg)][size] -> list of row dicts (one per round)
    raw: Dict[Tuple, Dict[int, List[Dict[str, Any]]]] = {}
    lat: Dict[Tuple, Dict[int, List[float]]] = {}
    iperf: Dict[Tuple, List[float]] = {}
    checked: List[Dict[str, Any]] = []
    blocks: List[Dict[str, Any]] = []  # the (network, round, workload, ranks) blocks measured
    rep.results["blocks_done"] = blocks
    rep.results["checked"] = checked
    for net in networks:
        shape = NETWORKS[net]
        with TestBed(hosts=shape["hosts"], nics=shape["nics"]) as tb:
            console.print(f"[bold]healthy[/] on {net} ({tb.prefix}: {shape['hosts']} host(s) x {shape['nics']} NICs)")
            for rnd in range(rounds):
                for wl, n in itertools.product(workloads, ranks):
                    cfgs = _configs(n, quick, nstreams, against=against_so is not None)
                    if rnd % 2:
                        cfgs = cfgs[::-1]  # A B ... / ... B A: neither config always goes first
                    rph = n // shape["hosts"]
                    # Small sizes: several short runs per config, alternating, because a run's
                    # latency depends on where the scheduler put its threads (the per-run p50/p99
                    # are summarized by their median over runs).
                    small_cfgs = [(nm, e) for nm, e in cfgs if not nm.startswith("nstreams")]
                    order = [("small", c) for _ in range(small_repeats) for c in small_cfgs]
                    order += [(seg["name"], c) for c in cfgs for seg in segs if seg["name"] != "small"]
                    for segname, (name, env) in order:
                        seg = next(x for x in segs if x["name"] == segname)
                        wd = work / f"{net}-{wl}-{n}-{name}-{segname}"
                        opts = {k: v for k, v in seg.items() if k != "name"}
                        if segname == "small" and wl == "allreduce" and not quick:
                            opts["iters"] = 100
                        if name == BASELINE:
                            opts["plugin"] = str(baseline_path())
                        elif name == AGAINST:
                            opts["plugin"] = str(against_so)
                        res = C.run_sweep(tb, wd, ranks_per_host=rph, env=env, workload=wl, check=False, pin=True,
                                          timeseries=str(wd / "ts-rank%r.csv"), **opts)
                        for row in res.rows:
                            raw.setdefault((net, wl, n, name), {}).setdefault(row["size"], []).append(row)
                        if segname == "small":
                            _, iters = C.read_timeseries(wd / "ts-rank0.csv")
                            per: Dict[int, List[float]] = {}
                            for it in iters:
                                per.setdefault(it["bytes"], []).append(it["lat_us"])
                            d = lat.setdefault((net, wl, n, name), {})
                            for size, ls in per.items():
                                d.setdefault(size, []).append((C.percentile(ls, 50), C.percentile(ls, 99), len(ls)))
                        shutil.rmtree(wd, ignore_errors=True)
                    console.print(f"  round {rnd + 1}/{rounds}: {wl}, {n} ranks: {', '.join(c for c, _ in cfgs)}")
                    # iperf3 right after each block, so it sees the same machine load; its best of
                    # pinned (like the ranks) and unpinned is the reference.
                    Ps = sorted({DEFAULT_NSTREAMS} | (set(nstreams) if n == 2 and wl == workloads[0] else set()))
                    for P in Ps:
                        best = 0.0
                        for pin in (True, False):
                            flows = C.iperf_ring(tb, _iperf_pairs(tb, n), P, iperf_s, omit_s=0 if quick else 1, pin=pin)
                            best = max(best, sum(f["gbs"] for f in flows) / len(flows))
                        iperf.setdefault((net, n, P), []).append(best)
                    # Stored after every block, so an interrupted run keeps the rounds it
                    # measured (Report.save_interrupted; targets are evaluated only at the end).
                    blocks.append({"network": net, "round": rnd + 1, "workload": wl, "nranks": n})
                    rep.results.update(_summarize(raw, lat, iperf, networks, workloads, ranks, nstreams))
            # Correctness: the same combinations with data generated and checked.
            for wl, n in itertools.product(workloads, ranks):
                wd = work / f"{net}-{wl}-{n}-checked"
                res = C.run_sweep(tb, wd, ranks_per_host=n // shape["hosts"], workload=wl, check=True,
                                  minbytes=8, maxbytes="64K" if quick else "16M", stepfactor=8 if quick else 4,
                                  iters=2 if quick else 3, warmup=1)
                checked.append({"network": net, "workload": wl, "nranks": n, "wrong_bytes": res.wrong_total,
                                "sizes": [r["size"] for r in res.rows],
                                "bytes_checked": sum(int((r.json or {}).get("stats", {}).get("bytes_received", 0))
                                                     for r in res.ranks)})
                rep.add_wrong(res.wrong_total)
                shutil.rmtree(wd, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)

    results = _summarize(raw, lat, iperf, networks, workloads, ranks, nstreams)
    rep.results.update(results)
    refresh(rep.data)
    _plots(rep, results)
    data = rep.finish()
    print_tables(data, console)
    return data


def _iperf_ref(rounds: Sequence[float]) -> Optional[float]:
    """The iperf3 reference: its best round. iperf3's many small processes suffer more from a
    busy machine than the spinning ranks do, so its best round is the fair (conservative)
    yardstick: noise can only make railover look worse."""
    return max(rounds) if rounds else None


def refresh(data: Dict[str, Any]) -> Dict[str, Any]:
    """(Re)derive the iperf3 reference, the railover/iperf3 ratios and the targets from the
    stored measurements (also used to re-evaluate an older JSON with the current rules)."""
    res = data["results"]
    by_key = {(v["network"], v["nranks"], v["streams"]): v["rounds"] for v in res["iperf"].values()}
    for c in res["combos"]:
        c["iperf_gbs"] = _iperf_ref(by_key.get((c["network"], c["nranks"], DEFAULT_NSTREAMS), []))
        for r in c["rows"]:
            r["armed_vs_iperf"] = C.ratio(r.get("armed", {}).get("busbw"), c["iperf_gbs"])
    for v in res["iperf"].values():
        v["gbs"] = _iperf_ref(v["rounds"])
    for r in res["nstreams"]:
        r["iperf_gbs"] = _iperf_ref(by_key.get((r["network"], 2, r["nstreams"]), []))
    data["settings"]["iperf_reference"] = "best round (pinned or unpinned, whichever was faster)"
    data["targets"] = []
    rep = C.Report.__new__(C.Report)
    rep.data = data
    _targets(rep, res)
    return data


def _med_rows(rows: List[Dict[str, Any]], key: str) -> Optional[float]:
    return C.median([float(r[key]) for r in rows])


def _summarize(raw, lat, iperf, networks, workloads, ranks, nstreams) -> Dict[str, Any]:
    combos = []
    for net, wl, n in itertools.product(networks, workloads, ranks):
        cfg_names = sorted({k[3] for k in raw if k[:3] == (net, wl, n)})
        if not cfg_names:
            continue
        ip = _iperf_ref(iperf.get((net, n, DEFAULT_NSTREAMS), []))
        sizes = sorted(set().union(*[set(raw[(net, wl, n, c)].keys()) for c in cfg_names]))
        rows = []
        for s in sizes:
            row: Dict[str, Any] = {"size": s}
            for c in cfg_names:
                rr = raw[(net, wl, n, c)].get(s, [])
                runs = lat.get((net, wl, n, c), {}).get(s, [])
                row[c] = {
                    "busbw": _med_rows(rr, "busbw_gbps") if rr else None,
                    "busbw_rounds": [r["busbw_gbps"] for r in rr],
                    "time_us": _med_rows(rr, "time_us") if rr else None,
                    # median over runs of each run's p50 / p99
                    "p50_us": C.median([x[0] for x in runs]) if runs else None,
                    "p99_us": C.median([x[1] for x in runs]) if runs else None,
                    "p50_runs": [x[0] for x in runs],
                    "samples": sum(x[2] for x in runs),
                }
            a, b = row.get("armed", {}), row.get("none", {})
            row["armed_vs_none"] = C.ratio(a.get("busbw"), b.get("busbw"))
            row["p50_armed_vs_none"] = C.ratio(a.get("p50_us"), b.get("p50_us"))
            row["p99_armed_vs_none"] = C.ratio(a.get("p99_us"), b.get("p99_us"))
            if "armed2" in row:
                row["armed2_vs_armed"] = C.ratio(row["armed2"].get("busbw"), a.get("busbw"))
                row["p50_armed2_vs_armed"] = C.ratio(row["armed2"].get("p50_us"), a.get("p50_us"))
            row["armed_vs_iperf"] = C.ratio(a.get("busbw"), ip)
            row["armed_vs_baseline"] = C.ratio(a.get("busbw"), row.get(BASELINE, {}).get("busbw"))
            if AGAINST in row:
                o = row[AGAINST]
                row["armed_vs_against"] = C.ratio(a.get("busbw"), o.get("busbw"))
                row["p50_armed_vs_against"] = C.ratio(a.get("p50_us"), o.get("p50_us"))
                row["p99_armed_vs_against"] = C.ratio(a.get("p99_us"), o.get("p99_us"))
            rows.append(row)
        vs_base = [r["armed_vs_baseline"] for r in rows if r["size"] >= 4 << 20 and r.get("armed_vs_baseline")]
        vs_ag = [r["armed_vs_against"] for r in rows if r["size"] >= 4 << 20 and r.get("armed_vs_against")]
        p50_ag = [r["p50_armed_vs_against"] for r in rows if r.get("p50_armed_vs_against")]
        combos.append({"network": net, "workload": wl, "nranks": n, "configs": cfg_names,
                       "iperf_gbs": ip, "rows": rows,
                       # geometric means: busbw armed / against over sizes >= 4 MiB, and small-
                       # message p50 latency armed / against over the sizes with latency samples
                       "armed_vs_against_ge4m": _geomean(vs_ag) if vs_ag else None,
                       "p50_armed_vs_against": _geomean(p50_ag) if p50_ag else None,
                       # geometric mean over sizes >= 4 MiB of busbw armed / baseline
                       "armed_vs_baseline_ge4m": _geomean(vs_base) if vs_base else None})
    ip_out = {f"{net}/{n}/P{P}": {"network": net, "nranks": n, "streams": P, "gbs": _iperf_ref(v), "rounds": v}
              for (net, n, P), v in sorted(iperf.items())}
    # NSTREAMS: median busbw over sizes >= 4 MiB, 2 ranks, per network and workload.
    ns_rows = []
    for net, wl in itertools.product(networks, workloads):
        combo = next((c for c in combos if (c["network"], c["workload"], c["nranks"]) == (net, wl, 2)), None)
        if combo is None:
            continue
        for ns in nstreams:
            name = "armed" if ns == DEFAULT_NSTREAMS else f"nstreams={ns}"
            vals = [r[name]["busbw"] for r in combo["rows"] if r["size"] >= 4 << 20 and name in r and r[name]["busbw"]]
            by1m = [r[name]["busbw"] for r in combo["rows"] if r["size"] >= 1 << 20 and name in r and r[name]["busbw"]]
            ns_rows.append({"network": net, "workload": wl, "nstreams": ns, "busbw_ge4m": C.median(vals),
                            "busbw_ge1m": C.median(by1m),
                            "iperf_gbs": _iperf_ref(iperf.get((net, 2, ns), []))})
    best = {}
    for ns in nstreams:
        # geometric mean over (network, workload) of busbw relative to the default's
        rel = []
        for r in ns_rows:
            if r["nstreams"] != ns:
                continue
            d = next((x for x in ns_rows if (x["network"], x["workload"], x["nstreams"]) ==
                      (r["network"], r["workload"], DEFAULT_NSTREAMS)), None)
            if d and d["busbw_ge4m"] and r["busbw_ge4m"]:
                rel.append(r["busbw_ge4m"] / d["busbw_ge4m"])
        best[ns] = (C.percentile(rel, 50) if rel else None)
    return {"combos": combos, "iperf": ip_out, "nstreams": ns_rows, "nstreams_vs_default": best}


def _geomean(vals: Sequence[float]) -> Optional[float]:
    import math
    v = [x for x in vals if x]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def _range(rows, key, pred) -> Tuple[Optional[float], Optional[float], Optional[int]]:
    """(geometric mean over the sizes, worst value, worst size) of a per-size ratio. Worst =
    lowest for bandwidth ratios, highest for latency ratios."""
    vals = [(r[key], r["size"]) for r in rows if pred(r["size"]) and r.get(key) is not None]
    if not vals:
        return None, None, None
    worst = min(vals) if "lat" not in key and not key.startswith("p") else max(vals)
    return _geomean([v for v, _ in vals]), worst[0], worst[1]


def _targets(rep: C.Report, res: Dict[str, Any]) -> None:
    """One target per combination and figure. The value is the geometric mean of the per-size
    ratios over the size range (single sizes are within this machine's noise, see the A/A
    control); the worst size is in the detail."""
    for c in res["combos"]:
        tag = f"{c['network']} {c['workload']} {c['nranks']} ranks"
        ge1 = lambda s: s >= 1 << 20
        g, w, ws = _range(c["rows"], "armed_vs_none", ge1)
        aa = _geomean([r["armed2_vs_armed"] for r in c["rows"] if ge1(r["size"]) and r.get("armed2_vs_armed")])
        spread = [abs(1 - r["armed2_vs_armed"]) for r in c["rows"] if ge1(r["size"]) and r.get("armed2_vs_armed")]
        rep.add_target(f"healthy: busbw armed/none, sizes >= 1 MiB, {tag}", g, ">=", 0.98,
                       detail=f"geometric mean over sizes; worst {C.fmt(w, 3)} at {C.human_size(ws) if ws else '-'}"
                              + (f"; A/A control armed2/armed {C.fmt(aa, 3)} (per-size |deviation| median "
                                 f"{C.fmt(C.median(spread), 3)}, max {C.fmt(max(spread), 3)})" if spread else ""))
        g, w, ws = _range(c["rows"], "armed_vs_iperf", lambda s: s >= 4 << 20)
        rep.add_target(f"healthy: busbw railover/iperf3 (-P {DEFAULT_NSTREAMS}), sizes >= 4 MiB, {tag}", g, ">=", 0.9,
                       detail=f"geometric mean over sizes; worst {C.fmt(w, 3)} at {C.human_size(ws) if ws else '-'}; "
                              f"iperf3 {C.fmt(c['iperf_gbs'], 3)} GB/s per flow")
        if c["workload"] == "sendrecv":
            small = lambda s: s <= 8 << 10
            for q in ("p50", "p99"):
                g, w, ws = _range(c["rows"], f"{q}_armed_vs_none", small)
                aa = _geomean([r["p50_armed2_vs_armed"] for r in c["rows"] if small(r["size"]) and r.get("p50_armed2_vs_armed")])
                rep.add_target(f"healthy: {q} latency armed/none, 8 B..8 KiB, {tag}", g, "<=", 1.05,
                               detail=f"geometric mean over sizes; worst {C.fmt(w, 3)} at {C.human_size(ws) if ws else '-'}"
                                      + (f"; A/A control p50 armed2/armed {C.fmt(aa, 3)}" if aa else ""))
    for ch in res.get("checked", []):
        rep.add_target(f"healthy: wrong bytes (checked run), {ch['network']} {ch['workload']} {ch['nranks']} ranks",
                       ch["wrong_bytes"], "==", 0, "B")


def _plots(rep: C.Report, res: Dict[str, Any]) -> None:
    plt = C.matplotlib_pyplot()
    combos = res["combos"]
    if not combos:
        return
    ncol = max(1, len({(c["workload"], c["nranks"]) for c in combos}))
    nets = sorted({c["network"] for c in combos})
    fig, axes = plt.subplots(len(nets), ncol, figsize=(4.2 * ncol, 3.4 * len(nets)), squeeze=False)
    colkeys = sorted({(c["workload"], c["nranks"]) for c in combos})
    for c in combos:
        ax = axes[nets.index(c["network"])][colkeys.index((c["workload"], c["nranks"]))]
        for name in c["configs"]:
            xs = [r["size"] for r in c["rows"] if r.get(name, {}).get("busbw") is not None]
            ys = [r[name]["busbw"] for r in c["rows"] if r.get(name, {}).get("busbw") is not None]
            ax.plot(xs, ys, marker=".", lw=1, label=name)
        if c["iperf_gbs"]:
            ax.axhline(c["iperf_gbs"], color="k", ls="--", lw=0.8, label=f"iperf3 -P {DEFAULT_NSTREAMS}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{c['network']}: {c['workload']}, {c['nranks']} ranks", fontsize=9)
        ax.set_xlabel("size (B)", fontsize=8)
        ax.set_ylabel("busbw (GB/s)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(rep.plot_path("healthy-busbw.png"), dpi=100)
    plt.close(fig)

    lat = [c for c in combos if c["workload"] == "sendrecv"]
    if lat:
        fig, axes = plt.subplots(1, len(lat), figsize=(4.2 * len(lat), 3.4), squeeze=False)
        for ax, c in zip(axes[0], lat):
            for name, style in (("armed", "-"), ("none", "--")):
                rows = [r for r in c["rows"] if r.get(name, {}).get("p50_us") is not None]
                ax.plot([r["size"] for r in rows], [r[name]["p50_us"] for r in rows], style, marker=".", label=f"{name} p50")
                ax.plot([r["size"] for r in rows], [r[name]["p99_us"] for r in rows], style, marker="x", label=f"{name} p99")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{c['network']}: sendrecv {c['nranks']} ranks", fontsize=9)
            ax.set_xlabel("size (B)", fontsize=8)
            ax.set_ylabel("iteration latency (µs)", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(rep.plot_path("healthy-latency.png"), dpi=100)
        plt.close(fig)


# --------------------------------------------------------------------------- output

def print_tables(data: Dict[str, Any], console: Console) -> None:
    for t in tables(data):
        console.print(t)


def tables(data: Dict[str, Any]) -> List[Table]:
    res = data["results"]
    out = []
    for c in res["combos"]:
        t = Table(title=f"healthy: {c['network']}, {c['workload']}, {c['nranks']} ranks "
                        f"(busbw GB/s, medians of {data['settings']['rounds']} round(s); iperf3 {C.fmt(c['iperf_gbs'])} GB/s per flow)")
        extra = [x for x in c["configs"] if x not in ("armed", "none")]
        ag = AGAINST in c["configs"]
        for col in ["size", "armed", "none", "armed/none", "p50 µs armed/none", "p99 µs armed/none", "armed/iperf3",
                    "armed/baseline"] + (["armed/against", "p50 armed/against"] if ag else []) + extra:
            t.add_column(col, justify="right")
        for r in c["rows"]:
            a, b = r.get("armed", {}), r.get("none", {})
            t.add_row(C.human_size(r["size"]), C.fmt(a.get("busbw"), 3), C.fmt(b.get("busbw"), 3), C.fmt(r["armed_vs_none"], 3),
                      f"{C.fmt(a.get('p50_us'), 0)}/{C.fmt(b.get('p50_us'), 0)}" if a.get("p50_us") else "",
                      f"{C.fmt(a.get('p99_us'), 0)}/{C.fmt(b.get('p99_us'), 0)}" if a.get("p99_us") else "",
                      C.fmt(r["armed_vs_iperf"], 3), C.fmt(r.get("armed_vs_baseline"), 3),
                      *([C.fmt(r.get("armed_vs_against"), 3), C.fmt(r.get("p50_armed_vs_against"), 3)] if ag else []),
                      *[C.fmt(r.get(x, {}).get("busbw"), 3) for x in extra])
        out.append(t)
    t = Table(title="RAILOVER_NSTREAMS (2 ranks): median busbw over sizes >= 4 MiB (GB/s) and iperf3 -P N")
    for col in ("network", "workload", "NSTREAMS", "railover busbw", "busbw >= 1 MiB", "iperf3 -P N"):
        t.add_column(col, justify="right")
    for r in res["nstreams"]:
        t.add_row(r["network"], r["workload"], str(r["nstreams"]), C.fmt(r["busbw_ge4m"], 3), C.fmt(r["busbw_ge1m"], 3),
                  C.fmt(r["iperf_gbs"], 3))
    out.append(t)
    return out


def markdown(data: Dict[str, Any]) -> str:
    res = data["results"]
    L = []
    for c in res["combos"]:
        extra = [x for x in c["configs"] if x not in ("armed", "none")]
        rounds = res["iperf"].get(f"{c['network']}/{c['nranks']}/P{DEFAULT_NSTREAMS}", {}).get("rounds", [])
        L.append(f"**{c['network']}, {c['workload']}, {c['nranks']} ranks** — busbw GB/s (median of "
                 f"{data['settings']['rounds']} interleaved rounds); iperf3 -P {DEFAULT_NSTREAMS}, same flows: "
                 f"{C.fmt(c['iperf_gbs'], 3)} GB/s per flow (best of {len(rounds)}: "
                 f"{', '.join(C.fmt(x, 2) for x in rounds)})\n")
        if c.get("armed_vs_baseline_ge4m") is not None:
            L.append(f"railover / baseline (libnccl-net-baseline.so: same buffers, streams and NICs over plain TCP), "
                     f"geometric mean over sizes ≥ 4 MiB: {C.fmt(c['armed_vs_baseline_ge4m'], 3)}\n")
        ag = AGAINST in c["configs"]
        if ag:
            L.append(f"railover / against ({data['settings'].get('against')}), geometric means: busbw over sizes ≥ 4 MiB "
                     f"{C.fmt(c.get('armed_vs_against_ge4m'), 3)}, small-message p50 latency "
                     f"{C.fmt(c.get('p50_armed_vs_against'), 3)} (lower is faster)\n")
        hdr = ["size", "armed", "none", "armed/none", "p50 µs armed / none", "p99 µs armed / none", "armed/iperf3",
               "armed/baseline"] + (["armed/against", "p50 armed/against"] if ag else []) + extra
        L.append("| " + " | ".join(hdr) + " |")
        L.append("|" + "---:|" * len(hdr))
        for r in c["rows"]:
            a, b = r.get("armed", {}), r.get("none", {})
            cells = [C.human_size(r["size"]), C.fmt(a.get("busbw"), 3), C.fmt(b.get("busbw"), 3), C.fmt(r["armed_vs_none"], 3),
                     f"{C.fmt(a.get('p50_us'), 0)} / {C.fmt(b.get('p50_us'), 0)}" if a.get("p50_us") else "",
                     f"{C.fmt(a.get('p99_us'), 0)} / {C.fmt(b.get('p99_us'), 0)}" if a.get("p99_us") else "",
                     C.fmt(r["armed_vs_iperf"], 3), C.fmt(r.get("armed_vs_baseline"), 3)] + \
                ([C.fmt(r.get("armed_vs_against"), 3), C.fmt(r.get("p50_armed_vs_against"), 3)] if ag else []) + \
                [C.fmt(r.get(x, {}).get("busbw"), 3) for x in extra]
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    L.append("**RAILOVER_NSTREAMS** (2 ranks, armed): median busbw over sizes ≥ 4 MiB and ≥ 1 MiB, and iperf3 with as many streams\n")
    L.append("| network | workload | NSTREAMS | busbw ≥ 4 MiB | busbw ≥ 1 MiB | iperf3 -P N |")
    L.append("|---|---|---:|---:|---:|---:|")
    for r in res["nstreams"]:
        L.append(f"| {r['network']} | {r['workload']} | {r['nstreams']} | {C.fmt(r['busbw_ge4m'], 3)} | "
                 f"{C.fmt(r['busbw_ge1m'], 3)} | {C.fmt(r['iperf_gbs'], 3)} |")
    rel = res.get("nstreams_vs_default", {})
    if rel:
        L.append("\nRelative to the default (" + str(DEFAULT_NSTREAMS) + "), median over networks and workloads: "
                 + ", ".join(f"NSTREAMS={k}: {C.fmt(v, 3)}" for k, v in sorted(rel.items(), key=lambda kv: int(kv[0]))))
    L.append("")
    L.append("Checked runs (data generated and verified): " + "; ".join(
        f"{c['network']} {c['workload']} {c['nranks']} ranks: {c['wrong_bytes']} wrong bytes" for c in res.get("checked", [])))
    return "\n".join(L) + "\n"
