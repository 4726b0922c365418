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
// NCCL's IB transport gives its buffers). Thread-safety: immutable after construction.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "transport/verbs/verbs_device.h"

namespace railover {
namespace verbs {

class MrSet {
 public:
  // Registers [addr, addr+size) on every HCA in `hcas`; ok() false with *err (naming the HCA and
  // errno) if any registration fails, in which case none is kept. size 0 is allowed (no MR).
  MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, std::string* err);
  // The same for a dmabuf (NCCL's regMrDmaBuf: GPU memory exported by the CUDA driver as file
  // descriptor `fd`, [offset, offset+size) of it mapped at `addr`): ibv_reg_dmabuf_mr on every
  // HCA, inside this call (NCCL closes the fd when regMrDmaBuf returns). Fails with *err when
  // this libibverbs has no ibv_reg_dmabuf_mr or an HCA refuses (errno named).
  MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, uint64_t offset, int fd, std::string* err);
  ~MrSet();
  MrSet(const MrSet&) = delete;
  MrSet& operator=(const MrSet&) = delete;

  bool ok() const { return ok_; }
  void* addr() const { return addr_; }
  size_t size() const { return size_; }
  size_t count() const { return mrs_.size(); }
  // Keys on HCA index i (0 when size is 0: a zero-length WRITE needs no key).
  uint32_t lkey(size_t i) const { return mrs_[i] ? mrs_[i]->lkey : 0; }
  uint32_t rkey(size_t i) const { return mrs_[i] ? mrs_[i]->rkey : 0; }
  // Index of `h` in the set, -1 if it is not one of its HCAs.
  int indexOf(const Hca* h) const;

 private:
  std::vector<Hca*> hcas_;
  std::vector<ibv_mr*> mrs_;
  void* addr_;
  size_t size_;
  bool ok_ = false;
  bool registerAll(const std::function<ibv_mr*(Hca&)>& reg, const char* call, std::string* err);
};

// Access flags of every railover registration (see above).
constexpr int kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

}  // namespace verbs
}  // namespace railover
