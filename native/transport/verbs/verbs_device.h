// Verbs building blocks, part 1: which HCA port and GID carry a NIC, and an opened HCA.
//
// A "rail NIC" in railover is a netdev (eth1, ens3f0, ...). For RoCE the HCA port behind it is
// the one whose GID table has entries bound to that netdev; the GID used for RC connections is
// the RoCE v2 entry that maps the NIC's IPv4 address (::ffff:a.b.c.d), chosen the way NCCL's IB
// transport chooses it by default (address family IPv4, RoCE version 2). For InfiniBand
// (link layer IB) the port is addressed by LID and no GID is needed (IB is not testable on this
// machine; the code path exists so the transport does not need a different shape for it).
//
// Thread-safety: findPort*() are reentrant. An Hca is shared by every path on it; its
// async-event state is guarded by an internal mutex (pollAsync() may be called from any path).
//
// Built only where rdma-core's headers are present; libibverbs itself is reached through dlopen
// (verbs_api.h): every call here fails with a clear error where it is not installed.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "transport/verbs/verbs_api.h"

namespace railover {
namespace verbs {

// One HCA port chosen for a NIC.
struct PortSel {
  std::string dev;          // HCA name (rxe0, mlx5_1)
  std::string netdev;       // the NIC it backs ("" when chosen by HCA name on IB)
  int port = 1;             // HCA port number (1-based, as in verbs)
  int gidIndex = -1;        // RoCE v2 GID index; -1 on IB (LID addressing)
  bool roce = false;        // link layer Ethernet (RoCE) vs InfiniBand
  ibv_gid gid{};            // the chosen GID (zero on IB)
  uint16_t lid = 0;         // port LID (IB only)
  ibv_mtu activeMtu = IBV_MTU_1024;
  std::string why;          // one line: how the port/GID was chosen (for doctor/logs)
};

// Finds the HCA port backing `netdev` and its GID with NCCL's defaults (every HCA allowed, the
// NIC's RoCE v2 IPv4 GID): choosePortForNetdev(netdev, IbConfig{}, ...) of verbs_config.h, which
// applies NCCL_IB_HCA and the GID variables. false with *err naming the problem (no such NIC, no
// RDMA device bound to the NIC, no RoCE v2 IPv4 GID bound to it, port not ACTIVE).
bool findPortForNetdev(const std::string& netdev, PortSel* out, std::string* err);

// Selects `port` of HCA `dev` directly. gidIndex -1: on RoCE the first RoCE v2 GID with an IPv4
// mapping, on IB none (LID). false with *err when the HCA/port/GID does not exist.
bool findPortByDevice(const std::string& dev, int port, int gidIndex, PortSel* out, std::string* err);

// An asynchronous event of an HCA, already acknowledged.
struct AsyncEvent {
  ibv_event_type type;
  int port = 0;           // for port events (PORT_ERR, PORT_ACTIVE, GID_CHANGE, ...), else 0
  uint32_t qpn = 0;       // for QP events, else 0
  uint64_t tUs = 0;       // CLOCK_MONOTONIC when it was read
};

// An opened HCA: context, one protection domain, and its async events. Not copyable.
class Hca {
 public:
  // Opens HCA `dev`. nullptr-equivalent (ok() false) with *err when it cannot.
  Hca(const std::string& dev, std::string* err);
  ~Hca();
  Hca(const Hca&) = delete;
  Hca& operator=(const Hca&) = delete;

  bool ok() const { return ctx_ != nullptr && pd_ != nullptr; }
  // The libibverbs table this HCA was opened with (valid whenever the Hca was constructed with
  // libibverbs loaded; ok() is false otherwise).
  const VerbsApi& api() const;
  const std::string& name() const { return dev_; }
  ibv_context* ctx() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }

  // Reads every pending async event without blocking and folds it into the per-port and per-QP
  // state below; returns the events read by this call (other callers may have read earlier ones:
  // use the counters for decisions, not this list).
  std::vector<AsyncEvent> pollAsync();
  // Number of IBV_EVENT_PORT_ERR events seen so far on `port` of this HCA (events of another
  // port or HCA never count here).
  uint64_t portErrors(int port);
  // Number of port state events (IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE) seen on `port`
  // (a watcher re-reads the port's state when it moves).
  uint64_t portStateEvents(int port);
  // True once IBV_EVENT_DEVICE_FATAL was seen (every QP and port of the HCA is gone).
  bool deviceFatal();
  // Number of GID table changes (IBV_EVENT_GID_CHANGE) seen on `port`.
  uint64_t gidChanges(int port);
  // True when a fatal QP event (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, PATH_MIG_ERR) or a device
  // fatal event named `qpn` (device fatal: every QP). *what gets the event name.
  bool qpFatal(uint32_t qpn, std::string* what);

 private:
  std::string dev_;
  const VerbsApi* api_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::mutex mu_;
  std::vector<uint64_t> portErr_, gidChg_, portEv_;  // index = port number
  std::unordered_set<uint32_t> fatalQps_;
  std::string fatalWhat_;
  bool deviceFatal_ = false;
};

uint64_t nowUs();  // CLOCK_MONOTONIC, µs
std::string gidString(const ibv_gid& g);

}  // namespace verbs
}  // namespace railover
