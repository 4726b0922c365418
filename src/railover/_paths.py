"""Locate the native artefacts: the plugin ``.so`` and the ``railover-perf`` driver.

Search order: ``RAILOVER_NATIVE_DIR`` (a directory holding both), the installed package's
``_native/`` folder, then a developer build tree (``build/`` at the repository root).
Raises FileNotFoundError naming every place looked at when nothing is found.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

PLUGIN_NAME = "railover"
PLUGIN_FILE = "libnccl-net-railover.so"
PERF_FILE = "railover-perf"

_PKG = Path(__file__).resolve().parent


def _candidates() -> list[Path]:
    out = []
    env = os.environ.get("RAILOVER_NATIVE_DIR")
    if env:
        out.append(Path(env))
    out.append(_PKG / "_native")
    repo = _PKG.parent.parent
    out.append(repo / "build")
    return out


def _find(fname: str) -> Path:
    tried = []
    for d in _candidates():
        p = d / fname
        tried.append(str(p))
        if p.is_file():
            return p
    raise FileNotFoundError(f"{fname} not found; looked at: {', '.join(tried)}. "
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
