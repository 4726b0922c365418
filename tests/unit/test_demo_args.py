"""`railover demo` rejects bad options before it builds anything (no root needed)."""
from __future__ import annotations

import pytest
import typer

from railover import demo


@pytest.mark.parametrize("layout,size,duration,faults,words", [
    ("foo", "4M", 0, "port-down:a0", "unknown layout"),
    ("99x99", "4M", 0, "port-down:a0", "names would collide"),
    ("T2", "abc", 0, "port-down:a0", "bad size"),
    ("T2", "-4M", 0, "port-down:a0", "bad size"),
    ("T2", "0", 0, "port-down:a0", "at least 1 byte"),
    ("T2", "4M", -5, "port-down:a0", "must be >= 0"),
    ("1x2", "4M", 0, "silent:b0", "has no NIC b0"),
])
def test_bad_options_are_rejected_naming_the_option(layout, size, duration, faults, words):
    with pytest.raises(typer.BadParameter, match=words):
        demo.check_args(layout, size, duration, demo.parse_faults(faults))


def test_good_options_pass():
    demo.check_args("T2", "4M", 0, demo.parse_faults("port-down:a0,silent:b0"))
    demo.check_args("T3", "64K", 10, demo.parse_faults("host-down:c1"))


def _demo_cli(*args: str):
    import os
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "railover.cli", "demo", *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, COLUMNS="250"))


def _flat(text: str) -> str:
    """CLI output without rich's box drawing and line wrapping."""
    import re
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", text).split())


@pytest.mark.parametrize("kind", ["file", "proc", "under-file"])
def test_bad_out_is_a_usage_error_naming_the_problem(tmp_path, kind):
    f = tmp_path / "existing"
    f.write_text("not a directory")
    out, words = {"file": (f, "exists and is not a directory"),
                  "proc": ("/proc/railover-demo-out", "cannot create the output directory"),
                  "under-file": (f / "sub", "cannot create the output directory")}[kind]
    r = _demo_cli("--out", str(out))
    both = r.stdout + r.stderr
    assert r.returncode == 2, both
    assert "Traceback" not in both, both
    assert "--out" in both and words in _flat(both), both
    assert f.read_text() == "not a directory"


def test_prepare_out_creates_the_directory_and_refuses_a_second_demo(tmp_path):
    out = tmp_path / "a" / "b"
    lock = demo.prepare_out(out)
    try:
        assert out.is_dir()
        with pytest.raises(typer.BadParameter, match="another railover demo is writing to"):
            demo.prepare_out(out)
    finally:
        lock.close()
    demo.prepare_out(out).close()  # released with the first one


@pytest.mark.parametrize("rc, rc_b, b_report, want", [
    (0, 1, {"survived": False, "wrong_bytes": 0}, 0),   # the baseline stalls/fails without failover: expected
    (0, 0, {"survived": True, "wrong_bytes": 0}, 0),
    (1, 1, {"survived": False, "wrong_bytes": 0}, 1),   # railover did not survive
    (1, 0, {"survived": True, "wrong_bytes": 0}, 1),
    (2, 2, None, 2),                                    # no test bed
    (0, 2, None, 2),                                    # the baseline's test bed failed
    (0, 1, None, 1),                                    # the baseline could not run (no report)
    (0, 1, {"survived": False, "wrong_bytes": 4096}, 1),  # a wrong byte is never expected
])
def test_baseline_exit_status_rule(rc, rc_b, b_report, want):
    assert demo.exit_code_with_baseline(rc, rc_b, b_report) == want


def test_baseline_help_says_it_is_expected_to_stall_and_states_the_exit_status():
    r = _demo_cli("--help")
    text = _flat(r.stdout)
    assert r.returncode == 0, r.stderr
    assert "The baseline is expected to stall or fail" in text
    assert "Exit status: 0 when the railover run survived every fault" in text


def test_a_test_bed_that_cannot_be_built_exits_2_not_1(monkeypatch, tmp_path):
    """README: exit 2 for no test bed; 1 is for a demo that ran and failed."""
    from railover.testbed.netns import TestBedError

    class NoBed:
        def __init__(self, layout):
            pass

        def __enter__(self):
            raise TestBedError("building test bed rot2 (T2) failed: RTNETLINK answers: File exists")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(demo, "check_system", lambda specs: None)
    monkeypatch.setattr(demo, "TestBed", NoBed)
    assert demo.run_demo(out=tmp_path / "out", quiet=True) == 2
