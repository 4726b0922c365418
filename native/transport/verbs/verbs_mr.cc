#include "transport/verbs/verbs_mr.h"

#include <cerrno>
#include <cstring>

namespace railover {
namespace verbs {

MrSet::MrSet(const std::vector<Hca*>& hcas, void* addr, size_t size, std::string* err)
    : hcas_(hcas), mrs_(hcas.size(), nullptr), addr_(addr), size_(size) {
  if (size == 0) {
    ok_ = true;
    return;
  }
  for (size_t i = 0; i < hcas.size(); ++i) {
    mrs_[i] = hcas[i]->api().reg_mr(hcas[i]->pd(), addr, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mrs_[i]) {
      *err = "ibv_reg_mr(" + hcas[i]->name() + ", " + std::to_string(size) + " bytes): " + std::strerror(errno);
      for (size_t j = 0; j < mrs_.size(); ++j)
        if (mrs_[j]) hcas[j]->api().dereg_mr(mrs_[j]), mrs_[j] = nullptr;
      return;
    }
  }
  ok_ = true;
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
