// Verbs building blocks, part 5: GPUDirect RDMA (GDR) support and the flush NCCL's iflush asks.
//
// Detection, as NCCL's IB transport detects it (so railover advertises GPU memory exactly where
// NCCL's own transport would):
//  * NCCL_PTR_CUDA: a peer-memory client lets ibv_reg_mr pin GPU memory. It is present when one
//    of these files exists: /sys/kernel/mm/memory_peers/nv_mem/version (nv_peer_mem),
//    /sys/kernel/mm/memory_peers/nv_mem_nc/version (its non-coherent variant), or
//    /sys/module/nvidia_peermem/version (the module shipped with the NVIDIA driver since 470).
//  * NCCL_PTR_DMABUF: libibverbs has ibv_reg_dmabuf_mr and the HCA's kernel driver implements
//    it. Probed with an invalid descriptor: ibv_reg_dmabuf_mr(pd, 0, 0, 0, fd -1, 0) fails with
//    EOPNOTSUPP or EPROTONOSUPPORT where the driver has no dmabuf support, and with another
//    errno (EBADF) where it has. Whether the CUDA driver can export dmabufs is NCCL's own check.
//
// Flush (iflush). A NIC writes GPU memory with posted PCIe writes; before NCCL tells a kernel
// that data arrived it must be sure those writes are visible to the GPU. An RDMA READ from the
// same HCA to the same memory cannot complete before the HCA's earlier writes there (PCIe
// ordering: a read does not pass posted writes on its path), so a 1-byte READ of the receive
// buffer through a QP connected to itself, completed, is the flush. NCCL's IB transport does
// the same with one such QP per receive comm; railover keeps one per HCA (FlushQp), shared by
// every comm on that HCA.
//
// Thread-safety: gdrPeerMemLoaded and dmabufSupported are reentrant. A FlushQp is thread-safe
// (an internal mutex: NCCL's progress threads of several comms may flush through one HCA).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_qp.h"

namespace railover {
namespace verbs {

// True when a GPU peer-memory client is loaded (the files above, under `sysRoot`: "" = the
// real /sys; tests pass a directory of their own). *which names the file found.
bool gdrPeerMemLoaded(const std::string& sysRoot = "", std::string* which = nullptr);

// True when HCA `h` registers dmabufs (the probe above). *why says why not.
bool dmabufSupported(Hca& h, std::string* why = nullptr);

// One RC QP connected to itself on an HCA port, with an 8-byte host landing buffer: the target
// of flush READs. Each READ is a ticket; RC completes the READs of one QP in order, so a
// ticket is done once a later or equal one has completed.
class FlushQp {
 public:
  // Depth: READs that may be outstanding at once (a flush asked beyond it waits in test()).
  static constexpr int kDepth = 64;
  // Creates the QP and brings it to RTS towards itself (QP state changes may resolve the
  // port's own address: not for NCCL's progress thread). ok() false with *err otherwise.
  FlushQp(Hca& hca, const PortSel& port, const RcParams& rc, std::string* err);
  ~FlushQp();
  FlushQp(const FlushQp&) = delete;
  FlushQp& operator=(const FlushQp&) = delete;
  bool ok() const { return ok_; }
  Hca& hca() const { return qp_->hca(); }
  ibv_qp* qp() const { return qp_->qp(); }  // tests: the QP whose READs a fake provider delivers

  // Asks for a 1-byte READ of `addr` (registered on this HCA with remote key `rkey`). Returns a
  // ticket (> 0). The READ is posted at once when the QP has room, else by a later test().
  uint64_t request(uint64_t addr, uint32_t rkey);
  // 1 when `ticket`'s READ has completed, 0 while it has not, -1 with *err when the QP failed
  // (an error completion: the port went down or the HCA failed; every ticket then fails).
  int test(uint64_t ticket, std::string* err);
  // READs completed so far (tests, diagnostics).
  uint64_t completed();

 private:
  void postQueued();  // under mu_
  void pollCq();      // under mu_
  std::mutex mu_;
  std::unique_ptr<RcQp> qp_;
  ibv_mr* landingMr_ = nullptr;
  uint64_t landing_ = 0;   // the READs' destination (8 bytes; only byte 0 is written)
  struct Want {
    uint64_t addr;
    uint32_t rkey;
  };
  std::vector<Want> queued_;  // asked, not yet posted (QP full)
  uint64_t nextTicket_ = 1;   // the next ticket handed out
  uint64_t posted_ = 0;       // tickets <= posted_ are posted
  uint64_t done_ = 0;         // tickets <= done_ have completed
  std::string failed_;        // set once an error completion was seen
  bool ok_ = false;
};

}  // namespace verbs
}  // namespace railover
