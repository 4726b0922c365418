// The failover engine (see link.h for the state machine and the delivery rules).
#include "failover/link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "common/tuning.h"
#include "health/health.h"
#include "failover/pairing.h"
#include "failover/registry.h"
#include "telemetry/journal.h"

namespace railover {

const char* pathStateName(PathState s) {
  switch (s) {
    case PathState::kConnecting: return "connecting";
    case PathState::kStandby: return "standby";
    case PathState::kActive: return "active";
    case PathState::kFailed: return "failed";
    case PathState::kClosed: return "closed";
  }
  return "?";
}

const char* linkStateName(LinkState s) {
  switch (s) {
    case LinkState::kConnecting: return "connecting";
    case LinkState::kWaiting: return "waiting";
    case LinkState::kResuming: return "resuming";
    case LinkState::kFailingBack: return "failing back";
    case LinkState::kRunning: return "running";
    case LinkState::kPeerClosed: return "peer closed";
    case LinkState::kFatal: return "fatal";
    case LinkState::kClosed: return "closed";
  }
  return "?";
}

uint64_t Path::closeAll(std::vector<std::shared_ptr<FenceWait>>* pending) {
  if (tx) tx->fence(), tx.reset();
  if (rx && pending) {
    std::shared_ptr<FenceWait> w = rx->fenceAsync();
    if (w && !w->done.load(std::memory_order_acquire)) pending->push_back(std::move(w));
    rx.reset();
  }
  uint64_t grantWaitUs = 0;
  if (rx) {
    rx->fence();
    grantWaitUs = rx->lastFenceGrantWait().us;
    rx.reset();
  }
  return grantWaitUs;
}

bool RecvRanges::covers(uint64_t a, uint64_t b) const {
  for (int i = 0; i < n; ++i)
    if (lo[i] <= a && b <= hi[i]) return true;
  return false;
}

bool RecvRanges::admits(uint64_t a, uint64_t b) const {
  // With chunks still arriving, count each as a possible new range; otherwise exactly.
  if (inflight) return n + inflight + 1 <= kMax;
  int apart = 0;  // ranges that [a, b) neither overlaps nor touches
  for (int i = 0; i < n; ++i) apart += hi[i] < a || b < lo[i];
  return apart + 1 <= kMax;
}

uint64_t RecvRanges::add(uint64_t a, uint64_t b) {
  uint64_t before = 0, after = 0;
  for (int i = 0; i < n; ++i) before += hi[i] - lo[i];
  // Merge [a, b) with every range it overlaps or touches; keep the others in order.
  uint64_t nlo[kMax + 1], nhi[kMax + 1];
  int m = 0;
  bool placed = false;
  for (int i = 0; i < n; ++i) {
    if (hi[i] < a) {
      nlo[m] = lo[i], nhi[m++] = hi[i];
    } else if (b < lo[i]) {
      if (!placed) nlo[m] = a, nhi[m++] = b, placed = true;
      nlo[m] = lo[i], nhi[m++] = hi[i];
    } else {
      a = std::min(a, lo[i]), b = std::max(b, hi[i]);
    }
  }
  if (!placed) nlo[m] = a, nhi[m++] = b;
  if (m > kMax) return 0;  // cannot happen for a chunk admits() accepted
  n = (uint8_t)m;
  for (int i = 0; i < m; ++i) lo[i] = nlo[i], hi[i] = nhi[i], after += nhi[i] - nlo[i];
  return after - before;
}

Link::Link() = default;

void Link::list() {
  if (deps.registry) deps.registry->add(this);
}

void Link::unlist() {
  if (deps.registry) deps.registry->remove(this);
}

Link::~Link() {
  if (deps.registry) deps.registry->retire(this);
  for (auto& p : paths) p.closeAll();  // close() closed them already when NCCL closed the comm; not journaled
}

namespace {
bool pathHealthy(const Path& p, Health* hl) {
  return !hl || (hl->nicUp(p.localNic) && hl->pairUp(p.pairId));
}
}  // namespace

bool SendLink::sweep() {
  std::unique_lock<std::mutex> lk(mu, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  Health* hl = deps.health;
  auto settled = [&] {
    return isFatal() || !deregMsg.empty() || (peerClosed() && active < 0) ||
           (active >= 0 && !resuming() && (!hl || seenEpoch == hl->epoch()) && pathHealthy(paths[active], hl));
  };
  if (settled()) return true;
  progress(true);
  return settled();
}

// An idle send comm whose path failed or whose standby died is not called again before its
// next isend, and the sweeper's window after the repair ends once the comm sits on a healthy
// active path: its failed paths would wait for that call, and a second fault at it found no
// connected path. So the idle pass drives it as a test() call would, but only while that call
// would have something to do: a failed path whose back-off ran out (NIC up: advancePath's
// rule, so no more attempts than calls would make), a connect in progress, a RESUME waiting
// for its answer, a failback due (failbackDue: the hold-down rules), no active path, or, once
// a second (tuning::kIdleStandbyLookUs), a connected standby to look at.
// Otherwise it only looks at the paths (no system call).
void SendLink::idleSweep(uint64_t now) {
  std::unique_lock<std::mutex> lk(mu, std::try_to_lock);
  if (!lk.owns_lock()) return;
  // CONNECTING: NCCL's connect calls drive it. `now` was read before the lock: a call since is
  // later than it.
  if (state() == LinkState::kConnecting || isFatal() || peerClosed() || !deregMsg.empty() ||
      lastCallUs_ + (uint64_t)tuning::kIdleSweepMs * 1000 > now)
    return;
  Health* hl = deps.health;
  bool due = active < 0 || resuming() || failbackDue(now);
  // A connected standby is looked at (its receiver's CLOSE, NACK or reset: advancePath) once
  // per kIdleStandbyLookUs since the last call or look.
  bool lookAtStandbys = now >= std::max(lastCallUs_, idleStandbyLookUs_) + tuning::kIdleStandbyLookUs;
  for (size_t i = 0; i < paths.size() && !due; ++i) {
    const Path& p = paths[i];
    due = p.state == PathState::kConnecting ||
          (p.state == PathState::kFailed && now >= p.nextAttemptUs && (!hl || hl->nicUp(p.localNic))) ||
          (p.state == PathState::kStandby && lookAtStandbys);
  }
  if (!due) return;
  idleStandbyLookUs_ = now;
  progress(true);
}

void RecvLink::idleSweep(uint64_t now) {
  std::unique_lock<std::mutex> lk(mu, std::try_to_lock);
  if (!lk.owns_lock()) return;
  // `now` was read before the lock: a call since is later than it (as for SendLink::idleSweep;
  // `now - lastCallUs_` would wrap and pass a comm NCCL had just called).
  if (!everReady_ || isFatal() || peerClosed() || lastCallUs_ + (uint64_t)tuning::kIdleSweepMs * 1000 > now) return;
  progress();
}

bool RecvLink::sweep() {
  std::unique_lock<std::mutex> lk(mu, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  Health* hl = deps.health;
  auto settled = [&] {
    return isFatal() || !deregMsg.empty() || !everReady_ || peerClosed() ||
           (active >= 0 && (!hl || seenEpoch == hl->epoch()) && pathHealthy(paths[active], hl));
  };
  if (settled()) return true;
  progress();
  return settled();
}

void Link::publishIfChanged(bool isSend) {
  uint64_t sig = 1469598103934665603ULL;
  auto mix = [&](uint64_t v) { sig = (sig ^ v) * 1099511628211ULL; };
  mix((uint64_t)(active + 1));
  mix(isFatal());
  for (auto& p : paths) mix((uint64_t)p.state), mix(p.flaps), mix(p.holdDownMs), mix((uint64_t)p.localNic);
  mix(counters.failovers), mix(counters.failbacks), mix(counters.flaps), mix(counters.bytesResent);
  if (sig == snapSig) return;
  snapSig = sig;
  LinkSnap s;
  s.isSend = isSend;
  s.secret = secret;
  s.peer = peerName;
  s.active = active;
  s.primary = primary;
  s.fatal = isFatal();
  s.counters = counters;
  for (auto& p : paths) {
    PathSnap ps;
    ps.localNic = p.localNic;
    ps.peer = addrToString(p.remote);
    ps.state = p.state;
    ps.flaps = p.flaps;
    ps.holdDownMs = p.holdDownMs;
    ps.lastError = p.lastError;
    s.paths.push_back(ps);
  }
  {
    std::lock_guard<std::mutex> g(snapMu);
    snap = std::move(s);
  }
  if (deps.registry) deps.registry->markDirty();
}

LinkSnap Link::snapshot() {
  std::lock_guard<std::mutex> g(snapMu);
  return snap;
}

static std::string nicName(const LinkDeps& d, int nic) {
  return nic >= 0 && nic < (int)d.nics->size() ? (*d.nics)[nic].name : std::string("?");
}

// "eth1 (rxe0 port 1)": the NIC and, where the transport has one, the device behind it (the
// fatal errors name both, so an operator knows which HCA port to look at).
static std::string deviceOf(const LinkDeps& d, int nic) {
  return d.transport ? d.transport->nicDevice(nic) : std::string();
}

static std::string nicWithDevice(const LinkDeps& d, int nic) {
  std::string dev = deviceOf(d, nic);
  return nicName(d, nic) + (dev.empty() ? "" : " (" + dev + ")");
}

static uint16_t portOf(const sockaddr_storage& a) {
  return ntohs(a.ss_family == AF_INET ? ((const sockaddr_in&)a).sin_port : ((const sockaddr_in6&)a).sin6_port);
}

std::string Link::describe(const Path& p) const {
  return nicName(deps, p.localNic) + "->" + addrToString(p.remote) + ":" + std::to_string(portOf(p.remote));
}

void Link::noteSlowCall(const Path& p, uint64_t t0, SlowCall kind, uint64_t grantWaitUs) {
  uint64_t t1 = nowUs();
  if (t1 - t0 < tuning::kSlowTransportCallUs) return;
  uint64_t& last = lastSlowCallLogUs[(int)kind];
  if (last && t1 - last < tuning::kSlowTransportLogIntervalUs) return;
  const char* call = kind == SlowCall::kClose ? "close" : kind == SlowCall::kOpen ? "open" : "progress";
  last = t1;
  std::string where = describe(p);
  std::string grant = grantWaitUs ? " (of which " + std::to_string(grantWaitUs / 1000) +
                                        " ms waiting for the path's grant of remote write, before its fence)"
                                  : "";
  RO_WARN_EVENT("railover: %s comm %016llx path %s: a %s call into its transport held this thread %llu ms%s", dir(),
                (unsigned long long)secret, where.c_str(), call, (unsigned long long)((t1 - t0) / 1000), grant.c_str());
  if (Journal* j = deps.journal)
    j->transport_slow(secret, dir(), nicName(deps, p.localNic), addrToString(p.remote), call, t1 - t0, grantWaitUs);
}

void Link::closePath(Path& p, std::vector<std::shared_ptr<FenceWait>>* pending) {
  uint64_t t0 = nowUs();
  uint64_t grantWaitUs = p.closeAll(pending);
  noteSlowCall(p, t0, SlowCall::kClose, grantWaitUs);
}

void Link::setPathState(Path& p, PathState to, const std::string& why, bool fault) {
  PathState from = p.state;
  if (from == to) return;
  p.state = to;
  std::string where = describe(p);
  if (fault)
    RO_WARN_EVENT("railover: %s comm %016llx path %s: %s -> %s (%s)", dir(), (unsigned long long)secret, where.c_str(),
                  pathStateName(from), pathStateName(to), why.c_str());
  else
    RO_INFO(RO_SUBSYS_NET, "railover: %s comm %016llx path %s: %s -> %s (%s)", dir(), (unsigned long long)secret,
            where.c_str(), pathStateName(from), pathStateName(to), why.c_str());
  if (Journal* j = deps.journal)
    j->path_state(secret, dir(), nicName(deps, p.localNic), addrToString(p.remote), pathStateName(from),
                  pathStateName(to), why);
}

void Link::setState(LinkState to, const std::string& why, bool warn) {
  LinkState from = state_;
  if (from == to) return;
  // FATAL and PEER_CLOSED are final but for CLOSED (and PEER_CLOSED -> FATAL); CLOSED is final.
  if (from == LinkState::kClosed || (from == LinkState::kFatal && to != LinkState::kClosed) ||
      (from == LinkState::kPeerClosed && to != LinkState::kFatal && to != LinkState::kClosed))
    return;
  state_ = to;
  if (warn)
    RO_WARN_EVENT("railover: %s comm %016llx: %s -> %s (%s)", dir(), (unsigned long long)secret, linkStateName(from),
                  linkStateName(to), why.c_str());
  else
    RO_INFO(RO_SUBSYS_NET, "railover: %s comm %016llx: %s -> %s (%s)", dir(), (unsigned long long)secret,
            linkStateName(from), linkStateName(to), why.c_str());
}

void Link::enterFatal(const std::string& msg, bool peerGone) {
  if (isFatal() || state_ == LinkState::kClosed) return;
  fatalMsg = msg;
  fatalPeerGone = peerGone;
  // The WARN with the whole message comes when the error is returned (fatalResult).
  setState(LinkState::kFatal, "see the fatal error");
  if (Journal* j = deps.journal) j->fatal(secret, dir(), fatalMsg);
  onFatal();
}

void Link::notePeerClosed(const std::string& cause) {
  if (closedCause.empty()) closedCause = cause;
  setState(LinkState::kPeerClosed, closedCause);
}

static uint32_t holdDownOf(const Path& p, const Config& cfg) { return p.holdDownMs ? p.holdDownMs : cfg.holdDownMs; }

// When the hold-down of path `p` started: the later of its reconnect and the last repair of
// its NIC or NIC pair. A path may reconnect (TCP) before the probes prove its pair healthy
// again; the hold-down counts from that proof, so a busy host that learns of the repair late
// still waits the whole hold-down before failing back.
static uint64_t holdDownStartUs(const Path& p, Health* hl) {
  // A rail that showed a queue (congestion) restarts the hold-down too: taking it back while
  // the queue persists would fill it again and move the comm away again (oscillation).
  if (!hl) return p.upSinceUs;
  return std::max({p.upSinceUs, hl->repairedUs(p.localNic, p.pairId), hl->queuedUs(p.pairId)});
}

// A failure that only the peer process can cause: its kernel refused the connection, or the
// peer closed or reset the stream. A NIC, cable or switch fault never produces one (it shows
// as timeouts and silence), so a receiver does not report these as path failures: the sender
// decided (and reports its own faults), or the comm is being closed.
static bool peerGoneError(const std::string& e) {
  return e.find("refused") != std::string::npos || e.find("reset by peer") != std::string::npos ||
         e.find("closed by peer") != std::string::npos || e.find("Broken pipe") != std::string::npos;
}

// The one place a link's fatal error leaves the plugin. With RAILOVER_ABORT_ON_FATAL=1 the
// process exits here (one stderr line naming the path and the cause, then quick_exit, which
// runs the state-file cleanup); otherwise the WARN and ncclSystemError as NCCL expects.
ncclResult_t fatalResult(const std::string& msg, bool abortOnFatal) {
  if (abortOnFatal) {
    std::string m = msg.rfind("railover: ", 0) == 0 ? msg.substr(10) : msg;
    fprintf(stderr, "railover: RAILOVER_ABORT_ON_FATAL=1: exiting on a fatal error: %s\n", m.c_str());
    fflush(stderr);
    std::quick_exit(kAbortOnFatalExitCode);
  }
  RO_WARN("%s", msg.c_str());
  return ncclSystemError;
}

// ------------------------------------------------------------------------------------------
// SendLink

// Causes recorded when the receiver closed the comm.
static const char* const kCloseCause = "the receiver closed the comm (CLOSE)";
static const char* const kFatalCloseCause =
    "the receiver's recv comm ended in a fatal error (CLOSE after a fatal error: the receiving rank's log names "
    "the cause)";
// The cause a receiver's CLOSE gives, by the reason in its seq (kCloseReason*).
static const char* closeCause(const CtlMsg& m) { return m.seq == kCloseReasonFatal ? kFatalCloseCause : kCloseCause; }
static const char* const kSenderCloseCause = "the sender closed the comm (CLOSE)";
static const char* const kNackCause =
    "the receiver no longer serves this comm (NACK: its listen comm or recv comm was closed, ended in a fatal "
    "error, or is being torn down)";

// For protocol errors: the control message's name, or the transport's raw type code.
static std::string ctlName(const CtlMsg& m) {
  switch (m.type) {
    case CtlType::kAck: return "ACK";
    case CtlType::kResume: return "RESUME";
    case CtlType::kResumeAck: return "RESUME_ACK";
    case CtlType::kNack: return "NACK";
    case CtlType::kClose: return "CLOSE";
    case CtlType::kOther: break;
  }
  return "frame type " + std::to_string(m.arg);
}

SendLink* SendLink::create(const LinkDeps& deps, int dev, const PeerHandle& h, std::string* err, int trafficClass) {
  const LinkDeps& d = deps;
  auto* l = new SendLink();
  l->deps = deps;
  l->trafficClass = trafficClass;
  l->createdUs = nowUs();
  l->dev_ = dev;
  l->secret = h.secret;
  while (l->connId == 0)
    if (getrandom(&l->connId, sizeof(l->connId), 0) != sizeof(l->connId)) l->connId = nowUs() * 0x9e3779b97f4a7c15ULL;
  l->nStreams = d.cfg->nStreams;
  l->matchTags_ = d.transport->tellsPostedReceivesOn(dev) && std::min<uint32_t>(d.cfg->maxRecvs, kMaxRecvs) > 1;
  auto addPath = [&](int localNic, int remoteIdx) {
    Path p;
    p.index = remoteIdx;
    p.localNic = localNic;
    p.rail = (*d.nics)[localNic].rail;
    p.remote = h.addrs[remoteIdx].addr;
    p.remoteLen = h.addrs[remoteIdx].len;
    if (Health* hl = deps.health) hl->remapRemote(&p.remote);
    p.holdDownMs = d.cfg->holdDownMs;  // a new path starts CONNECTING (startConnect() below)
    if (Health* hl = deps.health) p.pairId = hl->registerPair(localNic, p.remote, p.remoteLen);
    l->paths.push_back(std::move(p));
  };
  // Only from NICs whose paths the same transport carries (Transport::nicTransport: in the RDMA
  // transport's mixed mode a comm of a NIC served over TCP fails over only to TCP NICs, and an
  // RDMA comm only to RDMA NICs; the peer's handle carries only its NICs of that kind).
  const std::string kind = d.transport->nicTransport(dev);
  int otherKind = 0;  // local NICs left out for being of another kind
  std::vector<int> standbyNics;
  auto consider = [&](int j) {
    if (j == dev) return;
    if (kind != d.transport->nicTransport(j)) ++otherKind;
    else standbyNics.push_back(j);
  };
  if (d.cfg->standby == StandbyPolicy::kAll) {
    for (int j = 0; j < (int)(*d.nics).size(); ++j) consider(j);
  } else if (d.cfg->standby == StandbyPolicy::kExplicit) {
    for (auto& pr : d.cfg->standbyPairs) {
      if (pr.first != (*d.nics)[dev].name) continue;
      for (int j = 0; j < (int)(*d.nics).size(); ++j)
        if ((*d.nics)[j].name == pr.second) consider(j);
    }
  }
  // The primary from dev, standby paths from each other NIC: to the peer's NIC on the same
  // rail, or on the NIC's subnet where the rails do not match (failover/pairing.h).
  std::vector<LocalNicView> views((*d.nics).size());
  std::vector<Subnet> subnets = lookupSubnets(*d.nics);
  for (size_t i = 0; i < views.size(); ++i) views[i] = {(*d.nics)[i].name, (*d.nics)[i].rail, subnets[i]};
  PathPlan plan = planPaths(dev, standbyNics, views, h);
  for (auto& pr : plan.pairs) addPath(pr.localNic, pr.remote);
  l->primary = 0;
  l->peerName = addrToString(l->paths[0].remote);
  for (auto& n : plan.notes) {
    // Once per local NIC and kind: every comm between the two hosts shows the same cabling.
    if (d.registry && !d.registry->firstPairingWarning(n.localNic, (int)n.kind)) continue;
    RO_WARN("railover: %s", n.text.c_str());
    if (Journal* j = d.journal) j->rail_mismatch((*d.nics)[n.localNic].name, l->peerName, pairingNoteName(n.kind), n.text);
  }
  if (l->paths.size() == 1 && d.cfg->standby != StandbyPolicy::kNone) {
    // A comm without a standby path: say once per NIC that its connections cannot fail over, and why.
    if (!d.registry || d.registry->firstNoStandbyWarning(dev)) {
      RO_WARN("railover: connections from NIC %s to peer %s have no standby path (%s); they cannot fail over",
              (*d.nics)[dev].name.c_str(), l->peerName.c_str(),
              (*d.nics).size() < 2 ? "this process has only one NIC"
              : standbyNics.empty() && otherKind > 0
                  ? "every other local NIC is served by another transport (RAILOVER_TRANSPORT=rdma+tcp: rdma where an "
                    "RDMA port backs the NIC, tcp elsewhere; a comm fails over only within its kind)"
                  : "the peer has no NIC on the rail or subnet of any other local NIC (see RAILOVER_RAILS, RAILOVER_STANDBY)");
      if (Journal* j = d.journal) j->no_standby((*d.nics)[dev].name, l->peerName);
    }
  }
  uint64_t now = nowUs();
  for (auto& p : l->paths) l->startConnect(p, now, "connect");
  l->lastSlowTickUs = now;
  l->list();
  RO_INFO(RO_SUBSYS_NET | RO_SUBSYS_INIT, "railover: connect comm %016llx primary %s, %zu standby path(s)",
          (unsigned long long)l->secret, l->describe(l->paths[0]).c_str(), l->paths.size() - 1);
  (void)err;
  return l;
}

void SendLink::startConnect(Path& p, uint64_t now, const std::string& why) {
  const LinkDeps& d = deps;
  closePath(p);
  p.generation++;
  setPathState(p, PathState::kConnecting, why);
  p.attemptStartUs = now;
  p.connectWaitedUs = 0;
  p.offNetWaitedUs = 0;
  p.waitsOffNetwork = false;
  p.waitsForPeer = false;
  p.lastConnectPollUs = now;
  if (Health* hl = deps.health) hl->remapRemote(&p.remote);  // the peer's NIC may have moved
  PathIdentity id;
  id.secret = secret;
  id.connId = connId;
  id.pathIndex = (uint8_t)p.index;
  id.srcRail = (uint8_t)p.rail;
  id.probePort = (*d.ports)[p.localNic];
  id.generation = p.generation;
  id.trafficClass = trafficClass;
  ChunkPolicy chunks{d.cfg->minChunkBytes, d.cfg->maxChunkBytes};
  std::string err;
  // Timed like a close (path_up's open_us, transport_slow "open"): it runs on the caller's
  // thread, NCCL's when a failed path is retried. (The verbs transport created the path's CQ
  // and QPs here until they moved to its worker: 3.3 ms median, 69 ms max on the TCG bed.)
  uint64_t t0 = nowUs();
  p.tx = d.transport->openSendPath(p.localNic, p.remote, p.remoteLen, nStreams, id, chunks, &err);
  p.openUs = nowUs() - t0;
  noteSlowCall(p, t0, SlowCall::kOpen);
  if (!p.tx) failPath(p, err, now);
}

// Policy: the connect timeout counts waiting time as the polls saw it (Path::connectWaitedUs,
// tuning::kConnectPollCreditUs): a caller away for seconds gets one poll's credit for the gap,
// and that poll moves the connect on before it is judged. Time spent waiting for a process's
// work with the network's part done (SendPath::connectWaitsOffNetwork at the poll that began
// the gap: the peer's answer to an acknowledged request, this side's RDMA worker) counts
// towards tuning::kConnectOffNetworkMaxUs instead: a late thread is not a network fault
// either. `now` was read before the poll.
void SendLink::advanceConnect(Path& p, uint64_t now) {
  if (now > p.lastConnectPollUs) {
    uint64_t credit = std::min(now - p.lastConnectPollUs, tuning::kConnectPollCreditUs);
    (p.waitsOffNetwork ? p.offNetWaitedUs : p.connectWaitedUs) += credit;
    p.lastConnectPollUs = now;
  }
  std::string err;
  int r = p.tx ? p.tx->connectState(&err) : -1;
  if (r < 0) return failPath(p, p.tx ? err : "path not open", now);
  if (r == 0) {
    p.waitsOffNetwork = p.tx->connectWaitsOffNetwork();
    bool forPeer = p.waitsOffNetwork && p.tx->connectWaitsForPeer();
    if (forPeer && !p.waitsForPeer) p.pairUpWhenAcked = !deps.health || deps.health->pairUp(p.pairId);
    p.waitsForPeer = forPeer;
    uint64_t elapsedMs = (now - std::min(now, p.attemptStartUs)) / 1000;
    if (p.connectWaitedUs > tuning::kConnectTimeoutUs) {
      std::string why = "connect timed out after 3 s";
      if (elapsedMs > tuning::kConnectTimeoutUs / 1000 + 1000)  // the polls came late, or the peer: say so
        why += " of polling (" + std::to_string(elapsedMs) + " ms since the attempt started)";
      failPath(p, why, now);
    } else if (p.connectWaitedUs + p.offNetWaitedUs > tuning::kConnectOffNetworkMaxUs) {
      failPath(p, "connect timed out after " + std::to_string(tuning::kConnectOffNetworkMaxUs / 1000000) +
                      " s: the network delivered the request, but the peer's answer or this host's own bring-up of the "
                      "path did not come (" + std::to_string(elapsedMs) + " ms since the attempt started)",
               now);
    }
    return;
  }
  setPathState(p, PathState::kStandby, "connected, generation " + std::to_string(p.generation));
  p.upSinceUs = now;
  p.restoredUs = now;
  p.backoffMs = 0;
  if (state() == LinkState::kConnecting) setState(LinkState::kWaiting, "first path up: " + describe(p));
  if (Journal* j = deps.journal)
    j->path_up(secret, "send", nicName(deps, p.localNic), addrToString(p.remote), p.generation, p.openUs);
}

void SendLink::failPath(Path& p, const std::string& why, uint64_t now, uint64_t faultSinceUs) {
  const Config& cfg = *deps.cfg;
  // An orderly close by the receiver may surface first as an EOF or a reset on one stream
  // while its CLOSE waits, unread, on another: look before calling it a fault.
  if (!peerClosed()) {
    std::string e;
    if (active >= 0 && &paths[active] == &p && p.tx) readControl(p, now, &e);
    if (!peerClosed()) pollPeerClose(p, now, &e);
  }
  if (peerClosed()) {  // the receiver closed the comm: nothing to report or retry
    onPeerClosed(closedCause);
    return;
  }
  bool wasActive = active >= 0 && &paths[active] == &p;
  bool wasUsable = p.state == PathState::kActive || p.state == PathState::kStandby;
  closePath(p);
  // A usable path failing is a fault (WARN); a failed connect attempt is a retry (INFO).
  setPathState(p, PathState::kFailed, why, wasUsable);
  p.lastError = why;
  uint64_t faultAt = faultSinceUs && faultSinceUs < now ? faultSinceUs : now;
  if (wasUsable && p.failedAtUs && p.restoredUs &&
      (faultAt <= p.restoredUs || faultAt - p.restoredUs < (uint64_t)holdDownOf(p, *deps.cfg) * 1000)) {
    // A flap: a path that had failed before fails again within its hold-down. Grow the
    // hold-down (capped).
    p.flaps++;
    counters.flaps++;
    p.holdDownMs = std::min<uint32_t>(std::max<uint32_t>(holdDownOf(p, *deps.cfg), 1) * 2, cfg.holdDownMaxMs);
    RO_WARN_EVENT("railover: path %s flapped (%u flaps); hold-down now %u ms", describe(p).c_str(), p.flaps, p.holdDownMs);
    if (Journal* j = deps.journal) j->flap(secret, nicName(deps, p.localNic), p.flaps, p.holdDownMs);
  }
  p.failedAtUs = now;
  p.backoffMs = p.backoffMs ? std::min<uint32_t>(p.backoffMs * 2, cfg.backoffMaxMs) : tuning::kFirstBackoffMs;
  p.nextAttemptUs = now + (uint64_t)p.backoffMs * 1000;
  if (wasUsable) {
    // Detection as the engine saw it (active path): from its last data progress to the verdict.
    uint64_t detect = wasActive && now > lastProgressUs_ ? now - lastProgressUs_ : 0;
    if (Journal* j = deps.journal)
      j->path_down(secret, "send", nicName(deps, p.localNic), addrToString(p.remote), why, wasActive, detect);
  }
  if (!wasActive) return;
  active = -1;
  faultUs_ = now;
  failedFrom_ = (int)(&p - &paths[0]);
  counters.lastDetectUs = now > lastProgressUs_ ? now - lastProgressUs_ : 0;
  int next = pickStandby();
  if (next >= 0) {
    activate(next, now, false, switchReason(next));
  } else {
    setState(LinkState::kWaiting, "active path " + describe(p) + " failed (" + why + "); no standby path is usable, retrying",
             true);
    noPathSinceUs = now;
  }
}

std::string SendLink::switchReason(int next) const {
  if (!faultUs_ || failedFrom_ < 0) return "start";
  const Path& from = paths[failedFrom_];
  if (next == failedFrom_) return "recovery: no standby was usable; " + from.lastError;
  return "failover from " + describe(from) + ": " + from.lastError;
}

bool Link::peerGoneOnAllPaths() const {
  if (paths.empty()) return false;
  for (auto& p : paths)
    if (p.state != PathState::kFailed || !peerGoneError(p.lastError)) return false;
  return true;
}

int SendLink::pickStandby() const {
  Health* hl = deps.health;
  auto usable = [&](const Path& p) {
    return p.state == PathState::kStandby && (!hl || (hl->nicUp(p.localNic) && hl->pairUp(p.pairId)));
  };
  const Path& pr = paths[primary];
  uint64_t now = nowUs();
  if (usable(pr) && (pr.failedAtUs == 0 || now - std::min(now, holdDownStartUs(pr, hl)) >= (uint64_t)holdDownOf(pr, *deps.cfg) * 1000))
    return primary;
  // At connect, give the primary a moment to finish before settling for a standby (which
  // would mean a failback right after connect).
  if (active < 0 && counters.resumes == 0 && pr.state == PathState::kConnecting && now - createdUs < tuning::kPrimaryPreferenceAtConnectUs) return -1;
  // Spread comms over the surviving NICs: rotate the start by the comm's secret.
  int n = (int)paths.size();
  for (int k = 0; k < n; ++k) {
    int i = (int)((secret + (uint64_t)k) % (uint64_t)n);
    if (i != primary && usable(paths[i])) return i;
  }
  if (usable(pr)) return primary;
  return -1;
}

void SendLink::activate(int idx, uint64_t now, bool planned, const std::string& why) {
  int old = active;
  Path& p = paths[idx];
  if (old >= 0 && old != idx) {
    // Fence the old path: nothing more is written on it; the receiver fences it on RESUME.
    Path& o = paths[old];
    closePath(o);
    setPathState(o, PathState::kFailed, "fenced: traffic moves to " + describe(p));
    o.nextAttemptUs = now;  // reconnect it at once as a standby
    o.failedAtUs = o.failedAtUs ? o.failedAtUs : now;
    if (planned) o.backoffMs = 0, o.failedAtUs = 0;
  }
  setPathState(p, PathState::kActive, why);
  setState(planned ? LinkState::kFailingBack : LinkState::kResuming, "RESUME on " + describe(p) + ": " + why);
  p.restoredUs = now;
  active = idx;
  // A standby path has nothing queued: the RESUME is the first thing it carries.
  CtlMsg m;
  m.type = CtlType::kResume;
  m.seq = acked_;
  m.arg = p.generation;
  p.tx->sendCtl(m);
  resumeSentUs_ = now;
  resumeFromSeq_ = acked_;
  noPathSinceUs = 0;
  lastProgressUs_ = now;
  burstRequested_ = false;
}

void SendLink::enqueueMsg(const SendReq& r) {
  if (active < 0 || resuming()) return;
  SendPath& tx = *paths[active].tx;
  ChunkRef c;
  c.seq = r.seq, c.total = r.size, c.tag = r.tag, c.mhandle = r.mhandle;
  if (r.size == 0) {
    tx.post(c, r.data);
    return;
  }
  uint64_t cs = tx.chunkBytes(r.size);
  for (uint64_t off = 0; off < r.size; off += cs) {
    c.offset = off;
    c.len = std::min(cs, r.size - off);
    tx.post(c, r.data + off);
  }
}

void SendLink::enqueueFrom(uint64_t seq) {
  for (uint64_t s = std::max(seq, acked_); s < nextSeq_; ++s) enqueueMsg(ring_.at(s));
}

void SendLink::complete(uint64_t upTo) {
  for (uint64_t s = acked_; s < upTo; ++s) ring_.at(s).done = true;
  if (upTo > acked_) acked_ = upTo, lastProgressUs_ = nowUs(), burstRequested_ = false;
}

bool SendLink::readControl(Path& p, uint64_t now, std::string* err) {
  while (true) {
    CtlMsg f;
    int r = p.tx->recvCtl(&f, err);
    if (r < 0) return false;
    if (r == 0) return true;
    if (f.type == CtlType::kAck) {
      if (f.seq > nextSeq_) return *err = "receiver acknowledged a message never sent", false;
      // Whole messages acknowledged over this pair while a full-size probe burst runs on it:
      // the rail carries full-size data, so big probes lost there are congestion. (The stall
      // watch reports this too, but only while the comm is stalled; on a deep saturated queue
      // ACKs come in spurts and the burst can end between two stalls.)
      if (f.seq > acked_) {
        Health* hl = deps.health;
        if (hl && hl->burstActive(p.pairId)) hl->noteDataAcked(p.pairId);
        if (hl) hl->noteDelivered(p.pairId);
      }
      complete(f.seq);
    } else if (f.type == CtlType::kResumeAck && &p == &paths[active] && resuming()) {
      if (f.seq > nextSeq_ || f.seq < acked_) return *err = "RESUME_ACK seq out of range", false;
      onResumeAck(p, f.seq, now);
    } else if (f.type == CtlType::kResumeAck && &p == &paths[active] && state() == LinkState::kPeerClosed) {
      // The receiver answered a RESUME before it closed the comm: what it holds is complete.
      if (f.seq <= nextSeq_) complete(f.seq);
    } else if (f.type == CtlType::kNack) {
      if (f.seq == kNackReasonUnknownComm) {
        notePeerClosed(kNackCause);
        return *err = kNackCause, false;
      }
      return *err = "receiver refused the path (reason " + std::to_string(f.seq) + ")", false;
    } else if (f.type == CtlType::kClose) {
      notePeerClosed(closeCause(f));
      return *err = closeCause(f), false;
    } else if (f.type != CtlType::kResumeAck) {
      return *err = "unexpected " + ctlName(f) + " from receiver", false;
    }
  }
}

void SendLink::onResumeAck(Path& p, uint64_t seq, uint64_t now) {
  uint64_t resent = 0;
  for (uint64_t q = seq; q < nextSeq_; ++q) resent += ring_.at(q).size;
  complete(seq);
  bool failback = state() == LinkState::kFailingBack;
  std::string why = "RESUME_ACK at seq " + std::to_string(seq);
  bool warn = false;
  if (faultUs_ || failback) {
    uint64_t conv = faultUs_ ? now - faultUs_ : now - resumeSentUs_;
    counters.lastConvergeUs = conv;
    counters.bytesResent += resent;
    counters.resumes++;
    // Back on the very path that failed (no standby was usable): a recovery, not a failover.
    bool recovery = !failback && failedFrom_ == active;
    if (failback) counters.failbacks++;
    else if (recovery) counters.recoveries++;
    else counters.failovers++;
    if (Journal* j = deps.journal)
      (j->*(failback ? &Journal::failback : recovery ? &Journal::recover : &Journal::failover))(
          secret, nicName(deps, p.localNic), addrToString(p.remote), seq, resent, conv);
    why = std::string(failback ? "failed back to " : recovery ? "recovered on " : "failed over to ") + describe(p) +
          " at seq " + std::to_string(seq) + " after " + std::to_string(conv) + " us, " + std::to_string(resent) +
          " bytes resent";
    warn = !failback;  // a fault's end is news; a planned failback is routine
  }
  setState(LinkState::kRunning, why, warn);
  enqueueFrom(acked_);
  faultUs_ = 0;
  failedFrom_ = -1;
}

// The slow tick: the failover policy, once per tuning::kSlowTickUs (and at every health
// change), as a sequence of decisions; each acts through the mechanism (failPath, startConnect,
// activate, enterFatal, Health::requestBurst).
void SendLink::slowTick(uint64_t now) {
  lastSlowTickUs = now;
  Health* hl = deps.health;
  if (hl && hl->epoch() != seenEpoch) seenEpoch = hl->epoch();
  if (hl) {
    for (size_t i = 0; i < paths.size(); ++i) {
      Path& p = paths[i];
      PairView v = pairView(p);
      std::string cause = v.cause;
      if (p.state == PathState::kActive && !v.pairUp) {
        if (activePathFails(i, v, now, &cause)) failPath(p, cause, now);
      } else if ((p.state == PathState::kStandby || p.state == PathState::kConnecting) && v.hard) {
        failPath(p, cause, now);
      } else if (p.state == PathState::kConnecting && p.waitsForPeer && p.pairUpWhenAcked && !v.pairUp &&
                 otherPathUsable(i, now, true)) {
        // An attempt waiting for the peer's answer to its acknowledged request keeps waiting
        // through a soft verdict alone: a stopped or late peer process answers neither its
        // probes nor the attempt. But when the pair went down after the acknowledgement and the
        // peer's probes answer on another rail, the peer is alive: this rail lost them, and the
        // answer too, which would be waited for up to tuning::kConnectOffNetworkMaxUs (30 s).
        // Failed now, the attempt is retried with back-off, at once when the pair comes back
        // (restartAfterRepair). Not an attempt waiting on this host's worker (nothing of it is
        // on the rail), nor one that began while the pair was already down (a rail that loses
        // probes but carries TCP, e.g. a probe port filtered: its attempts would all fail).
        failPath(p, cause + "; the peer answers on another rail, so the answer to this connect was lost on this one",
                 now);
      }
      if (repairedSinceSeen(p, v)) restartAfterRepair(p, now);
    }
  }
  for (auto& p : paths) {
    advancePath(p, now);
    decayHoldDown(p, now);
  }
  if (active < 0) {
    int next = pickStandby();
    if (next >= 0) activate(next, now, false, switchReason(next));
    else judgeNoPath(now);
  } else if (failbackDue(now)) {
    activate(primary, now, true, "failback: the primary was healthy for its hold-down");
  }
  stallWatch(now);
  publishIfChanged(true);
}

SendLink::PairView SendLink::pairView(const Path& p) const {
  Health* hl = deps.health;
  PairView v;
  v.nicUp = hl->nicUp(p.localNic), v.pairUp = hl->pairUp(p.pairId);
  v.hard = !v.nicUp || hl->pairHardDown(p.pairId);
  v.cause = !v.nicUp ? "local NIC " + nicName(deps, p.localNic) + " down" : v.pairUp ? "" : hl->pairDownCause(p.pairId);
  return v;
}

// Policy: whether the active path `paths[i]`, whose pair is down (v), fails now. A hard
// verdict (NIC down, peer notice) always; a probe timeout alone may be congestion or a stopped
// peer: only when the path also stopped moving data and another path is healthy, or the
// network is silent too. Appends to *cause what made it fail beyond the pair's cause.
bool SendLink::activePathFails(size_t i, const PairView& v, uint64_t now, std::string* cause) const {
  const Config& cfg = *deps.cfg;
  Health* hl = deps.health;
  const Path& p = paths[i];
  bool idle = acked_ == nextSeq_;
  bool stalled = idle || now - lastProgressUs_ >= (uint64_t)cfg.stallMs * 1000;
  // A slow path is not a stalled one: when every rail is saturated (or rate-limited),
  // probes queue behind data and time out while messages still complete, only slowly.
  // If the peer's kernel acknowledged our bytes within the stall window, data is moving.
  if (stalled && !idle && !v.hard && p.tx && p.tx->peerAckedWithinMs(cfg.stallMs)) stalled = false;
  uint32_t detectMs = cfg.probeIntervalMs * cfg.probeMultiplier;
  // An idle comm (no RESUME awaiting its RESUME_ACK either) has no flow of its own to tell a
  // dead rail from a saturated one by. It stays on a rail that brought this process the peer's
  // data or ACKs (any comm's) within half the detection time: its probes were lost in a queue
  // they share with that traffic (a saturated or rate-limited rail). A dead rail brings nothing
  // once the data that reached this host before the fault is read, and a kept comm that gets
  // work is judged by its own flow again.
  // Seen without it: the e2e rate-limited test (tbf 100 Mbit/s, 50 ms queues both ways) failed
  // over an idle comm in 2 of 20 runs beside two busy loops, the probe answers queued 83 ms.
  if (stalled && idle && !resuming() && !v.hard && hl && hl->pairDeliveredWithinUs(p.pairId, (uint64_t)detectMs * 500))
    stalled = false;
  // Another path that is healthy shows the silence is this rail's, not the peer's. Healthy
  // means answering now (within half the detection time), not merely "not judged down yet":
  // when a peer stops, each rail's peer-wide hold ends at its own last answer, so for a round
  // the active rail can be down while the standby is silent but still up. And not a standby
  // whose NIC or pair came back less than a detection time ago: a stopped peer (SIGSTOP, a
  // debugger) that wakes up answers rail by rail, so the first rail to answer again says
  // nothing about the active one, whose answer is a moment behind. A real fault of the active
  // rail while the others recover is judged once they have answered for a detection time.
  bool otherUsable = otherPathUsable(i, now);
  // The peer's kernel acknowledges nothing either: the network is dead, not the peer
  // process (a stopped process's kernel still acknowledges). That is as good as hard.
  bool netSilent = false;
  if (stalled && !otherUsable && p.tx) netSilent = p.tx->unackedSilenceMs() >= detectMs;
  if (netSilent) *cause += "; the peer acknowledges nothing";
  return v.hard || (stalled && (otherUsable || netSilent));
}

bool Link::otherPathUsable(size_t i, uint64_t now, bool activeCounts) const {
  const Config& cfg = *deps.cfg;
  Health* hl = deps.health;
  if (!hl) return false;
  uint64_t detectUs = (uint64_t)cfg.probeIntervalMs * cfg.probeMultiplier * 1000;
  for (size_t j = 0; j < paths.size(); ++j) {
    const Path& o = paths[j];
    bool connected = o.state == PathState::kStandby || (activeCounts && o.state == PathState::kActive);
    if (j == i || !connected || !hl->nicUp(o.localNic) || !hl->pairUp(o.pairId)) continue;
    if (!hl->pairAnsweredWithinUs(o.pairId, detectUs / 2)) continue;
    uint64_t back = hl->repairedUs(o.localNic, o.pairId);
    if (!back || now >= back + detectUs) return true;
  }
  return false;
}

// Policy: the flow-stall rule. Probes test the rail, not the data's own flow: on RoCE each QP's
// packets take the ECMP route hashed from its UDP source port and its traffic class's queue,
// neither of which the probes share, so a fault there leaves the probes answering while the
// RC retries run for ~30 s. The proof it is the network: the peer's HCA acknowledged nothing
// for RAILOVER_FLOW_STALL_MS with writes in flight (a stopped or busy peer process does not
// stop its HCA's acknowledgements; a late caller is excluded by judging right after the poll,
// with the silence measured up to that poll's start (PathBase::silenceUs: a process stopped
// between its poll and this judgement has completions waiting it has not read), and the
// call-gap rule restarts lastProgressUs_). Needs a usable standby: with none, moving
// gains nothing and the path keeps its retries. Also judged while a RESUME is out (a failback
// onto a flow that is still cut): the peer's HCA acknowledges the RESUME SEND on arrival (its
// receives are pre-posted, its QPs are RTS before its endpoints go back); only the engine's
// RESUME_ACK waits for the receiver's fences, and that is no transport silence.
bool SendLink::flowStalled(size_t i, uint64_t now, std::string* cause, uint64_t* sinceUs) const {
  const Config& cfg = *deps.cfg;
  const Path& p = paths[i];
  // Pending work: unacknowledged data, or a RESUME waiting for its RESUME_ACK (after a
  // failback with every message acknowledged the RESUME is all the path carries; the receiver
  // re-advertises only once it has it, so nothing else would ever be in flight).
  bool resumeOut = state() == LinkState::kResuming || state() == LinkState::kFailingBack;
  if (!cfg.flowStallMs || !p.tx || !p.tx->ackSilenceIsFault() || (acked_ >= nextSeq_ && !resumeOut)) return false;
  uint64_t limitUs = (uint64_t)cfg.flowStallMs * 1000;
  if (now < lastProgressUs_ + limitUs) return false;
  uint32_t silentMs = p.tx->unackedSilenceMs();
  if (silentMs < cfg.flowStallMs || !otherPathUsable(i, now)) return false;
  *sinceUs = now - std::min<uint64_t>(now, (uint64_t)silentMs * 1000);
  *cause = "data flow stalled: no acknowledgement from the peer's transport for " + std::to_string(silentMs) +
           " ms with data in flight while the rail's probes answer (RAILOVER_FLOW_STALL_MS=" +
           std::to_string(cfg.flowStallMs) + ")";
  return true;
}

// A repair of the NIC or pair (it came back up since this path last looked)?
bool SendLink::repairedSinceSeen(Path& p, const PairView& v) {
  uint64_t repaired = deps.health->repairedUs(p.localNic, p.pairId);
  if (!(repaired > std::max(p.repairSeenUs, createdUs) && v.nicUp && v.pairUp)) return false;
  p.repairSeenUs = repaired;
  return true;
}

// After a repair every reconnect starts afresh. A waiting retry runs now, with its back-off
// reset (it grew during the outage); an attempt in progress is restarted, whenever it began:
// its SYN may have been lost, and the kernel would resend it only after its retransmission
// timeout (1 s, 3 s, ...), and a failed late attempt must not wait the grown back-off. Not
// an attempt that waits off the network (SendPath::connectWaitsOffNetwork at its latest poll):
// its request got through.
// An established path (active or standby) is nudged instead (SendPath::nudge): the receiver
// may have dropped its end during the outage, and a sender with nothing to write (RDMA: no
// advertisement came) would otherwise learn it only from the receiver's late FIN, or never.
void SendLink::restartAfterRepair(Path& p, uint64_t now) {
  if (p.state == PathState::kFailed) {
    p.backoffMs = 0;
    p.nextAttemptUs = now;
  } else if (p.state == PathState::kConnecting && !p.waitsOffNetwork) {
    // An attempt whose request the peer's kernel acknowledged (or that waits on this host's
    // worker) sent nothing into the outage: restarting it would throw away the QPs both ends
    // built and wait for the same peer threads again.
    p.backoffMs = 0;
    startConnect(p, now, "restart after the repair of its NIC or pair");
  } else if ((p.state == PathState::kActive || p.state == PathState::kStandby) && p.tx) {
    p.tx->nudge();
  }
}

// Mechanism: moves a connecting path on, retries a failed one when its back-off ran out (and
// its NIC is up), and watches a standby for the receiver's CLOSE or NACK.
void SendLink::advancePath(Path& p, uint64_t now) {
  Health* hl = deps.health;
  if (p.state == PathState::kConnecting) {
    advanceConnect(p, now);
    // The receiver's refusal of a reconnect (NACK: it no longer serves the comm) arrives on the
    // connecting path (the verbs bootstrap reads it where it waits for the endpoint, and reports
    // it only through recvNotice): read it now, as connectStep does at connect, not 3 s later
    // when the connect timeout's failPath looks for the receiver's word.
    std::string err;
    if (p.state == PathState::kConnecting && !peerClosed() && (!pollPeerClose(p, now, &err) || peerClosed()))
      failPath(p, peerClosed() ? closedCause : err, now);
  } else if (p.state == PathState::kFailed && now >= p.nextAttemptUs && (!hl || hl->nicUp(p.localNic))) {
    startConnect(p, now, p.backoffMs ? "retry after a " + std::to_string(p.backoffMs) + " ms back-off" : "reconnect");
  } else if (p.state == PathState::kStandby) {
    std::string err;  // a standby carries nothing from the receiver but a CLOSE or a NACK
    if (!pollPeerClose(p, now, &err) || peerClosed()) failPath(p, peerClosed() ? closedCause : "standby: " + err, now);
  }
}

// Policy (flap damping): a path stable for kHoldDownDecayPeriods hold-downs gets its grown
// hold-down halved again (not below RAILOVER_HOLD_DOWN_MS).
void SendLink::decayHoldDown(Path& p, uint64_t now) {
  const Config& cfg = *deps.cfg;
  if ((p.state == PathState::kStandby || p.state == PathState::kActive) && p.holdDownMs > cfg.holdDownMs &&
      now - std::max(p.restoredUs, p.decayedUs) > tuning::kHoldDownDecayPeriods * p.holdDownMs * 1000) {
    p.holdDownMs = std::max(cfg.holdDownMs, p.holdDownMs / 2);
    p.decayedUs = now;
  }
}

// Policy, with no active path and none usable: start the no-path clock; give up at once when
// every path was refused by the peer's kernel (its process exited), or after
// RAILOVER_FATAL_TIMEOUT with messages unacknowledged.
void SendLink::judgeNoPath(uint64_t now) {
  const Config& cfg = *deps.cfg;
  if (noPathSinceUs == 0) {
    noPathSinceUs = now;
  } else if (pendingSends() && peerGoneOnAllPaths() && !isFatal()) {
    bool refusedAll = true;
    for (auto& p : paths) refusedAll &= p.lastError.find("refused") != std::string::npos;
    if (refusedAll)
      enterFatal("railover: peer " + peerName + " closed the connection on all rails and refuses new ones on every "
                 "NIC: the peer process exited (not a NIC fault)",
                 true);
  } else if (cfg.fatalTimeoutS && now - noPathSinceUs > (uint64_t)cfg.fatalTimeoutS * 1000000 && pendingSends()) {
    std::string nics, causes;
    for (auto& p : paths) {
      nics += (nics.empty() ? "" : ",") + nicWithDevice(deps, p.localNic);
      causes += (causes.empty() ? "" : "; ") + nicName(deps, p.localNic) + ": " + p.lastError;
    }
    enterFatal("railover: no usable path to peer " + peerName + " from NIC(s) " + nics + " for " +
               std::to_string(cfg.fatalTimeoutS) + " s (" + causes + ")");
  }
}

// Policy: fail back to the primary once it is a healthy standby again and its hold-down (from
// its reconnect or the repair of its NIC or pair, whichever is later) has passed.
bool SendLink::failbackDue(uint64_t now) const {
  if (active == primary || resuming()) return false;
  Health* hl = deps.health;
  const Path& pr = paths[primary];
  bool ok = pr.state == PathState::kStandby && (!hl || (hl->nicUp(pr.localNic) && hl->pairUp(pr.pairId)));
  return ok && now - std::min(now, holdDownStartUs(pr, hl)) >= (uint64_t)holdDownOf(pr, *deps.cfg) * 1000;
}

// Stalled-progress watch: data pending but nothing moved for a while -> probe burst. Not
// when the peer's TCP is still acknowledging our bytes: that path is slow (a saturated
// queue), not stalled, and full-size probes lost in that queue are congestion.
void SendLink::stallWatch(uint64_t now) {
  const Config& cfg = *deps.cfg;
  Health* hl = deps.health;
  if (!(active >= 0 && hl && acked_ < nextSeq_ && now - lastProgressUs_ > (uint64_t)cfg.stallMs * 1000)) return;
  int pair = paths[active].pairId;
  bool checkAcks = !burstRequested_ || hl->burstActive(pair);
  // TCP_INFO costs a syscall per stream: on a path that stays slow (saturated, rate-limited)
  // look at most every RAILOVER_STALL_MS / 2 and keep the answer meanwhile.
  uint64_t every = std::max<uint64_t>(500, (uint64_t)cfg.stallMs * 500);
  if (checkAcks && !resuming() && now - ackCheckUs_ >= every) {
    ackCheckUs_ = now;
    ackSeen_ = paths[active].tx && paths[active].tx->peerAckedWithinMs(cfg.stallMs);
  }
  bool tcpAcked = checkAcks && !resuming() && ackSeen_ && now - ackCheckUs_ < every;
  // While any comm's burst runs on this pair, tell the monitor the rail still carries data.
  if (tcpAcked && hl->burstActive(pair)) hl->noteDataAcked(pair);
  if (!burstRequested_ && !tcpAcked) {
    hl->requestBurst(pair);
    burstRequested_ = true;
  }
}

void SendLink::progress(bool fromSweeper) {
  uint64_t now = nowUs();
  Health* hl = deps.health;
  // If we were not called for a while (descheduled, or NCCL busy elsewhere), the network had
  // no chance to show progress: restart the stall clock instead of blaming the path. The
  // sweeper's calls are not the caller coming back (they follow a health change).
  if (!fromSweeper) {
    if (now - lastCallUs_ > (uint64_t)deps.cfg->stallMs * tuning::kCallGapUsPerStallMs) lastProgressUs_ = std::max(lastProgressUs_, now);
    lastCallUs_ = now;
  }
  if (peerClosed()) {  // the receiver closed the comm: only its last ACKs are still read
    drainClosing(now);
    return;
  }
  if (isFatal()) return;  // final: NCCL has the error; nothing reconnects or retries any more
  if (!deregMsg.empty()) return;  // NCCL took a buffer in use away: the comm is being torn down
  if (now - lastSlowTickUs >= tuning::kSlowTickUs || active < 0 || (hl && hl->epoch() != seenEpoch)) slowTick(now);
  for (int guard = 0; guard < 4 && active >= 0; ++guard) {
    Path& p = paths[active];
    std::string err;
    uint64_t t0 = nowUs();
    if (!readControl(p, now, &err)) {
      noteSlowCall(p, t0, SlowCall::kProgress);
      failPath(p, err, now);
      continue;
    }
    // While resuming nothing but the RESUME is queued (enqueueMsg waits for the RESUME_ACK).
    int moved = p.tx->progress(&err);
    noteSlowCall(p, t0, SlowCall::kProgress);
    if (moved < 0) {
      failPath(p, err, now);
      continue;
    }
    if (moved > 0) {
      lastProgressUs_ = nowUs();
    } else {
      std::string cause;
      uint64_t since = 0;
      if (flowStalled((size_t)active, nowUs(), &cause, &since)) {
        failPath(p, cause, now, since);
        continue;
      }
    }
    break;
  }
}

bool SendLink::pollPeerClose(Path& p, uint64_t now, std::string* err) {
  if (!p.tx) return true;
  // The active path's control channel is read by readControl().
  bool withCtl = !(active >= 0 && &paths[active] == &p);
  while (!peerClosed()) {
    CtlMsg f;
    int r = p.tx->recvNotice(withCtl, &f, err);
    if (r < 0) return false;
    if (r == 0) break;
    if (f.type == CtlType::kClose) {
      notePeerClosed(closeCause(f));
    } else if (f.type == CtlType::kNack && f.seq == kNackReasonUnknownComm) {
      notePeerClosed(kNackCause);
    } else if (f.type == CtlType::kNack) {
      return *err = "receiver refused the path (reason " + std::to_string(f.seq) + ")", false;
    } else {
      return *err = "unexpected " + ctlName(f) + " on a path without control traffic", false;
    }
  }
  (void)now;
  return true;
}

void SendLink::onPeerClosed(const std::string& cause) {
  uint64_t now = nowUs();
  if (!closingSinceUs_) closingSinceUs_ = now;
  for (int i = 0; i < (int)paths.size(); ++i) {
    Path& p = paths[i];
    if (p.state == PathState::kClosed) continue;
    // The active path's stream 0 stays open for reading (drainClosing): ACKs the receiver sent
    // before its CLOSE may still be on their way there while the CLOSE already arrived on
    // another stream or rail.
    if (i == active && p.tx && now - closingSinceUs_ < tuning::kCloseDrainUs) continue;
    closePath(p);
    setPathState(p, PathState::kClosed, cause);
    p.lastError = cause;
  }
  if (active >= 0 && paths[active].state == PathState::kClosed) active = -1;
}

void SendLink::drainClosing(uint64_t now) {
  if (active < 0) return;
  Path& p = paths[active];
  std::string err;
  // Ends at the receiver's CLOSE or EOF on this stream (its ACKs come before), or after 1 s.
  if (!readControl(p, now, &err) || now - closingSinceUs_ >= tuning::kCloseDrainUs) {
    closePath(p);
    setPathState(p, PathState::kClosed, closedCause + "; its last ACKs are read");
    p.lastError = closedCause;
    active = -1;
  }
}

bool SendLink::closedVerdict(ncclResult_t* res) {
  if (!peerClosed() || active >= 0) return false;  // still reading ACKs sent before the CLOSE
  // Posting more still succeeds; pending requests fail in test().
  enterFatal("railover: peer " + peerName + " closed the comm with " + std::to_string(nextSeq_ - acked_) +
                 " message(s) not acknowledged (" + closedCause + ")" +
                 (closedCause == kFatalCloseCause ? "" : ": the receiving rank destroyed or aborted its communicator"),
             true);
  *res = fatalResult(fatalMsg, deps.cfg->abortOnFatal);
  return true;
}

int SendLink::connectStep(std::string* why) {
  std::lock_guard<std::mutex> g(mu);
  progress();
  uint64_t now = nowUs();
  // A receiver that closed (or never knew) this connection says so on the paths we opened.
  for (auto& p : paths) {
    if (peerClosed()) break;
    if (p.state != PathState::kConnecting && p.state != PathState::kStandby) continue;
    std::string err;
    if (!pollPeerClose(p, now, &err) && !peerClosed()) failPath(p, err, now);
  }
  if (peerClosed()) {
    onPeerClosed(closedCause);
    *why = closedCause;
    return -1;
  }
  if (isFatal()) {
    *why = fatalMsg;
    return -1;
  }
  // Some path had all streams connected and HELLOs written: the link left CONNECTING.
  return state() != LinkState::kConnecting ? 1 : 0;
}

size_t SendLink::forgetRegistration(void* mhandle) {
  size_t n = 0;
  for (uint64_t s = acked_; s < nextSeq_; ++s) {
    SendReq& r = ring_.at(s);
    if (!r.done && r.mhandle == mhandle) r.mhandle = nullptr, ++n;
  }
  if (n && deregMsg.empty()) {
    deregMsg = "railover: send comm to " + peerName + ": NCCL deregistered a buffer with " + std::to_string(n) +
               " message(s) on it not yet acknowledged; nothing more is sent on this comm";
    RO_INFO(RO_SUBSYS_NET, "%s", deregMsg.c_str());
  }
  return n;
}

bool SendLink::fitsPostedReceive(int32_t tag) {
  if (active < 0 || !paths[active].tx) return false;
  PostedReceive pr;
  if (!paths[active].tx->postedReceive(nextSeq_, &pr)) return false;
  if (pr.n < 1 || pr.n > kMaxRecvs || pr.firstSeq > nextSeq_ || nextSeq_ - pr.firstSeq >= (uint64_t)pr.n) return false;
  // The buffers the messages already placed in this receive took, as the receiver matches
  // them (each the first free buffer with its tag, in seq order), then a free one for `tag`.
  bool taken[kMaxRecvs] = {};
  auto take = [&](int32_t t) {
    for (int i = 0; i < pr.n; ++i)
      if (!taken[i] && pr.tags[i] == t) return taken[i] = true;
    return false;
  };
  for (uint64_t s = pr.firstSeq; s < nextSeq_; ++s)
    if (!take(ring_.at(s).tag)) return false;  // not the receive this engine filled: wait for a newer word
  return take(tag);
}

ncclResult_t SendLink::isend(const void* data, uint64_t size, int tag, void** request, void* mhandle) {
  std::lock_guard<std::mutex> g(mu);
  *request = nullptr;
  if (isFatal() && !fatalPeerGone) return fatalResult(fatalMsg, deps.cfg->abortOnFatal);
  // The slot must be free: acknowledged and seen done by NCCL (shared comms test requests of
  // several connections in their own orders).
  if (nextSeq_ - acked_ >= kSendRing || !ring_.at(nextSeq_).released) {
    progress();
    return ncclSuccess;
  }
  if (matchTags_ && !fitsPostedReceive(tag)) {
    progress();  // takes in what the receiver told since (its advertisements)
    if (!fitsPostedReceive(tag)) {
      // Not placeable yet: NCCL tries again later (a NULL request). The waiting send counts as
      // pending for the no-path verdicts (judgeNoPath), and a comm that can no longer be told
      // anything fails the call instead of leaving NCCL to retry forever.
      deferred_ = true;
      ncclResult_t res;
      if (closedVerdict(&res)) return res;
      if (isFatal()) return fatalResult(fatalMsg, deps.cfg->abortOnFatal);
      if (!deregMsg.empty()) {  // progress() stopped reading the receiver: nothing will fit
        RO_WARN("%s (a send on it was posted after its buffer was deregistered)", deregMsg.c_str());
        return ncclInternalError;
      }
      return ncclSuccess;
    }
  }
  deferred_ = false;
  SendReq& r = ring_.at(nextSeq_);
  r = SendReq();
  r.seq = nextSeq_++;
  r.data = (const uint8_t*)data;
  r.size = size;
  r.tag = tag;
  r.mhandle = mhandle;
  r.released = false;
  r.link = this;
  enqueueMsg(r);
  progress();
  *request = &r;
  return ncclSuccess;
}

ncclResult_t SendLink::test(SendReq* r, int* done, int* size) {
  std::lock_guard<std::mutex> g(mu);
  if (!r->done) progress();
  if (!r->done && !deregMsg.empty()) {
    RO_WARN("%s (a request on it was tested after its buffer was deregistered)", deregMsg.c_str());
    return ncclInternalError;
  }
  ncclResult_t res;
  if (!r->done && closedVerdict(&res)) return res;
  if (isFatal() && !r->done) return fatalResult(fatalMsg, deps.cfg->abortOnFatal);
  *done = r->done ? 1 : 0;
  if (r->done) r->released = true;
  if (r->done && size) *size = (int)r->size;
  return ncclSuccess;
}

void SendLink::close() {
  unlist();  // out of the sweeper's reach before anything is torn down
  std::lock_guard<std::mutex> g(mu);
  if (!peerClosed())
    for (auto& p : paths)
      if ((p.state == PathState::kActive || p.state == PathState::kStandby || p.state == PathState::kConnecting) && p.tx)
        p.tx->sendClose();
  Health* hl = deps.health;
  for (auto& p : paths) {
    closePath(p);
    setPathState(p, PathState::kClosed, "the comm is closed");
    if (hl && p.pairId >= 0) hl->unregisterPair(p.pairId);
  }
  setState(LinkState::kClosed, "closed by NCCL");
}

// ------------------------------------------------------------------------------------------
// RecvLink

RecvLink::RecvLink(const LinkDeps& d, uint64_t s, uint64_t id, int dev) : connId(id), dev_(dev) {
  deps = d;
  secret = s;
  lastSlowTickUs = nowUs();
  list();
}

bool RecvLink::offerStream(std::unique_ptr<Conn>& c, const StreamHello& h, const sockaddr_storage& peer, int localNic) {
  uint64_t now = nowUs();
  std::lock_guard<std::mutex> g(inMu_);
  if (refusing_) return false;
  incoming_.push_back({std::move(c), h, peer, localNic, now});
  return true;
}

void RecvLink::sendCloseOnPaths(uint64_t reason) {
  // This direction carries only whole control frames. The active path first: its ACKs are
  // flushed before any CLOSE leaves on another path (the sender still reads them after it).
  if (active >= 0 && paths[active].rx) paths[active].rx->sendClose(reason);
  for (int i = 0; i < (int)paths.size(); ++i)
    if (i != active && (paths[i].state == PathState::kStandby || paths[i].state == PathState::kConnecting) && paths[i].rx)
      paths[i].rx->sendClose(reason);
}

void RecvLink::onFatal() {
  stopTakingPaths("the recv comm ended in a fatal error");
  if (!fatalPeerGone && !peerClosed()) sendCloseOnPaths(kCloseReasonFatal);
}

void RecvLink::stopTakingPaths(const std::string& why) {
  std::vector<Incoming> queued;
  {
    std::lock_guard<std::mutex> g(inMu_);
    if (refusing_) return;
    refusing_ = true;
    queued.swap(incoming_);
  }
  queued.clear();  // their streams close: each sender fails that attempt
  for (auto& p : paths) {
    if (p.state != PathState::kConnecting) continue;
    closePath(p);  // nothing to fence: no path still connecting has carried data
    setPathState(p, PathState::kClosed, why + "; no new path is taken");
    p.lastError = why;
  }
}

void RecvLink::takeIncoming(uint64_t now) {
  std::vector<Incoming> in;
  {
    std::lock_guard<std::mutex> g(inMu_);
    in.swap(incoming_);
  }
  Health* hl = deps.health;
  for (auto& x : in) {
    const StreamHello& sh = x.hello;
    const PathIdentity& h = sh.id;
    if (h.pathIndex >= kMaxPeerAddrs) continue;  // dropped with x.conn
    if (paths.size() <= h.pathIndex) paths.resize(h.pathIndex + 1);
    Path& p = paths[h.pathIndex];
    p.index = h.pathIndex;
    if (h.generation < p.generation) continue;  // a stale attempt the sender already gave up on
    if (h.generation > p.generation || p.nStreams != sh.nStreams) {
      bool wasActive = active == (int)h.pathIndex;
      closePath(p, &fences_);
      p.generation = h.generation;
      p.nStreams = sh.nStreams;
      p.arrivedUs = 0;
      p.rx = deps.transport->newRecvPathOn(x.localNic, sh.nStreams);
      p.localNic = x.localNic;
      p.rail = h.srcRail;
      p.remote = x.peer;
      // A path first seen is created CONNECTING (no transition); a known one starts over.
      setPathState(p, PathState::kConnecting, "the sender opened generation " + std::to_string(h.generation));
      if (wasActive) {
        active = -1;
        noPathSinceUs = now;
        setState(LinkState::kWaiting, "the sender reconnected the active path " + describe(p));
      }
      p.remoteLen = x.peer.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      p.peerPort = h.probePort;
      p.live.reset();
      p.liveResult = 0;
      if (hl && p.pairId < 0) {
        sockaddr_storage probe = x.peer;
        if (probe.ss_family == AF_INET) ((sockaddr_in&)probe).sin_port = htons(h.probePort);
        else ((sockaddr_in6&)probe).sin6_port = htons(h.probePort);
        p.pairId = hl->registerPair(x.localNic, probe, p.remoteLen);
      }
    }
    if (sh.stream >= sh.nStreams) continue;  // dropped with x.conn
    p.arrivedUs = std::max(p.arrivedUs, x.arrivedUs);
    // A stream of the current generation after the path failed: it waits in a fresh receive
    // side (the path stays failed until the sender opens a new generation).
    if (!p.rx) p.rx = deps.transport->newRecvPathOn(p.localNic, p.nStreams);
    p.rx->adopt(sh.stream, std::move(x.conn));
    pollConnect(p, now);
  }
}

void RecvLink::pollConnect(Path& p, uint64_t now) {
  if (p.state != PathState::kConnecting || !p.rx) return;
  std::string err;
  int r = p.rx->connectState(&err);
  if (r > 0) {
    setPathState(p, PathState::kStandby, "connected, generation " + std::to_string(p.generation));
    if (state() == LinkState::kConnecting) setState(LinkState::kWaiting, "first path up: " + describe(p));
    p.upSinceUs = now;
    if (peerName.empty()) peerName = addrToString(p.remote);
    if (Journal* j = deps.journal)
      j->path_up(secret, "recv", nicName(deps, p.localNic), addrToString(p.remote), p.generation, 0);
  } else if (r < 0) {
    failPath(p, err, now);
  }
}

void RecvLink::failPath(Path& p, const std::string& why, uint64_t now, bool fault) {
  bool wasActive = active >= 0 && &paths[active] == &p;
  if (peerClosed()) {  // the sender closed the comm: nothing to report
    closePath(p, &fences_);
    setPathState(p, PathState::kClosed, closedCause);
    p.lastError = closedCause;
    if (wasActive) active = -1;
    return;
  }
  // The sender closed or reset this path (it fenced it, moved to another path, closed the
  // comm, or its process exited): the sender reports its own faults, and the peer-gone verdict
  // (checkPeerGone) handles an exited process, so this is no fault of ours to report.
  bool bySender = peerGoneError(why);
  bool wasUsable = p.state == PathState::kActive || p.state == PathState::kStandby;
  if (!bySender && wasUsable)
    if (Journal* j = deps.journal)
      j->path_down(secret, "recv", nicName(deps, p.localNic), addrToString(p.remote), why, wasActive, std::nullopt);
  closePath(p, &fences_);
  setPathState(p, PathState::kFailed, bySender ? "closed by the sender: " + why : why, fault && !bySender && wasUsable);
  p.lastError = why;
  p.failedAtUs = now;
  if (wasActive) {
    active = -1;
    noPathSinceUs = now;
    setState(LinkState::kWaiting, "active path " + describe(p) + " failed; waiting for the sender to resume on a standby");
  }
}

void RecvLink::checkPeerGone(uint64_t now) {
  if (active >= 0 || isFatal() || peerClosed() || nextComplete_ >= nextPost_ || paths.empty()) return;
  for (auto& p : paths)
    if (p.state != PathState::kFailed || !peerGoneError(p.lastError) || p.peerPort == 0) return;
  const LinkDeps& d = deps;
  bool allRefused = true;
  for (auto& p : paths) {
    if (p.liveResult == 0 && !p.live && now >= liveNextUs_) {
      // Connect to the sender process's listener on the NIC this path came from.
      sockaddr_storage a = p.remote;
      if (a.ss_family == AF_INET) ((sockaddr_in&)a).sin_port = htons(p.peerPort);
      else ((sockaddr_in6&)a).sin6_port = htons(p.peerPort);
      std::string err;
      p.live = d.transport->connect(p.localNic, a, p.remoteLen, &err);
      p.liveStartUs = now;
      if (!p.live && err.find("refused") != std::string::npos) p.liveResult = -1;
    }
    if (p.live) {
      std::string err;
      int r = p.live->connectState(&err);
      if (r > 0) {
        // The sender process is alive (it will reconnect, e.g. after fencing its paths under
        // congestion): say it was only a liveness check (connId 0) and look again later.
        d.transport->endLivenessCheck(*p.live, &err);
        p.live.reset();
        for (auto& q : paths) q.liveResult = 0, q.live.reset();
        liveNextUs_ = now + tuning::kLivenessRoundUs;
        return;
      }
      if (r < 0) {
        p.live.reset();
        if (err.find("refused") != std::string::npos) p.liveResult = -1;
        else liveNextUs_ = now + tuning::kLivenessRetryUs;  // inconclusive (no route, timeout): try again
      } else if (now - p.liveStartUs > tuning::kLivenessTimeoutUs) {
        p.live.reset();  // no answer at all: a network fault, not evidence either way
      }
    }
    allRefused &= p.liveResult < 0;
  }
  if (!allRefused) return;
  enterFatal("railover: peer " + peerName + " closed the connection on all rails without closing the comm, and its "
             "process refuses connections on every NIC: the peer process exited (not a NIC fault)",
             true);
}

void RecvLink::onResume(int idx, uint64_t fromSeq, uint64_t now) {
  // Fence every other path that carried data: close it, so no stale byte lands later. A
  // transport whose fence can block (RDMA) fences without blocking this thread; the answer
  // waits for it (finishResume).
  bool switched = active != idx && everReady_ && fromSeq > 0;
  for (int j = 0; j < (int)paths.size(); ++j)
    if (j != idx && paths[j].state == PathState::kActive) failPath(paths[j], "fenced by RESUME on " + describe(paths[idx]), now, false);
  // Forget partial progress: the sender resends every incomplete message whole.
  // (A message keeps the buffer its tag chose: the resent copy carries the same tag.)
  for (uint64_t s = nextComplete_; s < nextPost_; ++s) {
    MsgSlot& m = msgs_.at(s);
    if (!m.done) m.got = 0, m.total = UINT64_MAX;
  }
  for (uint64_t s = nextComplete_; s < nextPost_; ++s) msgs_.at(s).ranges.reset();
  if (fromSeq > nextComplete_) {
    enterFatal("railover: protocol error: sender resumed at seq " + std::to_string(fromSeq) + " beyond the receiver's " +
               std::to_string(nextComplete_));
    return;
  }
  resumeWait_.idx = idx;
  resumeWait_.generation = paths[idx].generation;
  resumeWait_.fromSeq = fromSeq;
  resumeWait_.sinceUs = now;
  resumeWait_.switched = switched;
  finishResume(now);
}

void RecvLink::finishResume(uint64_t now) {
  if (resumeWait_.idx < 0) return;
  Path& p = paths[resumeWait_.idx];
  if (p.state != PathState::kStandby || !p.rx || p.generation != resumeWait_.generation) {  // failed or reconnected meanwhile
    resumeWait_ = ResumeWait();
    return;
  }
  ResumeWait& rw = resumeWait_;
  std::string unsafe;
  fences_.erase(std::remove_if(fences_.begin(), fences_.end(),
                               [&rw, &unsafe](const std::shared_ptr<FenceWait>& w) {
                                 if (!w->done.load(std::memory_order_acquire)) return false;
                                 if (unsafe.empty()) unsafe = w->unsafe;
                                 uint64_t end = w->endUs.load(std::memory_order_relaxed);
                                 if (end > rw.sinceUs && end >= rw.fenceEndUs)  // it held the answer back
                                   rw.fenceQueuedUs = w->queuedUs, rw.fenceStartUs = w->startUs.load(std::memory_order_relaxed),
                                   rw.fenceEndUs = end, rw.fenceGrantEndUs = w->grantEndUs.load(std::memory_order_relaxed);
                                 return true;
                               }),
                fences_.end());
  if (!unsafe.empty()) {  // an older path may write into the receive buffers after any answer
    resumeWait_ = ResumeWait();
    enterFatal("railover: " + unsafe + "; its late writes could overwrite data resent on the new path, so the comm " +
               "fails instead of resuming (peer " + peerName + ")");
    return;
  }
  if (!fences_.empty()) return;  // an older path may still write: no answer yet
  uint64_t fromSeq = resumeWait_.fromSeq, waitedUs = now - resumeWait_.sinceUs;
  bool switched = resumeWait_.switched;
  int idx = resumeWait_.idx;
  // Where the wait went (journal `resume`, and the log line below), each part clipped to the
  // RESUME's arrival: until a fence thread started the fence, while it ran, and from its end
  // until the comm's progress saw it. With the fence queued before the RESUME arrived, the three
  // add up to waitedUs; queued later, the rest is before its hand-off. Of the run, the part the
  // fence waited for a grant of remote write already running on the old path (RDMA) before it
  // touched the QPs, clipped the same way (so it is at most the run).
  auto span = [](uint64_t a, uint64_t b) { return a && b > a ? b - a : 0; };
  uint64_t fenceQueueUs = 0, fenceRunUs = 0, fenceToAnswerUs = 0, fenceGrantWaitUs = 0;
  if (waitedUs && rw.fenceQueuedUs && rw.fenceStartUs) {  // waitedUs 0: it ended as this call began, no wait
    uint64_t q = std::max(rw.fenceQueuedUs, rw.sinceUs), st = std::max(rw.fenceStartUs, rw.sinceUs);
    fenceQueueUs = span(q, st), fenceRunUs = span(st, rw.fenceEndUs), fenceToAnswerUs = span(rw.fenceEndUs, now);
    if (rw.fenceGrantEndUs) fenceGrantWaitUs = span(st, std::min(rw.fenceGrantEndUs, rw.fenceEndUs));
  }
  resumeWait_ = ResumeWait();
  std::string why = "RESUME at seq " + std::to_string(fromSeq);
  auto ms = [](uint64_t us) { return std::to_string(us / 1000) + "." + std::to_string(us / 100 % 10); };
  if (waitedUs >= 1000)
    why += " (answered after the old path's fence, " + ms(waitedUs) + " ms: its queue " + ms(fenceQueueUs) +
           " ms, its run " + ms(fenceRunUs) + " ms" +
           (fenceGrantWaitUs ? " (" + ms(fenceGrantWaitUs) + " ms of it waiting for the path's grant of remote write)" : "") +
           ", then " + ms(fenceToAnswerUs) + " ms to the answer)";
  setPathState(p, PathState::kActive, why);
  active = idx;
  noPathSinceUs = 0;
  setState(LinkState::kRunning, "RESUME on " + describe(p) + " at seq " + std::to_string(fromSeq));
  CtlMsg m;
  m.type = CtlType::kResumeAck;
  m.seq = nextComplete_;
  p.rx->sendCtl(m);
  ackSent_ = nextComplete_;
  // A transport that writes into receive buffers learns them on the new path: every posted
  // receive not complete yet (the sender resends from nextComplete_).
  advertiseFrom(p, nextComplete_);
  if (switched) {
    counters.resumes++;
    if (Journal* j = deps.journal)
      j->resume(secret, "recv", nicName(deps, p.localNic), addrToString(p.remote), nextComplete_, waitedUs, fenceQueueUs,
                fenceRunUs, fenceToAnswerUs, fenceGrantWaitUs);
  }
}

// Standby paths carry nothing but a RESUME (or an EOF when the sender drops them).
bool RecvLink::readControl(Path& p, int idx, uint64_t now, std::string* err) {
  // A fatal link reads nothing more: a second RESUME must not be answered after the CLOSE.
  while (p.state == PathState::kStandby && p.rx && !isFatal()) {
    if (resumeWait_.idx == idx) {  // its RESUME waits for the old path's fence
      finishResume(now);
      if (resumeWait_.idx == idx) return true;
      continue;
    }
    CtlMsg m;
    int r = p.rx->recvCtl(&m, err);
    if (r < 0) return false;
    if (r == 0) return true;
    if (m.type == CtlType::kClose) {
      notePeerClosed(kSenderCloseCause);
      return *err = closedCause, false;
    }
    if (m.type != CtlType::kResume) return *err = "unexpected " + ctlName(m) + " on a standby path", false;
    onResume(idx, m.seq, now);
  }
  return true;
}

bool RecvLink::control(const CtlMsg& m, std::string* err) {
  if (m.type == CtlType::kClose) {
    notePeerClosed(kSenderCloseCause);
    return *err = closedCause, false;
  }
  return *err = "unexpected " + ctlName(m) + " on the active path", false;
}

int RecvLink::place(const ChunkRef& f, uint8_t** dst, std::string* err) {
  if (f.seq >= nextPost_) return kHold;  // its receive is not posted yet: leave it with the transport
  MsgSlot& m = msgs_.at(f.seq);
  if (f.seq < nextComplete_ || m.seq != f.seq || m.done) return kDiscard;  // a chunk of a completed message
  RecvReq& r = *m.req;
  if (r.error) return kHold;  // the caller's error is reported by test(); nothing moves
  if (m.idx < 0) {
    // The message's first chunk: pick its buffer. A grouped receive matches tags (the first
    // free buffer with this tag); a single one takes any tag.
    RecvBuf* bs = r.bufs();
    for (int i = 0; i < r.n && m.idx < 0; ++i)
      if (!bs[i].matched && (r.n == 1 || bs[i].tag == f.tag)) m.idx = i;
    if (m.idx < 0) {
      std::string tags;
      for (int i = 0; i < r.n; ++i) tags += (i ? "," : "") + std::to_string(bs[i].tag);
      r.error = true;
      r.errorCode = ncclInternalError;  // the sends do not match the posted receive: the caller's misuse
      usageMsg_ = "railover: peer " + peerName + " sent message " + std::to_string(f.seq) + " with tag " +
                  std::to_string(f.tag) + ", but no free buffer of the grouped receive it belongs to has that tag (tags " +
                  tags + ")";
      return kHold;
    }
    bs[m.idx].matched = true;
  }
  RecvBuf* b = &r.bufs()[m.idx];
  if (f.total > b->cap) {
    r.error = true;
    r.errorCode = ncclInvalidUsage;
    usageMsg_ = "railover: message truncated: peer " + peerName + " sent " + std::to_string(f.total) +
                " bytes but the receive was posted with " + std::to_string(b->cap) + " bytes";
    return kHold;
  }
  if (m.total == UINT64_MAX) m.total = f.total;
  else if (m.total != f.total) return *err = "protocol error: message size changed between chunks", -1;
  if (f.len > 0) {
    // Idempotent accounting: bytes already received are dropped, never counted twice.
    if (m.ranges.covers(f.offset, f.offset + f.len)) return kDiscard;
    if (!m.ranges.admits(f.offset, f.offset + f.len)) return kHold;
    m.ranges.inflight++;
  }
  *dst = b->data + f.offset;  // offset + len <= total <= cap: checked by the transport and above
  return kWrite;
}

void RecvLink::arrived(const ChunkRef& f, bool discarded) {
  if (discarded) {
    counters.dupBytesDropped += f.len;
    return;
  }
  MsgSlot& m = msgs_.at(f.seq);
  if (f.len > 0) {
    if (m.ranges.inflight) m.ranges.inflight--;
    m.got += m.ranges.add(f.offset, f.offset + f.len);
  }
  if (m.got == m.total && !m.done) {
    m.done = true;
    RecvReq& r = *m.req;
    r.bufs()[m.idx].size = m.total;
    r.bufs()[m.idx].nic = active >= 0 ? paths[active].localNic : dev_;  // only the active path delivers
    if (++r.ndone == r.n) r.done = true;
    while (nextComplete_ < nextPost_ && msgs_.at(nextComplete_).done) nextComplete_++;
    while (reqComplete_ < reqPost_ && ring_[reqComplete_ % kRing].done) reqComplete_++;
  }
}

void RecvLink::advertiseFrom(Path& p, uint64_t from) {
  for (uint64_t s = from; s < nextPost_;) {
    MsgSlot& m = msgs_.at(s);
    if (m.done || !m.req) {
      ++s;
      continue;
    }
    RecvReq& r = *m.req;
    const uint64_t end = r.firstSeq + (uint64_t)r.n;
    if (r.error) {  // the caller's error is reported by test(); nothing of it moves any more
      s = end;
      continue;
    }
    // What is left of the request: its messages from s on (the complete ones are a prefix: a
    // transport that needs advertisements delivers messages whole and in seq order) and the
    // buffers no message has taken, in buffer order (the order the engine matches tags in).
    AdvertEntry e[kMaxRecvs];
    int k = 0;
    RecvBuf* bs = r.bufs();
    for (int i = 0; i < r.n; ++i)
      if (!bs[i].matched) e[k++] = AdvertEntry{bs[i].tag, bs[i].data, bs[i].cap, bs[i].mhandle};
    if (k == (int)(end - s)) p.rx->advertise(s, e, k, r.n > 1);
    s = end;
  }
}

// The receiver's slow tick, once per tuning::kSlowTickUs, at every health change and while no
// path is active: the steps below, in order.
void RecvLink::slowTick(uint64_t now) {
  lastSlowTickUs = now;
  takeIncoming(now);
  if (healthChangedSinceSeen()) failPathsDownByHealth(now);
  for (int i = 0; i < (int)paths.size(); ++i) advancePath(i, now);
  checkPeerGone(now);
  judgeNoPath(now);
  publishIfChanged(false);
}

bool RecvLink::healthChangedSinceSeen() {
  Health* hl = deps.health;
  if (!hl || hl->epoch() == seenEpoch) return false;
  seenEpoch = hl->epoch();
  return true;
}

// Bilateral detection: a receiver that sees its side of a path down (its NIC down, or a hard
// pair-down verdict) closes it, so the sender's next write fails at once instead of waiting
// for its own probes. A path the sender connected over the pair after the hard verdict is
// kept: the connection proves the peer's NIC is back, and the verdict is only waiting for our
// next probe (failing it would cost the sender a flap and a doubled hold-down). "After" is
// judged by when the sender's connection arrived, not when this link polled it: a connection
// that arrived before the verdict proves nothing about the NIC since.
void RecvLink::failPathsDownByHealth(uint64_t now) {
  Health* hl = deps.health;
  for (auto& p : paths) {
    if (p.state != PathState::kActive && p.state != PathState::kStandby) continue;
    bool nicDown = !hl->nicUp(p.localNic);
    bool hard = !nicDown && hl->pairHardDown(p.pairId);
    if (hard) {
      uint64_t since = hl->pairHardDownSinceUs(p.pairId);
      if (since && p.arrivedUs > since) hard = false;
    }
    if (nicDown || hard)
      failPath(p, nicDown ? "local NIC " + nicName(deps, p.localNic) + " down" : hl->pairDownCause(p.pairId), now);
  }
}

// Moves a connecting path on (a transport whose paths come up in several steps: RDMA), and
// reads a standby's control channel (a RESUME makes it active; an error fails it).
void RecvLink::advancePath(int i, uint64_t now) {
  Path& p = paths[i];
  pollConnect(p, now);
  if (p.state != PathState::kStandby) return;
  std::string err;
  if (!readControl(p, i, now, &err)) failPath(p, err, now);
}

// No active path for RAILOVER_FATAL_TIMEOUT with receives pending: the link gives up.
void RecvLink::judgeNoPath(uint64_t now) {
  const Config& cfg = *deps.cfg;
  if (!(active < 0 && cfg.fatalTimeoutS && noPathSinceUs && nextComplete_ < nextPost_ &&
        now - noPathSinceUs > (uint64_t)cfg.fatalTimeoutS * 1000000 && !isFatal()))
    return;
  std::string nics;
  for (auto& p : paths) {
    std::string dev = deviceOf(deps, p.localNic);
    nics += (nics.empty() ? "" : ",") + nicName(deps, p.localNic) + " (" + (dev.empty() ? "" : dev + ": ") + p.lastError + ")";
  }
  std::string fence;
  if (resumeWait_.idx >= 0)
    fence = "; the sender's RESUME on " + describe(paths[resumeWait_.idx]) + " waited " +
            std::to_string((now - resumeWait_.sinceUs) / 1000) + " ms for the fence of an older path (its HCA is not "
            "answering)";
  enterFatal("railover: no usable path from peer " + peerName + " on NIC(s) " + nics + " for " +
             std::to_string(cfg.fatalTimeoutS) + " s" + fence);
}

void RecvLink::progress() {
  uint64_t now = nowUs();
  Health* hl = deps.health;
  if (isFatal()) return;  // final: NCCL has the error; nothing reconnects or retries any more
  if (!deregMsg.empty()) return;  // NCCL took a buffer in use away: the comm is being torn down
  if (now - lastSlowTickUs >= tuning::kSlowTickUs || active < 0 || (hl && hl->epoch() != seenEpoch)) slowTick(now);
  if (active < 0) return;
  Path& p = paths[active];
  std::string err;
  uint64_t t0 = nowUs();
  int moved = p.rx ? p.rx->progress(*this, &err) : -1;
  bool ok = moved >= 0;
  noteSlowCall(p, t0, SlowCall::kProgress);
  if (moved > 0 && hl) hl->noteDelivered(p.pairId);  // the peer's data came in over this rail
  if (ok && nextComplete_ > ackSent_) {
    CtlMsg m;
    m.type = CtlType::kAck;
    m.seq = nextComplete_;
    p.rx->sendCtl(m);
    ackSent_ = nextComplete_;
    ok = p.rx->flushCtl(&err) >= 0;
  }
  if (!ok) {
    failPath(p, p.rx ? err : "path not open", now);
  } else if (flowStalled(active, nowUs(), &err)) {
    // Bilateral: the sender may have nothing in flight to see it by (it waits for the
    // advertisements this end cannot get through); closing the path tells it at once.
    failPath(p, err, now);
  }
}

// Policy: the flow-stall rule at the receiver. The flow toward the sender carries this end's
// ACKs, RESUME_ACKs and (RDMA) advertisements; when only that direction is cut, the sender's
// data direction may look fine (its writes are acknowledged, or it has none in flight because
// no advertisement came), so only this end can tell. As at the sender: the sender's HCA
// acknowledges whatever its process does, the silence is read right after this path's poll and
// runs only up to that poll's start (time stopped after it is not the peer's: PathBase::silenceUs),
// and a standby whose pair answers must exist (else closing the path gains nothing).
bool RecvLink::flowStalled(int idx, uint64_t now, std::string* cause) const {
  const Config& cfg = *deps.cfg;
  const Path& p = paths[idx];
  if (!cfg.flowStallMs || !p.rx || !p.rx->ackSilenceIsFault()) return false;
  uint32_t silentMs = p.rx->unackedSilenceMs();
  if (silentMs < cfg.flowStallMs || !otherPathUsable((size_t)idx, now)) return false;
  *cause = "control flow to the sender stalled: no acknowledgement from the peer's transport for " +
           std::to_string(silentMs) + " ms with control messages in flight while the rail's probes answer "
           "(RAILOVER_FLOW_STALL_MS=" + std::to_string(cfg.flowStallMs) + ")";
  return true;
}

bool RecvLink::ready() {
  std::lock_guard<std::mutex> g(mu);
  uint64_t now = nowUs();
  slowTick(now);
  for (auto& p : paths)
    if (p.state == PathState::kStandby || p.state == PathState::kActive) everReady_ = true;
  return everReady_;
}

ncclResult_t RecvLink::irecv(int n, void** data, const uint64_t* caps, const int* tags, void** request,
                             void** mhandles) {
  std::lock_guard<std::mutex> g(mu);
  *request = nullptr;
  lastCallUs_ = nowUs();
  if (isFatal() && !fatalPeerGone) return fatalResult(fatalMsg, deps.cfg->abortOnFatal);
  // Room for the request (NCCL keeps at most 32 untested: 64 slots never reuse one it may
  // still test) and for its n messages.
  // A slot NCCL has not yet seen done is never reused (shared comms test the requests of
  // several connections in their own orders).
  if (reqPost_ - reqComplete_ >= kRing || nextPost_ + (uint64_t)n - nextComplete_ > (uint64_t)kMsgRing ||
      !ring_[reqPost_ % kRing].released) {
    progress();
    return ncclSuccess;
  }
  RecvReq& r = ring_[reqPost_++ % kRing];
  r.released = false;
  r.firstSeq = nextPost_;
  r.n = n;
  r.ndone = 0;
  r.done = r.error = false;
  r.errorCode = ncclSuccess;
  r.link = this;
  if (n > 1 && !r.group) r.group.reset(new RecvBuf[kMaxRecvs]);
  RecvBuf* bs = r.bufs();
  for (int i = 0; i < n; ++i) {
    bs[i] = RecvBuf();
    bs[i].data = (uint8_t*)data[i];
    bs[i].cap = caps[i];
    bs[i].tag = tags ? tags[i] : 0;
    bs[i].mhandle = mhandles ? mhandles[i] : nullptr;
  }
  for (int i = 0; i < n; ++i) {
    MsgSlot& m = msgs_.at(nextPost_);
    m = MsgSlot();
    m.seq = nextPost_++;
    m.req = &r;
  }
  if (active >= 0 && paths[active].rx) advertiseFrom(paths[active], r.firstSeq);
  progress();
  *request = &r;
  return ncclSuccess;
}

size_t RecvLink::forgetRegistration(void* mhandle) {
  size_t n = 0;
  const RecvReq* seen = nullptr;  // a request's messages are consecutive: each request once
  for (uint64_t s = nextComplete_; s < nextPost_; ++s) {
    MsgSlot& m = msgs_.at(s);
    if (!m.req || m.req == seen) continue;
    seen = m.req;
    if (m.req->done) continue;
    RecvBuf* bs = m.req->bufs();
    for (int i = 0; i < m.req->n; ++i)
      if (bs[i].mhandle == mhandle) bs[i].mhandle = nullptr, ++n;
  }
  if (n && deregMsg.empty()) {
    deregMsg = "railover: recv comm from " + peerName + ": NCCL deregistered a buffer of " + std::to_string(n) +
               " receive(s) not yet complete; nothing more is received on this comm";
    RO_INFO(RO_SUBSYS_NET, "%s", deregMsg.c_str());
    stopTakingPaths("NCCL is tearing the recv comm down (a buffer of a receive in progress was deregistered)");
  }
  return n;
}

ncclResult_t RecvLink::test(RecvReq* r, int* done, int* sizes) {
  std::lock_guard<std::mutex> g(mu);
  lastCallUs_ = nowUs();
  if (!r->done && !r->error) progress();
  if (!r->done && !deregMsg.empty()) {
    RO_WARN("%s (a request on it was tested after its buffer was deregistered)", deregMsg.c_str());
    return ncclInternalError;
  }
  if (r->error) {
    RO_WARN("%s", usageMsg_.c_str());
    return r->errorCode;
  }
  if (!r->done && peerClosed() && !isFatal())  // posting more still succeeds; pending requests fail here
    enterFatal("railover: peer " + peerName + " closed the comm with " + std::to_string(nextPost_ - nextComplete_) +
                   " receive(s) incomplete (" + closedCause + "): the sending rank destroyed or aborted its communicator",
               true);
  if (isFatal() && !r->done) return fatalResult(fatalMsg, deps.cfg->abortOnFatal);
  *done = r->done ? 1 : 0;
  if (r->done) r->released = true;
  if (r->done && sizes)
    for (int i = 0; i < r->n; ++i) sizes[i] = (int)r->bufs()[i].size;
  if (r->done) {
    flushReq_ = r, flushMask_ = 0;
    for (int i = 0; i < r->n; ++i) {
      const RecvBuf& b = r->bufs()[i];
      if (b.size > 0 && b.nic >= 0 && b.nic < kMaxFlushNics) flushMask_ |= 1ull << b.nic;
    }
  }
  return ncclSuccess;
}

uint64_t RecvLink::flushNics(const void* data) const {
  if (data && flushReq_ && flushMask_) {
    const RecvReq& r = *flushReq_;
    for (int i = 0; i < r.n; ++i)
      if (r.bufs()[i].data == data && r.bufs()[i].size > 0) return flushMask_;
  }
  int nic = active >= 0 ? paths[active].localNic : dev_;
  return nic >= 0 && nic < kMaxFlushNics ? 1ull << nic : 0;
}

void RecvLink::close() {
  unlist();
  if (deps.registry) deps.registry->unregisterRecvLink(secret, connId);
  std::lock_guard<std::mutex> g(mu);
  takeIncoming(nowUs());  // streams routed here but not yet taken learn of the close too
  if (!peerClosed()) sendCloseOnPaths(isFatal() && !fatalPeerGone ? kCloseReasonFatal : kCloseReasonClosed);
  {
    std::lock_guard<std::mutex> g2(inMu_);
    incoming_.clear();
  }
  Health* hl = deps.health;
  for (auto& p : paths) {
    closePath(p);
    setPathState(p, PathState::kClosed, "the comm is closed");
    if (hl && p.pairId >= 0) hl->unregisterPair(p.pairId);
  }
  setState(LinkState::kClosed, "closed by NCCL");
}

}  // namespace railover
