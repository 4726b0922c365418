"""Locate the native artefacts: the plugin ``.so`` and the ``railover-perf`` driver.

``RAILOVER_NATIVE_DIR`` (a directory holding both), when set and not empty, is the only
place looked at: a directory that does not exist, cannot be read or lacks the file is an
error (:class:`NativeDirError`, naming the variable and the path), never a silent fallback
to another build. Unset: the installed package's ``_native/`` folder, then a developer
build tree (``build/`` at the repository root); FileNotFoundError names every place looked
at when nothing is found.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

PLUGIN_NAME = "railover"
PLUGIN_FILE = "libnccl-net-railover.so"
PERF_FILE = "railover-perf"

_PKG = Path(__file__).resolve().parent


class NativeFileNotFound(FileNotFoundError):
    """A native file railover needs is not found (the message names where it looked and how
    to build or install it). A FileNotFoundError, for the callers that catch that."""


class NativeDirError(NativeFileNotFound):
    """``RAILOVER_NATIVE_DIR`` is set but unusable; the message names the variable, its value
    and what is wrong."""


def _candidates() -> list[Path]:
    out = []
    out.append(_PKG / "_native")
    repo = _PKG.parent.parent
    out.append(repo / "build")
    return out


def _from_native_dir(fname: str, value: str) -> Path:
    """``fname`` in the directory ``RAILOVER_NATIVE_DIR=value``; NativeDirError saying why not."""
    d = Path(value)
    fix = ("unset RAILOVER_NATIVE_DIR to use the installed railover, or point it at a build directory holding "
           f"{PLUGIN_FILE} and {PERF_FILE}")
    if not d.exists():
        raise NativeDirError(f"RAILOVER_NATIVE_DIR={value}: no such directory; {fix}")
    if not d.is_dir():
        raise NativeDirError(f"RAILOVER_NATIVE_DIR={value}: not a directory; {fix}")
    if not os.access(d, os.R_OK | os.X_OK):
        raise NativeDirError(f"RAILOVER_NATIVE_DIR={value}: cannot read the directory (permission denied); {fix}")
    p = d.absolute() / fname  # absolute: it ends up in LD_LIBRARY_PATH and NCCL_NET_PLUGIN of other processes
    if not p.is_file():
        raise NativeDirError(f"RAILOVER_NATIVE_DIR={value} has no {fname}; {fix}")
    if not _runnable(p):
        raise NativeDirError(f"RAILOVER_NATIVE_DIR={value}: {p} is not executable; chmod +x it, or {fix}")
    return p


def _runnable(p: Path) -> bool:
    """False for the driver ``railover-perf`` when it exists but cannot be run."""
    return p.name != PERF_FILE or os.access(p, os.X_OK)


def _find(fname: str) -> Path:
    env = os.environ.get("RAILOVER_NATIVE_DIR", "")
    if env.strip(" \t"):  # an empty value is the same as unset, as for every railover variable
        return _from_native_dir(fname, env)
    tried = []
    for d in _candidates():
        p = d / fname
        tried.append(str(p))
        if p.is_file():
            if not _runnable(p):
                raise NativeFileNotFound(f"{p} is not executable; chmod +x it, or reinstall/rebuild railover")
            return p
    raise NativeFileNotFound(f"{fname} not found; looked at: {', '.join(tried)}. "
                            "Install with './scripts/install.sh' (or 'pip install .') in the source tree, or build with "
                            "'cmake -S . -B build && cmake --build build'.")


def plugin_path() -> Path:
    """Absolute path of ``libnccl-net-railover.so``."""
    return _find(PLUGIN_FILE)


def perf_path() -> Path:
    """Absolute path of the ``railover-perf`` executable."""
    return _find(PERF_FILE)


def perf_argv(args: list[str]) -> list[str]:
    """The native driver's argv for the console command ``railover-perf ARGS``: ``ARGS``
    plus ``--plugin <the installed plugin>`` when they name no plugin (and ask for no help).
    Raises FileNotFoundError when a native file is missing."""
    exe = str(perf_path())
    named = any(a == "--plugin" or a.startswith("--plugin=") for a in args)
    help_ = any(a in ("-h", "--help") for a in args)
    return [exe] + ([] if named or help_ else ["--plugin", str(plugin_path())]) + list(args)


def perf_main() -> None:
    """Console entry point ``railover-perf``: exec the native driver with the same arguments
    (and the installed plugin unless ``--plugin`` is given)."""
    try:
        argv = perf_argv(sys.argv[1:])
    except FileNotFoundError as e:
        sys.stderr.write(f"railover-perf: {e}\n")
        sys.exit(2)
    os.execv(argv[0], argv)
