"""railover.sizes: the one size parser (railover-perf's grammar, native/tools/perf/util.cc
parseSize) and the one --size check, used by demo, bench, soak, the RDMA bench and the tbf
burst of the test bed's Rate fault."""
from __future__ import annotations

import pytest
import typer

from railover import demo, demo_rdma, sizes
from railover.bench import rdma as brdma
from railover.testbed import faults


@pytest.mark.parametrize("s, n", [
    ("4096", 4096), ("8B", 8), ("64K", 64 << 10), ("64kb", 64 << 10), ("1KiB", 1 << 10), ("1M", 1 << 20),
    ("1MiB", 1 << 20), ("4mb", 4 << 20), ("2G", 2 << 30), ("1GiB", 1 << 30), ("1T", 1 << 40), ("0", 0),
    (65536, 65536),
])
def test_sizes_railover_perf_accepts(s, n):
    assert sizes.parse_size(s) == n


@pytest.mark.parametrize("s", ["abc", "", "1 M", " 1M", "1M ", "-4M", "1.5M", "1iB", "1KI", "1kbit", "1P", "\u0661",
                               "99999999999T"])
def test_sizes_railover_perf_rejects_are_rejected(s):
    """Each is refused by railover-perf too: the Python check must not let one through to a run."""
    with pytest.raises(ValueError, match="bad size"):
        sizes.parse_size(s)


def test_one_parser_everywhere():
    assert faults.parse_size is sizes.parse_size and brdma.parse_size is sizes.parse_size
    assert not hasattr(demo, "parse_size") or demo.parse_size is sizes.parse_size


@pytest.mark.parametrize("size, words", [("abc", "bad size 'abc'"), ("0", "'0': the all-reduce needs at least 1 byte")])
def test_check_size_names_the_option(size, words):
    with pytest.raises(typer.BadParameter) as ei:
        sizes.check_size(size)
    assert ei.value.param_hint == "--size" and words in str(ei.value)
    with pytest.raises(typer.BadParameter, match="the burst needs at least 1 byte") as ei:
        sizes.check_size("0", option="--burst", what="the burst")
    assert ei.value.param_hint == "--burst"
    assert sizes.check_size("64K") == 65536


@pytest.mark.parametrize("size", ["1G", "1MiB", "1GiB"])   # 2T: over sizes.MAX_SIZE (ranks died of bad_alloc)
def test_demo_takes_every_size_railover_perf_takes(size):
    demo.check_args("T2", size, 0, demo.parse_faults("port-down:a0"))   # the tc-style parser refused these


@pytest.mark.parametrize("size", ["1kbit", "1 M"])
def test_demo_refuses_a_size_railover_perf_would_refuse(size):
    with pytest.raises(typer.BadParameter, match="bad size"):
        demo.check_args("T2", size, 0, demo.parse_faults("port-down:a0"))


def test_rdma_demo_checks_the_size_like_the_tcp_demo(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from railover.cli import app
    monkeypatch.setattr(demo_rdma, "run_rdma_demo", lambda *a, **k: pytest.fail("ran with a bad size"))
    r = CliRunner().invoke(app, ["demo", "--transport", "rdma", "--size", "0", "--out", str(tmp_path / "o")],
                           env={"COLUMNS": "250"})
    assert r.exit_code == 2 and "the all-reduce needs at least 1 byte" in r.output, r.output
