"""NCCL's IB variables on real Soft-RoCE: the HCA port and GID that ``railover-verbs-xfer
--netdev`` chooses (with the plugin's parser and the verbs layer's choosePortForNetdev) follow
NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_IB_ROCE_VERSION_NUM and NCCL_IB_ADDR_RANGE, and a path
built with explicit settings carries every byte.

Asserted here, on the RDMA test bed (two QEMU guests, rxe on every rail NIC):
* with no variable set, the NIC's RoCE v2 GID of its IPv4 address (the bed's ``gid_index``),
  with the one-line reason naming HCA, port, index, type, address and NIC;
* rxe's GID table holds RoCE v2 entries only: NCCL_IB_ROCE_VERSION_NUM=1 and
  NCCL_IB_ADDR_FAMILY=AF_INET6 (only a link-local IPv6 GID) are errors naming the variables and
  listing the NIC's GIDs; an explicit NCCL_IB_GID_INDEX wins even for the link-local entry and
  says it was given, one beyond the table is an error; NCCL_IB_ADDR_RANGE containing the NIC's
  address keeps the default choice and says so, one that does not is an error naming the range;
* NCCL_IB_HCA excluding the NIC's HCA is reported as an exclusion (the plugin serves that NIC
  with TCP), an exact include of it is accepted; a malformed value is an error naming the
  variable;
* sender and receiver with NCCL_IB_HCA='=<dev>:1' and NCCL_IB_GID_INDEX=<the RoCE v2 index>
  connect on that GID and move 24 messages with every byte checked.

The tests share the session's pair of guests (conftest's ``rdma_bed``, reset before each test).
"""
from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import pytest

from railover import _paths
from railover.testbed.netns import poll_until
from railover.testbed.rdma import bed as rbed

from rdma_helpers import crash_retry, events

pytestmark = pytest.mark.rdma

XFER = "railover-verbs-xfer"


@pytest.fixture(scope="module", autouse=True)
def _xfer_built(rdma_ok):
    try:
        _paths._find(rbed.VERBS_XFER_FILE)
    except FileNotFoundError as e:
        if os.environ.get("RAILOVER_REQUIRE_RDMA") == "1":
            pytest.fail(f"RAILOVER_REQUIRE_RDMA=1 but {e} (rebuild with libibverbs-dev installed)", pytrace=False)
        pytest.skip(f"{e} (rebuild with libibverbs-dev installed)")


def _choice(bed: rbed.RdmaBed, nic: rbed.RdmaNic, env: Dict[str, str], port: int) -> Tuple[Optional[dict], str]:
    """Start a receiver on ``nic`` in host B with ``env``; returns its "listening" event (the
    choice) or None and the error message when it refused to start."""
    p = bed.spawn("B", [XFER, "recv", "--netdev", nic.ifname, "-p", str(port), "--deadline-s", "600"], env=env)
    try:
        poll_until(lambda: events(p, "listening") or p.poll() is not None, 240, 0.2, f"xfer receiver with {env}")
        got = events(p, "listening")
        if got:
            return got[0], ""
        p.wait(60)
        errs = events(p, "error")
        assert p.returncode == 1 and errs, (p.returncode, p.stdout(), p.stderr())
        return None, errs[0]["message"]
    finally:
        if p.returncode is None:
            p.kill()
            p.wait(120)


def test_the_gid_choice_follows_nccls_ib_variables(rdma_bed):
    bed = rdma_bed
    nic = bed.hosts[1].nics[0]
    dev, ifname, addr = nic.rdma_dev, nic.ifname, nic.addr
    gid = f"::ffff:{addr}"

    def body():
        c, err = _choice(bed, nic, {}, 18950)
        assert c is not None, err
        assert (c["dev"], c["hca_port"], c["gid_index"], c["gid"]) == (dev, 1, nic.gid_index, gid), c
        assert c["why"] == (f"{dev} port 1 GID {nic.gid_index} (RoCE v2, IPv4 {addr}, bound to {ifname}; "
                            f"NCCL_IB_GID_INDEX unset)"), c

        # rxe's table holds RoCE v2 entries only (index 0: the link-local GID from the MAC, then
        # the IPv4 address): RoCE v1 and a (non-link-local) IPv6 GID are errors that list them.
        c, err = _choice(bed, nic, {"NCCL_IB_ROCE_VERSION_NUM": "1"}, 18951)
        assert c is None
        assert err.startswith(f"HCA {dev} port 1 has no RoCE v1 IPv4 GID bound to {ifname} "
                              f"(NCCL_IB_ROCE_VERSION_NUM=1, NCCL_IB_ADDR_FAMILY=AF_INET, NCCL_IB_GID_INDEX unset); "
                              f"GIDs bound to {ifname}: "), err
        assert f"{nic.gid_index} {gid} RoCE v2" in err, err
        c, err = _choice(bed, nic, {"NCCL_IB_ADDR_FAMILY": "AF_INET6"}, 18952)
        assert c is None and f"has no RoCE v2 IPv6 GID bound to {ifname}" in err, err

        # An explicit index wins, even the link-local entry automatic choice never takes.
        other = 0 if nic.gid_index != 0 else 1
        c, err = _choice(bed, nic, {"NCCL_IB_GID_INDEX": str(other)}, 18953)
        assert c is not None, err
        assert c["gid_index"] == other and c["why"].endswith(f"; NCCL_IB_GID_INDEX={other})"), c
        assert c["gid"] != gid, c
        c, err = _choice(bed, nic, {"NCCL_IB_GID_INDEX": "200"}, 18959)
        assert c is None and err.startswith(f"NCCL_IB_GID_INDEX=200: HCA {dev} port 1 has no GID at index 200"), err

        net = f"{addr}/{nic.prefixlen}"
        c, err = _choice(bed, nic, {"NCCL_IB_ADDR_RANGE": net}, 18953)
        assert c is not None, err
        assert c["gid_index"] == nic.gid_index and f"in NCCL_IB_ADDR_RANGE {net}" in c["why"], c

        c, err = _choice(bed, nic, {"NCCL_IB_ADDR_RANGE": "192.0.2.0/24"}, 18954)
        assert c is None
        assert err.startswith(f"HCA {dev} port 1 has no RoCE v2 IPv4 GID bound to {ifname} in 192.0.2.0/24 "
                              f"(NCCL_IB_ROCE_VERSION_NUM=2, NCCL_IB_ADDR_FAMILY=AF_INET, "
                              f"NCCL_IB_ADDR_RANGE=192.0.2.0/24, NCCL_IB_GID_INDEX unset); GIDs bound to {ifname}: "), err
        assert gid in err, err

        c, err = _choice(bed, nic, {"NCCL_IB_HCA": f"^={dev}"}, 18955)
        assert c is None
        assert err == (f"HCA {dev} port 1 behind NIC {ifname} is excluded by NCCL_IB_HCA='^={dev}': "
                       f"no RDMA on this NIC"), err

        c, err = _choice(bed, nic, {"NCCL_IB_HCA": f"={dev}:1"}, 18956)
        assert c is not None and c["dev"] == dev, err

        c, err = _choice(bed, nic, {"NCCL_IB_GID_INDEX": "auto"}, 18957)
        assert c is None and err.startswith("NCCL_IB_GID_INDEX='auto' is not valid"), err
        print(f"verbs GID choice on {dev}/{ifname}: RoCE v2 IPv4 index {nic.gid_index}; explicit index {other} taken")

    crash_retry(bed, body)


def test_explicit_hca_and_gid_index_carry_every_byte(rdma_bed):
    bed = rdma_bed
    # RC timeout 18 (1.07 s per try, ~7.5 s to give up with retry_cnt 6): no fault is injected
    # here, and a guest starved by a busy host must not be read as a broken path.
    rail, count, port = 1, 24, 18960
    a, b = bed.hosts[0].nics[rail], bed.hosts[1].nics[rail]

    def body():
        recv = bed.spawn("B", [XFER, "recv", "--netdev", b.ifname, "-p", str(port), "--deadline-s", "900"],
                         env={"NCCL_IB_HCA": f"={b.rdma_dev}:1", "NCCL_IB_GID_INDEX": str(b.gid_index)})
        send = None
        try:
            poll_until(lambda: events(recv, "listening") or recv.poll() is not None, 240, 0.2, "receiver to listen")
            assert recv.returncode is None, recv.stdout() + recv.stderr()
            send = bed.spawn("A", [XFER, "send", "--netdev", a.ifname, "-a", bed.hosts[1].mgmt_addr, "-p", str(port),
                                   "--count", str(count), "--seed", "5", "--max-size", "65536", "--chunk", "16384",
                                   "--timeout", "18", "--retry", "6", "--deadline-s", "900"],
                             env={"NCCL_IB_HCA": f"={a.rdma_dev}:1", "NCCL_IB_GID_INDEX": str(a.gid_index)})
            assert send.wait(900) == 0, send.stdout() + send.stderr()
            assert recv.wait(300) == 0, recv.stdout() + recv.stderr()
        finally:
            for p in (send, recv):
                if p is not None and p.returncode is None:
                    p.kill()
                    p.wait(120)
        sc, rc = events(send, "connected")[0], events(recv, "connected")[0]
        assert (sc["dev"], sc["gid_index"]) == (a.rdma_dev, a.gid_index), sc
        assert (rc["dev"], rc["gid_index"]) == (b.rdma_dev, b.gid_index), rc
        assert events(recv, "listening")[0]["why"].endswith(f"; NCCL_IB_GID_INDEX={b.gid_index})")
        rd, sd = events(recv, "done")[0], events(send, "done")[0]
        assert rd["messages"] == count and rd["wrong_bytes"] == 0 and rd["bad_messages"] == 0, rd
        assert sd["messages"] == count and sd["wrong_bytes_reported"] == 0, sd

    crash_retry(bed, body)
