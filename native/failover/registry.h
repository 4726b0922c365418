// The links of one runtime and the failover sweeper that drives them. The runtime owns one
// (the plugin's process has exactly one) and hands it to every link and listen comm in
// LinkDeps::registry; a test makes its own, so two runtimes or two tests share no link, no
// listen comm, no routing entry, no counters and no sweeper.
//
// What it holds:
//  * the listed links (Link::list / unlist): what the state file shows (forEach) and what the
//    sweeper drives;
//  * the routing of accepted streams: recv links by (secret, connection id), open listen comms
//    by secret (route(), the transport's StreamRouter);
//  * the counters of links already destroyed (closedTotals: lifetime totals = live + these);
//  * whether the state file is stale (markDirty / takeDirty);
//  * the NICs whose lack of a standby path was already warned about (once per NIC).
//
// Threads: NCCL's service thread (connect, accept, close: list, unlist, Listener), its progress
// thread (a link publishing a snapshot: markDirty), the transport's acceptor thread (route), the
// state-file writer (forEach, closedTotals, takeDirty), the sweeper thread (sweep, sweepIdle),
// and whichever thread changes the health epoch (notifySweeper, the Health epoch hook). Every
// public member is thread-safe and never blocks on a link: the sweeps only try a link's mutex.
// Lock order: the routing lock before the link-list lock (a recv link created by route() lists
// itself); a link's mutex is only tried under the link-list lock, never waited for.
//
// Lifetime: the registry must outlive every link and Listener handed it (they unlist
// themselves in close() and in their destructors) and every thread that calls it. The
// sweeper thread runs from startSweeper() until stopSweeper() or the destructor, which stop it
// and wait for it to end: no sweep runs once either returns. The plugin's runtime is never
// destroyed (the library is -z nodelete), so its sweeper runs until the process exits.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "failover/link.h"
#include "transport/transport.h"

namespace railover {

class LinkRegistry : public StreamRouter {
 public:
  LinkRegistry() = default;
  ~LinkRegistry() override;  // stops the sweeper (waits for it)
  LinkRegistry(const LinkRegistry&) = delete;
  LinkRegistry& operator=(const LinkRegistry&) = delete;

  // ---- listed links ----
  void add(Link* l);     // lists `l` (again: no effect)
  void remove(Link* l);  // unlists `l` (not listed: no effect)
  // Unlists `l`, which is being destroyed, and adds its counters to the closed totals.
  void retire(Link* l);
  // Runs `fn` on every listed link, under the link-list lock (fn must not list or unlist).
  void forEach(const std::function<void(Link&)>& fn);
  size_t size();  // links listed now
  // Counters of the links destroyed so far; *fatals (if set): how many of them went fatal.
  LinkCounters closedTotals(uint64_t* fatals);
  // The state file is stale: a link published a new snapshot or was destroyed.
  void markDirty() { dirty_.store(true, std::memory_order_release); }
  // Whether it was stale, clearing the mark (the state-file writer). Starts true.
  bool takeDirty() { return dirty_.exchange(false, std::memory_order_acq_rel); }

  // ---- the failover sweeper ----
  // One pass over every listed link (Link::sweep); returns how many are not settled. Tests
  // without the sweeper thread call it directly.
  size_t sweep();
  // One idle pass (Link::idleSweep) over every listed link; the sweeper runs it every
  // tuning::kIdleSweepMs, tests call it directly.
  void sweepIdle();
  // Starts the sweeper thread (a second call while it runs: no effect): for up to
  // tuning::kSweeperWindowUs after every notifySweeper() it runs sweep() every
  // tuning::kSweeperPassMs until every link is settled (a new notice extends the window);
  // otherwise sweepIdle() every tuning::kIdleSweepMs. Convergence of many comms then does not
  // wait for NCCL to come round to each of them.
  void startSweeper();
  // Stops the sweeper thread and waits for it to end (not started: no effect). Not from the
  // sweeper thread itself (a link's sweep never calls it).
  void stopSweeper();
  bool sweeperRunning() const { return sweeperOn_.load(std::memory_order_acquire); }
  // The health epoch moved (the Health epoch hook): wakes the sweeper for a window of sweeps.
  // No effect while the sweeper is not running. Never blocks beyond a short lock.
  void notifySweeper();

  // ---- routing of accepted streams ----
  // StreamRouter: hands a validated stream to the recv link of its (secret, connection id),
  // creating the link (with the listen comm's LinkDeps) when a listen comm with that secret is
  // open here and the id is new. Returns false and leaves `c` with the caller (who answers
  // NACK(kNackReasonUnknownComm) and drops it) when neither exists, or for a liveness check
  // (connection id 0). Called by the transport's acceptor thread (tests: their pump()).
  bool route(std::unique_ptr<Conn>& c, const StreamHello& h, const sockaddr_storage& peer, int localNic) override;
  // A recv link is closing: streams of (secret, connId) are no longer routed to it.
  void unregisterRecvLink(uint64_t secret, uint64_t connId);

  // True the first time it is asked for NIC `dev`: a comm from it has no standby path, to be
  // said once per NIC.
  bool firstNoStandbyWarning(int dev);
  // True the first time it is asked for local NIC `nic` and PairingNote `kind`: a pairing that
  // does not match the peer's rails is said once per NIC and kind, not once per comm.
  bool firstPairingWarning(int nic, int kind);

 private:
  friend class Listener;  // registers itself, and keeps its fresh links under routeMu_
  void runSweeper();

  // Listed links, and the counters of destroyed ones.
  std::mutex linksMu_;
  std::vector<Link*> links_;
  LinkCounters closed_;
  uint64_t closedFatals_ = 0;
  std::atomic<bool> dirty_{true};

  // Routing (lock order: routeMu_ before linksMu_).
  std::mutex routeMu_;
  std::map<std::pair<uint64_t, uint64_t>, RecvLink*> recvLinks_;  // by (secret, connection id)
  std::unordered_map<uint64_t, Listener*> listeners_;             // open listen comms by secret

  // The sweeper.
  std::mutex sweepMu_;
  std::condition_variable sweepCv_;
  uint64_t kicks_ = 0;  // notifySweeper() calls so far (under sweepMu_)
  bool stop_ = false;   // under sweepMu_
  std::thread sweeper_;
  std::atomic<bool> sweeperOn_{false};

  std::mutex warnMu_;
  std::vector<int> warnedNoStandby_;
  std::vector<std::pair<int, int>> warnedPairing_;  // (nic, kind) said
};

}  // namespace railover
