#include "transport/tcp/stream_path.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "common/tuning.h"

namespace railover {

std::unique_ptr<SendPath> StreamTransport::openSendPath(int nic, const sockaddr_storage& remote, socklen_t len, int nStreams,
                                                  const PathIdentity& id, const ChunkPolicy& chunks, std::string* err) {
  std::vector<std::unique_ptr<Conn>> conns;
  for (int i = 0; i < nStreams; ++i) {
    conns.push_back(connect(nic, remote, len, err));
    if (!conns.back()) return nullptr;
  }
  return std::unique_ptr<SendPath>(new StreamSendPath(std::move(conns), id, chunks));
}

StreamSendPath::StreamSendPath(std::vector<std::unique_ptr<Conn>> conns, const PathIdentity& id, const ChunkPolicy& chunks)
    : s_(conns.size()), id_(id), chunks_(chunks) {
  for (size_t i = 0; i < conns.size(); ++i) s_[i].conn = std::move(conns[i]);
}

int StreamSendPath::connectState(std::string* err) {
  bool all = true;
  for (size_t i = 0; i < s_.size(); ++i) {
    Stream& s = s_[i];
    if (s.connected) continue;
    if (!s.conn) return *err = "path fenced", -1;
    int r = s.conn->connectState(err);
    if (r < 0) return -1;
    if (r == 0) {
      all = false;
      continue;
    }
    wire::Hello h;
    h.stream = (uint8_t)i;
    h.nStreams = (uint8_t)s_.size();
    h.secret = id_.secret;
    h.path = id_.pathIndex;
    h.srcRail = id_.srcRail;
    h.probePort = id_.probePort;
    h.generation = id_.generation;
    h.connId = id_.connId;
    uint8_t buf[wire::kFrameBytes];
    wire::encodeHello(h, buf);
    if (!writeAll(*s.conn, buf, sizeof(buf), err)) return *err = "HELLO: " + *err, -1;
    s.connected = true;
  }
  return all ? 1 : 0;
}

uint64_t StreamSendPath::chunkBytes(uint64_t size) const {
  return wire::chunkSize(size, (int)s_.size(), chunks_.minChunkBytes, chunks_.maxChunkBytes);
}

void StreamSendPath::post(const ChunkRef& c, const void* src) {
  if (s_.empty()) return;
  if (c.len == 0) {  // a zero-byte message: its one (empty) DATA frame on stream 0
    s_[0].q.push_back({c, (const uint8_t*)src});
    return;
  }
  Stream* best = &s_[0];
  for (auto& s : s_)
    if (s.queuedBytes < best->queuedBytes) best = &s;
  best->q.push_back({c, (const uint8_t*)src});
  best->queuedBytes += c.len;
}

bool StreamSendPath::encodeCtl(const CtlMsg& m, uint8_t* out) {
  wire::Frame f;
  switch (m.type) {
    case CtlType::kAck: f.type = wire::kAck; break;
    case CtlType::kResume: f.type = wire::kResume, f.offset = m.arg; break;
    case CtlType::kResumeAck: f.type = wire::kResumeAck; break;
    case CtlType::kNack: f.type = wire::kNack; break;
    case CtlType::kClose: f.type = wire::kClose; break;
    case CtlType::kOther: return false;
  }
  f.seq = m.seq;
  wire::encodeFrame(f, out);
  return true;
}

void StreamSendPath::sendCtl(const CtlMsg& m) {
  uint8_t buf[wire::kFrameBytes];
  if (encodeCtl(m, buf)) ctlOut_.append((const char*)buf, sizeof(buf));
}

int StreamSendPath::writeStream(Stream& s, bool isCtl, std::string* err) {
  int moved = 0;
  while (true) {
    if (isCtl && !ctlOut_.empty() && !s.hdrBuilt) {
      iovec iov{(void*)ctlOut_.data(), ctlOut_.size()};
      ssize_t n = s.conn->writev(&iov, 1, err);
      if (n < 0) return -1;
      ctlOut_.erase(0, (size_t)n);
      if (!ctlOut_.empty()) return moved;
      continue;
    }
    if (s.q.empty()) return moved;
    Queued& e = s.q.front();
    const ChunkRef& c = e.c;
    if (!s.hdrBuilt) {
      wire::Frame f;
      f.type = wire::kData;
      f.len = (uint32_t)c.len;
      f.seq = c.seq;
      f.offset = c.offset;
      f.total = c.total;
      f.tag = c.tag;
      wire::encodeFrame(f, s.hdr);
      s.hdrBuilt = true, s.hdrDone = 0, s.payloadDone = 0;
    }
    iovec iov[2];
    int niov = 0;
    if (s.hdrDone < wire::kFrameBytes) iov[niov++] = {s.hdr + s.hdrDone, wire::kFrameBytes - s.hdrDone};
    if (c.len > s.payloadDone) iov[niov++] = {(void*)(e.src + s.payloadDone), c.len - s.payloadDone};
    ssize_t n = 0;
    if (niov) {
      n = s.conn->writev(iov, niov, err);
      if (n < 0) return -1;
      if (n == 0) return moved;
    }
    size_t h = std::min<size_t>((size_t)n, wire::kFrameBytes - s.hdrDone);
    s.hdrDone += h;
    s.payloadDone += (uint64_t)n - h;
    if (n > 0) moved = 1;
    if (s.hdrDone == wire::kFrameBytes && s.payloadDone == c.len) {
      s.queuedBytes -= c.len;
      s.q.pop_front();
      s.hdrBuilt = false;
      continue;
    }
    return moved;  // kernel buffer full
  }
}

int StreamSendPath::progress(std::string* err) {
  int moved = 0;
  for (size_t i = 0; i < s_.size(); ++i) {
    if (!s_[i].conn) return *err = "path fenced", -1;
    int r = writeStream(s_[i], i == 0, err);
    if (r < 0) return -1;
    moved |= r;
  }
  return moved;
}

int StreamSendPath::readFrame(Stream& s, wire::Frame* f, std::string* err) {
  ssize_t n = s.conn->read(s.rx + s.rxGot, wire::kFrameBytes - s.rxGot, err);
  if (n < 0) return -1;
  if (n == 0) return 0;
  s.rxGot += (size_t)n;
  if (s.rxGot < wire::kFrameBytes) return 0;
  s.rxGot = 0;
  if (!wire::decodeFrame(s.rx, f, err)) return *err = "protocol error from receiver: " + *err, -1;
  return 1;
}

CtlMsg StreamSendPath::toCtl(const wire::Frame& f) {
  CtlMsg m;
  m.seq = f.seq;
  switch (f.type) {
    case wire::kAck: m.type = CtlType::kAck; break;
    case wire::kResume: m.type = CtlType::kResume, m.arg = f.offset; break;
    case wire::kResumeAck: m.type = CtlType::kResumeAck; break;
    case wire::kNack: m.type = CtlType::kNack; break;
    case wire::kClose: m.type = CtlType::kClose; break;
    default: m.type = CtlType::kOther, m.arg = f.type; break;
  }
  return m;
}

int StreamSendPath::recvCtl(CtlMsg* m, std::string* err) {
  if (s_.empty() || !s_[0].conn) return *err = "path fenced", -1;
  wire::Frame f;
  int r = readFrame(s_[0], &f, err);
  if (r <= 0) return r;
  *m = toCtl(f);
  return 1;
}

int StreamSendPath::recvNotice(bool withCtl, CtlMsg* m, std::string* err) {
  for (size_t i = withCtl ? 0 : 1; i < s_.size(); ++i) {
    Stream& s = s_[i];
    if (!s.conn || !s.connected) continue;
    // Stream 0 reads into the same buffer as recvCtl(): should this standby become the active
    // path with part of a frame read, recvCtl() goes on from the same byte (reading it into
    // another buffer lost the frame boundary: fuzz_send found it).
    wire::Frame f;
    int r = readFrame(s, &f, err);
    if (r < 0) return -1;
    if (r == 0) continue;
    *m = toCtl(f);
    return 1;
  }
  return 0;
}

void StreamSendPath::sendClose() {
  uint8_t buf[wire::kFrameBytes];
  wire::Frame f;
  f.type = wire::kClose;
  wire::encodeFrame(f, buf);
  for (size_t i = 0; i < s_.size(); ++i) {
    Stream& s = s_[i];
    if (!s.conn || !s.connected || (s.hdrBuilt && (s.hdrDone > 0 || s.payloadDone > 0))) continue;
    std::string err;
    if (i == 0 && !ctlOut_.empty()) {
      iovec iov{(void*)ctlOut_.data(), ctlOut_.size()};
      ssize_t n = s.conn->writev(&iov, 1, &err);
      if (n < 0) continue;
      ctlOut_.erase(0, (size_t)n);
      if (!ctlOut_.empty()) continue;
    }
    writeAll(*s.conn, buf, sizeof(buf), &err);
  }
}

void StreamSendPath::fence() {
  for (auto& s : s_) {
    s.conn.reset();
    s.connected = false;
    s.q.clear();
    s.queuedBytes = 0, s.hdrBuilt = false, s.hdrDone = 0, s.payloadDone = 0, s.rxGot = 0;
  }
  ctlOut_.clear();
}

bool StreamSendPath::peerAckedWithinMs(uint32_t ms) {
  for (auto& s : s_)
    if (s.conn && s.conn->peerAckedWithinMs(ms)) return true;
  return false;
}

uint32_t StreamSendPath::unackedSilenceMs() {
  uint32_t m = 0;
  for (auto& s : s_)
    if (s.conn) m = std::max(m, s.conn->unackedSilenceMs());
  return m;
}

// ------------------------------------------------------------------------------------------
// Receive side

StreamRecvPath::StreamRecvPath(int nStreams) : s_((size_t)std::max(nStreams, 1)) {}

bool StreamRecvPath::adopt(int i, std::unique_ptr<Conn> c) {
  if (i < 0 || (size_t)i >= s_.size()) return false;
  s_[i] = Stream();
  s_[i].conn = std::move(c);
  return true;
}

static_assert(kMaxPeerAddrs == wire::kMaxHandleAddrs, "a handle address per path");
static_assert(kNackReasonUnknownComm == wire::kNackUnknownComm, "NACK reason codes are the wire's");

std::unique_ptr<RecvPath> StreamTransport::newRecvPath(int nStreams) {
  return std::unique_ptr<RecvPath>(new StreamRecvPath(nStreams));
}

bool StreamTransport::endLivenessCheck(Conn& c, std::string* err) {
  wire::Hello h;  // connId 0: a liveness check
  uint8_t buf[wire::kFrameBytes];
  wire::encodeHello(h, buf);
  return writeAll(c, buf, sizeof(buf), err);
}

StreamHello helloToStream(const wire::Hello& h) {
  StreamHello s;
  s.id.secret = h.secret;
  s.id.connId = h.connId;
  s.id.pathIndex = h.path;
  s.id.srcRail = h.srcRail;
  s.id.probePort = h.probePort;
  s.id.generation = h.generation;
  s.stream = h.stream;
  s.nStreams = h.nStreams;
  return s;
}

PeerHandle handleToPeer(const wire::Handle& h) {
  PeerHandle p;
  p.secret = h.secret;
  p.transport = wire::transportWireName(h.transport);
  p.primary = h.primary;
  p.naddr = std::min<int>(h.naddr, kMaxPeerAddrs);
  for (int i = 0; i < p.naddr; ++i) {
    const wire::HandleAddr& a = h.addrs[i];
    PeerHandle::Addr& o = p.addrs[i];
    o.rail = a.rail;
    if (a.family == 4) {
      auto* s = (sockaddr_in*)&o.addr;
      s->sin_family = AF_INET;
      s->sin_port = htons(a.port);
      memcpy(&s->sin_addr, a.addr, 4);
      o.len = sizeof(sockaddr_in);
    } else {
      auto* s = (sockaddr_in6*)&o.addr;
      s->sin6_family = AF_INET6;
      s->sin6_port = htons(a.port);
      memcpy(&s->sin6_addr, a.addr, 16);
      o.len = sizeof(sockaddr_in6);
    }
  }
  return p;
}

bool encodeWireHandle(const PeerHandle& p, void* out, std::string* err) {
  wire::Handle h;
  if (p.transport == "tcp") {
    h.transport = wire::kTransportTcp;
  } else if (p.transport == "rdma") {
    h.transport = wire::kTransportRdma;
  } else {
    return *err = "the handle layout has no code for transport \"" + p.transport + "\"", false;
  }
  if (p.naddr < 1 || p.naddr > wire::kMaxHandleAddrs || p.primary < 0 || p.primary >= p.naddr)
    return *err = "a handle needs 1.." + std::to_string(wire::kMaxHandleAddrs) + " addresses and a primary among them (" +
                  std::to_string(p.naddr) + " addresses, primary " + std::to_string(p.primary) + ")",
           false;
  h.secret = p.secret;
  h.primary = (uint8_t)p.primary;
  h.naddr = (uint8_t)p.naddr;
  for (int i = 0; i < p.naddr; ++i) {
    const PeerHandle::Addr& a = p.addrs[i];
    wire::HandleAddr& o = h.addrs[i];
    o.rail = (uint8_t)(a.rail & 0xff);
    if (a.addr.ss_family == AF_INET) {
      auto& s = (const sockaddr_in&)a.addr;
      o.family = 4;
      o.port = ntohs(s.sin_port);
      memcpy(o.addr, &s.sin_addr, 4);
    } else if (a.addr.ss_family == AF_INET6) {
      auto& s = (const sockaddr_in6&)a.addr;
      o.family = 6;
      o.port = ntohs(s.sin6_port);
      memcpy(o.addr, &s.sin6_addr, 16);
    } else {
      return *err = "handle address " + std::to_string(i) + " is neither IPv4 nor IPv6", false;
    }
  }
  uint8_t buf[wire::kHandleBytes];
  wire::encodeHandle(h, buf);
  static_assert(wire::kHandleTransportOffset < kTransportHandleBytes, "the transport byte is the transport's");
  static_assert(16 + 20 * wire::kMaxHandleAddrs <= kTransportHandleBytes, "the addresses are the transport's");
  memcpy(out, buf, kTransportHandleBytes);
  return true;
}

bool decodeWireHandle(const void* in, size_t len, PeerHandle* p, std::string* err) {
  wire::Handle h;
  if (!wire::decodeHandle(in, std::min(len, kTransportHandleBytes), &h, err)) return false;
  *p = handleToPeer(h);
  return true;
}

bool StreamTransport::encodeHandle(const PeerHandle& h, void* out, std::string* err) {
  if (h.transport != name()) return *err = "a " + h.transport + " handle asked of the " + name() + " transport", false;
  return encodeWireHandle(h, out, err);
}

bool StreamTransport::decodeHandle(const void* in, size_t len, PeerHandle* h, std::string* err) {
  return decodeWireHandle(in, len, h, err);
}

int StreamRecvPath::connectState(std::string* err) {
  for (auto& s : s_)
    if (!s.conn) return 0;
  (void)err;
  return 1;
}

void StreamRecvPath::sendCtl(const CtlMsg& m) {
  uint8_t buf[wire::kFrameBytes];
  if (StreamSendPath::encodeCtl(m, buf)) ctlOut_.append((const char*)buf, sizeof(buf));
}

int StreamRecvPath::flushCtl(std::string* err) {
  if (ctlOut_.empty()) return 0;
  if (s_.empty() || !s_[0].conn) return *err = "path fenced", -1;
  iovec iov{(void*)ctlOut_.data(), ctlOut_.size()};
  ssize_t n = s_[0].conn->writev(&iov, 1, err);
  if (n < 0) return -1;
  ctlOut_.erase(0, (size_t)n);
  return 0;
}

int StreamRecvPath::recvCtl(CtlMsg* m, std::string* err) {
  if (s_.empty() || !s_[0].conn) return *err = "path fenced", -1;
  ssize_t n = s_[0].conn->read(ctlIn_ + ctlInGot_, wire::kFrameBytes - ctlInGot_, err);
  if (n < 0) return -1;
  if (n == 0) return 0;
  ctlInGot_ += (size_t)n;
  if (ctlInGot_ < wire::kFrameBytes) return 0;
  ctlInGot_ = 0;
  wire::Frame f;
  if (!wire::decodeFrame(ctlIn_, &f, err)) return *err = "protocol error from sender: " + *err, -1;
  *m = StreamSendPath::toCtl(f);
  return 1;
}

int StreamRecvPath::progress(RecvSink& sink, std::string* err) {
  if (flushCtl(err) < 0) return -1;
  int moved = 0;
  for (auto& s : s_) {
    if (!s.conn) return *err = "path fenced", -1;
    int r = readStream(s, sink, err);
    if (r < 0) return -1;
    moved |= r;
  }
  return moved;
}

int StreamRecvPath::readStream(Stream& s, RecvSink& sink, std::string* err) {
  // Discarded payload is read into a per-thread scratch buffer, allocated on first use (only
  // a RESUME produces duplicates; one per receive path would be most of a comm's memory).
  static thread_local std::vector<uint8_t> scratch;
  uint64_t budget = tuning::kRecvBudgetBytesPerPass;  // bytes per stream per pass, so other streams get their turn
  int moved = 0;
  while (budget > 0) {
    if (!s.haveHdr) {
      ssize_t n = s.conn->read(s.hdr + s.hdrGot, wire::kFrameBytes - s.hdrGot, err);
      if (n < 0) return -1;
      if (n == 0) return moved;
      moved = 1;
      s.hdrGot += (size_t)n;
      if (s.hdrGot < wire::kFrameBytes) return moved;
      s.hdrGot = 0;
      if (!wire::decodeFrame(s.hdr, &s.cur, err)) return *err = "protocol error from sender: " + *err, -1;
      if (s.cur.type != wire::kData) {
        if (!sink.control(StreamSendPath::toCtl(s.cur), err)) return -1;
        continue;
      }
      s.haveHdr = true;
      s.placed = false;
      s.curGot = 0;
    }
    const wire::Frame& f = s.cur;
    ChunkRef c;
    c.seq = f.seq, c.offset = f.offset, c.len = f.len, c.total = f.total, c.tag = f.tag;
    if (!s.placed) {
      uint8_t* dst = nullptr;
      int r = sink.place(c, &dst, err);
      if (r < 0) return -1;
      if (r == RecvSink::kHold) return moved;  // leave it in the socket
      s.placed = true;
      s.discard = r == RecvSink::kDiscard;
      s.dst = dst;
    }
    while (s.curGot < f.len) {
      uint64_t want = f.len - s.curGot;
      uint8_t* dst;
      if (s.discard) {
        if (scratch.empty()) scratch.resize(tuning::kDiscardBufferBytes);
        want = std::min<uint64_t>(want, scratch.size());
        dst = scratch.data();
      } else {
        dst = s.dst + s.curGot;
      }
      ssize_t n = s.conn->read(dst, want, err);
      if (n < 0) return -1;
      if (n == 0) return moved;
      moved = 1;
      s.curGot += (uint64_t)n;
      budget -= std::min<uint64_t>(budget, (uint64_t)n);
    }
    s.haveHdr = false;
    s.placed = false;
    sink.arrived(c, s.discard);
  }
  return moved;
}

void StreamRecvPath::sendClose(uint64_t reason) {
  uint8_t buf[wire::kFrameBytes];
  wire::Frame f;
  f.type = wire::kClose;
  f.seq = reason;
  wire::encodeFrame(f, buf);
  for (size_t i = 0; i < s_.size(); ++i) {
    Stream& s = s_[i];
    if (!s.conn) continue;
    std::string err;
    if (i == 0 && !ctlOut_.empty()) {
      iovec iov{(void*)ctlOut_.data(), ctlOut_.size()};
      ssize_t n = s.conn->writev(&iov, 1, &err);
      if (n < 0) continue;
      ctlOut_.erase(0, (size_t)n);
      if (!ctlOut_.empty()) continue;
    }
    writeAll(*s.conn, buf, sizeof(buf), &err);
  }
}

void StreamRecvPath::fence() {
  for (auto& s : s_) s = Stream();
  ctlOut_.clear();
  ctlInGot_ = 0;
}

}  // namespace railover
