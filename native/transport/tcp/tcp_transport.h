// TCP implementation of the transport interface: source-bound, non-blocking sockets.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "common/config.h"
#include "common/nic.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/stream_path.h"
#include "transport/transport.h"

namespace railover {

class TcpConn : public Conn {
 public:
  explicit TcpConn(int fd) : fd_(fd) {}
  ~TcpConn() override;
  int connectState(std::string* err) override;
  ssize_t writev(const iovec* iov, int n, std::string* err) override;
  ssize_t read(void* buf, size_t len, std::string* err) override;
  bool dead(std::string* err) override;
  uint32_t unackedSilenceMs() override;
  bool peerAckedWithinMs(uint32_t ms) override;
  bool sentAllAcked() override;
  int fd() const { return fd_; }

 private:
  int fd_;
  bool connected_ = false;
};

namespace tcp {
class Acceptor;
}

class TcpTransport : public StreamTransport {
 public:
  // Streams leave from `nics` (source address and device) with cfg->tcpUserTimeoutMs; both
  // outlive the transport (the runtime's).
  TcpTransport(const std::vector<Nic>* nics, const Config* cfg);
  ~TcpTransport() override;  // closes the listeners and stops the acceptor thread
  std::unique_ptr<Conn> connect(int nic, const sockaddr_storage& remote, socklen_t len, std::string* err) override;
  // One listening socket per NIC and one acceptor thread for all (transport/tcp/acceptor.h),
  // started by the first call.
  bool listen(int nic, const sockaddr_storage& addr, socklen_t len, uint16_t* port, StreamRouter* router,
              std::string* err) override;

 private:
  tcp::StreamTuning tuning() const { return tcp::StreamTuning{cfg_->tcpUserTimeoutMs, cfg_->tcpKeepaliveS}; }
  const std::vector<Nic>* nics_;
  const Config* cfg_;
  std::mutex acceptorMu_;
  std::unique_ptr<tcp::Acceptor> acceptor_;  // created by the first listen(); under acceptorMu_
  StreamRouter* router_ = nullptr;           // the router acceptor_ was made with
};

}  // namespace railover
