#include "transport/verbs/verbs_path.h"

#include <arpa/inet.h>
#include <endian.h>
#include <poll.h>

#include <algorithm>
#include <system_error>
#include <thread>
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
  out[0] = a.count ? kGroupEntry : kAdvert;
  out[2] = a.count;
  out[3] = a.count ? a.index : 0;
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

void encodePart(uint64_t seq, uint8_t out[kBytes]) {
  std::memset(out, 0, kBytes);
  out[0] = kPart;
  put64(out + 8, seq);
}

void encodeDone(const Done& d, uint8_t out[kBytes]) {
  std::memset(out, 0, kBytes);
  out[0] = kDone;
  out[1] = d.written ? 0 : 1;
  out[3] = d.index;
  put64(out + 8, d.seq);
  put64(out + 24, d.bytes);
  put64(out + 32, d.tag);
}

namespace {
bool zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i]) return false;
  return true;
}
}  // namespace

int decode(const uint8_t in[kBytes], Decoded* d, std::string* err) {
  const std::string what = "control message of kind " + std::to_string(in[0]);
  if (in[0] == kAdvert || in[0] == kGroupEntry) {
    Advert& a = d->advert;
    uint32_t rk;
    std::memcpy(&rk, in + 4, 4);
    a.rkey = ntohl(rk);
    a.seq = get64(in + 8);
    a.addr = get64(in + 16);
    a.size = get64(in + 24);
    a.tag = get64(in + 32);
    a.count = in[0] == kGroupEntry ? in[2] : 0;
    a.index = in[0] == kGroupEntry ? in[3] : 0;
    if (in[0] == kAdvert) {
      if (in[1] || in[2] || in[3] || !zero(in + 40, 8)) return *err = what + ": reserved bytes not zero", 0;
      return kAdvert;
    }
    if (a.count < 1 || a.count > kMaxGroup)
      return *err = what + ": group of " + std::to_string(a.count) + " entries (1.." + std::to_string(kMaxGroup) + ")", 0;
    if (a.index >= a.count)
      return *err = what + ": entry " + std::to_string(a.index) + " of a group of " + std::to_string(a.count), 0;
    if (a.addr + a.size < a.addr)
      return *err = what + ": buffer of " + std::to_string(a.size) + " bytes at " + std::to_string(a.addr) +
                    " ends beyond the address space", 0;
    if (a.tag > 0xffffffffull) return *err = what + ": tag " + std::to_string(a.tag) + " beyond 32 bits", 0;
    if (in[1] || !zero(in + 40, 8)) return *err = what + ": reserved bytes not zero", 0;
    return kGroupEntry;
  }
  if (in[0] == kControl) {
    if (in[1] < static_cast<uint8_t>(CtlType::kAck) || in[1] > static_cast<uint8_t>(CtlType::kClose))
      return *err = what + ": unknown control type " + std::to_string(in[1]), 0;
    if (!zero(in + 2, 6) || !zero(in + 24, 24)) return *err = what + ": reserved bytes not zero", 0;
    d->ctl.type = static_cast<CtlType>(in[1]);
    d->ctl.seq = get64(in + 8);
    d->ctl.arg = get64(in + 16);
    return kControl;
  }
  if (in[0] == kDone) {
    Done& x = d->done;
    x.written = in[1] == 0;
    x.index = in[3];
    x.seq = get64(in + 8);
    x.bytes = get64(in + 24);
    x.tag = get64(in + 32);
    if (in[1] > 1) return *err = what + ": unknown status " + std::to_string(in[1]), 0;
    if (x.index >= kMaxGroup && (x.written || x.index != kNoEntry))
      return *err = what + ": entry " + std::to_string(x.index) + " (0.." + std::to_string(kMaxGroup - 1) +
                    (x.written ? ")" : ", or 255 for none)"), 0;
    if (x.bytes > 0xffffffffull) return *err = what + ": message of " + std::to_string(x.bytes) + " bytes beyond 32 bits", 0;
    if (x.tag > 0xffffffffull) return *err = what + ": tag " + std::to_string(x.tag) + " beyond 32 bits", 0;
    if (in[2] || !zero(in + 4, 4) || !zero(in + 16, 8) || !zero(in + 40, 8))
      return *err = what + ": reserved bytes not zero", 0;
    return kDone;
  }
  if (in[0] == kPart) {
    if (!zero(in + 1, 7) || !zero(in + 16, 32)) return *err = what + ": reserved bytes not zero", 0;
    d->partSeq = get64(in + 8);
    return kPart;
  }
  return *err = "control message of unknown kind " + std::to_string(in[0]) + "/" + std::to_string(in[1]), 0;
}
}  // namespace ctlwire

PathBase::PathBase(Hca& hca, const PortSel& port, const RcParams& params, std::string* err, int lanes)
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
  if (lanes < 1 || lanes > QpEndpoint::kMaxLanes) {
    *err = "a path of " + std::to_string(lanes) + " QPs (1.." + std::to_string(QpEndpoint::kMaxLanes) + ")";
    return;
  }
  lanes_.resize(static_cast<size_t>(lanes));
  for (Lane& l : lanes_) {
    l.qp = std::make_unique<RcQp>(hca, port, kSendDepth, kRecvDepth, err);
    if (!l.qp->ok()) return;
    l.ctlRecv.assign(kRecvDepth * kCtlBytes, 0);
    l.ctlSend.assign(kSendDepth * kCtlBytes, 0);
    l.recs.resize(kSendDepth);
    ibv_pd* pd = l.qp->qp()->pd;  // the QP's own opening of the HCA (Hca::reopen)
    l.ctlRecvMr = api_.reg_mr(pd, l.ctlRecv.data(), l.ctlRecv.size(), IBV_ACCESS_LOCAL_WRITE);
    l.ctlSendMr = api_.reg_mr(pd, l.ctlSend.data(), l.ctlSend.size(), IBV_ACCESS_LOCAL_WRITE);
    if (!l.ctlRecvMr || !l.ctlSendMr) {
      *err = "ibv_reg_mr(control slots on " + hca.name() + "): " + std::strerror(errno);
      return;
    }
  }
  ok_ = true;
}

PathBase::~PathBase() {
  for (Lane& l : lanes_) {
    l.qp.reset();  // the QP before the MRs its work requests point into
    if (l.ctlRecvMr) api_.dereg_mr(l.ctlRecvMr);
    if (l.ctlSendMr) api_.dereg_mr(l.ctlSendMr);
  }
}

bool PathBase::destroyQps(std::string* err) {
  bool all = true;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    std::string e;
    if (lanes_[i].qp->destroyQp(&e)) continue;
    if (all) *err = lanes_.size() > 1 ? e + " (QP " + std::to_string(i) + " of the path)" : e;
    all = false;
  }
  connected_ = false;  // nothing may be polled or posted on it any more
  fenced_ = true;
  return all;
}

std::vector<QpEndpoint> PathBase::localEndpoints() const {
  std::vector<QpEndpoint> v;
  for (const Lane& l : lanes_) {
    v.push_back(l.qp->local());
    v.back().lanes = static_cast<uint8_t>(lanes_.size());
    v.back().qos = true;
    v.back().trafficClass = static_cast<uint8_t>(params_.trafficClass);
    v.back().sl = static_cast<uint8_t>(params_.sl);
  }
  return v;
}

int PathBase::outstanding() const {
  int n = 0;
  for (const Lane& l : lanes_) n += l.sendsInFlight;
  return n;
}

bool PathBase::postRecv(Lane& l, int slot, std::string* err) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(l.ctlRecv.data() + static_cast<size_t>(slot) * kCtlBytes);
  sge.length = kCtlBytes;
  sge.lkey = l.ctlRecvMr->lkey;
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kRecvTag | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  int rc = ibv_post_recv(l.qp->qp(), &wr, &bad);
  if (rc) {
    *err = std::string("ibv_post_recv: ") + std::strerror(rc);
    return false;
  }
  ++l.recvsPosted;
  return true;
}

bool PathBase::connect(const std::vector<QpEndpoint>& peers, std::string* err) {
  if (!ok_) {
    *err = "path not constructed";
    return false;
  }
  if (peers.size() != lanes_.size()) {
    *err = "the peer offers " + std::to_string(peers.size()) + " QP endpoints for a path of " +
           std::to_string(lanes_.size()) + " QPs";
    return false;
  }
  for (const QpEndpoint& p : peers)
    if (p.lanes != lanes_.size()) {
      *err = "a peer endpoint names a path of " + std::to_string(p.lanes) + " QPs, this one has " +
             std::to_string(lanes_.size());
      return false;
    }
  for (Lane& l : lanes_) {
    if (!l.qp->toInit(params_.pkeyIndex, accessAtInit(), err)) return false;  // NCCL_IB_PKEY
    for (int i = 0; i < kRecvDepth; ++i)
      if (!postRecv(l, i, err)) return false;
  }
  hca_.pollAsync();
  portErrBase_ = hca_.portErrors(port_.port);  // only PORT_ERRs after the path came up count
  for (size_t i = 0; i < lanes_.size(); ++i)
    if (!lanes_[i].qp->toRts(peers[i], params_, err)) return false;
  if (!(accessAtInit() & IBV_ACCESS_REMOTE_WRITE)) {
    // Does the HCA refuse WRITEs into these QPs? Only its own read-back can say (writesAllowed).
    remoteWriteOffConfirmed_ = true;
    for (size_t i = 0; i < lanes_.size() && remoteWriteOffConfirmed_; ++i) {
      int got = 0;
      std::string qe;
      if (!lanes_[i].qp->queryAccess(&got, &qe)) {
        remoteWriteOffConfirmed_ = false, accessNote_ = qe;
      } else if (got & IBV_ACCESS_REMOTE_WRITE) {
        remoteWriteOffConfirmed_ = false;
        accessNote_ = hca_.name() + " reports IBV_ACCESS_REMOTE_WRITE on a QP brought up without it (its provider "
                      "does not honour the QP's remote access flags)";
      }
    }
  }
  connected_ = true;
  lastOkUs_ = nowUs();
  for (Lane& l : lanes_) l.lastOkUs = lastOkUs_;
  return true;
}

uint64_t PathBase::lastProgressUs() const {
  uint64_t oldest = UINT64_MAX;
  for (const Lane& l : lanes_)
    if (l.sendsInFlight > 0) oldest = std::min(oldest, l.lastOkUs);
  return oldest != UINT64_MAX ? oldest : lastOkUs_;
}

uint64_t PathBase::silenceUs() const {
  uint64_t most = 0;
  for (const Lane& l : lanes_)
    if (l.sendsInFlight > 0 && l.lastPollUs > l.lastOkUs) most = std::max(most, l.lastPollUs - l.lastOkUs);
  return most;
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

int PathBase::postSend(ibv_send_wr* wr, const SendRec& rec, std::string* err, int lane) {
  Lane& l = lanes_[static_cast<size_t>(lane)];
  wr->wr_id = l.sendHead;
  wr->send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(l.qp->qp(), wr, &bad);
  if (rc) {
    *err = std::string("ibv_post_send: ") + std::strerror(rc);
    markBroken("post", *err, rc);
    return -1;
  }
  l.recs[l.sendHead % kSendDepth] = rec;
  ++l.sendHead;
  // A lane's silence starts when it has work: an idle lane's last completion may be old.
  if (l.sendsInFlight++ == 0) l.lastOkUs = nowUs();
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

uint8_t* PathBase::ctlSendSlot(int lane) {
  Lane& l = lanes_[static_cast<size_t>(lane)];
  return l.ctlSend.data() + (l.sendHead % kSendDepth) * kCtlBytes;
}

int PathBase::postCtlSlot(uint8_t* w, std::string* err, int lane) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(w), static_cast<uint32_t>(kCtlBytes),
              lanes_[static_cast<size_t>(lane)].ctlSendMr->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  SendRec rec;
  rec.kind = SendRec::kCtl;
  return postSend(&wr, rec, err, lane);
}

void PathBase::waitIdle(int timeoutMs) {
  // Arm every CQ's notification only now, before sleeping, and look once more: a completion
  // that came after the caller's last poll and before the arming raises no event. Arming on
  // every poll instead cost two system calls per QP per progress() on rxe (its notify and the
  // channel read are syscalls) and an event per completion, which on a 1-vCPU guest took the
  // CPU rxe needs to move the data (docs/VERBS.md, "Completion model").
  for (Lane& l : lanes_) l.qp->rearm();
  int before = lastFound_;
  for (size_t i = 0; i < lanes_.size(); ++i) pollLane(static_cast<int>(i));  // the caller's next poll finishes
  if (lastFound_ != before) return;
  std::vector<pollfd> p;
  for (const Lane& l : lanes_) p.push_back({l.qp->completionFd(), POLLIN, 0});
  // The HCA's events wake the wait too, unless this path's opening is dead: its event file is
  // never read again and would keep poll() from sleeping.
  Hca::Opening o = hca_.current();
  if (o.epoch == lanes_[0].qp->epoch() && !o.dead) p.push_back({o.ctx->async_fd, POLLIN, 0});
  poll(p.data(), p.size(), timeoutMs);
}

void PathBase::pollOnce() {
  lastFound_ = lastOk_ = 0;
  if (!connected_) return;
  lastFound_ += static_cast<int>(hca_.pollAsyncFromDataPath().size());
  if (!broken_ && !fenced_) {
    uint64_t errs = 0, moves = 0;
    uint16_t lid = hca_.portStatus(port_.port, &errs, &moves);  // one lock of the HCA for both
    if (errs > portErrBase_)
      markBroken("port", "port error (" + hca_.name() + " port " + std::to_string(port_.port) + ")",
                 IBV_EVENT_PORT_ERR);
    if (!port_.roce) {  // InfiniBand: the subnet manager may give the port another LID while it stays up
      if (moves != lidSeen_) {
        lidSeen_ = moves;
        if (lid != 0 && lid != port_.lid)
          markBroken("port",
                     "LID of " + hca_.name() + " port " + std::to_string(port_.port) + " changed from " +
                         std::to_string(port_.lid) + " to " + std::to_string(lid) +
                         " (subnet manager): the peer's QPs address the old LID",
                     IBV_EVENT_LID_CHANGE);
      }
    }
    std::string what;
    for (size_t i = 0; i < lanes_.size() && !broken_; ++i)
      if (hca_.qpFatal(lanes_[i].qp->qp()->qp_num, lanes_[i].qp->epoch(), &what))
        markBroken("qp-event", lanes_.size() > 1 ? what + " (QP " + std::to_string(i) + " of the path)" : what, 0);
  }
  for (size_t i = 0; i < lanes_.size(); ++i) pollLane(static_cast<int>(i));
  afterPoll();
}

void PathBase::pollLane(int lane) {
  Lane& l = lanes_[static_cast<size_t>(lane)];
  ibv_wc wc[32];
  // Before the poll: whatever the HCA completed until now is in what it returns (silenceUs).
  l.lastPollUs = nowUs();
  int n = ibv_poll_cq(l.qp->cq(), 32, wc);
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
      --l.recvsPosted;
    else
      --l.sendsInFlight;
    if (c.status != IBV_WC_SUCCESS) {
      if (c.status == IBV_WC_WR_FLUSH_ERR) ++(isRecv ? flushedRecvs_ : flushedSends_);
      // Any error completion outside a fence breaks the path: which status arrives depends on
      // the kernel and the fault (retry exceeded, local QP error, flush first on 6.12 rxe).
      if (!fenced_) markBroken("completion", api_.wc_status_str(c.status), c.status);
      continue;
    }
    lastOkUs_ = now;
    l.lastOkUs = now;
    ++lastOk_;
    if (isRecv) {
      int slot = static_cast<int>(c.wr_id & ~kRecvTag);
      const uint8_t* w = l.ctlRecv.data() + static_cast<size_t>(slot) * kCtlBytes;
      if (c.opcode == IBV_WC_RECV_RDMA_WITH_IMM && lane == 0) {
        onImm(ntohl(c.imm_data));
      } else if (c.opcode == IBV_WC_RECV && c.byte_len == kCtlBytes) {
        if (lane == 0)
          onCtl(w);
        else
          onLaneCtl(lane, w);
      } else {
        markBroken("protocol", "unexpected receive completion (opcode " + std::to_string(c.opcode) + ", " +
                                   std::to_string(c.byte_len) + " bytes" +
                                   (lane ? ", QP " + std::to_string(lane) + " of the path" : std::string()) + ")",
                   0);
      }
      std::string e;
      if (!broken_ && !fenced_ && !postRecv(l, slot, &e)) markBroken("post", e, 0);
    } else {
      onSendDone(l.recs[c.wr_id % kSendDepth]);
    }
  }
}

bool PathBase::lingerSends(int timeoutMs, const std::function<bool()>& giveUp) {
  uint64_t deadline = nowUs() + static_cast<uint64_t>(timeoutMs) * 1000u;
  uint64_t askedUs = 0;
  while (connected_ && !fenced_ && !broken_ && outstanding() > 0) {
    uint64_t now = nowUs();
    if (now >= deadline) break;
    if (giveUp && now - askedUs >= 1000) {
      askedUs = now;
      if (giveUp()) break;
    }
    int before = outstanding();
    pollOnce();
    if (outstanding() == before) waitIdle(1);
  }
  return outstanding() == 0;
}

FenceResult PathBase::fence(int timeoutMs) {
  FenceResult r;
  uint64_t t0 = nowUs();
  fenced_ = true;
  if (connected_) {
    // Every QP, even after one refused (its error is the first one reported): the others must
    // not stay live. With several QPs the moves run at once, one thread per QP beyond the
    // first: a move to ERR was seen to block ~3 s on rxe after a local link loss, and N of them
    // in a row would hold the RESUME N times as long. A QP whose thread cannot be started is
    // moved on this thread.
    std::vector<std::string> errs(lanes_.size());
    std::vector<std::thread> movers;
    movers.reserve(lanes_.size());  // no allocation between starting a thread and keeping it
    for (size_t i = 1; i < lanes_.size(); ++i) {
      try {
        movers.emplace_back([this, i, &errs] { lanes_[i].qp->toError(&errs[i]); });
      } catch (const std::system_error&) {
        lanes_[i].qp->toError(&errs[i]);
      }
    }
    lanes_[0].qp->toError(&errs[0]);
    for (std::thread& t : movers) t.join();
    for (const std::string& e : errs)
      if (!e.empty() && r.err.empty()) r.err = e;
  }
  auto left = [this] {
    int n = 0;
    for (const Lane& l : lanes_) n += l.sendsInFlight + l.recvsPosted;
    return n;
  };
  uint64_t deadline = t0 + static_cast<uint64_t>(timeoutMs) * 1000u;
  while (connected_ && left() > 0 && nowUs() < deadline) {
    int before = left();
    pollOnce();
    if (left() == before) waitIdle(10);  // flushes come from the kernel
  }
  r.drained = left() == 0;
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

namespace {
constexpr int16_t kUnpicked = -2;
std::string seqs(uint64_t s) { return std::to_string(s); }
}  // namespace

SendPath::Group* SendPath::groupOf(uint64_t seq) {
  auto it = adverts_.upper_bound(seq);
  if (it == adverts_.begin()) return nullptr;
  --it;
  return seq - it->first < it->second.count ? &it->second : nullptr;
}

const SendPath::Group* SendPath::groupOf(uint64_t seq) const { return const_cast<SendPath*>(this)->groupOf(seq); }

bool SendPath::advertised(uint64_t seq, Advert* out) const {
  const Group* g = groupOf(seq);
  if (!g || g->have < g->count) return false;
  if (out) *out = g->e[0];
  return true;
}

bool SendPath::advertisedReceive(uint64_t seq, uint64_t* first, int* count, bool* grouped, uint64_t tags[kMaxGroup]) const {
  const Group* g = groupOf(seq);
  if (!g || g->have < g->count) return false;
  *first = g->seq, *count = g->count, *grouped = g->grouped;
  for (int i = 0; i < g->count; ++i) tags[i] = g->e[i].tag;
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
  Group* g = groupOf(c.seq);
  if (!g || g->have < g->count) return 0;  // the receiver has not posted its buffer(s) yet
  const unsigned k = static_cast<unsigned>(c.seq - g->seq);
  if (g->pick[k] == kUnpicked) {
    // The message's first chunk on this path: choose its buffer (as the receiver's engine does).
    if (c.offset != 0) {
      *err = "chunk at offset " + std::to_string(c.offset) + " of message " + seqs(c.seq) + " before its first chunk";
      return -1;
    }
    if (k != g->started) {
      *err = "message " + seqs(c.seq) + " started before message " + seqs(g->seq + g->started) +
             " of the same grouped receive (messages of a group go in seq order)";
      return -1;
    }
    int16_t pick = -1;
    uint8_t named = kNoEntry;
    if (!g->grouped) {
      named = 0;
    } else {
      for (int i = 0; i < g->count && named == kNoEntry; ++i)
        if (!(g->used & (1u << i)) && g->e[i].tag == c.tag) named = static_cast<uint8_t>(i);
      if (named != kNoEntry) g->used |= static_cast<uint8_t>(1u << named);
    }
    if (named != kNoEntry && c.total <= g->e[named].size) pick = named;
    g->pick[k] = pick;
    g->refuseIndex[k] = named;
    g->started++;
  }
  bool last = c.offset + c.len == c.total;
  const Group& oldest = adverts_.begin()->second;
  if (last && c.seq != oldest.seq + oldest.finished) {
    *err = "message " + seqs(c.seq) + " completed before the older advertised message " +
           seqs(oldest.seq + oldest.finished) + " (messages complete in seq order on a path)";
    return -1;
  }
  const int16_t pick = g->pick[k];
  const uint64_t first = g->seq;
  auto finish = [&] {
    if (++g->finished == g->count) adverts_.erase(first);
  };
  const int nl = lanes();
  // Lanes 1..nl-1 end their share of a finished message with a PART (after their writes).
  auto postParts = [&]() {
    for (int i = 1; i < nl; ++i) {
      uint8_t* w = ctlSendSlot(i);
      ctlwire::encodePart(c.seq, w);
      if (postCtlSlot(w, err, i) != 1) return false;
    }
    return true;
  };
  if (pick < 0) {  // refused: nothing is written; the last chunk tells the receiver
    if (!last) return 1;
    for (int i = 0; i < nl; ++i)
      if (!sendSlotFree(i)) return 0;
    Done d;
    d.seq = c.seq, d.tag = c.tag, d.bytes = c.total, d.index = g->refuseIndex[k], d.written = false;
    uint8_t* w = ctlSendSlot();
    ctlwire::encodeDone(d, w);
    int r = postCtlSlot(w, err);
    if (r != 1) return r;
    if (!postParts()) return -1;
    finish();
    return 1;
  }
  const Advert& a = g->e[pick];
  const bool withDone = last && g->grouped;
  // Lane i's share of the chunk: [i * per, (i + 1) * per) of it, cut at its end.
  const uint64_t per = nl == 1 ? c.len : (((c.len + nl - 1) / nl + kLaneAlign - 1) / kLaneAlign) * kLaneAlign;
  auto share = [&](int i, uint64_t* off) {
    *off = std::min(c.len, per * static_cast<uint64_t>(i));
    return std::min(c.len - *off, per);
  };
  for (int i = 0; i < nl; ++i) {  // a chunk goes out on every lane or on none
    uint64_t off, len = share(i, &off);
    int need = i == 0 ? ((!withDone || len > 0) ? 1 : 0) + (withDone ? 1 : 0) : (len > 0 ? 1 : 0) + (last ? 1 : 0);
    if (freeSlots(i) < need) return 0;
  }
  for (int i = nl - 1; i >= 0; --i) {
    uint64_t off, len = share(i, &off);
    bool imm = i == 0 && last && !g->grouped;
    bool write = i == 0 ? !withDone || len > 0 : len > 0;
    if (!write) continue;
    ibv_sge sge{reinterpret_cast<uintptr_t>(src) + off, static_cast<uint32_t>(len), lkey};
    ibv_send_wr wr{};
    wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    if (imm) wr.imm_data = htonl(static_cast<uint32_t>(c.total));
    wr.sg_list = len ? &sge : nullptr;
    wr.num_sge = len ? 1 : 0;
    wr.wr.rdma.remote_addr = a.addr + c.offset + off;
    wr.wr.rdma.rkey = a.rkey;
    SendRec rec;
    rec.kind = imm ? SendRec::kWriteImm : SendRec::kWrite;
    rec.chunk = c;
    rec.chunk.offset = c.offset + off;
    rec.chunk.len = len;
    int r = postSend(&wr, rec, err, i);
    if (r != 1) return -1;  // the path is broken now (postSend says why)
  }
  if (withDone) {  // after the writes on the same QP: the receiver sees it once they are placed
    Done d;
    d.seq = c.seq, d.tag = c.tag, d.bytes = c.total, d.index = static_cast<uint8_t>(pick), d.written = true;
    uint8_t* w = ctlSendSlot();
    ctlwire::encodeDone(d, w);
    if (postCtlSlot(w, err) != 1) return -1;
  }
  if (last) {
    if (!postParts()) return -1;
    finish();
  }
  return 1;
}

void SendPath::onCtl(const uint8_t* w) {
  ctlwire::Decoded d;
  std::string e;
  int k = ctlwire::decode(w, &d, &e);
  if (k == ctlwire::kControl) {
    Ev ev{};
    ev.kind = Ev::kCtl;
    ev.ctl = d.ctl;
    evq_.push_back(ev);
    return;
  }
  if (k == ctlwire::kDone) return markBroken("protocol", "a DONE message arrived at a sender", 0);
  if (k == ctlwire::kPart) return markBroken("protocol", "a PART message arrived at a sender", 0);
  if (k == 0) return markBroken("protocol", e, 0);
  const Advert& a = d.advert;
  if (k == ctlwire::kGroupEntry && a.index > 0) {  // the next entry of the group being told
    Group* g = adverts_.empty() ? nullptr : &adverts_.rbegin()->second;
    if (!g || g->seq != a.seq || !g->grouped || g->count != a.count || g->have != a.index)
      return markBroken("protocol", "entry " + std::to_string(a.index) + " of the grouped receive at seq " + seqs(a.seq) +
                                        " (" + std::to_string(a.count) + " entries) out of order", 0);
    g->e[a.index] = a;
    g->have++;
    return;
  }
  if (!adverts_.empty()) {
    const Group& prev = adverts_.rbegin()->second;
    if (prev.have < prev.count)
      return markBroken("protocol", "advertisement of seq " + seqs(a.seq) + " before the grouped receive at seq " +
                                        seqs(prev.seq) + " was told whole", 0);
    if (a.seq < prev.seq + prev.count)
      return markBroken("protocol", "advertisement of seq " + seqs(a.seq) + " overlaps the one of seq " + seqs(prev.seq) +
                                        " (" + std::to_string(prev.count) + " messages)", 0);
  }
  Group g;
  g.seq = a.seq;
  g.count = k == ctlwire::kGroupEntry ? a.count : 1;
  g.grouped = k == ctlwire::kGroupEntry;
  g.have = 1;
  g.e[0] = a;
  for (int i = 0; i < kMaxGroup; ++i) g.pick[i] = kUnpicked, g.refuseIndex[i] = kNoEntry;
  adverts_[a.seq] = g;
}

void SendPath::onImm(uint32_t) { markBroken("protocol", "write-with-immediate arrived at a sender", 0); }

void SendPath::onLaneCtl(int lane, const uint8_t* w) {
  markBroken("protocol", "control message of kind " + std::to_string(w[0]) + " on QP " + std::to_string(lane) +
                             " of a sender's path (only lane 0 carries the receiver's messages)", 0);
}

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
      sink.arrived(e.arrival);
    else if (e.kind == Ev::kCtl)
      sink.ctl(e.ctl);
  }
  if (takeBrokenNews()) sink.broken(why_);
}

int RecvPath::checkOrder(uint64_t seq, std::string* err) {
  if (broken_ || fenced_ || !connected_) {
    *err = fenced_ ? "path fenced" : broken_ ? "path broken: " + why_.status : "path not connected";
    return -1;
  }
  if (advertisedAny_ && seq < advertisedEnd_) {  // also below messages already arrived or held
    *err = "advertisement of seq " + std::to_string(seq) + " after seq " + std::to_string(advertisedEnd_ - 1) +
           " (advertise in seq order)";
    return -1;
  }
  return 1;
}

bool RecvPath::grantWrites(std::string* err) {
  if (writesGranted()) return true;
  // Before the modify: one that fails may have been applied on some lanes.
  writesAllowed_.store(true, std::memory_order_release);
  for (int i = 0; i < lanes(); ++i)
    if (!qp(i).setAccess(RcQp::kDataQpAccess, err)) return false;
  writesGranted_.store(true, std::memory_order_release);
  return true;
}

bool RecvPath::allowWrites(std::string* err) {
  if (writesGranted()) return true;
  if (grantWrites(err)) return true;
  markBroken("ibv_modify_qp", *err, 0);
  return false;
}

int RecvPath::advertise(uint64_t seq, uint64_t tag, void* buf, uint64_t size, uint32_t rkey, std::string* err) {
  if (checkOrder(seq, err) < 0) return -1;
  if (!sendSlotFree()) return 0;
  if (!allowWrites(err)) return -1;
  Pending p;
  Advert& a = p.e[0];
  a.seq = seq;
  a.tag = tag;
  a.addr = reinterpret_cast<uintptr_t>(buf);
  a.size = size;
  a.rkey = rkey;
  uint8_t* w = ctlSendSlot();
  ctlwire::encodeAdvert(a, w);
  int r = postCtlSlot(w, err);
  if (r == 1) {
    p.seq = seq;
    pending_.push_back(p);
    advertisedEnd_ = seq + 1, advertisedAny_ = true;
  }
  return r;
}

int RecvPath::advertiseGroup(uint64_t seq, const Advert* entries, int n, std::string* err) {
  if (n < 1 || n > kMaxGroup) {
    *err = "grouped receive of " + std::to_string(n) + " buffers (1.." + std::to_string(kMaxGroup) + ")";
    return -1;
  }
  if (checkOrder(seq, err) < 0) return -1;
  if (outstanding() + n > kSendDepth) return 0;
  if (!allowWrites(err)) return -1;
  Pending p;
  p.seq = seq;
  p.count = static_cast<uint8_t>(n);
  p.grouped = true;
  for (int i = 0; i < n; ++i) {
    Advert& a = p.e[i];
    a = entries[i];
    a.seq = seq, a.count = static_cast<uint8_t>(n), a.index = static_cast<uint8_t>(i);
    uint8_t* w = ctlSendSlot();
    ctlwire::encodeAdvert(a, w);
    if (postCtlSlot(w, err) != 1) return -1;  // the path is broken now (the sender sees a partial group only then)
  }
  pending_.push_back(p);
  advertisedEnd_ = seq + static_cast<uint64_t>(n), advertisedAny_ = true;
  return 1;
}

void RecvPath::onImm(uint32_t imm) {
  if (pending_.empty()) {
    markBroken("protocol", "write-with-immediate without an advertised buffer", 0);
    return;
  }
  Pending& p = pending_.front();
  if (p.grouped) {
    markBroken("protocol", "write-with-immediate for message " + std::to_string(p.seq + p.next) +
                               " of a grouped receive (its messages end with a DONE)", 0);
    return;
  }
  Advert a = p.e[0];
  pending_.pop_front();
  if (imm > a.size) {
    markBroken("protocol", "message " + std::to_string(a.seq) + " of " + std::to_string(imm) +
                               " bytes arrived in a buffer of " + std::to_string(a.size), 0);
    return;
  }
  Arrival x;
  x.seq = a.seq;
  x.tag = a.tag;
  x.bytes = imm;
  x.addr = a.addr;
  arrive(x);
}

void RecvPath::arrive(const Arrival& a) {
  if (lanes() > 1) {
    held_.push_back(a);  // afterPoll() releases it once every lane's share is placed
    return;
  }
  Ev e{};
  e.kind = Ev::kArrived;
  e.arrival = a;
  evq_.push_back(e);
}

void RecvPath::afterPoll() {
  if (partNext_.size() != static_cast<size_t>(lanes())) return;  // some lane has sent no PART yet
  while (!held_.empty()) {
    const uint64_t seq = held_.front().seq;
    for (int i = 1; i < lanes(); ++i)
      if (partNext_[static_cast<size_t>(i)] <= seq) return;
    Ev e{};
    e.kind = Ev::kArrived;
    e.arrival = held_.front();
    held_.pop_front();
    evq_.push_back(e);
  }
}

void RecvPath::onLaneCtl(int lane, const uint8_t* w) {
  ctlwire::Decoded d;
  std::string err;
  const std::string where = " on QP " + std::to_string(lane) + " of the path";
  int k = ctlwire::decode(w, &d, &err);
  if (k != ctlwire::kPart)
    return markBroken("protocol", (k == 0 ? err : "control message of kind " + std::to_string(w[0])) + where +
                                      " (only PARTs go there)", 0);
  if (partNext_.size() != static_cast<size_t>(lanes())) partNext_.assign(static_cast<size_t>(lanes()), 0);
  uint64_t& next = partNext_[static_cast<size_t>(lane)];
  if (d.partSeq < next || d.partSeq >= advertisedEnd_)
    return markBroken("protocol", "PART of message " + std::to_string(d.partSeq) + where +
                                      (d.partSeq < next ? " after the PART of message " + std::to_string(next - 1)
                                                        : " beyond the messages advertised (up to " +
                                                              std::to_string(advertisedEnd_) + ")"),
                      0);
  next = d.partSeq + 1;
}

void RecvPath::onDone(const Done& d) {
  const std::string m = "DONE of message " + std::to_string(d.seq);
  if (pending_.empty()) return markBroken("protocol", m + " without an advertised buffer", 0);
  Pending& p = pending_.front();
  uint64_t want = p.seq + p.next;
  if (d.seq != want) return markBroken("protocol", m + " where message " + std::to_string(want) + " was next", 0);
  Ev e{};
  e.kind = Ev::kArrived;
  e.arrival.seq = d.seq;
  e.arrival.tag = d.tag;
  e.arrival.bytes = d.bytes;
  if (d.written) {
    if (!p.grouped) return markBroken("protocol", m + " (written) for a single receive (it ends with a write-with-immediate)", 0);
    if (d.index >= p.count)
      return markBroken("protocol", m + ": entry " + std::to_string(d.index) + " of a group of " + std::to_string(p.count), 0);
    if (p.used & (1u << d.index))
      return markBroken("protocol", m + ": entry " + std::to_string(d.index) + " of the grouped receive at seq " +
                                        std::to_string(p.seq) + " filled twice", 0);
    const Advert& a = p.e[d.index];
    if (d.bytes > a.size)
      return markBroken("protocol", m + " of " + std::to_string(d.bytes) + " bytes arrived in entry " +
                                        std::to_string(d.index) + " of " + std::to_string(a.size) + " bytes", 0);
    if (d.tag != a.tag)
      return markBroken("protocol", m + " with tag " + std::to_string(d.tag) + " arrived in entry " +
                                        std::to_string(d.index) + " whose tag is " + std::to_string(a.tag), 0);
    p.used |= static_cast<uint8_t>(1u << d.index);
    e.arrival.addr = a.addr;
  } else {
    if (d.index != kNoEntry && d.index >= p.count)
      return markBroken("protocol", m + " (refused): entry " + std::to_string(d.index) + " of a group of " +
                                        std::to_string(p.count), 0);
    if (d.index != kNoEntry) p.used |= static_cast<uint8_t>(1u << d.index);
    e.arrival.refused = true;
  }
  if (++p.next == p.count) pending_.pop_front();
  arrive(e.arrival);
}

void RecvPath::onCtl(const uint8_t* w) {
  ctlwire::Decoded d;
  std::string err;
  int k = ctlwire::decode(w, &d, &err);
  if (k == ctlwire::kControl) {
    Ev e{};
    e.kind = Ev::kCtl;
    e.ctl = d.ctl;
    evq_.push_back(e);
  } else if (k == ctlwire::kDone) {
    onDone(d.done);
  } else {
    markBroken("protocol",
               k == 0 ? err
                      : "control message of kind " + std::to_string(w[0]) + " at a receiver" +
                            (k == ctlwire::kPart ? " on QP 0 (PARTs go on QPs 1..N-1 of a path)" : ""),
               0);
  }
}

}  // namespace verbs
}  // namespace railover
