// A fault-injecting fake transport and a scripted health view, for deterministic tests of the
// failover engine (path state machine, resume, exactly-once delivery) without sockets.
//
// Each connection is a pair of in-memory byte pipes. A "wire" groups every connection opened
// from one local NIC to one remote address (one NIC pair) and carries the faults:
//   drop      bytes written vanish (a black hole: writes still succeed)
//   broken    every read/write on both ends fails (a reset)
//   stalled   writes take nothing (full socket buffer)
//   maxWrite  at most this many bytes per write toward the receiver (partial writes)
//   refuse    new connections fail as the network would (no route to host)
//   peerGone  new connections are refused by the peer's kernel (its process exited)
//   silentClose  a server end's close never reaches the client (its FIN was lost with its NIC
//             and its socket reaped): the client sees nothing until it writes, and then a
//             reset, as a real kernel answers a byte for a socket it no longer has
#pragma once

#include <arpa/inet.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/clock.h"
#include "failover/link.h"
#include "health/health.h"
#include "plugin/devices.h"
#include "transport/tcp/stream_path.h"
#include "transport/transport.h"
#include "tests/scripted_health.h"

namespace railover {
namespace fake {

struct Wire {
  bool drop = false, broken = false, stalled = false, refuse = false, peerGone = false;
  bool silentClose = false;  // see above
  bool hangConnect = false;  // connects started now never complete (their SYN is lost)
  bool peerAcks = false;     // the peer's transport still acknowledges bytes (a slow, not dead, link)
  int hangFrom = INT32_MAX;  // connects after the first `hangFrom` on this wire never complete
  int connects = 0;          // connections opened on this wire
  size_t maxWrite = SIZE_MAX;
  uint64_t bytes = 0;  // payload bytes written toward the receiver
};

struct Pipe {
  std::deque<uint8_t> q;
  bool closed = false;
  bool gone = false;   // the reading end was closed silently (Wire::silentClose)
  bool reset = false;  // the writer's next read sees a reset (it wrote into a `gone` pipe)
};

class FakeConn : public Conn {
 public:
  FakeConn(std::shared_ptr<Pipe> out, std::shared_ptr<Pipe> in, std::shared_ptr<Wire> w, bool toReceiver)
      : out_(out), in_(in), wire_(w), toReceiver_(toReceiver),
        hangs_(toReceiver && (w->hangConnect || w->connects > w->hangFrom)) {}
  ~FakeConn() override {
    if (wire_->silentClose && !toReceiver_) {
      in_->gone = true;
      return;
    }
    out_->closed = true;
    in_->closed = true;
  }
  int connectState(std::string* err) override {
    if (wire_->broken) return *err = "connection reset (fake)", -1;
    return hangs_ ? 0 : 1;
  }
  bool peerAckedWithinMs(uint32_t) override { return toReceiver_ && wire_->peerAcks; }
  // What the peer's kernel would have acknowledged: every byte, once connected, unless the wire
  // or the connection drops, stalls or broke.
  bool sentAllAcked() override {
    return !hangs_ && !timedOut && !stalled && !in_->reset && !wire_->broken && !wire_->stalled &&
           !(wire_->drop && toReceiver_);
  }
  ssize_t writev(const iovec* iov, int n, std::string* err) override {
    if (timedOut) return *err = "Connection timed out (fake)", -1;
    if (in_->reset) return *err = "Connection reset by peer (fake)", -1;
    if (out_->gone) {  // the bytes leave; the peer's kernel answers them with a reset
      in_->reset = true;
      size_t done = 0;
      for (int i = 0; i < n; ++i) done += iov[i].iov_len;
      return (ssize_t)done;
    }
    if (wire_->broken || out_->closed) return *err = "connection reset (fake)", -1;
    if (wire_->stalled || stalled) return 0;
    size_t budget = toReceiver_ ? wire_->maxWrite : SIZE_MAX, done = 0;
    for (int i = 0; i < n && budget; ++i) {
      size_t k = std::min(budget, iov[i].iov_len);
      if (!(wire_->drop && toReceiver_)) out_->q.insert(out_->q.end(), (uint8_t*)iov[i].iov_base, (uint8_t*)iov[i].iov_base + k);
      done += k, budget -= k;
      if (k < iov[i].iov_len) break;
    }
    if (toReceiver_) wire_->bytes += done;
    return (ssize_t)done;
  }
  ssize_t read(void* buf, size_t len, std::string* err) override {
    if (timedOut) return *err = "Connection timed out (fake)", -1;
    if (wire_->broken) return *err = "connection reset (fake)", -1;
    if (in_->reset) return *err = "Connection reset by peer (fake)", -1;
    if (in_->q.empty()) {
      if (in_->closed) return *err = "connection closed by peer", -1;
      return 0;
    }
    size_t k = std::min(len, in_->q.size());
    std::copy(in_->q.begin(), in_->q.begin() + k, (uint8_t*)buf);
    in_->q.erase(in_->q.begin(), in_->q.begin() + k);
    return (ssize_t)k;
  }
  bool stalled = false;  // this one connection takes nothing (per-stream stall)
  bool timedOut = false;  // this one connection's kernel gave up (TCP_USER_TIMEOUT): calls fail

  bool dead(std::string* err) override {
    if (wire_->broken) return *err = "connection reset (fake)", true;
    if (in_->reset) return *err = "Connection reset by peer (fake)", true;
    if (in_->q.empty() && in_->closed) return *err = "closed by peer", true;
    return false;
  }

 private:
  std::shared_ptr<Pipe> out_, in_;
  std::shared_ptr<Wire> wire_;
  bool toReceiver_;
  bool hangs_;
};

// The server ends wait here until their HELLO has arrived; pump() routes them like the acceptor.
class FakeTransport : public StreamTransport {
 public:
  struct Pending {
    std::shared_ptr<Pipe> in;  // bytes from the client
    std::unique_ptr<Conn> server;
    int remoteNic;
    sockaddr_storage clientAddr;
  };
  // Maps a remote address (its first byte after 10.0.) to the receiver NIC index.
  std::map<std::pair<int, std::string>, std::shared_ptr<Wire>> wires;
  std::vector<Pending> pending;
  std::vector<std::string> nicAddr;  // address per local NIC index
  StreamRouter* router = nullptr;    // where pump() routes streams (a LinkRegistry); nullptr: dropped
  // Grouped receives for the engine's receive-side scenarios, whose sends come in receive
  // order (TCP itself offers none: it cannot tell the sender what the receiver posted).
  bool groupedReceives() const override { return true; }

  std::shared_ptr<Wire> wire(int nic, const std::string& remote) {
    auto& w = wires[{nic, remote}];
    if (!w) w = std::make_shared<Wire>();
    return w;
  }

  std::unique_ptr<Conn> connect(int nic, const sockaddr_storage& remote, socklen_t, std::string* err) override {
    std::string ra = addrToString(remote);
    auto w = wire(nic, ra);
    if (w->peerGone) return *err = "connect: Connection refused (fake)", nullptr;
    if (w->refuse || w->broken) return *err = "connect: No route to host (fake)", nullptr;
    w->connects++;
    auto c2s = std::make_shared<Pipe>(), s2c = std::make_shared<Pipe>();
    std::unique_ptr<Conn> client(new FakeConn(c2s, s2c, w, true));
    Pending p;
    p.in = c2s;
    p.server.reset(new FakeConn(s2c, c2s, w, false));
    p.remoteNic = -1;
    for (size_t i = 0; i < nicAddr.size(); ++i)
      if (nicAddr[i] == ra) p.remoteNic = (int)i;
    memset(&p.clientAddr, 0, sizeof(p.clientAddr));
    auto* sin = (sockaddr_in*)&p.clientAddr;
    sin->sin_family = AF_INET;
    inet_pton(AF_INET, nicAddr[nic].c_str(), &sin->sin_addr);
    pending.push_back(std::move(p));
    return client;
  }

  // Plays the acceptor: reads complete HELLOs (without consuming data after them) and routes.
  void pump() {
    for (size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      if (p.in->q.size() < wire::kFrameBytes) {
        ++i;
        continue;
      }
      uint8_t buf[wire::kFrameBytes];
      std::string err;
      ssize_t n = p.server->read(buf, sizeof(buf), &err);
      wire::Hello h;
      if (router && n == (ssize_t)sizeof(buf) && wire::decodeHello(buf, &h, &err))
        router->route(p.server, helloToStream(h), p.clientAddr, p.remoteNic);
      pending.erase(pending.begin() + i);
    }
  }
};

}  // namespace fake
}  // namespace railover
