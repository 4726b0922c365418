// Verbs building blocks, part 4: a "verbs path", one or more RC QPs ("lanes") between a local
// and a remote HCA port that carry one direction of a comm's data plus its control channel. It
// maps onto the engine's chunk-level transport concepts one to one (docs/VERBS.md has the full
// design):
//
//   engine concept                      verbs path
//   ---------------------------------   ------------------------------------------------------
//   receiver advertise(seq, entries)    RecvPath::advertise(): a SEND of {seq, tag, addr, size,
//                                         rkey of this path's HCA} to the sender; a grouped
//                                         receive: advertiseGroup(), n GROUP_ENTRY SENDs
//   sender post(ChunkRef, src)          SendPath::post(): RDMA WRITE of the chunk into the
//                                         advertised buffer (a group: the entry its tag picks)
//                                         at its offset; a single receive's last chunk is a
//                                         WRITE_WITH_IMM whose immediate is the message's total
//                                         size (big-endian 32 bits), a grouped message ends
//                                         with a DONE{seq, entry, bytes, tag} SEND
//   receiver arrived(seq, size)         the WRITE_WITH_IMM's or DONE's receive completion; the
//                                         seq is the oldest advertised message not yet arrived
//                                         (RC delivers in order and the sender completes
//                                         messages in seq order)
//   control sendCtl/recvCtl CtlMsg      a SEND of {type, seq, arg} in either direction
//   progress signals                    lastProgressUs(), outstanding()
//   path broken                         Broken{source, status, code}: an error completion, a
//                                         PORT_ERR of this HCA port, a fatal QP/device event
//   fence()                             QP to ERR, then drain every flush completion
//   completionNeedsReceiverAck()        true: a WRITE's completion proves the remote HCA took
//                                         the data, not that the receiver holds it
//
// Lanes (NCCL_IB_QPS_PER_CONNECTION = N > 1): lane 0 is the QP described above and carries
// every control message; each chunk is split into N shares (ceil(len / N) rounded up to
// kLaneAlign bytes, lane i taking the i-th; a short chunk leaves the last lanes empty), each
// share an RDMA WRITE on its lane. RC orders a QP's operations, not two QPs', so when a
// message's last chunk is posted every lane i >= 1 ends its share with a PART{seq} SEND after
// its writes, and the receiver reports the message (WRITE_WITH_IMM or DONE on lane 0) only once
// every lane's PART for it (or a later one) has arrived: then every byte of it is placed. The
// sender sends a PART on every lane for every message it finishes, refused ones included. The
// receiver uses the lane count the sender's endpoints name (QpEndpoint::lanes).
//
// Messages are limited to 4 GiB - 1 bytes (the immediate is 32 bits); post() rejects larger.
// Every call is non-blocking except fence() (bounded by its timeout). Thread-safety: one thread
// at a time per path; paths on the same Hca may run on different threads (Hca locks its own
// state).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_qp.h"

namespace railover {
namespace verbs {

// The engine's shapes, mirrored (the engine's own header is not included so that this layer
// builds on its own; the adapter converts field by field).
enum class CtlType : uint8_t { kAck = 1, kResume = 2, kResumeAck = 3, kNack = 4, kClose = 5 };
struct CtlMsg {
  CtlType type = CtlType::kAck;
  uint64_t seq = 0;
  uint64_t arg = 0;
};
struct ChunkRef {
  uint64_t seq = 0;     // message sequence number on the comm
  uint64_t offset = 0;  // bytes from the start of the message
  uint64_t len = 0;     // bytes in this chunk
  uint64_t total = 0;   // bytes in the whole message
  uint64_t tag = 0;
};
// One advertised receive buffer. count 0: a single-buffer receive for message `seq` (any tag
// goes in). count 1..kMaxGroup: entry `index` of a grouped receive whose messages are seq ..
// seq + count - 1; each of them goes into the first entry not yet used whose tag is the
// message's tag (entries in index order).
constexpr int kMaxGroup = 8;  // as the engine's kMaxRecvs (NCCL's IB transport: 8)
struct Advert {
  uint64_t seq = 0, tag = 0, addr = 0, size = 0;
  uint32_t rkey = 0;
  uint8_t count = 0, index = 0;
};
// The sender's word on one message of a receive (what the receiver reports to the engine).
// written: the message's `bytes` are in entry `index` of its advertisement (grouped receives;
// a single receive learns it from the WRITE_WITH_IMM instead). Refused (!written): nothing was
// written, the message does not fit its receive: no free entry has its tag (index kNoEntry), or
// it is larger than entry `index`; the receiver's engine reports the caller's error.
struct Done {
  uint64_t seq = 0, tag = 0, bytes = 0;
  uint8_t index = 0;
  bool written = true;
};
constexpr uint8_t kNoEntry = 0xff;

// The control message wire (PathBase::kCtlBytes = 48 bytes, big-endian; docs/PROTOCOL.md,
// "RDMA control messages"):
//   [0] kind  [1] control type | done status  [2] group count  [3] entry index  [4..7] rkey
//   [8..15] seq  [16..23] addr | arg  [24..31] size | bytes  [32..39] tag  [40..47] 0
// Kinds: 1 ADVERT (a single receive), 2 CONTROL, 3 GROUP_ENTRY (one entry of a grouped
// receive; a group of n is n of them, index 0..n-1 in order, all with the group's seq and n),
// 4 DONE (sender -> receiver, see Done; status 0 written, 1 refused), 5 PART (sender ->
// receiver on lanes 1..N-1 only: this lane's share of message seq is written; [8..15] seq,
// every other byte 0).
namespace ctlwire {
constexpr size_t kBytes = 48;
enum Kind : uint8_t { kAdvert = 1, kControl = 2, kGroupEntry = 3, kDone = 4, kPart = 5 };
void encodeAdvert(const Advert& a, uint8_t out[kBytes]);  // kAdvert (count 0) or kGroupEntry
void encodeCtl(const CtlMsg& m, uint8_t out[kBytes]);
void encodeDone(const Done& d, uint8_t out[kBytes]);
void encodePart(uint64_t seq, uint8_t out[kBytes]);
struct Decoded {
  Advert advert;         // kAdvert, kGroupEntry
  CtlMsg ctl;            // kControl
  Done done;             // kDone
  uint64_t partSeq = 0;  // kPart
};
// Kind of the message with its fields in *d, or 0 with *err naming what is wrong: an unknown
// kind or control type, a group count outside 1..kMaxGroup, an entry index not below the count,
// a buffer whose end overflows 64 bits, a tag or DONE size beyond 32 bits, a DONE status
// other than 0/1 or a written DONE without an entry, non-zero reserved bytes (every kind). What
// it accepts re-encodes to the same 48 bytes (fuzzed: native/fuzz/fuzz_verbs.cc).
int decode(const uint8_t in[kBytes], Decoded* d, std::string* err);
}  // namespace ctlwire

// Why a path is broken. source: "completion" (error CQE), "port" (IBV_EVENT_PORT_ERR on this
// path's HCA port), "qp-event"/"device" (fatal async event), "post" (ibv_post_* failed),
// "protocol" (a peer broke the wire rules). status: ibv_wc_status_str() / the event's name.
struct Broken {
  std::string source;
  std::string status;
  int code = 0;       // enum ibv_wc_status or enum ibv_event_type; errno for "post"
  uint64_t tUs = 0;   // CLOCK_MONOTONIC when this path saw it
  uint64_t sinceLastOkUs = 0;  // from the last successful completion to tUs
  std::string dev;             // the path's HCA and port, for the journal and fatal errors
  int port = 0;
};

// A message the receiver's sink hears about: its whole `bytes` are at `addr` (the advertised
// buffer, or the grouped receive's entry the sender chose by tag), or the sender refused it
// (`refused`: nothing written, addr 0; the message does not fit its receive).
struct Arrival {
  uint64_t seq = 0, tag = 0, bytes = 0;
  uint64_t addr = 0;
  bool refused = false;
};

struct FenceResult {
  bool drained = false;      // every outstanding send and posted receive was flushed
  int flushedSends = 0, flushedRecvs = 0;
  uint64_t us = 0;           // how long fence() took
  std::string err;           // modify-to-ERR failure (then nothing is guaranteed)
};

// Shared machinery: QPs (lanes), control slots, completion polling, async events, fence.
class PathBase {
 public:
  // Depths per lane: send WRs in flight (chunks + control) and receive WRs kept posted.
  static constexpr int kSendDepth = 256;
  static constexpr int kRecvDepth = 256;
  static constexpr size_t kCtlBytes = ctlwire::kBytes;  // control message on the wire
  // A chunk's share on one lane is a multiple of this many bytes (the last share excepted), as
  // NCCL's IB transport aligns its per-QP split to 128 bytes.
  static constexpr uint64_t kLaneAlign = 128;

  // `lanes` RC QPs (1..QpEndpoint::kMaxLanes) on `port` of `hca`. ok() false with *err when a
  // QP, CQ or control-slot registration cannot be created or `lanes` is out of range.
  PathBase(Hca& hca, const PortSel& port, const RcParams& params, std::string* err, int lanes = 1);
  virtual ~PathBase();
  bool ok() const { return ok_; }
  int lanes() const { return static_cast<int>(lanes_.size()); }
  // Lane 0's endpoint (a one-lane path's only one); every lane's, in lane order, each naming
  // the lane count.
  const QpEndpoint& local() const { return lanes_[0].qp->local(); }
  std::vector<QpEndpoint> localEndpoints() const;
  RcQp& qp(int lane = 0) { return *lanes_[static_cast<size_t>(lane)].qp; }
  const RcParams& params() const { return params_; }

  // Brings every lane up towards the peer's endpoint of the same lane (INIT, posts every
  // receive, RTR, RTS): `peers` holds lanes() endpoints, each naming lanes() as its count, else
  // false with *err. Not for the progress thread (address resolution may block).
  bool connect(const std::vector<QpEndpoint>& peers, std::string* err);
  bool connect(const QpEndpoint& peer, std::string* err) { return connect(std::vector<QpEndpoint>{peer}, err); }

  // Sends a control message to the peer. 1 posted, 0 no send slot free (retry after progress),
  // -1 broken/fenced (*err).
  int sendCtl(const CtlMsg& m, std::string* err);

  // Moves every lane's QP to ERR, all at once (one short-lived thread per QP beyond the first;
  // all of them, even after one failed: err names the first failure) and polls until every outstanding send and posted receive has flushed or
  // timeoutMs passed. After it returns (with err empty) nothing sent on these QPs can
  // land in this side's registered memory, and no completion of them remains to be seen later.
  FenceResult fence(int timeoutMs);
  // Destroys every lane's QP now (ibv_destroy_qp), for a fence whose move to ERR failed: true
  // when all are gone, else false with *err naming the first refusal (those QPs may still take
  // writes). The path is unusable afterwards; destroy it. Blocks (seconds on rxe after a link
  // loss): never on the progress thread.
  bool destroyQps(std::string* err);
  // For an orderly close, before fence(): polls (what it finds waits for the next progress())
  // until every send posted on the path has completed, i.e. the peer's HCA took it, or the
  // path broke, or `giveUp` (asked about once a millisecond; may be empty) says the peer is
  // gone, or timeoutMs passed; true when none is left. A control message posted last (the
  // CLOSE, the final ACKs) is then not flushed by the fence that follows. Blocks for up to
  // timeoutMs: for a close only, never for a progress call.
  bool lingerSends(int timeoutMs, const std::function<bool()>& giveUp = nullptr);
  bool fenced() const { return fenced_; }

  bool broken() const { return broken_; }
  const Broken& brokenWhy() const { return why_; }
  // CLOCK_MONOTONIC µs of the last successful completion (send or receive); connect time
  // before. With several QPs: the oldest last completion among the QPs that have sends in
  // flight (any QP's when none has), so one QP that stopped completing (an ECMP black hole of
  // its flow) is not hidden by the others. A QP's clock restarts when a send is posted to it
  // with none in flight: an idle QP is not silent.
  uint64_t lastProgressUs() const;
  // µs the peer's HCA is known to have acknowledged nothing with sends in flight: on each QP
  // with sends in flight, from its last completion (or the post that ended its idleness) to the
  // start of its latest poll of the completion queue; the largest over the QPs. 0 when nothing
  // is in flight. Measured to the poll, not to now: a process stopped or descheduled after its
  // poll (SIGSTOP, a busy host) has not looked since, and its completions may be waiting in the
  // queue (an HCA acknowledges whatever its process does), so that time is no silence. What the
  // flow-stall rule reads (RdmaTransport's unackedSilenceMs).
  uint64_t silenceUs() const;
  // Send work requests posted and not completed yet (every lane).
  int outstanding() const;
  // Completions and async events the last progress() found (0: nothing happened).
  int lastPollFound() const { return lastFound_; }
  // Of those, the successful completions: the peer's data or control messages, or the peer's
  // HCA acknowledging this end's sends (each a round trip over the rail).
  int lastPollOk() const { return lastOk_; }
  // For an idle caller: waits in poll(2) until a completion or an async event of the HCA may be
  // pending, or timeoutMs passes. Never needed for correctness (progress() never blocks).
  void waitIdle(int timeoutMs);

 protected:
  struct SendRec {
    enum Kind : uint8_t { kCtl, kWrite, kWriteImm } kind = kCtl;
    ChunkRef chunk;
  };
  // One poll pass: async events, then up to 32 completions per lane. Calls the hooks below.
  void pollOnce();
  virtual void onCtl(const uint8_t* wire) = 0;
  virtual void onImm(uint32_t imm) = 0;
  virtual void onSendDone(const SendRec& r) = 0;
  // A control slot received on lane >= 1 (only PARTs belong there).
  virtual void onLaneCtl(int lane, const uint8_t* wire) = 0;
  // Called once per pollOnce() after the completions (the receiver releases held arrivals).
  virtual void afterPoll() {}
  // The remote access every lane's QP gets at INIT (connect()).
  virtual int accessAtInit() const { return RcQp::kDataQpAccess; }
  // True exactly once, the first time it is asked after the path broke (sinks hear it once).
  bool takeBrokenNews();
  void markBroken(const std::string& source, const std::string& status, int code);
  int postSend(ibv_send_wr* wr, const SendRec& rec, std::string* err, int lane = 0);
  bool sendSlotFree(int lane = 0) const { return lanes_[static_cast<size_t>(lane)].sendsInFlight < kSendDepth; }
  int freeSlots(int lane) const { return kSendDepth - lanes_[static_cast<size_t>(lane)].sendsInFlight; }
  // The control slot the next send of `lane` will use (valid while sendSlotFree(lane)), and its
  // posting.
  uint8_t* ctlSendSlot(int lane = 0);
  int postCtlSlot(uint8_t* slot, std::string* err, int lane = 0);

  // Events found while polling, delivered to the sink by the next progress() (fence() polls
  // without a sink: a message that arrived just before the fence is not lost).
  struct Ev {
    enum Kind : uint8_t { kChunkDone, kCtl, kArrived } kind;
    ChunkRef chunk;
    CtlMsg ctl;
    Arrival arrival;
  };
  std::deque<Ev> evq_;

  Hca& hca_;
  const VerbsApi& api_;
  PortSel port_;
  RcParams params_;
  bool ok_ = false, connected_ = false, broken_ = false, fenced_ = false, brokenTold_ = false;
  Broken why_;
  uint64_t lastOkUs_ = 0;
  uint64_t portErrBase_ = 0;
  uint64_t lidSeen_ = UINT64_MAX;  // Hca::portLid's change count last compared (InfiniBand)
  // For a path whose QPs come up without IBV_ACCESS_REMOTE_WRITE (accessAtInit): whether
  // connect() read every lane's access back (RcQp::queryAccess, once it reached RTS) without
  // it, i.e. the HCA itself says its responder refuses WRITEs. false when a query failed or the
  // HCA reports the flag set anyway (providers that do not honour it); accessNote_ says which.
  bool remoteWriteOffConfirmed_ = false;
  std::string accessNote_;

 private:
  // One RC QP of the path with its control slots and send ring.
  struct Lane {
    std::unique_ptr<RcQp> qp;
    std::vector<uint8_t> ctlRecv, ctlSend;
    ibv_mr* ctlRecvMr = nullptr;
    ibv_mr* ctlSendMr = nullptr;
    std::vector<SendRec> recs;  // ring indexed by wr_id % kSendDepth
    uint64_t sendHead = 0;      // next wr_id to use
    int sendsInFlight = 0;
    int recvsPosted = 0;
    uint64_t lastOkUs = 0;      // last successful completion on this QP (connect time, or the post that ended its idleness)
    uint64_t lastPollUs = 0;    // when its latest poll of the completion queue started
  };
  bool postRecv(Lane& l, int slot, std::string* err);
  void pollLane(int lane);
  std::vector<Lane> lanes_;
  int lastFound_ = 0;
  int lastOk_ = 0;
  int flushedSends_ = 0, flushedRecvs_ = 0;
};

// Sender's end of a path.
class SendPath : public PathBase {
 public:
  struct Sink {
    virtual ~Sink() = default;
    virtual void chunkDone(const ChunkRef& c) = 0;  // the remote HCA acknowledged the chunk's write
    virtual void ctl(const CtlMsg& m) = 0;           // a control message from the receiver
    virtual void broken(const Broken& b) = 0;        // once, the first time the path breaks
  };
  using PathBase::PathBase;

  // Polls completions and events, calling the sink (never blocks).
  void progress(Sink& sink);
  // The receiver's advertisement covering `seq`, once it arrived whole (a group: every entry);
  // *out = the advert (a group: its entry 0).
  bool advertised(uint64_t seq, Advert* out) const;
  // The same advertisement as the engine needs it to place sends by tag: its first seq, the
  // messages it takes (*count), whether it is grouped, and its entries' tags in index order
  // (tags[0..*count)). False when no whole advertisement covers `seq` yet.
  bool advertisedReceive(uint64_t seq, uint64_t* first, int* count, bool* grouped, uint64_t tags[kMaxGroup]) const;
  // Posts one chunk from `src` (registered with `lkey` on this path's HCA). 1 posted, 0 would
  // block (no whole advertisement for the seq yet, or no send slot), -1 error (*err: total >=
  // 4 GiB, a chunk beyond its message, last chunk or first chunk of a grouped message out of
  // seq order, path broken or fenced). Chunks of a message go in offset order; the chunk with
  // offset + len == total is the last.
  // Which buffer: a single receive's advertised buffer; in a grouped receive the first entry
  // not yet used whose tag is c.tag, chosen at the message's first chunk (messages of a group
  // choose in seq order, as the receiver's engine matches them). A message that does not fit
  // (no free entry with its tag, or larger than its buffer) is refused, not written: its chunks
  // are taken (1) without a write and its last chunk posts a refusing DONE, so the receiver's
  // engine reports the caller's error (as with TCP) and the path stays up.
  // A grouped message ends with a WRITE of its last chunk and a DONE{seq, entry, bytes, tag}
  // SEND (RC: placed after the writes before it); a single one with a WRITE_WITH_IMM.
  // With several lanes the chunk is split into per-lane WRITEs and the last chunk also posts a
  // PART{seq} on every lane >= 1 (header); 0 (would block) when any lane lacks the send slots,
  // so a chunk is posted on all its lanes or on none. chunkDone() then reports each lane's
  // share of a chunk as its own ChunkRef (offset and len of the share).
  int post(const ChunkRef& c, const void* src, uint32_t lkey, std::string* err);
  // Always true for verbs: see the header comment.
  static constexpr bool completionNeedsReceiverAck() { return true; }

 private:
  void onCtl(const uint8_t* wire) override;
  void onImm(uint32_t imm) override;
  void onSendDone(const SendRec& r) override;
  void onLaneCtl(int lane, const uint8_t* wire) override;
  // One advertisement: a single receive (count 1, !grouped) or a grouped one, by first seq.
  struct Group {
    uint64_t seq = 0;
    uint8_t count = 1;     // messages it takes
    bool grouped = false;
    uint8_t have = 0;      // entries arrived so far (usable when have == count)
    uint8_t used = 0;      // entries chosen by a message (bit mask)
    uint8_t started = 0;   // messages whose buffer is chosen (seq order)
    uint8_t finished = 0;  // messages whose last chunk is posted (seq order)
    int16_t pick[kMaxGroup];  // chosen entry per message (seq - this seq); -1 refused
    uint8_t refuseIndex[kMaxGroup];  // entry named in a refusal (kNoEntry: no entry had the tag)
    Advert e[kMaxGroup];
  };
  // The group covering `seq`, nullptr if none (whole or not).
  Group* groupOf(uint64_t seq);
  const Group* groupOf(uint64_t seq) const;
  std::map<uint64_t, Group> adverts_;
};

// Receiver's end of a path.
class RecvPath : public PathBase {
 public:
  struct Sink {
    virtual ~Sink() = default;
    // The whole message a.seq (a.bytes long) is at a.addr, or was refused by the sender.
    virtual void arrived(const Arrival& a) = 0;
    virtual void ctl(const CtlMsg& m) = 0;
    virtual void broken(const Broken& b) = 0;
  };
  using PathBase::PathBase;

  void progress(Sink& sink);
  // Advertises [buf, buf+size) with `rkey` (of this path's HCA) for message `seq`. Advertise in
  // seq order. 1 sent, 0 no send slot (retry after progress), -1 broken/fenced (*err).
  int advertise(uint64_t seq, uint64_t tag, void* buf, uint64_t size, uint32_t rkey, std::string* err);
  // Advertises a grouped receive: messages seq .. seq + n - 1 go into entries[0..n) (addr, size,
  // rkey, tag; count and index are filled here), n in 1..kMaxGroup, as n GROUP_ENTRY messages
  // posted at once. 1 sent, 0 fewer than n send slots free (retry after progress), -1 broken,
  // fenced, bad n or out of seq order (*err).
  int advertiseGroup(uint64_t seq, const Advert* entries, int n, std::string* err);
  // An advertisement whose messages have not all arrived.
  struct Pending {
    uint64_t seq = 0;
    uint8_t count = 1;  // messages it takes
    bool grouped = false;
    uint8_t used = 0;   // entries filled (bit mask)
    uint8_t next = 0;   // messages arrived (seq order)
    Advert e[kMaxGroup];
  };
  // Advertised and not yet arrived on lane 0, oldest first (what a resume must re-advertise
  // elsewhere, with held() arrivals: those are not reported before their PARTs came).
  const std::deque<Pending>& pending() const { return pending_; }

  // Messages that arrived on lane 0 and wait for a lane's PART (several lanes only).
  size_t held() const { return held_.size(); }

  // Whether the path's QPs may ever have taken an RDMA WRITE. A receive path's QPs come up
  // without IBV_ACCESS_REMOTE_WRITE (the responder NAKs any WRITE, whatever its rkey: RC's
  // remote access check is the QP's as well as the MR's), and get it just before the path's
  // first advertisement leaves (set before the modify is tried, so a modify that failed
  // halfway counts too). A path the engine never advertised on, a standby that carried only
  // control messages, stays false: nothing of it can land in a registered buffer, even if its
  // QP can be neither moved to ERR nor destroyed (rdma_transport.cc, fenceAsync) -- provided
  // the HCA honours the QP's flag, which connect() checks by reading every lane's access back:
  // where it could not confirm IBV_ACCESS_REMOTE_WRITE off (query failed, or the provider
  // reports it on, as irdma does for the write responses it enables at QP creation) this is
  // true from the start. Read after the path stopped (fenced), from any thread the fence was
  // handed to.
  bool writesAllowed() const {
    return writesAllowed_.load(std::memory_order_acquire) || !remoteWriteOffConfirmed_;
  }
  // Why writesAllowed() is true for a path that never advertised: the read-back's finding
  // ("" when it confirmed the flag off).
  const std::string& accessReadBack() const { return accessNote_; }

  // Grants every lane's QP IBV_ACCESS_REMOTE_WRITE (RcQp::setAccess, RTS -> RTS), once. Meant
  // for a thread other than the path's (a modify is a firmware command on mlx5 and waits for
  // it), while the path's thread goes on polling and posting: it touches only the QPs (verbs
  // calls are thread-safe) and the two atomics behind writesAllowed() and writesGranted(). Not
  // concurrently with itself, with fence() or with the path's destruction (the caller orders
  // them: rdma_transport.cc, RdmaRecvPath::startGrant). false with *err when a modify failed;
  // the path is not marked broken by it (that is for the path's thread: advertise() would).
  bool grantWrites(std::string* err);
  // Whether grantWrites() succeeded: advertisements may leave. Thread-safe.
  bool writesGranted() const { return writesGranted_.load(std::memory_order_acquire); }

 private:
  int accessAtInit() const override { return IBV_ACCESS_LOCAL_WRITE; }
  // On the path's thread, before an advertisement: grantWrites() unless it succeeded already;
  // false with *err (the path is broken then) when a modify fails.
  bool allowWrites(std::string* err);
  std::atomic<bool> writesAllowed_{false}, writesGranted_{false};
  void onCtl(const uint8_t* wire) override;
  void onImm(uint32_t imm) override;
  void onSendDone(const SendRec& r) override {}
  void onLaneCtl(int lane, const uint8_t* wire) override;
  void afterPoll() override;
  void onDone(const Done& d);
  void arrive(const Arrival& a);
  int checkOrder(uint64_t seq, std::string* err);
  std::deque<Pending> pending_;
  // Several lanes: arrivals held until every lane >= 1 has sent a PART for their seq or a later
  // one; partNext_[i] = (seq of lane i's last PART) + 1, 0 before its first.
  std::deque<Arrival> held_;
  std::vector<uint64_t> partNext_;
  uint64_t advertisedEnd_ = 0;  // one past the highest seq advertised so far
  bool advertisedAny_ = false;
};

}  // namespace verbs
}  // namespace railover
