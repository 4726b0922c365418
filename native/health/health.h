// Process-wide health of every local NIC and every NIC pair (local NIC, remote NIC), shared by
// all comms of the process (invariant 7): one fault moves every comm on that NIC, once.
//
// Signals: netlink link events (carrier, operstate, admin down) and address events for local
// NICs; BFD-style UDP probes between NIC pairs (interval x detect multiplier) for remote and
// silent faults; NIC-down notices a peer sends over its surviving NICs (bilateral detection);
// probe bursts requested by a comm whose active path stalls.
//
// Threading: one background thread (started at the first init, never stopped: the library
// is linked -z nodelete) owns the sockets. Readers on the data path only load atomics
// (epoch(), pairUp(), nicUp()); registration takes a mutex and happens at connect/accept.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace railover {

struct Config;
struct Nic;

class Health {
 public:
  // Starts the monitor thread for `nics` (whose UDP probe sockets bind the listener ports).
  static void start(const Config& cfg, Nic* nics, int nNics, const uint16_t* ports);
  static Health* get();  // nullptr before start()

  // Changes whenever any NIC or pair changes state; comms re-check their paths when it moves.
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  bool nicUp(int nic) const;
  // A pair is identified by local NIC index and the remote NIC's probe address (IP + port).
  int registerPair(int nic, const sockaddr_storage& remote, socklen_t len);
  void unregisterPair(int id);
  bool pairUp(int id) const;
  // Down for a hard reason (local NIC down, peer's NIC-down notice): no need to confirm with
  // data progress. A soft down (probe timeout) may be congestion or a stopped peer.
  bool pairHardDown(int id) const;
  // Last detection time (µs from the fault signal to "down"), for the journal; 0 if unknown.
  uint64_t pairDownSinceUs(int id) const;
  std::string pairDownCause(int id) const;
  // The active path on this pair made no progress for a while: probe now, with full-size probes.
  void requestBurst(int id);
  // The data path saw a hard error on this pair (socket error): mark it down at once.
  void reportPairError(int id, const char* cause);

  std::atomic<uint64_t> epoch_{1};
};

}  // namespace railover
