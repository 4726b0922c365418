// The parameter table: every environment variable railover reads, declared once, with its
// type, default, unit, accepted range and meaning. Everything else is derived from it:
// parseConfig (common/config.cc) parses the plugin's variables by walking it, the plugin
// exports it as JSON (railover_describe_json, see abi/describe.cc) for `railover env --list`,
// `railover doctor` and the README's configuration table (tests fail when they diverge).
//
// Empty values: a variable set to an empty string (or only blanks) is the same as an unset
// one, for every variable: its default applies. (This is NCCL's own rule for its variables,
// e.g. NCCL_SOCKET_IFNAME="" means automatic selection.) An explicit "off" is spelled out
// where a variable has one (RAILOVER_STATE_DIR=off, RAILOVER_STANDBY=none). Blanks (space,
// tab) around a number, a word or a list item are no part of it: " 500" is 500, " tcp" tcp.
//
// Adding a variable: one entry below. A numeric (kUint) or flag (kFlag) variable the plugin
// reads also needs its Config field (config.h, initialised with RO_PARAM_DEFAULT) and one
// RO_UINT_FIELD line in config.cc (a static_assert counts them); then run
// scripts/update_docs.py for the README's table.
//
// Thread-safety: constant data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace railover {

enum class ParamType : uint8_t {
  kUint,        // decimal integer in lo..hi, a multiple of `step`
  kIfnameList,  // NCCL_SOCKET_IFNAME syntax: comma list of name prefixes, '^' excludes, '=' exact
  kFamily,      // AF_INET or AF_INET6
  kStandby,     // all | none | 'primary=standby' pairs separated by ';'
  kRails,       // comma list 'ifname=rail'
  kPath,        // a file or directory path (not checked by the plugin; doctor checks it is writable)
  kStateDir,    // a directory, or 'off'
  kNcclOwned,   // NCCL's own variable that railover also reads; NCCL validates it, railover does not
  kFlag,        // 0 or 1 (parsed like kUint with lo 0, hi 1)
  kTransport,   // auto, tcp, rdma or rdma+tcp
  kHcaList,     // NCCL_IB_HCA syntax: comma list of HCA-name prefixes with optional ':port', '^' excludes, '=' exact
  kGidIndex,    // -1 (automatic) or a GID table index
  kCidr,        // an IPv4 or IPv6 address range 'address/prefix-length'
};

// Who reads a variable (bit mask).
enum ParamReader : unsigned {
  kReadPlugin = 1,  // the plugin, at NCCL's first init (parseConfig; a bad value fails init)
  kReadPerf = 2,    // the railover-perf driver
  kReadTools = 4,   // the Python tools (railover CLI)
  kReadTests = 8,   // the test suite
};

struct ParamSpec {
  const char* name;
  ParamType type;
  unsigned readers;         // ParamReader bits
  uint64_t def;             // kUint: the default value (also the Config field's initial value)
  uint64_t lo, hi, step;    // kUint: accepted range and granularity (step 1 = any integer)
  const char* unit;         // kUint: unit of the value ("ms", "s", "bytes", ...); "" = a count
  const char* defaultText;  // the default as users read it
  const char* accepted;     // kUint: what special values mean ("" = none); else: the syntax in words
  const char* example;      // a valid value (tests parse it)
  const char* meaning;      // one line
};

// The table. Order: the plugin's variables in the order parseConfig reads them (RAILOVER_IFNAMES
// before NCCL_SOCKET_IFNAME: the first one set wins), then the tools'.
inline constexpr ParamSpec kParams[] = {
    {"RAILOVER_IFNAMES", ParamType::kIfnameList, kReadPlugin | kReadTools, 0, 0, 0, 1, "", "(unset)",
     "comma list of name prefixes; '^' excludes, '=' exact names (NCCL_SOCKET_IFNAME syntax)", "=eth0,eth1",
     "NICs railover uses; takes precedence over NCCL_SOCKET_IFNAME"},
    {"NCCL_SOCKET_IFNAME", ParamType::kIfnameList, kReadPlugin | kReadTools, 0, 0, 0, 1, "", "(unset)",
     "same as RAILOVER_IFNAMES", "eth",
     "used when RAILOVER_IFNAMES is unset; with neither, every NIC with an address except lo, docker*, virbr*"},
    {"NCCL_SOCKET_FAMILY", ParamType::kFamily, kReadPlugin | kReadTools, 0, 0, 0, 1, "", "any", "AF_INET or AF_INET6",
     "AF_INET", "address family of the NIC addresses railover uses"},
    {"RAILOVER_TRANSPORT", ParamType::kTransport, kReadPlugin | kReadTools, 0, 0, 0, 1, "", "auto",
     "auto, tcp, rdma or rdma+tcp", "rdma",
     "how paths move data: tcp (sockets), rdma (verbs RC queue pairs on the HCA port behind each NIC), auto (rdma "
     "when libibverbs loads and a NIC has an RDMA port with a GID, active or not; NICs without one are then left out "
     "of NCCL's devices, as NCCL's IB transport lists only RDMA devices; tcp when none has one), rdma+tcp (rdma on "
     "the NICs with an RDMA port, tcp on the others as devices of their own; a comm fails over only among NICs of "
     "its kind, and every rank must have RDMA behind the same NICs)"},
    // NCCL's IB variables: the same names, meanings and defaults as NCCL's own IB transport (the
    // defaults of NCCL 2.23 and later), applied by railover's verbs transport.
    {"NCCL_IB_HCA", ParamType::kHcaList, kReadPlugin, 0, 0, 0, 1, "", "(unset: every HCA)",
     "comma list of HCA-name prefixes, each optionally ':port'; '^' excludes, '=' exact names", "=mlx5_0:1,mlx5_1:1",
     "HCAs and ports the verbs transport may use; a NIC whose HCA port is not allowed has no RDMA (RAILOVER_TRANSPORT says what becomes of it)"},
    {"NCCL_IB_GID_INDEX", ParamType::kGidIndex, kReadPlugin, 0, 0, 0, 1, "", "-1",
     "-1 = automatic, or a GID table index 0..65535", "3",
     "RoCE: the GID index of every HCA port used; automatic picks the NIC's GID of NCCL_IB_ROCE_VERSION_NUM and "
     "NCCL_IB_ADDR_FAMILY (within NCCL_IB_ADDR_RANGE); unused on InfiniBand (LID addressing)"},
    {"NCCL_IB_ROCE_VERSION_NUM", ParamType::kUint, kReadPlugin, 2, 1, 2, 1, "", "2", "", "1",
     "RoCE version of the GID chosen automatically"},
    {"NCCL_IB_ADDR_FAMILY", ParamType::kFamily, kReadPlugin, 0, 0, 0, 1, "", "AF_INET", "AF_INET or AF_INET6",
     "AF_INET6", "address family of the GID chosen automatically (AF_INET: an IPv4-mapped GID)"},
    {"NCCL_IB_ADDR_RANGE", ParamType::kCidr, kReadPlugin, 0, 0, 0, 1, "", "(unset: any address)",
     "'address/prefix-length' of NCCL_IB_ADDR_FAMILY's family", "10.1.0.0/16",
     "address range the GID chosen automatically must be in"},
    {"NCCL_IB_TC", ParamType::kUint, kReadPlugin, 0, 0, 255, 1, "", "0", "", "106",
     "RoCE: traffic class of the QPs' GRH (DSCP << 2, with the ECN bits)"},
    {"NCCL_IB_SL", ParamType::kUint, kReadPlugin, 0, 0, 15, 1, "", "0", "", "1", "InfiniBand service level of the QPs"},
    {"NCCL_IB_TIMEOUT", ParamType::kUint, kReadPlugin, 20, 0, 31, 1, "", "20",
     "per try 4.096 µs * 2^value; 0 = no timeout (InfiniBand specification)", "14",
     "RC local ACK timeout exponent; with NCCL_IB_RETRY_CNT it bounds how long a QP retries (a backstop: railover "
     "fails over on port events and probes first)"},
    {"NCCL_IB_RETRY_CNT", ParamType::kUint, kReadPlugin, 7, 0, 7, 1, "retries", "7", "", "6",
     "RC transport retries before a send fails with a retry-exceeded error"},
    {"NCCL_IB_QPS_PER_CONNECTION", ParamType::kUint, kReadPlugin, 1, 1, 128, 1, "QPs", "1", "", "2",
     "RC queue pairs per path and direction of a comm: the sender splits each chunk over them (the receiver follows the sender's count); "
     "on the rxe bed's lossless wire 4 QPs moved 1.19-1.34x one QP's busbw at >= 1 MiB (docs/BENCHMARKS.md)"},
    {"NCCL_IB_PKEY", ParamType::kUint, kReadPlugin, 0, 0, 65535, 1, "", "0", "", "1",
     "index into the HCA port's P_Key table of the partition key the QPs use (an index, as in NCCL)"},
    {"NCCL_IB_PCI_RELAXED_ORDERING", ParamType::kUint, kReadPlugin, 2, 0, 2, 1, "", "2",
     "0 = off; 1 = on; 2 = on where capable. As in NCCL, 1 and 2 both mean on when libibverbs exports "
     "ibv_reg_mr_iova2 (rdma-core 28 or later) and off otherwise, without an error",
     "0",
     "PCIe relaxed ordering of NCCL's buffers: their registrations (regMr through ibv_reg_mr_iova2, regMrDmaBuf) on every "
     "HCA get IBV_ACCESS_RELAXED_ORDERING, as NCCL's IB transport does (net_ib/init.cc ncclIbRelaxedOrderingCapable, "
     "reg.cc); railover's own control and flush buffers never (nor NCCL's). An HCA whose kernel refuses the flag "
     "(EINVAL) is registered without it from then on, with one WARN"},
    {"RAILOVER_NSTREAMS", ParamType::kUint, kReadPlugin, 2, 1, 16, 1, "streams", "2", "", "4",
     "TCP streams per path (docs/BENCHMARKS.md has the measurement behind the default)"},
    {"RAILOVER_MIN_CHUNK_BYTES", ParamType::kUint, kReadPlugin, 64 << 10, 128, 1 << 20, 128, "bytes", "65536", "",
     "131072", "smallest piece a message is cut into across streams"},
    {"RAILOVER_STANDBY", ParamType::kStandby, kReadPlugin | kReadTools, 0, 0, 0, 1, "", "all",
     "'all', 'none', or ';'-separated pairs 'primary=standby' of interface names", "eth0=eth1;eth1=eth0",
     "standby paths: every other NIC (to the peer's NIC on the same rail), none (a plain plugin), or explicit pairs"},
    {"RAILOVER_RAILS", ParamType::kRails, kReadPlugin | kReadTools, 0, 0, 0, 1, "", "interface order",
     "comma list 'ifname=rail' with rail 0..32767", "eth0=0,eth1=1",
     "rail of each NIC; a standby path goes to the peer's NIC on the same rail"},
    {"RAILOVER_HOLD_DOWN_MS", ParamType::kUint, kReadPlugin | kReadTools, 3000, 0, 3600000, 1, "ms", "3000",
     "0 = fail back as soon as the primary is up", "250",
     "how long a repaired primary must stay healthy before failback"},
    {"RAILOVER_HOLD_DOWN_MAX_MS", ParamType::kUint, kReadPlugin | kReadTools, 60000, 0, 86400000, 1, "ms", "60000",
     "raised to RAILOVER_HOLD_DOWN_MS when below it", "120000",
     "cap of the hold-down, which doubles on every flap and halves after a stable period"},
    {"RAILOVER_FATAL_TIMEOUT", ParamType::kUint, kReadPlugin, 120, 0, 86400 * 7, 1, "s", "120", "0 = never", "300",
     "with no usable path this long, the pending call returns ncclSystemError with a WARN naming NICs, peer and cause"},
    {"RAILOVER_PROBE_INTERVAL_MS", ParamType::kUint, kReadPlugin | kReadTools, 20, 1, 60000, 1, "ms", "20", "", "20",
     "BFD-style probe interval per NIC pair"},
    {"RAILOVER_PROBE_MULT", ParamType::kUint, kReadPlugin | kReadTools, 5, 2, 100, 1, "missed probes", "5", "", "10",
     "missed probes before a NIC pair is declared down (detection = interval x multiplier)"},
    {"RAILOVER_BACKOFF_MAX_MS", ParamType::kUint, kReadPlugin, 60000, 10, 60000, 1, "ms", "60000", "", "5000",
     "cap of the exponential back-off between reconnect attempts of a failed path"},
    {"RAILOVER_PROBE_BACKOFF_MAX_MS", ParamType::kUint, kReadPlugin, 1000, 1, 60000, 1, "ms", "1000", "", "2000",
     "cap of the back-off of probes to a NIC pair that is down (interval doubling per probe); a repair is found within it"},
    {"RAILOVER_TCP_USER_TIMEOUT_MS", ParamType::kUint, kReadPlugin, 10000, 0, 600000, 1, "ms", "10000",
     "0 = kernel default", "20000", "TCP_USER_TIMEOUT on data streams (a backstop; probes detect faster)"},
    {"RAILOVER_MAX_RECVS", ParamType::kUint, kReadPlugin, 1, 1, 8, 1, "buffers", "1", "", "1",
     "maxRecvs told to NCCL by the rdma transport: receives grouped per irecv (NCCL's IB transport offers 8). "
     "Above 1 NCCL shares a comm among local ranks (PXN), and each send waits for a free buffer with its tag in the "
     "oldest receive not yet filled, as NCCL's IB transport does. The tcp transport always offers 1 (as NCCL's socket "
     "transport): it cannot tell the sender what the receiver posted"},
    {"RAILOVER_TCP_KEEPALIVE_S", ParamType::kUint, kReadPlugin, 2, 0, 3600, 1, "s", "2", "0 = off", "5",
     "idle time before a TCP keepalive on data and bootstrap streams: finds a stream whose peer dropped it silently "
     "(its FIN lost in an outage), which an end with nothing to write would otherwise wait on for ever"},
    {"RAILOVER_STALL_MS", ParamType::kUint, kReadPlugin, 50, 1, 60000, 1, "ms", "50", "", "100",
     "an active path with data pending and no progress this long triggers a full-size probe burst"},
    {"RAILOVER_FLOW_STALL_MS", ParamType::kUint, kReadPlugin, 500, 0, 600000, 1, "ms", "500", "0 = off", "1000",
     "RDMA: an active path whose QPs got no acknowledgement this long with writes in flight, while its rail's probes "
     "answer and a standby does too, fails over (the data flow alone is cut: ECMP route of the QP's flow, a stuck "
     "traffic class); TCP ignores it"},
    {"RAILOVER_ABORT_ON_FATAL", ParamType::kFlag, kReadPlugin, 0, 0, 1, 1, "", "0", "0 or 1", "1",
     "1: on a fatal error write one line naming path and cause to stderr and exit the process (status 70) instead of "
     "returning ncclSystemError (for JAX/XLA, which have no collective watchdog)"},
    {"RAILOVER_EVENT_LOG", ParamType::kPath, kReadPlugin | kReadTools, 0, 0, 0, 1, "", "(off)",
     "file path; '%p' = pid; a directory gets railover-<pid>.jsonl", "/var/log/railover/%p.jsonl",
     "JSON-lines event journal with CLOCK_MONOTONIC µs timestamps (docs/OPERATIONS.md lists its events)"},
    {"RAILOVER_STATE_DIR", ParamType::kStateDir, kReadPlugin | kReadTools, 0, 0, 0, 1, "",
     "/run/railover if writable, else /tmp/railover-<uid>", "a directory (an absolute path: each rank resolves a relative one in its own working directory), or 'off' in lower case (no state file)", "/run/railover",
     "where each process publishes its live state (railover-<pid>.json) for railover status and railover exporter"},
    {"NCCL_DEBUG", ParamType::kNcclOwned, kReadPlugin | kReadPerf, 0, 0, 0, 1, "", "WARN",
     "VERSION, WARN, INFO, TRACE (other values: WARN)", "INFO",
     "log level of railover's own output when NCCL passes no logger (railover-perf, tests)"},
    {"NCCL_DEBUG_SUBSYS", ParamType::kNcclOwned, kReadPerf, 0, 0, 0, 1, "", "all", "NCCL's subsystem list",
     "INIT,NET", "subsystems railover-perf's logger prints at INFO (like NCCL's)"},
    {"RAILOVER_NATIVE_DIR", ParamType::kPath, kReadTools, 0, 0, 0, 1, "", "(unset)", "a directory",
     "/opt/railover/lib",
     "where the Python tools find libnccl-net-railover.so and railover-perf: when set, the only place they look (unusable: an error naming it)"},
    {"RAILOVER_TESTBED_STATE", ParamType::kPath, kReadTools, 0, 0, 0, 1, "",
     "/run/railover-testbed, else /tmp/railover-testbed-<uid>", "a directory", "/tmp/rtb",
     "where `railover testbed` keeps the state of the test beds it built"},
    {"RAILOVER_REQUIRE_NETNS", ParamType::kFlag, kReadTests, 0, 0, 1, 1, "", "0", "0 or 1", "1",
     "1: end-to-end tests fail (instead of being skipped) when network namespaces are unavailable"},
    {"RAILOVER_REQUIRE_RDMA", ParamType::kFlag, kReadTests, 0, 0, 1, 1, "", "0", "0 or 1", "1",
     "1: RDMA test-bed tests fail (instead of being skipped) when QEMU or the guest image's inputs are missing"},
    {"RAILOVER_CTEST_BUILD", ParamType::kPath, kReadTests, 0, 0, 0, 1, "", "(unset): build-unit", "a configured CMake build tree",
     "build-asan",
     "tests only: the tree whose C++ tests the README's test command builds and runs through ctest, instead of compiling a plain build-unit (CI: its ASan+UBSan tree)"},
    {"RAILOVER_BED_FULL_ABI_MATRIX", ParamType::kFlag, kReadTests, 0, 0, 1, 1, "", "(unset)", "1 = on", "1",
     "RDMA test bed only: the single-fault and negative-control tests run under every net ABI (v7-v12) instead of v12 alone (~6x their time)"},
    {"RAILOVER_FUZZ_SECONDS", ParamType::kUint, kReadTests, 30, 1, 86400, 1, "s", "30", "", "60",
     "CI (.ci/run) only: how long each fuzz target runs"},
    {"RAILOVER_RDMA_ACCEL", ParamType::kPath, kReadTools, 0, 0, 0, 1, "", "auto", "auto, kvm or tcg", "tcg",
     "QEMU accelerator of the RDMA test bed (auto: KVM when it works, else TCG; the choice and why are printed)"},
    {"RAILOVER_RDMA_LOGS", ParamType::kPath, kReadTools, 0, 0, 0, 1, "", "(unset)", "a directory", "/tmp/rdma-logs",
     "keep every RDMA test-bed guest's console and QEMU stderr there, per boot attempt"},
    {"RAILOVER_FUZZ_DEBUG", ParamType::kFlag, kReadTests, 0, 0, 1, 1, "", "(unset)", "set = on", "1",
     "fuzz targets only: fuzz_recv prints the scenario an input decodes to, fuzz_send a summary"},
};
inline constexpr size_t kParamCount = sizeof(kParams) / sizeof(kParams[0]);

constexpr bool paramNameEq(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

// Index of `name` in kParams; in a constant expression an unknown name does not compile.
constexpr size_t paramIndex(const char* name) {
  for (size_t i = 0; i < kParamCount; ++i)
    if (paramNameEq(kParams[i].name, name)) return i;
  throw "railover: variable not declared in kParams";  // not a constant expression: compile error
}

// The declared default of a numeric variable, checked at compile time (use it for Config's
// field initialisers so the table and the struct cannot disagree).
#define RO_PARAM_DEFAULT(name) (std::integral_constant<uint64_t, ::railover::kParams[::railover::paramIndex(name)].def>::value)

// The entry for `name`, or nullptr (runtime lookup).
const ParamSpec* findParam(const char* name);

// The accepted range of a kUint entry in words, e.g. "0..604800 s; 0 = never" or
// "128..1048576 bytes, multiple of 128".
std::string paramRangeText(const ParamSpec& p);

}  // namespace railover
