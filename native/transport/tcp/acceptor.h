// The TCP transport's listeners and acceptor thread: one listening socket per NIC (bound to
// the NIC's address and device), every accepted stream read until its 32-byte HELLO
// (transport/tcp/wire.h) and handed to the engine's StreamRouter (transport/transport.h).
// The RDMA transport's bootstrap streams arrive through the same acceptor (their HELLO is the
// same 32 bytes).
//
// What is dropped, each with one WARN "railover: dropping connection from <peer> on NIC
// <name>: <reason>", the listener working on:
//  * a stream closed before 32 bytes ("closed before a complete HELLO (truncated HELLO)");
//  * 32 bytes that are not a HELLO of this protocol version ("bad HELLO: <decodeHello's cause>");
//  * a stream silent for the HELLO deadline ("no HELLO within 5 s"), noticed at most
//    `waitMs` late;
//  * a socket error while reading the HELLO (the errno text).
// A stream with a valid HELLO that no comm owns (the router returns false) is answered with
// NACK(kNackUnknownComm) and closed (one INFO "refusing connection ..."); a liveness check
// (connection id 0) is closed without a word.
//
// Thread-safety: listen() from any thread (init, the health thread when a NIC moves); the
// router is called from the acceptor's own thread only. The destructor stops the thread and
// closes every socket the acceptor holds (listeners and streams still waiting for a HELLO).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/tuning.h"
#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace railover {
namespace tcp {

class Acceptor {
 public:
  // `nicNames`: interface name per NIC index (listeners are bound to that device; names appear
  // in the log lines). Accepted streams get the data-stream options `tuning` (TCP_USER_TIMEOUT,
  // keepalive: tuneStream). A stream must complete its HELLO within
  // `helloTimeoutUs` (µs); the thread sleeps at most `waitMs` (ms) between deadline checks.
  // `router` outlives the acceptor.
  Acceptor(std::vector<std::string> nicNames, StreamTuning tuning, StreamRouter* router,
           uint64_t helloTimeoutUs = tuning::kHelloTimeoutUs, int waitMs = tuning::kAcceptorWaitMs);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Opens NIC `nic`'s listener at `addr` on *port (0 = ephemeral; the bound port is written
  // back) and starts accepting on it; a listener the NIC had before is closed (after the
  // acceptor's current batch of events). False with *err when the socket cannot be opened or
  // bound (the old listener then stays).
  bool listen(int nic, const sockaddr_storage& addr, socklen_t len, uint16_t* port, std::string* err);
  // False when the acceptor's epoll or eventfd could not be created (*err set by listen then).
  bool ok() const { return ep_ >= 0 && wakeFd_ >= 0; }

 private:
  void loop();
  void wake();
  const std::vector<std::string> names_;
  const StreamTuning tuning_;
  StreamRouter* const router_;
  const uint64_t helloTimeoutUs_;
  const int waitMs_;
  int ep_ = -1;
  int wakeFd_ = -1;
  std::mutex mu_;
  std::vector<std::pair<int, int>> newListeners_;  // (nic, fd) not yet in the epoll set; under mu_
  bool stop_ = false;                              // under mu_
  std::thread thread_;
};

}  // namespace tcp
}  // namespace railover
