// JSON-lines event journal (RAILOVER_EVENT_LOG): one object per line with "t_us"
// (CLOCK_MONOTONIC µs, the test bed's clock), "pid" and "event", then event fields.
// Events: nic_down, nic_up, path_down, path_up, failover, failback, flap, fatal, connect.
//
// Thread-safety: append() may be called from any thread; lines are written whole with one
// write(2) on an O_APPEND descriptor, so several processes may share a file.
#pragma once

#include <string>

namespace railover {

// Opens the journal (path with "%p" replaced by the pid; a directory gets
// railover-<pid>.jsonl inside). Empty path = journal off.
void journalOpen(const std::string& path);
bool journalEnabled();
// `fields` is a JSON fragment without braces, e.g. "\"nic\":\"eth0\",\"cause\":\"carrier\"".
void journalAppend(const char* event, const std::string& fields);
std::string jsonStr(const std::string& s);  // quoted, escaped JSON string

}  // namespace railover
