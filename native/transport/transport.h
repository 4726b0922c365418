// The transport interface the failover engine runs on: a path is N byte-stream connections
// (`Conn`) between a local NIC and a remote NIC. TCP implements it today (tcp/); an RDMA
// verbs transport would implement the same calls with receiver-advertised buffers, per-NIC
// memory keys and writes-with-immediate carrying the seq (see docs/DESIGN.md), and the
// engine's sequencing, acknowledgement and resume logic stays as it is.
//
// Every call is non-blocking. Thread-safety: a Conn is used by one thread at a time (its
// link's mutex holder).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>

#include <memory>
#include <string>

namespace railover {

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
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Opens one stream from local NIC `nic` to `remote`. nullptr with *err when it cannot start.
  virtual std::unique_ptr<Conn> connect(int nic, const sockaddr_storage& remote, socklen_t len, std::string* err) = 0;
};

// Writes all of `len` bytes if the connection takes them at once (for small control
// frames); returns false on error or a short write.
bool writeAll(Conn& c, const void* buf, size_t len, std::string* err);

}  // namespace railover
