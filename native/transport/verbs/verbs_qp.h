// Verbs building blocks, part 3: RC queue pair parameters, endpoint exchange and bring-up.
//
// Constants and their sources:
// * kNcclDefaultTimeout = 20, kNcclDefaultRetryCnt = 7: NCCL's IB transport defaults for
//   NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT (2.23 and later). The local ACK timeout is
//   4.096 µs * 2^timeout per try (InfiniBand Architecture Specification, QP attribute "Local
//   ACK Timeout"), so 20 gives 4.3 s per try and about 30 s until IBV_WC_RETRY_EXC_ERR with 7.
// * rxe (Soft-RoCE) treats retry_cnt 7 as "retry forever" (its completer only decrements the
//   count when it is not 7), so a dead peer never produces an error completion there: tests on
//   rxe use retry_cnt <= 6.
// * kRnrRetryInfinite = 7 (the verbs encoding of "infinite RNR retry", as NCCL uses),
//   kMinRnrTimer = 12 (0.64 ms, NCCL's value).
// * kHopLimit = 64: GRH hop limit, carried as the IP TTL on RoCE v2 (64 = Linux's default TTL).
//
// Thread-safety: an RcQp is used by one thread at a time.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

#include "transport/verbs/verbs_device.h"

namespace railover {
namespace verbs {

constexpr int kNcclDefaultTimeout = 20;
constexpr int kNcclDefaultRetryCnt = 7;
constexpr int kRnrRetryInfinite = 7;
constexpr int kMinRnrTimer = 12;
constexpr int kHopLimit = 64;

struct RcParams {
  int timeout = kNcclDefaultTimeout;    // local ACK timeout exponent, 0..31 (4.096 µs * 2^t)
  int retryCnt = kNcclDefaultRetryCnt;  // 0..7
  int sl = 0;                           // service level (NCCL_IB_SL)
  int trafficClass = 0;                 // GRH traffic class (NCCL_IB_TC)
  int pkeyIndex = 0;                    // NCCL_IB_PKEY: P_Key table index (used by RcQp::toInit)
  // Nominal time from the last acknowledged packet to IBV_WC_RETRY_EXC_ERR, µs:
  // 4.096 µs * 2^timeout * (retryCnt + 1). Infinite (UINT64_MAX) for retryCnt 7 on rxe only
  // in practice; this returns the specification's value.
  uint64_t nominalGiveUpUs() const;
  // "" when valid, else what is wrong.
  std::string validate() const;
};

// What the peer needs to connect to a QP. Sent over the out-of-band channel as 40 bytes in
// network byte order (pack/unpack), with a magic and version so a mismatched peer is named.
struct QpEndpoint {
  uint32_t qpn = 0;
  uint32_t psn = 0;          // 24 bits
  uint8_t gid[16] = {0};
  uint16_t lid = 0;
  uint8_t mtu = IBV_MTU_1024;  // enum ibv_mtu of the sender's active MTU
  uint8_t roce = 1;
  // QPs of the path this endpoint belongs to (1..kMaxLanes; NCCL_IB_QPS_PER_CONNECTION at the
  // sender): every endpoint of a path carries the same count, and a path's N endpoints travel
  // back to back. On the wire as byte 34 = lanes - 1, so a one-QP endpoint is byte for byte
  // what wire version 1 was before paths had several QPs.
  uint8_t lanes = 1;
  // The QoS the sender's QPs use (its RcParams: NCCL_IB_TC/NCCL_IB_SL or the comm's traffic
  // class), for the receiver's QPs: bytes 35 (1 = given), 36 (traffic class), 37 (service
  // level, 0..15). An endpoint without it (byte 35 = 0) is what a railover before it sent:
  // the receiver then uses its own settings.
  bool qos = false;
  uint8_t trafficClass = 0, sl = 0;
  static constexpr int kMaxLanes = 128;  // NCCL_IB_QPS_PER_CONNECTION's upper bound (params.h)
  static constexpr size_t kWireBytes = 40;
  void pack(uint8_t out[kWireBytes]) const;
  // false with *err naming the first bad field: magic, version, QPN (1..0xFFFFFF), PSN (24
  // bits), MTU code (IBV_MTU_256..IBV_MTU_4096), link layer (0 IB, 1 RoCE), LID (IB: unicast
  // 1..0xBFFF), GID (RoCE: not all zero), lane count (byte 34: 0..kMaxLanes-1), QoS flag
  // (byte 35: 0 or 1; with 0 bytes 36..37 zero), service level (byte 37: 0..15), reserved
  // bytes 38..39 (zero). Nothing is taken from a
  // refused endpoint. Fuzzed by native/fuzz/fuzz_verbs.cc.
  bool unpack(const uint8_t in[kWireBytes], std::string* err);
  // True when the bytes start with the endpoint's magic: a refused endpoint that does is a
  // malformed (or newer) railover peer, one that does not is another protocol altogether.
  static bool looksLikeOne(const uint8_t in[kWireBytes]);
};

// Blocking exchange of endpoints over a connected stream socket (bootstrap; never on a
// progress thread): writes ours, reads the peer's, bounded by timeoutMs.
bool exchangeEndpoints(int fd, const QpEndpoint& mine, QpEndpoint* peer, int timeoutMs, std::string* err);

// One RC QP on a port, with its own CQ (send and receive completions both land there) and a
// non-blocking completion channel, so that an idle caller can wait in poll(2) on completionFd()
// instead of spinning (which starves rxe's kernel work on a slow guest).
class RcQp {
 public:
  RcQp(Hca& hca, const PortSel& port, int sendDepth, int recvDepth, std::string* err);
  ~RcQp();  // destroys what is left (destroyQp()'s result is lost here: call it first to know)
  // ibv_destroy_qp now: true once the QP is gone (also when there was none). false with *err
  // when the HCA refused: the QP may still exist (and take the peer's writes); it is tried
  // again by the destructor. After success qp() is null. Not for the progress thread.
  bool destroyQp(std::string* err);
  RcQp(const RcQp&) = delete;
  RcQp& operator=(const RcQp&) = delete;

  bool ok() const { return qp_ != nullptr; }
  ibv_qp* qp() const { return qp_; }
  ibv_cq* cq() const { return cq_; }
  int completionFd() const { return ch_ ? ch_->fd : -1; }
  // Consumes pending completion-channel events and re-arms the CQ's notification. Call it
  // only before waiting on completionFd(), then poll the CQ once more (a completion between the
  // last poll and the arming raises no event): on rxe both halves are system calls and every
  // completion after the arming raises an event, so a busy poller must not re-arm.
  void rearm();
  Hca& hca() const { return hca_; }
  // The HCA opening (Hca::epoch) this QP and its CQ were built on; its PD is qp()->pd.
  uint64_t epoch() const { return epoch_; }
  const PortSel& port() const { return port_; }
  const QpEndpoint& local() const { return local_; }

  // RESET -> INIT (receives may be posted from here on), with P_Key table index `pkeyIndex`
  // (NCCL_IB_PKEY; RcParams::pkeyIndex; verbs_config.h checkPkeyIndex validates it) and
  // remote access `access` (IBV_ACCESS_* the peer may use on this QP: data QPs take RDMA
  // WRITEs, the flush QP of verbs_gdr.h serves its own RDMA READs).
  bool toInit(int pkeyIndex, int access, std::string* err);
  bool toInit(int pkeyIndex, std::string* err) { return toInit(pkeyIndex, kDataQpAccess, err); }
  bool toInit(std::string* err) { return toInit(0, err); }
  static constexpr int kDataQpAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  // Sets the remote access of a QP past INIT (RTS -> RTS, IBV_QP_ACCESS_FLAGS alone, which the
  // IB spec allows there): a receive path's QPs get IBV_ACCESS_REMOTE_WRITE this way only
  // before their first advertisement (verbs_path.h, RecvPath::writesAllowed).
  bool setAccess(int access, std::string* err);
  // The remote access the HCA reports for this QP (ibv_query_qp, IBV_QP_ACCESS_FLAGS), which
  // is what its responder enforces on providers that read it back from the QP context (mlx5
  // reads the firmware's, rxe the one it checks; irdma reports the write-response enable it
  // turns on at QP creation whatever was asked). false with *err when the query fails.
  bool queryAccess(int* access, std::string* err);
  // INIT -> RTR -> RTS towards `peer` with `p` (path MTU = the smaller active MTU).
  bool toRts(const QpEndpoint& peer, const RcParams& p, std::string* err);
  // Any state -> ERR: outstanding work requests complete with IBV_WC_WR_FLUSH_ERR, and incoming
  // packets for this QP are no longer placed into memory.
  bool toError(std::string* err);
  ibv_qp_state state();

 private:
  Hca& hca_;
  const VerbsApi& api_;
  PortSel port_;
  ibv_comp_channel* ch_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  unsigned unacked_ = 0;  // completion events read and not yet acknowledged
  uint64_t epoch_ = 0;
  QpEndpoint local_;
};

}  // namespace verbs
}  // namespace railover
