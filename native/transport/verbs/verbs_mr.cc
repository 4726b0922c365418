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

ibv_mr* MrSet::registerOn(const Hca::Opening& o, size_t i) {
  const VerbsApi& api = hcas_[i]->api();
  if (!dmabuf_) return api.reg_mr(o.pd, addr_, size_, kMrAccess);
  if (fd_ < 0) return errno = EBADF, nullptr;
  // iova = the address NCCL uses for the buffer, so remote keys and addresses match regMr's.
  return api.reg_dmabuf_mr(o.pd, offset_, size_, (uint64_t)(uintptr_t)addr_, fd_, kMrAccess);
}

MrSet::MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, std::string* err)
    : hcas_(hcas), slots_(new Slot[hcas.size()]), addr_(addr), size_(size) {
  ok_ = true;
  for (size_t i = 0; i < hcas_.size() && ok_ && size_; ++i) ok_ = refresh(i, err);
  if (!ok_) {
    for (size_t j = 0; j < hcas_.size(); ++j)
      if (ibv_mr* m = slots_[j].mr.exchange(nullptr)) hcas_[j]->api().dereg_mr(m);
  }
}

MrSet::MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, uint64_t offset, int fd, std::string* err)
    : hcas_(hcas), slots_(new Slot[hcas.size()]), addr_(addr), size_(size), dmabuf_(true), offset_(offset) {
  if (size && !hcas.empty() && !hcas[0]->api().reg_dmabuf_mr) {
    *err = "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later registers dmabufs)";
    return;
  }
  if (size) {
    fd_ = fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (fd_ < 0) {
      *err = std::string("dmabuf fd ") + std::to_string(fd) + ": " + std::strerror(fd < 0 ? EBADF : errno);
      return;
    }
  }
  ok_ = true;
  for (size_t i = 0; i < hcas_.size() && ok_ && size_; ++i) ok_ = refresh(i, err);
  if (!ok_) {
    for (size_t j = 0; j < hcas_.size(); ++j)
      if (ibv_mr* m = slots_[j].mr.exchange(nullptr)) hcas_[j]->api().dereg_mr(m);
  }
}

bool MrSet::refresh(size_t i, std::string* err) {
  if (size_ == 0) return true;
  std::lock_guard<std::mutex> g(mu_);
  Hca& h = *hcas_[i];
  Hca::Opening o = h.current();
  if (!o.pd || h.deviceFatal()) {  // nothing can be registered on a dead opening
    if (slots_[i].epoch == 0 && !slots_[i].mr.load(std::memory_order_relaxed)) return true;  // skipped until re-opened
    *err = std::string(callName(dmabuf_)) + "(" + h.name() + "): the HCA reported a device fatal error";
    return false;
  }
  if (slots_[i].mr.load(std::memory_order_relaxed) && slots_[i].epoch == o.epoch) return true;
  ibv_mr* m = registerOn(o, i);
  if (!m) {
    int e = errno;
    h.pollAsync();  // a device that died just now: skip it like one that was dead already
    if (h.deviceFatal() && !slots_[i].mr.load(std::memory_order_relaxed)) return true;
    *err = std::string(callName(dmabuf_)) + "(" + h.name() + ", " + std::to_string(size_) + " bytes): " + std::strerror(e);
    return false;
  }
  if (ibv_mr* old = slots_[i].mr.exchange(m, std::memory_order_acq_rel)) retired_.push_back({i, old});
  slots_[i].epoch = o.epoch;
  return true;
}

uint64_t MrSet::epochOf(size_t i) const {
  std::lock_guard<std::mutex> g(mu_);
  return slots_[i].epoch;
}

MrSet::~MrSet() {
  for (size_t j = 0; j < hcas_.size(); ++j)
    if (ibv_mr* m = slots_[j].mr.load()) hcas_[j]->api().dereg_mr(m);
  for (auto& r : retired_) hcas_[r.first]->api().dereg_mr(r.second);  // an old opening's: errors ignored
  if (fd_ >= 0) close(fd_);
}

int MrSet::indexOf(const Hca* h) const {
  for (size_t i = 0; i < hcas_.size(); ++i)
    if (hcas_[i] == h) return static_cast<int>(i);
  return -1;
}

}  // namespace verbs
}  // namespace railover
