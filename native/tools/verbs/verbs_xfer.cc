// railover-verbs-xfer: moves N messages over one verbs path (one RC QP on one rail) with the
// verbs layer of native/transport/verbs/, checks every byte, and reports how a broken rail is
// detected and fenced. A test tool for the RDMA test bed; never linked into the plugin; built
// only where rdma-core's headers are present.
//
//   railover-verbs-xfer recv (--netdev IF | -d DEV [-g GIDX]) [-p PORT] [--watch-s S]
//        [--deadline-s S] [--no-fence]
//   railover-verbs-xfer send (--netdev IF | -d DEV [-g GIDX]) -a ADDR [-p PORT] [--count N]
//        [--seed S] [--max-size BYTES] [--chunk BYTES] [--depth D] [--timeout T] [--retry R]
//        [--deadline-s S] [--bench]
//
// The sender connects to the receiver's bootstrap TCP port (PORT, default 18900) at ADDR (the
// management NIC in the test bed), sends the run's parameters, and both exchange QP endpoints.
// Message i has a size and content derived from (seed, i): the sizes include 0 bytes, exactly
// one chunk, one chunk + 1, 1 byte and --max-size, the rest uniform in [0, max-size]. The
// receiver advertises --depth buffers at a time (each max-size + 4096 bytes, filled with a
// canary byte), checks each arrived message byte by byte and that the bytes past its end still
// hold the canary, and answers ACK(seq, wrong bytes). --bench (throughput): every message is
// --max-size bytes and neither side generates or checks content (sizes are still checked), so
// the guest's CPU goes to the transfer. --timeout/--retry are the RC local ACK
// timeout exponent and retry count of both QPs (rxe: retry 7 = retry forever).
//
// When the path breaks (error completion, PORT_ERR of the path's port, fatal QP event) the tool
// prints {"ev":"broken"} with the status, fences the path (QP to ERR, drain) and prints
// {"ev":"fenced"}. With --watch-s S the receiver then keeps watching its receive buffers
// (compared every 100 ms) for S seconds or until SIGTERM: {"ev":"fence_watch"} every second
// and {"ev":"fence_check"} at the end, with the bytes that changed after the fence (must stay
// 0), the packets its NIC received since (statistics/rx_packets) and the RoCE packets its HCA
// port counted since (hw_counters/rcvd_pkts), so a test can show that the sender's writes
// reached the receiver after the fence and none landed. --no-fence (negative control for that
// test) watches the same way without fencing: there the late writes do land.
//
// With --netdev the HCA port and GID are chosen as the plugin chooses them, honouring NCCL's IB
// variables in the environment (NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_IB_ROCE_VERSION_NUM,
// NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE); the receiver's {"ev":"listening"} reports the choice
// (dev, hca_port, gid_index, gid, why). A bad value or an excluded HCA port is an error naming
// the variable (exit status 1).
//
// Output: JSON lines with "t_us" (CLOCK_MONOTONIC µs). Exit status: 0 all messages arrived
// intact, 1 runtime failure or wrong bytes, 2 usage, 3 the path broke.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "transport/verbs/verbs_config.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_mr.h"
#include "transport/verbs/verbs_path.h"
#include "transport/verbs/verbs_qp.h"

using railover::Config;
using railover::parseConfig;
using railover::processEnv;
using namespace railover::verbs;

namespace {

volatile sig_atomic_t g_stop = 0;
void onSignal(int) { g_stop = 1; }

constexpr size_t kTail = 4096;        // canary bytes past each receive buffer's max-size
constexpr uint8_t kCanary = 0xA5;
constexpr int kBootstrapMs = 300000;  // TCG guests under load: generous

void emit(const char* ev, const char* fmt = nullptr, ...) {
  char body[2048] = {0};
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
  }
  printf("{\"t_us\":%" PRIu64 ",\"ev\":\"%s\"%s}\n", nowUs(), ev, body);
  fflush(stdout);
}

int fail(const std::string& msg) {
  std::string esc;
  for (char c : msg) esc += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  emit("error", ",\"message\":\"%s\"", esc.c_str());
  fprintf(stderr, "railover-verbs-xfer: %s\n", msg.c_str());
  return 1;
}

std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) o += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return o + "\"";
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct RunCfg {  // sent by the sender to the receiver (network byte order on the wire)
  uint64_t count = 200, seed = 1, maxSize = 256 * 1024, chunk = 64 * 1024;
  uint32_t depth = 8, timeout = 14, retry = 6;
  bool bench = false;  // every message max-size, content not generated or checked (throughput)
};

uint64_t msgSize(const RunCfg& c, uint64_t seq) {
  if (c.bench) return c.maxSize;
  switch (seq % 16) {
    case 0: return 0;
    case 1: return std::min(c.chunk, c.maxSize);
    case 2: return std::min(c.chunk + 1, c.maxSize);
    case 3: return std::min<uint64_t>(1, c.maxSize);
    case 4: return c.maxSize;
    default: return splitmix(c.seed * 1000003u + seq) % (c.maxSize + 1);
  }
}

void fillMsg(const RunCfg& c, uint64_t seq, uint8_t* p, uint64_t n) {
  uint64_t base = splitmix(c.seed ^ (seq * 0x2545f4914f6cdd1dull));
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t w = splitmix(base + i);
    std::memcpy(p + i, &w, std::min<uint64_t>(8, n - i));
  }
}

// Wrong bytes of message `seq` in p[0, n) plus canary damage in p[n, slot).
uint64_t checkMsg(const RunCfg& c, uint64_t seq, const uint8_t* p, uint64_t n, uint64_t slot) {
  uint64_t base = splitmix(c.seed ^ (seq * 0x2545f4914f6cdd1dull)), wrong = 0;
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t w = splitmix(base + i);
    uint64_t k = std::min<uint64_t>(8, n - i);
    if (std::memcmp(p + i, &w, k) != 0)
      for (uint64_t j = 0; j < k; ++j) wrong += p[i + j] != reinterpret_cast<uint8_t*>(&w)[j];
  }
  for (uint64_t i = n; i < slot; ++i) wrong += p[i] != kCanary;
  return wrong;
}

struct Opts {
  std::string mode, netdev, dev, addr;
  int gidx = -1, port = 18900;
  double watchS = 0, deadlineS = 600;
  bool noFence = false;
  RunCfg cfg;
};

bool parseU64(const char* s, uint64_t* v) {
  char* end = nullptr;
  errno = 0;
  unsigned long long x = strtoull(s, &end, 0);
  if (errno || !end || *end || *s == '-') return false;
  *v = x;
  return true;
}

int usage(const std::string& why) {
  fprintf(stderr,
          "railover-verbs-xfer: %s\n"
          "usage: railover-verbs-xfer recv (--netdev IF | -d DEV [-g GIDX]) [-p PORT] [--watch-s S] [--deadline-s S]\n"
          "                          [--no-fence]\n"
          "       railover-verbs-xfer send (--netdev IF | -d DEV [-g GIDX]) -a ADDR [-p PORT] [--count N] [--seed S]\n"
          "                          [--max-size BYTES] [--chunk BYTES] [--depth D] [--timeout T] [--retry R]\n"
          "                          [--deadline-s S] [--bench]\n",
          why.c_str());
  return 2;
}

// --netdev: the HCA port and GID with NCCL's IB variables from the environment (NCCL_IB_HCA,
// NCCL_IB_GID_INDEX, NCCL_IB_ROCE_VERSION_NUM, NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE), parsed
// and applied exactly as the plugin does (common/config.h, transport/verbs/verbs_config.h).
bool selectPort(const Opts& o, PortSel* ps, std::string* err) {
  if (o.netdev.empty()) return findPortByDevice(o.dev, 1, o.gidx, ps, err);
  Config cfg;
  if (!parseConfig(processEnv(), &cfg, err)) return false;
  return choosePortForNetdev(o.netdev, cfg.ib, ps, err) == PortChoice::kChosen;
}

bool ioAll(int fd, void* buf, size_t n, bool wr) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n) {
    pollfd pf{fd, static_cast<short>(wr ? POLLOUT : POLLIN), 0};
    int r = poll(&pf, 1, kBootstrapMs);
    if (r < 0 && errno == EINTR && !g_stop) continue;
    if (r <= 0) return false;
    ssize_t k = wr ? write(fd, p, n) : read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

void put64(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; --i) p[7 - i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

// Common bring-up after the TCP connection: endpoints, QP to RTS, then a one-byte barrier each
// way so neither side sends before the other's QP can receive.
bool bringUp(int fd, PathBase& path, std::string* err) {
  QpEndpoint peer;
  if (!exchangeEndpoints(fd, path.local(), &peer, kBootstrapMs, err)) return false;
  if (!path.connect(peer, err)) return false;
  uint8_t b = 1;
  if (!ioAll(fd, &b, 1, true) || !ioAll(fd, &b, 1, false)) {
    *err = "bootstrap barrier failed (peer gone)";
    return false;
  }
  emit("connected", ",\"dev\":%s,\"port\":%d,\"gid_index\":%d,\"gid\":%s,\"qpn\":%u,\"peer_qpn\":%u,\"timeout\":%d,"
       "\"retry_cnt\":%d,\"nominal_give_up_us\":%" PRIu64,
       jstr(path.qp().port().dev).c_str(), path.qp().port().port, path.qp().port().gidIndex,
       jstr(gidString(path.qp().port().gid)).c_str(), path.local().qpn, peer.qpn, path.params().timeout,
       path.params().retryCnt, path.params().nominalGiveUpUs());
  return true;
}

void emitBroken(const Broken& b) {
  emit("broken",
       ",\"source\":%s,\"status\":%s,\"code\":%d,\"since_last_ok_us\":%" PRIu64 ",\"seen_us\":%" PRIu64
       ",\"dev\":%s,\"port\":%d",
       jstr(b.source).c_str(), jstr(b.status).c_str(), b.code, b.sinceLastOkUs, b.tUs, jstr(b.dev).c_str(), b.port);
}

void emitFence(const FenceResult& f, const char* extra = "") {
  emit("fenced", ",\"drained\":%s,\"flushed_sends\":%d,\"flushed_recvs\":%d,\"fence_us\":%" PRIu64 ",\"err\":%s%s",
       f.drained ? "true" : "false", f.flushedSends, f.flushedRecvs, f.us, jstr(f.err).c_str(), extra);
}

long readNum(const std::string& path) {
  std::ifstream f(path);
  long v = -1;
  if (f) f >> v;
  return v;
}
long readCounter(const PortSel& ps, const char* name) {
  return readNum("/sys/class/infiniband/" + ps.dev + "/ports/" + std::to_string(ps.port) + "/hw_counters/" + name);
}
long netdevRx(const PortSel& ps) {
  return ps.netdev.empty() ? -1 : readNum("/sys/class/net/" + ps.netdev + "/statistics/rx_packets");
}

// ---------------------------------------------------------------- receiver

struct RecvState : RecvPath::Sink {
  RunCfg cfg;
  RecvPath* path = nullptr;
  uint8_t* buf = nullptr;
  uint64_t slotBytes = 0;
  uint32_t rkey = 0;
  uint64_t arrivedN = 0, bytes = 0, wrongBytes = 0, badMsgs = 0, nextAdvert = 0;
  std::vector<CtlMsg> ackQueue;
  bool brokenSeen = false, closeSeen = false;
  std::string err;

  uint8_t* slot(uint64_t seq) { return buf + (seq % cfg.depth) * slotBytes; }
  void arrived(const Arrival& got) override {
    const uint64_t seq = got.seq, n = got.bytes;  // never refused: every buffer takes the largest message
    uint64_t want = msgSize(cfg, seq);
    uint64_t wrong = n != want ? n + 1 : cfg.bench ? 0 : checkMsg(cfg, seq, slot(seq), n, slotBytes);
    if (n != want) emit("size_mismatch", ",\"seq\":%" PRIu64 ",\"got\":%" PRIu64 ",\"want\":%" PRIu64, seq, n, want);
    wrongBytes += wrong;
    badMsgs += wrong != 0;
    ++arrivedN;
    bytes += n;
    if (!cfg.bench) std::memset(slot(seq), kCanary, slotBytes);
    CtlMsg a;
    a.type = CtlType::kAck;
    a.seq = seq;
    a.arg = wrong;
    ackQueue.push_back(a);
  }
  void ctl(const CtlMsg& m) override {
    if (m.type == CtlType::kClose) closeSeen = true;
  }
  void broken(const Broken& b) override {
    brokenSeen = true;
    emitBroken(b);
  }
  // Sends queued ACKs and new advertisements as far as send slots allow; false on error.
  bool pump() {
    while (!ackQueue.empty()) {
      int r = path->sendCtl(ackQueue.front(), &err);
      if (r < 0) return false;
      if (r == 0) return true;
      ackQueue.erase(ackQueue.begin());
    }
    while (nextAdvert < cfg.count && nextAdvert < arrivedN + cfg.depth) {
      int r = path->advertise(nextAdvert, 0, slot(nextAdvert), cfg.maxSize,
                              rkey, &err);
      if (r < 0) return false;
      if (r == 0) return true;
      ++nextAdvert;
    }
    return true;
  }
};

int runRecv(const Opts& o) {
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(o.port));
  if (bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) || listen(lfd, 4))
    return fail("bootstrap listen on port " + std::to_string(o.port) + ": " + strerror(errno));
  PortSel ps;
  std::string err;
  if (!selectPort(o, &ps, &err)) return fail(err);
  emit("listening", ",\"port\":%d,\"dev\":%s,\"hca_port\":%d,\"gid_index\":%d,\"gid\":%s,\"why\":%s", o.port,
       jstr(ps.dev).c_str(), ps.port, ps.gidIndex, jstr(gidString(ps.gid)).c_str(), jstr(ps.why).c_str());
  pollfd pf{lfd, POLLIN, 0};
  int pr = 0;
  uint64_t acceptDeadline = nowUs() + static_cast<uint64_t>(o.deadlineS * 1e6);
  while (!g_stop && (pr = poll(&pf, 1, 200)) == 0 && nowUs() < acceptDeadline) {
  }
  if (pr <= 0) return fail("no sender connected before the deadline");
  int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  close(lfd);
  if (fd < 0) return fail(std::string("accept: ") + strerror(errno));
  uint8_t cw[48];
  if (!ioAll(fd, cw, sizeof cw, false)) return fail("reading the run parameters from the sender");
  RecvState st;
  st.cfg.count = get64(cw);
  st.cfg.seed = get64(cw + 8);
  st.cfg.maxSize = get64(cw + 16);
  st.cfg.chunk = get64(cw + 24);
  st.cfg.depth = static_cast<uint32_t>(get64(cw + 32));
  st.cfg.timeout = cw[40];
  st.cfg.retry = cw[41];
  st.cfg.bench = cw[42] != 0;
  if (st.cfg.depth == 0 || st.cfg.depth > 64 || st.cfg.maxSize > (1ull << 30))
    return fail("run parameters out of range (depth 1..64, max-size <= 1 GiB)");

  Hca hca(ps.dev, &err);
  if (!hca.ok()) return fail(err);
  RcParams rp;
  rp.timeout = static_cast<int>(st.cfg.timeout);
  rp.retryCnt = static_cast<int>(st.cfg.retry);
  RecvPath path(hca, ps, rp, &err);
  if (!path.ok()) return fail(err);
  st.slotBytes = st.cfg.maxSize + kTail;
  std::vector<uint8_t> mem(st.slotBytes * st.cfg.depth, kCanary);
  std::vector<Hca*> hcas{&hca};
  MrSet mr(hcas, mem.data(), mem.size(), &err);
  if (!mr.ok()) return fail(err);
  st.path = &path;
  st.buf = mem.data();
  st.rkey = mr.rkey(0);
  if (!bringUp(fd, path, &err)) return fail(err);
  uint64_t t0 = nowUs(), deadline = t0 + static_cast<uint64_t>(o.deadlineS * 1e6);
  if (!st.pump()) return fail(st.err);
  uint64_t lastReport = t0;
  while (!g_stop && !st.brokenSeen && st.arrivedN < st.cfg.count && nowUs() < deadline) {
    path.progress(st);
    if (!st.brokenSeen && !st.pump()) {
      if (!path.broken()) return fail(st.err);
      path.progress(st);  // broke while posting: the sink hears it now
    }
    if (path.lastPollFound() == 0) path.waitIdle(20);
    if (nowUs() - lastReport > 1000000) {
      lastReport = nowUs();
      emit("progress", ",\"arrived\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"pending\":%zu", st.arrivedN, st.bytes,
           path.pending().size());
    }
  }
  if (st.brokenSeen) {
    size_t pending = path.pending().size();
    if (o.noFence) {
      emit("not_fenced", ",\"pending\":%zu,\"qp_state\":%d", pending, static_cast<int>(path.qp().state()));
    } else {
      FenceResult f = path.fence(10000);
      char extra[128];
      snprintf(extra, sizeof extra, ",\"pending\":%zu,\"qp_state\":%d", pending, static_cast<int>(path.qp().state()));
      emitFence(f, extra);
    }
    if (o.watchS > 0) {
      std::vector<uint8_t> snap(mem);
      long pk0 = readCounter(ps, "rcvd_pkts"), rx0 = netdevRx(ps);
      auto since = [](long now, long then) { return now >= 0 && then >= 0 ? now - then : -1L; };
      uint64_t end = nowUs() + static_cast<uint64_t>(o.watchS * 1e6), tick = nowUs();
      uint64_t changed = 0;
      auto diff = [&] {
        uint64_t d = 0;
        if (std::memcmp(snap.data(), mem.data(), mem.size()) != 0)
          for (size_t i = 0; i < mem.size(); ++i) d += snap[i] != mem[i];
        return d;
      };
      while (!g_stop && nowUs() < end) {
        changed = diff();
        if (nowUs() - tick > 1000000) {
          tick = nowUs();
          emit("fence_watch",
               ",\"changed_bytes\":%" PRIu64 ",\"rcvd_pkts_since_fence\":%ld,\"netdev_rx_since_fence\":%ld",
               changed, since(readCounter(ps, "rcvd_pkts"), pk0), since(netdevRx(ps), rx0));
        }
        usleep(100000);  // a memory watch, not a synchronisation: compare every 100 ms
      }
      changed = diff();
      emit("fence_check", ",\"changed_bytes\":%" PRIu64 ",\"pending\":%zu,\"rcvd_pkts_since_fence\":%ld,"
           "\"netdev_rx_since_fence\":%ld",
           changed, pending, since(readCounter(ps, "rcvd_pkts"), pk0), since(netdevRx(ps), rx0));
    }
    return 3;
  }
  if (st.arrivedN < st.cfg.count) return fail("deadline or signal before all messages arrived");
  double secs = static_cast<double>(nowUs() - t0) / 1e6;
  emit("done", ",\"messages\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"wrong_bytes\":%" PRIu64 ",\"bad_messages\":%" PRIu64
       ",\"secs\":%.3f,\"mb_per_s\":%.2f,\"bench\":%s",
       st.arrivedN, st.bytes, st.wrongBytes, st.badMsgs, secs, st.bytes / 1e6 / (secs > 0 ? secs : 1),
       st.cfg.bench ? "true" : "false");
  // Let the last ACKs go out and the sender say CLOSE (bounded).
  uint64_t closeBy = nowUs() + 120000000u;
  while (!g_stop && !st.closeSeen && !st.brokenSeen && nowUs() < closeBy) {
    path.progress(st);
    if (!st.brokenSeen && !st.pump()) break;
    if (path.lastPollFound() == 0) path.waitIdle(20);
  }
  return st.wrongBytes ? 1 : 0;
}

// ---------------------------------------------------------------- sender

struct SendState : SendPath::Sink {
  RunCfg cfg;
  uint64_t acked = 0, wrongReported = 0, chunksDone = 0, bytesAcked = 0;
  bool brokenSeen = false;
  void chunkDone(const ChunkRef&) override { ++chunksDone; }
  void ctl(const CtlMsg& m) override {
    if (m.type != CtlType::kAck) return;
    ++acked;
    wrongReported += m.arg;
    bytesAcked += msgSize(cfg, m.seq);
  }
  void broken(const Broken& b) override {
    brokenSeen = true;
    emitBroken(b);
  }
};

int runSend(const Opts& o) {
  PortSel ps;
  std::string err;
  if (!selectPort(o, &ps, &err)) return fail(err);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(o.addr.c_str(), std::to_string(o.port).c_str(), &hints, &res) || !res)
    return fail("cannot resolve receiver address '" + o.addr + "'");
  int fd = -1;
  uint64_t dl = nowUs() + static_cast<uint64_t>(kBootstrapMs) * 1000u;
  while (!g_stop && nowUs() < dl) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
    usleep(100000);  // connect retry pacing while the receiver starts
  }
  freeaddrinfo(res);
  if (fd < 0) return fail("cannot connect to the receiver at " + o.addr + ":" + std::to_string(o.port));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const RunCfg& c = o.cfg;
  uint8_t cw[48] = {0};
  put64(cw, c.count);
  put64(cw + 8, c.seed);
  put64(cw + 16, c.maxSize);
  put64(cw + 24, c.chunk);
  put64(cw + 32, c.depth);
  cw[40] = static_cast<uint8_t>(c.timeout);
  cw[41] = static_cast<uint8_t>(c.retry);
  cw[42] = c.bench ? 1 : 0;
  if (!ioAll(fd, cw, sizeof cw, true)) return fail("sending the run parameters");

  Hca hca(ps.dev, &err);
  if (!hca.ok()) return fail(err);
  RcParams rp;
  rp.timeout = static_cast<int>(c.timeout);
  rp.retryCnt = static_cast<int>(c.retry);
  SendPath path(hca, ps, rp, &err);
  if (!path.ok()) return fail(err);
  std::vector<uint8_t> src(c.maxSize * c.depth + 1);
  std::vector<Hca*> hcas{&hca};
  MrSet mr(hcas, src.data(), src.size(), &err);
  if (!mr.ok()) return fail(err);
  if (!bringUp(fd, path, &err)) return fail(err);

  SendState st;
  st.cfg = c;
  uint64_t t0 = nowUs(), deadline = t0 + static_cast<uint64_t>(o.deadlineS * 1e6), lastReport = t0;
  uint64_t cur = 0, curOff = 0;  // message being posted, next offset
  bool curFilled = false;
  while (!g_stop && !st.brokenSeen && st.acked < c.count && nowUs() < deadline) {
    path.progress(st);
    if (st.brokenSeen) break;
    bool postedAny = false;
    // post chunks of the current message while its buffer is free (depth messages unacked at most)
    while (cur < c.count && cur < st.acked + c.depth) {
      uint8_t* s = src.data() + (cur % c.depth) * c.maxSize;
      uint64_t total = msgSize(c, cur);
      if (!curFilled && !c.bench) {
        fillMsg(c, cur, s, total);
        curFilled = true;
      }
      ChunkRef ch;
      ch.seq = cur;
      ch.offset = curOff;
      ch.len = std::min(c.chunk, total - curOff);
      ch.total = total;
      int r = path.post(ch, s + curOff, mr.lkey(0), &err);
      if (r < 0) {
        if (path.broken()) break;
        return fail(err);
      }
      if (r == 0) break;
      postedAny = true;
      curOff += ch.len;
      if (curOff == total) {
        ++cur;
        curOff = 0;
        curFilled = false;
      }
    }
    if (!postedAny && path.lastPollFound() == 0) path.waitIdle(20);
    if (nowUs() - lastReport > 1000000) {
      lastReport = nowUs();
      emit("progress", ",\"acked\":%" PRIu64 ",\"posted_messages\":%" PRIu64 ",\"outstanding_wrs\":%d,"
           "\"since_last_ok_us\":%" PRIu64,
           st.acked, cur, path.outstanding(), nowUs() - path.lastProgressUs());
    }
  }
  if (st.brokenSeen || path.broken()) {
    if (!st.brokenSeen) path.progress(st);
    FenceResult f = path.fence(10000);
    char extra[64];
    snprintf(extra, sizeof extra, ",\"qp_state\":%d", static_cast<int>(path.qp().state()));
    emitFence(f, extra);
    return 3;
  }
  if (st.acked < c.count) return fail("deadline or signal before all messages were acknowledged");
  double secs = static_cast<double>(nowUs() - t0) / 1e6;
  emit("done", ",\"messages\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"wrong_bytes_reported\":%" PRIu64
       ",\"chunks\":%" PRIu64 ",\"secs\":%.3f,\"mb_per_s\":%.2f,\"bench\":%s",
       st.acked, st.bytesAcked, st.wrongReported, st.chunksDone, secs,
       st.bytesAcked / 1e6 / (secs > 0 ? secs : 1), c.bench ? "true" : "false");
  CtlMsg cl;
  cl.type = CtlType::kClose;
  if (path.sendCtl(cl, &err) == 1) {
    uint64_t by = nowUs() + 60000000u;
    while (!g_stop && path.outstanding() > 0 && !path.broken() && nowUs() < by) {
      path.progress(st);
      if (path.lastPollFound() == 0) path.waitIdle(20);
    }
  }
  return st.wrongReported ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("missing mode (send or recv)");
  Opts o;
  o.mode = argv[1];
  if (o.mode != "send" && o.mode != "recv") return usage("unknown mode '" + o.mode + "'");
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--no-fence" || k == "--bench") {
      (k == "--bench" ? o.cfg.bench : o.noFence) = true;
      continue;
    }
    if (i + 1 >= argc) return usage("option " + k + " needs a value");
    const char* v = argv[++i];
    uint64_t u = 0;
    bool num = parseU64(v, &u);
    if (k == "--netdev") o.netdev = v;
    else if (k == "-d") o.dev = v;
    else if (k == "-a") o.addr = v;
    else if (k == "-g" && num) o.gidx = static_cast<int>(u);
    else if (k == "-p" && num && u > 0 && u < 65536) o.port = static_cast<int>(u);
    else if (k == "--count" && num) o.cfg.count = u;
    else if (k == "--seed" && num) o.cfg.seed = u;
    else if (k == "--max-size" && num && u <= (1ull << 30)) o.cfg.maxSize = u;
    else if (k == "--chunk" && num && u > 0) o.cfg.chunk = u;
    else if (k == "--depth" && num && u >= 1 && u <= 64) o.cfg.depth = static_cast<uint32_t>(u);
    else if (k == "--timeout" && num && u <= 31) o.cfg.timeout = static_cast<uint32_t>(u);
    else if (k == "--retry" && num && u <= 7) o.cfg.retry = static_cast<uint32_t>(u);
    else if (k == "--watch-s") o.watchS = atof(v);
    else if (k == "--deadline-s") o.deadlineS = atof(v);
    else return usage("bad option or value: " + k + " " + v);
  }
  if (o.netdev.empty() == o.dev.empty()) return usage("give exactly one of --netdev IF or -d DEV");
  if (o.mode == "send" && o.addr.empty()) return usage("send needs -a ADDR (the receiver's bootstrap address)");
  if (o.deadlineS <= 0 || o.watchS < 0) return usage("--deadline-s must be > 0 and --watch-s >= 0");
  struct sigaction sa{};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return o.mode == "send" ? runSend(o) : runRecv(o);
}
