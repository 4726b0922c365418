// Live state for tools: each plugin process publishes its NICs, NIC pairs, comms with their
// paths, and counters to RAILOVER_STATE_DIR/railover-<pid>.json (schema: docs/OPERATIONS.md).
//
// A background thread rewrites the file atomically (temporary file + rename), at most every
// 100 ms and only when something changed; the data path never touches the file (links copy
// a small snapshot under their own snapshot mutex when their state changes). Files are mode
// 0640. A reader recognises a stale file by its pid and that process's start time.
#pragma once

#include <string>

namespace railover {

struct Config;

// Resolves the directory (RAILOVER_STATE_DIR, else /run/railover when writable, else
// /tmp/railover-<uid>) and starts the writer. An empty RAILOVER_STATE_DIR ("") turns it off.
void stateStart(const Config& cfg, bool dirSet);
std::string statePath();  // "" when off

}  // namespace railover
