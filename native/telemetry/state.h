// Live state for tools: each plugin process publishes its NICs, NIC pairs, comms with their
// paths, and counters to RAILOVER_STATE_DIR/railover-<pid>.json (schema: docs/OPERATIONS.md).
//
// This file owns the document's envelope and its writing: the process's identity (version,
// pid, start time, host, time of the update) and the file itself. The content comes from the
// layer that knows it (the plugin: plugin/state_file.h), through a StateSource, so telemetry
// reads nothing above it.
//
// A background thread rewrites the file atomically (temporary file + rename), at most every
// 100 ms and only when the source says something changed; the data path never touches the
// file. Files are mode 0640. A reader recognises a stale file by its pid and that process's
// start time.
#pragma once

#include <functional>
#include <string>

namespace railover {

struct Config;

// The content of the state file, called on the writer thread only.
struct StateSource {
  // True when anything changed since the previous call (the call forgets it).
  std::function<bool()> takeChanged;
  // The document's members after the process identity, without the enclosing braces:
  // `"event_log":...,"totals":{...}` (schema: docs/OPERATIONS.md).
  std::function<std::string()> renderFields;
};

// Resolves the directory (RAILOVER_STATE_DIR, else /run/railover when writable, else
// /tmp/railover-<uid>) and starts the writer over `src`. An empty RAILOVER_STATE_DIR ("")
// turns it off.
void stateStart(const Config& cfg, bool dirSet, StateSource src);
std::string statePath();  // "" when off
// Removes the file for good: the writer never writes it again (a write in progress finishes
// first; the two share a lock). Registered with atexit and at_quick_exit by stateStart, so a
// process that exits normally leaves no file. Thread-safe.
void stateRemove();

}  // namespace railover
