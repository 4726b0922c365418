"""The native code's layers depend on each other in one direction only (docs/DESIGN.md, "Layers
as built"): every ``#include "..."`` in ``native/`` names a header of the includer's own layer
or of a layer below it. ``native/tools``, ``native/tests`` and ``native/fuzz`` sit outside the
layers (test harnesses and separate programs) and may include anything.

Run directly (``python3 tests/unit/test_native_layers.py [NATIVE_DIR]``) it prints each
violation and exits 1; CTest runs it that way too (``native_layers``)."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"

# Top to bottom. A layer may include its own headers and those of every layer after it.
LAYERS = ["abi", "plugin", "failover", "transport", "health", "telemetry", "common"]
# Our own declarations of NCCL's net ABI types (no code, nothing of railover included): below
# every layer, so the logger's type (common/log.h) and ncclResult_t (the engine) come from one
# place. Every other file of native/abi is the top layer (the ABI adapters).
ABI_DECLARATIONS = "abi/nccl_net_abi.h"
BOTTOM = "NCCL ABI declarations"
EXEMPT = {"tools", "tests", "fuzz"}
SOURCE_SUFFIXES = {".h", ".hh", ".hpp", ".cc", ".cpp", ".c", ".inc"}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def layer_of(rel: str) -> Optional[str]:
    """Layer of a path relative to native/ ("health/health.cc"); None for an unknown folder."""
    if rel == ABI_DECLARATIONS:
        return BOTTOM
    top = rel.split("/", 1)[0]
    return top if top in LAYERS else None


def rank(layer: str) -> int:
    """Higher is lower in the stack."""
    return len(LAYERS) if layer == BOTTOM else LAYERS.index(layer)


def violations(native: Path) -> List[str]:
    """Every include in `native` that goes up the stack (or leaves it), one line each."""
    out: List[str] = []
    for path in sorted(native.rglob("*")):
        if not path.is_file() or path.suffix not in SOURCE_SUFFIXES:
            continue
        rel = path.relative_to(native).as_posix()
        if rel.split("/", 1)[0] in EXEMPT:
            continue
        mine = layer_of(rel)
        if mine is None:
            out.append(f"{rel}: folder {rel.split('/', 1)[0]}/ is in no layer (add it to LAYERS and docs/DESIGN.md)")
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            target = inc
            if inc.startswith(".") or ("/" not in inc and (path.parent / inc).exists()):
                # relative to the includer's folder
                try:
                    target = (path.parent / inc).resolve().relative_to(native.resolve()).as_posix()
                except ValueError:
                    target = inc  # outside native/: in no layer
            if mine == BOTTOM:
                out.append(f"{rel}:{no}: includes \"{inc}\": the NCCL ABI declarations include nothing of railover")
                continue
            theirs = layer_of(target)
            if theirs is None:
                out.append(f"{rel}:{no}: includes \"{inc}\", which is in no layer")
            elif rank(theirs) < rank(mine):
                out.append(f"{rel}:{no}: {mine} includes \"{inc}\" of {theirs}, a layer above it")
    return out


def test_no_layer_includes_a_layer_above_it():
    found = violations(NATIVE)
    assert not found, "includes against the layer order " + " > ".join(LAYERS) + ":\n" + "\n".join(found)


def test_the_checker_finds_each_kind_of_violation(tmp_path):
    files = {
        "common/log.h": '#include "abi/nccl_net_abi.h"\n',                # allowed: the declarations
        "abi/nccl_net_abi.h": "#include <cstdint>\n",
        "abi/adapters.cc": '#include "plugin/api.h"\n#include "common/log.h"\n',
        "plugin/api.h": "",
        "health/health.cc": '#include "health/health.h"\n#include "telemetry/journal.h"\n'
                            '  #  include "transport/tcp/wire.h"\n',              # up: transport
        "health/health.h": "",
        "health/probe.cc": '#include "probe.h"\n#include "../plugin/api.h"\n',     # relative, up: plugin
        "health/probe.h": "",
        "telemetry/journal.h": '#include "common/log.h"\n',
        "transport/tcp/wire.h": "",
        "common/nic.cc": '#include "tests/fake.h"\n',                            # into an exempt folder
        "extra/x.cc": "",                                                         # folder in no layer
        "tests/fake.h": '#include "abi/adapters.cc"\n',                           # exempt
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = violations(tmp_path)
    assert found == [
        'common/nic.cc:1: includes "tests/fake.h", which is in no layer',
        "extra/x.cc: folder extra/ is in no layer (add it to LAYERS and docs/DESIGN.md)",
        'health/health.cc:3: health includes "transport/tcp/wire.h" of transport, a layer above it',
        'health/probe.cc:2: health includes "../plugin/api.h" of plugin, a layer above it',
    ], found
    (tmp_path / "abi/nccl_net_abi.h").write_text('#include "common/log.h"\n')
    assert 'abi/nccl_net_abi.h:1: includes "common/log.h": the NCCL ABI declarations include nothing of railover' \
        in violations(tmp_path)


def test_design_states_the_same_order():
    # docs/DESIGN.md's sentence on the direction of dependencies names the folders top to bottom.
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    paragraphs = [" ".join(p.split()) for p in design.split("\n\n")]
    para = next((p for p in paragraphs if p.startswith("Dependencies go one way")), None)
    assert para is not None, "docs/DESIGN.md lost its 'Dependencies go one way' paragraph"
    order = para.split(". ", 1)[0]  # the first sentence names the layers in order
    stated = re.findall(r"`native/(\w+)`", order)
    assert stated == LAYERS, stated
    assert f"`native/{ABI_DECLARATIONS}`" in design


if __name__ == "__main__":
    native = Path(sys.argv[1]) if len(sys.argv) > 1 else NATIVE
    bad = violations(native)
    for v in bad:
        print(v)
    print(f"{len(bad)} include(s) against the layer order " + " > ".join(LAYERS))
    sys.exit(1 if bad else 0)
