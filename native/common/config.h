// railover's configuration: every RAILOVER_* variable (and the NCCL_* ones railover honours),
// parsed strictly. A bad value is an error whose message names the variable; init() then
// fails so that NCCL_NET=railover makes it fatal instead of a silent fallback.
//
// Thread-safety: parseConfig is pure; the process-wide Config is written once at init.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace railover {

// Returns the value of an environment variable, or nullptr when unset (tests inject fakes).
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup processEnv();

enum class StandbyPolicy { kAll, kNone, kExplicit };

struct Config {
  std::string ifnames;           // RAILOVER_IFNAMES, else NCCL_SOCKET_IFNAME ("" = automatic)
  std::string ifnamesVar;        // which variable `ifnames` came from (for messages)
  int family = 0;                // NCCL_SOCKET_FAMILY: 0 any, AF_INET, AF_INET6
  int nStreams = 2;              // RAILOVER_NSTREAMS: TCP streams per path, 1..16
  uint64_t minChunkBytes = 64 << 10;   // RAILOVER_MIN_CHUNK_BYTES: smallest striped chunk, multiple of 128
  uint64_t maxChunkBytes = 1 << 20;    // largest chunk on the wire (frame length bound)
  StandbyPolicy standby = StandbyPolicy::kAll;  // RAILOVER_STANDBY
  std::vector<std::pair<std::string, std::string>> standbyPairs;  // explicit "a=b" pairs
  std::vector<std::pair<std::string, int>> rails;  // RAILOVER_RAILS "if=rail,..." (empty = interface order)
  uint32_t holdDownMs = 3000;     // RAILOVER_HOLD_DOWN_MS: healthy time before failback
  uint32_t holdDownMaxMs = 60000; // RAILOVER_HOLD_DOWN_MAX_MS: cap of the flap-grown hold-down
  uint32_t fatalTimeoutS = 120;   // RAILOVER_FATAL_TIMEOUT: s without any usable path, 0 = forever
  uint32_t probeIntervalMs = 20;  // RAILOVER_PROBE_INTERVAL_MS: BFD-style probe interval
  uint32_t probeMultiplier = 5;   // RAILOVER_PROBE_MULT: missed probes before a NIC pair is down
  uint32_t probeBackoffMaxMs = 1000;  // RAILOVER_PROBE_BACKOFF_MAX_MS: cap of the probe gap to a down NIC pair
  uint32_t backoffMaxMs = 60000;  // RAILOVER_BACKOFF_MAX_MS: cap between reconnect attempts
  uint32_t tcpUserTimeoutMs = 10000;  // RAILOVER_TCP_USER_TIMEOUT_MS on data streams
  uint32_t stallMs = 50;          // RAILOVER_STALL_MS: no progress this long with data pending -> probe burst
  std::string eventLog;           // RAILOVER_EVENT_LOG: JSON-lines journal path ("" = none; %p = pid)
  std::string stateDir;           // RAILOVER_STATE_DIR
  // RAILOVER_ABORT_ON_FATAL (0/1, default 0): on a fatal error (no usable path past
  // RAILOVER_FATAL_TIMEOUT, the peer process gone) write one line naming the path and the
  // cause to stderr and exit the process with kAbortOnFatalExitCode, instead of returning
  // ncclSystemError. For frameworks without a collective watchdog (JAX/XLA) that would
  // otherwise hang after an NCCL error.
  bool abortOnFatal = false;
};
// Exit status of a process ended by RAILOVER_ABORT_ON_FATAL=1 (sysexits' EX_SOFTWARE).
constexpr int kAbortOnFatalExitCode = 70;

// Parses the environment into `out`. Returns false and sets `err` (naming the variable and
// the accepted values) on the first bad value.
bool parseConfig(const EnvLookup& env, Config* out, std::string* err);

// Helpers exposed for unit tests.
bool parseUint(const char* s, uint64_t lo, uint64_t hi, uint64_t* out);

}  // namespace railover
