"""tests/conftest.py's hygiene rules, proven by running small pytest sessions that break them:
work folders and state files go to temporary places removed even when the test fails, a
test bed a test leaves behind is removed and errors that test, and a run that leaves
namespaces or /run/railover files behind fails."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import railover

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
SRC = str(Path(railover.__file__).resolve().parent.parent)
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                               reason="needs root and iproute2 (real namespaces, /run/railover)")


def _session(tmp_path: Path, test_code: str, **env: str) -> subprocess.CompletedProcess:
    """Run one inner pytest session with the project's conftest and ``test_code``."""
    d = tmp_path / "inner"
    d.mkdir()
    shutil.copy(CONFTEST, d / "conftest.py")
    (d / "test_inner.py").write_text(textwrap.dedent(test_code))
    e = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    e.pop("RAILOVER_STATE_DIR", None)   # the inner session sets its own, as a fresh run does
    e.pop("RAILOVER_TESTBED_STATE", None)
    e.pop("PYTEST_ADDOPTS", None)       # CI's options for its own run (--durations) are not the inner session's
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(d), str(d)],
                          cwd=d, env=e, capture_output=True, text=True, timeout=300)


def test_work_folders_and_state_dir_are_temporary_and_removed_even_when_the_test_fails(tmp_path):
    record = tmp_path / "record.json"
    r = _session(tmp_path, """
        import json, os, tempfile
        def test_fails_after_making_a_scenario_folder():
            wd = tempfile.mkdtemp(prefix="railover-scn-")   # what run_scenario does without a workdir
            open(os.path.join(wd, "events-rank0.jsonl"), "w").write("{}")
            json.dump({"wd": wd, "state": os.environ.get("RAILOVER_STATE_DIR"), "tmpdir": os.environ.get("TMPDIR"),
                       "beds": os.environ.get("RAILOVER_TESTBED_STATE")}, open(os.environ["RECORD"], "w"))
            assert False, "fails on purpose"
        """, RECORD=str(record))
    assert r.returncode == 1 and "fails on purpose" in r.stdout, r.stdout + r.stderr
    rec = json.loads(record.read_text())
    assert not Path(rec["wd"]).exists(), "the failed test's scenario folder was left behind"
    assert rec["wd"].startswith(rec["tmpdir"]) and rec["beds"].startswith(rec["tmpdir"])
    assert rec["state"] and not rec["state"].startswith("/run/railover") and not Path(rec["state"]).exists()


@pytest.mark.parametrize("var,value", [("RAILOVER_REQUIRE_NETNS", "yes"), ("RAILOVER_REQUIRE_RDMA", "true"),
                                       ("RAILOVER_REQUIRE_NETNS", " 1")])
def test_a_require_gate_other_than_0_or_1_stops_the_run(tmp_path, var, value):
    """RAILOVER_REQUIRE_NETNS=yes read as "not required": the bed tests skipped silently, the
    opposite of what was asked (found by a fresh-user trial). The run now refuses to start."""
    r = _session(tmp_path, """
        def test_runs():
            pass
        """, **{var: value})
    assert r.returncode == 4 and f"{var}={value!r}: give 1" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "1 passed" not in r.stdout


@ROOT_ONLY
def test_a_bed_left_by_a_failing_test_is_removed_and_reported(tmp_path):
    from railover.testbed import netns as tbmod
    record = tmp_path / "prefix"
    r = _session(tmp_path, """
        import os
        from railover.testbed.netns import TestBed
        def test_leaks_a_bed():
            tb = TestBed("1x2").up()
            tb.detach()                     # outlives this process, as after a killed 'railover demo'
            open(os.environ["RECORD"], "w").write(tb.prefix)
            assert False, "fails on purpose"
        """, RECORD=str(record))
    prefix = record.read_text().strip()
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        assert "left test bed(s) behind, now removed" in r.stdout and prefix in r.stdout, r.stdout
        assert not [n for n in tbmod._list_netns() if n.startswith(prefix + "-")]
    finally:
        tbmod.cleanup_leftovers(prefix)


@ROOT_ONLY
def test_a_run_that_leaves_namespaces_or_state_files_fails(tmp_path):
    ns = "ro" + os.urandom(2).hex() + "-nsQ"
    gone = subprocess.Popen(["true"])
    gone.wait()   # a pid that no longer runs, as a crashed rank's
    state = Path("/run/railover") / f"railover-{gone.pid}.json"
    r = _session(tmp_path, f"""
        import subprocess
        from pathlib import Path
        def test_passes_but_leaks():
            subprocess.run(["ip", "netns", "add", "{ns}"], check=True)
            Path("/run/railover").mkdir(exist_ok=True)
            Path("{state}").write_text("{{}}")
        """)
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        assert "1 passed" in r.stdout, r.stdout
        assert "test run left these behind" in r.stdout, r.stdout
        assert f"network namespace {ns}" in r.stdout and f"state file {state}" in r.stdout, r.stdout
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        state.unlink(missing_ok=True)


def test_a_clean_run_passes(tmp_path):
    r = _session(tmp_path, """
        import tempfile
        def test_clean():
            assert tempfile.mkdtemp(prefix="railover-scn-")
        """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "left these behind" not in r.stdout


def test_a_testbed_state_dir_the_user_named_that_cannot_be_used_is_warned_about(tmp_path, monkeypatch, capsys):
    """RAILOVER_TESTBED_STATE naming a file (or an unusable path) silently sent the bed's
    record to /run/railover-testbed, where the user would not look for it. Now a warning (once)
    says so and where the records go."""
    from railover.testbed import netns
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("RAILOVER_TESTBED_STATE", str(afile))
    monkeypatch.setattr(netns, "_STATE_DIR_WARNED", set())
    used = netns._writable_state_dir()
    assert used != afile and used.is_dir()
    err = capsys.readouterr().err
    assert f"RAILOVER_TESTBED_STATE={afile} cannot hold the test beds' records (not a directory); they go to {used}" \
        in err, err
    netns._writable_state_dir()
    assert capsys.readouterr().err == "", "warned twice"
    monkeypatch.setenv("RAILOVER_TESTBED_STATE", str(tmp_path / "new" / "dir"))
    assert netns._writable_state_dir() == tmp_path / "new" / "dir"
    assert capsys.readouterr().err == ""
