"""The parameter table (native/common/params.h) as the Python tools read it from the plugin:
it declares every variable railover reads, `railover env --list` prints it, doctor validates
with it, and the README's configuration table is its rendering."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from railover import params
from railover.cli import app
from railover.ops import doctor as dr

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def table():
    return params.params()


def _read_in_sources():
    """Variable names the code reads: getenv("X") in native/, and every RAILOVER_* string
    literal in src/ and the test suite's conftest files."""
    names = {}
    for f in (ROOT / "native").rglob("*"):
        if f.suffix in (".cc", ".h"):
            for m in re.finditer(r'getenv\("([A-Z0-9_]+)"\)', f.read_text()):
                names.setdefault(m.group(1), str(f.relative_to(ROOT)))
    for f in list((ROOT / "src").rglob("*.py")) + list((ROOT / "tests").rglob("conftest.py")):
        for m in re.finditer(r'["\'](RAILOVER_[A-Z0-9_]*[A-Z0-9])["\']', f.read_text()):
            names.setdefault(m.group(1), str(f.relative_to(ROOT)))
    return names


def test_every_variable_read_is_declared(table):
    declared = {p["name"] for p in table}
    read = _read_in_sources()
    assert read, "the scan found nothing: the patterns are wrong"
    missing = {n: f for n, f in read.items() if n not in declared}
    assert not missing, f"read but not declared in native/common/params.h: {missing}"


def test_entries_are_complete(table):
    names = [p["name"] for p in table]
    assert len(names) == len(set(names))
    for p in table:
        assert p["meaning"] and p["default"] and p["example"] and p["readers"], p
        if p["type"] == "uint":
            assert p["lo"] <= p["default_value"] <= p["hi"] and p["default_value"] % p["step"] == 0, p
            assert p["range"].startswith(f"{p['lo']}..{p['hi']}"), p
            assert str(p["default_value"]) == p["default"], p


def test_readme_table_is_the_rendered_table():
    d = params.describe()
    text = (ROOT / "README.md").read_text()
    want = params.replace_block(text, params.README_BEGIN, params.README_END,
                                params.render_markdown(d["params"], d["empty_values"]))
    assert text == want, ("README.md's configuration table differs from the plugin's parameter table; "
                          "run: PYTHONPATH=src RAILOVER_NATIVE_DIR=build python3 scripts/update_docs.py")


def test_native_check_is_the_plugin_parser(table):
    n = params.load()
    assert n.check("RAILOVER_NSTREAMS", "4") is None
    assert n.check("RAILOVER_NSTREAMS", "") is None          # empty = unset
    assert n.check("RAILOVER_NSTREAMS", "17") == "RAILOVER_NSTREAMS='17' is not valid: expected an integer 1..16 streams"
    assert "multiple of 128" in n.check("RAILOVER_MIN_CHUNK_BYTES", "1000")
    assert "not a railover variable" in n.check("RAILOVER_NOPE", "1")
    assert n.check("RAILOVER_STATE_DIR", "off") is None


def test_doctor_checks_come_from_the_table(table):
    assert dr.known_vars() == {p["name"] for p in table}
    for p in table:
        if "plugin" not in p["readers"]:
            continue
        var = p["name"]
        ok = dr.validate_config({var: p["example"]})
        assert not [c for c in ok if c.status == dr.FAIL], (var, ok)
        if p["type"] == "uint":
            bad = [c for c in dr.validate_config({var: str(p["hi"] + 1)}) if c.status == dr.FAIL]
            assert len(bad) == 1 and bad[0].what == var and p["range"] in bad[0].detail, (var, bad)
        elif p["type"] in ("ifname_list", "family", "standby", "rails"):
            bad = [c for c in dr.validate_config({var: "a b=c;d"}) if c.status == dr.FAIL]
            assert len(bad) == 1 and bad[0].detail.startswith(f"{var}='a b=c;d' is not valid"), (var, bad)


MISMATCH = {"NCCL_IB_ADDR_RANGE": "10.0.0.0/8", "NCCL_IB_ADDR_FAMILY": "AF_INET6"}
MISMATCH_WORDS = "it is an IPv4 range but NCCL_IB_ADDR_FAMILY is AF_INET6"


def test_a_rule_between_variables_is_refused_as_init_refuses_it(table):
    """NCCL_IB_ADDR_RANGE=10.0.0.0/8 with NCCL_IB_ADDR_FAMILY=AF_INET6: each value is valid
    alone, but the plugin's init refuses them together (and NCCL init fails, whatever the
    transport). doctor said ok (exit 0), launch ran the command and the demo built its bed:
    they checked each variable alone."""
    n = params.load()
    assert MISMATCH_WORDS in n.check_config(MISMATCH)
    assert n.check_config({"NCCL_IB_ADDR_RANGE": "10.0.0.0/8"}) is None
    assert n.check_config({}) is None
    bad = params.refused(MISMATCH)
    assert list(bad) == ["NCCL_IB_ADDR_RANGE"] and MISMATCH_WORDS in bad["NCCL_IB_ADDR_RANGE"], bad
    both = params.refused(dict(MISMATCH, RAILOVER_NSTREAMS="99"))   # a bad value does not hide the rule
    assert list(both) == ["RAILOVER_NSTREAMS", "NCCL_IB_ADDR_RANGE"], both
    fails = [c for c in dr.validate_config(MISMATCH) if c.status == dr.FAIL]
    assert [c.what for c in fails] == ["NCCL_IB_ADDR_RANGE"] and MISMATCH_WORDS in fails[0].detail, fails
    from railover.ops.cli import LaunchConflict, launch_env
    with pytest.raises(LaunchConflict, match=MISMATCH_WORDS):
        launch_env(MISMATCH)
    env, warnings = launch_env(MISMATCH, force=True)
    assert "NCCL_IB_ADDR_RANGE" not in env and params.refused(env) == {}, env
    from railover import demo
    with pytest.raises(ValueError, match=MISMATCH_WORDS):
        demo.check_env(MISMATCH)


def test_doctor_without_the_plugin_says_config_was_not_checked(monkeypatch):
    def boom(*a, **k):
        raise FileNotFoundError("libnccl-net-railover.so not found")
    monkeypatch.setattr(params, "load", boom)
    (c,) = dr.validate_config({"RAILOVER_NSTREAMS": "99"})
    assert c.status == dr.WARN and "not checked" in c.detail and "not found" in c.detail


def test_env_list_plain_and_json(table):
    r = CliRunner().invoke(app, ["env", "--list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for p in table:
        assert p["name"] in r.output
    assert "Empty values" in r.output
    r = CliRunner().invoke(app, ["env", "--list", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [p["name"] for p in d["params"]] == [p["name"] for p in table] and "journal" not in d
    r = CliRunner().invoke(app, ["env", "--events", "--json"])
    assert r.exit_code == 0 and "failover" in [e["name"] for e in json.loads(r.output)["journal"]["events"]]
    r = CliRunner().invoke(app, ["env", "--json"])
    assert r.exit_code == 2 and "--list" in r.output


@pytest.mark.parametrize("columns", [40, 60, 79, 80, 100, 200])
def test_env_list_wraps_and_never_truncates(table, columns):
    """At 80 columns rich used to cut names and values short ("(unse…", "RAILOVER_IFN…"), and
    at 40 the table left 4 columns to the text ("defa", "ult:"): every word of every
    variable's name, default, accepted values and meaning, and of the empty-value rule, must
    be in the output whole, on lines no wider than the terminal; narrower than 80 columns,
    each variable is a block that starts with its name on a line of its own."""
    r = CliRunner().invoke(app, ["env", "--list"], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= columns
    assert "\u2026" not in r.output
    words = set(r.output.split())
    d = params.describe()
    for p in table:
        for field in (p["name"], p["default"], p["range"], p["meaning"]):
            missing = [w for w in field.split() if w not in words]
            assert not missing, (p["name"], missing)
    assert not [w for w in d["empty_values"].split() if w not in words]
    if columns < params.TABLE_MIN:
        assert [p["name"] for p in table] == [line for line in lines if line in {p["name"] for p in table}]


def test_env_list_without_plugin_is_a_clear_error(monkeypatch):
    def boom(*a, **k):
        raise FileNotFoundError("libnccl-net-railover.so not found; looked at: /x")
    monkeypatch.setattr(params, "describe", boom)
    r = CliRunner().invoke(app, ["env", "--list"])
    assert r.exit_code == 2 and "cannot read railover's parameter table" in r.output and "Traceback" not in r.output


def test_table_reads_from_an_installed_package_layout(tmp_path):
    # A wheel installs the package with the plugin in railover/_native/ and no build tree:
    # copy that layout and read the table without RAILOVER_NATIVE_DIR, from another directory.
    import os
    import shutil
    import subprocess
    import sys
    from railover import _paths
    pkg = tmp_path / "site" / "railover"
    shutil.copytree(ROOT / "src" / "railover", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "_native").mkdir()
    shutil.copy2(_paths.plugin_path(), pkg / "_native" / _paths.PLUGIN_FILE)
    env = {k: v for k, v in os.environ.items() if k not in ("RAILOVER_NATIVE_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tmp_path / "site")
    code = ("from railover import params, _paths; print(_paths.plugin_path()); "
            "print(len(params.params()), params.check('RAILOVER_NSTREAMS', '0'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    where, line = r.stdout.splitlines()
    assert where == str(pkg / "_native" / _paths.PLUGIN_FILE)
    assert line.startswith(f"{len(params.params())} RAILOVER_NSTREAMS='0' is not valid")


def test_env_list_at_columns_0_uses_the_default_width(table):
    """COLUMNS=0 used to print nothing (a table 0 columns wide), exit 0."""
    r = CliRunner().invoke(app, ["env", "--list"], env={"COLUMNS": "0"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines and max(len(line.rstrip()) for line in lines) <= 80
    for p in table:
        assert p["name"] in r.output


def test_env_list_narrow_accepted_values_wrap_under_their_label(table):
    """At 40 columns the continuation lines of "accepted:" were indented as the meaning under
    them (2 columns), so the two ran together; they now wrap right of the label."""
    r = CliRunner().invoke(app, ["env", "--list"], env={"COLUMNS": "40"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    wrapped = 0
    for i, line in enumerate(lines):
        if line.startswith("  accepted: "):
            col = len("  accepted: ")
            j = i + 1
            # the accepted value's continuation lines, up to the meaning (indented 2)
            while j < len(lines) and lines[j].startswith(" " * col) and lines[j].strip():
                j += 1
                wrapped += 1
            assert j < len(lines) and lines[j].startswith("  ") and not lines[j].startswith("   "), lines[i:j + 1]
    assert wrapped, r.output   # some accepted values do wrap at 40 columns


def test_a_library_that_is_no_net_plugin_is_not_called_an_old_railover_build(tmp_path):
    """`doctor --plugin .../libz.so.1` said the file was a railover build from before the
    parameter table; it is no NCCL net plugin at all."""
    import shutil
    from pathlib import Path
    from railover import _paths, params as P
    libz = next(p for p in (Path("/lib/x86_64-linux-gnu/libz.so.1"), Path("/usr/lib/x86_64-linux-gnu/libz.so.1"),
                            Path("/lib64/libz.so.1")) if p.exists())
    so = Path(shutil.copy(libz, tmp_path / "libz-copy.so"))
    with pytest.raises(OSError, match=r"is no NCCL net plugin \(it exports no ncclNetPlugin_v7 .. _v12\)"):
        P.Native(so)
    assert P.net_plugin_problem(so).endswith("exports no NCCL net plugin (ncclNetPlugin_v7 .. _v12)")
    assert P.net_plugin_problem(_paths.plugin_path()) is None
    # the baseline plugin (a net plugin that is not railover) is told apart from a non-plugin
    base = _paths.plugin_path().parent / "libnccl-net-baseline.so"
    if base.exists():
        with pytest.raises(OSError, match=r"another NCCL net plugin"):
            P.Native(base)
