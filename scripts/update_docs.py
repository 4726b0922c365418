#!/usr/bin/env python3
"""Regenerate the blocks of README.md (configuration table) and docs/OPERATIONS.md (journal
events) from the plugin's own declarations (railover_describe_json of the built plugin).

    PYTHONPATH=src RAILOVER_NATIVE_DIR=build python3 scripts/update_docs.py

tests/unit/test_params.py fails while the documents differ from what this writes."""
from __future__ import annotations

import sys
from pathlib import Path

from railover import params

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    d = params.describe()
    for path, begin, end, body in (
            (ROOT / "README.md", params.README_BEGIN, params.README_END,
             params.render_markdown(d["params"], d["empty_values"])),
            (ROOT / "docs" / "OPERATIONS.md", params.EVENTS_BEGIN, params.EVENTS_END, params.render_events_markdown(d))):
        text = path.read_text()
        new = params.replace_block(text, begin, end, body)
        if new != text:
            path.write_text(new)
            print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
