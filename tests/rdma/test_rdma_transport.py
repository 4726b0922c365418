"""The plugin's RDMA transport (``RAILOVER_TRANSPORT=rdma``) end to end on the RDMA test bed:
``railover-perf`` ranks in the two guests load the plugin, which moves every message with RDMA
WRITE / WRITE_WITH_IMM on rxe queue pairs (``NCCL_IB_QPS_PER_CONNECTION`` RC QPs per path,
default 1, on the HCA port behind the path's NIC), every byte checked by railover-perf.

Asserted here:
* an all-reduce across the guests completes with 0 wrong bytes through net ABIs v7, v9, v12,
  and the plugin says it runs the rdma transport on both rails (NIC -> HCA port and GID);
* a cable pull, an admin down, and a silent black hole (nftables, no carrier or port event), on the primary
  rail of guest A in the middle of a timed all-reduce move every comm to the standby HCA
  (``failover`` in the journal, the path on the faulty NIC down), and after the repair the
  comms return to it (``failback``), with 0 wrong bytes;
* the same for a one-way loss (what leaves A's primary NIC is dropped at B's input) and for a cable
  pull at the far end (B's primary NIC: B sees the port error, A sees nothing);
* a cut of the RoCE flow alone (UDP 4791 dropped; probes still answer): the flow-stall rule
  moves both guests' send comms, then they fail back;
* a primary that flaps (4 cable pulls of 0.5 s, 1 s apart): every byte arrives, no comm switches
  3 times within a hold-down, the repeated failures are reported as flaps with a grown
  hold-down, and once it stops flapping the comms fail back;
* negative controls: a congested primary (tbf at 8 Mbit/s with a 1.5 s queue on both ends,
  well below what the rail carries under TCG: no failover, no error, no oscillation) and a
  stopped peer (rank 1 SIGSTOPped for 12 s, past the stall watch and the probe timeout: no
  failover, no path_down, no error);
* both of A's cables pulled: a clean ncclSystemError naming "no usable path" within the fatal
  timeout (plus TCG's slack), never a hang;
* grouped receives (railover-perf ``--group 8``: 8 steps per irecv, buffers in reverse step
  order, placed by tag) on paths of three RC QPs (``NCCL_IB_QPS_PER_CONNECTION=3``) across a
  cable pull and failback, every byte checked;
* sends placed by tag as NCCL's shared comms (PXN) need (railover-perf ``--group 4
  --send-ahead``: steps of a later irecv reach isend early and must wait, NULL, for their turn)
  across a cable pull and failback, every byte checked;
* iflush (railover-perf ``--flush``, as NCCL's GPUDirect receive path): every receive with
  bytes is flushed by a real RDMA READ through the HCA, also across a cable pull of that HCA;
* ranks that disagree on the transport (one tcp, one rdma) fail with an error that names both
  transports, instead of exchanging bytes the other side cannot read;
* the management NIC (no rxe) selected beside the rails: ``RAILOVER_TRANSPORT=auto`` leaves it
  out of NCCL's devices and runs rdma on the rails; ``rdma+tcp`` serves it over TCP as a device
  of its own, each comm on its NIC's kind (a rail comm fails over to the other rail, never to
  eth0), every byte checked across a cable pull and failback;
* under each older net ABI (v11 to v7), one run takes a sequence of faults on the primary, each
  repaired and failed back before the next (cable pull at either end, admin down, and a share
  of the silent black hole, one-way loss and flap), then ends with both rails down in the clean
  error, 0 wrong bytes. The single-fault tests and negative controls above run v12 only; with
  ``RAILOVER_BED_FULL_ABI_MATRIX=1`` they run under every ABI and each older ABI's sequence
  takes every fault (v7 alone: 10 tests, ~6.5 min in this bed; all older ABIs ~30 min more).

Timers: under TCG (no KVM here) a guest runs 10-50x slower than native; the plugin runs with
the bed's TCG timers (:data:`railover.testbed.rdma.perf.TCG_PLUGIN_ENV`) and every wait below is
bounded generously.
"""
from __future__ import annotations

import os
import re
import secrets
import sys
import threading
import time
from typing import Dict, List

import pytest

from railover import journal
from railover.testbed.netns import poll_until
from railover.testbed.rdma import faults as rf
from railover.testbed.rdma import perf as rperf

from rdma_helpers import crash_retry, gid_of

pytestmark = pytest.mark.rdma

RDMA_ENV = {"RAILOVER_TRANSPORT": "rdma", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def _journal(bed, host: str) -> List[dict]:
    """Events of the journals of the railover-perf ranks running in ``host`` now."""
    rc, out, _ = bed.sh(host, "cat /tmp/rperf-*/journal-rank*.jsonl 2>/dev/null || true", timeout_s=60)
    # railover.journal.parse_line: a line being written (or garbled) is None, not an error
    return [e for e in map(journal.parse_line, out.splitlines()) if e is not None]


@pytest.mark.parametrize("abi", [12, 11, 10, 9, 8, 7])
def test_allreduce_over_the_rdma_transport_every_byte(rdma_bed, tmp_path, abi):
    """Every net ABI the plugin exports (NCCL 2.19 to 2.32), through railover-perf's forced
    version table: v7 (int sizes), v8 (size_t regMr), v9 (size_t isend/irecv, vProps,
    maxP2pBytes), v10 (the comm config and its traffic class at connect), v11 (init per
    communicator with a context, and finalize) and v12 (the newest). From v10 the comm's
    traffic class (``--traffic-class 5``) reaches the QPs: GRH traffic class 5 and SL 5."""
    big = "1M" if abi == 12 else "64K"  # the full size range once; the ABI tables differ in calls, not sizes
    tc = ["--traffic-class", "5"] if abi >= 10 else []

    def body():
        res = rperf.run_perf(rdma_bed, ranks_per_host=1, timeout_s=900, workload="allreduce", minbytes="1K",
                             maxbytes=big, stepfactor=8, iters=3, warmup=1, channels=1, op_timeout=120,
                             rendezvous_timeout=300, fetch_to=tmp_path, env=RDMA_ENV, abi=abi, extra_args=tc)
        assert res.ok, res.describe()
        assert res.wrong_total == 0 and len(res.ranks) == 2
        logs = "".join(r.stdout + r.stderr for r in res.ranks)
        want = "traffic class 5, SL 5)" if abi >= 10 else "traffic class 0, SL 0)"
        assert re.search(r"RDMA send path \d+ \(generation \d+\) up on rxe\d port 1: 1 QP \(first QPN \d+, "
                         + re.escape(want), logs), logs[-3000:]
        for r in res.ranks:
            assert r.json["exit_code"] == 0 and r.json["errors"] == [], r.json
            assert r.json["stats"]["bytes_received"] > 0
            assert r.json["stats"]["calls"]["regMr"] > 0
            # the plugin chose the HCA port behind each rail NIC
            assert "transport rdma: eth1 -> rxe0 port 1" in r.stdout + r.stderr, r.stdout + r.stderr
            assert "eth2 -> rxe1 port 1" in r.stdout + r.stderr
            # NCCL_IB_PCI_RELAXED_ORDERING's default: NCCL's buffers registered with the flag
            # through ibv_reg_mr_iova2 (Debian 12's rdma-core has it), and rxe takes it (every
            # byte above was written into such registrations)
            assert "relaxed ordering on [" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
            assert "refused IBV_ACCESS_RELAXED_ORDERING" not in r.stdout + r.stderr
            # no grouped receives by default (maxRecvs 1: NCCL shares no comm among local ranks,
            # plugin/api.cc), and messages < 4 GiB (the size travels in 32 bits)
            assert r.json["device"]["max_recvs"] == 1
            if abi >= 9:  # v7/v8 properties have no size limits
                assert r.json["device"]["max_p2p_bytes"] == 2**32 - 1
        if abi == 12:  # the properties NCCL reads are the same under every ABI
            for r in res.ranks:
                _check_device_properties(rdma_bed, rdma_bed.hosts[r.rank].name, r.json["device"])
                line = re.search(r"NIC eth1 device properties from rxe0 port 1: .*", r.stdout + r.stderr)
                assert line, (r.stdout + r.stderr)[-3000:]
                print(f"[rank {r.rank}] {line.group(0)}")
                # rxe reads back the remote access its responder checks: both HCAs (primary and
                # standby receive paths) confirm IBV_ACCESS_REMOTE_WRITE off until advertised
                for hca in ("rxe0", "rxe1"):
                    assert f"{hca}: QP remote access read back as set" in r.stdout + r.stderr, \
                        (r.stdout + r.stderr)[-3000:]
                assert "could not be confirmed to refuse RDMA writes" not in r.stdout + r.stderr

    crash_retry(rdma_bed, body)


def _check_device_properties(bed, host: str, dev: dict) -> None:
    """Device 0 (eth1, on rxe0 port 1) as NCCL's IB transport would report rxe0's port: guid =
    the HCA's sys_image_guid (its network-order bytes as a host integer, as NCCL stores it), port 1, speed = the port's active rate, maxComms = max_qp over
    the QPs each comm puts on the HCA (one per path, a path per NIC: 2 NICs here), and the
    NIC's PCI path (rxe hangs off no PCI function of its own), all read from ``ibv_devinfo -v``
    in the same guest."""
    rc, out, err = bed.sh(host, "ibv_devinfo -v -d rxe0", timeout_s=60)
    assert rc == 0, err
    guid = re.search(r"sys_image_guid:\s*([0-9a-f:]+)", out)
    max_qp = re.search(r"max_qp:\s*(\d+)", out)
    rate = re.search(r"active_width:\s*(\d+)X.*?active_speed:\s*([\d.]+) Gbps", out, re.S)
    assert guid and max_qp and rate, out
    # NCCL's IB transport reports the GUID's network-order bytes read as a host integer
    assert dev["guid"] == int.from_bytes(bytes.fromhex(guid.group(1).replace(":", "")), sys.byteorder), \
        (dev, guid.group(1))
    assert dev["port"] == 1, dev
    assert dev["speed_mbps"] == round(int(rate.group(1)) * float(rate.group(2)) * 1000), (dev, rate.group(0))
    assert dev["max_comms"] == min(65536, int(max_qp.group(1)) // 2), (dev, max_qp.group(1))
    rc, nic_pci, _ = bed.sh(host, "readlink -f /sys/class/net/eth1/device", timeout_s=60)
    assert dev["pci_path"] == nic_pci.strip(), (dev, nic_pci)


class _Background:
    """railover-perf (timed all-reduce, RDMA transport) running in a thread while a test injects
    faults; ``wait_armed`` polls guest A's journal until paths are up on both rails. With
    ``stoppable`` the run lasts at most ``duration`` s and :meth:`result` ends it early through
    railover-perf's stop file (rank 0 finishes the collective in flight and both ranks stop), so
    a test runs only as long as its checks need."""

    def __init__(self, bed, tmp_path, env, duration=100, timeout_s=900, stoppable=False, extra_args=(),
                 workload="allreduce", abi=None, channels=1):
        self.bed, self.box = bed, {}
        self.stop_path = f"/tmp/rstop-{secrets.token_hex(3)}" if stoppable else None
        extra = (["--stop-file", self.stop_path] if self.stop_path else []) + list(extra_args)

        def run():
            self.box["res"] = rperf.run_perf(bed, ranks_per_host=1, timeout_s=timeout_s, workload=workload,
                                             minbytes="64K", maxbytes="256K", stepfactor=4, duration=duration,
                                             warmup=1, channels=channels, op_timeout=240, rendezvous_timeout=300,
                                             fetch_to=tmp_path, env=dict(RDMA_ENV, **env), extra_args=extra,
                                             abi=abi)

        self.t = threading.Thread(target=run, daemon=True)
        self.t.start()

    def wait_armed(self):
        poll_until(lambda: {e["nic"] for e in _journal(self.bed, "A") if e.get("event") == "path_up"} >= {"eth1", "eth2"},
                   300, 1.0, "paths on both rails in guest A")

    def wait_event(self, name, timeout_s):
        poll_until(lambda: any(e.get("event") == name for e in _journal(self.bed, "A") + _journal(self.bed, "B")),
                   timeout_s, 1.0, f"a {name} event")

    def result(self):
        # guest clocks (as the journals) when the run was told to end: what follows is the close
        self.stop_us = {h.name: self.bed.guest_now_us(h.name) for h in self.bed.hosts}
        if self.stop_path and self.t.is_alive():
            self.bed.run("A", ["touch", self.stop_path], timeout_s=60)
        self.t.join(1000)
        if self.stop_path:
            self.bed.run("A", ["rm", "-f", self.stop_path], timeout_s=60)
        res = self.box.get("res")
        assert res is not None, "railover-perf did not finish"
        return res


def _rank_events(tmp_path, rank: int) -> List[dict]:
    """Rank ``rank``'s journal (rank 0 runs in guest A, rank 1 in B; times on that guest's clock)."""
    path = tmp_path / f"journal-rank{rank}.jsonl"
    assert path.is_file(), f"rank {rank} wrote no journal"
    stats = journal.Stats()
    events = journal.read(path, stats)
    assert stats.garbled == 0, f"rank {rank}'s journal has {stats.garbled} garbled line(s)"  # the run has ended
    return events


def _events(tmp_path) -> List[dict]:
    return _rank_events(tmp_path, 0) + _rank_events(tmp_path, 1)


def _named(evs: List[dict], name: str) -> List[dict]:
    return [e for e in evs if e.get("event") == name]


def _hold_guest_time(bed, host: str, seconds: float) -> None:
    """Keep a fault in place for ``seconds`` of the guest's clock (the fault's duration, not a
    synchronisation); polls the guest clock."""
    t0 = bed.guest_now_us(host)
    poll_until(lambda: bed.guest_now_us(host) - t0 >= seconds * 1e6, seconds * 20 + 120, 0.5,
               f"{seconds} s of guest time in {host}")


#: the net ABIs the single-fault and negative-control tests below run under: v12 (the newest)
#: only, or every one with RAILOVER_BED_FULL_ABI_MATRIX=1 (the full matrix, ~6x their time);
#: by default the older ABIs get one sequence of faults each
#: (test_a_sequence_of_faults_fails_over_and_back_under_every_older_abi)
FULL_ABI_MATRIX_ENV = "RAILOVER_BED_FULL_ABI_MATRIX"
OLDER_ABIS = [11, 10, 9, 8, 7]
FAULT_ABIS = [12] + (OLDER_ABIS if os.environ.get(FULL_ABI_MATRIX_ENV) == "1" else [])
abi_matrix = pytest.mark.parametrize("abi", FAULT_ABIS, ids=lambda a: f"v{a}")


def _abi_arg(abi: int):
    """railover-perf's abi option: v12 unforced (the plugin's newest), older ones forced."""
    return None if abi == 12 else abi


def _check_abi(res, abi: int) -> None:
    """Both ranks ran the plugin through net ABI ``abi`` (forced below v12)."""
    for r in res.ranks:
        assert r.json, f"rank {r.rank} wrote no result: {r.stderr[-2000:]}"
        assert r.json["plugin"]["abi"] == abi and r.json["plugin"]["abi_forced"] == (abi != 12), r.json["plugin"]


#: fault kind -> (fault class, NIC, the guests that see their eth1 go down: nic_down), every
#: fault on the primary rail (rail 0, eth1 in both guests)
FAULTS = {"cable_pull": (rf.CablePull, "a0", {"A"}), "admin_down": (rf.AdminDown, "a0", {"A"}),
          "silent": (rf.Silent, "a0", set()), "one_way": (rf.OneWay, "a0", set()),
          "receiver_cable_pull": (rf.CablePull, "b0", {"B"})}

HOSTS = ("A", "B")  # rank 0 runs in guest A, rank 1 in B
SWITCHES = ("failover", "failback", "recover")


def _stamps(bed) -> Dict[str, int]:
    """Both guests' clocks now (µs; each journal is on its own guest's clock)."""
    return {h: bed.guest_now_us(h) for h in HOSTS}


def _back_on_primary(by_host: Dict[str, List[dict]], repaired: Dict[str, int]) -> bool:
    """In these events (per guest): a failback since ``repaired``, and every send comm that
    switched is now on eth1 (its last failover/failback/recover went there)."""
    last, failback = {}, False
    for h, evs in by_host.items():
        for e in sorted((e for e in evs if e.get("event") in SWITCHES), key=lambda e: e["t_us"]):
            last[(h, e["comm"])] = e
            failback |= e["event"] == "failback" and e["t_us"] >= repaired[h]
    return failback and all(e["to_nic"] == "eth1" for e in last.values())


def _check_switch_rate(evs: List[dict], what: str) -> None:
    """No comm switches 3 times within 1 s (the flap budget with a 1 s hold-down)."""
    switches: Dict[str, List[int]] = {}
    for e in _named(evs, "failover") + _named(evs, "failback"):
        switches.setdefault(e["comm"], []).append(e["t_us"])
    for comm, ts in switches.items():
        ts.sort()
        print(f"{what} comm {comm}: switches at {[(t - ts[0]) // 1000 for t in ts]} ms")
        for i in range(len(ts) - 2):
            assert ts[i + 2] - ts[i] > 1_000_000, f"{what}: 3 switches within 1 s for comm {comm}: {ts}"


class _FaultSequence:
    """Faults on the primary rail injected one after another into one :class:`_Background`
    run (1 s hold-down): each is held until a comm failed over, then repaired, and the next
    starts only once a comm failed back and every comm that switched is on eth1 again (journal
    events, never a sleep). :meth:`both_rails_down` (A's two cables pulled until a comm gives
    up) can end a sequence. Each step keeps its window on both guests' clocks, from before the
    fault to that failback; :meth:`check` asserts per window on the journals fetched after the
    run: a failover to eth2, a path on eth1 down, a failback, which guests saw eth1 go down,
    nothing fatal (and a fatal naming both HCA ports for both rails down)."""

    def __init__(self, bed):
        self.bed = bed
        self.steps: List[dict] = []

    def _live(self, since: Dict[str, int]) -> Dict[str, List[dict]]:
        return {h: [e for e in _journal(self.bed, h) if e.get("t_us", 0) >= since[h]] for h in HOSTS}

    def _begin(self, kind: str) -> dict:
        step = {"kind": kind, "start": _stamps(self.bed), "t0": time.monotonic()}
        self.steps.append(step)
        return step

    def _wait_live(self, step: dict, pred, timeout_s: float, what: str) -> None:
        poll_until(lambda: pred(self._live(step["start"])), timeout_s, 1.0, f"{what} ({step['kind']})")

    def _settle(self, step: dict, repaired: Dict[str, int]) -> None:
        self._wait_live(step, lambda ev: _back_on_primary(ev, repaired), 240,
                        "a failback and every comm that switched back on eth1")
        step["end"] = _stamps(self.bed)
        step["wall_s"] = time.monotonic() - step["t0"]
        print(f"fault {step['kind']}: {step['wall_s']:.1f} s from injection to every comm back on eth1")

    def fault(self, kind: str) -> None:
        """One fault of :data:`FAULTS`, held until a comm failed over, then repaired."""
        cls, nic, _ = FAULTS[kind]
        step = self._begin(kind)
        f = cls(self.bed, nic).apply()
        try:
            self._wait_live(step, lambda ev: any(_named(ev[h], "failover") for h in HOSTS), 120, "a failover")
            if isinstance(f, rf.OneWay):
                step["dropped"] = f.counter()
        finally:
            repaired = _stamps(self.bed)  # before the repair: a failback may follow within ms
            f.undo()
        self._settle(step, repaired)

    def flap(self) -> None:
        """A's primary cable pulled 4 times for 0.5 s, 1 s apart."""
        step = self._begin("flap")
        fl = rf.Flap(self.bed, "a0", count=4, down_ms=500, up_ms=1000)
        try:
            fl.apply()
        finally:
            fl.undo()  # only acts when the apply was interrupted
        step["cycles"] = fl.cycles
        # the last repair on A's clock (the flap's); B's clock read just after it
        self._settle(step, dict(_stamps(self.bed), A=fl.cycles[-1][1]))

    def both_rails_down(self) -> None:
        """Both of A's cables pulled and held until a comm gave up (``fatal``); the run ends."""
        step = self._begin("both_rails_down")
        pulls = []
        try:
            for nic in ("a0", "a1"):
                pulls.append(rf.CablePull(self.bed, nic).apply())
            self._wait_live(step, lambda ev: any(_named(ev[h], "fatal") for h in HOSTS), 120, "a fatal error")
            step["wall_s"] = time.monotonic() - step["t0"]
            print(f"both rails down: {step['wall_s']:.1f} s from the pulls to the fatal error")
        finally:
            for f in pulls:
                f.undo()

    def check(self, tmp_path) -> None:
        final = {"A": _rank_events(tmp_path, 0), "B": _rank_events(tmp_path, 1)}
        for step in self.steps:
            kind, end = step["kind"], step.get("end", {h: float("inf") for h in HOSTS})
            win = {h: [e for e in final[h] if step["start"][h] <= e["t_us"] <= end[h]] for h in HOSTS}
            evs = win["A"] + win["B"]
            if kind == "both_rails_down":
                _check_no_usable_path(evs)
                continue
            assert not _named(evs, "fatal"), (kind, _named(evs, "fatal"))
            assert any(e["to_nic"] == "eth2" for e in _named(evs, "failover")), (kind, _named(evs, "failover"))
            assert any(e["nic"] == "eth1" for e in _named(evs, "path_down")), (kind, _named(evs, "path_down"))
            assert _named(evs, "failback"), (kind, [e.get("event") for e in evs])
            if kind == "flap":
                _check_flap(win, step["cycles"])
                continue
            # which ends saw eth1 go down: the pulled or downed NIC's guest only, none for a
            # black hole (no carrier or port event: only probes and the progress watch can tell)
            saw = {h for h in HOSTS if _named(win[h], "nic_down")}
            assert saw == FAULTS[kind][2], (kind, {h: _named(win[h], "nic_down") for h in HOSTS})
            assert all(e["nic"] == "eth1" for e in _named(evs, "nic_down")), (kind, _named(evs, "nic_down"))
            if kind == "one_way":
                assert step["dropped"] > 0, "the one-way drop rule dropped nothing"
        # a fatal error only once both rails were down
        last = self.steps[-1]
        for h in HOSTS:
            early = [e for e in _named(final[h], "fatal")
                     if last["kind"] != "both_rails_down" or e["t_us"] < last["start"][h]]
            assert not early, early


def _check_flap(win: Dict[str, List[dict]], cycles) -> None:
    """A flapping primary (4 pulls): every cycle ran, no comm switched 3 times within a
    hold-down, the repeated failures are flaps that grew the hold-down."""
    print("flap cycles (A clock, ms after the first pull): "
          + ", ".join(f"{(d - cycles[0][0]) / 1e3:.0f}-{(u - cycles[0][0]) / 1e3:.0f}" for d, u in cycles))
    assert len(cycles) == 4
    for rank, h in enumerate(HOSTS):
        _check_switch_rate(win[h], f"rank {rank}")
    flaps = _named(win["A"] + win["B"], "flap")
    assert flaps, "the repeated failures are reported as flaps"
    assert max(int(e["hold_down_ms"]) for e in flaps) > 1000, flaps


def _check_no_usable_path(evs: List[dict]) -> None:
    """A comm gave up with a fatal error naming "no usable path" and the HCA port behind each
    NIC, not only the NIC (the issue's "naming HCA, port")."""
    fatal = _named(evs, "fatal")
    assert fatal and "no usable path" in fatal[0]["message"], fatal
    assert len(set(re.findall(r"rxe\d+ port 1", fatal[0]["message"]))) == 2, fatal[0]["message"]


def _check_fatal_run(res) -> None:
    """The run of a both-rails-down ended in a clean error, not a hang or wrong bytes."""
    assert not res.timed_out, "never a silent hang"
    assert any(r.returncode not in (0, None) for r in res.ranks), [r.returncode for r in res.ranks]
    assert all(r.returncode != 1 for r in res.ranks), "wrong data: " + res.describe()
    assert res.wrong_total == 0
    text = "\n".join(r.stdout + r.stderr for r in res.ranks)
    assert "no usable path" in text and "ncclSystemError" in text, text[-3000:]


@abi_matrix
@pytest.mark.parametrize("kind", list(FAULTS))
def test_a_fault_on_the_primary_fails_over_to_the_standby_hca_and_back(rdma_bed, tmp_path, kind, abi):
    """cable_pull: guest A's eth1 loses carrier (rxe0 port error at once); admin_down: ``ip link
    set eth1 down`` in A (the netdev's admin state and rxe0's port go down); silent: its wire
    black-holes both directions (nftables drops at the input of both ends; no carrier or port
    event: only probes and the progress watch can tell); one_way: what leaves A's eth1 is lost
    (dropped at B's input; B's packets still arrive);
    receiver_cable_pull: B's eth1 loses carrier while A sends to it (B gets the port error, A
    only silence: its RC retries and probes go unanswered)."""
    bed = rdma_bed

    def body():
        run = _Background(bed, tmp_path, {"RAILOVER_HOLD_DOWN_MS": "1000"}, duration=600, stoppable=True,
                          abi=_abi_arg(abi))
        seq = _FaultSequence(bed)
        try:
            run.wait_armed()
            seq.fault(kind)
        finally:
            res = run.result()
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        _check_abi(res, abi)
        seq.check(tmp_path)

    crash_retry(bed, body)


#: the faults every older ABI's run injects first, in order, each repaired and failed back
#: before the next (each takes 6-10 s in this bed)
OLDER_ABI_FAULTS = ["cable_pull", "receiver_cable_pull", "admin_down"]
#: then one of the slower ones (15-27 s each: detected by the probes or the progress watch, or
#: a hold-down the flaps grew), to keep CI's time (55-80 s per ABI instead of ~96 s for all):
#: the silent black hole and the one-way loss each on two older ABIs, the flap (cable pulls
#: again, with hold-down growth) on one; all of them on every older ABI with
#: RAILOVER_BED_FULL_ABI_MATRIX=1. The v12 tests run each alone.
OLDER_ABI_SLOW_FAULTS = {11: ["silent"], 10: ["one_way"], 9: ["flap"], 8: ["silent"], 7: ["one_way"]}
if os.environ.get(FULL_ABI_MATRIX_ENV) == "1":
    OLDER_ABI_SLOW_FAULTS = {abi: ["silent", "one_way", "flap"] for abi in OLDER_ABIS}


@pytest.mark.parametrize("abi", OLDER_ABIS, ids=lambda a: f"v{a}")
def test_a_sequence_of_faults_fails_over_and_back_under_every_older_abi(rdma_bed, tmp_path, abi):
    """The plugin driven through an older net ABI's table (the single-fault tests run v12, the
    newest, unless RAILOVER_BED_FULL_ABI_MATRIX=1): one run, every byte checked, takes a cable
    pull at either end of the primary, an admin down and the ABI's share of a silent black hole,
    a one-way loss and a flap (:data:`OLDER_ABI_SLOW_FAULTS`), each held until a comm failed over
    and, after its repair, waited until the comms failed back to the primary; then both of A's
    cables are pulled and the run must end in a clean
    ``no usable path`` error naming both HCA ports within the fatal timeout (10 s, plus TCG's
    slack), never a hang. Per fault: failover to eth2, a path on eth1 down, failback, which guests
    saw eth1 go down, the flap's switch budget and grown hold-down; 0 wrong bytes in the whole
    run."""
    bed = rdma_bed

    def body():
        run = _Background(bed, tmp_path, {"RAILOVER_HOLD_DOWN_MS": "1000", "RAILOVER_FATAL_TIMEOUT": "10"},
                          duration=1200, timeout_s=1500, stoppable=True, abi=abi)
        seq = _FaultSequence(bed)
        try:
            run.wait_armed()
            for kind in OLDER_ABI_FAULTS + OLDER_ABI_SLOW_FAULTS[abi]:
                seq.flap() if kind == "flap" else seq.fault(kind)
            seq.both_rails_down()
        finally:
            res = run.result()
        _check_fatal_run(res)
        _check_abi(res, abi)
        for r in res.ranks:
            assert r.json["stats"]["bytes_received"] > 0, r.json["stats"]
        seq.check(tmp_path)

    crash_retry(bed, body)


def test_a_job_that_starts_with_the_primary_cable_pulled_runs_and_moves_to_it_after_the_repair(rdma_bed, tmp_path):
    """Guest A's eth1 cable is pulled before the ranks start (RAILOVER_TRANSPORT=rdma): the
    plugin keeps the NIC (its port is chosen while DOWN and reported down at once), the comms
    run on eth2, every byte checked; after the repair the comms move to eth1 (a path comes up
    on it and A's send comm fails back to it). Before, init failed ("not ACTIVE") with
    RAILOVER_TRANSPORT=rdma, and auto served every NIC with TCP."""
    bed = rdma_bed

    def body():
        pull = rf.CablePull(bed, "a0").apply()
        run = None
        try:
            poll_until(lambda: "DOWN" in rf.guest_link(bed, "a0")["port_state"], 120, 0.5,
                       "rxe port of a0 DOWN before the job starts")
            run = _Background(bed, tmp_path, {"RAILOVER_HOLD_DOWN_MS": "1000"}, duration=600, stoppable=True)
            poll_until(lambda: any(e.get("event") == "path_up" and e.get("nic") == "eth2" and e.get("dir") == "send"
                                   for e in _journal(bed, "A")), 300, 1.0, "a send path on eth2 in guest A")
            assert not any(e.get("event") == "path_up" and e.get("nic") == "eth1" for e in _journal(bed, "A")), \
                "a path came up on the pulled NIC"
        finally:
            pull.undo()
        try:
            poll_until(lambda: any(e.get("event") == "failback" for e in _journal(bed, "A")), 300, 1.0,
                       "guest A's comm moving to eth1 after the repair")
        finally:
            res = run.result() if run else None
        assert res is not None and res.ok, res.describe() if res else "no run"
        assert res.wrong_total == 0
        evs = _rank_events(tmp_path, 0)
        assert not _named(evs, "fatal"), _named(evs, "fatal")
        assert any(e["nic"] == "eth1" for e in _named(evs, "path_up")), "no path on eth1 after the repair"
        text = "\n".join(r.stdout + r.stderr for r in res.ranks)
        assert "not ACTIVE" in text and "move to it once the port is ACTIVE" in text, text[-3000:]

    crash_retry(bed, body)


def test_a_cut_of_the_roce_flow_alone_fails_over_on_the_flow_stall_rule(rdma_bed, tmp_path):
    """Only RoCE v2 packets (UDP port 4791) are dropped on the primary rail, both directions:
    the probes and bootstrap streams on that rail go on answering, so the health layer sees a
    working rail, as with an ECMP route that black-holes one QP's flow or a stuck traffic class.
    The QPs' silence with writes in flight (RAILOVER_FLOW_STALL_MS, 5 s under TCG) moves both
    guests' send comms to the standby HCA long before the RC retries would end in an error
    (7 retries of NCCL_IB_TIMEOUT 20: ~30 s); after the repair they fail back, every byte
    checked. Without the rule the first cause would be the RC's retry-exceeded error. The cut is
    held until a comm that failed back onto the still-cut rail was moved off it again."""
    bed = rdma_bed

    def body():
        run = _Background(bed, tmp_path, {"RAILOVER_HOLD_DOWN_MS": "1000"}, duration=600, stoppable=True)
        try:
            run.wait_armed()
            fault = rf.RoceOnly(bed, "a0").apply()
            try:
                poll_until(lambda: sum(1 for e in _journal(bed, "A") + _journal(bed, "B")
                                       if e.get("event") == "failover") >= 2, 180, 1.0,
                           "a failover in both guests")
                assert fault.counter() > 0, "the RoCE drop rules dropped nothing"

                # The cut stays: the primary's probes answer, so a comm fails back onto it after
                # the hold-down, and the rule must move it off again (a flap), not leave it to the
                # RC retries (found by a review: the rule was off while a RESUME was out).
                def stalled_again():
                    for h in ("A", "B"):
                        n = [e for e in _journal(bed, h) if e.get("event") == "path_down" and e.get("dir") == "send"
                             and e.get("nic") == "eth1" and "data flow stalled" in e.get("cause", "")]
                        if len(n) >= 2:
                            return h
                    return None
                poll_until(stalled_again, 240, 1.0, "a failback onto the cut rail failed over again")
            finally:
                fault.undo()
            # both guests' comms move back (a comm that flapped waits out its grown hold-down)
            poll_until(lambda: all(any(e.get("event") == "failback" for e in _journal(bed, h)) for h in ("A", "B")),
                       240, 1.0, "a failback in both guests")
        finally:
            res = run.result()
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        for rank in (0, 1):
            evs = _rank_events(tmp_path, rank)
            assert not _named(evs, "nic_down"), "a cut of the RoCE flow has no carrier or port event"
            assert not _named(evs, "fatal"), _named(evs, "fatal")
            downs = [e for e in _named(evs, "path_down") if e.get("dir") == "send" and e["nic"] == "eth1"]
            assert downs, f"rank {rank}: the primary send path never went down"
            # by its own rule, or by the peer's receiver closing the path on its rule (whichever
            # end's silence was judged first); never by the RC's retry-exceeded error
            assert ("data flow stalled" in downs[0]["cause"] or "bootstrap stream" in downs[0]["cause"]), downs[0]
            assert _named(evs, "failover") and _named(evs, "failback"), [e.get("event") for e in evs]
        causes = [e.get("cause", "") for r in (0, 1) for e in _named(_rank_events(tmp_path, r), "path_down")]
        assert any("flow stalled" in c for c in causes), causes
        assert any(_named(_rank_events(tmp_path, r), "flap") for r in (0, 1)), "a failure after a failback is a flap"

    crash_retry(bed, body)


def test_an_address_change_on_the_primary_rechooses_its_gid_and_every_byte_arrives(rdma_bed, tmp_path):
    """Guest B's primary NIC gets another address while a job runs (rxe's RoCE v2 GID follows the
    address): the port watch re-chooses the NIC's GID after IBV_EVENT_GID_CHANGE and journals it
    (hca_addr_change, kind gid, the new address's GID), and the health layer journals the address
    change. The comms keep their bytes whatever their QPs on the old GID do: no fatal error, every
    byte checked; after the address is restored the GID is chosen back."""
    bed = rdma_bed

    def gid_changes(addr):
        return [e for e in _journal(bed, "B") if e.get("event") == "hca_addr_change" and e.get("nic") == "eth1"
                and e.get("new", "").endswith("::ffff:" + addr)]

    def body():
        run = _Background(bed, tmp_path, {"RAILOVER_HOLD_DOWN_MS": "1000"}, duration=600, stoppable=True)
        try:
            run.wait_armed()
            with rf.AddrChange(bed, "b0", "10.0.0.22"):
                poll_until(lambda: gid_changes("10.0.0.22"), 180, 1.0, "the GID re-chosen for 10.0.0.22 in guest B")
            poll_until(lambda: gid_changes("10.0.0.2"), 180, 1.0, "the GID chosen back for 10.0.0.2 in guest B")
        finally:
            res = run.result()
            # While the job's QPs held GID index 1, rxe put each new address's GID at the next
            # free index, so 10.0.0.2 is back at index 2; with the job gone, one more swap puts
            # it at index 1, where the bed's reset (and every later test) expects it.
            with rf.AddrChange(bed, "b0", "10.0.0.22"):
                pass
            poll_until(lambda: rf.guest_link(bed, "b0")["gid1"] == gid_of("10.0.0.2"), 120, 0.5,
                       "B's eth1 GID back at index 1")
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        evs = _rank_events(tmp_path, 1)
        assert not _named(evs, "fatal"), _named(evs, "fatal")
        changes = [e for e in _named(evs, "hca_addr_change") if e["nic"] == "eth1"]
        assert [e["kind"] for e in changes][:2] == ["gid", "gid"], changes
        assert changes[0]["hca"].endswith("port 1") and changes[0]["old"].endswith("::ffff:10.0.0.2"), changes[0]
        assert "GID table changed" in changes[0]["why"], changes[0]
        assert any(e.get("new") == "10.0.0.22" for e in _named(evs, "nic_addr_change")), _named(evs, "nic_addr_change")
        assert not _named(_rank_events(tmp_path, 0), "fatal")

    crash_retry(bed, body)


def _cable_pull_and_repair(bed, tmp_path, env=None, nic="a0", **background):
    """A background railover-perf run (1 s hold-down, plus ``env``; ``background`` goes to
    :class:`_Background`), a cable pull on ``nic`` (A's primary by default) once paths are up,
    held until a comm failed over, then repaired; waits for a failback and returns the run's
    result."""
    run = _Background(bed, tmp_path, dict({"RAILOVER_HOLD_DOWN_MS": "1000"}, **(env or {})), duration=600,
                      stoppable=True, **background)
    try:
        run.wait_armed()
        fault = rf.CablePull(bed, nic).apply()
        try:
            run.wait_event("failover", 120)
        finally:
            fault.undo()
        run.wait_event("failback", 240)
    finally:
        res = run.result()
    return res


def test_iflush_reads_through_the_hca_and_survives_its_cable_pull(rdma_bed, tmp_path):
    """NCCL's GPUDirect receive path on real verbs (rxe): railover-perf ``--flush`` calls iflush
    after every SIMPLE receive with bytes, as NCCL's proxy does for GPU buffers. Each flush is
    a 1-byte RDMA READ of the receive buffer through the receiving NIC's flush QP (a QP
    connected to itself), so no flush request may come back NULL ("nothing to flush") and every
    one must complete. A cable pull on A's primary in the middle: the flushes on that HCA fail
    over to the other NIC's flush QP with the data, the run ends with 0 wrong bytes and no error,
    and the comms fail back after the repair."""
    bed = rdma_bed

    def body():
        res = _cable_pull_and_repair(bed, tmp_path, extra_args=["--flush"])
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        for r in res.ranks:
            stats = r.json["stats"]
            assert r.json["exit_code"] == 0 and r.json["errors"] == [], r.json
            assert stats["calls"]["iflush"] > 0, stats
            assert stats["null_returns"]["iflush"] == 0, "an RDMA receive always has something to flush"
            # rxe in the guests: no GPU peer-memory client, no dmabuf support: host memory only
            assert r.json["device"]["ptr_support"] == 1, r.json["device"]
        assert _named(_events(tmp_path), "failover") and _named(_events(tmp_path), "failback")

    crash_retry(bed, body)


def test_grouped_receives_on_three_qps_per_path_survive_a_cable_pull(rdma_bed, tmp_path):
    """Grouped receives end to end on real verbs, on paths of three RC QPs: railover-perf
    ``--group 8`` posts SIMPLE steps (16 KiB slots, so a message spans 4-16 steps) 8 at a time
    as one irecv whose buffers are in reverse step order, each with its own tag: every message
    must be placed by its tag through the GROUP_ENTRY advertisements and the sender's DONE, and
    the checker counts any byte in a wrong buffer. ``NCCL_IB_QPS_PER_CONNECTION=3`` on both
    ranks: each chunk is split over three QPs and a message is reported only once every QP's
    share has landed (the DONE on QP 0 and a PART on QPs 1 and 2). A cable pull on A's primary
    mid-run breaks all three QPs of each primary path: what is left of each group is
    re-advertised with the standby HCA's keys and the resent messages land by tag again on the
    standby's three QPs; after the repair the comms fail back; 0 wrong bytes, no error. (One
    QP per path, the default, is what every other test here runs.)"""
    bed = rdma_bed

    def body():
        res = _cable_pull_and_repair(bed, tmp_path, env={"NCCL_IB_QPS_PER_CONNECTION": "3", "RAILOVER_MAX_RECVS": "8"},
                                     workload="sendrecv",
                                     extra_args=["--slot-size", "16K", "--group", "8"])
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        for r in res.ranks:
            assert r.json["exit_code"] == 0 and r.json["errors"] == [], r.json
            assert r.json["config"]["group"] == 8
            st = r.json["stats"]
            assert st["bytes_received"] > 0
            # grouped: far fewer receives than 16 KiB steps moved
            assert st["calls"]["irecv"] * 16384 * 3 < st["bytes_received"], st
        logs = "".join(r.stdout + r.stderr for r in res.ranks)
        assert "up on rxe0 port 1: 3 QPs" in logs and "up on rxe1 port 1: 3 QPs" in logs, logs[-3000:]
        assert " 1 QP " not in logs, "a path of one QP although NCCL_IB_QPS_PER_CONNECTION=3"
        evs = _events(tmp_path)
        assert _named(evs, "failover") and _named(evs, "failback")
        assert not _named(evs, "fatal"), _named(evs, "fatal")

    crash_retry(bed, body)


def test_sends_that_reach_isend_before_their_receive_wait_for_it_through_a_cable_pull(rdma_bed, tmp_path):
    """NCCL's shared-comm (PXN) case on real verbs: with maxRecvs > 1 the connections sharing a
    comm post their sends out of each other's order, and a send must go only into the oldest
    receive not yet filled, into a free buffer with its tag, or be answered with a NULL request.
    railover-perf ``--group 4 --send-ahead`` tries, every pass, the step after the next one
    first: when that step belongs to the next irecv the plugin must defer it (NULL), and when it
    belongs to the same irecv it may take it before the next one. Any send placed in the wrong
    receive lands in another step's buffer (wrong bytes) or fails the receive (tag mismatch).
    A cable pull on A's primary in the middle: the deferred sends are placed by what the
    receiver re-advertises on the standby. 0 wrong bytes, no error, sends really deferred,
    failover and failback."""
    bed = rdma_bed

    def body():
        res = _cable_pull_and_repair(bed, tmp_path, env={"RAILOVER_MAX_RECVS": "4"}, workload="sendrecv",
                                     extra_args=["--slot-size", "4K", "--group", "4", "--send-ahead"])
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        for r in res.ranks:
            assert r.json["exit_code"] == 0 and r.json["errors"] == [], r.json
            assert r.json["config"]["group"] == 4 and r.json["config"]["send_ahead"] is True
            assert r.json["device"]["max_recvs"] == 4
            st = r.json["stats"]
            assert st["bytes_received"] > 0
            assert st["null_returns"]["isend"] > 0, "no send of a later irecv was ever deferred: " + repr(st)
        evs = _events(tmp_path)
        assert _named(evs, "failover") and _named(evs, "failback")
        assert not _named(evs, "fatal"), _named(evs, "fatal")

    crash_retry(bed, body)


@abi_matrix
def test_a_flapping_primary_limits_switches_and_fails_back_once_stable(rdma_bed, tmp_path, abi):
    """Guest A's primary cable is pulled 4 times for 0.5 s, 1 s apart (hold-down 1 s): every
    byte arrives, no comm switches 3 times within one hold-down (the flap budget), the repeated
    failures are reported as flaps that grow the hold-down, and after the last repair traffic
    returns to the primary (failback)."""
    bed = rdma_bed

    def body():
        run = _Background(bed, tmp_path, {"RAILOVER_HOLD_DOWN_MS": "1000"}, duration=600, stoppable=True,
                          abi=_abi_arg(abi))
        seq = _FaultSequence(bed)
        try:
            run.wait_armed()
            seq.flap()
        finally:
            res = run.result()
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        _check_abi(res, abi)
        seq.check(tmp_path)
        # the flap budget over the whole run, not only the flap's window
        for rank in (0, 1):
            _check_switch_rate(_rank_events(tmp_path, rank), f"rank {rank} (whole run)")

    crash_retry(bed, body)


@abi_matrix
def test_a_congested_primary_is_not_a_failure(rdma_bed, tmp_path, abi):
    """Negative control: both ends of the primary rail shaped to 8 Mbit/s with a queue of up to
    1.5 s (tbf), well below what the rail carries here, for 20 s while the all-reduce runs.
    Probes wait behind data in that queue and messages complete slowly, but data keeps moving:
    no failover, no error (as the TCP suite's rate-limit control) and no oscillation (at most
    one recovery per comm). The shaper's counters prove the rail was congested (packets held
    back) and that the traffic stayed on it."""
    bed = rdma_bed

    def body():
        run = _Background(bed, tmp_path, {}, duration=600, stoppable=True, abi=_abi_arg(abi))
        rates = [rf.Rate(bed, n, rate="8mbit", burst=32768, latency_ms=1500) for n in ("a0", "b0")]
        try:
            run.wait_armed()
            before = {}
            try:
                for f in rates:
                    f.apply()
                    before[f.nic.name] = f.stats()
                _hold_guest_time(bed, "A", 20)
                after = {f.nic.name: f.stats() for f in rates}
            finally:
                for f in rates:
                    f.undo()
        finally:
            res = run.result()
        for name in before:
            b, a = before[name], after[name]
            print(f"tbf on {name}: sent {(a['sent_bytes'] - b['sent_bytes']) / 1e6:.2f} MB, overlimits "
                  f"{a['overlimits'] - b['overlimits']}, dropped {a['dropped'] - b['dropped']}")
        a0b, a0a = before["a0"], after["a0"]
        assert a0a["overlimits"] > a0b["overlimits"], "the shaper never held a packet back: no congestion"
        assert a0a["sent_bytes"] - a0b["sent_bytes"] > 2_000_000, "the traffic left the congested primary"
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        _check_abi(res, abi)
        moves = []
        for rank in (0, 1):
            evs = _rank_events(tmp_path, rank)
            for e in evs:
                if e.get("event") in ("path_down", "failover", "failback", "recover", "flap", "fatal"):
                    moves.append(e)
                    print(f"rank {rank}: {e['event']} {e.get('dir', '')} {e.get('nic') or e.get('to_nic')} "
                          f"comm {e.get('comm')} t {e['t_us']} {e.get('cause', '')}")
            # as the TCP suite's rate-limit control: no failover, no error
            assert not _named(evs, "failover"), _named(evs, "failover")
            assert not _named(evs, "fatal"), _named(evs, "fatal")
            # and no oscillation: at most one path move back and forth per comm
            per_comm: Dict[str, int] = {}
            for e in evs:
                if e.get("event") in ("failback", "recover"):
                    per_comm[e["comm"]] = per_comm.get(e["comm"], 0) + 1
            assert all(n <= 1 for n in per_comm.values()), per_comm

    crash_retry(bed, body)


@abi_matrix
def test_a_stopped_peer_is_not_a_nic_failure(rdma_bed, tmp_path, abi):
    """Negative control: rank 1 (guest B) SIGSTOPped for 12 s of B's clock, longer than the stall
    watch (5 s) and the probe timeout (10 s) of the TCG timers, then SIGCONTinued. B's kernel
    and HCA keep running, only the process is frozen: no failover, no path_down, no error, and
    the collective in flight completes with every byte."""
    bed = rdma_bed

    def body():
        run = _Background(bed, tmp_path, {}, duration=600, stoppable=True, abi=_abi_arg(abi))
        try:
            run.wait_armed()
            st = rf.Stop(bed, "B", "railover-perf").apply()
            try:
                assert len(st.pids) == 1, st.pids
                assert set(st.states().values()) == {"T"}, st.states()
                _hold_guest_time(bed, "B", 12)
                assert set(st.states().values()) == {"T"}, "rank 1 was not stopped all along"
            finally:
                st.undo()
            assert "T" not in st.states().values(), st.states()
        finally:
            res = run.result()
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        for r in res.ranks:
            assert r.json["exit_code"] == 0 and r.json["errors"] == [], r.json
        _check_abi(res, abi)
        evs = _events(tmp_path)
        print("while stopped:", [(e["event"], e.get("nic"), e.get("cause")) for e in evs
                                 if e.get("event") in ("pair_down", "pair_up", "peer_silence", "health_late")][:12])
        assert not _named(evs, "failover"), _named(evs, "failover")
        assert not _named(evs, "fatal"), _named(evs, "fatal")
        # path_down before the run was told to end (the close that follows is another test's topic)
        downs = [e for r, host in ((0, "A"), (1, "B")) for e in _named(_rank_events(tmp_path, r), "path_down")
                 if e["t_us"] < run.stop_us[host]]
        assert not downs, downs

    crash_retry(bed, body)


def test_a_receiver_stopped_while_a_path_reconnects_fails_no_connect_attempt(rdma_bed, tmp_path):
    """The verbs receiver answers a reconnect on its own threads (its acceptor takes the bootstrap
    stream, its comm reads the sender's endpoints, brings its QPs up and answers with its own).
    Guest A's standby cable is pulled and, once A's send comm has lost that path, rank 1 (B, the
    receiver of A's send comm) is SIGSTOPped and the cable repaired: A reconnects the path at
    once, B's kernel completes the TCP handshake and acknowledges A's HELLO and endpoints, and
    the answer waits for B's process. A waits 10 s of its clock for it (past the 3 s connect
    timeout), then B is SIGCONTinued: the path must come up in that first attempt
    (SendPath::connectWaitsOffNetwork), with no "connect timed out" for it, and every byte of
    the collective arrives. Before, the attempt timed out after 3 s and was retried while B
    was stopped (RdmaEngineTest.AReceiverAwayLongerThanTheConnectTimeoutFailsNoConnectAttempt
    pins it with fakes)."""
    bed = rdma_bed

    def body():
        run = _Background(bed, tmp_path, {}, duration=600, timeout_s=900, stoppable=True)
        pull = st = None
        try:
            run.wait_armed()
            pulled = _stamps(bed)
            pull = rf.CablePull(bed, "a1").apply()
            poll_until(lambda: any(e.get("event") == "path_state" and e.get("dir") == "send" and e.get("nic") == "eth2"
                                   and e.get("to") == "failed" and e["t_us"] >= pulled["A"]
                                   for e in _journal(bed, "A")), 240, 1.0, "A's send path on eth2 failed")
            st = rf.Stop(bed, "B", "railover-perf").apply()
            assert len(st.pids) == 1, st.pids
            repaired = _stamps(bed)
            pull.undo()
            pull = None
            poll_until(lambda: any(e.get("event") == "path_state" and e.get("dir") == "send" and e.get("nic") == "eth2"
                                   and e.get("to") == "connecting" and e["t_us"] >= repaired["A"]
                                   for e in _journal(bed, "A")), 240, 1.0, "A reconnecting its send path on eth2")
            _hold_guest_time(bed, "A", 10)
            assert set(st.states().values()) == {"T"}, "rank 1 was not stopped all along"
            st.undo()
            st = None
            poll_until(lambda: any(e.get("event") == "path_up" and e.get("dir") == "send" and e.get("nic") == "eth2"
                                   and e["t_us"] >= repaired["A"] for e in _journal(bed, "A")),
                       240, 1.0, "A's send path on eth2 up again")
            _hold_guest_time(bed, "A", 3)  # traffic after the stop before the run ends
        finally:
            if st is not None:
                st.undo()
            if pull is not None:
                pull.undo()
            res = run.result()
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        a = _rank_events(tmp_path, 0)
        after = [e for e in a if e["t_us"] >= repaired["A"] and e.get("dir") == "send" and e.get("nic") == "eth2"]
        print("A's send path on eth2 after the repair:",
              [(e["event"], e.get("to"), e.get("reason"), e.get("generation")) for e in after][:12])
        timeouts = [e for e in after if e.get("event") == "path_state" and "timed out" in (e.get("reason") or "")]
        assert not timeouts, timeouts
        ups = {}
        for e in after:
            if e.get("event") == "path_up":
                ups.setdefault(e["comm"], e)
        assert ups, after
        for comm, up in ups.items():
            connects = [e for e in after if e["comm"] == comm and e.get("event") == "path_state"
                        and e.get("to") == "connecting" and e["t_us"] <= up["t_us"]]
            assert len(connects) == 1, f"comm {comm}: the path took {len(connects)} attempts to come up: {connects}"
            # the attempt waited for B's process past the connect timeout (B was stopped all along)
            assert up["t_us"] - connects[0]["t_us"] > 3_000_000, (connects[0], up)
            # and it is the attempt that came up: no restart in between (a restart after a
            # repair is connecting -> connecting, not journaled, but it takes a new generation)
            mine = [e for e in a if e.get("comm") == comm and e.get("dir") == "send" and e.get("nic") == "eth2"]
            before = [e for e in mine if e.get("event") == "path_up" and e["t_us"] < repaired["A"]]
            assert before, mine
            attempts = [e for e in mine if e.get("event") == "path_state" and e.get("to") == "connecting"
                        and before[-1]["t_us"] < e["t_us"] <= up["t_us"]]
            assert up["generation"] == before[-1]["generation"] + len(attempts), (before[-1], attempts, up)
        assert not _named(_events(tmp_path), "fatal")

    crash_retry(bed, body)


@abi_matrix
def test_both_rails_down_is_a_clean_error_within_the_fatal_timeout(rdma_bed, tmp_path, abi):
    """Both of guest A's cables pulled: no path is left, so within RAILOVER_FATAL_TIMEOUT (10 s)
    plus a generous bound for TCG the pending call returns ncclSystemError with a WARN naming
    the NICs and the peer; nothing hangs."""
    bed = rdma_bed

    def body():
        run = _Background(bed, tmp_path, {"RAILOVER_FATAL_TIMEOUT": "10"}, duration=240, timeout_s=600,
                          abi=_abi_arg(abi))
        seq = _FaultSequence(bed)
        try:
            run.wait_armed()
            seq.both_rails_down()
        finally:
            res = run.result()
        _check_fatal_run(res)
        _check_abi(res, abi)
        seq.check(tmp_path)

    crash_retry(bed, body)


def test_both_rails_down_shorter_than_the_fatal_timeout_recovers_and_closes_cleanly(rdma_bed, tmp_path):
    """Both of guest A's cables pulled for 30 s of A's clock: longer than the TCG probe
    detection (10 s), so both guests judge every pair down and every path fails, but within
    RAILOVER_FATAL_TIMEOUT (200 s). Recovery never gives up: after the repair each guest's send
    comm resumes (recover, failover or failback), the collective completes with every byte and
    nothing is fatal. The orderly close at the end is no fault: no path_down after the run was
    told to stop (the CLOSE reaches the peer before the bootstrap stream ends)."""
    bed = rdma_bed

    def body():
        run = _Background(bed, tmp_path, {"RAILOVER_FATAL_TIMEOUT": "200", "RAILOVER_HOLD_DOWN_MS": "1000"},
                          duration=600, timeout_s=900, stoppable=True)
        pulls = []
        try:
            run.wait_armed()
            pulls = [rf.CablePull(bed, "a0").apply(), rf.CablePull(bed, "a1").apply()]
            _hold_guest_time(bed, "A", 30)
            # stamped before the repair: a resume may come within ms of it (seen on a fast host)
            repaired = _stamps(bed)
            for f in pulls:
                f.undo()
            pulls = []

            def resumed():
                return all(any(e.get("event") in ("recover", "failover", "failback") and e["t_us"] >= repaired[h]
                               and e.get("comm") for e in _journal(bed, h)) for h in ("A", "B"))
            poll_until(resumed, 240, 1.0, "a send comm resuming in each guest after the repair")
            _hold_guest_time(bed, "A", 5)  # traffic on the recovered paths before the stop
        finally:
            for f in pulls:
                f.undo()
            res = run.result()
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        evs = _events(tmp_path)
        assert not _named(evs, "fatal"), _named(evs, "fatal")
        for r in (0, 1):
            assert _named(_rank_events(tmp_path, r), "path_down"), f"rank {r}: the pull took no path down"
        closing = [e for r, host in ((0, "A"), (1, "B")) for e in _named(_rank_events(tmp_path, r), "path_down")
                   if e["t_us"] >= run.stop_us[host]]
        assert not closing, closing

    crash_retry(bed, body)


def test_one_path_the_receiver_dropped_during_a_long_pull_is_found_at_the_repair(rdma_bed, tmp_path):
    """RAILOVER_STANDBY=none (one path per comm): guest A's only cable pulled for 20 s of A's
    clock, longer than B's probe detection (10 s under TCG). A drops its paths at the port
    error. Its FIN must not tell B: a FIN lost with the NIC is resent with back-off and given
    up after the socket's retry limits, so it may come a minute late or never. In this bed it
    may also arrive right at the repair, so the test drops every FIN leaving A's eth1 (nftables
    in A; A's resets still pass). How B's send comm then learns that its path is gone depends
    on the moment of the pull:
    - with writes in flight, its RC QP retries unanswered and the engine fails the path once
      the probes time out ("the peer acknowledges nothing");
    - with none in flight (A's advertisements stopped first), it sees only soft probe timeouts
      and keeps the path until the repair. There it nudges the path (one byte on its bootstrap
      stream), A's kernel answers with a reset, and the path breaks ("bootstrap stream: ...
      reset").
    Either way B reconnects and the collective resumes with every byte. Without the nudge the
    second case waits for the fatal timeout (docs/BENCHMARKS.md, "Bare RC"). The gtest
    EngineOnly.APathTheReceiverDroppedSilentlyIsFoundByTheNudgeAtTheRepair pins it
    deterministically."""
    bed = rdma_bed
    add = ("nft add table inet rtest_fin && nft add chain inet rtest_fin out '{ type filter hook output priority 0; }' "
           "&& nft add rule inet rtest_fin out oifname eth1 tcp flags '&' fin == fin counter drop")
    drop = "nft delete table inet rtest_fin 2>/dev/null; true"

    def body():
        run = _Background(bed, tmp_path, {"RAILOVER_STANDBY": "none", "RAILOVER_FATAL_TIMEOUT": "300"},
                          duration=600, timeout_s=900, stoppable=True)
        pull = None
        fins = None
        try:
            poll_until(lambda: all(any(e.get("event") == "path_up" and e.get("nic") == "eth1" for e in _journal(bed, h))
                                   for h in ("A", "B")), 300, 1.0, "paths up on rail 0 in both guests")
            rc, _, err = bed.run("A", ["sh", "-c", add], timeout_s=60)
            assert rc == 0, err
            pull = rf.CablePull(bed, "a0").apply()
            _hold_guest_time(bed, "A", 20)
            # stamped before the repair: a resume may come within ms of it
            repaired = _stamps(bed)
            pull.undo()
            pull = None

            def resumed():
                return all(any(e.get("event") in ("recover", "failover", "failback") and e["t_us"] >= repaired[h]
                               and e.get("comm") for e in _journal(bed, h)) for h in ("A", "B"))
            poll_until(resumed, 240, 1.0, "a send comm resuming in each guest after the repair")
            rc, fins, _ = bed.run("A", ["nft", "list", "table", "inet", "rtest_fin"], timeout_s=60)
            bed.run("A", ["sh", "-c", drop], timeout_s=60)
            _hold_guest_time(bed, "A", 5)  # traffic on the recovered paths before the stop
        finally:
            if pull is not None:
                pull.undo()
            bed.run("A", ["sh", "-c", drop], timeout_s=60)
            res = run.result()
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        evs = _events(tmp_path)
        assert not _named(evs, "fatal"), _named(evs, "fatal")
        b_downs = [e for e in _named(_rank_events(tmp_path, 1), "path_down") if e.get("dir") == "send"]
        print("B's send path_down events:", [(e.get("t_us"), e.get("cause")) for e in b_downs], "\nA's FIN rule:", fins)
        assert any("acknowledges nothing" in e["cause"] or ("bootstrap stream" in e["cause"] and "reset" in e["cause"])
                   for e in b_downs), b_downs

    crash_retry(bed, body)


def test_auto_leaves_the_management_nic_out_and_uses_rdma_on_the_rails(rdma_bed, tmp_path):
    """RAILOVER_TRANSPORT=auto with the management NIC (eth0, no rxe) selected beside the two
    rail NICs: eth0 is left out of NCCL's devices (as NCCL's IB transport lists only RDMA
    devices; it used to put every NIC on TCP) and the job runs rdma on the rails, every byte
    checked, no path on eth0."""
    bed = rdma_bed
    env = dict(RDMA_ENV, RAILOVER_TRANSPORT="auto", RAILOVER_IFNAMES="=eth1,eth2,eth0")

    def body():
        res = rperf.run_perf(bed, ranks_per_host=1, timeout_s=600, workload="allreduce", minbytes="1K",
                             maxbytes="64K", stepfactor=8, iters=2, warmup=1, channels=2, op_timeout=120,
                             rendezvous_timeout=300, fetch_to=tmp_path, env=env, extra_args=["--dev-spread"])
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        for r in res.ranks:
            log = r.stdout + r.stderr
            assert r.json["exit_code"] == 0 and r.json["errors"] == [], r.json
            assert "RAILOVER_TRANSPORT=auto: NIC(s) eth0 have no RDMA port" in log, log[-3000:]
            assert "devices are the RDMA NIC(s) eth1,eth2 only" in log, log[-3000:]
            assert "transport rdma: eth1 -> rxe0 port 1" in log and "-> tcp" not in log, log[-3000:]
            assert r.json["device"]["ndev"] == 2, r.json["device"]
            nics = {e["nic"] for e in _named(_rank_events(tmp_path, r.rank), "path_up")}
            assert nics == {"eth1", "eth2"}, nics

    crash_retry(bed, body)


def test_rdma_plus_tcp_serves_the_management_nic_over_tcp_beside_the_rdma_rails(rdma_bed, tmp_path):
    """RAILOVER_TRANSPORT=rdma+tcp with the management NIC (eth0, no rxe) selected beside the
    two rail NICs: the plugin runs mixed, rdma on eth1 and eth2 and tcp on eth0, each a device.
    railover-perf spreads 3 channels over the 3 devices (``--dev-spread``): the eth0 comms run
    over TCP with no standby (every other NIC is rdma), the rail comms keep their standby on the
    other rail only; a cable pull of A's eth1 moves its comms to eth2, never to eth0, and back
    after the repair; every byte arrives."""
    bed = rdma_bed
    env = {"RAILOVER_TRANSPORT": "rdma+tcp", "RAILOVER_IFNAMES": "=eth1,eth2,eth0"}

    def body():
        res = _cable_pull_and_repair(bed, tmp_path, env=env, channels=3, extra_args=["--dev-spread"])
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        for r in res.ranks:
            log = r.stdout + r.stderr
            assert r.json["exit_code"] == 0 and r.json["errors"] == [], r.json
            assert "RAILOVER_TRANSPORT=rdma+tcp: NIC eth0 served over tcp" in log, log[-3000:]
            line = re.search(r"transport rdma\+tcp: .*", log)
            assert line and "eth0 -> tcp [" in line.group(0) and "eth1 -> rxe0 port 1" in line.group(0), log[-3000:]
            assert "rdma+tcp: rdma on NIC(s) eth1,eth2, tcp on NIC(s) eth0" in log, log[-3000:]
            assert r.json["device"]["ndev"] == 3, r.json["device"]
            evs = _rank_events(tmp_path, r.rank)
            kinds = {}  # (comm, dir) -> local NICs its paths came up on
            for e in _named(evs, "path_up"):
                kinds.setdefault((e["comm"], e["dir"]), set()).add(e["nic"])
            assert {frozenset(v) for v in kinds.values()} == {frozenset({"eth1", "eth2"}), frozenset({"eth0"})}, kinds
            assert {e["nic"] for e in _named(evs, "no_standby")} == {"eth0"}, _named(evs, "no_standby")
            assert all(e["to_nic"] in ("eth1", "eth2") for e in _named(evs, "failover") + _named(evs, "failback"))
        assert any(e["to_nic"] == "eth2" for e in _named(_events(tmp_path), "failover"))
        assert _named(_events(tmp_path), "failback")

    crash_retry(bed, body)


def test_rdma_plus_tcp_refuses_a_connection_nccl_pairs_across_kinds(rdma_bed, tmp_path):
    """RAILOVER_TRANSPORT=rdma+tcp on both ranks, but rank 1 also selects the management NIC,
    which sorts first: device 0 is rdma (eth1) on rank 0 and tcp (eth0) on rank 1, a pairing NCCL
    can make. No comm can carry it: connect refuses the peer's handle and names both kinds,
    instead of connecting paths the other side cannot read."""
    bed = rdma_bed

    def body():
        res = rperf.run_perf(bed, ranks_per_host=1, timeout_s=600, workload="allreduce", minbytes="1K",
                             maxbytes="1K", iters=1, warmup=0, channels=1, op_timeout=60, rendezvous_timeout=300,
                             fetch_to=tmp_path, env=dict(RDMA_ENV, RAILOVER_TRANSPORT="rdma+tcp"),
                             per_rank_env={1: {"RAILOVER_IFNAMES": "=eth1,eth2,eth0"}})
        assert not res.ok
        text = "\n".join(r.stdout + r.stderr for r in res.ranks)
        # rank 1 (device 0 = eth0, tcp) names its mixed process and the safe setting
        assert ("the peer listens with the rdma transport but this NIC is served by tcp (RAILOVER_TRANSPORT=rdma+tcp, "
                "this process runs rdma+tcp)") in text, text[-3000:]
        assert "auto leaves the tcp NICs out" in text
        assert res.wrong_total == 0

    crash_retry(bed, body)


def test_ranks_on_different_transports_fail_with_a_clear_error(rdma_bed, tmp_path):
    """Rank 0 runs rdma, rank 1 tcp: connect refuses the peer's handle and names both."""
    bed = rdma_bed

    def body():
        res = rperf.run_perf(bed, ranks_per_host=1, timeout_s=600, workload="allreduce", minbytes="1K",
                             maxbytes="1K", iters=1, warmup=0, channels=1, op_timeout=60, rendezvous_timeout=300,
                             fetch_to=tmp_path, env=RDMA_ENV, per_rank_env={1: {"RAILOVER_TRANSPORT": "tcp"}})
        assert not res.ok
        text = "\n".join(r.stdout + r.stderr for r in res.ranks)
        assert "set RAILOVER_TRANSPORT to the same value on every rank" in text, text[-3000:]
        assert "rdma" in text and "tcp" in text

    crash_retry(bed, body)
