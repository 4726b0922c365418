#include "transport/tcp/acceptor.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "common/clock.h"
#include "common/log.h"
#include "common/nic.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/stream_path.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/wire.h"

namespace railover {
namespace tcp {
namespace {

// epoll tags: a listener has bit 63 set, its NIC index in bits 32..62 and its fd in the low 32
// bits; the wake-up eventfd is bit 62 alone; a stream waiting for its HELLO is its fd.
constexpr uint64_t kListenerTag = 1ULL << 63;
constexpr uint64_t kWakeTag = 1ULL << 62;

}  // namespace

Acceptor::Acceptor(std::vector<std::string> nicNames, StreamTuning tuning, StreamRouter* router,
                   uint64_t helloTimeoutUs, int waitMs)
    : names_(std::move(nicNames)),
      tuning_(tuning),
      router_(router),
      helloTimeoutUs_(helloTimeoutUs),
      waitMs_(waitMs) {
  ep_ = epoll_create1(EPOLL_CLOEXEC);
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!ok()) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  epoll_ctl(ep_, EPOLL_CTL_ADD, wakeFd_, &ev);
  thread_ = std::thread(&Acceptor::loop, this);
}

Acceptor::~Acceptor() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    wake();
    thread_.join();
  }
  for (auto& nl : newListeners_) ::close(nl.second);  // opened after the thread ended
  if (ep_ >= 0) ::close(ep_);
  if (wakeFd_ >= 0) ::close(wakeFd_);
}

void Acceptor::wake() {
  uint64_t one = 1;
  if (write(wakeFd_, &one, sizeof(one)) < 0) RO_WARN("railover: cannot wake the acceptor: %s", strerror(errno));
}

bool Acceptor::listen(int nic, const sockaddr_storage& addr, socklen_t len, uint16_t* port, std::string* err) {
  if (!ok()) {
    *err = std::string("the acceptor could not start (epoll/eventfd): ") + strerror(errno);
    return false;
  }
  if (nic < 0 || nic >= (int)names_.size()) {
    *err = "NIC index " + std::to_string(nic) + " out of range (" + std::to_string(names_.size()) + " NICs)";
    return false;
  }
  int fd = listenOn(addr, len, port, err, names_[nic]);
  if (fd < 0) return false;
  {
    std::lock_guard<std::mutex> g(mu_);
    newListeners_.push_back({nic, fd});
  }
  wake();
  return true;
}

// Accepts streams on every NIC's listener, reads each one's HELLO (exactly wire::kFrameBytes,
// checked by decodeHello: magic, version, fields) and hands it to the router. Anything else is
// dropped and logged; the listeners keep working.
void Acceptor::loop() {
  struct Pending {
    int nic;
    uint8_t buf[wire::kFrameBytes];
    size_t got;
    uint64_t startUs;
    sockaddr_storage peer;
  };
  auto addListener = [&](int nic, int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerTag | ((uint64_t)nic << 32) | (uint32_t)fd;
    epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
  };
  // The listener each NIC accepts on now (-1: none). When a NIC moves to a new address the
  // listener of the old address is closed (nobody can reach it there any more), after the
  // batch of events that may still name it.
  std::vector<int> current(names_.size(), -1);
  std::vector<int> retired;
  std::unordered_map<int, Pending> pending;
  // warn: a WARN; else an INFO line (a stream closed before it sent a byte: its initiator gave
  // the connect up, as a railover sender restarting a connect after a repair does, or a port
  // probe; nothing is wrong on this side).
  auto drop = [&](int fd, const char* why, bool warn = true) {
    auto it = pending.find(fd);
    if (it != pending.end()) {
      if (warn)
        RO_WARN("railover: dropping connection from %s on NIC %s: %s", addrToString(it->second.peer).c_str(),
                names_[it->second.nic].c_str(), why);
      else
        RO_INFO(RO_SUBSYS_NET, "railover: dropping connection from %s on NIC %s: %s",
                addrToString(it->second.peer).c_str(), names_[it->second.nic].c_str(), why);
      pending.erase(it);
    }
    epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
  };
  char timeoutWhy[64];
  snprintf(timeoutWhy, sizeof(timeoutWhy), "no HELLO within %g s", (double)helloTimeoutUs_ / 1e6);
  epoll_event evs[64];
  bool stopping = false;
  while (!stopping) {
    int n = epoll_wait(ep_, evs, 64, waitMs_);
    uint64_t now = nowUs();
    for (int i = 0; i < n; ++i) {
      uint64_t tag = evs[i].data.u64;
      if (tag == kWakeTag) {
        uint64_t v;
        if (read(wakeFd_, &v, sizeof(v)) < 0) continue;
        std::lock_guard<std::mutex> g(mu_);
        if (stop_) {
          stopping = true;
          continue;
        }
        for (auto& nl : newListeners_) {
          int nic = nl.first;
          if (current[nic] >= 0 && current[nic] != nl.second) {
            epoll_ctl(ep_, EPOLL_CTL_DEL, current[nic], nullptr);
            retired.push_back(current[nic]);
          }
          current[nic] = nl.second;
          addListener(nic, nl.second);
        }
        newListeners_.clear();
        continue;
      }
      if (tag & kListenerTag) {
        int nic = (int)((tag >> 32) & 0x7fffffff);
        int lfd = (int)(uint32_t)tag;
        if (std::find(retired.begin(), retired.end(), lfd) != retired.end()) continue;
        while (true) {
          sockaddr_storage peer{};
          socklen_t pl = sizeof(peer);
          int fd = accept4(lfd, (sockaddr*)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          Pending p{nic, {}, 0, now, peer};
          pending[fd] = p;
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.u64 = (uint64_t)(uint32_t)fd;
          epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
        }
        continue;
      }
      int fd = (int)(uint32_t)tag;
      auto it = pending.find(fd);
      if (it == pending.end()) continue;
      Pending& p = it->second;
      ssize_t r = recv(fd, p.buf + p.got, sizeof(p.buf) - p.got, MSG_DONTWAIT);
      if (r == 0) {
        if (p.got == 0) drop(fd, "closed before sending anything (its initiator gave the connect up)", false);
        else drop(fd, "closed before a complete HELLO (truncated HELLO)");
        continue;
      }
      if (r < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) drop(fd, strerror(errno));
        continue;
      }
      p.got += (size_t)r;
      if (p.got < sizeof(p.buf)) continue;
      wire::Hello h;
      std::string err;
      if (!wire::decodeHello(p.buf, &h, &err)) {
        drop(fd, ("bad HELLO: " + err).c_str());
        continue;
      }
      int nic = p.nic;
      sockaddr_storage peer = p.peer;
      pending.erase(it);
      epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
      tuneStream(fd, tuning_);
      std::unique_ptr<Conn> conn(new TcpConn(fd));
      if (!router_->route(conn, helloToStream(h), peer, nic) && h.connId != 0) {
        // No open listen comm and no live recv comm has it (closed, or never ours): say so, so
        // the sender stops reconnecting instead of retrying for as long as its comm lives.
        uint8_t buf[wire::kFrameBytes];
        wire::Frame f;
        f.type = wire::kNack;
        f.seq = wire::kNackUnknownComm;
        wire::encodeFrame(f, buf);
        std::string werr;
        writeAll(*conn, buf, sizeof(buf), &werr);
        RO_INFO(RO_SUBSYS_NET, "railover: refusing connection from %s on NIC %s: unknown or closed comm (NACK sent)",
                addrToString(peer).c_str(), names_[nic].c_str());
      }  // connId 0: a peer's liveness check of this process; closed without a word (conn's destructor)
    }
    for (int fd : retired) ::close(fd);  // after the batch: no event above can name them any more
    retired.clear();
    // A HELLO must arrive within the deadline; stray connections are not kept open.
    for (auto it = pending.begin(); it != pending.end();) {
      if (now - it->second.startUs > helloTimeoutUs_) {
        int fd = it->first;
        RO_WARN("railover: dropping connection from %s on NIC %s: %s", addrToString(it->second.peer).c_str(),
                names_[it->second.nic].c_str(), timeoutWhy);
        epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Stopped (destructor): close what this thread holds.
  for (auto& p : pending) ::close(p.first);
  for (int fd : current)
    if (fd >= 0) ::close(fd);
}

}  // namespace tcp
}  // namespace railover
