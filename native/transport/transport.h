// The transport interfaces the failover engine runs on.
//
// Two layers:
//  * The path layer (SendPath, RecvPath): what the engine sees. A path moves *chunks* of
//    numbered messages and a small set of *control messages* (CtlMsg) between one local NIC
//    and one remote NIC. How a path carries them (TCP: N byte streams with 32-byte frames,
//    docs/PROTOCOL.md; RDMA verbs: queue pairs and writes into advertised buffers) is the
//    transport's business. The engine never sees bytes on a stream.
//  * The byte-stream layer (Conn, Transport::connect): what a stream-based path (TCP, or the
//    in-memory pipes of the unit tests and fuzz targets) is built from.
//
// Units: seq = message sequence number of the comm (0, 1, ...); offset, len, total in bytes.
// Errors: every call that can fail returns -1 / false with a one-line cause in *err (the
// engine logs and journals it verbatim), e.g. "connection reset by peer".
// Thread-safety: a path object is used by one thread at a time (its link's mutex holder).
// Every call is non-blocking.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>

#include <memory>
#include <string>

namespace railover {

class Conn;

// One chunk of message `seq`: bytes [offset, offset + len) of a message of `total` bytes,
// sent with the isend's `tag` (picks the buffer of a grouped receive). A zero-byte message
// is one chunk with len = total = 0.
struct ChunkRef {
  uint64_t seq = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
  uint64_t total = 0;
  int32_t tag = 0;
  // The registration of the message's source buffer: what Transport::regMr returned for the
  // buffer NCCL passed to isend (nullptr when the caller registered nothing; a transport that
  // needs a key, RDMA, then fails the path with that cause).
  void* mhandle = nullptr;
};

// One receive buffer told to the sender (RecvPath::advertise): `size` bytes at `buf` for a
// message with `tag`, registered as `mhandle` (Transport::regMr).
struct AdvertEntry {
  int32_t tag = 0;
  void* buf = nullptr;
  uint64_t size = 0;
  void* mhandle = nullptr;
};

// Most buffers of one receive (an irecv of n buffers), as NCCL's IB transport
// (NCCL_NET_IB_MAX_RECVS = 8); the plugin's maxRecvs is at most this.
constexpr int kMaxReceiveBuffers = 8;

// What a send path was told of the receive the receiver posted for a message
// (SendPath::postedReceive): messages firstSeq .. firstSeq + n - 1 go into n buffers whose tags
// are tags[0..n), in the receiver's buffer order. After a RESUME it is what is left of the
// receive (RecvPath::advertise): its messages not complete yet and the buffers none took.
struct PostedReceive {
  uint64_t firstSeq = 0;
  int n = 0;              // 1..kMaxReceiveBuffers
  bool grouped = false;   // an irecv of several buffers (or what is left of one)
  int32_t tags[kMaxReceiveBuffers] = {};
};

// Engine-level control messages (TCP encodes each as one 32-byte frame, docs/PROTOCOL.md).
//   kAck        receiver -> sender: every message with seq < `seq` is complete
//   kResume     sender -> receiver on a newly activated path: first unacknowledged seq;
//               `arg` = the path's generation
//   kResumeAck  receiver -> sender: next seq the receiver expects
//   kNack       receiver -> sender: refused; `seq` = reason code (wire::kNackUnknownComm = 1:
//               the receiver does not know the comm)
//   kClose      either way: the comm is being closed in order (not a fault)
//   kOther      anything else the peer sent where a control message was expected (a
//               protocol error; `arg` = the transport's raw type code, for the message)
enum class CtlType : uint8_t { kAck, kResume, kResumeAck, kNack, kClose, kOther };
struct CtlMsg {
  CtlType type = CtlType::kOther;
  uint64_t seq = 0;
  uint64_t arg = 0;
};
constexpr uint64_t kNackReasonUnknownComm = 1;  // same value as wire::kNackUnknownComm
// A receiver's CLOSE carries why in its seq (docs/PROTOCOL.md, "Close"): 0 NCCL closed the
// recv comm; 1 the recv comm ended in a fatal error (its rank's log names the cause), so the
// sender's pending sends fail at once with that cause instead of waiting for a network
// verdict. A sender takes any other value as 0 (a newer peer's reason).
constexpr uint64_t kCloseReasonClosed = 0;
constexpr uint64_t kCloseReasonFatal = 1;

// Who a path belongs to; a stream transport sends it in each stream's HELLO, so the
// receiver can route the stream to its comm and path.
struct PathIdentity {
  uint64_t secret = 0;      // the listen comm's secret (from the handle)
  uint64_t connId = 0;      // the send comm's connection id (random, never 0)
  uint8_t pathIndex = 0;    // receiver address index (in the handle) this path targets
  uint8_t srcRail = 0;      // sender NIC's rail
  uint16_t probePort = 0;   // sender NIC's listener/probe port
  uint32_t generation = 0;  // increments every time the sender re-opens this path
  // The comm's traffic class from NCCL (ncclNetCommConfig_t.trafficClass: v10 connect, v11+
  // init; -1 = none given). Not in the TCP HELLO: the RDMA transport resolves it with
  // NCCL_IB_TC/NCCL_IB_SL (verbs::rcParamsFor) for the path's QPs and tells the receiver.
  int trafficClass = -1;
};

// What a stream of a path says about itself when it reaches the receiver (TCP: its HELLO).
struct StreamHello {
  PathIdentity id;
  uint8_t stream = 0;    // index of the stream within its path
  uint8_t nStreams = 1;  // streams in the path
};

// Most addresses a handle carries, hence most paths per link (TCP: wire::kMaxHandleAddrs).
constexpr int kMaxPeerAddrs = 5;

// The listen handle NCCL's bootstrap carries to every peer is 128 bytes. The transport owns
// bytes [0, kTransportHandleBytes): its listeners' addresses and ports, the listen comm's
// secret, and its own name (Transport::encodeHandle / decodeHandle; TCP's layout, which the
// RDMA transport shares, is in transport/tcp/wire.h and docs/PROTOCOL.md). The plugin API keeps
// the rest for itself (the connect-in-progress link between connect() calls).
constexpr size_t kTransportHandleBytes = 120;

// What a listen handle says (Transport::encodeHandle writes it, decodeHandle reads a peer's).
struct PeerHandle {
  struct Addr {
    int rail = -1;
    sockaddr_storage addr{};
    socklen_t len = 0;
  };
  uint64_t secret = 0;
  std::string transport = "tcp";  // the receiver's transport (Transport::name())
  int primary = 0;           // index into addrs: the receiver's NIC NCCL chose
  int naddr = 0;             // <= kMaxPeerAddrs
  Addr addrs[kMaxPeerAddrs];
};

// How a path cuts messages into chunks (bytes); from RAILOVER_MIN_CHUNK / RAILOVER_MAX_CHUNK.
struct ChunkPolicy {
  uint64_t minChunkBytes = 0;
  uint64_t maxChunkBytes = 0;
};

// The send side of one path (sender -> receiver).
//
// Completion model: with completionNeedsReceiverAck() (TCP), a chunk handed to the transport
// is not delivered until the receiver's ACK says so; the engine completes a send only on the
// receiver's cumulative ACK (or RESUME_ACK). Either way a send completes only when the
// receiver holds the whole message.
class SendPath {
 public:
  virtual ~SendPath() = default;
  // Connect progress: 1 = ready (every stream/QP connected, identity told to the receiver),
  // 0 = in progress, -1 = failed with the cause in *err.
  virtual int connectState(std::string* err) = 0;
  // Size (bytes) of the chunks a message of `size` bytes is cut into on this path (the last
  // chunk may be shorter). Never 0 for size > 0.
  virtual uint64_t chunkBytes(uint64_t size) const = 0;
  // Queues chunk `c`, whose bytes are at `src` (valid until the send completes). The
  // transport stripes chunks over its streams / QPs. No copy of the payload is made.
  virtual void post(const ChunkRef& c, const void* src) = 0;
  // Queues a control message (sent before any chunk not yet started on the control channel).
  virtual void sendCtl(const CtlMsg& m) = 0;
  // Drives I/O: 1 = some bytes moved, 0 = nothing could move now, -1 = the path is broken
  // (cause in *err). Never blocks.
  virtual int progress(std::string* err) = 0;
  // Next control message from the receiver on the control channel: 1 = *m filled, 0 = none
  // yet, -1 = broken or undecodable (cause in *err).
  virtual int recvCtl(CtlMsg* m, std::string* err) = 0;
  // Reads the receiver's notices (CLOSE, NACK) that may arrive anywhere on the path except
  // the control channel (and on the control channel too when `withCtl`, for a path that
  // carries no control traffic: a standby). 1 = *m filled, 0 = none, -1 = broken. Cheap
  // enough for the slow tick; not called on the hot path.
  virtual int recvNotice(bool withCtl, CtlMsg* m, std::string* err) = 0;
  // Best effort, never blocks: tells the receiver the comm is closing in order (kClose on
  // every stream that is at a message boundary, after the control messages still queued).
  virtual void sendClose() = 0;
  // After it returns nothing sent on this path can land in a receive buffer any more (TCP:
  // the sockets are closed). The path is unusable afterwards.
  virtual void fence() = 0;
  // Transport progress signals (TCP: TCP_INFO of the streams). peerAckedWithinMs: data is
  // outstanding and the peer's transport acknowledged some of it in the last `ms` ms (slow,
  // not dead); false when nothing is outstanding or unknown. Costs a syscall per stream:
  // only for a path already suspect. unackedSilenceMs: ms since the peer's transport last
  // acknowledged anything while data is outstanding (0 = nothing outstanding or unknown).
  virtual bool peerAckedWithinMs(uint32_t ms) = 0;
  virtual uint32_t unackedSilenceMs() = 0;
  // Whether a silence of this path's own transport acknowledgements (unackedSilenceMs) with
  // data in flight proves the data flow is cut even while the rail's probes answer: the engine
  // then fails the active path over after RAILOVER_FLOW_STALL_MS (SendLink::flowStalled).
  // RDMA RC: true; the peer's HCA acknowledges every packet whatever its process does, and a
  // lost packet is resent only after the local ACK timeout (NCCL_IB_TIMEOUT: 4.3 s per try at
  // NCCL's default 20), so a flow that only the data misses (an ECMP route hashed from the QP's
  // UDP source port, a stuck traffic class, a filter on UDP port 4791) is otherwise seen only
  // after the RC retries, ~30 s. TCP: false (default); its retransmission back-off (200 ms,
  // 400 ms, ...) makes silences of seconds normal on a lossy but working rail.
  virtual bool ackSilenceIsFault() const { return false; }
  // While connecting (connectState() 0): true when the network has done its part so far and
  // what is left is a process's work: the peer's answer, with every byte this side sent for
  // it acknowledged by the peer's kernel (Conn::sentAllAcked; a receiver thread late on a busy
  // host, a stopped process), or this side's own background work (RDMA: the worker creating or
  // bringing up the path's QPs, queued behind other comms' bring-ups). Not a fault of the
  // path: the engine does not count such waiting towards the connect timeout
  // (tuning::kConnectTimeoutUs), only towards tuning::kConnectOffNetworkMaxUs. False (default)
  // where the connect waits for nothing but the network (TCP: the peer's acceptor thread takes
  // the HELLO) or it cannot tell. Called on every poll of a connecting path: cheap.
  virtual bool connectWaitsOffNetwork() { return false; }
  // While connecting, right after connectWaitsOffNetwork() said true at this poll: true when
  // what is left is the peer's answer (its kernel acknowledged the request), not this side's own
  // work (RDMA: the worker creating or bringing up the QPs). Only such an attempt can lose its
  // answer to a fault of the rail after the acknowledgement (SendLink::slowTick). Default false.
  virtual bool connectWaitsForPeer() { return false; }
  // True when delivery is proven only by the receiver's ACK (TCP). A transport that can prove
  // delivery otherwise (an RDMA write completion with a receiver-side placement guarantee)
  // may return false; the engine still requires the receiver to hold the whole message.
  virtual bool completionNeedsReceiverAck() const { return true; }
  // The health layer saw this path's NIC or NIC pair come back after an outage (SendLink's
  // repair step; called under the link's mutex, on NCCL's thread or the sweeper). Best effort,
  // never blocks: provokes an answer from the receiver's end of an established path, so that
  // a path the receiver dropped during the outage is seen gone within a round trip of the
  // repair, from recvNotice/progress, not only when the receiver's kernel resends its FIN
  // (exponential back-off: minutes after a long outage) or never (an orphaned socket is
  // reaped after net.ipv4.tcp_orphan_retries). Needed where the sender may have nothing to
  // write on its own (RDMA: it waits for the receiver's advertisements, which a dropped path
  // never sends). Default: nothing (TCP: its streams' keepalive, RAILOVER_TCP_KEEPALIVE_S, finds a
  // stream the receiver dropped whenever it was dropped, not only at a repair).
  virtual void nudge() {}
  // The receive the receiver posted for message `seq`, as far as this path was told it: true
  // with *out filled (out->firstSeq <= seq < out->firstSeq + out->n), false when it is not
  // known (not told yet, or a transport that tells the sender nothing: TCP). Cheap (no I/O;
  // what progress() took in). Answered by transports whose tellsPostedReceives() is true; the
  // engine then places each send in a receive as NCCL's IB transport does (SendLink::isend).
  virtual bool postedReceive(uint64_t seq, PostedReceive* out) const {
    (void)seq, (void)out;
    return false;
  }
};

// What the engine tells a receive path about each chunk (implemented by the engine).
class RecvSink {
 public:
  enum Placement { kHold = 0, kWrite = 1, kDiscard = 2 };
  virtual ~RecvSink() = default;
  // Asked once per chunk before any of its bytes are taken: kWrite = put its c.len bytes at
  // *dst; kDiscard = take them and drop them (a duplicate: a chunk of a completed message or
  // bytes already received); kHold = not now (leave it, and what follows it on the same
  // stream / queue, where it is: its receive is not posted yet, or failed); -1 = protocol
  // error (cause in *err): the path is broken.
  virtual int place(const ChunkRef& c, uint8_t** dst, std::string* err) = 0;
  // Every byte of chunk `c` is at the destination place() gave (or was dropped: `discarded`).
  virtual void arrived(const ChunkRef& c, bool discarded) = 0;
  // A control message where chunks were expected (TCP: a CLOSE on a data stream). Returns
  // false with *err to break the path.
  virtual bool control(const CtlMsg& m, std::string* err) = 0;
};

// A receive path's fence still running off the caller's thread (RecvPath::fenceAsync).
// `done` turns true (release store) once nothing sent on the fenced path can land in a
// receive buffer. Shared by the transport's fence job and the engine; thread-safe.
// The times (nowUs(), µs; 0 = not known) say where a slow fence spent its time; the job sets
// startUs and endUs before its release store of `done`, so a reader that saw `done` sees them.
struct FenceWait {
  std::atomic<bool> done{false};
  uint64_t queuedUs = 0;               // fenceAsync() handed the fence to its thread (set before sharing)
  std::atomic<uint64_t> startUs{0};    // a fence thread began it
  std::atomic<uint64_t> endUs{0};      // it finished (QP in ERR and drained, or given up)
  // Set only when the fence, once begun, first waited for a grant of remote write to the
  // path's QPs that was already running (RDMA, WriteGrant): when that wait ended. The fence
  // itself then ran from here to endUs. 0: it waited for no grant.
  std::atomic<uint64_t> grantEndUs{0};
  // Non-empty when the fence could not stop the old path (its QP refused both the move to ERR
  // and destruction): a write of it may still land after a RESUME is answered. Written before
  // `done` is set (read it after done reads true). The engine then fails the comm instead of
  // answering: an error to NCCL, never data overwritten behind its back.
  std::string unsafe;
};

// The receive side of one path (sender -> receiver).
//
// Duplicate safety, stated per transport: a chunk may arrive twice only across a RESUME (the
// sender resends every unacknowledged message whole on the new path). A transport that reads
// chunks itself (TCP) asks place() first and reads a duplicate into a scratch buffer, so it
// never touches the receive buffer; a transport whose NIC writes into the receive buffer
// directly (RDMA) cannot ask first, and relies on fence(): the engine fences every other path
// before it answers RESUME_ACK, so no write of an older path can land after the resent data.
// Either way the engine's accounting is idempotent per chunk (RecvLink's received ranges).
class RecvPath {
 public:
  virtual ~RecvPath() = default;
  // 1 = every stream / QP of the path is there (usable as a standby), 0 = not yet, -1 = broken.
  virtual int connectState(std::string* err) = 0;
  // Takes the chunks that have arrived (bounded work per call, so other paths get their turn)
  // and first writes queued control messages: 1 = something moved, 0 = nothing, -1 = broken
  // (cause in *err). Calls sink.place / arrived / control.
  virtual int progress(RecvSink& sink, std::string* err) = 0;
  // Queues a control message to the sender (ACK, RESUME_ACK, CLOSE) and flushCtl() writes
  // what is queued: 0 = written or queued for the next call, -1 = broken.
  virtual void sendCtl(const CtlMsg& m) = 0;
  virtual int flushCtl(std::string* err) = 0;
  // Next control message from the sender on a path that carries no data yet (a standby: a
  // RESUME or a CLOSE): 1 = *m filled, 0 = none, -1 = broken or undecodable.
  virtual int recvCtl(CtlMsg* m, std::string* err) = 0;
  // Best effort, never blocks: the queued control messages, then kClose with `reason`
  // (kCloseReason*, in its seq), on every stream.
  virtual void sendClose(uint64_t reason) = 0;
  // After it returns nothing sent on this path can land in a receive buffer (TCP: sockets
  // closed; RDMA: the QPs are in error and flushed). The path is unusable afterwards. May
  // block (RDMA: bounded by the drain timeout, and a QP's move to ERR was seen to take ~3 s
  // on rxe after a local link loss): the engine calls it only where that is acceptable (the
  // comm's close) and otherwise fenceAsync().
  virtual void fence() = 0;
  // Whether the last fence() first waited for a grant of remote write to the path's QPs that
  // was already running (RDMA: WriteGrant, an ibv_modify_qp on a fence thread; the fence waits
  // for it because the grant touches the QPs), and how long that wait held the caller, µs (a
  // part of fence()'s own time). {false, 0}: it waited for none, or no fence() ran (the
  // transports without grants). fenceAsync() reports its wait in FenceWait::grantEndUs instead.
  struct FenceGrantWait {
    bool waited = false;
    uint64_t us = 0;
  };
  virtual FenceGrantWait lastFenceGrantWait() const { return {}; }
  // The same fence without blocking the caller: the path stops at once (it moves and reads
  // nothing more, its calls fail) and the part that may block runs elsewhere. Returns nullptr
  // when the fence is already complete, else a wait whose `done` says when it is; the engine
  // answers no RESUME before every such wait is done. The path may be destroyed before that
  // (the transport keeps what the fence needs). Default: fence(), complete on return.
  virtual std::shared_ptr<FenceWait> fenceAsync() {
    fence();
    return nullptr;
  }
  // The receiver's side of the flow-stall rule (RecvLink::flowStalled): ms since the sender's
  // transport last acknowledged anything this end sent (control messages: ACK, RESUME_ACK;
  // RDMA: the advertisements too) while some is outstanding (0 = nothing outstanding, or
  // unknown), and whether that silence proves the flow toward the sender is cut even while the
  // rail's probes answer (as SendPath::ackSilenceIsFault: RDMA RC true, TCP false, default).
  virtual uint32_t unackedSilenceMs() { return 0; }
  virtual bool ackSilenceIsFault() const { return false; }
  // Stream transports: takes accepted stream `stream` (< the path's stream count) of the path,
  // replacing one already there. Returns false when the transport builds paths otherwise.
  virtual bool adopt(int stream, std::unique_ptr<Conn> c) { (void)stream, (void)c; return false; }
  // The engine posted a receive and this path is the active one: messages seq .. seq + n - 1
  // go into the n buffers `entries` (tag, address, size in bytes, registration). grouped
  // false (then n == 1): a single-buffer receive, any tag goes in. grouped true: (what is
  // left of) a grouped receive; each message goes into the first entry not yet used whose tag
  // is the message's tag, entries in the order given (the engine's own matching rule, so both
  // ends agree on the buffer). Called in seq order: for each new receive while the path is
  // active, and right after RESUME_ACK for every posted receive not complete yet, with only
  // its incomplete messages and the entries not yet holding one (a transport that needs
  // advertisements delivers each message whole, so an entry is taken exactly when its message
  // is complete). `entries` is valid during the call only. TCP: nothing to do. A transport
  // whose sender writes into the receiver's memory (RDMA) tells the sender where.
  virtual void advertise(uint64_t seq, const AdvertEntry* entries, int n, bool grouped) {
    (void)seq, (void)entries, (void)n, (void)grouped;
  }
};

// The byte-stream layer: one connection of a stream path.
class Conn {
 public:
  virtual ~Conn() = default;
  // Connect progress: 1 connected, 0 still in progress, -1 failed (reason in *err).
  virtual int connectState(std::string* err) = 0;
  // Writes from the iovecs: bytes written (0 = would block), or -1 on a connection error.
  virtual ssize_t writev(const iovec* iov, int n, std::string* err) = 0;
  // Reads up to len bytes: > 0 bytes read, 0 = nothing available, -1 = error or peer closed.
  virtual ssize_t read(void* buf, size_t len, std::string* err) = 0;
  // True when the peer closed or the connection broke (does not consume data).
  virtual bool dead(std::string* err) = 0;
  // Milliseconds since the peer's transport last acknowledged anything while data is
  // outstanding (0 when nothing is outstanding or unknown). Tells a dead network (nothing is
  // acknowledged) from a stopped peer process (its kernel still acknowledges).
  virtual uint32_t unackedSilenceMs() { return 0; }
  // True when data is outstanding and the peer's transport acknowledged some of it within the
  // last `ms` milliseconds: the path is slow (a saturated or rate-limited link), not dead.
  // False when nothing is outstanding or it is unknown. Costs a syscall: call it only when a
  // path is already suspect.
  virtual bool peerAckedWithinMs(uint32_t ms) { (void)ms; return false; }
  // True when the connection is established and the peer's transport has acknowledged every
  // byte written on it so far (TCP: the peer's kernel ACKed them, SIOCOUTQ is 0); false while
  // any is unacknowledged or unsent, or when it cannot tell. The peer's kernel acknowledges
  // without the peer's threads, so after a request this tells "the network delivered it, the
  // peer's process has not answered yet" from "the network did not deliver it". One or two
  // syscalls: for a connect that waits, not for the data path.
  virtual bool sentAllAcked() { return false; }
};

// Where a transport's acceptor hands every incoming stream whose first bytes identified it
// (TCP: a valid HELLO). Implemented by the engine, which routes the stream to its recv link
// (failover/registry.h, LinkRegistry::route); the transport never knows about comms.
// Thread-safety: called from the transport's acceptor thread only.
class StreamRouter {
 public:
  virtual ~StreamRouter() = default;
  // Takes `c` (leaving it empty) when a comm owns the stream `h` names and returns true.
  // Returns false and leaves `c` with the caller when no comm owns it (an unknown or closed
  // comm: the transport then refuses it with NACK(kNackReasonUnknownComm) and closes it), or
  // for a liveness check (h.id.connId == 0: closed without a word).
  virtual bool route(std::unique_ptr<Conn>& c, const StreamHello& h, const sockaddr_storage& peer, int localNic) = 0;
};

// A flush in progress (Transport::flush). test(): 1 done, 0 not yet, -1 failed with *err.
// Used by one thread at a time (NCCL's test() on the flush request).
class FlushOp {
 public:
  virtual ~FlushOp() = default;
  virtual int test(std::string* err) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Listens on local NIC `nic` at `addr` (its address; the port in it is ignored) on port
  // *port (0 = any: the chosen port is written back), and accepts incoming streams there for
  // the process's life: each stream's identity (TCP: its HELLO) is checked within
  // tuning::kHelloTimeoutUs, strays are dropped and logged, and every identified stream goes to
  // `router` (the same router on every call; it outlives the transport). A second call for the
  // same NIC (the NIC moved to a new address) replaces its listener. The handle advertises
  // these addresses and ports. False with *err when the listener cannot be opened (the
  // NIC's previous listener, if any, stays). Thread-safe. A transport without listeners (the
  // in-memory streams of the unit tests) refuses with a cause.
  virtual bool listen(int nic, const sockaddr_storage& addr, socklen_t len, uint16_t* port, StreamRouter* router,
                      std::string* err) {
    (void)nic, (void)addr, (void)len, (void)port, (void)router;
    *err = std::string("the ") + name() + " transport of this process does not accept connections";
    return false;
  }
  // Opens one stream from local NIC `nic` to `remote`. nullptr with *err when it cannot start.
  virtual std::unique_ptr<Conn> connect(int nic, const sockaddr_storage& remote, socklen_t len, std::string* err) = 0;
  // Opens the send side of a path of `nStreams` streams (or queue pairs) from local NIC `nic`
  // to `remote`. nullptr with *err when it cannot start.
  virtual std::unique_ptr<SendPath> openSendPath(int nic, const sockaddr_storage& remote, socklen_t len, int nStreams,
                                                 const PathIdentity& id, const ChunkPolicy& chunks, std::string* err) = 0;
  // The receive side of a path of `nStreams` streams, empty until the acceptor's streams are
  // adopted (RecvPath::adopt).
  virtual std::unique_ptr<RecvPath> newRecvPath(int nStreams) = 0;
  // The same, knowing the local NIC the path arrived on (a transport whose path lives on the
  // NIC's HCA needs it; a stream transport does not).
  virtual std::unique_ptr<RecvPath> newRecvPathOn(int localNic, int nStreams) {
    (void)localNic;
    return newRecvPath(nStreams);
  }
  // What regMr returns where the transport needs no registration (TCP copies through the
  // kernel): the registered range, a real object that deregMr frees.
  struct HostRegistration {
    void* data;
    size_t size;
  };
  // The device behind local NIC `nic` as errors name it, e.g. "rxe0 port 1" (RDMA: the HCA
  // port chosen for it); "" where the NIC is all there is (TCP). Thread-safe, never blocks.
  virtual std::string nicDevice(int nic) const {
    (void)nic;
    return std::string();
  }
  // The device port behind a local NIC as the transport uses it now, for operators (the state
  // file's per-NIC "rdma" object, docs/OPERATIONS.md). RDMA: the HCA port chosen for the NIC.
  struct DevicePort {
    std::string hca;         // HCA name (rxe0, mlx5_1)
    int port = 0;            // HCA port number (1-based, as in verbs)
    bool roce = false;       // link layer Ethernet (RoCE: GID addressing) vs InfiniBand (LID)
    bool active = false;     // the port is ACTIVE as the transport last saw it (its port watch
                             // follows PORT_ERR / PORT_ACTIVE and device fatal errors)
    int gidIndex = -1;       // GID index in use; -1 on InfiniBand
    std::string gid;         // that GID as text ("::ffff:10.0.0.1"); "" on InfiniBand
    int lid = 0;             // the port's LID on InfiniBand (0 while it has none); 0 on RoCE
    int mtuBytes = 0;        // the port's active MTU in bytes (256 .. 4096; 0: unknown)
    std::string why;         // one line: how the port and GID were chosen (the last choice:
                             // the GID is chosen again after the GID table changed)
  };
  // Fills *out with the device port behind local NIC `nic` and returns true; false (and *out
  // untouched) where the NIC is all there is (TCP) or `nic` is out of range. A copy taken at
  // once: thread-safe (any thread, while the transport lives), never blocks on I/O.
  virtual bool devicePort(int nic, DevicePort* out) const {
    (void)nic, (void)out;
    return false;
  }
  // What NCCL's getProperties reports for local NIC `nic` where the transport knows the device
  // better than the netdev does (RDMA: the HCA port behind the NIC, filled as NCCL's IB
  // transport fills its own devices' properties). A field left at its zero keeps the NIC's value
  // (common/nic.h: /sys/class/net speed and PCI path, a per-device guid, port 0, 65536 comms).
  struct DeviceProps {
    uint64_t guid = 0;    // the adapter's system image GUID: one value for every port and PCI
                          // function of one adapter (NCCL treats devices with equal guid and
                          // port as one physical port whose bandwidth they share); RDMA: its
                          // bytes in network order read as a host integer, as NCCL's IB
                          // transport reports it
    int port = 0;         // the port number, distinct among this process's devices of one guid
    int speedMbps = 0;    // the port's data rate, Mbps
    int maxComms = 0;     // comms the device can hold (NCCL: the most channels through it)
    std::string pciPath;  // the device's PCI directory in /sys
    std::string why;      // one line for the INIT log: where the values come from
  };
  // Fills *out for local NIC `nic` and returns true; false (and *out untouched) where the NIC is
  // all there is (TCP) or `nic` is out of range. Read once, at plugin init, after the transport
  // chose its devices. Thread-safe, never blocks.
  virtual bool deviceProps(int nic, DeviceProps* out) const {
    (void)nic, (void)out;
    return false;
  }
  // Memory kinds a registration may be (NCCL's NCCL_PTR_* bits, the same values).
  static constexpr uint32_t kPtrHost = 0x1, kPtrCuda = 0x2, kPtrDmaBuf = 0x4;
  // The kinds this transport registers on NIC `nic`: the plugin's ptrSupport. HOST always;
  // CUDA / DMABUF only where GPUDirect RDMA really works (RDMA: verbs_gdr.h's detection).
  virtual uint32_t ptrSupport(int nic) const {
    (void)nic;
    return kPtrHost;
  }
  // Registers [data, data + size) of kind `ptrType` (kPtrHost or kPtrCuda) for sends from it
  // and receives into it on every path the process may use (RDMA: on every HCA at once, so a
  // failover never registers anything). Returns the mhandle NCCL passes back to isend/irecv,
  // or nullptr with *err (also for a kind ptrSupport does not offer). A transport that needs
  // no registration returns a HostRegistration. deregMr releases it (nullptr: nothing).
  virtual void* regMr(void* data, size_t size, int ptrType, std::string* err) {
    if (ptrType != (int)kPtrHost) return *err = std::string("the ") + name() + " transport registers host memory only", nullptr;
    return new HostRegistration{data, size};
  }
  void* regMr(void* data, size_t size, std::string* err) { return regMr(data, size, (int)kPtrHost, err); }
  // regMr for a comm on local NIC `nic` (NCCL's regMr names the comm; -1: no comm, register as
  // regMr). A transport that serves NICs differently registers only what that NIC's comms can
  // use (the RDMA transport's mixed mode: a comm on a NIC served over TCP fails over only to
  // such NICs, so its buffer is pinned on no HCA). deregMr releases what it returned.
  virtual void* regMrOn(int nic, void* data, size_t size, int ptrType, std::string* err) {
    (void)nic;
    return regMr(data, size, ptrType, err);
  }
  // NCCL's regMrDmaBuf: [offset, offset + size) of dmabuf `fd`, mapped at `data`, registered
  // inside the call (NCCL closes fd when it returns). nullptr with *err where ptrSupport has
  // no DMABUF bit.
  virtual void* regMrDmaBuf(void* data, size_t size, uint64_t offset, int fd, std::string* err) {
    (void)data, (void)size, (void)offset, (void)fd;
    return *err = std::string("the ") + name() + " transport registers no dmabufs", nullptr;
  }
  // regMrDmaBuf for a comm on local NIC `nic` (-1: no comm), as regMrOn.
  virtual void* regMrDmaBufOn(int nic, void* data, size_t size, uint64_t offset, int fd, std::string* err) {
    (void)nic;
    return regMrDmaBuf(data, size, offset, fd, err);
  }
  // iflush: makes what NIC `nic` wrote into the registered buffer at `data` (mhandle: its
  // registration) visible to the GPU before NCCL tells a kernel it arrived. Returns an
  // operation to poll, or nullptr: with *err empty when nothing needs flushing (NCCL takes a
  // NULL flush request as done), with *err set when the flush cannot be made.
  virtual std::unique_ptr<FlushOp> flush(int nic, void* data, void* mhandle, std::string* err) {
    (void)nic, (void)data, (void)mhandle, (void)err;
    return nullptr;
  }
  virtual void deregMr(void* mhandle) { delete static_cast<HostRegistration*>(mhandle); }
  // True when the send paths tell what the receiver posted (SendPath::postedReceive; RDMA:
  // its advertisements), which is what grouped receives need with NCCL: with maxRecvs > 1 NCCL
  // shares one comm among the local ranks' connections to a peer (PXN) and groups their steps
  // into one irecv, each buffer tagged with its sender's rank, and the sends of those
  // connections reach isend in no particular order. NCCL's IB transport takes a send only into
  // the oldest receive not yet filled that has a free buffer with its tag, and answers "try
  // again" (a NULL request) otherwise; the engine does the same with this (SendLink::isend).
  // TCP tells the sender nothing: its sends go in isend order, as NCCL's socket transport's.
  virtual bool tellsPostedReceives() const { return false; }
  // False when a receive may not group several buffers: the plugin then reports maxRecvs 1
  // whatever RAILOVER_MAX_RECVS says. Grouping is safe only where the sender can match tags
  // (tellsPostedReceives); a fake may group without it for the engine's own receive tests,
  // whose sends come in receive order.
  virtual bool groupedReceives() const { return tellsPostedReceives(); }
  // The same for the comms of local NIC `nic` (its device's maxRecvs, its send links' tag
  // matching): a transport that serves some NICs over TCP (nicTransport) answers false for them.
  virtual bool tellsPostedReceivesOn(int nic) const {
    (void)nic;
    return tellsPostedReceives();
  }
  virtual bool groupedReceivesOn(int nic) const {
    (void)nic;
    return groupedReceives();
  }
  // Largest message (bytes) the transport carries; the plugin reports the smaller of it and
  // NCCL's limit as maxP2pBytes / maxCollBytes. RDMA: 4 GiB - 1 (the size travels in 32 bits).
  virtual uint64_t maxMessageBytes() const { return UINT64_MAX; }
  // Short name for logs, the state file and the handle ("tcp", "rdma").
  virtual const char* name() const { return "tcp"; }
  // The transport that carries the paths of local NIC `nic` ("tcp", "rdma"): name(), except in
  // the RDMA transport's mixed mode (RAILOVER_TRANSPORT=rdma+tcp where an RDMA port backs some NICs
  // only), which serves the NICs without one over TCP. A comm lives on one kind: its listen
  // handle names its NIC's kind and carries only that kind's NICs, its standby paths leave only
  // from NICs of that kind, and a peer whose NIC is of another kind is refused at connect.
  virtual const char* nicTransport(int nic) const {
    (void)nic;
    return name();
  }
  // What the process runs, for the state file and status: name(), or "rdma+tcp" in mixed mode.
  virtual std::string kinds() const { return name(); }
  // Writes the listen handle `h` (its `transport` must be name()) into
  // out[0, kTransportHandleBytes). False with *err when it cannot be encoded (no address,
  // more than kMaxPeerAddrs, a family other than IPv4/IPv6). A transport without listeners
  // refuses with a cause.
  virtual bool encodeHandle(const PeerHandle& h, void* out, std::string* err) {
    (void)h, (void)out;
    *err = std::string("the ") + name() + " transport of this process makes no listen handles";
    return false;
  }
  // Reads a peer's listen handle (its first `len` bytes, at most kTransportHandleBytes are
  // read). h->transport is the transport the handle names, which may differ from this one (the
  // caller refuses that handle, naming both). False with *err naming the problem.
  virtual bool decodeHandle(const void* in, size_t len, PeerHandle* h, std::string* err) {
    (void)in, (void)len, (void)h;
    *err = std::string("the ") + name() + " transport of this process reads no listen handles";
    return false;
  }
  // Ends a liveness check of the peer process over a connected stream `c` (TCP: a HELLO with
  // connection id 0, which the peer's acceptor closes without a word). False with *err on error.
  virtual bool endLivenessCheck(Conn& c, std::string* err) = 0;
};

// Writes all of `len` bytes if the connection takes them at once (for small control
// frames); returns false on error or a short write.
bool writeAll(Conn& c, const void* buf, size_t len, std::string* err);

}  // namespace railover
