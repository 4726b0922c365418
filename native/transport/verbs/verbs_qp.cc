#include "transport/verbs/verbs_qp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace railover {
namespace verbs {

namespace {
constexpr uint32_t kEndpointMagic = 0x524f5651;  // "ROVQ"
constexpr uint16_t kEndpointVersion = 1;

void put32(uint8_t* p, uint32_t v) {
  v = htonl(v);
  std::memcpy(p, &v, 4);
}
uint32_t get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return ntohl(v);
}
}  // namespace

uint64_t RcParams::nominalGiveUpUs() const {
  double perTry = 4.096 * static_cast<double>(1ull << timeout);
  return static_cast<uint64_t>(perTry * (retryCnt + 1));
}

std::string RcParams::validate() const {
  if (timeout < 0 || timeout > 31) return "RC timeout " + std::to_string(timeout) + " out of range 0..31";
  if (retryCnt < 0 || retryCnt > 7) return "RC retry_cnt " + std::to_string(retryCnt) + " out of range 0..7";
  if (sl < 0 || sl > 15) return "service level " + std::to_string(sl) + " out of range 0..15";
  if (trafficClass < 0 || trafficClass > 255)
    return "traffic class " + std::to_string(trafficClass) + " out of range 0..255";
  return "";
}

// Layout: magic(4) version(2) lid(2) qpn(4) psn(4) gid(16) mtu(1) roce(1) lanes-1(1) pad(5) = 40 bytes.
void QpEndpoint::pack(uint8_t out[kWireBytes]) const {
  std::memset(out, 0, kWireBytes);
  put32(out, kEndpointMagic);
  uint16_t v = htons(kEndpointVersion), l = htons(lid);
  std::memcpy(out + 4, &v, 2);
  std::memcpy(out + 6, &l, 2);
  put32(out + 8, qpn);
  put32(out + 12, psn);
  std::memcpy(out + 16, gid, 16);
  out[32] = mtu;
  out[33] = roce;
  out[34] = static_cast<uint8_t>(lanes ? lanes - 1 : 0);
  if (qos) {
    out[35] = 1;
    out[36] = trafficClass;
    out[37] = sl;
  }
}

bool QpEndpoint::looksLikeOne(const uint8_t in[kWireBytes]) { return get32(in) == kEndpointMagic; }

bool QpEndpoint::unpack(const uint8_t in[kWireBytes], std::string* err) {
  // Every field is checked before anything is taken: these 40 bytes come from whatever
  // connected to the bootstrap port, and a value the HCA would reject later (or silently
  // truncate: QPNs and PSNs are 24 bits) must be named here instead.
  if (get32(in) != kEndpointMagic) {
    *err = "peer's QP endpoint has a bad magic (not a railover verbs peer)";
    return false;
  }
  uint16_t v, l;
  std::memcpy(&v, in + 4, 2);
  std::memcpy(&l, in + 6, 2);
  if (ntohs(v) != kEndpointVersion) {
    *err = "peer's QP endpoint version " + std::to_string(ntohs(v)) + " != " + std::to_string(kEndpointVersion);
    return false;
  }
  uint32_t q = get32(in + 8), p = get32(in + 12);
  uint16_t lidv = ntohs(l);
  uint8_t m = in[32], r = in[33];
  if (q == 0 || q > 0xFFFFFFu) {
    *err = "peer's QP endpoint has QP number " + std::to_string(q) + " (valid: 1..0xFFFFFF)";
    return false;
  }
  if (p > 0xFFFFFFu) {
    *err = "peer's QP endpoint has PSN " + std::to_string(p) + " (a PSN is 24 bits)";
    return false;
  }
  if (m < IBV_MTU_256 || m > IBV_MTU_4096) {
    *err = "peer's QP endpoint has MTU code " + std::to_string(m) + " (valid: 1..5, 256..4096 bytes)";
    return false;
  }
  if (r > 1) {
    *err = "peer's QP endpoint has link-layer flag " + std::to_string(r) + " (0 InfiniBand, 1 RoCE)";
    return false;
  }
  if (r == 0 && (lidv == 0 || lidv > 0xBFFF)) {
    *err = "peer's QP endpoint is InfiniBand with LID " + std::to_string(lidv) + " (unicast LIDs: 1..0xBFFF)";
    return false;
  }
  bool gidZero = true;
  for (int i = 16; i < 32; ++i) gidZero = gidZero && in[i] == 0;
  if (r == 1 && gidZero) {
    *err = "peer's QP endpoint is RoCE with an all-zero GID";
    return false;
  }
  if (in[34] >= kMaxLanes) {
    *err = "peer's QP endpoint names a path of " + std::to_string(in[34] + 1) + " QPs (1.." +
           std::to_string(kMaxLanes) + ")";
    return false;
  }
  if (in[35] > 1) {
    *err = "peer's QP endpoint has QoS flag " + std::to_string(in[35]) + " (byte 35: 0 or 1)";
    return false;
  }
  if (in[35] == 0 && (in[36] != 0 || in[37] != 0)) {
    *err = "peer's QP endpoint has a traffic class or service level without its QoS flag (bytes 36..37)";
    return false;
  }
  if (in[37] > 15) {
    *err = "peer's QP endpoint has service level " + std::to_string(in[37]) + " (0..15)";
    return false;
  }
  for (size_t i = 38; i < kWireBytes; ++i) {
    if (in[i] != 0) {
      *err = "peer's QP endpoint has non-zero reserved byte " + std::to_string(i);
      return false;
    }
  }
  lid = lidv;
  qpn = q;
  psn = p;
  std::memcpy(gid, in + 16, 16);
  mtu = m;
  roce = r;
  lanes = static_cast<uint8_t>(in[34] + 1);
  qos = in[35] == 1;
  trafficClass = in[36];
  sl = in[37];
  return true;
}

namespace {
bool ioAll(int fd, void* buf, size_t n, bool wr, uint64_t deadlineUs, std::string* err) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n) {
    uint64_t now = nowUs();
    if (now >= deadlineUs) {
      *err = std::string("timed out ") + (wr ? "sending" : "receiving") + " the QP endpoint";
      return false;
    }
    pollfd pf{fd, static_cast<short>(wr ? POLLOUT : POLLIN), 0};
    int r = poll(&pf, 1, static_cast<int>((deadlineUs - now) / 1000 + 1));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t k = wr ? write(fd, p, n) : read(fd, p, n);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) {
      *err = std::string("bootstrap socket ") + (k == 0 ? "closed by the peer" : std::strerror(errno));
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
}  // namespace

bool exchangeEndpoints(int fd, const QpEndpoint& mine, QpEndpoint* peer, int timeoutMs, std::string* err) {
  uint8_t out[QpEndpoint::kWireBytes], in[QpEndpoint::kWireBytes];
  mine.pack(out);
  uint64_t dl = nowUs() + static_cast<uint64_t>(timeoutMs) * 1000u;
  if (!ioAll(fd, out, sizeof out, true, dl, err) || !ioAll(fd, in, sizeof in, false, dl, err)) return false;
  return peer->unpack(in, err);
}

RcQp::RcQp(Hca& hca, const PortSel& port, int sendDepth, int recvDepth, std::string* err)
    : hca_(hca), api_(hca.api()), port_(port) {
  if (!hca.ok()) {
    *err = "HCA " + hca.name() + " is not open";
    return;
  }
  Hca::Opening o = hca.current();  // CQ, channel and QP on one opening of the HCA
  epoch_ = o.epoch;
  ch_ = api_.create_comp_channel(o.ctx);
  if (!ch_) {
    *err = "ibv_create_comp_channel(" + hca.name() + "): " + std::strerror(errno);
    return;
  }
  int fl = fcntl(ch_->fd, F_GETFL);
  fcntl(ch_->fd, F_SETFL, fl | O_NONBLOCK);
  cq_ = api_.create_cq(o.ctx, sendDepth + recvDepth, nullptr, ch_, 0);
  if (!cq_) {
    *err = "ibv_create_cq(" + hca.name() + ", " + std::to_string(sendDepth + recvDepth) + "): " + std::strerror(errno);
    return;
  }
  ibv_qp_init_attr ia{};
  ia.send_cq = cq_;
  ia.recv_cq = cq_;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = static_cast<uint32_t>(sendDepth);
  ia.cap.max_recv_wr = static_cast<uint32_t>(recvDepth);
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.sq_sig_all = 0;
  qp_ = api_.create_qp(o.pd, &ia);
  if (!qp_) {
    *err = "ibv_create_qp(" + hca.name() + ", RC, " + std::to_string(sendDepth) + "/" + std::to_string(recvDepth) +
           " WRs): " + std::strerror(errno);
    return;
  }
  std::random_device rd;
  local_.qpn = qp_->qp_num;
  local_.psn = rd() & 0xffffff;
  std::memcpy(local_.gid, port.gid.raw, 16);
  local_.lid = port.lid;
  local_.mtu = static_cast<uint8_t>(port.activeMtu);
  local_.roce = port.roce ? 1 : 0;
}

bool RcQp::destroyQp(std::string* err) {
  if (!qp_) return true;
  uint32_t qpn = qp_->qp_num;
  int rc = api_.destroy_qp(qp_);
  if (rc) {
    *err = std::string("ibv_destroy_qp: ") + std::strerror(rc);
    return false;
  }
  qp_ = nullptr;
  hca_.forgetQp(qpn, epoch_);  // the number may now go to a new QP
  return true;
}

RcQp::~RcQp() {
  std::string ignored;  // a dead device's calls may fail: its memory is freed with its context
  destroyQp(&ignored);
  if (cq_) {
    if (unacked_) api_.ack_cq_events(cq_, unacked_);
    api_.destroy_cq(cq_);
  }
  if (ch_) api_.destroy_comp_channel(ch_);
}

void RcQp::rearm() {
  ibv_cq* c = nullptr;
  void* ctx = nullptr;
  while (api_.get_cq_event(ch_, &c, &ctx) == 0) ++unacked_;  // non-blocking channel
  if (unacked_ >= 64) {
    api_.ack_cq_events(cq_, unacked_);
    unacked_ = 0;
  }
  ibv_req_notify_cq(cq_, 0);
}

bool RcQp::toInit(int pkeyIndex, int access, std::string* err) {
  if (pkeyIndex < 0 || pkeyIndex > 65535) {
    *err = "P_Key index " + std::to_string(pkeyIndex) + " out of range 0..65535";
    return false;
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = static_cast<uint16_t>(pkeyIndex);
  a.port_num = static_cast<uint8_t>(port_.port);
  a.qp_access_flags = static_cast<unsigned>(access);
  if (api_.modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    *err = "modify QP to INIT on " + hca_.name() + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

bool RcQp::setAccess(int access, std::string* err) {
  ibv_qp_attr a{};
  a.qp_access_flags = static_cast<unsigned>(access);
  if (api_.modify_qp(qp_, &a, IBV_QP_ACCESS_FLAGS)) {
    *err = "modify QP access flags on " + hca_.name() + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

bool RcQp::queryAccess(int* access, std::string* err) {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  if (int rc = api_.query_qp(qp_, &a, IBV_QP_ACCESS_FLAGS, &ia)) {
    *err = "query QP access flags on " + hca_.name() + ": " + std::strerror(rc > 0 ? rc : errno);
    return false;
  }
  *access = static_cast<int>(a.qp_access_flags);
  return true;
}

bool RcQp::toRts(const QpEndpoint& peer, const RcParams& p, std::string* err) {
  std::string bad = p.validate();
  if (!bad.empty()) {
    *err = bad;
    return false;
  }
  if (peer.roce != local_.roce) {
    *err = std::string("link layer mismatch: local ") + (local_.roce ? "RoCE" : "InfiniBand") + ", peer " +
           (peer.roce ? "RoCE" : "InfiniBand");
    return false;
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(peer.mtu, local_.mtu));
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = kMinRnrTimer;
  a.ah_attr.port_num = static_cast<uint8_t>(port_.port);
  a.ah_attr.sl = static_cast<uint8_t>(p.sl);
  if (local_.roce) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(port_.gidIndex);
    a.ah_attr.grh.hop_limit = kHopLimit;
    a.ah_attr.grh.traffic_class = static_cast<uint8_t>(p.trafficClass);
  } else {
    a.ah_attr.dlid = peer.lid;
  }
  if (api_.modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    *err = "modify QP to RTR on " + hca_.name() + " towards QP " + std::to_string(peer.qpn) + ": " +
           std::strerror(errno) + " (peer address unresolvable?)";
    return false;
  }
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = static_cast<uint8_t>(p.timeout);
  a.retry_cnt = static_cast<uint8_t>(p.retryCnt);
  a.rnr_retry = kRnrRetryInfinite;
  a.sq_psn = local_.psn;
  a.max_rd_atomic = 1;
  if (api_.modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                 IBV_QP_MAX_QP_RD_ATOMIC)) {
    *err = "modify QP to RTS on " + hca_.name() + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

bool RcQp::toError(std::string* err) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (api_.modify_qp(qp_, &a, IBV_QP_STATE)) {
    *err = "modify QP to ERR on " + hca_.name() + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

ibv_qp_state RcQp::state() {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  if (api_.query_qp(qp_, &a, IBV_QP_STATE, &ia)) return IBV_QPS_UNKNOWN;
  return a.qp_state;
}

}  // namespace verbs
}  // namespace railover
