// The RDMA transport: the engine's path interface (transport/transport.h) on verbs RC queue
// pairs (transport/verbs: NCCL_IB_QPS_PER_CONNECTION QPs per path, default 1, on the HCA port
// behind the path's NIC).
//
// What a path is here:
//  * a TCP *bootstrap* stream from the sender's NIC to the receiver's listener on the peer NIC
//    (the TCP transport's connect): it carries the HELLO (the same 32 bytes as a TCP stream,
//    so the receiver's acceptor, the TCP transport's (listen), routes it to its comm and path
//    unchanged), then the QP endpoints (verbs::QpEndpoint, 40 bytes per QP each way: the
//    sender's N = its NCCL_IB_QPS_PER_CONNECTION, named in every endpoint; the receiver builds
//    as many and answers with theirs). It stays
//    open for the path's life: its end (EOF, reset) tells either side that the peer fenced or
//    dropped the path, or exited, long before an RC retry timeout would;
//  * N RC QPs ("lanes"; verbs::SendPath at the sender, verbs::RecvPath at the receiver; with
//    N > 1 each chunk is split over the lanes and a message is reported only once every lane's
//    share is placed: verbs_path.h):
//    the receiver advertises each posted buffer (address, size, rkey of its HCA), the sender
//    RDMA-WRITEs the message's chunks into it and ends the message with a WRITE_WITH_IMM;
//    control messages (ACK, RESUME, RESUME_ACK, CLOSE) are SENDs on the same QP.
//
// Bring-up order (as NCCL's IB transport): the sender creates its QP and sends its endpoint;
// the receiver moves its QP to RTR/RTS first and only then answers with its endpoint, so the
// sender's first packet never meets a QP that cannot take it. QP state changes (which may
// resolve addresses) and QP destruction (~3 s on rxe after a local link loss) run on the
// transport's worker thread, never on NCCL's threads.
//
// Fence: the sender stops posting and moves its QP to ERR on the send-fence thread (nothing
// more leaves; not on the caller's thread nor on the worker, see RdmaSendPath::fence); the receiver moves its QP to
// ERR and drains the flush completions of every posted receive (bounded by kFenceDrainMs) on
// a fence thread of its own (RdmaRecvPath::fenceAsync, FenceRunner), and the engine answers
// RESUME_ACK on the new path only once that is done, so no write of the old path lands in a
// receive buffer after the resume and NCCL's thread never waits for a QP (docs/DESIGN.md,
// "RDMA").
//
// Completion: a send completes on the receiver's ACK, never on a write completion (an RDMA
// WRITE completion proves the remote HCA took the data, not that the receiver holds the whole
// message in the buffer the engine gave).
//
// Grouped receives (maxRecvs 8): the receiver advertises a group as n GROUP_ENTRY messages
// (seq of its first message, n, entry index, tag, address, size, rkey); the sender picks, at a
// message's first chunk, the first unused entry with the message's tag (the engine's rule) and
// ends the message with a DONE{seq, entry, bytes} SEND after its writes. A message that does
// not fit its receive is refused with a DONE, so the receiver's engine reports the caller's
// error (docs/PROTOCOL.md, "RDMA control messages").
//
// GPUDirect: buffers in GPU memory are registered with the peer-memory client (regMr, type
// CUDA) or as dmabufs (regMrDmaBuf), on every HCA; iflush reads one byte of the buffer through
// the NIC's flush QP (verbs_gdr.h) so the NIC's earlier writes are visible to the GPU.
//
// Limits: messages < 4 GiB.
// Thread-safety: a path object is used by one thread at a time (its link's mutex holder);
// the transport's methods are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/config.h"
#include "common/nic.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_gdr.h"
#include "transport/verbs/verbs_mr.h"
#include "transport/verbs/verbs_qp.h"

namespace railover {
namespace verbs {
class RecvPath;  // transport/verbs/verbs_path.h
}
}  // namespace railover

namespace railover {
namespace rdma {

// Longest a receiver's fence waits for the flush of its posted receives, ms. rxe flushes in
// well under a millisecond; the bound only matters on a wedged HCA (logged when reached).
constexpr int kFenceDrainMs = 100;
// A fence whose QP refused the move to ERR destroys the path's QPs instead: tries in all, and
// the first gap between them in ms (doubling: 10, 20, 40, 80 ms, ~150 ms in all). Ours: long
// enough for a transient EBUSY, short against the RESUME it holds back; the fence thread
// blocks, never NCCL's.
constexpr int kFenceDestroyTries = 5;
constexpr int kFenceDestroyGapMs = 10;
// An orderly close waits up to this long for the path's last sends (the CLOSE, the final ACKs)
// to complete before its QP goes to ERR, which would flush them (verbs::PathBase::lingerSends);
// only while the bootstrap stream shows the peer alive. A completion takes microseconds on an
// HCA and a few ms on rxe under TCG; on expiry the close goes on as before (the peer then
// sees the path end without its CLOSE).
constexpr int kCloseLingerMs = 100;
// The byte a sender writes on an established path's bootstrap stream to nudge it
// (SendPath::nudge, after a repair): the receiver reads and drops it; a receiver that dropped
// the path (its socket closed, or reaped) answers with a reset, which ends the stream at the
// sender at once. Any other byte after the endpoints is a protocol error. Part of the wire
// protocol (docs/PROTOCOL.md, "RDMA control messages"; docs/DESIGN.md, "The nudge after a repair").
constexpr uint8_t kStreamNudge = 0x6e;
// A fence that takes longer than this (µs) is logged with its duration: the engine answers
// RESUME only after the receiver's fences of older paths finished, so a slow one delays a
// failover by as much (it no longer blocks NCCL's thread: RdmaRecvPath::fenceAsync).
constexpr uint64_t kSlowFenceUs = 50000;

// Runs each receive path's asynchronous fence on a thread of its own. A QP's move to ERR was
// seen to block ~3 s on rxe after a local link loss (docs/DESIGN.md, "RDMA"), so fences must
// not wait behind each other (one NIC's loss fences every comm on it at once) nor behind QP
// destruction on the Worker.
//
// The threads are started ahead of need: `spares` of them wait from construction on, and the
// pool tops itself up outside the lock, so run() on NCCL's thread (a receive path's fence on a
// failover, and on the answer to a RESUME) only queues the job and wakes a thread. A thread
// that takes a job with no other thread left free starts one before the job (a burst); with
// another still free it runs the job first and tops the pool up to `spares` after it, so a
// single fence does not wait for a thread start (up to 17 ms between hand-off and run on the
// TCG bed when every thread started its successor first). Before the pool, run() started a
// std::thread per fence on the caller's thread: a receive path's close on NCCL's thread took
// 1.6-1.8 ms at the median and 10-15 ms at worst on the TCG bed (journals,
// docs/BENCHMARKS.md), mostly that start.
// run() starts a thread itself only when more fences arrive at once than threads are free
// (counted by callerStarts()). A thread idle for idleExitMs while `spares` others wait ends;
// it is joined by another thread of the pool or by the destructor; a thread that stays while
// it joins one stays counted as free, so run() never sees it missing. If run() can start no
// thread, the job runs on the caller's thread (slow, never lost); a job that run() left to a
// thread still starting, whose start then failed (a process out of threads), waits for the
// next thread of the pool that is free (never lost, but possibly behind a blocking fence).
// Thread-safe.
constexpr int kFenceSpares = 2;
constexpr int kFenceIdleExitMs = 30000;
class FenceRunner {
 public:
  explicit FenceRunner(int spares = kFenceSpares, int idleExitMs = kFenceIdleExitMs);
  ~FenceRunner();  // runs the jobs still queued, then stops and joins every thread
  void run(std::function<void()> job);
  void joinAll();  // waits until every job run so far has finished (tests; transport teardown)
  // Threads that run() had to start on its caller's thread (more fences at once than spares).
  uint64_t callerStarts() const { return callerStarts_.load(std::memory_order_relaxed); }
  int threads() const;  // threads alive now (tests)
  // Test hook: while held (hold(true) until hold(false)), no thread takes a job. run() queues
  // as usual (and starts threads as usual: they wait too; one that can start none still runs the
  // job on its caller's thread, as always), so a test can keep a job queued and
  // not begun for as long as it needs (a grant a fence must cancel, RdmaRecvPath). A job
  // already running is not affected. The destructor runs what is queued, held or not;
  // joinAll() while held waits for the release. queued(): jobs queued, not yet taken.
  // Production code never holds. Thread-safe.
  void hold(bool held);
  size_t queued() const;

 private:
  void loop();
  bool startLocked();    // mu_ held; false: no thread could be started
  void startReserved();  // mu_ not held: starts the thread a ++starting_ reserved (undone on failure)
  std::list<std::thread> reapLocked();  // mu_ held: the threads that ended, to be joined
  const int spares_;
  const int idleExitMs_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> q_;
  int waiting_ = 0;   // threads waiting for a job
  int starting_ = 0;  // threads started that have not reached their wait yet
  int busy_ = 0;      // jobs running
  bool stop_ = false;
  bool held_ = false;  // hold(): the threads take no job (tests)
  std::list<std::thread> threads_;      // a list: a started thread joins it without allocating
  std::vector<std::thread::id> ended_;  // threads that returned from loop(), not joined yet
  std::atomic<uint64_t> callerStarts_{0};
};

// Hands the caller's reference `sh` (reset here) to a job posted to `w` (anything with
// post(std::function<void()>)): what `sh` points to is released by that job, never by the
// caller, even when the job runs before post() returns. Keeping a copy in the caller until
// after post() (as this code once did) let a worker that won the race on a 1-vCPU guest run
// the job first, and the caller then dropped the last reference: a verbs path's QPs were
// destroyed on NCCL's thread, under the send link's lock, for ~3 s after a cable pull (rxe's
// QP destruction waits for packets queued on the dead link; docs/BENCHMARKS.md, "fence
// threads"). Thread-safety: as w.post().
template <typename W, typename T>
void handOff(W& w, std::shared_ptr<T>& sh) {
  if (!sh) return;
  w.post([last = std::move(sh)]() mutable { last.reset(); });
}

// Jobs on one background thread, in two FIFOs: bring-up jobs (postBringUp: creating a path's
// QPs, moving them to RTS; milliseconds) run before the other jobs (post: building a flush QP,
// handing a retired path on to the release thread, ...). The transport has two: its worker
// (bring-ups) and its release thread (RdmaTransport::release: destroying QPs, which blocks ~3 s
// each on rxe after a link loss), so a connect (two worker jobs, a 3 s timeout) never waits
// behind a release, not even one already running. Thread-safe.
class Worker {
 public:
  Worker();
  ~Worker();  // runs the jobs still queued, then stops
  void post(std::function<void()> job);
  void postBringUp(std::function<void()> job);
  // Waits until every job posted so far has run (tests; never on an NCCL thread).
  void drain();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> up_;  // bring-up jobs, served first
  std::deque<std::function<void()>> q_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread t_;
};

// The HCA port serving one NIC.
struct NicPort {
  verbs::PortSel sel;
  verbs::Hca* hca = nullptr;  // owned by the transport
  int hcaIndex = -1;          // index of hca in the transport's HCA list (and in every MrSet)
};

class RdmaTransport : public Transport {
 public:
  // Finds the HCA port behind every NIC of `nics` (NCCL_IB_HCA, GID by NCCL_IB_GID_INDEX /
  // ROCE_VERSION_NUM / ADDR_FAMILY / ADDR_RANGE: cfg->ib) and opens its HCA; QPs get
  // NCCL_IB_TIMEOUT / RETRY_CNT / SL / TC / PKEY. ok() false with *err naming the first NIC
  // that has none (or why libibverbs could not be loaded).
  //
  // Mixed mode (`tcpWhereNoRdma`, RAILOVER_TRANSPORT=rdma+tcp where only some NICs have an RDMA
  // port): a NIC without one is served over TCP instead of failing (nicTransport(nic) "tcp"):
  // its paths are the bootstrap TCP transport's own (openSendPath, newRecvPathOn), it has no
  // HCA, no flush QP, no port watch, ptrSupport host and maxRecvs 1. ok() false when no NIC
  // has an RDMA port.
  RdmaTransport(const std::vector<Nic>* nics, const Config* cfg, std::string* err, bool tcpWhereNoRdma = false);
  // Tests: NIC i is served by port `ports[i]` (HCA opened by name; a PortSel with an empty
  // `dev` is a NIC served over TCP, as in mixed mode), and the bootstrap streams come from
  // `bootstrap` (an in-memory stream transport), which outlives this one.
  RdmaTransport(const std::vector<verbs::PortSel>& ports, Transport* bootstrap, std::string* err,
                const IbConfig& ib = IbConfig{});
  ~RdmaTransport() override;
  bool ok() const { return ok_; }
  // One line per NIC: "eth1 -> rxe0 port 1 GID 1 (...)", for the INIT log, then the memory
  // registration's relaxed ordering ("; relaxed ordering on [why]", with the HCAs that refused it).
  std::string describe() const;
  // NCCL_IB_PCI_RELAXED_ORDERING as applied (verbs::relaxedOrderingChoice, given to every HCA):
  // whether NCCL's buffers are registered with IBV_ACCESS_RELAXED_ORDERING, and why.
  bool relaxedOrdering(std::string* why = nullptr) const {
    if (why) *why = roWhy_;
    return ro_;
  }

  std::unique_ptr<Conn> connect(int nic, const sockaddr_storage& remote, socklen_t len, std::string* err) override;
  std::unique_ptr<SendPath> openSendPath(int nic, const sockaddr_storage& remote, socklen_t len, int nStreams,
                                         const PathIdentity& id, const ChunkPolicy& chunks, std::string* err) override;
  std::unique_ptr<RecvPath> newRecvPath(int nStreams) override;
  std::unique_ptr<RecvPath> newRecvPathOn(int localNic, int nStreams) override;
  bool endLivenessCheck(Conn& c, std::string* err) override;
  // The bootstrap streams' listeners: the bootstrap transport's (TCP's acceptor, whose HELLO
  // check and routing are the same for both transports).
  bool listen(int nic, const sockaddr_storage& addr, socklen_t len, uint16_t* port, StreamRouter* router,
              std::string* err) override;
  // The handle in protocol v2's layout (the bootstrap listeners' addresses), naming "rdma".
  bool encodeHandle(const PeerHandle& h, void* out, std::string* err) override;
  bool decodeHandle(const void* in, size_t len, PeerHandle* h, std::string* err) override;
  // GPUDirect (transport/verbs/verbs_gdr.h): CUDA where a peer-memory client is loaded,
  // DMABUF where the NIC's HCA registers dmabufs; host memory always.
  uint32_t ptrSupport(int nic) const override;
  std::string nicDevice(int nic) const override;
  // NIC `nic`'s HCA port, link layer, state, GID / LID, MTU and why they were chosen, from the
  // current choice (portSel(): the port watch updates `active`, the LID and MTU at a port's
  // return, the GID after IBV_EVENT_GID_CHANGE). Copied under selMu_; thread-safe.
  bool devicePort(int nic, DevicePort* out) const override;
  // The HCA port behind the NIC as NCCL's IB transport reports its devices: guid = the HCA's
  // sys_image_guid; port = the HCA port number plus the ports of the process's other HCAs
  // with that guid that sort before it by name (the PCI functions of one adapter each call
  // their port 1; NCCL's IB transport numbers them apart the same way), so guid and port name
  // one physical port; speed = the port's rate when it was last read ACTIVE (0 while it never
  // was: the NIC's speed stays); maxComms = the HCA's max_qp shared by the paths every NIC's
  // comms put on it (NCCL_IB_QPS_PER_CONNECTION QPs each, one per NIC of this process:
  // max_qp / (QPs per path x NICs), at most 65536; other processes on the host share the HCA
  // too, as with NCCL's IB transport); pciPath = the HCA's /sys/class/infiniband/<hca>/device,
  // or the NIC's where the HCA has none (rxe, siw).
  bool deviceProps(int nic, DeviceProps* out) const override;
  using Transport::regMr;
  // Registers on every HCA (verbs::MrSet); any registration also makes sure every NIC's flush
  // QP exists (built here, on NCCL's service thread, never on its progress thread). An HCA that
  // is dead (DEVICE_FATAL) is skipped and registered at its re-open; this call waits while a
  // re-opened HCA's re-registration runs (the port watch holds the registry then).
  void* regMr(void* data, size_t size, int ptrType, std::string* err) override;
  void* regMrDmaBuf(void* data, size_t size, uint64_t offset, int fd, std::string* err) override;
  // Mixed mode: a comm on a NIC served over TCP gets a HostRegistration (host memory only, as
  // the TCP transport; nothing pinned on any HCA, no wait behind an HCA re-open); every other
  // NIC, and nic -1, registers on every HCA as regMr / regMrDmaBuf.
  void* regMrOn(int nic, void* data, size_t size, int ptrType, std::string* err) override;
  void* regMrDmaBufOn(int nic, void* data, size_t size, uint64_t offset, int fd, std::string* err) override;
  // Deregisters on every HCA (a HostRegistration of regMrOn: frees it, without the wait that
  // follows). Waits while a re-opened HCA's re-registration runs (the port watch thread holds
  // the registry then).
  void deregMr(void* mhandle) override;
  // A 1-byte RDMA READ of `data` through NIC `nic`'s flush QP (verbs::FlushQp). If that READ
  // fails (the NIC's port went down after the data arrived), the flush is retried through
  // the other NICs in index order and fails only when every one fails; a failed flush QP is
  // rebuilt on the worker thread.
  std::unique_ptr<FlushOp> flush(int nic, void* data, void* mhandle, std::string* err) override;
  // Tests: GPUDirect as if detected (peer memory loaded; dmabuf on every HCA), and NIC `nic`'s
  // flush QP (nullptr: none built).
  void setGdrForTest(bool peerMem, bool dmabuf);
  // Tests: HCA index `hca` takes dmabufs or not (after setGdrForTest).
  void setDmabufForTest(size_t hca, bool supported);
  verbs::FlushQp* flushQpForTest(int nic);
  // Tests: the clock (µs) the flush QPs' rebuild gap (kFlushRebuildGapUs) is measured with,
  // instead of nowUs(), so a test can end the gap without waiting for it. Set it before
  // anything builds a flush QP (regMr, startPortWatch); it is called from NCCL's threads, the
  // worker and the port watch, so it must be thread-safe.
  void setFlushClockForTest(std::function<uint64_t()> nowUs) { flushClock_ = std::move(nowUs); }
  static constexpr uint64_t flushRebuildGapUsForTest() { return kFlushRebuildGapUs; }
  bool tellsPostedReceives() const override { return true; }  // the receivers' advertisements
  bool tellsPostedReceivesOn(int nic) const override { return !overTcp(nic); }
  bool groupedReceivesOn(int nic) const override { return !overTcp(nic); }
  uint64_t maxMessageBytes() const override { return 0xffffffffull; }
  const char* name() const override { return "rdma"; }
  const char* nicTransport(int nic) const override { return overTcp(nic) ? "tcp" : "rdma"; }
  std::string kinds() const override { return mixed() ? "rdma+tcp" : "rdma"; }
  // Mixed mode: some NIC is served over TCP (no RDMA port behind it). Fixed at construction.
  bool mixed() const {
    for (const NicPort& p : ports_)
      if (!p.hca) return true;
    return false;
  }
  // NIC `nic` is served over TCP (mixed mode: no RDMA port behind it). Fixed at construction:
  // thread-safe.
  bool overTcp(int nic) const { return nic >= 0 && (size_t)nic < ports_.size() && !ports_[nic].hca; }

  // The port and GID serving NIC `nic` now (a copy: the port watch re-chooses the GID after
  // IBV_EVENT_GID_CHANGE, with NCCL_IB_* rules; new QPs use the new one). Thread-safe.
  verbs::PortSel portSel(int nic) const;
  // Watches the HCAs' async events on a thread of its own and calls `signal(nic, up, why)`
  // whenever the port behind NIC `nic` leaves or re-enters the ACTIVE state (IBV_EVENT_PORT_ERR
  // / PORT_ACTIVE, re-read with ibv_query_port; every kPortRecheckMs the states are re-read even
  // without an event) or its HCA reports DEVICE_FATAL. The runtime feeds it into per-NIC health
  // (Health::transportNicSignal), so one port event moves every comm on the NIC. Call once.
  //
  // After DEVICE_FATAL the watch re-opens the HCA (verbs::Hca::reopen) kReopenFirstMs later and
  // then with a back-off doubling to kReopenMaxMs, for as long as the transport lives; once it
  // is open again, every registered buffer is registered on it again (MrSet::refresh; a dmabuf
  // through the fd kept at regMrDmaBuf), the NIC's GID is chosen again and its flush QP
  // rebuilt, and only then, with its port ACTIVE, is the NIC reported up ("RDMA device
  // re-opened"): the engine's failback moves its comms back as after a port repair.
  //
  // `addr` (may be empty) hears when the address a NIC's new paths use changes while its port
  // stays up: kind "gid" (IBV_EVENT_GID_CHANGE re-chose the RoCE GID; old/new are "<index>
  // <gid>"; connected paths keep theirs) or "lid" (IBV_EVENT_LID_CHANGE on InfiniBand; old/new
  // are the LIDs in decimal; connected paths break, see verbs::Hca::portLid). Both callbacks
  // run on the watch thread and must not block.
  using PortSignal = std::function<void(int nic, bool up, const std::string& why)>;
  using AddrSignal = std::function<void(int nic, const std::string& kind, const std::string& oldAddr,
                                        const std::string& newAddr, const std::string& why)>;
  void startPortWatch(PortSignal signal, AddrSignal addr = nullptr);
  static constexpr int kPortRecheckMs = 1000;
  static constexpr int kReopenFirstMs = 1000;  // first re-open attempt after DEVICE_FATAL
  static constexpr int kReopenMaxMs = 8000;    // back-off cap: a repaired HCA is found within it
  // Number of re-open attempts of HCA index `hca` so far (tests, diagnostics). Thread-safe.
  uint64_t reopenAttempts(int hca) const;

  // The HCA behind NIC `nic` (its `sel` is the choice at init: use portSel() for the current one).
  const NicPort& port(int nic) const { return ports_[nic]; }
  Worker& worker() { return worker_; }
  FenceRunner& fencer() { return fencer_; }
  // Where send paths' fences move their QPs to ERR (RdmaSendPath::fence): a thread of its own,
  // so a move that blocks (~3 s on rxe after a local link loss) holds neither the worker's
  // bring-ups nor NCCL's thread (no thread is started per fence; they queue, which costs
  // nothing: the receiver's fence is what keeps a path's writes out).
  Worker& sendFencer() { return sendFences_; }
  // Releases `sh` (reset here) off the caller's thread: through the worker, so after every
  // bring-up job posted before (a path's release follows its own bring-up), to the release
  // thread, where the last reference is dropped and the verbs objects are destroyed (a QP's
  // destruction blocks ~3 s on rxe after a local link loss; on the worker it held every
  // comm's bring-up: RdmaPathTest.AQpDestructionBlockedAfterALinkLossHoldsNoOtherPathsBringUp).
  // A copy still held elsewhere (a bring-up job running now) is dropped there first: the
  // worker's hop runs after that job. Thread-safe.
  template <typename T>
  void release(std::shared_ptr<T>& sh) {
    if (!sh) return;
    worker_.post([this, last = std::move(sh)]() mutable { handOff(releases_, last); });
  }
  Worker& releaser() { return releases_; }
  const verbs::RcParams& rcParams() const { return rc_; }
  // Logs, once per HCA, what the first receive path connected on NIC `nic` read back of its
  // QPs' remote access (verbs::RecvPath::writesAllowed): INFO when the HCA confirmed
  // IBV_ACCESS_REMOTE_WRITE off, WARN when it did not (a stuck fence of a standby that never
  // carried data then fails the comm instead of being called safe). Thread-safe (the worker).
  void noteAccessReadBack(int nic, const verbs::RecvPath& p);

 private:
  std::mutex accessLogMu_;
  std::vector<char> accessLogged_;  // per HCA index
  bool openPorts(const std::vector<std::string>& names, const std::vector<verbs::PortSel>& sels, std::string* err);
  std::vector<std::string> tcpWhy_;       // mixed mode: per NIC served over TCP, why it has no RDMA port
  std::vector<std::string> names_;        // NIC name per index (for describe())
  std::unique_ptr<Transport> ownBoot_;    // the TCP transport (production)
  Transport* boot_ = nullptr;             // bootstrap streams, liveness checks
  std::vector<std::unique_ptr<verbs::Hca>> hcas_;
  std::vector<NicPort> ports_;
  verbs::RcParams rc_;
  IbConfig ib_;                  // NCCL_IB_* (GID re-choice)
  mutable std::mutex selMu_;     // guards ports_[i].sel after init (the port watch rewrites it)
  Worker releases_;  // before worker_ (outlives it): the worker's jobs hand paths to it
  Worker worker_;
  FenceRunner fencer_;  // after worker_: its jobs hand what they held to the worker
  Worker sendFences_;   // after worker_: its jobs hand the fenced send paths to the worker
  bool ok_ = false;
  void watchLoop(PortSignal signal, AddrSignal addr);
  // Re-opens HCA index `h` if its opening is dead, then registers every live MrSet on it again
  // and builds the flush QP of each of its NICs on the new opening. false + *err otherwise (the
  // watch keeps the NICs down and tries again later).
  bool reviveHca(size_t h, std::string* err);
  mutable std::mutex mrMu_;                      // guards mrs_
  std::vector<verbs::MrSet*> mrs_;               // every registration alive (regMr .. deregMr)
  // Mixed mode: regMrOn's HostRegistrations alive. A lock of their own, not mrMu_: reviveHca
  // holds mrMu_ while it re-registers every buffer on a re-opened HCA, and a TCP NIC's comm
  // must not wait for that.
  mutable std::mutex hostMu_;
  std::unordered_set<void*> hostRegs_;
  std::vector<std::unique_ptr<std::atomic<uint64_t>>> reopenTries_;  // per HCA index
  bool track(verbs::MrSet* mr, std::string* err);  // registers mr in mrs_ (up to date); false: it is not
  // Relaxed ordering (NCCL_IB_PCI_RELAXED_ORDERING): chosen once HCAs are open, given to each.
  void chooseRelaxedOrdering();
  // One WARN per HCA that refused the flag (Hca::takeRelaxedOrderingRefusal), after registrations.
  void logRelaxedOrderingRefusals();
  bool ro_ = false;
  std::string roWhy_;
  // GPUDirect
  void detectGdr();
  bool peerMem_ = false;        // a GPU peer-memory client is loaded
  std::vector<char> dmabuf_;    // per HCA index: registers dmabufs
 public:
  struct FlushSlot {            // the flush QP of one NIC's port
    std::mutex mu;
    std::shared_ptr<verbs::FlushQp> qp;  // nullptr: not built (or failed and not rebuilt)
    bool building = false;
    std::string err;            // why the last build or READ failed
    uint64_t lastFailUs = 0;    // when the last build failed (0: it did not; flushNowUs()'s clock)
    // A build asked for within kFlushRebuildGapUs of a failed one (a port back up, a LID
    // change, a flush or regMr meanwhile): not started then, started by the port watch once
    // the gap has passed (startDueFlushRebuilds), or by the next flush or regMr after it.
    bool pending = false;
  };
 private:
  std::vector<std::unique_ptr<FlushSlot>> flush_;  // per NIC
  void ensureFlushQps();                // builds the missing ones now (service thread)
  // Drops NIC `nic`'s failed flush QP `failed` (unless it was replaced already) and posts a rebuild to the worker; after a failed build
  // the next one waits kFlushRebuildGapUs (a port that stays down is not hammered): one asked
  // for within it is remembered (FlushSlot::pending) and started when it ends.
  void rebuildFlushQp(int nic, const verbs::FlushQp* failed);
  // The port watch's part of the gap: posts to the worker the remembered rebuild of every slot
  // whose gap has passed; returns the µs until the next remembered one is due (UINT64_MAX:
  // none), which bounds the watch's wait. Never blocks (the builds run on the worker).
  uint64_t startDueFlushRebuilds();
  // The worker's build of NIC `nic`'s flush QP (s.building set): from the port's current
  // choice; if that choice (LID, GID, MTU) or the HCA's opening changed while it ran, the QP is
  // dropped and the build posted again, so the slot never keeps a QP on an old address.
  void buildFlushQp(int nic);
  static constexpr uint64_t kFlushRebuildGapUs = 1000000;
  // The clock of the flush QPs' rebuild gap: nowUs(), or the test's (setFlushClockForTest).
  uint64_t flushNowUs() const;
  std::function<uint64_t()> flushClock_;
  friend class RdmaFlushOp;
  std::thread watch_;
  int stopFd_ = -1;  // eventfd: ends the watch thread (destructor)
};

// Tests and diagnostics: the QP of an RDMA path, once its bring-up finished (nullptr for a path
// of another transport or one still connecting).
ibv_qp* pathQp(SendPath* p);
ibv_qp* pathQp(RecvPath* p);
// Every QP of the path, lane 0 first (empty while it is connecting).
std::vector<ibv_qp*> pathQps(SendPath* p);
std::vector<ibv_qp*> pathQps(RecvPath* p);

// True when every NIC of `nics` has an ACTIVE RDMA port behind it that NCCL_IB_HCA allows, with
// a GID by NCCL's rules (cfg.ib), and libibverbs loads (RAILOVER_TRANSPORT=auto then uses rdma
// on every NIC); *why says which NIC has none otherwise (the first), and *withRdma (when not
// null) gets the names of the NICs that have one (auto keeps only those; rdma+tcp serves the
// others over TCP; plugin/runtime.cc).
bool rdmaUsable(const std::vector<Nic>& nics, const Config& cfg, std::string* why,
                std::vector<std::string>* withRdma = nullptr);

}  // namespace rdma
}  // namespace railover
