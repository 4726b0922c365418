#!/usr/bin/env python3
"""Does an nftables drop on an rxe NIC stall its guest? The measurement behind the RDMA bed's
``at="wire"`` default for :class:`railover.testbed.rdma.faults.Silent` and ``OneWay``.

On the RDMA bed (2 guests, rxe), ``ib_write_bw`` streams from A's a0 to B's b0 (64 KiB
messages). For each case a one-way cut of a0's outgoing traffic is held for ``--hold`` seconds
of guest time while guest A runs a meter: a bash loop that waits 5 ms (``read -t`` on an idle
fifo, no process started) and records the largest gap between two wake-ups. Cases, interleaved
per round: ``none`` (no fault), ``host`` (``OneWay(at="host")``: nftables output hook in A),
``wire`` (``OneWay(at="wire")``: nftables input hook in B). Printed per case and round, one
JSON line: guest A's CPU split over the hold (/proc/stat), the meter's largest gap (µs) and
wake-ups, the packets the rule dropped.

Reading: a gap of seconds means every thread of guest A was held off the CPU that long, which
a plugin would see as a late health thread (the journal's ``health_late``) and which delays
anything A's ranks must answer. Run from a checkout with the native build::

    PYTHONPATH=src RAILOVER_NATIVE_DIR=build python3 scripts/rdma_nft_stall.py --rounds 2

Takes about 2 minutes per round under TCG. Exit 0 when the bed ran; it judges nothing.
"""
from __future__ import annotations

import argparse
import json
import sys

from railover.testbed.netns import poll_until
from railover.testbed.rdma import faults as rf
from railover.testbed.rdma.bed import RdmaBed, RdmaBedError

METER = r'''
mkfifo /tmp/ro-meter-fifo 2>/dev/null || true; exec 3<>/tmp/ro-meter-fifo
end=$(( EPOCHSECONDS + HOLD )); prev=$EPOCHREALTIME; maxg=0; n=0
while [ $EPOCHSECONDS -lt $end ]; do
  read -t 0.005 -u 3 x || true
  now=$EPOCHREALTIME; g=$(( ${now/./} - ${prev/./} )); prev=$now; n=$((n+1))
  [ $g -gt $maxg ] && maxg=$g
done
echo "{\"wakeups\": $n, \"max_gap_us\": $maxg}"
'''
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_ticks(bed: RdmaBed, host: str) -> list:
    _, out, _ = bed.run(host, ["head", "-1", "/proc/stat"], check=True)
    return [int(x) for x in out.split()[1:1 + len(CPU_FIELDS)]]


def cpu_split(a: list, b: list) -> dict:
    d = [y - x for x, y in zip(a, b)]
    tot = sum(d) or 1
    return {n: round(v / tot, 2) for n, v in zip(CPU_FIELDS, d)}


def one_case(bed: RdmaBed, case: str, rnd: int, hold_s: int, port: int) -> dict:
    a, b = bed.hosts[0].nics[0], bed.hosts[1].nics[0]
    args = ["-x", "1", "-p", str(port), "-s", "65536", "-D", str(hold_s + 30), "-F"]
    srv = bed.spawn("B", ["ib_write_bw", "-d", b.rdma_dev, *args])

    def listening() -> bool:
        if srv.poll() is not None:
            return True
        rc, out, _ = bed.run("B", ["ss", "-Hltn", f"sport = :{port}"], timeout_s=60)
        return rc == 0 and out.strip() != ""
    poll_until(listening, 180, 0.3, f"ib_write_bw listening on {port} in B")
    def sent() -> int:
        _, out, _ = bed.run("A", ["cat", f"/sys/class/infiniband/{a.rdma_dev}/ports/1/hw_counters/sent_pkts"])
        return int(out) if out.strip().isdigit() else -1
    before = sent()
    cli = bed.spawn("A", ["ib_write_bw", "-d", a.rdma_dev, *args, b.addr])

    # the stream is running once A's rxe0 has sent a good number of packets since the client started
    def streaming() -> bool:
        return sent() - before > 2000
    poll_until(streaming, 180, 0.3, "ib_write_bw streaming from A")
    fault = None if case == "none" else rf.OneWay(bed, "a0", at=case)
    s0 = cpu_ticks(bed, "A")
    meter = bed.spawn("A", ["bash", "-c", METER.replace("HOLD", str(hold_s))])
    if fault:
        fault.apply()
    try:
        meter.wait(hold_s * 30 + 120)
        s1 = cpu_ticks(bed, "A")
    finally:
        if fault:
            fault.undo()
    row = {"case": case, "round": rnd, "cpu_A": cpu_split(s0, s1), **json.loads(meter.stdout().strip() or "{}"),
           "dropped": fault.counter() if fault else 0}
    for p in (cli, srv):
        try:
            p.wait(hold_s * 30 + 120)
        except TimeoutError:
            p.kill(9)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hold", type=int, default=8, help="seconds of guest time each cut is held")
    o = ap.parse_args()
    if o.rounds < 1 or not 1 <= o.hold <= 120:
        ap.error("--rounds must be >= 1 and --hold 1..120")
    try:
        with RdmaBed(rails=2, log=lambda s: print(s, file=sys.stderr)) as bed:
            port = 18700
            for rnd in range(o.rounds):
                for case in ("none", "host", "wire"):
                    port += 1
                    print(json.dumps(one_case(bed, case, rnd, o.hold, port)), flush=True)
    except (RdmaBedError, rf.FaultError, TimeoutError) as e:
        print(f"rdma_nft_stall: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
