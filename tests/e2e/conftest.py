"""Shared fixtures for end-to-end tests on the network-namespace test bed.

* ``netns_mode`` (session): ``"root"`` or ``"userns"``. Without privileges the test is
  skipped — or fails when ``RAILOVER_REQUIRE_NETNS=1`` (CI on a capable machine must not
  silently skip). Any test marked ``@pytest.mark.netns`` gets this gate automatically;
  ``require_netns`` is the same gate as an explicit fixture.
* ``testbed``: factory ``testbed(layout="T2", **TestBed kwargs) -> TestBed`` (already up);
  every bed is torn down after the test and the test fails if any of its namespaces or
  state files survive.
* ``t2``: a T2 bed; ``t2_echo``: ``(tb, a0, b0, port)`` with a TCP echo server on b0.

Unprivileged runs: the gate enters an unprivileged user namespace for the whole pytest
process (see ``railover.testbed.netns.ensure_privileges``); that must happen while the process is
single-threaded, i.e. before any test started threads.
"""
from __future__ import annotations

import os
import shutil
from typing import Callable, List

import pytest

from railover.testbed import netns as tbmod

REQUIRE_ENV = "RAILOVER_REQUIRE_NETNS"


def _netns_unavailable() -> "str | None":
    missing = [t for t in ("ip", "nft") if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)} (install iproute2 and nftables)"
    try:
        tbmod.ensure_privileges(allow_userns=True)
    except tbmod.PrivilegeError as e:
        return str(e)
    return None


@pytest.fixture(scope="session")
def netns_mode() -> str:
    """Privilege mode for test beds; skips (or fails with RAILOVER_REQUIRE_NETNS=1)."""
    reason = _netns_unavailable()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but network namespaces are unavailable: {reason}",
                        pytrace=False)
        pytest.skip(f"network namespaces unavailable: {reason}")
    return tbmod.privilege_mode()


@pytest.fixture
def require_netns(netns_mode: str) -> str:
    """Explicit form of the netns gate; returns the mode."""
    return netns_mode


@pytest.fixture(autouse=True)
def _netns_marker_gate(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("netns") is not None:
        request.getfixturevalue("netns_mode")


@pytest.fixture
def testbed(netns_mode: str) -> Callable[..., tbmod.TestBed]:
    """Factory: ``testbed("T2-flat")``, ``testbed(hosts=4, nics=2)``; beds are removed and
    checked for leftovers after the test."""
    beds: List[tbmod.TestBed] = []

    def make(layout="T2", **kw) -> tbmod.TestBed:
        tb = tbmod.TestBed(layout, **kw).up()
        beds.append(tb)
        return tb

    yield make
    errors = []
    for tb in reversed(beds):
        try:
            tb.down()
        except Exception as e:  # keep tearing down the others
            errors.append(f"{tb.prefix}: {e}")
    prefixes = {tb.prefix for tb in beds}
    left = [i for i in tbmod.list_testbeds() if i.prefix in prefixes]
    if errors or left:
        pytest.fail(f"test bed teardown failed: {errors}; leftovers: {left}", pytrace=False)


@pytest.fixture
def t2(testbed) -> tbmod.TestBed:
    """A T2 test bed (2 hosts x 2 isolated rails)."""
    return testbed("T2")


@pytest.fixture
def t2_echo(t2):
    """``(tb, a0, b0, port)``: T2 with a TCP echo server listening on b0's address."""
    a0, b0 = t2.nic("a0"), t2.nic("b0")
    srv = t2.echo_server(b0)
    tbmod.poll_until(lambda: t2.tcp_echo(a0, b0, srv.port), 5, what="baseline echo a0 -> b0")
    return t2, a0, b0, srv.port
