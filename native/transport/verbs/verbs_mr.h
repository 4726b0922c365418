// Verbs building blocks, part 2: a buffer registered on every HCA a comm may use.
//
// A comm's primary and standby paths run on different HCAs, and an RDMA key is only valid on the
// HCA (protection domain) that issued it. So a buffer is registered once per HCA, at once, when
// NCCL registers it (regMr): after a failover the resend on the standby uses the standby HCA's
// lkey for its source and the receiver's standby-HCA rkey for the target, without registering
// anything on the failover path. Index i of the set is the i-th Hca given at construction.
//
// Access: LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ (receive buffers are RDMA WRITE targets;
// LOCAL_WRITE is required by verbs whenever REMOTE_WRITE is set; REMOTE_READ lets the flush QP
// of verbs_gdr.h read a receive buffer, as iflush does after GPUDirect writes, the same access
// NCCL's IB transport gives its buffers), plus IBV_ACCESS_RELAXED_ORDERING on an HCA whose
// Hca::relaxedOrdering() is on (NCCL_IB_PCI_RELAXED_ORDERING, set by the RDMA transport): host
// and GPU memory through ibv_reg_mr_iova2 (iova = the address), dmabufs through
// ibv_reg_dmabuf_mr, as NCCL's reg.cc does. A registration the kernel refuses with EINVAL
// because of the flag is made again without it, and the HCA remembers not to use it
// (Hca::noteRelaxedOrderingRefused). Thread-safety: immutable after construction.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/verbs/verbs_device.h"

namespace railover {
namespace verbs {

//
// After an HCA's DEVICE_FATAL its registrations are gone. A set made while one of its HCAs is
// dead skips that HCA (its keys are 0 until refreshed); refresh(i) registers the buffer again
// on HCA i's current opening (Hca::reopen). A dmabuf's fd is duplicated at construction and
// kept until destruction, so it can be registered again after NCCL closed its own fd.
// Thread-safety: lkey()/rkey() may be called from any thread while refresh() runs on another
// (keys are swapped atomically; a replaced MR stays registered until destruction).
class MrSet {
 public:
  // Registers [addr, addr+size) on every HCA in `hcas`; ok() false with *err (naming the HCA and
  // errno) if any registration on a live HCA fails, in which case none is kept. An HCA whose
  // current opening reported DEVICE_FATAL is skipped (refresh() later). size 0 is allowed (no MR).
  MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, std::string* err);
  // The same for a dmabuf (NCCL's regMrDmaBuf: GPU memory exported by the CUDA driver as file
  // descriptor `fd`, [offset, offset+size) of it mapped at `addr`): ibv_reg_dmabuf_mr on every
  // HCA, inside this call (NCCL closes the fd when regMrDmaBuf returns; a duplicate is kept for
  // refresh()). Fails with *err when this libibverbs has no ibv_reg_dmabuf_mr or an HCA refuses
  // (errno named).
  MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, uint64_t offset, int fd, std::string* err);
  ~MrSet();
  MrSet(const MrSet&) = delete;
  MrSet& operator=(const MrSet&) = delete;

  bool ok() const { return ok_; }
  void* addr() const { return addr_; }
  size_t size() const { return size_; }
  size_t count() const { return hcas_.size(); }
  // Keys on HCA index i (0 when size is 0: a zero-length WRITE needs no key; 0 while HCA i is
  // dead and not refreshed).
  uint32_t lkey(size_t i) const {
    const Reg* r = slots_[i].cur.load(std::memory_order_acquire);
    return r ? r->mr->lkey : 0;
  }
  uint32_t rkey(size_t i) const {
    const Reg* r = slots_[i].cur.load(std::memory_order_acquire);
    return r ? r->mr->rkey : 0;
  }
  // The keys on HCA index i only if they belong to HCA opening `epoch` (the QP that will use
  // them: RcQp::epoch()); false while the buffer is not (yet) registered on that opening, so a
  // QP of a re-opened HCA never posts a key of the dead one. A 0-byte set has no keys (0) and
  // is valid on every opening.
  bool keysOn(size_t i, uint64_t epoch, uint32_t* lkey, uint32_t* rkey) const {
    if (size_ == 0) return *lkey = 0, *rkey = 0, true;
    const Reg* r = slots_[i].cur.load(std::memory_order_acquire);
    if (!r || r->epoch != epoch) return false;
    return *lkey = r->mr->lkey, *rkey = r->mr->rkey, true;
  }
  // Registers the buffer on HCA i's current opening unless it is registered there already.
  // false with *err (call, HCA, errno) when that fails, or when the current opening is dead and
  // holds this buffer's keys (they are dead too); the old keys stay meanwhile. true with nothing
  // done for a slot that was skipped because its HCA was dead and still is.
  bool refresh(size_t i, std::string* err);
  // The HCA opening (Hca::epoch) HCA i's keys belong to; 0: none (dead when registered).
  uint64_t epochOf(size_t i) const;
  // Index of `h` in the set, -1 if it is not one of its HCAs.
  int indexOf(const Hca* h) const;
  // Whether HCA i's current registration has IBV_ACCESS_RELAXED_ORDERING (false: none, or
  // registered without it).
  bool relaxedOrdering(size_t i) const;

 private:
  struct Reg {  // one registration, immutable once published
    ibv_mr* mr;
    uint64_t epoch;  // the HCA opening it is on
    bool relaxedOrdering;  // registered with IBV_ACCESS_RELAXED_ORDERING
  };
  struct Slot {
    std::atomic<const Reg*> cur{nullptr};
  };
  std::vector<Hca*> hcas_;
  std::unique_ptr<Slot[]> slots_;
  std::vector<std::pair<size_t, std::unique_ptr<Reg>>> regs_;  // every Reg ever published (guarded by mu_)
  mutable std::mutex mu_;  // refresh()
  void* addr_;
  size_t size_;
  bool dmabuf_ = false;
  uint64_t offset_ = 0;
  int fd_ = -1;     // the dmabuf's duplicated fd (-1: none)
  int tmpFd_ = -1;  // NCCL's own fd, during the constructor only when it could not be duplicated
  int dupErr_ = 0;  // errno of that failed duplication (refresh() reports it)
  void dropAll();   // deregisters every registration, current and replaced
  bool ok_ = false;
  // One registration (with relaxed ordering when HCA i wants it, once more without it after an
  // EINVAL); errno on failure; *withRo: whether the flag is on the MR.
  ibv_mr* registerOn(const Hca::Opening& o, size_t i, bool* withRo);
  ibv_mr* registerWith(const Hca::Opening& o, size_t i, int access);  // one call with `access`
};

// Access flags of every railover registration of NCCL's buffers (see above; relaxed ordering
// added where chosen). railover's own control and flush buffers (verbs_path.cc, verbs_gdr.cc)
// are registered with IBV_ACCESS_LOCAL_WRITE alone and never relaxed ordering: NCCL registers
// its internal ones (FIFOs, completion records, the flush buffer) with plain ibv_reg_mr too.
constexpr int kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

}  // namespace verbs
}  // namespace railover
