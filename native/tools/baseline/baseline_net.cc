// libnccl-net-baseline.so: the physical limit of the data movement railover-perf drives,
// as a minimal NCCL net plugin (ABI v9). `railover-perf --plugin libnccl-net-baseline.so`
// moves exactly the buffers it moves through railover (same slot sizes, same 8 requests in
// flight per connection, same workloads, same NICs), so busbw(railover) / busbw(baseline)
// measures the plugin and nothing else.
//
// What it does, and nothing more:
//   * devices: the NICs of RAILOVER_IFNAMES (else NCCL_SOCKET_IFNAME; "=" exact names in
//     that order, otherwise name prefixes; "^" excludes), else every IPv4 NIC but lo;
//   * a connection = RAILOVER_NSTREAMS (default 2, 1..16) plain TCP sockets from the local
//     NIC's address to the peer NIC's listener; no standby, no probes, no acknowledgements,
//     no sequence numbers, no copies (send()/recv() straight from/into the caller's buffer);
//   * a message = an 8-byte size on stream 0, then the bytes cut as railover cuts them
//     (chunk = ceil(size / nstreams) rounded up to 128 B, at least RAILOVER_MIN_CHUNK_BYTES,
//     default 65536), chunk i on stream i % nstreams;
//   * progress happens inside test() (no thread of its own).
// It detects nothing and survives nothing: a socket error fails the request.
//
// Thread-safety: as NCCL requires of a net plugin: a comm is used by one thread at a time.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "abi/nccl_net_abi.h"

namespace {

constexpr int kMaxStreams = 16;
constexpr int kSlots = 64;          // requests in flight per comm (NCCL uses at most 8)
constexpr size_t kHandleBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr int kPtrHost = 1;         // NCCL_PTR_HOST

ncclDebugLogger_t gLog = nullptr;
struct Nic {
  std::string name;
  sockaddr_in addr;
};
std::vector<Nic> gNics;
int gStreams = 2;
uint64_t gMinChunk = 65536;

#define BLOG(fmt, ...) \
  do { if (gLog) gLog(RO_LOG_WARN, RO_SUBSYS_NET, __FILE__, __LINE__, "baseline: " fmt, ##__VA_ARGS__); } while (0)

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

bool findNics() {
  const char* spec = getenv("RAILOVER_IFNAMES");
  if (!spec || !*spec) spec = getenv("NCCL_SOCKET_IFNAME");
  std::string sp = spec ? spec : "";
  bool exclude = !sp.empty() && sp[0] == '^';
  bool exact = !sp.empty() && sp[0] == '=';
  std::vector<std::string> names = split(exclude || exact ? sp.substr(1) : sp);
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return false;
  std::vector<Nic> all;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    Nic n{i->ifa_name, *(sockaddr_in*)i->ifa_addr};
    bool dup = false;
    for (auto& x : all) dup |= x.name == n.name;
    if (!dup) all.push_back(n);
  }
  freeifaddrs(ifs);
  auto match = [&](const std::string& nm) {
    for (auto& p : names)
      if (exact ? nm == p : nm.compare(0, p.size(), p) == 0) return true;
    return false;
  };
  if (exact) {
    for (auto& p : names)
      for (auto& n : all)
        if (n.name == p) gNics.push_back(n);
  } else {
    for (auto& n : all) {
      bool keep = names.empty() ? n.name != "lo" : (exclude ? !match(n.name) : match(n.name));
      if (keep) gNics.push_back(n);
    }
  }
  return !gNics.empty();
}

uint64_t chunkSize(uint64_t size) {
  uint64_t c = (size + gStreams - 1) / gStreams;
  c = (c + 127) & ~uint64_t(127);
  if (c < gMinChunk) c = gMinChunk;
  return c;
}

void nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// ---- comms -------------------------------------------------------------------------------
struct Comm;
struct Req {
  Comm* c = nullptr;
  bool used = false, done = false, failed = false;
  uint64_t seq = 0;
  char* buf = nullptr;
  uint64_t cap = 0, size = 0;
  bool sizeKnown = false;
  int streamsDone = 0;
};

struct Stream {
  int fd = -1;
  uint64_t seq = 0;      // request this stream works on
  uint64_t chunk = 0;    // chunk index (s, s + n, ...) within it
  uint64_t got = 0;      // bytes of that chunk moved
  uint64_t hdr = 0;      // stream 0: bytes of the size header moved
  uint64_t hdrVal = 0;
  bool started = false;
};

struct Comm {
  bool send = false;
  int n = 0;
  Stream s[kMaxStreams];
  Req slots[kSlots];
  uint64_t nextSeq = 0;
  bool failed = false;
};

// Moves as many bytes as the sockets take for stream `si`; false on a socket error.
bool progressStream(Comm* c, int si) {
  Stream& st = c->s[si];
  while (st.seq < c->nextSeq) {
    Req& r = c->slots[st.seq % kSlots];
    if (!st.started) {
      st.started = true;
      st.chunk = (uint64_t)si;
      st.got = 0;
      st.hdr = 0;
      if (c->send && si == 0) st.hdrVal = r.size;
    }
    if (si == 0 && st.hdr < 8) {  // the message's size, on stream 0
      char* h = (char*)&st.hdrVal;
      ssize_t k = c->send ? ::send(st.fd, h + st.hdr, 8 - st.hdr, MSG_NOSIGNAL) : ::recv(st.fd, h + st.hdr, 8 - st.hdr, 0);
      if (k == 0 && !c->send) return false;
      if (k < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      st.hdr += (uint64_t)k;
      if (st.hdr < 8) continue;
      if (!c->send) {
        if (st.hdrVal > r.cap) {
          BLOG("message of %llu bytes for a %llu-byte receive", (unsigned long long)st.hdrVal, (unsigned long long)r.cap);
          return false;
        }
        r.size = st.hdrVal;
        r.sizeKnown = true;
      }
    }
    if (!c->send && !r.sizeKnown) return true;  // stream 0 has not read the size yet
    uint64_t cs = chunkSize(r.size);
    uint64_t off = st.chunk * cs;
    if (off >= r.size) {  // this stream is done with the request
      st.started = false;
      st.seq++;
      if (++r.streamsDone == c->n) r.done = true;
      continue;
    }
    uint64_t len = std::min(cs, r.size - off);
    char* p = r.buf + off + st.got;
    uint64_t left = len - st.got;
    ssize_t k = c->send ? ::send(st.fd, p, left, MSG_NOSIGNAL) : ::recv(st.fd, p, left, 0);
    if (k == 0 && !c->send) return false;
    if (k < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    st.got += (uint64_t)k;
    if (st.got == len) {
      st.chunk += (uint64_t)c->n;
      st.got = 0;
    }
  }
  return true;
}

bool progress(Comm* c) {
  if (c->failed) return false;
  for (int i = 0; i < c->n; i++)
    if (!progressStream(c, i)) {
      c->failed = true;
      return false;
    }
  return true;
}

Req* post(Comm* c, char* buf, uint64_t size) {
  Req& r = c->slots[c->nextSeq % kSlots];
  if (r.used) return nullptr;  // all slots in flight: NCCL retries
  r = Req{};
  r.c = c, r.used = true, r.seq = c->nextSeq++, r.buf = buf;
  if (c->send) r.size = size, r.sizeKnown = true;
  else r.cap = size;
  return &r;
}

// ---- listen / connect / accept -----------------------------------------------------------
struct Handle {
  sockaddr_in addr;
};
struct Pending {
  int fd;
  uint8_t hello[8];
  size_t got;
};
struct Listen {
  int fd = -1;
  std::vector<Pending> pending;
  std::map<uint32_t, std::vector<std::pair<int, int>>> groups;  // comm id -> (stream, fd)
};

ncclResult_t bInit(ncclDebugLogger_t logger) {
  gLog = logger;
  if (const char* v = getenv("RAILOVER_NSTREAMS")) {
    int x = atoi(v);
    if (x < 1 || x > kMaxStreams) {
      BLOG("RAILOVER_NSTREAMS=%s: expected 1..%d", v, kMaxStreams);
      return ncclInvalidArgument;
    }
    gStreams = x;
  }
  if (const char* v = getenv("RAILOVER_MIN_CHUNK_BYTES")) gMinChunk = strtoull(v, nullptr, 10);
  if (gMinChunk == 0) gMinChunk = 128;
  gNics.clear();
  if (!findNics()) {
    BLOG("no usable NIC (RAILOVER_IFNAMES / NCCL_SOCKET_IFNAME)");
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t bDevices(int* n) {
  *n = (int)gNics.size();
  return ncclSuccess;
}

ncclResult_t bProps(int dev, ncclNetProperties_v9_t* p) {
  if (dev < 0 || dev >= (int)gNics.size()) return ncclInvalidArgument;
  memset(p, 0, sizeof(*p));
  p->name = (char*)gNics[dev].name.c_str();
  p->pciPath = nullptr;
  p->guid = (uint64_t)dev;
  p->ptrSupport = kPtrHost;
  p->speed = 10000;
  p->latency = 0;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  p->netDeviceType = RO_NET_DEVICE_HOST;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = dev;
  p->maxP2pBytes = (size_t)1 << 31;
  p->maxCollBytes = (size_t)1 << 31;
  return ncclSuccess;
}

ncclResult_t bListen(int dev, void* handle, void** listenComm) {
  if (dev < 0 || dev >= (int)gNics.size()) return ncclInvalidArgument;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = gNics[dev].addr;
  a.sin_port = 0;
  socklen_t l = sizeof(a);
  if (fd < 0 || bind(fd, (sockaddr*)&a, sizeof(a)) != 0 || listen(fd, 1024) != 0 || getsockname(fd, (sockaddr*)&a, &l) != 0) {
    BLOG("listen on %s: %s", gNics[dev].name.c_str(), strerror(errno));
    if (fd >= 0) close(fd);
    return ncclSystemError;
  }
  nonblock(fd);
  memset(handle, 0, kHandleBytes);
  ((Handle*)handle)->addr = a;
  auto* L = new Listen;
  L->fd = fd;
  *listenComm = L;
  return ncclSuccess;
}

ncclResult_t bConnect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_t** devComm) {
  if (devComm) *devComm = nullptr;
  if (dev < 0 || dev >= (int)gNics.size()) return ncclInvalidArgument;
  static std::mt19937 rng{std::random_device{}()};
  uint32_t id = rng();
  auto* c = new Comm;
  c->send = true;
  c->n = gStreams;
  for (int i = 0; i < c->n; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in local = gNics[dev].addr;
    local.sin_port = 0;
    // A listener accepts the handshake before accept() is called: a blocking connect ends.
    if (fd < 0 || bind(fd, (sockaddr*)&local, sizeof(local)) != 0 ||
        ::connect(fd, (sockaddr*)&((Handle*)handle)->addr, sizeof(sockaddr_in)) != 0) {
      BLOG("connect from %s: %s", gNics[dev].name.c_str(), strerror(errno));
      if (fd >= 0) close(fd);
      for (int j = 0; j < i; j++) close(c->s[j].fd);
      delete c;
      return ncclSystemError;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint8_t hello[8];
    memcpy(hello, &id, 4);
    hello[4] = (uint8_t)i, hello[5] = (uint8_t)c->n, hello[6] = hello[7] = 0;
    if (::send(fd, hello, 8, MSG_NOSIGNAL) != 8) {
      BLOG("hello: %s", strerror(errno));
      close(fd);
      delete c;
      return ncclSystemError;
    }
    nonblock(fd);
    c->s[i].fd = fd;
  }
  *sendComm = c;
  return ncclSuccess;
}

ncclResult_t bAccept(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** devComm) {
  if (devComm) *devComm = nullptr;
  *recvComm = nullptr;
  auto* L = (Listen*)listenComm;
  while (true) {
    int fd = accept4(L->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    L->pending.push_back(Pending{fd, {}, 0});
  }
  for (size_t i = 0; i < L->pending.size();) {
    Pending& p = L->pending[i];
    ssize_t k = ::recv(p.fd, p.hello + p.got, 8 - p.got, 0);
    if (k > 0) p.got += (size_t)k;
    if ((k == 0) || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      close(p.fd);
      L->pending.erase(L->pending.begin() + (long)i);
      continue;
    }
    if (p.got == 8) {
      uint32_t id;
      memcpy(&id, p.hello, 4);
      L->groups[id].push_back({p.hello[4], p.fd});
      int n = p.hello[5];
      L->pending.erase(L->pending.begin() + (long)i);
      auto& g = L->groups[id];
      if ((int)g.size() == n && !*recvComm) {
        auto* c = new Comm;
        c->n = n;
        for (auto& sf : g) c->s[sf.first].fd = sf.second;
        L->groups.erase(id);
        *recvComm = c;
      }
      continue;
    }
    i++;
  }
  return ncclSuccess;
}

ncclResult_t bRegMr(void*, void*, size_t, int, void** mh) {
  static int token;
  *mh = &token;
  return ncclSuccess;
}
ncclResult_t bRegMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void**) { return ncclInternalError; }
ncclResult_t bDeregMr(void*, void*) { return ncclSuccess; }

ncclResult_t bIsend(void* comm, void* data, size_t size, int, void*, void** request) {
  auto* c = (Comm*)comm;
  if (c->failed) return ncclSystemError;
  *request = post(c, (char*)data, size);
  return ncclSuccess;
}

ncclResult_t bIrecv(void* comm, int n, void** data, size_t* sizes, int*, void**, void** request) {
  auto* c = (Comm*)comm;
  if (n != 1) return ncclInternalError;
  if (c->failed) return ncclSystemError;
  *request = post(c, (char*)data[0], sizes[0]);  // overwrites the v9 optional-completion marker
  return ncclSuccess;
}

ncclResult_t bIflush(void*, int, void**, int*, void**, void** request) {
  *request = nullptr;
  return ncclSuccess;
}

ncclResult_t bTest(void* request, int* done, int* sizes) {
  auto* r = (Req*)request;
  *done = 0;
  if (!progress(r->c) && !r->done) return ncclSystemError;
  if (r->done) {
    *done = 1;
    if (sizes) *sizes = (int)r->size;
    r->used = false;
  }
  return ncclSuccess;
}

ncclResult_t closeComm(void* comm) {
  auto* c = (Comm*)comm;
  for (int i = 0; i < c->n; i++)
    if (c->s[i].fd >= 0) close(c->s[i].fd);
  delete c;
  return ncclSuccess;
}

ncclResult_t bCloseListen(void* listenComm) {
  auto* L = (Listen*)listenComm;
  for (auto& p : L->pending) close(p.fd);
  for (auto& g : L->groups)
    for (auto& sf : g.second) close(sf.second);
  close(L->fd);
  delete L;
  return ncclSuccess;
}

ncclResult_t bGetDeviceMr(void*, void*, void**) { return ncclInternalError; }
ncclResult_t bIrecvConsumed(void*, int, void*) { return ncclSuccess; }

}  // namespace

extern "C" __attribute__((visibility("default"))) const ncclNet_v9_t ncclNetPlugin_v9 = {
    "baseline", bInit,      bDevices, bProps,  bListen,      bConnect,     bAccept,
    bRegMr,     bRegMrDmaBuf, bDeregMr, bIsend, bIrecv,       bIflush,      bTest,
    closeComm,  closeComm,  bCloseListen, bGetDeviceMr, bIrecvConsumed, nullptr};
