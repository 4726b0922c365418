#include "transport/verbs/verbs_path.h"

#include <arpa/inet.h>
#include <endian.h>
#include <poll.h>

#include <cerrno>
#include <cstring>

namespace railover {
namespace verbs {

namespace {
constexpr uint64_t kRecvTag = 1ull << 63;  // wr_id bit: a receive work request

void put64(uint8_t* p, uint64_t v) {
  v = htobe64(v);
  std::memcpy(p, &v, 8);
}
uint64_t get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return be64toh(v);
}
}  // namespace

namespace ctlwire {
void encodeAdvert(const Advert& a, uint8_t out[kBytes]) {
  std::memset(out, 0, kBytes);
  out[0] = kAdvert;
  uint32_t rk = htonl(a.rkey);
  std::memcpy(out + 4, &rk, 4);
  put64(out + 8, a.seq);
  put64(out + 16, a.addr);
  put64(out + 24, a.size);
  put64(out + 32, a.tag);
}

void encodeCtl(const CtlMsg& m, uint8_t out[kBytes]) {
  std::memset(out, 0, kBytes);
  out[0] = kControl;
  out[1] = static_cast<uint8_t>(m.type);
  put64(out + 8, m.seq);
  put64(out + 16, m.arg);
}

int decode(const uint8_t in[kBytes], Advert* a, CtlMsg* m) {
  if (in[0] == kAdvert) {
    uint32_t rk;
    std::memcpy(&rk, in + 4, 4);
    a->rkey = ntohl(rk);
    a->seq = get64(in + 8);
    a->addr = get64(in + 16);
    a->size = get64(in + 24);
    a->tag = get64(in + 32);
    return kAdvert;
  }
  if (in[0] == kControl && in[1] >= static_cast<uint8_t>(CtlType::kAck) &&
      in[1] <= static_cast<uint8_t>(CtlType::kClose)) {
    m->type = static_cast<CtlType>(in[1]);
    m->seq = get64(in + 8);
    m->arg = get64(in + 16);
    return kControl;
  }
  return 0;
}
}  // namespace ctlwire

PathBase::PathBase(Hca& hca, const PortSel& port, const RcParams& params, std::string* err)
    : hca_(hca), api_(hca.api()), port_(port), params_(params) {
  if (!hca.ok()) {
    *err = "HCA " + hca.name() + " is not open";
    return;
  }
  std::string bad = params.validate();
  if (!bad.empty()) {
    *err = bad;
    return;
  }
  qp_ = std::make_unique<RcQp>(hca, port, kSendDepth, kRecvDepth, err);
  if (!qp_->ok()) return;
  ctlRecv_.assign(kRecvDepth * kCtlBytes, 0);
  ctlSend_.assign(kSendDepth * kCtlBytes, 0);
  recs_.resize(kSendDepth);
  ctlRecvMr_ = api_.reg_mr(hca.pd(), ctlRecv_.data(), ctlRecv_.size(), IBV_ACCESS_LOCAL_WRITE);
  ctlSendMr_ = api_.reg_mr(hca.pd(), ctlSend_.data(), ctlSend_.size(), IBV_ACCESS_LOCAL_WRITE);
  if (!ctlRecvMr_ || !ctlSendMr_) {
    *err = "ibv_reg_mr(control slots on " + hca.name() + "): " + std::strerror(errno);
    return;
  }
  ok_ = true;
}

PathBase::~PathBase() {
  qp_.reset();  // the QP before the MRs its work requests point into
  if (ctlRecvMr_) api_.dereg_mr(ctlRecvMr_);
  if (ctlSendMr_) api_.dereg_mr(ctlSendMr_);
}

bool PathBase::postRecv(int slot, std::string* err) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(ctlRecv_.data() + static_cast<size_t>(slot) * kCtlBytes);
  sge.length = kCtlBytes;
  sge.lkey = ctlRecvMr_->lkey;
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kRecvTag | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  int rc = ibv_post_recv(qp_->qp(), &wr, &bad);
  if (rc) {
    *err = std::string("ibv_post_recv: ") + std::strerror(rc);
    return false;
  }
  ++recvsPosted_;
  return true;
}

bool PathBase::connect(const QpEndpoint& peer, std::string* err) {
  if (!ok_) {
    *err = "path not constructed";
    return false;
  }
  if (!qp_->toInit(params_.pkeyIndex, err)) return false;  // NCCL_IB_PKEY
  for (int i = 0; i < kRecvDepth; ++i)
    if (!postRecv(i, err)) return false;
  hca_.pollAsync();
  portErrBase_ = hca_.portErrors(port_.port);  // only PORT_ERRs after the path came up count
  if (!qp_->toRts(peer, params_, err)) return false;
  connected_ = true;
  lastOkUs_ = nowUs();
  return true;
}

void PathBase::markBroken(const std::string& source, const std::string& status, int code) {
  if (broken_) return;
  broken_ = true;
  why_.source = source;
  why_.status = status;
  why_.code = code;
  why_.tUs = nowUs();
  why_.sinceLastOkUs = why_.tUs > lastOkUs_ ? why_.tUs - lastOkUs_ : 0;
  why_.dev = port_.dev;
  why_.port = port_.port;
}

bool PathBase::takeBrokenNews() {
  if (!broken_ || brokenTold_) return false;
  brokenTold_ = true;
  return true;
}

int PathBase::postSend(ibv_send_wr* wr, const SendRec& rec, std::string* err) {
  wr->wr_id = sendHead_;
  wr->send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(qp_->qp(), wr, &bad);
  if (rc) {
    *err = std::string("ibv_post_send: ") + std::strerror(rc);
    markBroken("post", *err, rc);
    return -1;
  }
  recs_[sendHead_ % kSendDepth] = rec;
  ++sendHead_;
  ++sendsInFlight_;
  return 1;
}

int PathBase::sendCtl(const CtlMsg& m, std::string* err) {
  if (broken_ || fenced_ || !connected_) {
    *err = fenced_ ? "path fenced" : broken_ ? "path broken: " + why_.status : "path not connected";
    return -1;
  }
  if (!sendSlotFree()) return 0;
  uint8_t* w = ctlSendSlot();
  ctlwire::encodeCtl(m, w);
  return postCtlSlot(w, err);
}

uint8_t* PathBase::ctlSendSlot() { return ctlSend_.data() + (sendHead_ % kSendDepth) * kCtlBytes; }

int PathBase::postCtlSlot(uint8_t* w, std::string* err) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(w), static_cast<uint32_t>(kCtlBytes), ctlSendMr_->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  SendRec rec;
  rec.kind = SendRec::kCtl;
  return postSend(&wr, rec, err);
}

void PathBase::waitIdle(int timeoutMs) {
  pollfd p[2] = {{qp_->completionFd(), POLLIN, 0}, {hca_.ctx()->async_fd, POLLIN, 0}};
  poll(p, 2, timeoutMs);
}

void PathBase::pollOnce() {
  lastFound_ = 0;
  if (!connected_) return;
  lastFound_ += static_cast<int>(hca_.pollAsync().size());
  qp_->rearm();
  if (!broken_ && !fenced_) {
    if (hca_.portErrors(port_.port) > portErrBase_)
      markBroken("port", "port error (" + hca_.name() + " port " + std::to_string(port_.port) + ")",
                 IBV_EVENT_PORT_ERR);
    std::string what;
    if (hca_.qpFatal(qp_->qp()->qp_num, &what)) markBroken("qp-event", what, 0);
  }
  ibv_wc wc[32];
  int n = ibv_poll_cq(qp_->cq(), 32, wc);
  if (n < 0) {
    markBroken("completion", "ibv_poll_cq failed", n);
    return;
  }
  uint64_t now = n ? nowUs() : 0;
  lastFound_ += n;
  for (int i = 0; i < n; ++i) {
    const ibv_wc& c = wc[i];
    bool isRecv = (c.wr_id & kRecvTag) != 0;
    if (isRecv)
      --recvsPosted_;
    else
      --sendsInFlight_;
    if (c.status != IBV_WC_SUCCESS) {
      if (c.status == IBV_WC_WR_FLUSH_ERR) ++(isRecv ? flushedRecvs_ : flushedSends_);
      // Any error completion outside a fence breaks the path: which status arrives depends on
      // the kernel and the fault (retry exceeded, local QP error, flush first on 6.12 rxe).
      if (!fenced_) markBroken("completion", api_.wc_status_str(c.status), c.status);
      continue;
    }
    lastOkUs_ = now;
    if (isRecv) {
      int slot = static_cast<int>(c.wr_id & ~kRecvTag);
      if (c.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        onImm(ntohl(c.imm_data));
      } else if (c.opcode == IBV_WC_RECV && c.byte_len == kCtlBytes) {
        onCtl(ctlRecv_.data() + static_cast<size_t>(slot) * kCtlBytes);
      } else {
        markBroken("protocol", "unexpected receive completion (opcode " + std::to_string(c.opcode) + ", " +
                                   std::to_string(c.byte_len) + " bytes)", 0);
      }
      std::string e;
      if (!broken_ && !fenced_ && !postRecv(slot, &e)) markBroken("post", e, 0);
    } else {
      onSendDone(recs_[c.wr_id % kSendDepth]);
    }
  }
}

FenceResult PathBase::fence(int timeoutMs) {
  FenceResult r;
  uint64_t t0 = nowUs();
  fenced_ = true;
  if (connected_ && !qp_->toError(&r.err)) {
    r.us = nowUs() - t0;
    return r;
  }
  uint64_t deadline = t0 + static_cast<uint64_t>(timeoutMs) * 1000u;
  while (connected_ && (sendsInFlight_ > 0 || recvsPosted_ > 0) && nowUs() < deadline) {
    int before = sendsInFlight_ + recvsPosted_;
    pollOnce();
    if (sendsInFlight_ + recvsPosted_ == before) waitIdle(10);  // flushes come from the kernel
  }
  r.drained = sendsInFlight_ == 0 && recvsPosted_ == 0;
  r.flushedSends = flushedSends_;
  r.flushedRecvs = flushedRecvs_;
  r.us = nowUs() - t0;
  return r;
}

// ---- sender

void SendPath::progress(Sink& sink) {
  pollOnce();
  while (!evq_.empty()) {
    Ev e = evq_.front();
    evq_.pop_front();
    if (e.kind == Ev::kChunkDone)
      sink.chunkDone(e.chunk);
    else if (e.kind == Ev::kCtl)
      sink.ctl(e.ctl);
  }
  if (takeBrokenNews()) sink.broken(why_);
}

bool SendPath::advertised(uint64_t seq, Advert* out) const {
  auto it = adverts_.find(seq);
  if (it == adverts_.end()) return false;
  if (out) *out = it->second;
  return true;
}

int SendPath::post(const ChunkRef& c, const void* src, uint32_t lkey, std::string* err) {
  if (broken_ || fenced_ || !connected_) {
    *err = fenced_ ? "path fenced" : broken_ ? "path broken: " + why_.status : "path not connected";
    return -1;
  }
  if (c.total > 0xffffffffull) {
    *err = "message of " + std::to_string(c.total) + " bytes: the verbs path carries at most 4 GiB - 1";
    return -1;
  }
  if (c.offset + c.len > c.total) {
    *err = "chunk [" + std::to_string(c.offset) + ", +" + std::to_string(c.len) + ") beyond the message's " +
           std::to_string(c.total) + " bytes";
    return -1;
  }
  auto it = adverts_.find(c.seq);
  if (it == adverts_.end()) return 0;  // the receiver has not posted its buffer yet
  const Advert& a = it->second;
  if (c.total > a.size) {
    *err = "message " + std::to_string(c.seq) + " of " + std::to_string(c.total) +
           " bytes is larger than the receive buffer of " + std::to_string(a.size) + " bytes";
    return -1;
  }
  bool last = c.offset + c.len == c.total;
  if (last && adverts_.begin()->first != c.seq) {
    *err = "message " + std::to_string(c.seq) + " completed before the older advertised message " +
           std::to_string(adverts_.begin()->first) + " (messages complete in seq order on a path)";
    return -1;
  }
  if (!sendSlotFree()) return 0;
  ibv_sge sge{reinterpret_cast<uintptr_t>(src), static_cast<uint32_t>(c.len), lkey};
  ibv_send_wr wr{};
  wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  if (last) wr.imm_data = htonl(static_cast<uint32_t>(c.total));
  wr.sg_list = c.len ? &sge : nullptr;
  wr.num_sge = c.len ? 1 : 0;
  wr.wr.rdma.remote_addr = a.addr + c.offset;
  wr.wr.rdma.rkey = a.rkey;
  SendRec rec;
  rec.kind = last ? SendRec::kWriteImm : SendRec::kWrite;
  rec.chunk = c;
  int r = postSend(&wr, rec, err);
  if (r == 1 && last) adverts_.erase(it);
  return r;
}

void SendPath::onCtl(const uint8_t* w) {
  Advert a;
  Ev e{};
  int k = ctlwire::decode(w, &a, &e.ctl);
  if (k == ctlwire::kAdvert) {
    adverts_[a.seq] = a;
  } else if (k == ctlwire::kControl) {
    e.kind = Ev::kCtl;
    evq_.push_back(e);
  } else {
    markBroken("protocol", "control message of unknown kind " + std::to_string(w[0]) + "/" + std::to_string(w[1]), 0);
  }
}

void SendPath::onImm(uint32_t) { markBroken("protocol", "write-with-immediate arrived at a sender", 0); }

void SendPath::onSendDone(const SendRec& r) {
  if (r.kind == SendRec::kCtl) return;
  Ev e{};
  e.kind = Ev::kChunkDone;
  e.chunk = r.chunk;
  evq_.push_back(e);
}

// ---- receiver

void RecvPath::progress(Sink& sink) {
  pollOnce();
  while (!evq_.empty()) {
    Ev e = evq_.front();
    evq_.pop_front();
    if (e.kind == Ev::kArrived)
      sink.arrived(e.seq, e.tag, e.bytes);
    else if (e.kind == Ev::kCtl)
      sink.ctl(e.ctl);
  }
  if (takeBrokenNews()) sink.broken(why_);
}

int RecvPath::advertise(uint64_t seq, uint64_t tag, void* buf, uint64_t size, uint32_t rkey, std::string* err) {
  if (broken_ || fenced_ || !connected_) {
    *err = fenced_ ? "path fenced" : broken_ ? "path broken: " + why_.status : "path not connected";
    return -1;
  }
  if (!pending_.empty() && seq <= pending_.back().seq) {
    *err = "advertisement of seq " + std::to_string(seq) + " after seq " + std::to_string(pending_.back().seq) +
           " (advertise in seq order)";
    return -1;
  }
  if (!sendSlotFree()) return 0;
  Advert a;
  a.seq = seq;
  a.tag = tag;
  a.addr = reinterpret_cast<uintptr_t>(buf);
  a.size = size;
  a.rkey = rkey;
  uint8_t* w = ctlSendSlot();
  ctlwire::encodeAdvert(a, w);
  int r = postCtlSlot(w, err);
  if (r == 1) pending_.push_back(a);
  return r;
}

void RecvPath::onImm(uint32_t imm) {
  if (pending_.empty()) {
    markBroken("protocol", "write-with-immediate without an advertised buffer", 0);
    return;
  }
  Advert a = pending_.front();
  pending_.pop_front();
  if (imm > a.size) {
    markBroken("protocol", "message " + std::to_string(a.seq) + " of " + std::to_string(imm) +
                               " bytes arrived in a buffer of " + std::to_string(a.size), 0);
    return;
  }
  Ev e{};
  e.kind = Ev::kArrived;
  e.seq = a.seq;
  e.tag = a.tag;
  e.bytes = imm;
  evq_.push_back(e);
}

void RecvPath::onCtl(const uint8_t* w) {
  Advert a;
  Ev e{};
  if (ctlwire::decode(w, &a, &e.ctl) != ctlwire::kControl) {
    markBroken("protocol", "control message of kind " + std::to_string(w[0]) + " at a receiver", 0);
    return;
  }
  e.kind = Ev::kCtl;
  evq_.push_back(e);
}

}  // namespace verbs
}  // namespace railover
