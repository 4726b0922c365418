"""Hygiene for every test run: tests leave nothing behind on the machine, even when they fail.

* Session: ``RAILOVER_STATE_DIR`` points to a temporary directory for the whole run, so no
  plugin loaded by a test (in this process or a child) writes into the node's
  ``/run/railover``; the directory is removed at the end.
* Each test: ``tempfile``'s directory and ``TMPDIR`` (for child processes) point to a fresh
  short directory (``/tmp/rot-XXXXXXXX``: short, because railover-perf's rendezvous socket
  path must stay under 90 bytes), and ``RAILOVER_TESTBED_STATE`` to a directory inside it, so
  every test bed the test builds, in-process or through a child (``railover demo``,
  ``testbed up --detach``, scripts), records its state file there. After the test, a bed
  recorded there that still has namespaces is removed (processes inside killed) and the test
  errors naming it; then the directory, with the scenario/perf work folders made by
  ``mkdtemp``, is removed. ``pytest --keep-tmp`` keeps the directories (paths printed) to
  inspect a failure.
* Session end: the run fails when test-bed namespaces (``ro????-ns*``) or files in the
  default state directories (``/run/railover``, ``/tmp/railover-<uid>``) appeared during it
  and are still there. Namespaces of beds whose owner process is alive and not one of this
  run's processes, and state files of such live processes, are another run's (several runs
  may share a machine) and are not counted; a state file of a process that has exited cannot
  be told apart and is counted (the message says so).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

_REAL_TMP = tempfile.gettempdir()
_SESSION: Dict[str, object] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--keep-tmp", action="store_true", default=False,
                     help="keep each test's temporary directory (work folders, journals) instead of removing it")


def _default_state_files() -> Set[str]:
    dirs = [Path("/run/railover")] + sorted(Path(_REAL_TMP).glob("railover-[0-9]*"))
    out: Set[str] = set()
    for d in dirs:
        try:
            out |= {str(p) for p in d.iterdir()}
        except OSError:
            continue
    return out


def _namespaces() -> Set[str]:
    from railover.testbed import netns as tbmod
    try:
        return {n for n in tbmod._list_netns() if tbmod.NS_RE.match(n)}
    except Exception:  # no iproute2 / netns support: nothing to watch
        return set()


def _ancestors_include(pid: int, root: int) -> bool:
    """Whether live process ``pid`` is ``root`` or one of its descendants."""
    for _ in range(64):
        if pid == root:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


#: The gates that turn a skip into a failure (tests/e2e, tests/rdma conftest): "1" requires,
#: unset, empty or "0" does not. Anything else ("yes", "true") silently skipped the tests it
#: was meant to require (found by a fresh-user trial), so the run refuses to start.
REQUIRE_VARS = ("RAILOVER_REQUIRE_NETNS", "RAILOVER_REQUIRE_RDMA")


def pytest_configure(config: pytest.Config) -> None:
    bad = [f"{v}={os.environ[v]!r}" for v in REQUIRE_VARS if os.environ.get(v, "") not in ("", "0", "1")]
    if bad:
        raise pytest.UsageError(f"{', '.join(bad)}: give 1 (the tests must run: fail where they cannot) or 0")
    if hasattr(config, "workerinput"):
        return
    _SESSION["old_state_dir"] = os.environ.get("RAILOVER_STATE_DIR")
    _SESSION["state_dir"] = tempfile.mkdtemp(prefix="railover-test-state-")
    os.environ["RAILOVER_STATE_DIR"] = str(_SESSION["state_dir"])
    _SESSION["namespaces"] = _namespaces()
    _SESSION["state_files"] = _default_state_files()
    _SESSION["ours"] = set()   # prefixes of beds this run's tests built


def pytest_unconfigure(config: pytest.Config) -> None:
    if "state_dir" not in _SESSION:
        return
    shutil.rmtree(str(_SESSION["state_dir"]), ignore_errors=True)
    old = _SESSION.get("old_state_dir")
    if old is None:
        os.environ.pop("RAILOVER_STATE_DIR", None)
    else:
        os.environ["RAILOVER_STATE_DIR"] = str(old)


def leftovers(before_ns: Set[str], before_files: Set[str], ours: Set[str]) -> List[str]:
    """What this run left behind: namespaces and default-state-dir files that appeared since
    ``before_*``; see the module docstring for which namespaces are not counted."""
    from railover.testbed import netns as tbmod
    out: List[str] = []
    new_ns = _namespaces() - before_ns
    if new_ns:
        beds = {i.prefix: i for i in tbmod.list_testbeds()}
        for ns in sorted(new_ns):
            prefix = tbmod.NS_RE.match(ns).group(1)
            info = beds.get(prefix)
            foreign = (prefix not in ours and info is not None and info.alive and info.pid is not None
                       and not _ancestors_include(info.pid, os.getpid()))
            if not foreign:
                out.append(f"network namespace {ns}")
    for f in sorted(_default_state_files() - before_files):
        m = re.match(r"railover-(\d+)\.json$", Path(f).name)
        pid = int(m.group(1)) if m else None
        if pid is not None and Path(f"/proc/{pid}").exists() and not _ancestors_include(pid, os.getpid()):
            continue  # a live process of another run
        out.append(f"state file {f}" + (" (its process has exited; if another run shares this machine, it may be "
                                        "that run's)" if pid is not None and not Path(f"/proc/{pid}").exists() else ""))
    return out


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "namespaces" not in _SESSION:
        return
    left = leftovers(_SESSION["namespaces"], _SESSION["state_files"], _SESSION["ours"])  # type: ignore[arg-type]
    if not left:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    msg = ("test run left these behind (a test or the code under test does not clean up): " + "; ".join(left)
           + ". Remove beds with 'railover testbed down --prefix <prefix>'.")
    if tr is not None:
        tr.write_line("")
        tr.write_line("ERROR " + msg, red=True, bold=True)
    else:
        print("ERROR " + msg)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _beds_recorded_in(state_dir: Path):
    from railover.testbed import netns as tbmod
    return [i for i in tbmod.list_testbeds()
            if i.state_file is not None and i.state_file.parent == state_dir]


@pytest.fixture(autouse=True)
def _private_temp_and_bed_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                                tmp_path_factory: pytest.TempPathFactory):
    tmp_path_factory.getbasetemp()  # pytest's own tmp_path root: fixed before tempfile is redirected
    d = Path(tempfile.mkdtemp(prefix="rot-", dir=_REAL_TMP))
    beds = d / "testbeds"
    beds.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setenv("RAILOVER_TESTBED_STATE", str(beds))
    try:
        yield d
    finally:
        leaked: List[str] = []
        try:
            from railover.testbed import netns as tbmod
            for info in _beds_recorded_in(beds):
                _SESSION.setdefault("ours", set()).add(info.prefix)  # type: ignore[union-attr]
                if info.namespaces:  # the test's own fixtures have torn their beds down by now
                    leaked.append(f"{info.prefix} ({', '.join(info.namespaces)})")
                    tbmod.cleanup_leftovers(info.prefix)
        finally:
            if request.config.getoption("--keep-tmp"):
                print(f"\nkept {d}")
            else:
                shutil.rmtree(d, ignore_errors=True)
        if leaked:
            pytest.fail("the test left test bed(s) behind, now removed: " + "; ".join(leaked), pytrace=False)

