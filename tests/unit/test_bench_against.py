"""``railover bench healthy --against``: which plugin it takes, and the error for a path that
holds none (no test bed needed)."""
from pathlib import Path

import pytest

from railover.bench import common as C
from railover.bench import healthy


def test_against_takes_the_plugin_file_or_the_directory_holding_it(tmp_path: Path):
    so = tmp_path / "libnccl-net-railover.so"
    so.write_bytes(b"\x7fELF")
    assert healthy.against_path(tmp_path) == so.resolve()
    assert healthy.against_path(so) == so.resolve()


def test_against_without_a_plugin_names_the_path(tmp_path: Path):
    with pytest.raises(C.BenchError, match=r"--against .*empty: no libnccl-net-railover.so there"):
        healthy.against_path(tmp_path / "empty")


def test_against_is_measured_right_after_armed_in_every_round():
    names = [n for n, _ in healthy._configs(2, quick=True, nstreams=[2], against=True)]
    assert names[:2] == ["armed", healthy.AGAINST] and healthy.BASELINE in names
    assert healthy.AGAINST not in [n for n, _ in healthy._configs(2, quick=True, nstreams=[2])]
