// The links of one runtime, their routing and the failover sweeper (see registry.h).
#include "failover/registry.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>

#include "common/clock.h"
#include "common/log.h"
#include "common/nic.h"
#include "common/tuning.h"

namespace railover {

LinkRegistry::~LinkRegistry() { stopSweeper(); }

// ------------------------------------------------------------------------------------------
// Listed links

void LinkRegistry::add(Link* l) {
  std::lock_guard<std::mutex> g(linksMu_);
  if (std::find(links_.begin(), links_.end(), l) == links_.end()) links_.push_back(l);
}

void LinkRegistry::remove(Link* l) {
  std::lock_guard<std::mutex> g(linksMu_);
  links_.erase(std::remove(links_.begin(), links_.end(), l), links_.end());
}

void LinkRegistry::retire(Link* l) {
  {
    std::lock_guard<std::mutex> g(linksMu_);
    links_.erase(std::remove(links_.begin(), links_.end(), l), links_.end());
    const LinkCounters& c = l->counters;
    closed_.failovers += c.failovers, closed_.failbacks += c.failbacks;
    closed_.flaps += c.flaps, closed_.bytesResent += c.bytesResent;
    closed_.recoveries += c.recoveries, closed_.resumes += c.resumes;
    closedFatals_ += !l->fatalMsg.empty();  // it went fatal (it may be closed since)
  }
  markDirty();
}

void LinkRegistry::forEach(const std::function<void(Link&)>& fn) {
  std::lock_guard<std::mutex> g(linksMu_);
  for (Link* l : links_) fn(*l);
}

size_t LinkRegistry::size() {
  std::lock_guard<std::mutex> g(linksMu_);
  return links_.size();
}

LinkCounters LinkRegistry::closedTotals(uint64_t* fatals) {
  std::lock_guard<std::mutex> g(linksMu_);
  if (fatals) *fatals = closedFatals_;
  return closed_;
}

bool LinkRegistry::firstNoStandbyWarning(int dev) {
  std::lock_guard<std::mutex> g(warnMu_);
  if (std::find(warnedNoStandby_.begin(), warnedNoStandby_.end(), dev) != warnedNoStandby_.end()) return false;
  warnedNoStandby_.push_back(dev);
  return true;
}

bool LinkRegistry::firstPairingWarning(int nic, int kind) {
  std::lock_guard<std::mutex> g(warnMu_);
  auto key = std::make_pair(nic, kind);
  if (std::find(warnedPairing_.begin(), warnedPairing_.end(), key) != warnedPairing_.end()) return false;
  warnedPairing_.push_back(key);
  return true;
}

// ------------------------------------------------------------------------------------------
// The failover sweeper

size_t LinkRegistry::sweep() {
  std::lock_guard<std::mutex> g(linksMu_);
  size_t unsettled = 0;
  for (Link* l : links_) unsettled += l->sweep() ? 0 : 1;
  return unsettled;
}

void LinkRegistry::sweepIdle() {
  uint64_t now = nowUs();
  std::lock_guard<std::mutex> g(linksMu_);
  for (Link* l : links_) l->idleSweep(now);
}

void LinkRegistry::notifySweeper() {
  if (!sweeperOn_.load(std::memory_order_acquire)) return;
  {
    std::lock_guard<std::mutex> g(sweepMu_);
    kicks_++;
  }
  sweepCv_.notify_one();
}

void LinkRegistry::startSweeper() {
  std::lock_guard<std::mutex> g(sweepMu_);
  if (sweeper_.joinable()) return;
  stop_ = false;
  sweeper_ = std::thread([this] { runSweeper(); });
  sweeperOn_.store(true, std::memory_order_release);
}

void LinkRegistry::stopSweeper() {
  std::thread t;
  {
    std::lock_guard<std::mutex> g(sweepMu_);
    stop_ = true;
    t = std::move(sweeper_);
  }
  sweepCv_.notify_all();
  if (t.joinable()) t.join();
  sweeperOn_.store(false, std::memory_order_release);
}

void LinkRegistry::runSweeper() {
  // Like the health thread: best effort ahead of busy-polling threads, silently normal
  // without privilege.
  setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), tuning::kHelperThreadNice);
  uint64_t seen = 0;
  auto woken = [&] { return stop_ || kicks_ != seen; };  // under sweepMu_
  while (true) {
    {
      std::unique_lock<std::mutex> lk(sweepMu_);
      bool kicked = sweepCv_.wait_for(lk, std::chrono::milliseconds(tuning::kIdleSweepMs), woken);
      if (stop_) return;
      seen = kicks_;
      if (!kicked) {
        lk.unlock();
        sweepIdle();
        continue;
      }
    }
    uint64_t until = nowUs() + tuning::kSweeperWindowUs;
    while (sweep() > 0 && nowUs() < until) {
      std::unique_lock<std::mutex> lk(sweepMu_);
      // Next pass in 1 ms, or at once when health changes again (which extends the window).
      if (sweepCv_.wait_for(lk, std::chrono::milliseconds(tuning::kSweeperPassMs), woken)) {
        if (stop_) return;
        seen = kicks_;
        until = nowUs() + tuning::kSweeperWindowUs;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Routing of accepted streams to recv links

void LinkRegistry::unregisterRecvLink(uint64_t secret, uint64_t connId) {
  std::lock_guard<std::mutex> g(routeMu_);
  recvLinks_.erase({secret, connId});
}

// A comm lives on its NIC's kind (Transport::nicTransport: in the RDMA transport's mixed mode
// some NICs are served over TCP). A stream of the comm that arrives on a NIC of another kind
// (a peer that did not take the addresses from the comm's handle: stale, buggy or hostile)
// would get a receive side of the wrong kind, half-connected and never failing; it is closed
// instead (the sender sees the path fail and retries).
static bool otherKind(const LinkDeps& d, int dev, int localNic, const sockaddr_storage& peer) {
  if (!d.transport || std::strcmp(d.transport->nicTransport(dev), d.transport->nicTransport(localNic)) == 0) return false;
  // A WARN the first time (a peer that keeps retrying would repeat it every few seconds), INFO after.
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    RO_WARN("railover: a stream from %s for a %s comm arrived on NIC %d, which is served by %s: closed",
            addrToString(peer).c_str(), d.transport->nicTransport(dev), localNic, d.transport->nicTransport(localNic));
  else
    RO_INFO(RO_SUBSYS_NET, "railover: a stream from %s for a %s comm arrived on NIC %d, which is served by %s: closed",
            addrToString(peer).c_str(), d.transport->nicTransport(dev), localNic, d.transport->nicTransport(localNic));
  return true;
}

bool LinkRegistry::route(std::unique_ptr<Conn>& c, const StreamHello& sh, const sockaddr_storage& peer, int localNic) {
  const PathIdentity& h = sh.id;
  if (h.connId == 0) return false;  // a liveness check: the caller drops it quietly
  std::lock_guard<std::mutex> g(routeMu_);
  auto it = recvLinks_.find({h.secret, h.connId});
  if (it != recvLinks_.end()) {
    if (otherKind(it->second->deps, it->second->dev(), localNic, peer)) {
      c.reset();
      return true;
    }
    return it->second->offerStream(c, sh, peer, localNic);  // false: the link ended (NACK)
  }
  auto lt = listeners_.find(h.secret);
  if (lt == listeners_.end()) return false;
  Listener* L = lt->second;
  if (otherKind(L->deps_, L->dev, localNic, peer)) {
    c.reset();
    return true;
  }
  // A connection whose recv link was closed is not re-created by a late reconnect.
  if (!L->open_ || std::find(L->seen_.begin(), L->seen_.end(), h.connId) != L->seen_.end()) return false;
  L->seen_.push_back(h.connId);
  auto* l = new RecvLink(L->deps_, h.secret, h.connId, L->dev);
  recvLinks_[{h.secret, h.connId}] = l;
  L->fresh_.push_back(l);
  return l->offerStream(c, sh, peer, localNic);  // a new link takes it
}

// ------------------------------------------------------------------------------------------
// Listener (its bookkeeping lives under the registry's routing lock)

Listener::Listener(const LinkDeps& deps, uint64_t s, int d) : secret(s), dev(d), deps_(deps), reg_(*deps.registry) {
  std::lock_guard<std::mutex> g(reg_.routeMu_);
  reg_.listeners_[secret] = this;
}

RecvLink* Listener::accept() {
  std::vector<RecvLink*> cand;
  {
    std::lock_guard<std::mutex> g(reg_.routeMu_);
    cand = fresh_;
  }
  for (RecvLink* l : cand) {
    if (!l->ready()) continue;
    std::lock_guard<std::mutex> g(reg_.routeMu_);
    fresh_.erase(std::find(fresh_.begin(), fresh_.end(), l));
    return l;
  }
  return nullptr;
}

void Listener::close() {
  std::vector<RecvLink*> unaccepted;
  {
    std::lock_guard<std::mutex> g(reg_.routeMu_);
    open_ = false;
    reg_.listeners_.erase(secret);
    unaccepted.swap(fresh_);
  }
  // Their senders learn it from the CLOSE (their connect fails with that cause).
  for (RecvLink* l : unaccepted) {
    l->close();
    delete l;
  }
}

}  // namespace railover
