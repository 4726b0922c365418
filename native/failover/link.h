// The failover engine: one *link* per NCCL comm (a SendLink for a send comm, a RecvLink for
// its peer recv comm), each owning a primary path and standby paths over other NICs.
//
// This file and link.cc hold two state machines (docs/DESIGN.md, "State machines", has the
// tables of transitions and their triggers):
//
// * each path's (PathState), changed only by Link::setPathState, which logs and journals
//   (path_state) every transition with its reason:
//
//   CONNECTING --all streams connected, HELLO sent--> STANDBY --RESUME sent / accepted--> ACTIVE
//        ^                                               |                              |
//        +------ back-off retry (capped) <--- FAILED <---+------ error / pair down -----+
//   (any state -> CLOSED when the comm is closed by either side)
//
// * each link's (LinkState), changed only by Link::setState, which logs every transition:
//     CONNECTING -> WAITING                          the first path connected
//     WAITING -> RESUMING                            send: a path made active, RESUME sent (the
//                                                    start, or a standby usable again after an outage)
//     RUNNING (or FAILING_BACK) -> RESUMING          send: the active path failed; failover
//     RUNNING -> FAILING_BACK                        send: the primary was healthy for its hold-down
//     RESUMING, FAILING_BACK -> RUNNING              send: RESUME_ACK
//     RUNNING, RESUMING, FAILING_BACK -> WAITING     the active path failed, no usable standby
//     WAITING <-> RUNNING                            recv: a RESUME arrived / the active path failed
//     any -> PEER_CLOSED, FATAL, CLOSED              (final: only PEER_CLOSED -> FATAL, and -> CLOSED)
//
// Delivery rules (docs/DESIGN.md, invariants 1-3):
//  * the k-th isend lands in the k-th irecv's buffer exactly once, in order;
//  * a send completes only when the receiver acknowledged the whole message (cumulative ACK);
//  * before data moves on a newly activated path the sender sends RESUME(first unacked seq)
//    and the receiver fences every other path, forgets partial progress of incomplete
//    receives and answers RESUME_ACK(next expected seq); the sender resends from there.
//    Receive accounting is idempotent per chunk (RecvRanges): bytes already held and chunks
//    of completed seqs are discarded, never counted twice.
//
// The engine moves chunks and control messages through the path interface
// (transport/transport.h: SendPath, RecvPath, RecvSink); framing is the transport's.
//
// Threading: NCCL's progress thread calls isend/irecv/test, its service thread connect/
// accept/close; the sweeper thread of the link's registry (failover/registry.h) calls sweep/
// idleSweep; a per-link mutex serialises them. The health thread is never blocked by a
// link: links only read its atomics. No call blocks (invariant 5).
//
// Dependencies: everything a link uses from the process (configuration, NICs, transport,
// health, journal, registry) comes in its LinkDeps (failover/deps.h) at construction.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "abi/nccl_net_abi.h"
#include "failover/deps.h"
#include "transport/transport.h"

namespace railover {

constexpr int kRing = 64;  // receive requests in flight per comm (NCCL needs 32)
// Largest n of a grouped receive (irecv of n buffers), advertised as maxRecvs; as NCCL's IB
// transport (NCCL_NET_IB_MAX_RECVS).
constexpr int kMaxRecvs = kMaxReceiveBuffers;
// Sends in flight per comm: NCCL may post 32 x maxRecvs on a send comm.
constexpr int kSendRing = 32 * kMaxRecvs;
// Messages in flight per recv comm (a grouped receive takes n of them).
constexpr int kMsgRing = 32 * kMaxRecvs;

enum class PathState { kConnecting, kStandby, kActive, kFailed, kClosed };
const char* pathStateName(PathState s);

// What a link is doing (the recv side uses CONNECTING, WAITING, RUNNING and the three final ones).
enum class LinkState {
  kConnecting,   // no path has connected yet (recv: accept has not seen a ready path yet)
  kWaiting,      // no active path: the first one is not chosen yet, or the active one failed and
                 // no standby is usable (failed paths retry; the fatal timeout runs)
  kResuming,     // send: RESUME sent on a newly active path (start, failover, recovery), waiting
                 // for its RESUME_ACK; nothing else is sent meanwhile
  kFailingBack,  // send: the same for a planned switch back to the repaired primary
  kRunning,      // traffic flows on the active path
  kPeerClosed,   // the peer closed the comm (closedCause says how); the sender still reads the
                 // ACKs sent before the CLOSE; pending requests fail, nothing reconnects
  kFatal,        // gave up (fatalMsg): pending requests get the error
  kClosed,       // closed by NCCL
};
const char* linkStateName(LinkState s);

struct Path {
  int index = 0;        // index in the receiver's handle address list
  int localNic = -1;    // our NIC
  int rail = -1;
  int pairId = -1;      // Health pair id
  sockaddr_storage remote{};
  socklen_t remoteLen = 0;
  PathState state = PathState::kConnecting;
  std::unique_ptr<SendPath> tx;  // sender: the path's send side (null while failed or closed)
  std::unique_ptr<RecvPath> rx;  // receiver: the path's receive side (null while failed or closed)
  int nStreams = 0;              // receiver: streams the sender's HELLOs announced for this generation
  uint32_t generation = 0;
  uint64_t nextAttemptUs = 0;
  uint32_t backoffMs = 0;
  uint64_t upSinceUs = 0;      // when it last became usable (hold-down clock)
  // Receiver only: when the newest stream of this generation reached the acceptor (µs,
  // CLOCK_MONOTONIC): what the sender's connection proves about its NIC dates from then, not
  // from when this link polled it (RecvLink::failPathsDownByHealth).
  uint64_t arrivedUs = 0;
  uint64_t restoredUs = 0;     // when it last became usable or active again (flap clock)
  uint64_t decayedUs = 0;      // when its hold-down last shrank
  uint64_t failedAtUs = 0;
  uint64_t attemptStartUs = 0;
  // Send: the connect attempt's waiting time as its polls saw it, µs: each poll adds the time
  // since the previous one (or since the attempt started), at most kConnectPollCreditUs, so a
  // caller that was away is not read as a network that did not answer (advanceConnect).
  uint64_t connectWaitedUs = 0;
  uint64_t lastConnectPollUs = 0;
  // Send: the part of the attempt's waiting time that was a process's work, not the network's
  // (SendPath::connectWaitsOffNetwork at the poll that began it: the peer's answer, this side's
  // worker), µs: counted here instead of in connectWaitedUs, bounded by
  // tuning::kConnectOffNetworkMaxUs.
  uint64_t offNetWaitedUs = 0;
  bool waitsOffNetwork = false;  // what the latest poll of the attempt said
  // Send: the latest poll said the attempt waits for the peer's answer to an acknowledged
  // request (SendPath::connectWaitsForPeer), and whether the pair was up when that wait began
  // (a verdict from before the acknowledgement says nothing about a lost answer).
  bool waitsForPeer = false;
  bool pairUpWhenAcked = false;
  uint64_t openUs = 0;  // send: how long the last openSendPath held the thread, µs (path_up)
  uint32_t flaps = 0;
  uint32_t holdDownMs = 0;     // current (flap-grown) hold-down
  uint64_t repairSeenUs = 0;   // last NIC/pair repair (Health::repairedUs) this path acted on
  std::string lastError;
  uint64_t lastRxUs = 0;
  // Receiver only: the sender's listener port on the NIC this path comes from (its HELLO's
  // probePort), and the liveness check of the sender process over it (peer-gone verdict).
  uint16_t peerPort = 0;
  std::unique_ptr<Conn> live;
  uint64_t liveStartUs = 0;
  int liveResult = 0;  // 0 unknown, 1 the sender process accepted, -1 its kernel refused
  // Fences and drops both sides. With `pending`, the receive side is fenced without blocking
  // (RecvPath::fenceAsync) and a fence still running is added to *pending. Returns how long
  // the receive side's blocking fence waited for a running grant of remote write
  // (RecvPath::lastFenceGrantWait), µs; 0 with `pending`, or when it waited for none.
  uint64_t closeAll(std::vector<std::shared_ptr<FenceWait>>* pending = nullptr);
};

struct LinkCounters {
  uint64_t failovers = 0, failbacks = 0, flaps = 0, bytesResent = 0, resumes = 0, recoveries = 0;
  uint64_t dupBytesDropped = 0;  // receiver: chunks of already-complete messages read and discarded
  uint64_t lastDetectUs = 0, lastConvergeUs = 0;
};

// What the state file shows of a link; copied under Link::snapMu when the link changes.
struct PathSnap {
  int localNic = -1;
  std::string peer;
  PathState state = PathState::kConnecting;
  uint32_t flaps = 0, holdDownMs = 0;
  std::string lastError;
};
struct LinkSnap {
  bool isSend = true;
  uint64_t secret = 0;
  std::string peer;
  int active = -1, primary = 0;
  bool fatal = false;
  std::vector<PathSnap> paths;
  LinkCounters counters;
};

class Link {
 public:
  Link();
  virtual ~Link();
  LinkDeps deps;  // handed in at construction (SendLink::create, Listener, RecvLink)
  // Makes the link visible in deps.registry (state file, failover sweeper; no effect without
  // a registry). Called once it is fully constructed; unlist() before it is torn down (close()
  // and the destructors do).
  void list();
  void unlist();
  // One step of the failover sweeper (sweeper thread, never an NCCL thread): if the link is
  // not settled on a healthy active path, drives it as a test() call would, so a NIC fault
  // moves every comm without waiting for NCCL to call each one. Never blocks: skips a link
  // whose mutex is held. Returns true when the link is settled.
  virtual bool sweep() { return true; }
  // The sweeper's idle pass (every tuning::kIdleSweepMs, sweeper thread): drives a link that
  // NCCL is not calling while it has work: a recv comm whose receives are all complete must
  // still answer a RESUME, or its sender's last sends never complete; a send comm reconnects
  // its failed paths, or a second fault at its next call would find no connected standby.
  // Never blocks: skips a link whose mutex is held. `now` in µs (nowUs()).
  virtual void idleSweep(uint64_t now) { (void)now; }
  // NCCL deregisters `mhandle` (deregMr on this comm). Messages not complete that still use it
  // forget it, and if there are any the link stops (deregMsg set): NCCL is tearing the comm
  // down (receives posted and never matched, a send whose ACK the closing peer never sent, an
  // abort), so nothing of this link may read the registration after the caller frees it (the
  // sweeper would otherwise resend or re-advertise from it). Quietly: this is a normal
  // teardown, not a fault. Returns how many messages used it. Caller holds mu.
  virtual size_t forgetRegistration(void* mhandle) = 0;
  // The NCCL device (local NIC index) the comm was opened on: listen()'s dev for a recv comm,
  // connect()'s for a send comm. Fixed at construction; any thread.
  virtual int dev() const = 0;
  // Set by forgetRegistration: the link moves nothing more (progress, sweeps), and a request
  // still tested fails with this message (ncclInternalError).
  std::string deregMsg;
  // Publishes a snapshot for the state file when anything it shows changed (called from the
  // link's slow tick, at most every ms; cheap when nothing changed).
  void publishIfChanged(bool isSend);
  LinkSnap snapshot();
  std::mutex snapMu;
  LinkSnap snap;
  uint64_t snapSig = 0;
  std::mutex mu;
  uint64_t secret = 0;
  std::vector<Path> paths;
  // Whether a path other than paths[i] could carry the traffic now: a standby (or, with
  // `activeCounts`, the active path) whose NIC is up and whose pair answers its probes (within
  // half the detection time), not just repaired. Proof that the peer is alive and reachable.
  bool otherPathUsable(size_t i, uint64_t now, bool activeCounts = false) const;
  int active = -1;
  int primary = 0;
  int nStreams = 1;
  LinkState state() const { return state_; }
  bool isFatal() const { return state_ == LinkState::kFatal; }
  // The fatal error is "the peer process exited": requests already pending fail (in test()),
  // but posting more still succeeds, as NCCL may post receives it then closes unmatched.
  bool fatalPeerGone = false;
  // The peer closed the comm in order (later EOFs are not faults): closedCause is set. Stays
  // true once set, whatever state the link moves to afterwards (fatal, closed).
  bool peerClosed() const { return !closedCause.empty(); }
  std::string fatalMsg;  // the fatal error; set (once) when the link enters FATAL
  uint64_t noPathSinceUs = 0;
  uint64_t lastSlowTickUs = 0;
  uint64_t seenEpoch = 0;
  // The kinds of call into a path's transport that are timed (journal `call`: "progress",
  // "close": fencing and releasing the path, see closePath; "open": creating a send path and
  // starting its connect, see SendLink::startConnect).
  enum class SlowCall { kProgress, kClose, kOpen };
  static constexpr int kSlowCallKinds = 3;
  // A call into path p's transport of kind `call` that began at t0 (nowUs()) and held the
  // thread longer than tuning::kSlowTransportCallUs: logged and journaled (transport_slow), at
  // most once per tuning::kSlowTransportLogIntervalUs per link and kind of call (a slow
  // progress does not hide a slow close). `grantWaitUs`: of the call's time, the part a
  // receive path's blocking fence waited for a running grant of remote write (a close; µs,
  // 0 when none). Caller holds mu.
  void noteSlowCall(const Path& p, uint64_t t0, SlowCall call, uint64_t grantWaitUs = 0);
  // p.closeAll(pending), timed: a close that held the thread is journaled as call "close"
  // (noteSlowCall). Every close of a path by a live link goes through here: a failed path, the
  // old active path fenced by a failover or failback, a path replaced by a reconnect, and the
  // paths of a comm NCCL closes. Caller holds mu.
  void closePath(Path& p, std::vector<std::shared_ptr<FenceWait>>* pending = nullptr);
  uint64_t lastSlowCallLogUs[kSlowCallKinds] = {};  // noteSlowCall's last line, by SlowCall
  LinkCounters counters;
  std::string peerName;  // for logs: peer address of the primary path
  std::string describe(const Path& p) const;
  // Every path failed because the peer's kernel refused or reset it (the peer process exited).
  bool peerGoneOnAllPaths() const;
  // Why the peer closed the comm (CLOSE, or a NACK saying it no longer serves it); "" if it did not.
  std::string closedCause;

  // The one place a path's state changes. Logs one line and journals one path_state event:
  //   railover: <dir> comm <secret> path <describe(p)>: <from> -> <to> (<why>)
  // as a WARN (rate-limited, RO_WARN_EVENT) for `fault`, else INFO (NET). No line when the
  // state does not change (a connect attempt restarted). Under `mu`.
  void setPathState(Path& p, PathState to, const std::string& why, bool fault = false);
  // The one place the link's state changes: logs `railover: <dir> comm <secret>: <from> -> <to>
  // (<why>)`, a WARN (RO_WARN_EVENT) for `warn`, else INFO (NET); nothing when unchanged. A
  // fatal or closed link stays so (only FATAL -> CLOSED). Under `mu`.
  void setState(LinkState to, const std::string& why, bool warn = false);
  // The link gives up with `msg` (the error NCCL gets): FATAL, journaled once. peerGone: the
  // peer process exited or closed the comm (pending requests fail, posting more succeeds).
  void enterFatal(const std::string& msg, bool peerGone = false);
  // Called once by enterFatal when the link turns fatal. Under `mu`.
  virtual void onFatal() {}
  // The peer closed the comm (`cause`): sets closedCause (the first cause stays) and enters
  // PEER_CLOSED unless the link is fatal or closed already.
  void notePeerClosed(const std::string& cause);

 protected:
  virtual const char* dir() const = 0;  // "send" or "recv", for logs and the journal

 private:
  LinkState state_ = LinkState::kConnecting;
};

// A ring of kChunks x kChunk slots indexed by a sequence number, allocated one chunk at a time
// on first use (most comms never have more than kChunk requests in flight, and memory per comm
// matters at thousands of comms). Slots never move: pointers to them may be handed to NCCL.
template <typename T, int kChunk, int kChunks>
class ChunkedRing {
 public:
  static constexpr uint64_t kSize = (uint64_t)kChunk * kChunks;
  T& at(uint64_t seq) {
    uint64_t i = seq % kSize;
    auto& c = chunks_[i / kChunk];
    if (!c) c.reset(new T[kChunk]);
    return c[i % kChunk];
  }

 private:
  std::unique_ptr<T[]> chunks_[kChunks];
};

// Requests handed to NCCL. `kind` comes first in both so test() can tell them apart.
enum : uint32_t { kKindSend = 0x53454e44, kKindRecv = 0x52454356 };

struct SendReq {
  uint32_t kind = kKindSend;
  uint64_t seq = 0;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  int32_t tag = 0;  // carried in every DATA frame; picks the buffer of a grouped receive
  void* mhandle = nullptr;  // NCCL's registration of `data` (Transport::regMr), for RDMA keys
  bool done = false;
  bool released = true;  // NCCL saw it done (test), so the slot may be reused
  Link* link = nullptr;
};

class SendLink : public Link {
 public:
  ~SendLink() override { unlist(); }
  bool sweep() override;
  uint64_t createdUs = 0;
  // Creates paths to every address in the handle allowed by the standby policy; starts connects.
  // trafficClass: the comm's, from NCCL (-1 = none given; see PathIdentity::trafficClass).
  static SendLink* create(const LinkDeps& deps, int dev, const PeerHandle& h, std::string* err,
                          int trafficClass = -1);
  // One connect() step (NCCL's service thread): 1 = hand the comm to NCCL (a path has all its
  // streams connected and HELLOs written, i.e. no later than the receiver's accept can return;
  // data posted before a path is active waits for it), 0 = call again, -1 = error with the
  // cause in *why (the receiver closed the comm, or the link is fatal).
  int connectStep(std::string* why);
  uint64_t connId = 0;  // this connection's id in the HELLO (several connects per listen handle)
  int trafficClass = -1;  // the comm's traffic class from NCCL, -1 = none (PathIdentity)
  // mhandle: the registration NCCL passes with the buffer (Transport::regMr; nullptr: none).
  // With tag matching (matchTags(): maxRecvs > 1 on a transport that tells the sender what the
  // receiver posted) a send is taken only into the receive the next message belongs to, and
  // only when that receive has a buffer with `tag` that the messages already placed in it left
  // free; otherwise *request is NULL (NCCL's "try again later", as NCCL's IB transport answers).
  // Without it sends go in isend order (NCCL's socket transport; maxRecvs 1).
  ncclResult_t isend(const void* data, uint64_t size, int tag, void** request, void* mhandle = nullptr);
  size_t forgetRegistration(void* mhandle) override;
  ncclResult_t test(SendReq* r, int* done, int* size);
  void close();
  bool matchTags() const { return matchTags_; }

 private:
  // Whether a send with `tag` may become message nextSeq_ now: the active path was told the
  // receive it falls in (SendPath::postedReceive) and that receive has a buffer with `tag`
  // left free by the messages already placed in it. Caller holds mu.
  bool fitsPostedReceive(int32_t tag);
  bool matchTags_ = false;  // set at create(); see isend
  // fromSweeper: the sweeper, not NCCL, is calling (does not count as the caller's return).
  void progress(bool fromSweeper = false);
  // The idle pass: reconnects failed paths (and completes a RESUME or a due failback) of a
  // comm NCCL has not called for tuning::kIdleSweepMs, as its next call would (link.cc).
  void idleSweep(uint64_t now) override;
  // The failover policy, every tuning::kSlowTickUs and at every health change: the decisions
  // below, in order, acting through the mechanism functions after them.
  void slowTick(uint64_t now);
  // ---- policy ----
  struct PairView {  // what health says of a path's NIC and NIC pair
    bool nicUp = true, pairUp = true, hard = false;
    std::string cause;  // why it is down ("" when up)
  };
  PairView pairView(const Path& p) const;
  // Slow vs stalled: whether the active path paths[i], its pair down, fails now (may add to *cause).
  bool activePathFails(size_t i, const PairView& v, uint64_t now, std::string* cause) const;
  // The flow-stall rule (RAILOVER_FLOW_STALL_MS, transports whose ACK silence is proof:
  // SendPath::ackSilenceIsFault): whether the active path paths[i], whatever its probes say,
  // has had data pending with no progress and no transport acknowledgement for that long
  // while another path is usable. Judged right after the path's progress (its completions
  // just read), so a late caller is never read as a silent network. Sets *cause.
  // *sinceUs: when the silence began (for the flap test).
  bool flowStalled(size_t i, uint64_t now, std::string* cause, uint64_t* sinceUs) const;
  bool repairedSinceSeen(Path& p, const PairView& v);  // a NIC/pair repair this path has not acted on
  void decayHoldDown(Path& p, uint64_t now);            // flap damping: shrink a grown hold-down
  int pickStandby() const;                              // which path to resume on (-1: none)
  bool failbackDue(uint64_t now) const;                 // the primary's hold-down has passed
  void judgeNoPath(uint64_t now);                       // no usable path: fatal verdicts
  void stallWatch(uint64_t now);                        // stalled progress -> probe burst
  std::string switchReason(int next) const;             // why traffic moves to paths[next] now
  // ---- mechanism ----
  void restartAfterRepair(Path& p, uint64_t now);
  void advancePath(Path& p, uint64_t now);  // connect steps, back-off retries, standby CLOSE watch
  void advanceConnect(Path& p, uint64_t now);
  void startConnect(Path& p, uint64_t now, const std::string& why);
  // faultSinceUs: when the evidence of the fault began, where the verdict needed a silence of its
  // own first (the flow-stall rule: the silence's start); 0 = now. The flap test measures from
  // it, so a path whose verdict takes longer than its hold-down still counts as a flap.
  void failPath(Path& p, const std::string& why, uint64_t now, uint64_t faultSinceUs = 0);
  // Makes paths[idx] active (fencing the old active path) and sends RESUME: RESUMING, or
  // FAILING_BACK when `planned`. `why` is the reason logged and journaled.
  void activate(int idx, uint64_t now, bool planned, const std::string& why);
  // RESUME_ACK(seq) on the active path: completes what the receiver holds, counts and journals
  // the switch (failover, recover, failback), RUNNING, and resends from seq.
  void onResumeAck(Path& p, uint64_t seq, uint64_t now);
  void enqueueFrom(uint64_t seq);
  void enqueueMsg(const SendReq& r);
  bool readControl(Path& p, uint64_t now, std::string* err);
  void complete(uint64_t upTo);
  // Reads what the receiver sent on a path that carries no control traffic for us (a standby
  // or connecting path, or streams 1.. of the active one): only CLOSE or NACK may come there.
  // Returns false with *err on a stream error or protocol error; a CLOSE or an unknown-comm
  // NACK marks the peer closed (notePeerClosed, see onPeerClosed) and returns true.
  bool pollPeerClose(Path& p, uint64_t now, std::string* err);
  // The receiver closed the comm: every path is closed quietly (no path_down, no reconnect).
  void onPeerClosed(const std::string& cause);
  void drainClosing(uint64_t now);
  uint64_t closingSinceUs_ = 0;  // when the receiver's close was first seen
  // test()/isend() verdicts on a comm whose peer closed it or exited; returns true (with the
  // error in *res) when the request can never complete.
  bool closedVerdict(ncclResult_t* res);
  const char* dir() const override { return "send"; }
  int dev() const override { return dev_; }
  bool resuming() const { return state() == LinkState::kResuming || state() == LinkState::kFailingBack; }

  int dev_ = 0;
  ChunkedRing<SendReq, 64, kSendRing / 64> ring_;
  uint64_t nextSeq_ = 0;
  uint64_t acked_ = 0;          // every seq < acked_ is acknowledged
  // Tag matching: the last isend was answered NULL (its receive not told yet) and none has
  // been accepted since; a send NCCL still has to place.
  bool deferred_ = false;
  // Work the receiver still owes this comm: unacknowledged messages or a send waiting to be
  // placed. The no-path verdicts (peer gone, RAILOVER_FATAL_TIMEOUT) apply only then.
  bool pendingSends() const { return acked_ < nextSeq_ || deferred_; }
  uint64_t resumeSentUs_ = 0;
  uint64_t resumeFromSeq_ = 0;
  uint64_t faultUs_ = 0;        // when the current outage was detected (for convergence time)
  int failedFrom_ = -1;         // path that failed at faultUs_ (resuming on it again is a recovery)
  uint64_t lastProgressUs_ = 0;
  uint64_t lastCallUs_ = 0;     // the caller's last progress() (a long gap is not a network stall)
  uint64_t idleStandbyLookUs_ = 0;  // the idle pass's last drive of this comm (idleSweep)
  bool burstRequested_ = false;
  uint64_t ackCheckUs_ = 0;     // last look at the active path's TCP acknowledgements (stall watch)
  bool ackSeen_ = false;        // ...and whether the peer's TCP had acknowledged data then
};

// One buffer of a (grouped) receive.
struct RecvBuf {
  uint8_t* data = nullptr;
  uint64_t cap = 0;
  int32_t tag = 0;
  void* mhandle = nullptr;  // NCCL's registration of `data` (Transport::regMr)
  bool matched = false;  // a message was assigned to it
  uint64_t size = 0;     // bytes received (valid once its message is complete)
  int nic = -1;          // local NIC of the path that completed its message (iflush reads through it)
};
constexpr int kMaxFlushNics = 64;  // NICs iflush can name in one mask (RecvLink::flushNics)

// A receive request: n buffers (n > 1: a grouped receive) filled by the next n messages of
// the comm, in order; within the group a message goes to a free buffer with its tag (n == 1:
// the one buffer, whatever the tag, as NCCL's socket transport). Done when all n are.
struct RecvReq {
  uint32_t kind = kKindRecv;
  uint64_t firstSeq = 0;  // seq of the group's first message
  int n = 1;
  int ndone = 0;
  bool done = false;
  bool error = false;
  ncclResult_t errorCode = ncclSuccess;
  bool released = true;  // NCCL saw it done (test), so the slot may be reused
  Link* link = nullptr;
  RecvBuf one;                       // n == 1
  std::unique_ptr<RecvBuf[]> group;  // n > 1: kMaxRecvs buffers, allocated at the slot's first grouped use
  RecvBuf* bufs() { return n == 1 ? &one : group.get(); }
  const RecvBuf* bufs() const { return n == 1 ? &one : group.get(); }
};

// The byte ranges of one message received so far, for accounting that is idempotent per
// chunk: a chunk (or part of one) seen twice never counts twice. Sorted, disjoint ranges
// [lo, hi), at most kMax of them; the first always starts at 0 (initially [0, 0)), so a chunk
// that extends what is received from the start never needs a new range. A chunk that would
// need more than kMax ranges waits (RecvSink::kHold) until the gaps before it fill; the chunk
// at the start of the lowest gap always fits, so receiving always makes progress. A message
// has at most max(streams, size / 1 MiB) chunks, so with kMax = 8 only messages over ~16 MiB
// whose streams drift apart by 8 chunks ever wait. No heap allocation.
struct RecvRanges {
  static constexpr int kMax = 8;
  uint64_t lo[kMax], hi[kMax];
  uint8_t n = 1;
  uint8_t inflight = 0;  // chunks placed whose bytes are still arriving (each may add a range)
  RecvRanges() { lo[0] = hi[0] = 0; }
  void reset() { n = 1, lo[0] = hi[0] = 0, inflight = 0; }
  // True when [a, b) is already received (a duplicate).
  bool covers(uint64_t a, uint64_t b) const;
  // Whether [a, b) may be placed now without ever needing more than kMax ranges.
  bool admits(uint64_t a, uint64_t b) const;
  // Records [a, b) as received; returns the bytes it newly covers (0 for a duplicate).
  uint64_t add(uint64_t a, uint64_t b);
};

// The receiver's view of one message seq: which request (and buffer) it fills.
struct MsgSlot {
  uint64_t seq = UINT64_MAX;
  RecvReq* req = nullptr;
  int idx = -1;                 // buffer of req, chosen by tag at the message's first chunk
  uint64_t total = UINT64_MAX;  // known from the first chunk
  uint64_t got = 0;             // distinct bytes received (ranges' total)
  bool done = false;
  RecvRanges ranges;
};

class RecvLink : public Link, public RecvSink {
 public:
  // Created by LinkRegistry::route() for the first stream of a new connection to a listen
  // comm (or directly by tests and fuzzers).
  RecvLink(const LinkDeps& deps, uint64_t secret, uint64_t connId, int dev);
  uint64_t connId = 0;
  ~RecvLink() override { unlist(); }
  bool sweep() override;
  // Called by the acceptor thread with a validated stream: takes `c` (leaving it empty) and
  // returns true, or, once the link has ended (stopTakingPaths), leaves it with the caller and
  // returns false (the transport then refuses it with NACK(kNackReasonUnknownComm), as for a
  // closed comm).
  bool offerStream(std::unique_ptr<Conn>& c, const StreamHello& h, const sockaddr_storage& peer, int localNic);
  bool ready();  // true once the first path has all its streams
  // n buffers (1..kMaxRecvs) with their capacities (bytes) and tags; NULL *request = ring full.
  // mhandles: n registrations (Transport::regMr), or nullptr when the transport needs none.
  size_t forgetRegistration(void* mhandle) override;
  ncclResult_t irecv(int n, void** data, const uint64_t* caps, const int* tags, void** request,
                     void** mhandles = nullptr);
  // sizes: n ints (bytes received per buffer), filled when *done.
  ncclResult_t test(RecvReq* r, int* done, int* sizes);
  void close();
  int dev() const override { return dev_; }
  // RecvSink: the engine's answers to the active path's transport (under `mu`; public for the
  // engine tests, which deliver chunks directly as a transport would).
  int place(const ChunkRef& c, uint8_t** dst, std::string* err) override;
  void arrived(const ChunkRef& c, bool discarded) override;
  bool control(const CtlMsg& m, std::string* err) override;

 private:
  void progress();
  void idleSweep(uint64_t now) override;
  void takeIncoming(uint64_t now);
  // Takes no new path, and tells the sender on every connected path (CLOSE with
  // kCloseReasonFatal) unless the sender is gone or closed the comm itself: its pending sends
  // then fail at once with that cause, instead of waiting for a network verdict on rails that
  // work (a receiver that no longer reads looks like a stalled path) and, after
  // RAILOVER_FATAL_TIMEOUT, reporting "no usable path".
  void onFatal() override;
  // CLOSE with `reason` (kCloseReason*) on the active path first (its ACKs are flushed before
  // any CLOSE leaves on another path), then on every standby and connecting path (best effort:
  // a path whose queued control messages cannot all be written now gets none). close() sends
  // again, with the fatal reason on a fatal link: a CLOSE onFatal could not send goes then, and
  // a sender that read the first has closed those paths already. Under `mu`.
  void sendCloseOnPaths(uint64_t reason);
  // The link has ended (fatal, or NCCL deregistered a buffer of a receive in progress: the
  // comm is being torn down) and takes no new path: streams offered from now on are refused
  // (offerStream returns false: NACK, so the sender ends its comm at its attempt's first
  // poll), streams queued and not yet taken are closed, and so are paths still connecting,
  // with `why` (their senders fail the attempt and retry, into the NACK). Without it, a
  // sender's attempt on RDMA waited for an endpoint answer no poll would give, up to
  // tuning::kConnectOffNetworkMaxUs (30 s), and retried for as long as its comm lived.
  // Connected paths stay as they are (NCCL still gets this link's error on its calls). Once;
  // under `mu`.
  void stopTakingPaths(const std::string& why);
  // A connecting receive path: becomes a standby once its transport says it is up, fails when
  // its transport says it broke.
  void pollConnect(Path& p, uint64_t now);
  // The slow tick: the steps below, in order (takeIncoming; on a health change
  // failPathsDownByHealth; advancePath for each path; checkPeerGone; judgeNoPath), then a
  // snapshot for the state file.
  void slowTick(uint64_t now);
  bool healthChangedSinceSeen();           // the health epoch moved since the last look (notes it)
  void failPathsDownByHealth(uint64_t now);  // bilateral detection: close paths health says are down
  // The receiver's side of the flow-stall rule (SendLink::flowStalled): its control messages on
  // the active path paths[idx] got no acknowledgement from the sender's transport for
  // RAILOVER_FLOW_STALL_MS while a standby's pair answers. Judged right after the path's
  // progress call. Sets *cause.
  bool flowStalled(int idx, uint64_t now, std::string* cause) const;
  void advancePath(int idx, uint64_t now);   // connect steps; a standby's RESUME (or its error)
  void judgeNoPath(uint64_t now);            // no active path for RAILOVER_FATAL_TIMEOUT: fatal
  bool readControl(Path& p, int idx, uint64_t now, std::string* err);
  // A RESUME on standby path `idx`: fences every other path that carried data (without
  // blocking: RecvPath::fenceAsync), forgets partial progress, and answers RESUME_ACK, or, while
  // a fence still runs, remembers the resume (resumeWait_) for finishResume.
  void onResume(int idx, uint64_t fromSeq, uint64_t now);
  // Completes the remembered resume once no fence is pending: path active, RESUME_ACK, the
  // advertisements. Drops it if its path failed meanwhile. Called from readControl.
  void finishResume(uint64_t now);
  // Tells path `p` (active) every posted, incomplete receive from seq `from` on: its messages
  // not complete yet and its buffers not taken (RecvPath::advertise; a no-op for stream
  // transports).
  void advertiseFrom(Path& p, uint64_t from);
  // fault: a WARN when a usable path fails (not for a fence by RESUME on another path, nor when
  // the sender closed or reset it: the sender reports its own faults).
  void failPath(Path& p, const std::string& why, uint64_t now, bool fault = true);
  // Peer-gone verdict: with receives pending and every path closed or reset by the sender,
  // checks whether the sender process still exists by connecting to its listener on each
  // path's NIC pair (refused on every one: the process exited; accepted: it is alive and will
  // reconnect, e.g. after fencing its paths under congestion). Never judged from the closes
  // alone.
  void checkPeerGone(uint64_t now);
  uint64_t liveNextUs_ = 0;

  int dev_ = 0;
  std::mutex inMu_;
  struct Incoming {
    std::unique_ptr<Conn> conn;
    StreamHello hello;
    sockaddr_storage peer;
    int localNic;
    uint64_t arrivedUs;  // when offerStream() got it (the acceptor's thread)
  };
  std::vector<Incoming> incoming_;
  bool refusing_ = false;       // under inMu_: set by stopTakingPaths, never cleared
  RecvReq ring_[kRing];         // requests, by request number
  uint64_t reqPost_ = 0;        // requests posted
  uint64_t reqComplete_ = 0;    // every request below this one is complete
  ChunkedRing<MsgSlot, kRing, kMsgRing / kRing> msgs_;  // messages, by seq
  uint64_t nextPost_ = 0;       // message seqs below this one have a posted buffer
  uint64_t nextComplete_ = 0;   // every seq < nextComplete_ is complete
  std::string usageMsg_;        // the caller's error (truncation, tag mismatch)
 public:
  // The NICs iflush must read through (bit i: NIC i) for buffer `data`: those whose paths
  // completed the messages of the receive test() last reported done, when `data` is one of its
  // buffers with bytes (NCCL flushes right after that test); else the active path's NIC, or
  // the comm's device when none is active. A grouped receive that failed over midway was
  // written by two HCAs, and a failback or failover between the arrival and the flush must not
  // move the READ to another HCA: a READ through one HCA orders only its own writes to GPU
  // memory. Caller holds mu.
  uint64_t flushNics(const void* data) const;

 private:
  const RecvReq* flushReq_ = nullptr;  // see flushNics(): the receive test() last reported done
  uint64_t flushMask_ = 0;
  uint64_t ackSent_ = 0;
  uint64_t lastCallUs_ = 0;  // NCCL's last irecv/test on this comm, µs (the idle pass starts after it)
  const char* dir() const override { return "recv"; }
  // accept() found a path ready and handed the link to NCCL (a fact of the NCCL handshake, not
  // a link state: a link may become fatal or peer-closed before or after it).
  bool everReady_ = false;
  // Fences of receive paths still running in their transport (RecvPath::fenceAsync): no
  // RESUME is answered before all are done, so no write of an older path lands after it.
  std::vector<std::shared_ptr<FenceWait>> fences_;
  struct ResumeWait {
    int idx = -1;            // the standby that carried the RESUME; -1 = none waiting
    uint32_t generation = 0; // its generation then (a reconnected path never sent this RESUME)
    uint64_t fromSeq = 0;
    uint64_t sinceUs = 0;    // when the RESUME arrived
    bool switched = false;   // a failover (counted, journaled), not the first activation
    // Of the fences that ended after the RESUME arrived, the one that ended last (it held the
    // answer back): its FenceWait times, µs (0 = none).
    // fenceGrantEndUs: when that fence stopped waiting for a running grant (FenceWait::grantEndUs).
    uint64_t fenceQueuedUs = 0, fenceStartUs = 0, fenceEndUs = 0, fenceGrantEndUs = 0;
  };
  ResumeWait resumeWait_;
};

// Returns a link's fatal error to NCCL: logs `msg` (a WARN) and returns ncclSystemError; with
// RAILOVER_ABORT_ON_FATAL=1 it writes `msg` as one stderr line and exits the process instead
// (status kAbortOnFatalExitCode). Thread-safe.
ncclResult_t fatalResult(const std::string& msg, bool abortOnFatal);

// A listen comm: accepts any number of connections to its handle (as NCCL's socket and IB
// transports do). The registry's router (LinkRegistry::route, on the acceptor thread) creates
// a RecvLink for each new connection id seen with the handle's secret; accept() hands them
// out, oldest ready first. closeListen (close()) stops new connections; links already accepted
// live on (their failed paths keep reconnecting through the process's listeners), links never
// accepted are closed. deps.registry must be set: the listen comm is registered there by its
// secret (the registry must outlive it).
// Thread-safety: accept()/close() from NCCL's service thread; the router from the acceptor.
class Listener {
 public:
  Listener(const LinkDeps& deps, uint64_t secret, int dev);  // registers the secret
  RecvLink* accept();                  // nullptr = no connection ready yet
  void close();                        // unregisters; closes the links never accepted
  const uint64_t secret;
  const int dev;

 private:
  friend class LinkRegistry;
  const LinkDeps deps_;  // handed to the links it creates
  LinkRegistry& reg_;    // deps_.registry
  bool open_ = true;
  std::vector<RecvLink*> fresh_;  // created, not accepted yet (oldest first); under the registry's routing lock
  std::vector<uint64_t> seen_;    // every connection id ever created here (a closed one is not re-created)
};

}  // namespace railover
