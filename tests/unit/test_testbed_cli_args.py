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
