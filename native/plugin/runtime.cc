#include "plugin/runtime.h"

#include <algorithm>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <unordered_map>

#include "common/clock.h"
#include "common/log.h"
#include "common/tuning.h"
#include "failover/link.h"
#include "health/health.h"
#include "telemetry/journal.h"
#include "telemetry/state.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/stream_path.h"
#include "transport/tcp/wire.h"
#ifdef RAILOVER_HAVE_VERBS
#include "transport/rdma/rdma_transport.h"
#endif

namespace railover {

ncclResult_t Runtime::init(ncclDebugLogger_t logger) {
  if (logger) setLogger(logger);
  std::lock_guard<std::mutex> g(mu_);
  if (tried_) {
    if (result_ != ncclSuccess) RO_WARN("railover: init failed earlier: %s", error_.c_str());
    return result_;
  }
  tried_ = true;
  std::string err;
  if (!parseConfig(processEnv(), &cfg, &err)) {
    error_ = err;
    RO_WARN("railover: %s", err.c_str());
    return result_ = ncclInvalidArgument;
  }
  if (!discoverNics(cfg, &nics, &err)) {
    error_ = err;
    RO_WARN("railover: %s", err.c_str());
    return result_ = ncclSystemError;
  }
  ports.assign(nics.size(), 0);
  if (!transport && !chooseTransport(&err)) {
    error_ = err;
    RO_WARN("railover: %s", err.c_str());
    return result_ = ncclSystemError;
  }
  for (auto& n : nics) {
    socklen_t len = 0;
    sockaddr_storage a = n.getAddr(&len);
    uint16_t port = 0;
    int fd = tcp::listenOn(a, len, &port, &err, n.name);
    if (fd < 0) {
      error_ = "cannot listen on NIC " + n.name + " (" + addrToString(a) + "): " + err;
      RO_WARN("railover: %s", error_.c_str());
      for (int f : listenFds_) ::close(f);
      listenFds_.clear();
      return result_ = ncclSystemError;
    }
    listenFds_.push_back(fd);
    ports[n.index] = port;
    RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: NIC %d %s addr %s rail %d speed %d Mbps pci %s port %u",
            n.index, n.name.c_str(), addrToString(a).c_str(), n.rail, n.speedMbps,
            n.pciPath.empty() ? "(virtual)" : n.pciPath.c_str(), port);
  }
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  Health::setAddrChangeHook([](int nic, const sockaddr_storage& a, socklen_t l) { Runtime::get().relisten(nic, a, l); });
  journalOpen(cfg.eventLog);
  stateStart(cfg, cfg.stateDirSet);
  startSweeper();
  Health::setEpochHook(&sweeperNotify);
  Health::start(cfg, nics.data(), (int)nics.size(), ports.data());
#ifdef RAILOVER_HAVE_VERBS
  if (auto* rt = dynamic_cast<rdma::RdmaTransport*>(transport))
    rt->startPortWatch([](int nic, bool up, const std::string& why) {
      if (Health* h = Health::get()) h->transportNicSignal(nic, up, why);
    });
#endif
  std::thread(&Runtime::acceptLoop, this).detach();
  ok_.store(true, std::memory_order_release);
  return result_ = ncclSuccess;
}


bool Runtime::chooseTransport(std::string* err) {
  TransportKind k = cfg.transport;
#ifdef RAILOVER_HAVE_VERBS
  if (k == TransportKind::kAuto) {
    std::string why;
    k = rdma::rdmaUsable(nics, cfg, &why) ? TransportKind::kRdma : TransportKind::kTcp;
    if (k == TransportKind::kTcp)
      RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: RAILOVER_TRANSPORT=auto: using tcp (%s)", why.c_str());
  }
  if (k == TransportKind::kRdma) {
    auto* t = new rdma::RdmaTransport(&nics, &cfg, err);
    if (!t->ok()) {
      *err = "RAILOVER_TRANSPORT=" + std::string(transportName(cfg.transport)) + ": cannot use RDMA: " + *err;
      delete t;
      return false;
    }
    RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: transport rdma: %s", t->describe().c_str());
    transport = t;
    return true;
  }
#else
  if (k == TransportKind::kRdma) {
    *err = "RAILOVER_TRANSPORT=rdma, but this build of railover has no RDMA transport (built without rdma-core's "
           "headers: install libibverbs-dev and rebuild)";
    return false;
  }
#endif
  transport = new TcpTransport(&nics, &cfg);
  return true;
}

void Runtime::relisten(int nic, const sockaddr_storage& a, socklen_t len) {
  uint16_t port = ports[nic];
  std::string err;
  int fd = tcp::listenOn(a, len, &port, &err, nics[nic].name);
  if (fd < 0) {
    RO_WARN("railover: NIC %s moved to %s but cannot listen there on port %u: %s; peers cannot reconnect to it",
            nics[nic].name.c_str(), addrToString(a).c_str(), ports[nic], err.c_str());
    return;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    newListeners_.push_back({nic, fd});
  }
  uint64_t one = 1;
  if (write(wakeFd_, &one, sizeof(one)) < 0) RO_WARN("railover: cannot wake the acceptor");
}

// The acceptor: accepts streams on every NIC's listener, reads and checks their HELLO
// (magic, version, secret) and hands them to their recv link. Anything else is dropped and
// logged; the listener keeps working.
void Runtime::acceptLoop() {
  struct Pending {
    int fd;
    int nic;
    uint8_t buf[wire::kFrameBytes];
    size_t got;
    uint64_t startUs;
    sockaddr_storage peer;
  };
  int ep = epoll_create1(EPOLL_CLOEXEC);
  // Listener tags: bit 63 set, NIC index in bits 32..62, fd in the low 32 bits.
  auto addListener = [&](int nic, int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = (1ULL << 63) | ((uint64_t)nic << 32) | (uint32_t)fd;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  };
  for (size_t i = 0; i < listenFds_.size(); ++i) addListener((int)i, listenFds_[i]);
  // The listener each NIC accepts on now. When a NIC moves to a new address the listener of
  // the old address is closed (nobody can reach it there any more; keeping it leaked one
  // socket per address change), after the batch of events that may still name it.
  std::vector<int> current(listenFds_);
  std::vector<int> retired;
  {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = (1ULL << 62);  // wake-up: a NIC moved, a new listener waits in newListeners_
    epoll_ctl(ep, EPOLL_CTL_ADD, wakeFd_, &ev);
  }
  std::unordered_map<int, Pending> pending;
  auto drop = [&](int fd, const char* why) {
    auto it = pending.find(fd);
    if (it != pending.end()) {
      RO_WARN("railover: dropping connection from %s on NIC %s: %s", addrToString(it->second.peer).c_str(),
              nics[it->second.nic].name.c_str(), why);
      pending.erase(it);
    }
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
  };
  epoll_event evs[64];
  while (true) {
    int n = epoll_wait(ep, evs, 64, tuning::kAcceptorWaitMs);
    uint64_t now = nowUs();
    for (int i = 0; i < n; ++i) {
      uint64_t tag = evs[i].data.u64;
      if (tag == (1ULL << 62)) {
        uint64_t v;
        if (read(wakeFd_, &v, sizeof(v)) < 0) continue;
        std::lock_guard<std::mutex> g(mu_);
        for (auto& nl : newListeners_) {
          int nic = nl.first;
          if (nic >= (int)current.size()) current.resize(nic + 1, -1);
          if (current[nic] >= 0 && current[nic] != nl.second) {
            epoll_ctl(ep, EPOLL_CTL_DEL, current[nic], nullptr);
            retired.push_back(current[nic]);
          }
          current[nic] = nl.second;
          addListener(nic, nl.second);
        }
        newListeners_.clear();
        continue;
      }
      if (tag >> 63) {
        int nic = (int)((tag >> 32) & 0x7fffffff);
        int lfd = (int)(uint32_t)tag;
        if (std::find(retired.begin(), retired.end(), lfd) != retired.end()) continue;
        while (true) {
          sockaddr_storage peer{};
          socklen_t pl = sizeof(peer);
          int fd = accept4(lfd, (sockaddr*)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          Pending p{fd, nic, {}, 0, now, peer};
          pending[fd] = p;
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.u64 = (uint64_t)(uint32_t)fd;
          epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        }
        continue;
      }
      int fd = (int)(uint32_t)tag;
      auto it = pending.find(fd);
      if (it == pending.end()) continue;
      Pending& p = it->second;
      ssize_t r = recv(fd, p.buf + p.got, sizeof(p.buf) - p.got, MSG_DONTWAIT);
      if (r == 0) {
        drop(fd, "closed before a complete HELLO (truncated HELLO)");
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
      epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
      tcp::tuneStream(fd, cfg.tcpUserTimeoutMs);
      std::unique_ptr<Conn> conn(new TcpConn(fd));
      if (!routeStream(conn, helloToStream(h), peer, nic) && h.connId != 0) {
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
                addrToString(peer).c_str(), nics[nic].name.c_str());
      }  // connId 0: a peer's liveness check of this process; closed without a word
    }
    for (int fd : retired) ::close(fd);  // after the batch: no event above can name them any more
    retired.clear();
    // A HELLO must arrive within 5 s; stray connections are not kept open.
    for (auto it = pending.begin(); it != pending.end();) {
      if (now - it->second.startUs > tuning::kHelloTimeoutUs) {
        int fd = it->first;
        RO_WARN("railover: dropping connection from %s on NIC %s: no HELLO within 5 s",
                addrToString(it->second.peer).c_str(), nics[it->second.nic].name.c_str());
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace railover
