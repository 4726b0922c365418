// railover's configuration: every variable of the parameter table (common/params.h) that the
// plugin reads, parsed strictly. A bad value is an error whose message names the variable; init() then
// fails so that NCCL_NET=railover makes it fatal instead of a silent fallback.
//
// Thread-safety: parseConfig is pure; the process-wide Config is written once at init.
#pragma once

#include <sys/socket.h>

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
// RAILOVER_TRANSPORT. kMixed ("rdma+tcp"): rdma on the NICs with an RDMA port, tcp on the
// others, each a device of its own (plugin/runtime.h, chooseTransport).
enum class TransportKind { kAuto, kTcp, kRdma, kMixed };
const char* transportName(TransportKind t);  // "auto", "tcp", "rdma", "rdma+tcp"

// NCCL_IB_HCA: which HCAs (and ports) the verbs transport may use, in NCCL's syntax: a comma list
// of HCA-name prefixes, each optionally followed by ':port'; a leading '^' makes it an exclude
// list, a following '=' makes every name an exact name instead of a prefix ("^=mlx5_1,mlx5_4",
// "=mlx5_0:1,mlx5_1:1", "mlx5"). A NIC whose HCA port is not allowed has no RDMA.
struct HcaSpec {
  std::string name;  // HCA name (exact or prefix, see HcaFilter::exact)
  int port = -1;     // 1..255; -1 = every port of the HCA
};
struct HcaFilter {
  bool exclude = false;        // '^': the listed HCAs/ports are the ones NOT to use
  bool exact = false;          // '=': names match exactly; else each name is a prefix
  std::vector<HcaSpec> items;  // empty (variable unset): every HCA and port may be used
  // True when port `port` (1-based) of HCA `dev` may be used. Pure; thread-safe. (Inline: the
  // verbs layer and its tests use it without linking the configuration parser.)
  bool allows(const std::string& dev, int port) const {
    if (items.empty()) return true;
    bool listed = false;
    for (const HcaSpec& h : items) {
      bool name = exact ? dev == h.name : dev.compare(0, h.name.size(), h.name) == 0;
      if (name && (h.port < 0 || h.port == port)) listed = true;
    }
    return exclude ? !listed : listed;
  }
};

// NCCL's IB variables, with NCCL's meaning and defaults (params.h has the table). The verbs
// transport reads them through transport/verbs/verbs_config.h (GID choice, RC QP attributes).
struct IbConfig {
  HcaFilter hca;                      // NCCL_IB_HCA
  std::string hcaText;                // NCCL_IB_HCA as given ("" = unset), for messages
  int gidIndex = -1;                  // NCCL_IB_GID_INDEX: -1 = automatic (RoCE only)
  uint32_t roceVersion = RO_PARAM_DEFAULT("NCCL_IB_ROCE_VERSION_NUM");  // 1 or 2
  int addrFamily = AF_INET;           // NCCL_IB_ADDR_FAMILY: AF_INET or AF_INET6
  bool addrRangeSet = false;          // NCCL_IB_ADDR_RANGE given
  int addrRangeFamily = AF_INET;      // family of the range's address
  uint8_t addrRange[16] = {0};        // the range's address: 4 bytes (AF_INET) or 16 (AF_INET6), network order
  int addrRangePrefix = 0;            // prefix length in bits (0..32 or 0..128)
  std::string addrRangeText;          // as given
  uint32_t timeout = RO_PARAM_DEFAULT("NCCL_IB_TIMEOUT");    // local ACK timeout exponent: 4.096 µs * 2^timeout
  uint32_t retryCnt = RO_PARAM_DEFAULT("NCCL_IB_RETRY_CNT");  // transport retries, 0..7
  uint32_t sl = RO_PARAM_DEFAULT("NCCL_IB_SL");               // InfiniBand service level, 0..15
  uint32_t trafficClass = RO_PARAM_DEFAULT("NCCL_IB_TC");     // GRH traffic class (RoCE: DSCP << 2 | ECN), 0..255
  // NCCL_IB_SL / NCCL_IB_TC were given. When not, NCCL (2.24 and later) takes the comm's traffic
  // class from ncclNetCommConfig_t when NCCL passes one, else 0 (verbs_config.h: rcParamsFor).
  bool slSet = false, trafficClassSet = false;
  uint32_t qpsPerConnection = RO_PARAM_DEFAULT("NCCL_IB_QPS_PER_CONNECTION");  // RC QPs per path and direction
  uint32_t pkeyIndex = RO_PARAM_DEFAULT("NCCL_IB_PKEY");      // P_Key table index of the QPs (NCCL's meaning)
  // NCCL_IB_PCI_RELAXED_ORDERING: 0 off, 1 on, 2 on where capable; NCCL treats 1 and 2 alike (on
  // when libibverbs has ibv_reg_mr_iova2). verbs_config.h: relaxedOrderingChoice.
  uint32_t relaxedOrdering = RO_PARAM_DEFAULT("NCCL_IB_PCI_RELAXED_ORDERING");
};

// Field defaults come from the parameter table (common/params.h), checked at compile time.
struct Config {
  std::string ifnames;           // RAILOVER_IFNAMES, else NCCL_SOCKET_IFNAME ("" = automatic)
  std::string ifnamesVar;        // which variable `ifnames` came from (for messages)
  int family = 0;                // NCCL_SOCKET_FAMILY: 0 any, AF_INET, AF_INET6
  TransportKind transport = TransportKind::kAuto;  // RAILOVER_TRANSPORT
  IbConfig ib;                   // NCCL_IB_* (the verbs transport's HCA, GID and QP settings)
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
  uint32_t maxRecvs = RO_PARAM_DEFAULT("RAILOVER_MAX_RECVS");  // grouped receives offered to NCCL (1 = none)
  uint32_t tcpKeepaliveS = RO_PARAM_DEFAULT("RAILOVER_TCP_KEEPALIVE_S");  // idle s before a keepalive, 0 = off
  uint32_t stallMs = RO_PARAM_DEFAULT("RAILOVER_STALL_MS");  // no progress with data pending -> probe burst, ms
  uint32_t flowStallMs = RO_PARAM_DEFAULT("RAILOVER_FLOW_STALL_MS");  // RDMA: ack silence with writes in flight -> failover, ms (0 off)
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

// One warning per RAILOVER_* variable in `envp` ("NAME=value" entries, null-terminated; null
// = none) that is not in the parameter table: a misspelt name the plugin would otherwise
// ignore in silence. Each reads "RAILOVER_X is not a railover variable (did you mean
// RAILOVER_Y?); it is ignored", naming the closest known variable when one is close: over the
// part after RAILOVER_ (the shared prefix would make any two names look alike), the shortest
// known name it is the start of, else the nearest by edit distance if that is at most a fifth
// of the longer of the two; else "(typo?)" instead. Doctor and `railover launch` warn in the
// same words by the same rule (doctor.py close_var). Pure; in the order of `envp`.
std::vector<std::string> unknownVarWarnings(const char* const* envp);

// Parses an NCCL_IB_HCA value (syntax above) into *out; false with *why (no variable name)
// when it is malformed. Exposed for unit tests.
bool parseHcaFilter(const std::string& s, HcaFilter* out, std::string* why);

// Helpers exposed for unit tests.
// parseUint: a decimal number in [lo, hi], nothing else (no sign, no blanks); with `asNccl`
// also 0x-led hex and 0-led octal, as NCCL reads its own variables (strtoll base 0), but
// strict where NCCL is not (trailing characters are an error, not ignored).
bool parseUint(const char* s, uint64_t lo, uint64_t hi, uint64_t* out, bool asNccl = false);
// The Config field a numeric (kUint) plugin variable sets; false when `name` has none.
bool configUintField(const char* name, const Config& c, uint64_t* out);

}  // namespace railover
