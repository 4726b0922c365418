// railover's configuration: every variable of the parameter table (common/params.h) that the
// plugin reads, parsed strictly. A bad value is an error whose message names the variable; init() then
// fails so that NCCL_NET=railover makes it fatal instead of a silent fallback.
//
// Thread-safety: parseConfig is pure; the process-wide Config is written once at init.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/params.h"

namespace railover {

// Returns the value of an environment variable, or nullptr when unset (tests inject fakes).
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup processEnv();

enum class StandbyPolicy { kAll, kNone, kExplicit };
// RAILOVER_TRANSPORT. kAuto resolves at init (plugin/runtime.cc) to kRdma or kTcp.
enum class TransportKind { kAuto, kTcp, kRdma };
const char* transportName(TransportKind t);  // "auto", "tcp", "rdma"

// Field defaults come from the parameter table (common/params.h), checked at compile time.
struct Config {
  std::string ifnames;           // RAILOVER_IFNAMES, else NCCL_SOCKET_IFNAME ("" = automatic)
  std::string ifnamesVar;        // which variable `ifnames` came from (for messages)
  int family = 0;                // NCCL_SOCKET_FAMILY: 0 any, AF_INET, AF_INET6
  TransportKind transport = TransportKind::kAuto;  // RAILOVER_TRANSPORT
  int nStreams = (int)RO_PARAM_DEFAULT("RAILOVER_NSTREAMS");  // TCP streams per path
  uint64_t minChunkBytes = RO_PARAM_DEFAULT("RAILOVER_MIN_CHUNK_BYTES");  // smallest striped chunk, bytes
  uint64_t maxChunkBytes = 1 << 20;    // largest chunk on the wire (frame length bound), bytes
  StandbyPolicy standby = StandbyPolicy::kAll;  // RAILOVER_STANDBY
  std::vector<std::pair<std::string, std::string>> standbyPairs;  // explicit "a=b" pairs
  std::vector<std::pair<std::string, int>> rails;  // RAILOVER_RAILS "if=rail,..." (empty = interface order)
  uint32_t holdDownMs = RO_PARAM_DEFAULT("RAILOVER_HOLD_DOWN_MS");         // healthy time before failback, ms
  uint32_t holdDownMaxMs = RO_PARAM_DEFAULT("RAILOVER_HOLD_DOWN_MAX_MS");  // cap of the flap-grown hold-down, ms
  uint32_t fatalTimeoutS = RO_PARAM_DEFAULT("RAILOVER_FATAL_TIMEOUT");     // s without a usable path, 0 = forever
  uint32_t probeIntervalMs = RO_PARAM_DEFAULT("RAILOVER_PROBE_INTERVAL_MS");  // BFD-style probe interval, ms
  uint32_t probeMultiplier = RO_PARAM_DEFAULT("RAILOVER_PROBE_MULT");  // missed probes before a pair is down
  uint32_t backoffMaxMs = RO_PARAM_DEFAULT("RAILOVER_BACKOFF_MAX_MS");  // cap between reconnect attempts, ms
  uint32_t probeBackoffMaxMs = RO_PARAM_DEFAULT("RAILOVER_PROBE_BACKOFF_MAX_MS");  // cap of the probe gap to a down pair, ms
  uint32_t tcpUserTimeoutMs = RO_PARAM_DEFAULT("RAILOVER_TCP_USER_TIMEOUT_MS");  // on data streams, ms
  uint32_t stallMs = RO_PARAM_DEFAULT("RAILOVER_STALL_MS");  // no progress with data pending -> probe burst, ms
  // RAILOVER_ABORT_ON_FATAL: on a fatal error (no usable path past RAILOVER_FATAL_TIMEOUT, the
  // peer process gone) write one line naming the path and the cause to stderr and exit the
  // process with kAbortOnFatalExitCode instead of returning ncclSystemError (JAX/XLA have no
  // collective watchdog and would hang after an NCCL error).
  bool abortOnFatal = RO_PARAM_DEFAULT("RAILOVER_ABORT_ON_FATAL") != 0;
  std::string eventLog;           // RAILOVER_EVENT_LOG: JSON-lines journal path ("" = none; %p = pid)
  std::string stateDir;           // RAILOVER_STATE_DIR ("" = the default directory, or off: see stateDirSet)
  bool stateDirSet = false;       // RAILOVER_STATE_DIR was given: a directory, or "off" (stateDir "")
};
// Exit status of a process ended by RAILOVER_ABORT_ON_FATAL=1 (sysexits' EX_SOFTWARE).
constexpr int kAbortOnFatalExitCode = 70;

// Parses the environment into `out` by walking the parameter table (kParams entries read by
// the plugin). An empty or blank value is the same as an unset one. Returns false and sets
// `err` (naming the variable and the accepted values) on the first bad value.
bool parseConfig(const EnvLookup& env, Config* out, std::string* err);

// Checks one variable's value alone, with parseConfig's rules. Returns false with `err` when
// it is bad or when `name` is not a variable the plugin reads (a variable only the tools or
// NCCL validate is accepted as is).
bool checkParam(const char* name, const char* value, std::string* err);

// Helpers exposed for unit tests.
bool parseUint(const char* s, uint64_t lo, uint64_t hi, uint64_t* out);
// The Config field a numeric (kUint) plugin variable sets; false when `name` has none.
bool configUintField(const char* name, const Config& c, uint64_t* out);

}  // namespace railover
