#include "transport/verbs/verbs_mr.h"

#include <cerrno>
#include <cstring>

namespace railover {
namespace verbs {

MrSet::MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, std::string* err)
    : hcas_(hcas), mrs_(hcas.size(), nullptr), addr_(addr), size_(size) {
  ok_ = registerAll([&](Hca& h) { return h.api().reg_mr(h.pd(), addr, size, kMrAccess); }, "ibv_reg_mr", err);
}

MrSet::MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, uint64_t offset, int fd, std::string* err)
    : hcas_(hcas), mrs_(hcas.size(), nullptr), addr_(addr), size_(size) {
  if (size && !hcas.empty() && !hcas[0]->api().reg_dmabuf_mr) {
    *err = "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later registers dmabufs)";
    return;
  }
  // iova = the address NCCL uses for the buffer, so remote keys and addresses match regMr's.
  ok_ = registerAll(
      [&](Hca& h) { return h.api().reg_dmabuf_mr(h.pd(), offset, size, (uint64_t)(uintptr_t)addr, fd, kMrAccess); },
      "ibv_reg_dmabuf_mr", err);
}

bool MrSet::registerAll(const std::function<ibv_mr*(Hca&)>& reg, const char* call, std::string* err) {
  if (size_ == 0) return true;
  for (size_t i = 0; i < hcas_.size(); ++i) {
    mrs_[i] = reg(*hcas_[i]);
    if (!mrs_[i]) {
      *err = std::string(call) + "(" + hcas_[i]->name() + ", " + std::to_string(size_) + " bytes): " + std::strerror(errno);
      for (size_t j = 0; j < mrs_.size(); ++j)
        if (mrs_[j]) hcas_[j]->api().dereg_mr(mrs_[j]), mrs_[j] = nullptr;
      return false;
    }
  }
  return true;
}

MrSet::~MrSet() {
  for (size_t j = 0; j < mrs_.size(); ++j)
    if (mrs_[j]) hcas_[j]->api().dereg_mr(mrs_[j]);
}

int MrSet::indexOf(const Hca* h) const {
  for (size_t i = 0; i < hcas_.size(); ++i)
    if (hcas_[i] == h) return static_cast<int>(i);
  return -1;
}

}  // namespace verbs
}  // namespace railover
