"""System prerequisites: the programs railover's commands run and the Debian 12 packages that
provide them. This file is the one list: ``scripts/install.sh`` installs :data:`PACKAGES`
(it runs this file with the system ``python3`` before the package is installed, so it uses
the standard library only), ``railover demo`` checks its tools before it builds anything,
and ``railover doctor`` reports every missing one with the package to install (or the
directory to add to PATH, for one installed off it).

Run as a script: ``python3 prereqs.py --packages run build [test]`` prints the Debian
packages of those groups, one per line.
"""
from __future__ import annotations

import os
import shutil
import sys
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

#: Debian packages per purpose. ``python``: an interpreter with pip and venv (Debian splits
#: them out); ``run``: the test bed, faults and benchmarks (``ip``, ``nft``, ``iperf3``,
#: ``taskset``/``ps``); ``build``: compiling the plugin and railover-perf when pip builds the
#: package; ``rdma``: the RDMA test bed (``railover testbed up --rdma``: QEMU guests with
#: Soft-RoCE; libibverbs-dev builds railover-verbs-probe, so it must be installed before pip
#: builds the package; the guest image itself is built from apt-get download at first use);
#: ``test``: the C++ unit tests (GoogleTest), the plugin checks (``nm``, ``readelf``) and clang
#: with its libFuzzer/sanitizer runtimes for the fuzz targets (docs/RELIABILITY.md).
PACKAGES: Dict[str, List[str]] = {
    "python": ["python3", "python3-pip", "python3-venv"],
    "run": ["iproute2", "nftables", "iperf3", "util-linux", "procps"],
    "build": ["build-essential", "cmake", "ninja-build"],
    "rdma": ["qemu-system-x86", "libibverbs-dev", "ibverbs-providers", "cpio", "kmod", "dpkg"],
    "test": ["libgtest-dev", "binutils", "clang", "llvm", "libclang-rt-14-dev"],
}

#: program -> (Debian package, what railover uses it for). Queueing disciplines (rate
#: limits) are set through netlink (pyroute2), so ``tc`` is not needed.
TOOLS: Dict[str, Tuple[str, str]] = {
    "ip": ("iproute2", "network namespaces of the test bed (ip netns exec)"),
    "nft": ("nftables", "silent black-hole, loss and one-way faults"),
    "iperf3": ("iperf3", "the TCP reference of railover bench"),
    "taskset": ("util-linux", "CPU pinning in railover bench"),
    "cmake": ("cmake", "building the plugin"),
    "c++": ("build-essential", "compiling the plugin"),
}


#: Where Debian installs administration programs (``ip``, ``nft``): on root's PATH, not on a
#: non-root login's. A program there but not on PATH is installed, only out of reach.
SYSTEM_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


class MissingTools(RuntimeError):
    """Programs a command needs are not on PATH; the message names each one with its fix: the
    ``apt-get install`` line for those not installed, the directory to add to PATH for those
    installed in a :data:`SYSTEM_DIRS` directory that PATH lacks."""

    def __init__(self, missing: Sequence[str], what: str, path: Optional[str] = None):
        self.missing = list(missing)
        off = {t: off_path(t, path) for t in self.missing}
        absent = [t for t in self.missing if off[t] is None]
        msg = f"{what} needs {', '.join(self.missing)}, not on PATH here: " + "; ".join(hint(t, off[t]) for t in self.missing)
        if absent:
            msg += f". Install everything at once with: {install_line(absent)} (or ./scripts/install.sh in the source tree)"
        super().__init__(msg)


def off_path(tool: str, path: Optional[str] = None) -> Optional[str]:
    """Where ``tool`` is installed in a :data:`SYSTEM_DIRS` directory that ``path`` (default
    $PATH) does not list; None when it is not there (or PATH lists that directory)."""
    listed = (os.environ.get("PATH", "") if path is None else path).split(os.pathsep)
    for d in SYSTEM_DIRS:
        if d not in listed:
            where = shutil.which(tool, path=d)
            if where:
                return where
    return None


def found_off_path(tools: Iterable[str] = tuple(TOOLS), path: Optional[str] = None) -> Dict[str, str]:
    """``{program: where}`` for those of ``tools`` missing on ``path`` but installed off it
    (:func:`off_path`)."""
    return {t: where for t in tools if _which(t, path) is None and (where := off_path(t, path))}


def path_fix(where: str) -> str:
    """The command that puts the directory of ``where`` (a program found by :func:`off_path`) on PATH."""
    return f'export PATH="$PATH:{os.path.dirname(where)}"'


def hint(tool: str, off: Optional[str] = None) -> str:
    """``"nft not found: apt-get install nftables"``; for a program installed off PATH at
    ``off`` (:func:`off_path`), ``"nft is installed in /usr/sbin, which PATH lacks: export
    PATH=... (or run as root)"``."""
    if off:
        return f"{tool} is installed in {os.path.dirname(off)}, which PATH lacks: {path_fix(off)} (or run as root)"
    pkg = TOOLS[tool][0] if tool in TOOLS else tool
    return f"{tool} not found: apt-get install {pkg}"


def install_line(tools: Iterable[str]) -> str:
    """One ``apt-get install`` command for the packages of ``tools`` (order kept, no repeats)."""
    pkgs: List[str] = []
    for t in tools:
        p = TOOLS[t][0] if t in TOOLS else t
        if p not in pkgs:
            pkgs.append(p)
    return "apt-get install " + " ".join(pkgs)


def missing(tools: Iterable[str], path: Optional[str] = None) -> List[str]:
    """The programs of ``tools`` not found on ``path`` (default: $PATH, which the commands
    run them from; Debian puts ``ip`` and ``nft`` in /usr/sbin, on root's PATH)."""
    return [t for t in tools if _which(t, path) is None]


def _which(tool: str, path: Optional[str]) -> Optional[str]:
    return shutil.which(tool, path=path)


def require(tools: Sequence[str], what: str, path: Optional[str] = None) -> None:
    """Raise :class:`MissingTools` naming every program of ``tools`` that is missing."""
    gone = missing(tools, path)
    if gone:
        raise MissingTools(gone, what, path)


def found(tools: Iterable[str] = tuple(TOOLS), path: Optional[str] = None) -> Dict[str, Optional[str]]:
    """``{program: its path, or None when missing}`` for ``tools``."""
    return {t: _which(t, path) for t in tools}


def packages(groups: Sequence[str]) -> List[str]:
    """The Debian packages of ``groups`` (keys of :data:`PACKAGES`), in order, no repeats.
    Raises KeyError naming an unknown group."""
    out: List[str] = []
    for g in groups:
        if g not in PACKAGES:
            raise KeyError(f"unknown package group {g!r} (known: {', '.join(PACKAGES)})")
        out += [p for p in PACKAGES[g] if p not in out]
    return out


def doctor_rows(tools: Mapping[str, Optional[str]],
                off: Optional[Mapping[str, str]] = None) -> List[Tuple[str, str, str, str]]:
    """``(program, status, finding, fix)`` rows for ``railover doctor`` from ``tools`` (as
    :func:`found`) and ``off`` (as :func:`found_off_path`): OK when found; WARN when missing (a
    job needs none of them: they serve the test bed, demo, bench and the build), with the
    package to install, or the directory to add to PATH where it is installed off PATH."""
    rows = []
    off = off or {}
    for t, where in tools.items():
        pkg, use = TOOLS.get(t, (t, ""))
        if where:
            rows.append((t, "OK", f"{t}: {where}", ""))
        else:
            rows.append((t, "WARN", f"{hint(t, off.get(t))} (needed for {use})",
                         path_fix(off[t]) if off.get(t) else f"apt-get install {pkg}"))
    return rows


def main(argv: Sequence[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--packages":
        try:
            print("\n".join(packages(argv[1:])))
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 2
        return 0
    print("usage: prereqs.py --packages GROUP [GROUP...]   (groups: " + ", ".join(PACKAGES) + ")", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
