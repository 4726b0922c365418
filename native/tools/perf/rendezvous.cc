// railover-perf rendezvous over pathname AF_UNIX sockets; see rendezvous.h.
#include "tools/perf/rendezvous.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tools/perf/util.h"

namespace rperf {

namespace {
constexpr uint32_t kMagic = 0x52504652;  // "RPFR"
constexpr uint32_t kMaxPayload = 1u << 20;

struct Header {
  uint32_t magic, kind, a, b, c, len;
};

bool fillAddr(const std::string& path, sockaddr_un* a, std::string* err) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  if (path.size() >= sizeof(a->sun_path)) {
    *err = strf("rendezvous socket path too long (%zu bytes, limit %zu): %s", path.size(), sizeof(a->sun_path) - 1,
                path.c_str());
    return false;
  }
  memcpy(a->sun_path, path.c_str(), path.size());
  return true;
}

std::string sockPath(const std::string& dir, int r) { return dir + "/rank" + std::to_string(r) + ".sock"; }

// Writes all of header+payload (blocking fd); false on error.
bool writeAll(int fd, const Header& h, const void* data, size_t len) {
  iovec iov[2] = {{const_cast<Header*>(&h), sizeof h}, {const_cast<void*>(data), len}};
  int niov = len ? 2 : 1;
  size_t total = sizeof h + len, done = 0;
  while (done < total) {
    msghdr m{};
    iovec cur[2];
    int n = 0;
    size_t skip = done;
    for (int i = 0; i < niov; i++) {
      if (skip >= iov[i].iov_len) {
        skip -= iov[i].iov_len;
        continue;
      }
      cur[n].iov_base = static_cast<char*>(iov[i].iov_base) + skip;
      cur[n].iov_len = iov[i].iov_len - skip;
      skip = 0;
      n++;
    }
    m.msg_iov = cur;
    m.msg_iovlen = size_t(n);
    ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += size_t(k);
  }
  return true;
}

// Reads exactly len bytes, waiting at most until deadlineUs (0 = no deadline). 0 on success,
// 1 on EOF, -1 on error / timeout.
int readFull(int fd, void* buf, size_t len, uint64_t deadlineUs) {
  size_t done = 0;
  while (done < len) {
    if (deadlineUs) {
      uint64_t now = nowUs();
      if (now >= deadlineUs) return -1;
      pollfd p{fd, POLLIN, 0};
      int to = int((deadlineUs - now) / 1000) + 1;
      int r = poll(&p, 1, to);
      if (r < 0 && errno != EINTR) return -1;
      if (r <= 0) continue;
    }
    ssize_t k = read(fd, static_cast<char*>(buf) + done, len - done);
    if (k == 0) return 1;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -1;
    }
    done += size_t(k);
  }
  return 0;
}
}  // namespace

Rendezvous::~Rendezvous() { stop(); }

bool Rendezvous::start(const std::string& dir, int rank, int nranks, uint64_t deadlineUs, std::string* err) {
  rank_ = rank;
  nranks_ = nranks;
  peers_.clear();
  for (int i = 0; i < nranks; i++) peers_.push_back(std::make_unique<Peer>());
  mkdir(dir.c_str(), 0777);  // fine if it exists
  path_ = sockPath(dir, rank);
  sockaddr_un addr;
  if (!fillAddr(path_, &addr, err)) return false;
  listenFd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listenFd_ < 0) {
    *err = strf("socket(AF_UNIX): %s", strerror(errno));
    return false;
  }
  unlink(path_.c_str());  // stale file of an earlier run
  if (bind(listenFd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listenFd_, nranks + 16) != 0) {
    *err = strf("cannot bind/listen on %s: %s", path_.c_str(), strerror(errno));
    return false;
  }
  if (pipe2(wakeFd_, O_CLOEXEC) != 0) {
    *err = strf("pipe: %s", strerror(errno));
    return false;
  }
  started_ = true;

  int missing = nranks - 1;
  std::vector<bool> have(size_t(nranks), false);
  have[size_t(rank)] = true;
  std::string lastConnErr;
  while (missing > 0) {
    // Outgoing: connect to every lower rank not yet connected (retry until it has bound).
    for (int q = 0; q < rank; q++) {
      if (have[size_t(q)]) continue;
      sockaddr_un qa;
      if (!fillAddr(sockPath(dir, q), &qa, err)) return false;
      int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        *err = strf("socket(AF_UNIX): %s", strerror(errno));
        return false;
      }
      if (::connect(fd, reinterpret_cast<sockaddr*>(&qa), sizeof qa) != 0) {
        lastConnErr = strf("connect(%s): %s", qa.sun_path, strerror(errno));
        close(fd);
        continue;  // ENOENT / ECONNREFUSED / EAGAIN: peer not there yet
      }
      Header h{kMagic, kHello, uint32_t(rank), uint32_t(nranks), 0, 0};
      if (!writeAll(fd, h, nullptr, 0)) {
        lastConnErr = strf("hello to rank %d: %s", q, strerror(errno));
        close(fd);
        continue;
      }
      peers_[size_t(q)]->fd = fd;
      have[size_t(q)] = true;
      missing--;
    }
    if (missing == 0) break;
    uint64_t now = nowUs();
    if (now >= deadlineUs) {
      std::string who;
      for (int q = 0; q < nranks; q++)
        if (!have[size_t(q)]) who += strf("%s%d", who.empty() ? "" : ",", q);
      *err = strf("rendezvous in %s timed out: ranks {%s} did not join%s%s", dir.c_str(), who.c_str(),
                  lastConnErr.empty() ? "" : "; last error: ", lastConnErr.c_str());
      return false;
    }
    // Incoming: wait (bounded) for a higher rank to connect; the bound paces the retries above.
    pollfd p{listenFd_, POLLIN, 0};
    uint64_t waitUs = std::min<uint64_t>(deadlineUs - now, 20000);
    int pr = poll(&p, 1, int(waitUs / 1000) + 1);
    if (pr <= 0) continue;
    int fd = accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Header h;
    if (readFull(fd, &h, sizeof h, std::min(deadlineUs, nowUs() + 5000000)) != 0 || h.magic != kMagic ||
        h.kind != kHello) {
      logWarn("rendezvous: dropped a connection without a valid hello");
      close(fd);
      continue;
    }
    int q = int(h.a);
    if (int(h.b) != nranks || q <= rank || q >= nranks || have[size_t(q)]) {
      *err = strf("rendezvous: unexpected hello from rank %d of %d (we are rank %d of %d; duplicate rank or "
                  "mismatched --nranks?)",
                  q, int(h.b), rank, nranks);
      close(fd);
      return false;
    }
    peers_[size_t(q)]->fd = fd;
    have[size_t(q)] = true;
    missing--;
  }
  reader_ = std::thread([this] { readerLoop(); });
  return true;
}

void Rendezvous::stop() {
  if (!started_) return;
  started_ = false;
  if (reader_.joinable()) {
    char c = 'x';
    ssize_t w = write(wakeFd_[1], &c, 1);
    (void)w;
    reader_.join();
  }
  for (auto& p : peers_) {
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
  }
  if (listenFd_ >= 0) close(listenFd_);
  listenFd_ = -1;
  for (int& f : wakeFd_) {
    if (f >= 0) close(f);
    f = -1;
  }
  unlink(path_.c_str());
}

void Rendezvous::markGone(int peer) {
  {
    std::lock_guard<std::mutex> g(mu_);
    peers_[size_t(peer)]->gone = true;
  }
  int expected = -1;
  firstGone_.compare_exchange_strong(expected, peer);
  cv_.notify_all();
}

bool Rendezvous::peerGone(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  return peers_[size_t(peer)]->gone;
}

bool Rendezvous::waitAnyGone(uint64_t deadlineUs) {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (firstGone_.load() >= 0) return true;
    uint64_t now = nowUs();
    if (now >= deadlineUs) return false;
    cv_.wait_for(lk, std::chrono::microseconds(deadlineUs - now));
  }
}

bool Rendezvous::readMsg(int peer) {
  int fd = peers_[size_t(peer)]->fd;
  Header h;
  int r = readFull(fd, &h, sizeof h, 0);
  if (r != 0) return false;
  if (h.magic != kMagic || h.len > kMaxPayload) {
    logWarn("rendezvous: garbage from rank %d; treating it as gone", peer);
    return false;
  }
  std::vector<char> data(h.len);
  if (h.len && readFull(fd, data.data(), h.len, 0) != 0) return false;
  {
    std::lock_guard<std::mutex> g(mu_);
    box_[{peer, Tag{h.kind, h.a, h.b, h.c}}].push_back(std::move(data));
  }
  cv_.notify_all();
  return true;
}

void Rendezvous::readerLoop() {
  std::vector<pollfd> pfds;
  std::vector<int> who;
  for (;;) {
    pfds.clear();
    who.clear();
    pfds.push_back({wakeFd_[0], POLLIN, 0});
    who.push_back(-1);
    for (int q = 0; q < nranks_; q++) {
      if (q == rank_ || peers_[size_t(q)]->fd < 0) continue;
      {
        std::lock_guard<std::mutex> g(mu_);
        if (peers_[size_t(q)]->gone) continue;
      }
      pfds.push_back({peers_[size_t(q)]->fd, POLLIN, 0});
      who.push_back(q);
    }
    int r = poll(pfds.data(), pfds.size(), -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      logWarn("rendezvous: poll failed: %s", strerror(errno));
      return;
    }
    if (pfds[0].revents) return;
    for (size_t i = 1; i < pfds.size(); i++) {
      if (!pfds[i].revents) continue;
      if (!readMsg(who[i])) markGone(who[i]);
    }
  }
}

bool Rendezvous::send(int peer, Tag tag, const void* data, size_t len, std::string* err) {
  if (peer == rank_) {
    std::vector<char> v(static_cast<const char*>(data), static_cast<const char*>(data) + len);
    {
      std::lock_guard<std::mutex> g(mu_);
      box_[{peer, tag}].push_back(std::move(v));
    }
    cv_.notify_all();
    return true;
  }
  Peer& p = *peers_[size_t(peer)];
  Header h{kMagic, tag.kind, tag.a, tag.b, tag.c, uint32_t(len)};
  std::lock_guard<std::mutex> g(p.wmu);
  if (!writeAll(p.fd, h, data, len)) {
    if (err) *err = strf("rendezvous send to rank %d failed: %s", peer, strerror(errno));
    return false;
  }
  return true;
}

Rendezvous::Status Rendezvous::tryRecv(int peer, Tag tag, std::vector<char>* out) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = box_.find({peer, tag});
  if (it != box_.end() && !it->second.empty()) {
    *out = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) box_.erase(it);
    return Status::kOk;
  }
  return peers_[size_t(peer)]->gone ? Status::kPeerGone : Status::kNotYet;
}

Rendezvous::Status Rendezvous::recv(int peer, Tag tag, std::vector<char>* out, uint64_t deadlineUs) {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    auto it = box_.find({peer, tag});
    if (it != box_.end() && !it->second.empty()) {
      *out = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) box_.erase(it);
      return Status::kOk;
    }
    if (peers_[size_t(peer)]->gone) return Status::kPeerGone;
    uint64_t now = nowUs();
    if (now >= deadlineUs) return Status::kTimeout;
    cv_.wait_for(lk, std::chrono::microseconds(deadlineUs - now));
  }
}

bool Rendezvous::barrier(uint32_t seq, uint64_t deadlineUs, std::string* err) {
  std::vector<char> none;
  std::vector<std::vector<char>> all;
  return allgather(seq | 0x80000000u, none, &all, deadlineUs, err);
}

bool Rendezvous::allgather(uint32_t seq, const std::vector<char>& mine, std::vector<std::vector<char>>* all,
                           uint64_t deadlineUs, std::string* err) {
  uint32_t kind = (seq & 0x80000000u) ? kBarrier : kGather;
  Tag tag{kind, seq, 0, 0};
  all->assign(size_t(nranks_), {});
  (*all)[size_t(rank_)] = mine;
  for (int q = 0; q < nranks_; q++) {
    if (q == rank_) continue;
    if (!send(q, tag, mine.data(), mine.size(), err)) return false;
  }
  for (int q = 0; q < nranks_; q++) {
    if (q == rank_) continue;
    Status s = recv(q, tag, &(*all)[size_t(q)], deadlineUs);
    if (s == Status::kOk) continue;
    if (err)
      *err = s == Status::kPeerGone ? strf("rank %d exited during %s %u", q, kind == kBarrier ? "barrier" : "allgather",
                                           seq & 0x7fffffffu)
                                    : strf("timed out waiting for rank %d in %s %u", q,
                                           kind == kBarrier ? "barrier" : "allgather", seq & 0x7fffffffu);
    return false;
  }
  return true;
}

}  // namespace rperf
