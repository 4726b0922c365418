"""`railover launch` (environment, conflicts, exec) and `railover drill` (refusal, report
logic) without network namespaces."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from railover import _paths, envvars
from railover.ops import drill as dl
from railover.cli import app
from railover.ops.cli import LaunchConflict, launch_env

# Subprocesses import the same railover this test process imported (the installed package in
# CI, src/ in a developer tree), so they find the same native files.
import railover as _railover_pkg  # noqa: E402

SRC = str(Path(_railover_pkg.__file__).resolve().parent.parent)
DUMP = "import json, os; print(json.dumps(dict(os.environ)))"


def test_launch_env_adds_ncclvars_and_keeps_the_users_railover_settings():
    base = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/cuda/lib64", "RAILOVER_HOLD_DOWN_MS": "500",
            "RAILOVER_IFNAMES": "=eth0,eth1"}
    env, warnings = launch_env(base)
    libdir = str(_paths.plugin_path().parent)
    assert warnings == []
    assert env["NCCL_NET"] == "railover" and env["NCCL_NET_PLUGIN"] == "railover"
    assert env["NCCL_NET_PLUGIN_REF_COUNT"] == "1"
    assert env["LD_LIBRARY_PATH"] == f"{libdir}:/opt/cuda/lib64"
    assert env["RAILOVER_HOLD_DOWN_MS"] == "500" and env["RAILOVER_IFNAMES"] == "=eth0,eth1"
    assert base == {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/cuda/lib64", "RAILOVER_HOLD_DOWN_MS": "500",
                    "RAILOVER_IFNAMES": "=eth0,eth1"}   # not modified in place
    assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == \
        {k: v for k, v in envvars.nccl_env(base).items() if k.startswith("NCCL_")}


def test_launch_env_keeps_an_explicit_ref_count_with_a_warning():
    env, warnings = launch_env({"NCCL_NET_PLUGIN_REF_COUNT": "0"})
    assert env["NCCL_NET_PLUGIN_REF_COUNT"] == "0" and "2.28/2.29" in warnings[0]
    env, warnings = launch_env({"NCCL_NET": "railover", "NCCL_NET_PLUGIN": str(_paths.plugin_path())})
    assert warnings == [] and env["NCCL_NET_PLUGIN"] == str(_paths.plugin_path())


def test_launch_keeps_the_users_plugin_path_and_validates_with_that_build(tmp_path):
    other = tmp_path / _paths.PLUGIN_FILE   # another railover build, as a user would name it
    shutil.copy(_paths.plugin_path(), other)
    env, warnings = launch_env({"NCCL_NET_PLUGIN": str(other), "LD_LIBRARY_PATH": "/opt/cuda/lib64"})
    assert warnings == []
    assert env["NCCL_NET_PLUGIN"] == str(other), "the user's build must not be replaced by railover's own"
    assert env["LD_LIBRARY_PATH"] == "/opt/cuda/lib64" and env["NCCL_NET"] == "railover"
    with pytest.raises(LaunchConflict, match="RAILOVER_NSTREAMS='99' is not valid"):
        launch_env({"NCCL_NET_PLUGIN": str(other), "RAILOVER_NSTREAMS": "99"})
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--", "torchrun"], env={"NCCL_NET_PLUGIN": str(other)})
    assert r.exit_code == 0 and "NCCL_NET_PLUGIN=" not in r.output and "warning" not in r.output, r.output


def test_launch_keeps_a_railover_build_the_users_ld_library_path_resolves(tmp_path, monkeypatch):
    """NCCL_NET_PLUGIN=railover is opened by file name, LD_LIBRARY_PATH first: a build the user
    already has there is kept (railover's own is not put in front of it), validates the
    variables, and a note on stderr says which build the command gets."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    shutil.copy(_paths.plugin_path(), theirs / _paths.PLUGIN_FILE)
    ours = tmp_path / "ours"   # railover's own build, one that does not load: validation must use theirs
    ours.mkdir()
    (ours / _paths.PLUGIN_FILE).write_bytes(b"not an ELF file")
    monkeypatch.setenv("RAILOVER_NATIVE_DIR", str(ours))
    ld = f"/opt/cuda/lib64:{theirs}"
    notes = []
    env, warnings = launch_env({"NCCL_NET_PLUGIN": "railover", "LD_LIBRARY_PATH": ld}, notes=notes)
    assert env["LD_LIBRARY_PATH"] == ld and env["NCCL_NET_PLUGIN"] == "railover" and env["NCCL_NET"] == "railover"
    assert warnings == [], warnings
    assert len(notes) == 1 and str(theirs / _paths.PLUGIN_FILE) in notes[0] and str(ours) in notes[0], notes
    with pytest.raises(LaunchConflict, match="RAILOVER_NSTREAMS='99' is not valid"):
        launch_env({"LD_LIBRARY_PATH": ld, "RAILOVER_NSTREAMS": "99"})
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--", "torchrun"],
                           env={"NCCL_NET_PLUGIN": "railover", "LD_LIBRARY_PATH": ld})
    assert r.exit_code == 0, r.output
    assert "LD_LIBRARY_PATH=" not in r.output and "warning" not in r.output, r.output
    assert f"note: using the railover plugin your LD_LIBRARY_PATH resolves, {theirs / _paths.PLUGIN_FILE}" in \
        " ".join(r.output.split()), r.output
    # an empty entry is the current directory, as for the dynamic loader
    monkeypatch.chdir(theirs)
    env, _ = launch_env({"LD_LIBRARY_PATH": "/opt/cuda/lib64::"})
    assert env["LD_LIBRARY_PATH"] == "/opt/cuda/lib64::"


def test_launch_says_nothing_when_ld_library_path_already_has_railovers_own_build():
    ld = f"/opt/cuda/lib64:{_paths.plugin_path().parent}"
    notes = []
    env, warnings = launch_env({"LD_LIBRARY_PATH": ld}, notes=notes)
    assert env["LD_LIBRARY_PATH"] == ld and warnings == [] and notes == []
    env, _ = launch_env({"LD_LIBRARY_PATH": "/opt/cuda/lib64"}, notes=notes)   # none there: railover's own first
    assert env["LD_LIBRARY_PATH"] == f"{_paths.plugin_path().parent}:/opt/cuda/lib64" and notes == []


def test_launch_refuses_a_railover_on_ld_library_path_that_does_not_load(tmp_path):
    (tmp_path / _paths.PLUGIN_FILE).write_bytes(b"not an ELF file")
    base = {"LD_LIBRARY_PATH": str(tmp_path)}
    with pytest.raises(LaunchConflict, match=f"LD_LIBRARY_PATH={tmp_path} resolves {_paths.PLUGIN_FILE} to "
                                             f"{tmp_path / _paths.PLUGIN_FILE}, which is not a loadable railover"):
        launch_env(base)
    env, warnings = launch_env(base, force=True)
    assert env["LD_LIBRARY_PATH"] == f"{_paths.plugin_path().parent}:{tmp_path}"
    assert any("railover's own build is put first on LD_LIBRARY_PATH (--force)" in w for w in warnings), warnings


@pytest.mark.parametrize("content", [None, b"not an ELF file"])
def test_launch_refuses_a_plugin_path_that_is_not_a_loadable_railover_plugin(tmp_path, content):
    bad = tmp_path / _paths.PLUGIN_FILE
    if content is not None:
        bad.write_bytes(content)
    with pytest.raises(LaunchConflict, match=f"NCCL_NET_PLUGIN={bad} is not a loadable railover plugin"):
        launch_env({"NCCL_NET_PLUGIN": str(bad)})
    env, warnings = launch_env({"NCCL_NET_PLUGIN": str(bad)}, force=True)
    assert env["NCCL_NET_PLUGIN"] == "railover"
    assert any("not a loadable railover plugin" in w and "replaced by NCCL_NET_PLUGIN=railover (--force)" in w
               for w in warnings), warnings
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--", "torchrun"], env={"NCCL_NET_PLUGIN": str(bad)})
    assert r.exit_code == 2 and "not a loadable railover plugin" in r.output and "Traceback" not in r.output, r.output


def test_launch_says_it_could_not_validate_when_the_plugin_does_not_load(tmp_path, monkeypatch):
    (tmp_path / _paths.PLUGIN_FILE).write_bytes(b"not an ELF file")
    monkeypatch.setenv("RAILOVER_NATIVE_DIR", str(tmp_path))
    env, warnings = launch_env({"RAILOVER_NSTREAMS": "99"})
    assert env["RAILOVER_NSTREAMS"] == "99"
    assert len(warnings) == 1 and "could not validate the RAILOVER_* settings" in warnings[0], warnings
    assert "the plugin could not be loaded" in warnings[0] and str(tmp_path / _paths.PLUGIN_FILE) in warnings[0]
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--", "torchrun"], env={"RAILOVER_NATIVE_DIR": str(tmp_path)})
    assert r.exit_code == 0 and "warning: could not validate the RAILOVER_* settings" in r.output, r.output


@pytest.mark.parametrize("base,words", [
    ({"NCCL_NET": "IB"}, "NCCL_NET=IB selects another network"),
    ({"NCCL_NET_PLUGIN": "aws-ofi"}, "NCCL_NET_PLUGIN=aws-ofi selects another plugin"),
    ({"RAILOVER_NSTREAMS": "99"}, "RAILOVER_NSTREAMS='99' is not valid"),
])
def test_launch_env_refuses_conflicts_unless_forced(base, words):
    with pytest.raises(LaunchConflict) as ei:
        launch_env(base)
    assert words in str(ei.value)
    env, warnings = launch_env(base, force=True)
    assert env["NCCL_NET"] == "railover" and env["NCCL_NET_PLUGIN"] == "railover"
    assert any(words in w and "--force" in w for w in warnings)


def test_launch_force_really_removes_an_invalid_value_and_says_so():
    base = {"RAILOVER_NSTREAMS": "99", "RAILOVER_HOLD_DOWN_MS": "500", "NCCL_NET": "IB"}
    env, warnings = launch_env(base, force=True)
    assert "RAILOVER_NSTREAMS" not in env, "an invalid value must not reach the plugin (its init would fail)"
    assert env["RAILOVER_HOLD_DOWN_MS"] == "500"   # valid ones are kept
    assert env["NCCL_NET"] == "railover"
    assert any("RAILOVER_NSTREAMS='99'" in w and "removed" in w and "default" in w for w in warnings), warnings
    assert any("NCCL_NET=IB" in w and "replaced by NCCL_NET=railover" in w for w in warnings), warnings
    assert base["RAILOVER_NSTREAMS"] == "99"   # the caller's mapping is not modified


def test_launch_force_runs_the_command_without_the_invalid_value():
    cp = _launch(["--force", "--", sys.executable, "-c", DUMP], {"RAILOVER_PROBE_MULT": "1", "RAILOVER_STALL_MS": "70"})
    assert cp.returncode == 0, cp.stderr
    env = json.loads(cp.stdout)
    assert "RAILOVER_PROBE_MULT" not in env and env["RAILOVER_STALL_MS"] == "70"
    assert "RAILOVER_PROBE_MULT='1'" in cp.stderr and "removed" in cp.stderr
    r = CliRunner().invoke(app, ["launch", "--force", "--dry-run", "--", "torchrun"], env={"RAILOVER_PROBE_MULT": "1"})
    assert r.exit_code == 0 and "unset RAILOVER_PROBE_MULT" in r.output, r.output


def _launch(args, extra_env=None):
    env = dict(os.environ, PYTHONPATH=SRC, **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "railover.cli", "launch"] + args, env=env, capture_output=True,
                          text=True, timeout=60)


def test_launch_execs_the_command_with_the_environment():
    cp = _launch(["--", sys.executable, "-c", DUMP], {"RAILOVER_STALL_MS": "70"})
    assert cp.returncode == 0, cp.stderr
    env = json.loads(cp.stdout)
    assert env["NCCL_NET"] == "railover" and env["NCCL_NET_PLUGIN"] == "railover"
    assert env["RAILOVER_STALL_MS"] == "70"
    assert str(_paths.plugin_path().parent) in env["LD_LIBRARY_PATH"].split(":")


def test_launch_passes_the_exit_code_and_options_of_the_command():
    cp = _launch(["--", sys.executable, "-c", "import sys; sys.exit(7)", "--force"])
    assert cp.returncode == 7


def test_launch_refusals_and_missing_command():
    cp = _launch(["--", "true"], {"NCCL_NET": "Socket"})
    assert cp.returncode == 2 and "NCCL_NET=Socket selects another network" in cp.stderr and "--force" in cp.stderr
    cp = _launch(["--force", "--", sys.executable, "-c", DUMP], {"NCCL_NET": "Socket"})
    assert cp.returncode == 0 and json.loads(cp.stdout)["NCCL_NET"] == "railover" and "replaced by NCCL_NET=railover" in cp.stderr
    cp = _launch(["--", "no-such-command-railover"])
    assert cp.returncode == 127 and "command not found" in cp.stderr


def test_launch_warns_about_a_misspelt_railover_variable_as_doctor_does():
    from railover.ops.doctor import validate_config
    base = {"RAILOVER_HOLDDOWN_MS": "500", "RAILOVER_STALL_MS": "70"}
    env, warnings = launch_env(base)
    want = "RAILOVER_HOLDDOWN_MS is not a railover variable (did you mean RAILOVER_HOLD_DOWN_MS?); it is ignored"
    assert warnings == [want]
    assert env["RAILOVER_HOLDDOWN_MS"] == "500"   # warned about, not removed: the command runs as asked
    assert [c.detail for c in validate_config(base) if c.what == "RAILOVER_HOLDDOWN_MS"] == [want]   # doctor's words
    cp = _launch(["--", sys.executable, "-c", DUMP], {"RAILOVER_HOLDDOWN_MS": "500"})
    assert cp.returncode == 0, cp.stderr
    assert f"warning: {want}" in cp.stderr and "Traceback" not in cp.stderr
    assert json.loads(cp.stdout)["RAILOVER_HOLDDOWN_MS"] == "500"


def test_a_misspelt_variable_gets_the_closest_name_and_an_unrelated_one_none():
    from railover.ops.doctor import unknown_var_checks
    names = {"RAILOVER_HOLD_DOWN_MS", "RAILOVER_STALL_MS", "RAILOVER_RAILS", "RAILOVER_PROBE_INTERVAL_MS"}
    got = {c.what: (c.detail, c.fix) for c in unknown_var_checks(
        {"RAILOVER_STALLMS": "1", "RAILOVER_PROBE_INTERVAL": "5", "RAILOVER_HCAS": "mlx5_0", "RAILOVER_RAILS": "",
         "NCCL_IB_HCA": "mlx5"}, names)}
    assert set(got) == {"RAILOVER_STALLMS", "RAILOVER_PROBE_INTERVAL", "RAILOVER_HCAS"}
    assert got["RAILOVER_STALLMS"][0] == ("RAILOVER_STALLMS is not a railover variable "
                                           "(did you mean RAILOVER_STALL_MS?); it is ignored")
    assert "rename it to RAILOVER_STALL_MS" in got["RAILOVER_STALLMS"][1]
    assert "did you mean RAILOVER_PROBE_INTERVAL_MS?" in got["RAILOVER_PROBE_INTERVAL"][0]
    # RAILOVER_HCAS shares only the prefix with RAILOVER_RAILS: no suggestion
    assert got["RAILOVER_HCAS"][0] == "RAILOVER_HCAS is not a railover variable (typo?); it is ignored"


def test_launch_warns_about_a_nic_listed_twice_in_rails():
    env, warnings = launch_env({"RAILOVER_RAILS": "eth0=0,eth0=1"})
    assert warnings == ["RAILOVER_RAILS lists eth0 2 times (eth0=0, eth0=1): the plugin uses the last, rail 1"]
    assert env["RAILOVER_RAILS"] == "eth0=0,eth0=1"   # warned about, not changed
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--", "torchrun"], env={"RAILOVER_RAILS": "eth0=0,eth0=1"})
    assert r.exit_code == 0 and "warning: RAILOVER_RAILS lists eth0 2 times" in r.output, r.output
    env, warnings = launch_env({"RAILOVER_RAILS": "eth0=0,eth1=1"})
    assert warnings == []


def test_launch_dry_run_prints_the_changes():
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--", "torchrun", "train.py"])
    assert r.exit_code == 0, r.output
    assert "NCCL_NET=railover" in r.output and "exec: torchrun train.py" in r.output


def test_launch_refusal_also_shows_the_other_findings():
    base = {"NCCL_NET": "IB", "RAILOVER_HOLDDOWN_MS": "500", "RAILOVER_RAILS": "eth0=0,eth0=1"}
    with pytest.raises(LaunchConflict) as ei:
        launch_env(base)
    assert "NCCL_NET=IB selects another network" in str(ei.value)
    assert any("RAILOVER_HOLDDOWN_MS is not a railover variable" in w for w in ei.value.warnings)
    assert any("RAILOVER_RAILS lists eth0 2 times" in w for w in ei.value.warnings)
    assert not any("--force" in w for w in ei.value.warnings), "what --force would do is not a finding"
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--", "torchrun"], env=base)
    assert r.exit_code == 2, r.output
    assert "warning: RAILOVER_HOLDDOWN_MS is not a railover variable" in r.output
    assert "warning: RAILOVER_RAILS lists eth0 2 times" in r.output
    assert "error: NCCL_NET=IB selects another network" in r.output


def test_launch_dry_run_quotes_the_command_and_values_for_a_shell():
    r = CliRunner().invoke(app, ["launch", "--dry-run", "--", "echo", "a b", "it's"],
                           env={"LD_LIBRARY_PATH": "/opt/my libs"})
    assert r.exit_code == 0, r.output
    assert "exec: echo 'a b' 'it'\"'\"'s'" in r.output, r.output
    assert f"LD_LIBRARY_PATH='{_paths.plugin_path().parent}:/opt/my libs'" in r.output, r.output


def test_launch_names_a_command_that_exists_but_cannot_run(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    cp = _launch(["--", str(script)])
    assert cp.returncode == 126 and f"{script}: not executable" in cp.stderr, cp.stderr
    cp = _launch(["--", "train.sh"], {"PATH": f"{tmp_path}:{os.environ.get('PATH', '')}"})
    assert cp.returncode == 126 and f"{script}: not executable" in cp.stderr, cp.stderr
    cp = _launch(["--", str(tmp_path)])
    assert cp.returncode == 126 and f"{tmp_path}: is a directory" in cp.stderr, cp.stderr


def test_launch_refuses_an_empty_command():
    """`launch -- ""` said "<python bin dir>/: is a directory", exit 126."""
    cp = _launch(["--", ""])
    assert cp.returncode == 2 and "error: empty command" in cp.stderr and "directory" not in cp.stderr, cp.stderr
    cp = _launch(["--dry-run", "--", "", "x"])
    assert cp.returncode == 2 and "error: empty command" in cp.stderr and "exec:" not in cp.stdout, cp.stderr


@pytest.mark.parametrize("var", ["NCCL_NET", "NCCL_NET_PLUGIN"])
def test_launch_takes_an_empty_nccl_net_or_plugin_as_unset(var):
    """An empty NCCL_NET= / NCCL_NET_PLUGIN= selects nothing (railover's convention: empty is
    unset): no conflict, and railover's value is set."""
    env, warnings = launch_env({var: "", "LD_LIBRARY_PATH": "/opt/cuda/lib64"})
    assert env["NCCL_NET"] == "railover" and env["NCCL_NET_PLUGIN"] == "railover"
    assert not any("selects another" in w for w in warnings), warnings


@pytest.mark.parametrize("ld", ["/a::/b", ":/a", "/a:", "/b:/a:/b"])
def test_nccl_env_keeps_the_users_ld_library_path_entries_as_given(ld):
    """An empty entry is the current directory to the loader: it used to be dropped; entries
    are neither dropped nor reordered, railover's directory goes first."""
    libdir = str(_paths.plugin_path().parent)
    assert envvars.nccl_env({"LD_LIBRARY_PATH": ld})["LD_LIBRARY_PATH"] == f"{libdir}:{ld}"
    assert envvars.nccl_env({"LD_LIBRARY_PATH": ""})["LD_LIBRARY_PATH"] == libdir   # no entry: no "current directory"
    assert envvars.nccl_env({})["LD_LIBRARY_PATH"] == libdir
    env, _ = launch_env({"LD_LIBRARY_PATH": ld})
    assert env["LD_LIBRARY_PATH"] == f"{libdir}:{ld}"


def test_nccl_env_puts_the_plugin_directory_first_even_when_it_is_already_further_back(tmp_path):
    """`railover env` promises railover's own directory first: one already on LD_LIBRARY_PATH
    behind a directory with another build of the plugin lost to it (the loader takes the first)."""
    libdir = str(_paths.plugin_path().parent)
    other = tmp_path / "old"
    other.mkdir()
    (other / _paths.PLUGIN_FILE).write_bytes(b"")
    got = envvars.nccl_env({"LD_LIBRARY_PATH": f"{other}:{libdir}"})["LD_LIBRARY_PATH"]
    assert got.split(":")[0] == libdir and got == f"{libdir}:{other}:{libdir}"
    assert envvars.nccl_env({"LD_LIBRARY_PATH": f"{libdir}:/x"})["LD_LIBRARY_PATH"] == f"{libdir}:/x"  # already first


# --------------------------------------------------------------------------- drill

def test_drill_refuses_without_yes():
    r = CliRunner().invoke(app, ["drill", "--nic", "eth0", "--down-for", "5"])
    assert r.exit_code == 2
    out = " ".join(r.output.split())
    assert "refusing to run" in out and "eth0" in out and "--yes" in out


def test_drill_missing_nic_is_a_clear_error():
    r = CliRunner().invoke(app, ["drill", "--nic", "norailovernic0", "--down-for", "1", "--yes"])
    assert r.exit_code == 2 and "no interface named 'norailovernic0'" in r.output


def test_drill_bad_duration():
    with pytest.raises(dl.DrillError):
        dl.run_drill("lo", 0)


def _res(**kw):
    r = dl.DrillResult(nic="eth0", netns=None, down_for_s=2.0, down_us=1_000_000, up_us=3_000_000,
                       users=["rank 0"], journals=["/j"])
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_drill_analysis_of_a_good_run():
    evs = [{"t_us": 900_000, "pid": 1, "event": "pair_down", "nic": "eth0"},        # before the drill: ignored
           {"t_us": 1_000_400, "pid": 1, "event": "nic_down", "nic": "eth0", "signal": "admin down"},
           {"t_us": 1_001_000, "pid": 1, "event": "failover", "comm": "5", "to_nic": "eth1", "convergence_us": 600},
           {"t_us": 1_002_000, "pid": 2, "event": "failover", "comm": "6", "to_nic": "eth1", "convergence_us": 900},
           {"t_us": 4_100_000, "pid": 1, "event": "failback", "comm": "5", "to_nic": "eth0", "convergence_us": 300},
           {"t_us": 4_200_000, "pid": 2, "event": "failback", "comm": "6", "to_nic": "eth0", "convergence_us": 300}]
    r = dl.analyze(_res(), evs)
    assert r.ok, r.problems
    assert r.detection["event"] == "nic_down" and r.detection["since_down_ms"] == pytest.approx(0.4)
    assert [e["since_down_ms"] for e in r.failovers] == [1.0, 2.0]
    assert [e["since_up_ms"] for e in r.failbacks] == [1100.0, 1200.0]


def test_drill_analysis_finds_the_problems():
    r = dl.analyze(_res(), [])
    assert not r.ok and any("did not notice" in p for p in r.problems) and any("no failover" in p for p in r.problems)
    evs = [{"t_us": 1_000_400, "pid": 1, "event": "nic_down"},
           {"t_us": 1_001_000, "pid": 1, "event": "failover", "comm": "5"},
           {"t_us": 1_500_000, "pid": 1, "event": "fatal", "comm": "7", "message": "no usable path"}]
    r = dl.analyze(_res(still_failed_over=["rank 0 comm 5"]), evs)
    text = " | ".join(r.problems)
    assert "no failback" in text and "pid 1 comm 5" in text and "no usable path" in text and "still on a standby" in text
    r = dl.analyze(_res(users=[]), [])
    assert r.problems == ["no running railover process used eth0: nothing to observe"]
    r = dl.analyze(_res(journals=[]), [])
    assert any("no event journal" in p for p in r.problems)


def test_drill_analysis_of_a_garbled_comm_field_is_a_report_not_a_traceback():
    """A failover whose comm was a list or an object (a garbled journal line) ended the drill,
    after the NIC was back, in a traceback (unhashable type: 'list') instead of the report."""
    evs = [{"t_us": 1_000_400, "pid": 1, "event": "nic_down", "nic": "eth0", "signal": "admin down"},
           {"t_us": 1_001_000, "pid": 1, "event": "failover", "comm": [5], "to_nic": "eth1"},
           {"t_us": 1_002_000, "pid": 1, "event": "failover", "comm": {"id": 6}, "to_nic": "eth1"},
           {"t_us": 4_100_000, "pid": 1, "event": "failback", "comm": [5], "to_nic": "eth0"}]
    r = dl.analyze(_res(), evs)
    assert len(r.failovers) == 2 and len(r.failbacks) == 1
    assert r.problems == ["no failback after the NIC came back for: pid 1 comm {'id': 6}"]


@pytest.fixture
def no_link_changes(monkeypatch):
    """The NIC 'exists and is up'; taking it down fails the test (records the calls)."""
    calls = []
    monkeypatch.setattr(dl, "link_admin_up", lambda nic, netns=None: True)
    monkeypatch.setattr(dl, "set_link", lambda nic, up, netns=None: calls.append((nic, up)))
    return calls


@pytest.mark.parametrize("argv,msg", [
    (["--down-for", "-5"], "Invalid value for '--down-for': -5 is not in the range x>0."),
    (["--down-for", "0"], "Invalid value for '--down-for': 0 is not in the range x>0."),
    (["--down-for", "inf"], "Invalid value for '--down-for': inf is not a finite number."),  # the NIC down for ever
    (["--down-for", "5", "--wait-failback", "-3"], "Invalid value for '--wait-failback'"),
    (["--down-for", "5", "--wait-failback", "inf"], "Invalid value for '--wait-failback': inf is not a finite number."),
])
@pytest.mark.parametrize("yes", [[], ["--yes"]])
def test_drill_validates_durations_before_asking_for_yes(no_link_changes, tmp_path, argv, msg, yes):
    r = CliRunner().invoke(app, ["drill", "--nic", "eth0", "--state-dir", str(tmp_path)] + argv + yes)
    assert r.exit_code == 2, r.output
    out = " ".join(re.sub(r"[\u2500-\u257f]", " ", r.output).split())  # rich draws usage errors in a box
    assert msg in out and "--yes" not in out, out
    assert no_link_changes == []
    with pytest.raises(dl.DrillError, match="--wait-failback must be >= 0"):
        dl.run_drill("eth0", 1, wait_failback_s=-3)


def test_drill_refuses_when_no_railover_process_uses_the_nic(no_link_changes, tmp_path):
    r = CliRunner().invoke(app, ["drill", "--nic", "eth0", "--down-for", "0.01", "--yes", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "refusing to run: no running railover process uses eth0" in out and "--force" in out, out
    assert no_link_changes == [], "the NIC was taken down with nothing to observe"
    # --force: the drill runs anyway (the NIC goes down and comes back), the report says why it is not OK
    r = CliRunner().invoke(app, ["drill", "--nic", "eth0", "--down-for", "0.01", "--yes", "--force",
                                 "--wait-failback", "0", "--state-dir", str(tmp_path), "--json"])
    assert r.exit_code == 1, r.output
    assert no_link_changes == [("eth0", False), ("eth0", True)]
    assert json.loads(r.stdout)["problems"] == ["no running railover process used eth0: nothing to observe"]


def test_drill_refuses_a_journal_or_state_dir_that_does_not_exist(no_link_changes, tmp_path):
    """A mistyped --journal (a peer's journal on a shared file system) was left out of the report
    without a word, after the NIC had gone down; status and exporter warned. The drill, which
    takes a NIC down, refuses before it does, even with --force."""
    for extra in (["--journal", str(tmp_path / "nope.jsonl")], ["--state-dir", str(tmp_path / "missing")]):
        r = CliRunner().invoke(app, ["drill", "--nic", "eth0", "--down-for", "0.01", "--yes", "--force",
                                     "--state-dir", str(tmp_path)] + extra)
        assert r.exit_code == 2, r.output
        out = " ".join(r.output.split())
        assert "refusing to run:" in out and "does not exist" in out and extra[1] in out, out
        assert no_link_changes == [], "the NIC was taken down"


def test_drill_report_shows_fields_an_event_lacks_as_absent_not_none(monkeypatch, tmp_path):
    """Journal events are checked for their event name and time only: a field one lacks (an
    older or newer plugin, a hand-written journal) or has as null was printed as "None" (pid,
    comm, to NIC, peer, "in pid None", "flap: pid None", "fatal error in pid None: None"), and a
    null bytes_resent ended the report with a TypeError traceback."""
    evs = [{"t_us": 1_000_400, "event": "nic_down", "nic": "eth0", "signal": None},
           {"t_us": 1_001_000, "event": "failover", "to_nic": None},
           {"t_us": 1_001_500, "pid": 5, "event": "failover", "to_nic": "eth1"},   # no comm, no failback
           {"t_us": 1_002_000, "event": "flap", "nic": "eth0"},
           {"t_us": 1_003_000, "event": "fatal"},
           {"t_us": 1_004_000, "pid": 3, "event": "fatal", "message": "no usable path"},
           {"t_us": 4_100_000, "event": "failback", "bytes_resent": None, "convergence_us": None}]
    res = dl.analyze(_res(counters_before={"failovers": 0}, counters_after={"failovers": 1}), evs)
    monkeypatch.setattr(dl, "run_drill", lambda *a, **k: res)
    argv = ["drill", "--nic", "eth0", "--down-for", "1", "--yes", "--state-dir", str(tmp_path)]
    r = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.exception, r.output)   # not a TypeError
    assert "Traceback" not in r.output and "None" not in r.output, r.output
    out = " ".join(r.output.split())
    assert "detection: nic_down after 0.4 ms (nic=eth0) " in out + " ", out
    assert "│ failover │ - │ - │ - │ - │ 1.0 │ - │ - │ - │" in out, out
    assert "flap: nic=eth0" in out and "PROBLEM: fatal error PROBLEM" in out, out
    assert "PROBLEM: fatal error in pid 3: no usable path" in out, out
    assert "PROBLEM: no failback after the NIC came back for: pid 5 PROBLEM" in out, out
    r = CliRunner().invoke(app, argv + ["--json"])
    assert r.exit_code == 1 and "None" not in " ".join(json.loads(r.stdout)["problems"]), r.output


@pytest.mark.parametrize("first_line,code,words", [
    (b"#!/nonexistent/interpreter\n", 127, "its interpreter '/nonexistent/interpreter' (the #! line) was not found"),
    (b"#!/bin/sh\r\n", 127, "(the line ends in \\r: Windows line endings)"),
    # the kernel runs the first word; the rest is one argument to it, not part of its name
    (b"#!/nonexistent/python3 -u -x\n", 127, "its interpreter '/nonexistent/python3' (the #! line) was not found"),
    (b"echo no shebang\n", 126, "not a program this machine runs"),
])
def test_launch_names_why_an_executable_file_cannot_run(tmp_path, first_line, code, words):
    """An executable script whose #! interpreter is missing (or has a Windows \\r), or with no
    #! line at all, ended `railover launch` in a traceback (FileNotFoundError naming the script,
    which is there; OSError Exec format error), exit 1."""
    script = tmp_path / "train.sh"
    script.write_bytes(first_line)
    script.chmod(0o755)
    cp = _launch(["--", str(script)])
    assert cp.returncode == code, cp.stderr
    assert "Traceback" not in cp.stderr and f"error: {script}: cannot run it: " in cp.stderr, cp.stderr
    assert words in cp.stderr, cp.stderr


@pytest.mark.parametrize("conv", [float("inf"), float("nan"), pytest.param(10 ** 400, id="integer-beyond-a-float")])
def test_drill_report_shows_a_convergence_time_that_is_not_a_finite_number_as_absent(monkeypatch, tmp_path, conv):
    """A garbled journal line's convergence_us of Infinity (Python's json reads it) or an
    integer beyond a float's range ended the drill's report in an OverflowError traceback
    after the NIC was back; it is '-' like a missing one."""
    evs = [{"t_us": 1_000_400, "event": "nic_down", "nic": "eth0", "signal": "carrier lost"},
           {"t_us": 1_001_000, "pid": 5, "event": "failover", "comm": "1", "to_nic": "eth1", "convergence_us": conv},
           {"t_us": 4_100_000, "pid": 5, "event": "failback", "comm": "1", "to_nic": "eth0", "convergence_us": 700}]
    res = dl.analyze(_res(counters_before={"failovers": 0}, counters_after={"failovers": 1}), evs)
    monkeypatch.setattr(dl, "run_drill", lambda *a, **k: res)
    argv = ["drill", "--nic", "eth0", "--down-for", "1", "--yes", "--state-dir", str(tmp_path)]
    r = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert isinstance(r.exception, SystemExit) or r.exception is None, (r.exception, r.output)
    assert "Traceback" not in r.output, r.output
    out = " ".join(r.output.split())
    assert "│ failover │ 5 │ 1 │ eth1 │ - │ 1.0 │ - │ - │ - │" in out, out
    assert "│ 0.7 │" in out, out


@pytest.mark.parametrize("plugins", ["railover,ib", "ib,railover", "railover,,socket", "railover, ib"])
def test_launch_keeps_a_plugin_list_naming_railover_in_the_users_order(plugins):
    """NCCL 2.27+ read NCCL_NET_PLUGIN as a comma list (src/plugin/net.cc: each entry opened in
    turn; with NCCL_NET=railover only railover is used). launch refused a list naming railover
    ("selects another plugin"); it keeps it as given, saying what NCCL makes of it."""
    base = {"PATH": "/usr/bin", "NCCL_NET_PLUGIN": plugins}
    env, warnings = launch_env(base)
    assert env["NCCL_NET_PLUGIN"] == plugins and env["NCCL_NET"] == "railover"
    assert env["LD_LIBRARY_PATH"] == str(_paths.plugin_path().parent)
    (w,) = warnings
    assert "lists several plugins" in w and "older NCCL takes the whole value as one plugin name" in w, w
    assert "kept as given" in w


def test_launch_keeps_a_list_naming_the_users_build_by_path(tmp_path):
    other = tmp_path / _paths.PLUGIN_FILE
    shutil.copy(_paths.plugin_path(), other)
    env, _ = launch_env({"NCCL_NET_PLUGIN": f"{other},ib", "LD_LIBRARY_PATH": "/opt/cuda/lib64"})
    assert env["NCCL_NET_PLUGIN"] == f"{other},ib" and env["LD_LIBRARY_PATH"] == "/opt/cuda/lib64"
    with pytest.raises(LaunchConflict, match="RAILOVER_NSTREAMS='99' is not valid"):  # validated by that build
        launch_env({"NCCL_NET_PLUGIN": f"{other},ib", "RAILOVER_NSTREAMS": "99"})
    with pytest.raises(LaunchConflict, match="not a loadable railover plugin"):
        launch_env({"NCCL_NET_PLUGIN": f"{tmp_path / 'no' / _paths.PLUGIN_FILE},ib"})


@pytest.mark.parametrize("plugins,words", [
    ("foo,ib", "lists no railover plugin (entries: foo, ib)"),
    ("ib, railover", "NCCL does not trim blanks around its entries, so ' railover' opens no plugin"),
    (" railover", "NCCL does not trim blanks"),
    ("none", "loads no network plugin"),
    ("foo", "selects another plugin")])
def test_launch_names_why_a_plugin_list_opens_no_railover(plugins, words):
    with pytest.raises(LaunchConflict) as e:
        launch_env({"NCCL_NET_PLUGIN": plugins})
    assert words in str(e.value)
    env, warnings = launch_env({"NCCL_NET_PLUGIN": plugins}, force=True)
    assert env["NCCL_NET_PLUGIN"] == "railover" and words in warnings[0]


@pytest.mark.parametrize("nver", [[2, 27, 7], [2, 28, 9], None])
def test_none_loads_no_railover_on_any_nccl_release(nver):
    """NCCL_NET_PLUGIN=none: 2.28.3+ read it (any case) as no plugin (src/plugin/net.cc);
    2.27 and older look for a plugin file 'none' / libnccl-net-none.so, which loads none either.
    railover is not loaded on any release: doctor FAILs and launch refuses it whatever the
    release, and the words say what each release does with it."""
    from railover.ops import doctor as dr
    torch = {"torch": "2.9.0", "nccl": nver, "error": ""} if nver else None
    for value in ("none", "NONE"):
        (c,) = [c for c in dr.nccl_checks(dict(NCCL_NET="railover", NCCL_NET_PLUGIN=value), {}, torch, None)
                if c.what == "NCCL_NET_PLUGIN"]
        assert c.status == dr.FAIL and "loads no network plugin" in c.detail, c
        assert "NCCL 2.28+ read 'none' as no plugin; older releases look for a plugin file of that name" in c.detail
        with pytest.raises(LaunchConflict, match="loads no network plugin"):
            launch_env({"NCCL_NET_PLUGIN": value})


def test_launch_and_doctor_refuse_railover_past_the_entries_nccl_reads():
    """NCCL 2.27+ keep only the first 14 entries of an NCCL_NET_PLUGIN list (16 networks, 2 of
    them built in; src/plugin/net.cc) and drop an entry of more than 254 characters: railover
    listed 15th, or by a longer path, is never opened, and with NCCL_NET=railover init fails.
    launch kept such a list as given and doctor passed it (warning only about old releases)."""
    from railover.ops import doctor as dr
    others = [f"p{k}" for k in range(14)]
    late = ",".join(others + ["railover"])
    with pytest.raises(LaunchConflict, match="railover is entry 15: NCCL reads only the first 14"):
        launch_env({"NCCL_NET_PLUGIN": late})
    nccl = {"torch": "2.9.0", "nccl": [2, 28, 9], "error": ""}
    checks = dr.nccl_checks(dict(NCCL_NET="railover", NCCL_NET_PLUGIN=late), {}, nccl, None)
    assert [c.status for c in checks if c.what == "NCCL_NET_PLUGIN"] == [dr.FAIL], checks
    # the 14th is still read, as with an empty entry before it (it takes no place), or a long
    # entry (dropped: it takes none either)
    for ok in [",".join(others[:13] + ["railover"]), ",".join(others[:13]) + ",,railover",
               ",".join(["x" * 300] + others[:13] + ["railover"])]:
        env, warnings = launch_env({"NCCL_NET_PLUGIN": ok})
        assert env["NCCL_NET_PLUGIN"] == ok and "several plugins" in warnings[0], (ok, warnings)
    long_path = "/" + "d" * 240 + "/" + _paths.PLUGIN_FILE
    with pytest.raises(LaunchConflict, match="railover entry is 265 characters long; NCCL reads at most 254"):
        launch_env({"NCCL_NET_PLUGIN": long_path + ",ib"})
