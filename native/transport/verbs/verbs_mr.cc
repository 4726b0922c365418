#include "transport/verbs/verbs_mr.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace railover {
namespace verbs {

namespace {
const char* callName(bool dmabuf) { return dmabuf ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr"; }
}  // namespace

ibv_mr* MrSet::registerWith(const Hca::Opening& o, size_t i, int access) {
  const VerbsApi& api = hcas_[i]->api();
  // iova = the buffer's address (as ibv_reg_mr gives it), so keys and addresses match regMr's.
  const uint64_t iova = (uint64_t)(uintptr_t)addr_;
  if (!dmabuf_) {
    // The flag goes through ibv_reg_mr_iova2, as in NCCL: libibverbs' exported ibv_reg_mr
    // predates optional access flags.
    if (access & IBV_ACCESS_RELAXED_ORDERING) return api.reg_mr_iova2(o.pd, addr_, size_, iova, (unsigned)access);
    return api.reg_mr(o.pd, addr_, size_, access);
  }
  int fd = fd_ >= 0 ? fd_ : tmpFd_;
  if (fd < 0) return errno = dupErr_ ? dupErr_ : EBADF, nullptr;
  return api.reg_dmabuf_mr(o.pd, offset_, size_, iova, fd, access);
}

ibv_mr* MrSet::registerOn(const Hca::Opening& o, size_t i, bool* withRo) {
  Hca& h = *hcas_[i];
  const bool ro = h.relaxedOrdering() && (dmabuf_ || h.api().reg_mr_iova2);
  ibv_mr* m = registerWith(o, i, ro ? kMrAccess | IBV_ACCESS_RELAXED_ORDERING : kMrAccess);
  *withRo = m && ro;
  if (m || !ro || errno != EINVAL) return m;
  // IBV_ACCESS_RELAXED_ORDERING is optional (a device without it ignores it), but a kernel that
  // predates optional access flags refuses it with EINVAL: once more without it, and when that
  // works the HCA is not asked again (Hca::noteRelaxedOrderingRefused; its owner logs it).
  m = registerWith(o, i, kMrAccess);
  if (m) h.noteRelaxedOrderingRefused();
  return m;
}

bool MrSet::relaxedOrdering(size_t i) const {
  const Reg* r = slots_[i].cur.load(std::memory_order_acquire);
  return r && r->relaxedOrdering;
}

MrSet::MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, std::string* err)
    : hcas_(hcas), slots_(new Slot[hcas.size()]), addr_(addr), size_(size) {
  ok_ = true;
  for (size_t i = 0; i < hcas_.size() && ok_ && size_; ++i) ok_ = refresh(i, err);
  if (!ok_) dropAll();
}

MrSet::MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, uint64_t offset, int fd, std::string* err)
    : hcas_(hcas), slots_(new Slot[hcas.size()]), addr_(addr), size_(size), dmabuf_(true), offset_(offset) {
  if (size && !hcas.empty() && !hcas[0]->api().reg_dmabuf_mr) {
    *err = "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later registers dmabufs)";
    return;
  }
  if (size) {
    if (fd < 0) {
      *err = std::string("dmabuf fd ") + std::to_string(fd) + ": " + std::strerror(EBADF);
      return;
    }
    fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (fd_ < 0) {
      // Out of descriptors (EMFILE): register with NCCL's fd now, but this set cannot be
      // registered again after a device fatal error (refresh() says so).
      dupErr_ = errno;
      tmpFd_ = fd;
    }
  }
  ok_ = true;
  for (size_t i = 0; i < hcas_.size() && ok_ && size_; ++i) ok_ = refresh(i, err);
  tmpFd_ = -1;  // NCCL's fd is only good inside regMrDmaBuf: every HCA was registered with it
  if (!ok_) dropAll();
}

bool MrSet::refresh(size_t i, std::string* err) {
  if (size_ == 0) return true;
  std::lock_guard<std::mutex> g(mu_);
  Hca& h = *hcas_[i];
  for (int attempt = 0;; ++attempt) {
    Hca::Opening o = h.current();  // its `dead` flag is read with it (one lock)
    const Reg* cur = slots_[i].cur.load(std::memory_order_relaxed);
    if (!o.pd || o.dead) {  // nothing can be registered on a dead opening
      if (!cur) return true;  // skipped until re-opened
      *err = std::string(callName(dmabuf_)) + "(" + h.name() + "): the HCA reported a device fatal error";
      return false;
    }
    if (cur && cur->epoch == o.epoch) return true;
    bool ro = false;
    ibv_mr* m = registerOn(o, i, &ro);
    if (!m) {
      int e = errno;
      h.pollAsync();  // a device that died just now: skip it like one that was dead already
      Hca::Opening now = h.current();
      if (now.epoch != o.epoch && attempt == 0) continue;  // re-opened meanwhile: once more on the new one
      if (now.dead && now.epoch == o.epoch && !cur) return true;
      *err = std::string(callName(dmabuf_)) + "(" + h.name() + ", " + std::to_string(size_) + " bytes): " + std::strerror(e);
      return false;
    }
    regs_.emplace_back(i, std::unique_ptr<Reg>(new Reg{m, o.epoch, ro}));
    slots_[i].cur.store(regs_.back().second.get(), std::memory_order_release);
    return true;
  }
}

uint64_t MrSet::epochOf(size_t i) const {
  const Reg* r = slots_[i].cur.load(std::memory_order_acquire);
  return r ? r->epoch : 0;
}

void MrSet::dropAll() {
  for (size_t j = 0; j < hcas_.size(); ++j) slots_[j].cur.store(nullptr);
  for (auto& r : regs_) hcas_[r.first]->api().dereg_mr(r.second->mr);
  regs_.clear();
}

MrSet::~MrSet() {
  dropAll();  // the replaced registrations too (an old opening's: errors ignored)
  if (fd_ >= 0) close(fd_);
}

int MrSet::indexOf(const Hca* h) const {
  for (size_t i = 0; i < hcas_.size(); ++i)
    if (hcas_[i] == h) return static_cast<int>(i);
  return -1;
}

}  // namespace verbs
}  // namespace railover
