"""Byte sizes as the tools take them (``--size 4M``, a tbf ``burst`` of ``64kb``): one
grammar, railover-perf's (``native/tools/perf/util.cc``, ``parseSize``), so that a size the
Python side accepts is one railover-perf accepts too."""
from __future__ import annotations

import re
from typing import Union

import typer

__all__ = ["parse_size", "check_size", "MAX_SIZE"]

#: The largest all-reduce size the CLI takes (1 GiB): railover-perf allocates several buffers
#: of the size on every rank and several ranks share a host, and 1 GiB is the largest message
#: its int-ABI path carries (``kIntAbiMaxMessage``, ``native/tools/perf/net.h``); a larger size
#: would reach the ranks and die there (``std::bad_alloc``) after a test bed was built.
MAX_SIZE = 1 << 30

_SIZE = re.compile(r"([0-9]+)(?:([KMGT])(?:I?B)?|B)?", re.I)
_SHIFT = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}


def parse_size(size: Union[str, int]) -> int:
    """``"4096"``, ``"64K"``, ``"1M"``, ``"1MiB"``, ``"2GB"``, ``"1T"`` -> bytes (binary
    multiples; case-insensitive; no spaces: railover-perf's grammar). An int is taken as
    bytes. ValueError names the bad value and the accepted forms."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 0:
            raise ValueError(f"bad size {size!r}: a size cannot be negative")
        return size
    m = _SIZE.fullmatch(str(size))
    if not m:
        raise ValueError(f"bad size {size!r} (bytes, or with a K, M, G or T suffix: 4096, 64K, 1M, 1MiB)")
    n = int(m.group(1)) << _SHIFT[(m.group(2) or "").upper()]
    if n >= 1 << 64:
        raise ValueError(f"bad size {size!r}: too large")
    return n


def check_size(size: str, option: str = "--size", what: str = "the all-reduce") -> int:
    """A size option checked before anything is built: its bytes (1 B..:data:`MAX_SIZE`), or
    typer.BadParameter naming ``option`` and what is wrong (``what`` needs at least 1 byte)."""
    try:
        n = parse_size(size)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=option)
    if n < 1:
        raise typer.BadParameter(f"{size!r}: {what} needs at least 1 byte", param_hint=option)
    if n > MAX_SIZE:
        raise typer.BadParameter(f"{size!r}: at most 1G (1 GiB) for {what}", param_hint=option)
    return n
