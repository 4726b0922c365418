// Fuzz target: the receive path of a comm (RecvLink), driven through its real entry points
// (offerStream as the acceptor calls it, irecv, test, ready, close) over in-memory streams
// whose bytes the input chooses. Everything a sender writes is untrusted: frame headers,
// chunk bounds, sequence numbers, RESUMEs on standby paths, reconnects with new generations.
//
// The input picks 1..8 receives (capacity 0..2048 bytes each, posted a few per round), how
// often a read returns only a few bytes (partial frame headers and payloads), and one or two paths of
// 1..3 streams each (HELLO fields included). Two modes:
//   raw         every stream's bytes come straight from the input;
//   structured  the input picks message sizes, chunk size, which stream carries each chunk,
//               and optionally a failover: path A carries some messages and part of the
//               next (then maybe resets), path B (connected from the start, a standby)
//               then receives RESUME(r), r <= the last ACK the receiver sent on A, and
//               every message from r again, as a sender does once A is drained or dropped.
//
// Invariants checked (any violation aborts, so libFuzzer saves the input):
//  * no byte is written outside a posted buffer: each buffer is its own heap block of exactly
//    its capacity, so ASan reports any write past it (also for capacity 0);
//  * a receive completes at most once: once test() says done with size s, later calls say
//    done with the same s, and its buffer never changes again; s <= capacity;
//  * every frame the receiver writes back decodes, is ACK / RESUME_ACK / CLOSE, and its
//    sequence number never exceeds the receives posted; every receive below an ACKed
//    sequence number is done;
//  * structured mode: every receive completes with exactly the bytes sent, bytes past the
//    message in its buffer are untouched, no error is reported, and (without a failover)
//    the last ACK covers all.
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

constexpr int kMaxRecv = 8;
constexpr int kRounds = 1 << 20;  // a bound only: a run stops after 3 rounds without progress
constexpr uint8_t kFill = 0xEE;

// One direction pair of an in-memory stream: `in` is what the sender wrote (the input),
// `out` what the receiver wrote back.
struct Feed {
  std::vector<uint8_t> in;
  size_t pos = 0;
  size_t maxRead = SIZE_MAX;  // bytes a short read() returns at most
  size_t shortEvery = 1;      // every shortEvery-th read is short (others return all they can)
  size_t reads = 0;
  bool eof = false;           // the connection breaks after `in`, with error `eofErr`
  const char* eofErr = "connection reset (fuzz)";
  bool gated = false;         // nothing arrives yet (a standby before the sender fails over)
  bool closed = false;        // the receiver dropped its end
  std::vector<uint8_t> out;
  bool drained() const { return pos == in.size(); }
};

class FeedConn : public Conn {
 public:
  explicit FeedConn(Feed* f) : f_(f) {}
  ~FeedConn() override { f_->closed = true; }
  int connectState(std::string*) override { return 1; }
  ssize_t writev(const iovec* iov, int n, std::string*) override {
    size_t done = 0;
    for (int i = 0; i < n; ++i) {
      f_->out.insert(f_->out.end(), (const uint8_t*)iov[i].iov_base, (const uint8_t*)iov[i].iov_base + iov[i].iov_len);
      done += iov[i].iov_len;
    }
    return (ssize_t)done;
  }
  ssize_t read(void* buf, size_t len, std::string* err) override {
    if (f_->gated) return 0;
    size_t left = f_->in.size() - f_->pos;
    if (!left) {
      if (f_->eof) return *err = f_->eofErr, -1;
      return 0;
    }
    size_t k = std::min(len, left);
    if (++f_->reads % f_->shortEvery == 0) k = std::min(k, f_->maxRead);
    memcpy(buf, f_->in.data() + f_->pos, k);
    f_->pos += k;
    return (ssize_t)k;
  }
  bool dead(std::string* err) override {
    if (!f_->gated && f_->drained() && f_->eof) return *err = f_->eofErr, true;
    return false;
  }

 private:
  Feed* f_;
};

using fuzz::makeNic;
using fuzz::quietLogger;

// The receiver opens no streams of its own here: it builds its paths' receive sides (stream
// paths over the fed streams) and nothing else.
class NoConnectTransport : public StreamTransport {
 public:
  std::unique_ptr<Conn> connect(int, const sockaddr_storage&, socklen_t, std::string* err) override {
    return *err = "no outgoing connections (fuzz)", nullptr;
  }
};
NoConnectTransport gTransport;

void setup() {
  setLogger(quietLogger);
  Config cfg;
  cfg.fatalTimeoutS = 0;  // no wall-clock verdicts: a run must depend on its input only
  Runtime::get().initForTest(cfg, {makeNic(0, "f0", "10.0.0.1"), makeNic(1, "f1", "10.0.1.1")}, &gTransport);
}

uint8_t pattern(uint64_t msg, uint64_t off) { return (uint8_t)(msg * 2654435761u + off * 40503u + (off >> 9) + 1); }

// Message k as the sender has it (2048 bytes: the largest capacity).
const std::vector<uint8_t>& content(int k) {
  static std::vector<std::vector<uint8_t>> c = [] {
    std::vector<std::vector<uint8_t>> v(kMaxRecv, std::vector<uint8_t>(2048));
    for (int m = 0; m < kMaxRecv; ++m)
      for (size_t j = 0; j < 2048; ++j) v[m][j] = pattern(m, j);
    return v;
  }();
  return c[k];
}

void putFrame(std::vector<uint8_t>* v, const wire::Frame& f) {
  uint8_t b[wire::kFrameBytes];
  wire::encodeFrame(f, b);
  v->insert(v->end(), b, b + sizeof(b));
}

struct PathIn {
  wire::Hello hello;
  std::vector<std::unique_ptr<Feed>> feeds;
  int offerRound = 0;  // raw mode: round at which its streams reach the receiver
  bool offered = false;
};

// Appends the chunks of message k to the streams of `p`, each stream chosen by the input.
void sendMessage(FuzzedDataProvider& fdp, PathIn& p, uint64_t k, uint64_t size, uint64_t chunk, uint64_t nChunks) {
  uint64_t off = 0;
  for (uint64_t c = 0; c < nChunks; ++c) {
    uint64_t len = size == 0 ? 0 : std::min(chunk, size - off);
    auto& v = p.feeds[fdp.ConsumeIntegralInRange<size_t>(0, p.feeds.size() - 1)]->in;
    wire::Frame f;
    f.type = wire::kData, f.seq = k, f.offset = off, f.len = (uint32_t)len, f.total = size;
    putFrame(&v, f);
    v.insert(v.end(), content((int)k).begin() + off, content((int)k).begin() + off + len);
    off += len;
  }
}

uint64_t chunksOf(uint64_t size, uint64_t chunk) { return size == 0 ? 1 : (size + chunk - 1) / chunk; }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setup();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  const bool structured = fdp.ConsumeBool();
  const int nRecv = fdp.ConsumeIntegralInRange<int>(1, kMaxRecv);
  const int postPerRound = fdp.ConsumeIntegralInRange<int>(1, nRecv);
  const size_t maxRead = fdp.ConsumeIntegralInRange<size_t>(0, 64);  // 0: no short reads
  const size_t shortEvery = fdp.ConsumeIntegralInRange<size_t>(1, 8);
  std::vector<uint64_t> caps(nRecv), sizes(nRecv);
  for (int k = 0; k < nRecv; ++k) caps[k] = fdp.ConsumeIntegralInRange<uint64_t>(0, 2048);

  const uint64_t secret = 0x5EC2E7F022ULL;
  std::vector<PathIn> paths(structured ? 1 : fdp.ConsumeIntegralInRange<int>(1, 2));
  auto initPath = [&](PathIn& p, uint8_t index) {
    int ns = fdp.ConsumeIntegralInRange<int>(1, 3);
    p.hello.secret = secret;
    p.hello.nStreams = (uint8_t)ns;
    p.hello.path = index;
    p.hello.srcRail = index;
    p.hello.generation = structured ? 0 : fdp.ConsumeIntegralInRange<uint32_t>(0, 2);
    for (int s = 0; s < ns; ++s) {
      p.feeds.emplace_back(new Feed());
      p.feeds.back()->maxRead = maxRead ? maxRead : SIZE_MAX;
      p.feeds.back()->shortEvery = shortEvery;
    }
  };

  uint64_t resumeChoice = 0, chunk = 1;
  bool failover = false;
  if (structured) {
    // A sender's view: messages 0..nRecv-1, a fixed chunk size, maybe a failover to path B.
    for (int k = 0; k < nRecv; ++k) sizes[k] = fdp.ConsumeIntegralInRange<uint64_t>(0, caps[k]);
    chunk = fdp.ConsumeIntegralInRange<uint64_t>(1, 600);
    failover = fdp.ConsumeBool();
    initPath(paths[0], 0);
    wire::Frame resume;
    resume.type = wire::kResume, resume.seq = 0;
    putFrame(&paths[0].feeds[0]->in, resume);
    int cut = failover ? fdp.ConsumeIntegralInRange<int>(0, nRecv) : nRecv;
    for (int k = 0; k < cut; ++k) sendMessage(fdp, paths[0], k, sizes[k], chunk, chunksOf(sizes[k], chunk));
    if (failover) {
      if (cut < nRecv) {  // part of the next message, then the path dies or goes quiet
        uint64_t n = chunksOf(sizes[cut], chunk);
        sendMessage(fdp, paths[0], cut, sizes[cut], chunk, fdp.ConsumeIntegralInRange<uint64_t>(0, n - 1));
      }
      for (auto& f : paths[0].feeds) f->eof = fdp.ConsumeBool();
      paths.emplace_back();
      initPath(paths[1], 1);
      for (auto& f : paths[1].feeds) f->gated = true;  // filled and opened once A is drained or dropped
      resumeChoice = fdp.ConsumeIntegralInRange<uint64_t>(0, cut);
    }
  } else {
    for (size_t i = 0; i < paths.size(); ++i) {
      initPath(paths[i], fdp.ConsumeIntegralInRange<uint8_t>(0, 6));  // 5 and 6 are out of range
      paths[i].offerRound = i == 0 ? 0 : fdp.ConsumeIntegralInRange<int>(0, 8);
      for (auto& f : paths[i].feeds) {
        f->eof = fdp.ConsumeBool();
        if (fdp.ConsumeBool()) f->eofErr = "connection closed by peer (fuzz)";  // the peer process exited
        f->in = fdp.ConsumeBytes<uint8_t>(fdp.ConsumeIntegralInRange<size_t>(0, 4096));
      }
    }
  }

  // The receiver's buffers: one heap block of exactly `cap` bytes each.
  std::vector<std::unique_ptr<uint8_t[]>> bufs(nRecv);
  for (int k = 0; k < nRecv; ++k) {
    bufs[k].reset(new uint8_t[caps[k]]);
    memset(bufs[k].get(), kFill, caps[k]);
  }
  std::vector<void*> reqs(nRecv, nullptr);
  std::vector<int> doneSize(nRecv, -1);
  std::vector<std::vector<uint8_t>> atDone(nRecv);
  int posted = 0;
  bool failed = false;

  sockaddr_storage peer{};
  ((sockaddr_in&)peer).sin_family = AF_INET;
  inet_pton(AF_INET, "10.0.0.2", &((sockaddr_in&)peer).sin_addr);
  auto* link = new RecvLink(Runtime::get().linkDeps(), secret, /*connId=*/0, /*dev=*/0);
  static const bool debug = getenv("RAILOVER_FUZZ_DEBUG") != nullptr;  // prints the scenario
  if (debug) {
    fprintf(stderr, "structured %d nRecv %d postPerRound %d maxRead %zu\n", structured, nRecv, postPerRound, maxRead);
    for (int k = 0; k < nRecv; ++k) fprintf(stderr, "  recv %d cap %llu size %llu\n", k, (unsigned long long)caps[k], (unsigned long long)sizes[k]);
    for (auto& p : paths) {
      fprintf(stderr, "  path %u gen %u streams %u offerRound %d\n", p.hello.path, p.hello.generation, p.hello.nStreams, p.offerRound);
      for (auto& f : p.feeds) {
        fprintf(stderr, "    feed %zu bytes eof %d gated %d:", f->in.size(), f->eof, f->gated);
        for (size_t o = 0; o + wire::kFrameBytes <= f->in.size() && o < 4096;) {
          wire::Frame fr;
          std::string e;
          bool ok = wire::decodeFrame(f->in.data() + o, &fr, &e);
          fprintf(stderr, " [t%u s%llu o%llu l%u T%llu%s]", fr.type, (unsigned long long)fr.seq, (unsigned long long)fr.offset, fr.len,
                  (unsigned long long)fr.total, ok ? "" : " bad");
          o += wire::kFrameBytes + (ok && fr.type == wire::kData ? fr.len : 0);
        }
        fprintf(stderr, "\n");
      }
    }
  }

  auto offer = [&](PathIn& p) {
    for (size_t s = 0; s < p.feeds.size(); ++s) {
      wire::Hello h = p.hello;
      h.stream = (uint8_t)s;
      std::unique_ptr<Conn> c(new FeedConn(p.feeds[s].get()));
      link->offerStream(c, helloToStream(h), peer, p.hello.path % 2);  // refused once the link ended: c closes
    }
    p.offered = true;
  };
  auto checkDone = [&](int k, int done, int sz) {
    if (doneSize[k] >= 0) {
      FUZZ_CHECK(done == 1 && sz == doneSize[k], "receive %d completed again (done %d, size %d, was %d)", k, done, sz,
                 doneSize[k]);
      FUZZ_CHECK(caps[k] == 0 || !memcmp(atDone[k].data(), bufs[k].get(), caps[k]),
                 "receive %d's buffer changed after it completed", k);
    } else if (done) {
      FUZZ_CHECK(sz >= 0 && (uint64_t)sz <= caps[k], "receive %d completed with %d bytes, capacity %llu", k, sz,
                 (unsigned long long)caps[k]);
      doneSize[k] = sz;
      atDone[k].assign(bufs[k].get(), bufs[k].get() + caps[k]);
    }
  };

  offer(paths[0]);
  int quiet = 0;
  for (int round = 0; round < kRounds && quiet < 3; ++round) {
    bool moved = false;
    size_t before = 0, after = 0;
    for (auto& p : paths)
      for (auto& f : p.feeds) before += f->pos;
    for (size_t i = 1; i < paths.size(); ++i) {
      if (!paths[i].offered && (structured || round >= paths[i].offerRound)) offer(paths[i]), moved = true;
      bool aDrained = true;
      for (auto& f : paths[0].feeds) aDrained &= f->drained() || f->closed;
      for (auto& f : paths[i].feeds)
        if (f->gated && aDrained) f->gated = false, moved = true;
      if (moved && structured && failover && paths[1].feeds[0]->in.empty()) {
        // The sender fails over: resume from its first unacknowledged message (or earlier).
        uint64_t acked = 0;
        for (size_t o = 0; o + wire::kFrameBytes <= paths[0].feeds[0]->out.size(); o += wire::kFrameBytes) {
          wire::Frame fr;
          std::string e;
          if (wire::decodeFrame(paths[0].feeds[0]->out.data() + o, &fr, &e) && fr.type == wire::kAck) acked = std::max(acked, fr.seq);
        }
        wire::Frame resume;
        resume.type = wire::kResume, resume.seq = std::min(resumeChoice, acked);
        putFrame(&paths[1].feeds[0]->in, resume);
        for (int k = (int)resume.seq; k < nRecv; ++k) sendMessage(fdp, paths[1], k, sizes[k], chunk, chunksOf(sizes[k], chunk));
      }
    }
    link->ready();  // runs the slow tick: takes offered streams, reads RESUMEs on standby paths
    for (int n = 0; n < postPerRound && posted < nRecv && !failed; ++n) {
      void* q = nullptr;
      void* data = bufs[posted].get();
      const int tag = 0;
      ncclResult_t r = link->irecv(1, &data, &caps[posted], &tag, &q);
      if (r != ncclSuccess) {
        failed = true;
        break;
      }
      FUZZ_CHECK(q != nullptr, "irecv accepted receive %d without a request (ring of %d not full)", posted, kRing);
      reqs[posted++] = q;
      moved = true;
    }
    bool allDone = posted == nRecv;
    for (int k = 0; k < posted && !failed; ++k) {
      int done = 0, sz = -1;
      ncclResult_t r = link->test((RecvReq*)reqs[k], &done, &sz);
      if (r != ncclSuccess) {
        FUZZ_CHECK(doneSize[k] < 0, "receive %d reported an error after it completed", k);
        failed = true;
        break;
      }
      checkDone(k, done, done ? sz : -1);
      allDone &= done == 1;
    }
    for (auto& p : paths)
      for (auto& f : p.feeds) after += f->pos;
    moved |= after != before;
    if (debug) fprintf(stderr, "round %d: posted %d consumed %zu -> %zu failed %d\n", round, posted, before, after, failed);
    if (allDone || failed) break;
    quiet = moved ? 0 : quiet + 1;
  }

  // Everything the receiver wrote back: whole, valid control frames; ACKs only for done receives.
  uint64_t lastAck = 0;
  for (auto& p : paths)
    for (auto& f : p.feeds) {
      FUZZ_CHECK(f->out.size() % wire::kFrameBytes == 0, "receiver wrote %zu bytes, not whole frames", f->out.size());
      for (size_t o = 0; o < f->out.size(); o += wire::kFrameBytes) {
        wire::Frame fr;
        std::string err;
        FUZZ_CHECK(wire::decodeFrame(f->out.data() + o, &fr, &err), "receiver wrote an invalid frame: %s", err.c_str());
        FUZZ_CHECK(fr.type == wire::kAck || fr.type == wire::kResumeAck || fr.type == wire::kClose,
                   "receiver wrote frame type %u", fr.type);
        if (fr.type == wire::kClose) {  // before close(): only a link that ended in a fatal error says so
          FUZZ_CHECK(fr.seq == kCloseReasonFatal && link->isFatal(), "receiver wrote CLOSE (reason %llu) while %s",
                     (unsigned long long)fr.seq, link->isFatal() ? "fatal" : "not fatal");
          continue;
        }
        FUZZ_CHECK(fr.seq <= (uint64_t)posted, "receiver acknowledged seq %llu with %d receives posted",
                   (unsigned long long)fr.seq, posted);
        for (uint64_t k = 0; k < fr.seq; ++k)
          FUZZ_CHECK(doneSize[k] >= 0 || ((RecvReq*)reqs[k])->done, "seq %llu acknowledged, receive %llu not complete",
                     (unsigned long long)fr.seq, (unsigned long long)k);
        if (fr.type == wire::kAck) lastAck = std::max(lastAck, fr.seq);
      }
    }
  if (structured) {
    FUZZ_CHECK(!failed && posted == nRecv, "a valid stream failed (posted %d of %d)", posted, nRecv);
    for (int k = 0; k < nRecv; ++k) {
      FUZZ_CHECK(doneSize[k] == (int)sizes[k], "receive %d: size %d, sent %llu", k, doneSize[k], (unsigned long long)sizes[k]);
      FUZZ_CHECK(sizes[k] == 0 || !memcmp(bufs[k].get(), content(k).data(), sizes[k]), "receive %d holds other bytes than were sent", k);
      std::vector<uint8_t> fill(caps[k] - sizes[k], kFill);
      FUZZ_CHECK(fill.empty() || !memcmp(bufs[k].get() + sizes[k], fill.data(), fill.size()), "receive %d: a byte past the message was written", k);
    }
    // Without a failover the path stays up, so the receiver must have acknowledged everything
    // (after a failover the last completion may have come just as path A broke).
    if (!failover)
      FUZZ_CHECK(lastAck == (uint64_t)nRecv, "last ACK %llu, %d messages complete", (unsigned long long)lastAck, nRecv);
  }
  link->close();
  delete link;
  // After close, no buffer of a completed receive may have changed.
  for (int k = 0; k < nRecv; ++k)
    if (doneSize[k] >= 0)
      FUZZ_CHECK(caps[k] == 0 || !memcmp(atDone[k].data(), bufs[k].get(), caps[k]), "receive %d changed at close", k);
  return 0;
}
