// JSON-lines event journal (RAILOVER_EVENT_LOG): one object per line with "t_us"
// (CLOCK_MONOTONIC µs, the test bed's clock), "pid" and "event", then the event's fields.
// The events and their fields are declared in telemetry/events.h; lines are written only
// through the typed emitters declared there (journal::failover(...), ...).
//
// Thread-safety: the emitters may be called from any thread; lines are written whole with one
// write(2) on an O_APPEND descriptor, so several processes may share a file.
#pragma once

#include <string>

#include "telemetry/events.h"

namespace railover {

// Opens the journal (path with "%p" replaced by the pid; a directory gets
// railover-<pid>.jsonl inside). Empty path = journal off. Only the first successful open
// counts (the journal is per process).
void journalOpen(const std::string& path);
bool journalEnabled();
// Closes the journal so that a later journalOpen takes effect. For tests only: not safe
// while other threads emit.
void journalCloseForTest();
std::string jsonStr(const std::string& s);  // quoted, escaped JSON string

}  // namespace railover
