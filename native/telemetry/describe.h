// railover's self-description as JSON: the parameter table (common/params.h) and the journal's
// events (telemetry/events.h). The plugin exports it as railover_describe_json (abi/describe.cc)
// for the Python tools; its shape:
//   {"version": 1, "empty_values": "<the rule for empty values>",
//    "params": [{"name", "type", "readers": [...], "default", "unit", "range", "accepted",
//                "example", "meaning", and for "uint" also "lo", "hi", "step", "default_value"}],
//    "journal": {"common_fields": [{"name", "type", "meaning"}],
//                "events": [{"name", "meaning", "fields": [{"name", "type", "meaning"}]}]}}
// Field types of journal events: "string", "integer", "boolean", "comm" (a decimal string),
// "integer?" (an integer that may be absent).
//
// Thread-safety: pure.
#pragma once

#include <string>

namespace railover {

std::string describeJson();

// JSON type name of a field type of events.h (Str -> "string", ...).
const char* eventFieldJsonType(const char* type);

}  // namespace railover
