// Thin POSIX socket helpers for the TCP transport: non-blocking, source-bound sockets.
//
// Every socket railover opens on a NIC (data streams, listeners here; the health monitor's
// probe sockets) is bound to that NIC's address and to its device (common/nic_socket.h), so
// its traffic leaves through that NIC whatever the routing table says. A connection is
// re-bound on every reconnect (each attempt is a new socket).
// Thread-safety: stateless functions on file descriptors the caller owns.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

namespace railover {
namespace tcp {

// Creates a non-blocking listening TCP socket on `addr` (port 0 = ephemeral), bound to device
// `ifname` when not empty (accepted streams inherit it, so their replies leave through that
// NIC). Returns the fd (and the bound port in *port), or -1 with `err` set.
int listenOn(const sockaddr_storage& addr, socklen_t len, uint16_t* port, std::string* err,
             const std::string& ifname = std::string());
// Options of every data stream (and RDMA bootstrap stream), from the parameter table.
//  userTimeoutMs: TCP_USER_TIMEOUT (ms; 0 = the kernel's default): how long written data may
//    stay unacknowledged before the kernel gives the connection up (a backstop to the probes).
//  keepaliveS: idle time (s; 0 = off) after which the kernel sends a keepalive, and again each
//    keepaliveS while the stream stays idle. Its purpose is not liveness (the probes judge
//    that) but a stream whose other end vanished without a FIN or RST reaching us (its host
//    dropped the socket during an outage: TCP_USER_TIMEOUT, a crash): the peer's kernel answers
//    the keepalive with a reset, so an end with nothing to write learns it within keepaliveS of
//    the network working again instead of waiting for ever (docs/DESIGN.md, "Streams the peer
//    dropped silently"). A stopped peer's kernel still answers: no false failure. TCP_KEEPCNT
//    is left to the kernel (net.ipv4.tcp_keepalive_probes, 9): with userTimeoutMs 0, an idle
//    stream whose peer stays unreachable is ended after about 10 x keepaliveS.
struct StreamTuning {
  uint32_t userTimeoutMs = 0;
  uint32_t keepaliveS = 0;
};

// Starts a non-blocking connect from `src` (port 0) on interface `ifname` to `dst`.
// Returns the fd, or -1 with `err` (the connect itself completes later: see connectDone).
int startConnect(const sockaddr_storage& src, socklen_t srcLen, const std::string& ifname,
                 const sockaddr_storage& dst, socklen_t dstLen, const StreamTuning& tuning, std::string* err);
// 1 = connected, 0 = still in progress, -1 = failed (errno-style reason in *err).
int connectDone(int fd, std::string* err);
// Applies the data-stream options: TCP_NODELAY, TCP_USER_TIMEOUT, and TCP keepalive when
// tuning.keepaliveS > 0 (SO_KEEPALIVE, TCP_KEEPIDLE = TCP_KEEPINTVL = keepaliveS).
void tuneStream(int fd, const StreamTuning& tuning);
void setNonBlocking(int fd);

// Non-blocking send/recv wrappers: return bytes moved (>= 0), 0 when it would block, or -1 on
// a connection error (reason in *err; "closed by peer" for EOF on recv).
ssize_t sendSome(int fd, const void* buf, size_t len, std::string* err);
ssize_t recvSome(int fd, void* buf, size_t len, std::string* err);

}  // namespace tcp
}  // namespace railover
