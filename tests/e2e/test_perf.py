"""railover-perf (the NCCL-proxy emulator) driving the real plugin over loopback.

Every ABI version v7..v12 x {sendrecv, allreduce} x {2, 4 ranks} must move every byte right;
plus the life-cycle modes (reconnects while data flows, dlclose/dlopen reload), the timed mode
with its time series, start-order robustness, a peer exiting mid-run, and a self-test proving
that the checker catches a single flipped byte. Sizes are small so the module stays well under
a minute on a 2-CPU machine.
"""
from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from railover import _paths, perf

LOOPBACK = {"RAILOVER_IFNAMES": "lo", "NCCL_SOCKET_IFNAME": "lo"}
# Small slots so that the sweep covers zero-byte, sub-slot LL, and multi-step SIMPLE messages.
SMALL = dict(minbytes=0, maxbytes="256K", stepfactor=8, iters=2, warmup=1, slot_size="16K", ll_slot="4K",
             ll_max="1K", op_timeout=20, rendezvous_timeout=30)


@pytest.fixture(scope="module", autouse=True)
def binaries():
    # Fail (not skip) when the native build is missing: these tests are the driver's contract.
    return _paths.perf_path(), _paths.plugin_path()


def _run(nranks=2, timeout=60.0, env=None, **kw):
    opts = dict(SMALL)
    opts.update(kw)
    return perf.run_perf(nranks, env=dict(LOOPBACK, **(env or {})), timeout=timeout, **opts)


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("workload", ["sendrecv", "allreduce"])
@pytest.mark.parametrize("abi", [7, 8, 9, 10, 11, 12])
def test_every_abi_moves_every_byte(abi, workload, nranks):
    res = _run(nranks, abi=abi, workload=workload, channels=2, contexts=2).check()
    assert res.abi == abi
    assert res.wrong_total == 0
    sizes = [r["size"] for r in res.rows]
    assert sizes[0] == 0 and sizes[-1] == 256 << 10, sizes
    for r in res.ranks:
        j = r.json
        assert j["exit_code"] == 0 and j["errors"] == []
        st = j["stats"]
        assert st["calls"]["listen"] == 2 and st["calls"]["closeSend"] == 2 and st["calls"]["closeRecv"] == 2
        assert st["calls"]["regMr"] == st["calls"]["deregMr"] == 8  # LL + SIMPLE buffer per comm
        assert st["calls"]["init"] == 2 and st["calls"]["finalize"] == 2  # two contexts
        assert st["plugin_init_calls"] == (2 if abi >= 11 else 1)
        assert st["bytes_received"] > 0
        assert 2 <= st["max_inflight"] <= 8  # never more than NCCL_STEPS in flight per connection
        assert st["left_inflight_at_close"] > 0  # comms closed with requests outstanding
    row = res.rows[-1]
    factor = 2 * (nranks - 1) / nranks if workload == "allreduce" else 1.0
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor, rel=1e-3)


def test_single_rank_talks_to_itself_and_logs_like_nccl():
    # NCCL's GDR probe pattern: connect and accept of one loopback pair on one service thread.
    res = perf.run_perf(1, env=dict(LOOPBACK, NCCL_DEBUG="INFO"), timeout=60,
                        **dict(SMALL, workload="sendrecv", channels=2)).check()
    assert " NCCL INFO " in res.ranks[0].stderr
    quiet = perf.run_perf(1, env=dict(LOOPBACK, NCCL_DEBUG="WARN"), timeout=60, **dict(SMALL, maxbytes="8")).check()
    assert " NCCL INFO " not in quiet.ranks[0].stderr


@pytest.mark.parametrize("abi", [8, 12])
def test_tcp_offers_no_grouped_receive_even_with_max_recvs_8(abi):
    """Over TCP maxRecvs is 1, as NCCL's socket transport's, even with RAILOVER_MAX_RECVS=8: a TCP
    sender is not told the receiver's grouped receives, which NCCL's shared comms (PXN) need it
    to match sends against by tag. ``--group 8`` is refused naming the limit, the plugin's WARN
    says why, and without ``--group`` the same run moves every byte. Also ``--flush``: TCP has
    nothing to flush, so every iflush answers with a NULL request (NCCL's "done"). The grouped
    path itself runs on the RDMA bed (tests/rdma)."""
    big = dict(workload="sendrecv", channels=2, slot_size="4K", minbytes="32K", maxbytes="256K")  # SIMPLE steps only
    eight = {"RAILOVER_MAX_RECVS": "8"}
    refused = _run(2, abi=abi, **big, group=8, env=eight)
    assert not refused.ok and "takes grouped receives of at most 1" in refused.describe(), refused.describe()
    assert "RAILOVER_MAX_RECVS=8 has no effect with the tcp transport" in refused.describe(), refused.describe()
    single = _run(2, abi=abi, **big, flush=True, env=eight).check()
    assert single.wrong_total == 0
    for r in single.ranks:
        assert r.json["device"]["max_recvs"] == 1, "maxRecvs stays 1 over TCP"
        assert r.json["exit_code"] == 0 and r.json["errors"] == []
        assert r.json["stats"]["bytes_received"] > 0
        calls, nulls = r.json["stats"]["calls"]["iflush"], r.json["stats"]["null_returns"]["iflush"]
        assert calls > 0 and nulls == calls


def test_send_ahead_needs_grouped_receives():
    res = perf.run_perf(2, env=LOOPBACK, timeout=60, extra_args=["--send-ahead"], **dict(SMALL, workload="sendrecv"))
    assert not res.ok
    assert "--send-ahead needs --group 2 or more" in res.ranks[0].stderr, res.describe()


def test_group_needs_the_sendrecv_workload():
    res = _run(2, workload="allreduce", group=4)
    assert not res.ok
    assert "--group needs the sendrecv workload" in res.ranks[0].stderr


def test_sendrecv_pairs():
    res = _run(4, workload="sendrecv", pattern="pairs", maxbytes="32K").check()
    assert res.result["config"]["pattern"] == "pairs" and res.wrong_total == 0


@pytest.mark.parametrize("duration", [None, 1.0])
def test_sendrecv_oneway_moves_data_one_way_only(duration):
    kw = dict(duration=duration, minbytes="64K") if duration else {}
    res = _run(2, workload="sendrecv", pattern="oneway", maxbytes="64K", **kw).check()
    assert res.result["config"]["pattern"] == "oneway" and res.wrong_total == 0
    sender, receiver = (r.json for r in res.ranks)
    assert sender["stats"]["bytes_received"] == 0
    # the receiver holds every byte of every row's iterations (and no more)
    rows = receiver["rows"]
    assert rows and receiver["stats"]["bytes_received"] >= sum(r["size"] * r["iters"] for r in rows) > 0


def test_oneway_needs_an_even_number_of_ranks():
    res = perf.run_perf(3, env=LOOPBACK, timeout=30, **dict(SMALL, workload="sendrecv", pattern="oneway"))
    assert not res.ok
    assert "--pattern oneway needs the sendrecv workload and an even number of ranks" in res.ranks[0].stderr


def test_reconnects_while_data_flows_and_reload():
    res = _run(2, workload="allreduce", channels=2, iters=4, reconnect_every=2, reload=True, timeout=90).check()
    j = res.result
    assert j["stats"]["reconnects"] >= 4
    assert j["stats"]["conns_opened"] == j["stats"]["calls"]["closeSend"] + j["stats"]["calls"]["closeRecv"]
    assert j["plugin"]["loads"] == 2 and j["stats"]["calls"]["finalize"] == 2
    assert {r["comm"] for r in res.rows} == {0, 1}
    assert res.wrong_total == 0


def test_reload_without_init_like_nccl_2_22():
    res = _run(2, abi=10, reload_no_init=True, maxbytes="4K").check()
    st = res.result["stats"]
    assert st["plugin_init_calls"] == 1 and st["calls"]["devices"] == 1
    assert {r["comm"] for r in res.rows} == {0, 1}


def test_timed_run_writes_a_timeseries(tmp_path):
    ts = tmp_path / "ts%r.csv"
    res = _run(2, workload="sendrecv", minbytes="64K", maxbytes=None, duration=0.7, timeseries=str(ts),
               slot_size="32K").check()
    j = res.result
    assert j["stopped_early"] is None and j["timeseries"]["iterations"] > 10
    buckets, iters = perf.read_timeseries(tmp_path / "ts0.csv")
    assert len(iters) == j["timeseries"]["iterations"] == res.rows[0]["iters"]
    times = [t for t, _ in buckets]
    assert times == list(range(times[0], times[0] + 1000 * len(times), 1000))  # every ms, in order
    assert times[0] % 1000 == 0 and len(buckets) >= 600
    # Every received byte lands in exactly one bucket (the extra requests left in flight at
    # close never complete, so they are not counted).
    assert sum(b for _, b in buckets) == j["stats"]["bytes_received"] == 65536 * len(iters)
    assert all(i["wrong"] == 0 and i["lat_us"] > 0 for i in iters)
    # Both ranks ran exactly the same number of iterations (rank 0 grants them).
    assert res.ranks[1].json["timeseries"]["iterations"] == len(iters)


def test_start_order_does_not_matter():
    # Rank 1 starts first; rank 0 only once rank 1 is already retrying its connection.
    def spawn(rank, argv, env):
        if rank == 0:
            sock = Path(argv[argv.index("--rendezvous") + 1]) / "rank1.sock"
            deadline = time.monotonic() + 20
            while not sock.exists():
                assert time.monotonic() < deadline, "rank 1 never bound its socket"
                time.sleep(0.01)
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    res = perf.run_perf(2, env=LOOPBACK, timeout=60, spawn=spawn, start_order=[1, 0],
                        **dict(SMALL, maxbytes="1K")).check()
    assert "Avg bus bandwidth" in res.ranks[0].stdout


def _spawn_acting_on_rank1(tmp_path, action):
    """A spawn that logs to files and runs ``action(procs)`` on a thread once rank 1 printed
    that its timed loop started (files, not pipes: run_perf drains pipes itself)."""
    procs = {}

    def spawn(rank, argv, env):
        err = tmp_path / f"rank{rank}.stderr"
        with open(err, "w") as f:
            p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=f)
        procs[rank] = p
        if rank == 1:
            def watch():
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and p.poll() is None:
                    if "timed run started" in err.read_text():
                        action(procs)
                        return
                    time.sleep(0.01)
            threading.Thread(target=watch, daemon=True).start()
        return p
    return spawn


def test_peer_exit_stops_a_timed_run_early(tmp_path):
    spawn = _spawn_acting_on_rank1(tmp_path, lambda procs: procs[1].kill())
    t0 = time.monotonic()
    res = perf.run_perf(2, env=LOOPBACK, timeout=60, spawn=spawn, minbytes="4K", maxbytes=None, duration=30,
                        verbose=True, op_timeout=20, start_order=[1, 0])
    assert time.monotonic() - t0 < 20, "the survivor did not notice the exit"
    r0 = res.ranks[0]
    assert r0.returncode == 0, res.describe() + (tmp_path / "rank0.stderr").read_text()
    assert r0.json["stopped_early"] == "rank 1 exited"
    assert r0.json["errors"] == []


def test_stuck_request_times_out_instead_of_hanging(tmp_path):
    # A peer that stops (SIGSTOP) keeps its sockets open: nothing errors, requests just never
    # complete. The survivor must name the stuck request and exit 4 after --op-timeout.
    def freeze(procs):
        procs[1].send_signal(signal.SIGSTOP)
        procs[0].wait()
        procs[1].kill()

    spawn = _spawn_acting_on_rank1(tmp_path, freeze)
    t0 = time.monotonic()
    res = perf.run_perf(2, env=LOOPBACK, timeout=60, spawn=spawn, minbytes="4K", maxbytes=None, duration=30,
                        verbose=True, op_timeout=1.5, start_order=[1, 0])
    assert time.monotonic() - t0 < 20
    r0 = res.ranks[0]
    assert r0.returncode == perf.EXIT_TIMEOUT, res.describe() + (tmp_path / "rank0.stderr").read_text()
    assert any("stuck request" in e or "stalled" in e for e in r0.json["errors"]), r0.json["errors"]


def test_checker_catches_one_flipped_byte():
    # --selftest-corrupt flips one bit in one message after it was generated: every layer of the
    # checking (per-message for sendrecv, partial sums for allreduce) must see it.
    for workload in ("sendrecv", "allreduce"):
        res = _run(4 if workload == "allreduce" else 2, workload=workload, maxbytes="4K",
                   extra_args=["--selftest-corrupt", "3"])
        assert not res.ok
        assert all(r.returncode == perf.EXIT_WRONG_DATA for r in res.ranks), res.describe()
        # sendrecv: exactly the flipped byte. allreduce: the bad partial sum is counted again at
        # every rank it travels through (each rank checks everything it receives), and after
        # additions it may differ in up to 4 bytes of its float.
        if workload == "sendrecv":
            assert res.wrong_total == 1
        else:
            assert 1 <= res.wrong_total <= 4 * 2 * (4 - 1)
        assert res.result["wrong_total"] == res.wrong_total
        assert any("wrong data" in r.stderr for r in res.ranks)


def test_load_errors_are_reported(tmp_path):
    res = perf.run_perf(1, env=LOOPBACK, timeout=30, plugin=str(tmp_path / "missing.so"))
    assert res.ranks[0].returncode == perf.EXIT_USAGE
    assert "dlopen" in res.result["errors"][0]
    bad_dev = _run(1, dev=99, maxbytes="8")
    assert bad_dev.ranks[0].returncode == perf.EXIT_USAGE
    assert "--dev 99" in bad_dev.result["errors"][0]


def test_exit_removes_the_state_files_and_a_misspelt_standby_nic_is_named(tmp_path):
    # Every rank writes RAILOVER_STATE_DIR/railover-<pid>.json while it runs; a rank that exits
    # normally leaves none behind (railover-perf ends with quick_exit, the plugin's cleanup
    # is registered for it). RAILOVER_STANDBY naming a NIC that is not selected is a WARN that
    # names it (it would otherwise leave that NIC's comms without failover, silently).
    sd = tmp_path / "state"
    env = dict(LOOPBACK, RAILOVER_STATE_DIR=str(sd), RAILOVER_STANDBY="lo=eth9", NCCL_DEBUG="WARN")
    res = perf.run_perf(2, env=env, timeout=60, **SMALL).check()
    assert res.wrong_total == 0
    assert sd.is_dir(), "the ranks created their state directory"
    assert not list(sd.glob("railover-*.json*")), list(sd.iterdir())
    err = "\n".join(r.stderr for r in res.ranks)
    assert "RAILOVER_STANDBY pair lo=eth9 names eth9, which is not a selected NIC" in err, err[-2000:]


@pytest.mark.parametrize("duration", [None, 5])
def test_failed_init_says_the_run_failed(duration):
    # A plugin whose init fails (here: an invalid RAILOVER_NSTREAMS) moved and checked no data:
    # the footer must not say "Wrong bytes: 0 OK", and every rank exits non-zero. In a timed run
    # both ranks fail; the one that fails last must not excuse its own init failure as the
    # consequence of the other's exit.
    env = dict(LOOPBACK, RAILOVER_NSTREAMS="99")
    kw = dict(SMALL)
    if duration:
        kw.update(duration=duration, maxbytes=None, minbytes="4K")
    res = perf.run_perf(2, env=env, timeout=60, **kw)
    for r in res.ranks:
        assert r.returncode == perf.EXIT_PLUGIN, res.describe()
    out = res.ranks[0].stdout
    assert "Wrong bytes" in out, out
    assert "0 OK" not in out, out
    assert "failed before any data was checked" in out and "FAILED" in out, out
