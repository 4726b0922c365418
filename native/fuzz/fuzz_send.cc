// Fuzz target: the send side of a comm (SendLink), which reads control frames the receiver
// writes back (ACK, RESUME_ACK, NACK, CLOSE) and so trusts another process's bytes. Driven
// through its real entry points (create, ready, isend, test, close) over in-memory
// connections: every connection the sender opens gets its reply bytes from the input, and
// everything the sender writes is recorded.
//
// The input picks the streams per path (1..3), 1..8 sends of 0..4096 bytes (posted a few per
// round), how many bytes one write takes (partial frames), how many reply bytes arrive per
// round (so ACKs come after the data they acknowledge, and control frames arrive in pieces),
// and for each connection the sender opens (at most 8): the bytes the "receiver" answers with
// and whether the connection then breaks.
//
// Invariants checked (any violation aborts):
//  * the sender reads nothing outside the posted send buffers (each its own heap block of
//    exactly its size: ASan);
//  * a send completes only after the input acknowledged it: send k reports done only if the
//    sender has consumed an ACK or RESUME_ACK with seq > k; done is never withdrawn and the
//    size it reports is the size posted;
//  * everything the sender writes decodes: each connection starts with a valid HELLO with
//    the comm's secret and a stream index below its stream count, then valid frames only
//    (DATA, RESUME, CLOSE); every DATA chunk belongs to a posted send, has that send's
//    total, and carries exactly that send's bytes at its offset.
#include <fuzzer/FuzzedDataProvider.h>

#include <arpa/inet.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/log.h"
#include "failover/link.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_engine.h"
#include "plugin/devices.h"
#include "plugin/runtime.h"
#include "transport/tcp/stream_path.h"
#include "transport/transport.h"

using namespace railover;

namespace {

constexpr int kMaxSend = 8;
constexpr int kMaxConns = 8;
constexpr int kRounds = 1 << 20;  // a bound only: a run stops after 3 rounds without progress

struct Feed {
  std::vector<uint8_t> in;   // what the receiver answers
  size_t pos = 0;
  size_t visible = 0;        // bytes of `in` that have "arrived" so far (grows every round)
  bool eof = false;          // the connection breaks once `in` is read
  size_t maxWrite = SIZE_MAX;
  std::vector<uint8_t> out;  // what the sender wrote
};

class FeedConn : public Conn {
 public:
  explicit FeedConn(Feed* f) : f_(f) {}
  int connectState(std::string*) override { return 1; }
  ssize_t writev(const iovec* iov, int n, std::string* err) override {
    if (f_->eof && f_->pos == f_->in.size()) return *err = "connection reset (fuzz)", -1;
    size_t budget = f_->maxWrite, done = 0;
    for (int i = 0; i < n && budget; ++i) {
      size_t k = std::min(budget, iov[i].iov_len);
      f_->out.insert(f_->out.end(), (const uint8_t*)iov[i].iov_base, (const uint8_t*)iov[i].iov_base + k);
      done += k, budget -= k;
      if (k < iov[i].iov_len) break;
    }
    return (ssize_t)done;
  }
  ssize_t read(void* buf, size_t len, std::string* err) override {
    size_t left = std::min(f_->visible, f_->in.size()) - f_->pos;
    if (!left) return f_->eof ? (*err = "connection reset (fuzz)", -1) : 0;
    size_t k = std::min(len, left);
    memcpy(buf, f_->in.data() + f_->pos, k);
    f_->pos += k;
    return (ssize_t)k;
  }
  bool dead(std::string* err) override {
    if (f_->eof && f_->pos == f_->in.size()) return *err = "connection reset (fuzz)", true;
    return false;
  }

 private:
  Feed* f_;
};

// Opens connections whose reply bytes the current input supplies.
class FeedTransport : public StreamTransport {
 public:
  FuzzedDataProvider* fdp = nullptr;
  size_t maxWrite = SIZE_MAX;
  size_t revealStep = 32;  // reply bytes that arrive per round on every connection
  std::vector<std::unique_ptr<Feed>> feeds;
  std::unique_ptr<Conn> connect(int, const sockaddr_storage&, socklen_t, std::string* err) override {
    if (feeds.size() >= (size_t)kMaxConns) return *err = "connect: No route to host (fuzz)", nullptr;
    feeds.emplace_back(new Feed());
    Feed* f = feeds.back().get();
    f->maxWrite = maxWrite;
    f->eof = fdp->ConsumeBool();
    f->in = fdp->ConsumeBytes<uint8_t>(fdp->ConsumeIntegralInRange<size_t>(0, 512));
    return std::unique_ptr<Conn>(new FeedConn(f));
  }
};

FeedTransport gTransport;

using fuzz::makeNic;
using fuzz::quietLogger;

uint8_t pattern(uint64_t msg, uint64_t off) { return (uint8_t)(msg * 2654435761u + off * 40503u + (off >> 9) + 3); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setLogger(quietLogger);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  Config cfg;
  cfg.fatalTimeoutS = 0;  // no wall-clock verdicts
  cfg.nStreams = fdp.ConsumeIntegralInRange<int>(1, 3);
  cfg.minChunkBytes = 256;  // several chunks per message, striped over the streams
  Runtime::get().initForTest(cfg, {makeNic(0, "f0", "10.0.0.1"), makeNic(1, "f1", "10.0.1.1")}, &gTransport);
  gTransport.feeds.clear();
  gTransport.fdp = &fdp;
  size_t mw = fdp.ConsumeIntegralInRange<size_t>(0, 96);
  gTransport.maxWrite = mw ? mw : SIZE_MAX;
  gTransport.revealStep = fdp.ConsumeIntegralInRange<size_t>(1, 64);

  const int nSend = fdp.ConsumeIntegralInRange<int>(1, kMaxSend);
  const int postPerRound = fdp.ConsumeIntegralInRange<int>(1, nSend);
  std::vector<uint64_t> sizes(nSend);
  std::vector<std::unique_ptr<uint8_t[]>> bufs(nSend);
  for (int k = 0; k < nSend; ++k) {
    sizes[k] = fdp.ConsumeIntegralInRange<uint64_t>(0, 4096);
    bufs[k].reset(new uint8_t[sizes[k]]);  // exactly the message: ASan sees any over-read
    for (uint64_t j = 0; j < sizes[k]; ++j) bufs[k][j] = pattern(k, j);
  }

  wire::Handle h;
  h.secret = 0xC0FFEE5EC2E7ULL;
  h.naddr = 2;
  h.primary = 0;
  for (int i = 0; i < 2; ++i) {
    h.addrs[i].rail = (uint8_t)i, h.addrs[i].family = 4, h.addrs[i].port = (uint16_t)(2000 + i);
    h.addrs[i].addr[0] = 10, h.addrs[i].addr[2] = (uint8_t)i, h.addrs[i].addr[3] = 2;
  }
  std::string err;
  SendLink* link = SendLink::create(Runtime::get().linkDeps(), 0, handleToPeer(h), &err);
  FUZZ_CHECK(link != nullptr, "create failed: %s", err.c_str());

  // Highest seq the sender could have taken as acknowledged: ACK / RESUME_ACK frames it read.
  auto ackedByInput = [&] {
    uint64_t a = 0;
    for (auto& f : gTransport.feeds)
      for (size_t o = 0; o + wire::kFrameBytes <= f->pos; o += wire::kFrameBytes) {
        wire::Frame fr;
        std::string e;
        if (wire::decodeFrame(f->in.data() + o, &fr, &e) && (fr.type == wire::kAck || fr.type == wire::kResumeAck))
          a = std::max(a, fr.seq);
      }
    return a;
  };

  std::vector<void*> reqs(nSend, nullptr);
  std::vector<bool> done(nSend, false);
  int posted = 0;
  bool failed = false;
  int quiet = 0;
  for (int round = 0; round < kRounds && quiet < 3 && !failed; ++round) {
    auto progressOf = [&] {
      size_t s = 0;
      for (auto& f : gTransport.feeds) s += f->pos + f->out.size();
      return s + gTransport.feeds.size();
    };
    size_t before = progressOf();
    bool moved = false;
    std::string why;
    (void)link->connectStep(&why);  // hands the comm out once a path is up; errors show in isend/test
    for (int n = 0; n < postPerRound && posted < nSend; ++n) {
      void* q = nullptr;
      if (link->isend(bufs[posted].get(), sizes[posted], /*tag=*/0, &q) != ncclSuccess) {
        failed = true;
        break;
      }
      if (!q) break;  // ring full: try again next round
      reqs[posted++] = q;
      moved = true;
    }
    for (int k = 0; k < posted && !failed; ++k) {
      int d = 0, sz = -1;
      if (link->test((SendReq*)reqs[k], &d, &sz) != ncclSuccess) {
        FUZZ_CHECK(!done[k], "send %d reported an error after it completed", k);
        failed = true;
        break;
      }
      FUZZ_CHECK(!(done[k] && !d), "send %d was done and is no longer", k);
      if (d && !done[k]) {
        FUZZ_CHECK((uint64_t)k < ackedByInput(), "send %d completed, but the input acknowledged only seq < %llu", k,
                   (unsigned long long)ackedByInput());
        FUZZ_CHECK(sz == (int)sizes[k], "send %d completed with size %d, posted %llu", k, sz, (unsigned long long)sizes[k]);
        done[k] = true;
      }
    }
    for (auto& f : gTransport.feeds)  // the receiver's answers arrive a little at a time
      if (f->visible < f->in.size()) f->visible += gTransport.revealStep, moved = true;
    moved |= progressOf() != before;
    quiet = moved ? 0 : quiet + 1;
  }
  static const bool debug = getenv("RAILOVER_FUZZ_DEBUG") != nullptr;
  if (debug) {
    int nd = 0;
    for (bool d : done) nd += d;
    fprintf(stderr, "streams %d sends %d posted %d done %d failed %d connections %zu acked-by-input %llu\n", cfg.nStreams,
            nSend, posted, nd, failed, gTransport.feeds.size(), (unsigned long long)ackedByInput());
  }
  link->close();
  delete link;

  // Everything the sender wrote, connection by connection.
  for (auto& f : gTransport.feeds) {
    const std::vector<uint8_t>& o = f->out;
    if (o.size() < wire::kFrameBytes) continue;  // the HELLO was never (completely) written
    wire::Hello hello;
    std::string e;
    FUZZ_CHECK(wire::decodeHello(o.data(), &hello, &e), "sender wrote a bad HELLO: %s", e.c_str());
    FUZZ_CHECK(hello.secret == h.secret && hello.nStreams == cfg.nStreams, "HELLO has the wrong secret or stream count");
    size_t at = wire::kFrameBytes;
    while (at + wire::kFrameBytes <= o.size()) {
      wire::Frame fr;
      FUZZ_CHECK(wire::decodeFrame(o.data() + at, &fr, &e), "sender wrote an invalid frame: %s", e.c_str());
      FUZZ_CHECK(fr.type == wire::kData || fr.type == wire::kResume || fr.type == wire::kClose,
                 "sender wrote frame type %u", fr.type);
      at += wire::kFrameBytes;
      if (fr.type != wire::kData) continue;
      FUZZ_CHECK(fr.seq < (uint64_t)posted && fr.total == sizes[fr.seq], "DATA for seq %llu total %llu was never posted",
                 (unsigned long long)fr.seq, (unsigned long long)fr.total);
      size_t have = std::min<size_t>(fr.len, o.size() - at);  // the last chunk may be cut short
      FUZZ_CHECK(have == 0 || !memcmp(o.data() + at, bufs[fr.seq].get() + fr.offset, have),
                 "DATA for seq %llu at offset %llu carries other bytes than the send buffer", (unsigned long long)fr.seq,
                 (unsigned long long)fr.offset);
      at += fr.len;
    }
  }
  return 0;
}
