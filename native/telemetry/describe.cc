#include "telemetry/describe.h"

#include <cstring>

#include "common/config.h"
#include "common/params.h"
#include "telemetry/events.h"
#include "telemetry/journal.h"

namespace railover {
namespace {

const char* typeName(ParamType t) {
  switch (t) {
    case ParamType::kUint: return "uint";
    case ParamType::kIfnameList: return "ifname_list";
    case ParamType::kFamily: return "family";
    case ParamType::kStandby: return "standby";
    case ParamType::kRails: return "rails";
    case ParamType::kPath: return "path";
    case ParamType::kStateDir: return "state_dir";
    case ParamType::kNcclOwned: return "nccl_owned";
    case ParamType::kFlag: return "flag";
    case ParamType::kTransport: return "transport";
    case ParamType::kHcaList: return "hca_list";
    case ParamType::kGidIndex: return "gid_index";
    case ParamType::kCidr: return "cidr";
  }
  return "?";
}

std::string readers(unsigned r) {
  std::string o = "[";
  const std::pair<unsigned, const char*> names[] = {
      {kReadPlugin, "plugin"}, {kReadPerf, "railover-perf"}, {kReadTools, "tools"}, {kReadTests, "tests"}};
  for (auto& n : names)
    if (r & n.first) o += (o.size() > 1 ? "," : "") + jsonStr(n.second);
  return o + "]";
}

std::string kv(const char* k, const std::string& v) { return jsonStr(k) + ":" + jsonStr(v); }

}  // namespace

const char* eventFieldJsonType(const char* t) {
  if (!strcmp(t, "Str")) return "string";
  if (!strcmp(t, "U64")) return "integer";
  if (!strcmp(t, "Bool")) return "boolean";
  if (!strcmp(t, "Comm")) return "comm";
  if (!strcmp(t, "OptU64")) return "integer?";
  return "?";
}

std::string describeJson() {
  std::string o = "{\"version\":1,";
  o += kv("empty_values", "Empty values: a variable set to an empty (or blank) value is the same as an unset one, "
                          "for every variable: its default applies. Turning something off is spelled out: "
                          "RAILOVER_STATE_DIR=off, RAILOVER_STANDBY=none.") + ",\"params\":[";
  for (size_t i = 0; i < kParamCount; ++i) {
    const ParamSpec& p = kParams[i];
    o += i ? "," : "";
    o += "{" + kv("name", p.name) + "," + kv("type", typeName(p.type)) + ",\"readers\":" + readers(p.readers) + "," +
         kv("default", p.defaultText) + "," + kv("unit", p.unit) + "," +
         kv("range", p.type == ParamType::kUint ? paramRangeText(p) : p.accepted) + "," + kv("accepted", p.accepted) +
         "," + kv("example", p.example) + "," + kv("meaning", p.meaning);
    if (p.type == ParamType::kUint)
      o += ",\"lo\":" + std::to_string(p.lo) + ",\"hi\":" + std::to_string(p.hi) + ",\"step\":" +
           std::to_string(p.step) + ",\"default_value\":" + std::to_string(p.def);
    o += "}";
  }
  o += "],\"journal\":{\"common_fields\":[";
  o += "{" + kv("name", "t_us") + "," + kv("type", "integer") + "," +
       kv("meaning", "CLOCK_MONOTONIC µs (the same clock for every process of a host)") + "},";
  o += "{" + kv("name", "pid") + "," + kv("type", "integer") + "," + kv("meaning", "the writing process") + "},";
  o += "{" + kv("name", "event") + "," + kv("type", "string") + "," + kv("meaning", "the event's name") + "}";
  o += "],\"events\":[";
  for (size_t i = 0; i < kEventCount; ++i) {
    const EventSpec& e = kEvents[i];
    o += i ? "," : "";
    o += "{" + kv("name", e.name) + "," + kv("meaning", e.meaning) + ",\"fields\":[";
    for (size_t j = 0; j < e.nFields; ++j)
      o += std::string(j ? "," : "") + "{" + kv("name", e.fields[j].name) + "," +
           kv("type", eventFieldJsonType(e.fields[j].type)) + "," + kv("meaning", e.fields[j].meaning) + "}";
    o += "]}";
  }
  return o + "]}}";
}

}  // namespace railover
