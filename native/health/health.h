// Process-wide health of every local NIC and every NIC pair (local NIC, remote NIC), shared by
// all comms of the process (invariant 7): one fault moves every comm on that NIC, once.
//
// Signals: netlink link events (carrier, operstate, admin down) and address events for local
// NICs; transport port events (RDMA: the HCA port behind a NIC in error or ACTIVE); BFD-style UDP probes between NIC pairs (interval x detect multiplier) for remote and
// silent faults; NIC-down notices a peer sends over its surviving NICs (bilateral detection);
// probe bursts requested by a comm whose active path stalls.
//
// Threading: one background thread (started at the first init, never stopped: the library
// is linked -z nodelete; a test's private monitor, startPrivate, stops it) owns the sockets. Readers on the data path only load atomics
// (epoch(), pairUp(), nicUp()); registration takes a mutex and happens at connect/accept.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace railover {

struct Config;
struct Nic;
class Journal;

class Health {
 public:
  virtual ~Health() = default;
  // Starts the monitor thread for `nics` (whose UDP probe sockets bind the listener ports).
  // Its events (NIC and pair verdicts, late wake-ups) go to `journal` (nullptr: none), which
  // must outlive the thread (the runtime's does).
  static void start(const Config& cfg, Nic* nics, int nNics, const uint16_t* ports, Journal* journal);
  // A monitor of the caller's own, not installed as the process-wide one (unit tests of the
  // real monitor over loopback sockets). Same arguments as start(); its thread runs until the
  // returned object is destroyed (which joins it: at most one probe interval).
  static std::unique_ptr<Health> startPrivate(const Config& cfg, Nic* nics, int nNics, const uint16_t* ports,
                                              Journal* journal);
  static Health* get();  // nullptr before start()
  // Replaces the process-wide instance (unit tests install a scripted one).
  static void install(Health* h);

  // Changes whenever any NIC or pair changes state; comms re-check their paths when it moves.
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  virtual bool nicUp(int nic) const = 0;
  // A pair is identified by local NIC index and the remote NIC's probe address (IP + port).
  virtual int registerPair(int nic, const sockaddr_storage& remote, socklen_t len) = 0;
  virtual void unregisterPair(int id) = 0;
  virtual bool pairUp(int id) const = 0;
  // Down for a hard reason (local NIC down, peer's NIC-down notice): no need to confirm with
  // data progress. A soft down (probe timeout) may be congestion or a stopped peer.
  virtual bool pairHardDown(int id) const = 0;
  // While pair `id` is hard down: when the latest hard evidence came (CLOCK_MONOTONIC µs);
  // 0 when it is not hard down (or the view does not know). A path that connected over the
  // pair after this instant shows the verdict is stale (the peer's NIC came back).
  virtual uint64_t pairHardDownSinceUs(int id) const { (void)id; return 0; }
  virtual std::string pairDownCause(int id) const = 0;
  // Pair `id`'s probes were answered within the last `us` µs (a pair still up may be silent:
  // its verdict waits for the detection time, or a peer-wide hold). False before its first
  // answer. Views that do not track answers say true. Thread-safe (one atomic load).
  virtual bool pairAnsweredWithinUs(int id, uint64_t us) const { (void)id, (void)us; return true; }
  // When local NIC `nic` or pair `id` last came back up (CLOCK_MONOTONIC µs; 0 = never was
  // down). A connect attempt that started before this instant sent its SYN into the outage;
  // a standby back for less than a detection time is no proof that a silent active rail is
  // dead (SendLink::activePathFails: a waking peer answers rail by rail).
  virtual uint64_t repairedUs(int nic, int id) const { (void)nic, (void)id; return 0; }
  // When pair `id` last showed a queue (an answer delayed past half the detection time while
  // the same peer answered another rail promptly: congestion, health::answerQueued), as
  // CLOCK_MONOTONIC µs; 0 = never. Failback onto the pair waits a hold-down after it.
  virtual uint64_t queuedUs(int id) const { (void)id; return 0; }
  // The active path on this pair made no progress for a while: probe now, with full-size probes.
  virtual void requestBurst(int id) = 0;
  // A full-size probe burst is requested or running on pair `id` (one atomic load).
  virtual bool burstActive(int id) const { (void)id; return false; }
  // A comm saw the peer's TCP acknowledge its data on pair `id` just now (called while a burst
  // runs): the rail carries data, so lost full-size probes there are congestion, not an MTU
  // black hole. Thread-safe, never blocks.
  virtual void noteDataAcked(int id) { (void)id; }
  // A link on pair `id` just took in something only a working rail brings: the peer's data
  // (a receive path's progress read bytes) or the peer's ACK of a message (a send path). Called
  // on the data path: thread-safe, never blocks (one atomic store).
  virtual void noteDelivered(int id) { (void)id; }
  // Pair `id` brought such a delivery (noteDelivered) within the last `us` µs: the rail carries
  // traffic, so probes lost on it meanwhile were lost in a queue they share with that traffic.
  // Views that do not track deliveries say false (no evidence). Thread-safe (one atomic load).
  virtual bool pairDeliveredWithinUs(int id, uint64_t us) const { (void)id, (void)us; return false; }
  // A peer moved one of its NICs to a new address (its notice): rewrite `remote` (IP + port)
  // to where that NIC is now, so reconnects and probes go there. No-op when unknown.
  virtual void remapRemote(sockaddr_storage* remote) const {}
  // Called (on the health thread) when a local NIC's address changed, so the listener can be
  // re-opened on the new address; set once by the runtime before start().
  static void setAddrChangeHook(void (*hook)(int nic, const sockaddr_storage& addr, socklen_t len));
  // Called (on the thread that changed it) after every epoch change; set once by the runtime
  // to wake the failover sweeper. Must not block.
  static void setEpochHook(void (*hook)());
  // A transport's own view of local NIC `nic` (RDMA: the HCA port behind it went to error, or
  // is ACTIVE again): the NIC counts as up only while the link is up, it has its address, and
  // its transport port is up. `signal` names the event for the journal ("RDMA port error
  // (rxe0 port 1)"). Thread-safe, never blocks: applied by the health thread.
  virtual void transportNicSignal(int nic, bool up, const std::string& signal) { (void)nic, (void)up, (void)signal; }
  // JSON array of every registered NIC pair: [{"nic","peer","up","cause"}] (state file).
  virtual std::string pairsJson() const { return "[]"; }

 protected:
  void bump() {
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    if (notifyHooks_) notifyEpoch();
  }
  static void notifyEpoch();
  std::atomic<uint64_t> epoch_{1};
  bool notifyHooks_ = true;  // false for a private monitor (startPrivate): the epoch and address hooks are the runtime's
};

}  // namespace railover
