"""The environment NCCL needs to load railover, shared by ``env``, ``launch`` and the test bed."""
from __future__ import annotations

import os
import shlex

from railover import _paths


def nccl_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Variables that make stock NCCL load railover and fail loudly if it cannot.

    ``NCCL_NET_PLUGIN=railover`` + the plugin's directory on ``LD_LIBRARY_PATH`` is the
    spelling every NCCL from 2.19 to 2.32 resolves (an absolute path fails on 2.19-2.20 and 2.27.3).
    ``NCCL_NET=railover`` turns a load failure into an error instead of a silent fallback to
    NCCL's own transports. ``NCCL_NET_PLUGIN_REF_COUNT=1`` works around NCCL 2.28/2.29 losing
    the plugin name after the last communicator is destroyed (NCCL issue 1978).
    Raises FileNotFoundError when the plugin is not built/installed.
    """
    base = dict(os.environ if base is None else base)
    libdir = str(_paths.plugin_path().parent)
    ld = base.get("LD_LIBRARY_PATH", "")
    # the user's entries as given, empty ones included (an empty entry is the current directory),
    # after the plugin's directory: the loader takes the first directory holding the file, so an
    # entry of ours further back would lose to another build in front of it (the later copy of
    # ours is left in place, harmless)
    parts = ld.split(":") if ld else []
    if not parts or parts[0] != libdir:
        parts.insert(0, libdir)
    return {
        "NCCL_NET_PLUGIN": _paths.PLUGIN_NAME,
        "NCCL_NET": _paths.PLUGIN_NAME,
        "LD_LIBRARY_PATH": ":".join(parts),
        "NCCL_NET_PLUGIN_REF_COUNT": "1",
    }


def render_shell(env: dict[str, str]) -> str:
    """``export K=V`` lines, shell-quoted."""
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
