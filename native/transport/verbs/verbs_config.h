// Verbs building blocks, part 5: NCCL's IB variables applied (common/config.h IbConfig, parsed
// with the rest of the parameter table): which HCA port serves a NIC (NCCL_IB_HCA), which GID its
// QPs use (NCCL_IB_GID_INDEX, NCCL_IB_ROCE_VERSION_NUM, NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE),
// and the RC QP attributes (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT, NCCL_IB_SL, NCCL_IB_TC,
// NCCL_IB_PKEY). NCCL_IB_QPS_PER_CONNECTION is IbConfig::qpsPerConnection, read as is.
//
// GID choice (chooseGid), with NCCL's rules plus railover's binding to the rail NIC:
//  * InfiniBand link layer: no GID; the QPs are addressed by LID without a GRH (index -1).
//    NCCL_IB_GID_INDEX does not apply there.
//  * RoCE, NCCL_IB_GID_INDEX >= 0: that index, whatever it holds (an empty slot is an error).
//  * RoCE, automatic (-1): among the entries bound to the NIC, the ones of the address family
//    NCCL_IB_ADDR_FAMILY (AF_INET = an IPv4-mapped GID ::ffff:a.b.c.d), of RoCE version
//    NCCL_IB_ROCE_VERSION_NUM, inside NCCL_IB_ADDR_RANGE when it is set, and neither zero nor
//    link-local (fe80::/64); of these the one equal to the NIC's first address of that family
//    (the address its TCP paths use), else the lowest index. NCCL itself falls back to index 0
//    when nothing matches; railover says why instead (an error naming the variables), so that a
//    NIC without a usable GID is not silently sent into a GID that cannot route.
//
// The GID table is read with ibv_query_gid_ex (rdma-core reads the kernel's table, itself
// falling back to sysfs on old kernels); readGidTableSysfs reads the same facts from
// /sys/class/infiniband/<dev>/ports/<port>/{gids,gid_attrs/types,gid_attrs/ndevs}/<index> and is
// used when ibv_query_gid_ex cannot answer.
//
// Thread-safety: the pure functions are reentrant; the others as noted.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_qp.h"

namespace railover {
namespace verbs {

enum class GidType : uint8_t { kUnknown, kIb, kRoceV1, kRoceV2 };
const char* gidTypeName(GidType t);  // "IB", "RoCE v1", "RoCE v2", "unknown"

// One populated entry of a port's GID table.
struct GidEntry {
  int index = 0;
  uint8_t gid[16] = {0};  // network order
  GidType type = GidType::kUnknown;
  std::string netdev;     // the netdev the entry is bound to ("" = none, as on InfiniBand)
};

// What the choice needs to know about the port and the NIC it serves.
struct PortFacts {
  std::string dev;           // HCA name
  int port = 1;              // 1-based
  bool roce = true;          // link layer Ethernet (else InfiniBand)
  uint16_t lid = 0;          // InfiniBand only
  std::string netdev;        // the NIC the GID must be bound to ("" = any netdev)
  bool hasPreferred = false;  // the NIC's first address of NCCL_IB_ADDR_FAMILY is known:
  uint8_t preferred[16] = {0};  // as a GID (IPv4: ::ffff:a.b.c.d)
};

struct GidChoice {
  int index = -1;            // GID index; -1 on InfiniBand (LID addressing, no GRH)
  uint8_t gid[16] = {0};
  GidType type = GidType::kUnknown;
  std::string netdev;        // what the chosen entry is bound to
  std::string why;           // one line, e.g. "rxe0 port 1 GID 1 (RoCE v2, IPv4 10.1.0.1, bound to eth1;
                             // NCCL_IB_GID_INDEX unset)"
};

// The GID choice described at the top, over the port's populated GID entries (any order).
// Pure. false with *err naming the port, the NIC and the variables when nothing can be chosen.
bool chooseGid(const IbConfig& s, const PortFacts& port, const std::vector<GidEntry>& table, GidChoice* out,
               std::string* err);

// Address family of a GID as NCCL classifies it: AF_INET for an IPv4-mapped GID, else AF_INET6.
int gidFamily(const uint8_t gid[16]);
// True when `gid` is inside NCCL_IB_ADDR_RANGE (always when the range is unset).
bool gidInRange(const IbConfig& s, const uint8_t gid[16]);

// Reads port `port` of HCA `dev` from a sysfs tree rooted at `root` (normally
// "/sys/class/infiniband"): every populated entry (readable, non-zero GID). `roce` says how to
// read the type "IB/RoCE v1" (RoCE v1 on Ethernet, IB on InfiniBand). false with *err when the
// port's gids directory cannot be listed.
bool readGidTableSysfs(const std::string& root, const std::string& dev, int port, bool roce,
                       std::vector<GidEntry>* out, std::string* err);

// Reads the GID table of an opened HCA port (ibv_query_gid_ex, else sysfs). `tableLen` from
// ibv_query_port (gid_tbl_len). false with *err when neither source answers.
bool readGidTable(const VerbsApi& api, ibv_context* ctx, const std::string& dev, int port, int tableLen, bool roce,
                  std::vector<GidEntry>* out, std::string* err);

// How choosePortForNetdev ended.
enum class PortChoice {
  kChosen,      // *out filled (port ACTIVE, GID chosen)
  kChosenDown,  // *out filled (GID chosen) but no port bound to the NIC is ACTIVE now (a pulled
                // cable at job start): the transport keeps the NIC, down until its port is
                // ACTIVE (*err says which port and its state)
  kExcluded,    // every HCA port bound to the NIC is excluded by NCCL_IB_HCA: serve the NIC with TCP
  kFailed,      // no usable HCA port: *err says why (no RDMA device bound, no GID, ...)
};

// The IPoIB network interfaces on InfiniBand port `port` (1-based) of HCA `dev`: the entries of
// /sys/class/net whose device's infiniband/ directory names `dev` and whose dev_port is
// port - 1, sorted by name. Empty where none (no IPoIB on the port, or not InfiniBand). Reads
// sysfs only; reentrant.
std::vector<std::string> ipoibNetdevs(const std::string& dev, int port);

// Finds the HCA port behind NIC `netdev` (a port with a GID entry bound to it; for an IPoIB NIC
// the HCA port its sysfs device names) that NCCL_IB_HCA allows, and chooses its GID with
// chooseGid. *err is set for kExcluded too (a line for logs naming the HCA port and the filter).
// Opens and closes the devices it inspects; reentrant.
PortChoice choosePortForNetdev(const std::string& netdev, const IbConfig& s, PortSel* out, std::string* err);

// Re-runs the GID choice on a port already in use, after its GID table changed
// (Hca::gidChanges(cur.port) moved, i.e. IBV_EVENT_GID_CHANGE): re-reads the table and the NIC's
// address through the opened `hca`, chooses again with `s`, and sets *changed when the index or
// the GID value differs from `cur`. *out gets the new selection (cur's port fields, new GID and
// why). false with *err when no GID can be chosen any more (the port cannot carry new QPs until
// one can; existing QPs keep the GID they were created with). Call off the progress thread
// (reads sysfs/netlink); `hca` may be in use by other threads.
bool reselectGid(Hca& hca, const IbConfig& s, const PortSel& cur, PortSel* out, bool* changed, std::string* err);

// RC QP attributes from the settings: timeout = NCCL_IB_TIMEOUT, retryCnt = NCCL_IB_RETRY_CNT,
// pkeyIndex = NCCL_IB_PKEY; trafficClass = NCCL_IB_TC and sl = NCCL_IB_SL when given, else, as
// NCCL (2.24 and later) does, the comm's traffic class (`commTrafficClass`, from NCCL's
// ncclNetCommConfig_t; -1 = none given) when it fits the field (TC 0..255, SL 0..15), else 0.
// Pure.
RcParams rcParamsFor(const IbConfig& s, int commTrafficClass = -1);

// NCCL_IB_PCI_RELAXED_ORDERING applied as NCCL's IB transport does (net_ib/init.cc,
// ncclIbRelaxedOrderingCapable): 0 off; 1 and 2 on exactly when this libibverbs exports
// ibv_reg_mr_iova2 (`api` null: not loaded, off). NCCL turns an explicit 1 off silently where it
// is missing; railover does too, and says so in *why (one line, for the transport's INFO line
// and the RDMA report). The result goes to every HCA (Hca::setRelaxedOrdering). Pure.
bool relaxedOrderingChoice(const IbConfig& s, const VerbsApi* api, std::string* why);

// Checks P_Key index `index` (NCCL_IB_PKEY) on port `port` of the opened `hca`
// (ibv_query_pkey): false with *err naming NCCL_IB_PKEY when the index is beyond the port's
// P_Key table or its entry is empty (0); *pkey gets the P_Key value (host order) for logs.
bool checkPkeyIndex(Hca& hca, int port, int index, uint16_t* pkey, std::string* err);

}  // namespace verbs
}  // namespace railover
