"""`railover testbed up`: an option of the other kind of bed (the RDMA bed's --rails/--kernel/
--accel/--wire on a namespace bed, a namespace bed's --layout/--hosts/--nics/
--no-policy-routing with --rdma) is refused naming it, exit 2, before any bed is built."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from railover.cli import app
from railover.testbed import netns
from railover.testbed.rdma import cli as rdma_cli

from cli_text import text


@pytest.fixture(autouse=True)
def no_bed(monkeypatch):
    def bed(*a, **k):
        raise AssertionError("a test bed was built")
    monkeypatch.setattr(netns, "TestBed", bed)
    monkeypatch.setattr(rdma_cli, "up", bed)


@pytest.mark.parametrize("argv,msg", [
    (["--rails", "3"], "--rails applies to the RDMA bed only (add --rdma)"),
    (["--kernel", "6.1"], "--kernel applies to the RDMA bed only (add --rdma)"),   # the default value, given
    (["--accel", "kvm", "--wire", "udp"], "--accel, --wire apply to the RDMA bed only (add --rdma)"),
    (["--rdma", "--layout", "T3"], "--layout applies to the network-namespace beds only, not to the RDMA bed"),
    (["--rdma", "--hosts", "3", "--nics", "4"], "--hosts, --nics apply to the network-namespace beds only"),
    (["--rdma", "--no-policy-routing"], "--no-policy-routing applies to the network-namespace beds only"),
])
def test_up_refuses_options_of_the_other_kind_of_bed(argv, msg):
    r = CliRunner().invoke(app, ["testbed", "up"] + argv)
    assert r.exit_code == 2, r.output
    assert msg in text(r), text(r)
    assert "Invalid value for --rdma" not in text(r), text(r)   # names the option given, not --rdma
    assert "Traceback" not in r.output


@pytest.mark.parametrize("argv,opt,msg", [
    # one NIC per host: no standby NIC, nothing can fail over (1x1 used to build a bed)
    (["--layout", "1x1"], "--layout", "1x1: 1 NIC per host leaves no standby NIC"),
    (["--layout", "4x1-flat"], "--layout", "4x1-flat: 1 NIC per host leaves no standby NIC"),
    (["--layout", "T2", "--nics", "1"], "'--nics'", "2"),
    (["--rdma", "--rails", "1"], "'--rails'", "2"),
    # a layout that cannot be built is a usage error naming the option, not a bare 'error:' line
    (["--layout", "0x2"], "--layout", "0x2: hosts must be 1..254, got 0"),
    (["--layout", "T9"], "--layout", "unknown layout 'T9'"),
    (["--layout", "30x10"], "--layout", "30x10: with more than 26 hosts"),
    (["--hosts", "30", "--nics", "10"], "--hosts / --nics", "30x10: with more than 26 hosts"),
])
def test_up_refuses_a_bed_without_a_standby_nic_naming_the_option(argv, opt, msg):
    r = CliRunner().invoke(app, ["testbed", "up"] + argv)
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert f"Invalid value for {opt}:" in text(r) and msg in text(r), text(r)
    assert "Traceback" not in r.output


@pytest.mark.parametrize("argv", [[], ["--layout", "T2-flat"], ["--layout", "T3"], ["--layout", "1x2"],
                                  ["--layout", "2x3"], ["--layout", "4x1", "--nics", "2"], ["--hosts", "1"],
                                  ["--layout", "26x10"], ["--layout", "2x99"], ["--rdma"], ["--rdma", "--rails", "8"]])
def test_up_builds_every_bed_with_a_standby_nic(argv):
    """One host is a bed too (bench healthy's loopback network, tests): only the NICs count."""
    r = CliRunner().invoke(app, ["testbed", "up"] + argv)
    assert isinstance(r.exception, AssertionError) and "a test bed was built" in str(r.exception), r.output
