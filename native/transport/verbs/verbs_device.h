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
// async-event state is guarded by an internal mutex (pollAsync() may be called from any path;
// pollAsyncFromDataPath() skips the lock and the read while a watcher thread reads the events).
//
// Built only where rdma-core's headers are present; libibverbs itself is reached through dlopen
// (verbs_api.h): every call here fails with a clear error where it is not installed.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
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
  int speedMbps = 0;        // the port's data rate when read (portSpeedMbps); 0: unknown
  std::string why;          // one line: how the port/GID was chosen (for doctor/logs)
  bool active = true;       // the port was ACTIVE when chosen (PortChoice::kChosenDown: not;
                            // on IB its LID is read again when it comes up)
  std::string state;        // the port state then ("ACTIVE", "DOWN", ...)
};

// A port's data rate in Mbps from ibv_port_attr's active_speed and active_width codes, with the
// per-lane rates NCCL's IB transport reports for them (so the two transports give NCCL's topology
// the same bandwidth for one port): SDR 2500, DDR 5000, QDR and FDR10 10000, FDR 14000, EDR 25000,
// HDR 50000, NDR 100000 per lane; widths 1x, 2x, 4x, 8x, 12x (the verbs encodings of the IBTA
// PortInfo fields: speed 1/2/4/8/16/32/64/128, width 1/16/2/4/8). 0 for a code outside those
// (XDR is reported only in active_speed_ex, which rdma-core's ibv_port_attr gained after the
// version this is built against: such a port reads 0, and the plugin then keeps the NIC's
// /sys/class/net speed). Pure.
int portSpeedMbps(uint8_t activeSpeed, uint8_t activeWidth);

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
//
// Re-opening: after IBV_EVENT_DEVICE_FATAL every object on the context is gone (QPs, CQs,
// MRs), and the device may come back (driver reload, firmware reset, PCI recovery) as a device
// of the same name. reopen() opens it again: a new context and PD become the *current opening*
// (epoch + 1), and the event state starts clean. Objects built on an older opening keep it
// (their context stays open until the Hca is destroyed, so destroying them later is safe); a
// QP of an older opening counts as fatal (qpFatal). Thread-safety: every method may be called
// from any thread; ctx()/pd()/current() return the current opening at the time of the call.
class Hca {
 public:
  // Opens HCA `dev`. nullptr-equivalent (ok() false) with *err when it cannot.
  Hca(const std::string& dev, std::string* err);
  ~Hca();
  Hca(const Hca&) = delete;
  Hca& operator=(const Hca&) = delete;

  // One opening of the device: its context, protection domain and number (1 = the first);
  // `dead`: it reported DEVICE_FATAL (read with the rest, under one lock, by current()).
  struct Opening {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    uint64_t epoch = 0;
    bool dead = false;
  };

  bool ok() const;
  // The libibverbs table this HCA was opened with (valid whenever the Hca was constructed with
  // libibverbs loaded; ok() is false otherwise).
  const VerbsApi& api() const;
  const std::string& name() const { return dev_; }
  ibv_context* ctx() const { return current().ctx; }
  ibv_pd* pd() const { return current().pd; }
  // The current opening: build objects that belong together (CQ, QP, MR) on one snapshot.
  Opening current() const;
  uint64_t epoch() const { return current().epoch; }

  // What ibv_query_device said of the device when it was opened (re-read by reopen()); zeros
  // when the query failed. sysImageGuid: the same on every port and PCI function of one
  // adapter (host order); maxQp: the QPs the device can hold; physPorts: its port count.
  struct Attrs {
    uint64_t sysImageGuid = 0;
    int maxQp = 0;
    int physPorts = 0;
  };
  Attrs attrs() const;
  // The HCA's PCI device directory: the realpath of /sys/class/infiniband/<name>/device, as
  // NCCL's IB transport reports it; "" for a device with none (rxe and siw hang off no PCI
  // function of their own). Read once at construction.
  const std::string& pciPath() const { return pciPath_; }

  // Relaxed ordering of NCCL's buffers registered on this HCA (MrSet, verbs_mr.h): the owner's
  // choice (NCCL_IB_PCI_RELAXED_ORDERING with a libibverbs that has ibv_reg_mr_iova2; off
  // until set), and whether this HCA's kernel refused the flag with EINVAL (one that predates
  // optional access flags), after which it is never asked again. Both outlive reopen(), so a
  // re-registration on a new opening makes the same choice.
  void setRelaxedOrdering(bool on) { roWanted_.store(on, std::memory_order_release); }
  bool relaxedOrderingWanted() const { return roWanted_.load(std::memory_order_acquire); }
  // Wanted and not refused: what the next registration uses.
  bool relaxedOrdering() const { return relaxedOrderingWanted() && !relaxedOrderingRefused(); }
  bool relaxedOrderingRefused() const { return roRefused_.load(std::memory_order_acquire); }
  // Records a refusal (MrSet, after its retry without the flag succeeded).
  void noteRelaxedOrderingRefused() { roRefused_.store(true, std::memory_order_release); }
  // True once, for the first caller after the refusal was recorded: the one that logs it.
  bool takeRelaxedOrderingRefusal() {
    return relaxedOrderingRefused() && !roRefusalTaken_.exchange(true, std::memory_order_acq_rel);
  }

  // Opens the device named name() again (after DEVICE_FATAL: the caller decides when). On
  // success the new context and PD become current, deviceFatal() is false again and fatal-QP
  // state is cleared; the old opening is kept until destruction. false with *err ("no RDMA
  // device named ...", "cannot open ...", "ibv_alloc_pd ...") when the device is not back.
  bool reopen(std::string* err);

  // Reads every pending async event of the current opening without blocking and folds it into
  // the per-port and per-QP state below; returns the events read by this call (other callers may
  // have read earlier ones: use the counters for decisions, not this list). Nothing is read
  // once the current opening reported DEVICE_FATAL (its event file only reports errors then).
  std::vector<AsyncEvent> pollAsync();
  // pollAsync() for the data path (a path's progress, called from NCCL's proxy thread on every
  // test()): reading the event file is a read() system call even when it is empty, on rxe as on
  // mlx5. While a watcher thread blocks on the event file and reads what arrives (setWatched(true):
  // the RDMA transport's port watch), this reads only when nobody has read for
  // kDataPathReadUs, a backstop for a watcher that runs late on a busy host; so a port event
  // reaches the paths at most kDataPathReadUs after it would have otherwise. Unwatched, it is
  // pollAsync(). Returns what this call read (usually nothing: use the counters).
  std::vector<AsyncEvent> pollAsyncFromDataPath();
  // Whether a watcher thread reads this HCA's event file as events arrive (see above).
  void setWatched(bool on) { watched_.store(on, std::memory_order_release); }
  // 1 ms: ours. The extra delay it allows is small against the 20 ms local-fault target, and it
  // takes the data path's event reads from one per progress call (~10^5-10^6 per second with a
  // spinning proxy thread) to at most 1000 per second per HCA.
  static constexpr uint64_t kDataPathReadUs = 1000;
  // Number of read attempts on the event file so far (pollAsync() calls that reached it), for
  // tests and diagnostics.
  uint64_t asyncReads() const { return asyncReads_.load(std::memory_order_relaxed); }
  // Number of IBV_EVENT_PORT_ERR events seen so far on `port` of this HCA (events of another
  // port or HCA never count here; counts run on across re-openings).
  uint64_t portErrors(int port);
  // Number of port state events (IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE) seen on `port`
  // (a watcher re-reads the port's state when it moves).
  uint64_t portStateEvents(int port);
  // True once IBV_EVENT_DEVICE_FATAL was seen on the current opening (every QP, MR and port
  // of it is gone) and until reopen() succeeds.
  bool deviceFatal();
  // Number of GID table changes (IBV_EVENT_GID_CHANGE) seen on `port`.
  uint64_t gidChanges(int port);
  // Number of LID changes (IBV_EVENT_LID_CHANGE: the subnet manager gave `port` another LID,
  // InfiniBand) seen on `port`; a watcher re-reads the port's LID when it moves.
  uint64_t lidChanges(int port);
  // The LID of `port` as the port watch last read it (InfiniBand; ibv_query_port after the port
  // came up or after IBV_EVENT_LID_CHANGE), and how often that known value changed. `lid` 0
  // means "not read yet" and never counts as a change. A path whose own LID (the one its QPs
  // were connected with) differs from a known LID is dead: the peer's QPs address the old one.
  void notePortLid(int port, uint16_t lid);
  // *changes (may be null) gets the change count; returns the LID (0: not known).
  uint16_t portLid(int port, uint64_t* changes);
  // For a path's poll (one lock instead of two): *portErrors as portErrors(port), *lidChanges
  // and the result as portLid(port, ...).
  uint16_t portStatus(int port, uint64_t* portErrors, uint64_t* lidChanges);
  // True when QP `qpn` of opening `epoch` is dead: a fatal QP event (QP_FATAL, QP_REQ_ERR,
  // QP_ACCESS_ERR, PATH_MIG_ERR) named it, or its opening reported DEVICE_FATAL or was replaced
  // by a re-open. *what gets the event name.
  bool qpFatal(uint32_t qpn, uint64_t epoch, std::string* what);
  // QP `qpn` of opening `epoch` was destroyed: its number may be given to a new QP, which must
  // not inherit the old one's fatal event. Called by ~RcQp after ibv_destroy_qp.
  void forgetQp(uint32_t qpn, uint64_t epoch);

 private:
  std::string dev_;
  const VerbsApi* api_ = nullptr;
  mutable std::mutex mu_;
  Opening cur_;                    // guarded by mu_
  Attrs attrs_;                    // guarded by mu_
  std::string pciPath_;
  std::vector<Opening> retired_;   // older openings, closed by the destructor
  std::vector<uint64_t> portErr_, gidChg_, lidChg_, portEv_;  // index = port number
  std::vector<uint16_t> lid_;        // index = port number; 0: not known (notePortLid)
  std::vector<uint64_t> lidMoves_;   // index = port number
  std::unordered_set<uint32_t> fatalQps_;
  std::string fatalWhat_;
  bool deviceFatal_ = false;
  std::atomic<bool> watched_{false};
  std::atomic<uint64_t> lastReadUs_{0};  // when pollAsync() last read the event file (any thread)
  std::atomic<uint64_t> asyncReads_{0};
  std::atomic<bool> roWanted_{false}, roRefused_{false}, roRefusalTaken_{false};
  bool openOnce(Opening* o, Attrs* a, std::string* err);  // opens dev_ into *o, *a (no lock held)
};

uint64_t nowUs();  // CLOCK_MONOTONIC, µs
std::string gidString(const ibv_gid& g);

}  // namespace verbs
}  // namespace railover
