#include "transport/verbs/verbs_gdr.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace railover {
namespace verbs {

bool gdrPeerMemLoaded(const std::string& sysRoot, std::string* which) {
  static const char* const kFiles[] = {"/sys/kernel/mm/memory_peers/nv_mem/version",
                                       "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
                                       "/sys/module/nvidia_peermem/version"};
  for (const char* f : kFiles) {
    std::string p = sysRoot.empty() ? std::string(f) : sysRoot + (f + 4);  // sysRoot replaces "/sys"
    if (access(p.c_str(), F_OK) == 0) {
      if (which) *which = f;
      return true;
    }
  }
  return false;
}

bool dmabufSupported(Hca& h, std::string* why) {
  std::string ignored;
  if (!why) why = &ignored;
  if (!h.ok()) return *why = "HCA " + h.name() + " is not open", false;
  auto reg = h.api().reg_dmabuf_mr;
  if (!reg) return *why = "this libibverbs has no ibv_reg_dmabuf_mr", false;
  errno = 0;
  ibv_mr* mr = reg(h.pd(), 0, 0, 0, -1, 0);
  if (mr) {  // cannot happen with fd -1; never leak it if a provider accepts it anyway
    h.api().dereg_mr(mr);
    return true;
  }
  if (errno == EOPNOTSUPP || errno == EPROTONOSUPPORT) {
    *why = "HCA " + h.name() + ": ibv_reg_dmabuf_mr is not supported by its driver (" + std::strerror(errno) + ")";
    return false;
  }
  return true;
}

FlushQp::FlushQp(Hca& hca, const PortSel& port, const RcParams& rc, std::string* err) {
  qp_.reset(new RcQp(hca, port, kDepth, 1, err));
  if (!qp_->ok()) return;
  landingMr_ = hca.api().reg_mr(qp_->qp()->pd, &landing_, sizeof(landing_), IBV_ACCESS_LOCAL_WRITE);
  if (!landingMr_) {
    *err = "ibv_reg_mr(" + hca.name() + ", flush landing buffer): " + std::strerror(errno);
    return;
  }
  if (!qp_->toInit(rc.pkeyIndex, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE, err)) return;
  if (!qp_->toRts(qp_->local(), rc, err)) {
    *err = "flush QP on " + hca.name() + ": " + *err;
    return;
  }
  ok_ = true;
}

FlushQp::~FlushQp() {
  Hca& h = qp_->hca();
  qp_.reset();  // the QP first: its READs target the landing buffer
  if (landingMr_) h.api().dereg_mr(landingMr_);
}

uint64_t FlushQp::request(uint64_t addr, uint32_t rkey) {
  std::lock_guard<std::mutex> g(mu_);
  uint64_t t = nextTicket_++;
  queued_.push_back({addr, rkey});
  if (failed_.empty()) postQueued();
  return t;
}

void FlushQp::postQueued() {
  size_t n = 0;
  for (; n < queued_.size() && posted_ - done_ < (uint64_t)kDepth; ++n) {
    ibv_sge sge{};
    sge.addr = (uint64_t)(uintptr_t)&landing_;
    sge.length = 1;
    sge.lkey = landingMr_->lkey;
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = posted_ + 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = queued_[n].addr;
    wr.wr.rdma.rkey = queued_[n].rkey;
    int rc = ibv_post_send(qp_->qp(), &wr, &bad);
    if (rc) {
      failed_ = "flush READ on " + qp_->hca().name() + ": ibv_post_send: " + std::strerror(rc);
      break;
    }
    ++posted_;
  }
  queued_.erase(queued_.begin(), queued_.begin() + (long)n);
}

void FlushQp::pollCq() {
  ibv_wc wc[16];
  int n;
  while ((n = ibv_poll_cq(qp_->cq(), 16, wc)) > 0) {
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        if (failed_.empty())
          failed_ = "flush READ on " + qp_->hca().name() + " completed with " +
                    qp_->hca().api().wc_status_str(wc[i].status);
        continue;
      }
      if (wc[i].wr_id > done_) done_ = wc[i].wr_id;
    }
  }
}

int FlushQp::test(uint64_t ticket, std::string* err) {
  std::lock_guard<std::mutex> g(mu_);
  if (ticket <= done_) return 1;
  if (failed_.empty()) {
    pollCq();
    if (failed_.empty()) postQueued();
  }
  if (ticket <= done_) return 1;
  std::string what;
  if (failed_.empty() && qp_->hca().qpFatal(qp_->qp()->qp_num, qp_->epoch(), &what))
    failed_ = "flush QP on " + qp_->hca().name() + ": " + what;  // a dead HCA may never complete it
  if (!failed_.empty()) return *err = failed_, -1;
  return 0;
}

uint64_t FlushQp::completed() {
  std::lock_guard<std::mutex> g(mu_);
  return done_;
}

}  // namespace verbs
}  // namespace railover
