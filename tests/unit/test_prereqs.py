"""System prerequisites: `railover demo` and `railover doctor` name a missing program and the
Debian package to install, before anything is built (run here with a PATH that lacks nft)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from railover import demo, prereqs
from railover.ops import doctor as dr


@pytest.fixture
def path_without_nft(tmp_path) -> str:
    """A PATH holding only `ip` (when this machine has it): no nft, iperf3, cmake..."""
    d = tmp_path / "bin"
    d.mkdir()
    ip = shutil.which("ip")
    if ip:
        (d / "ip").symlink_to(ip)
    return str(d)


@pytest.fixture(autouse=True)
def no_system_dirs(monkeypatch):
    """Programs off PATH in /usr/sbin count as not installed here (this machine has them)."""
    monkeypatch.setattr(prereqs, "SYSTEM_DIRS", ())


# The CLI in a child process, with `path` as PATH and, as above, no system directories looked
# at beyond it.
_CLI = "import sys, railover.prereqs as p; p.SYSTEM_DIRS = (); from railover.cli import main; sys.exit(main())"


def _cli(args, path):
    env = dict(os.environ, PATH=path, COLUMNS="250")
    return subprocess.run([sys.executable, "-c", _CLI, *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", text).split())


def test_hint_and_install_line_name_the_debian_packages():
    assert prereqs.hint("nft") == "nft not found: apt-get install nftables"
    assert prereqs.install_line(["ip", "nft", "iperf3", "c++", "cmake"]) == \
        "apt-get install iproute2 nftables iperf3 build-essential cmake"
    assert prereqs.packages(["run", "build"])[:3] == ["iproute2", "nftables", "iperf3"]
    with pytest.raises(KeyError, match="unknown package group 'gpu'"):
        prereqs.packages(["gpu"])


def test_every_tool_comes_from_a_package_the_install_script_installs():
    everything = set(prereqs.packages(list(prereqs.PACKAGES)))
    assert {pkg for pkg, _ in prereqs.TOOLS.values()} <= everything


def test_require_names_every_missing_program(path_without_nft):
    with pytest.raises(prereqs.MissingTools) as ei:
        prereqs.require(["nft", "iperf3"], "railover bench", path_without_nft)
    msg = str(ei.value)
    assert ei.value.missing == ["nft", "iperf3"]
    assert "nft not found: apt-get install nftables" in msg and "iperf3 not found: apt-get install iperf3" in msg
    assert "apt-get install nftables iperf3" in msg


def test_demo_needs_nft_only_for_nftables_faults(path_without_nft):
    assert demo.needed_tools(demo.parse_faults("port-down:a0,silent:b0")) == ["ip", "nft"]
    assert demo.needed_tools(demo.parse_faults("port-down:a0,host-down:b1")) == ["ip"]
    with pytest.raises(prereqs.MissingTools, match="nft not found: apt-get install nftables"):
        demo.check_system(demo.parse_faults("silent:b0"), path_without_nft)


def test_demo_without_nft_says_what_to_install_before_building_anything(tmp_path, path_without_nft):
    r = _cli(["demo", "--out", str(tmp_path / "out")], path_without_nft)
    both = r.stdout + r.stderr
    assert r.returncode == 2, both
    assert "Traceback" not in both
    assert "nft not found: apt-get install nftables" in _flat(both), both
    beds = Path(os.environ["RAILOVER_TESTBED_STATE"])   # where this test's beds record themselves (conftest)
    assert not list(beds.glob("ro*.json")), "a test bed was built although nft is missing"
    assert not (tmp_path / "out" / "run").exists()


def test_demo_baseline_without_nft_stops_after_the_first_refusal(tmp_path, path_without_nft):
    r = _cli(["demo", "--baseline", "--out", str(tmp_path / "out")], path_without_nft)
    both = _flat(r.stdout + r.stderr)
    assert r.returncode == 2 and "Traceback" not in both, both
    assert both.count("railover demo needs nft") == 1, both


def test_doctor_reports_missing_programs_with_their_package():
    rep = dr.diagnose(dr.Facts(env={}, ifaces=[dr.Iface("eth0", 2, ["10.0.0.1/24"]), dr.Iface("eth1", 3, ["10.0.1.1/24"])],
                               plugin={"path": "/x.so", "loaded": True, "abi": [7, 8, 9, 10, 11, 12]},
                               tools={"ip": "/usr/sbin/ip", "nft": None}),
                      route=lambda d, s: ("eth0" if s.startswith("10.0.0") else "eth1", ""), probe=lambda s, d, i: (True, ""))
    sysc = {c.what: c for c in rep.checks if c.section == "system"}
    assert sysc["ip"].status == dr.OK
    assert sysc["nft"].status == dr.WARN and "nft not found: apt-get install nftables" in sysc["nft"].detail
    assert sysc["nft"].fix == "apt-get install nftables"


def test_doctor_cli_with_a_path_without_nft(path_without_nft):
    r = _cli(["doctor", "--json", "--no-torch"], path_without_nft)
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stderr
    checks = {c["what"]: c for c in json.loads(r.stdout)["checks"] if c["section"] == "system"}
    assert checks["nft"]["status"] == "WARN" and "apt-get install nftables" in checks["nft"]["detail"]
    assert checks["iperf3"]["status"] == "WARN" and checks["cmake"]["fix"] == "apt-get install cmake"


def test_a_program_installed_off_path_is_named_with_the_directory_to_add(tmp_path, monkeypatch, path_without_nft):
    # A non-root login on Debian has no /usr/sbin on PATH: nft is installed, only out of reach,
    # and "apt-get install nftables" would be the wrong advice.
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    (sbin / "nft").write_text("#!/bin/sh\n")
    (sbin / "nft").chmod(0o755)
    monkeypatch.setattr(prereqs, "SYSTEM_DIRS", (str(sbin),))
    assert prereqs.off_path("nft", path_without_nft) == str(sbin / "nft")
    assert prereqs.off_path("nft", path_without_nft + os.pathsep + str(sbin)) is None, "a directory PATH lists"
    assert prereqs.off_path("iperf3", path_without_nft) is None, "not there at all"
    with pytest.raises(prereqs.MissingTools) as ei:
        prereqs.require(["nft", "iperf3"], "railover bench", path_without_nft)
    msg = str(ei.value)
    assert f'nft is installed in {sbin}, which PATH lacks: export PATH="$PATH:{sbin}" (or run as root)' in msg, msg
    assert "iperf3 not found: apt-get install iperf3" in msg
    assert "Install everything at once with: apt-get install iperf3 (" in msg, "nft is installed: not in the line"
    with pytest.raises(prereqs.MissingTools) as ei:
        prereqs.require(["nft"], "railover demo", path_without_nft)
    assert "apt-get" not in str(ei.value), "nothing to install"
    assert prereqs.found_off_path(["nft", "iperf3"], path_without_nft) == {"nft": str(sbin / "nft")}
    rows = {r[0]: r for r in prereqs.doctor_rows(prereqs.found(["nft", "iperf3"], path_without_nft),
                                                 prereqs.found_off_path(["nft", "iperf3"], path_without_nft))}
    assert rows["nft"][1] == "WARN" and rows["nft"][3] == f'export PATH="$PATH:{sbin}"'
    assert rows["iperf3"][3] == "apt-get install iperf3"
