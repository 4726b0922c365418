#include "transport/tcp/wire.h"

#include <cstring>

namespace railover {
namespace wire {
namespace {

inline void put16(uint8_t* p, uint16_t v) { p[0] = v, p[1] = v >> 8; }
inline void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
inline void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
inline void put48(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 6; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
inline uint64_t get48(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 5; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint16_t get16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
inline uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

void encodeHandle(const Handle& h, void* outv) {
  uint8_t* out = (uint8_t*)outv;
  memset(out, 0, kHandleBytes);
  put32(out, kMagic);
  put16(out + 4, h.version);
  out[6] = h.naddr;
  out[7] = h.primary;
  put64(out + 8, h.secret);
  for (int i = 0; i < h.naddr && i < kMaxHandleAddrs; ++i) {
    uint8_t* a = out + 16 + 20 * i;
    a[0] = h.addrs[i].rail;
    a[1] = h.addrs[i].family;
    put16(a + 2, h.addrs[i].port);
    memcpy(a + 4, h.addrs[i].addr, 16);
  }
  out[kHandleTransportOffset] = h.transport;
}

const char* transportWireName(uint8_t t) {
  return t == kTransportTcp ? "tcp" : t == kTransportRdma ? "rdma" : "unknown";
}

bool decodeHandle(const void* inv, size_t len, Handle* h, std::string* err) {
  const uint8_t* in = (const uint8_t*)inv;
  if (len < 16) return *err = "handle too short", false;
  if (get32(in) != kMagic) return *err = "handle has a bad magic (not a railover handle)", false;
  h->version = get16(in + 4);
  if (h->version != kVersion)
    return *err = "handle has protocol version " + std::to_string(h->version) + ", this railover speaks " +
                  std::to_string(kVersion),
           false;
  h->naddr = in[6];
  h->primary = in[7];
  if (h->naddr == 0 || h->naddr > kMaxHandleAddrs)
    return *err = "handle lists " + std::to_string(h->naddr) + " addresses (1.." + std::to_string(kMaxHandleAddrs) + " allowed)", false;
  if (16 + 20 * (size_t)h->naddr > len) return *err = "handle truncated", false;
  if (h->primary >= h->naddr) return *err = "handle's primary index is out of range", false;
  h->secret = get64(in + 8);
  for (int i = 0; i < h->naddr; ++i) {
    const uint8_t* a = in + 16 + 20 * i;
    h->addrs[i].rail = a[0];
    h->addrs[i].family = a[1];
    h->addrs[i].port = get16(a + 2);
    memcpy(h->addrs[i].addr, a + 4, 16);
    if (a[1] != 4 && a[1] != 6) return *err = "handle address " + std::to_string(i) + " has an unknown family", false;
    if (h->addrs[i].port == 0) return *err = "handle address " + std::to_string(i) + " has port 0", false;
  }
  h->transport = len > kHandleTransportOffset ? in[kHandleTransportOffset] : kTransportTcp;
  if (h->transport != kTransportTcp && h->transport != kTransportRdma)
    return *err = "handle names transport " + std::to_string(h->transport) + ", which this railover does not know", false;
  return true;
}

void encodeHello(const Hello& h, void* outv) {
  uint8_t* out = (uint8_t*)outv;
  memset(out, 0, kFrameBytes);
  put32(out, kMagic);
  put16(out + 4, h.version);
  out[6] = h.stream;
  out[7] = h.nStreams;
  put64(out + 8, h.secret);
  out[16] = h.path;
  out[17] = h.srcRail;
  put16(out + 18, h.probePort);
  put32(out + 20, h.generation);
  put64(out + 24, h.connId);
}

bool decodeHello(const void* inv, Hello* h, std::string* err) {
  const uint8_t* in = (const uint8_t*)inv;
  if (get32(in) != kMagic) return *err = "bad magic", false;
  h->version = get16(in + 4);
  if (h->version != kVersion) return *err = "unsupported protocol version " + std::to_string(h->version), false;
  h->stream = in[6];
  h->nStreams = in[7];
  h->secret = get64(in + 8);
  h->path = in[16];
  h->srcRail = in[17];
  h->probePort = get16(in + 18);
  h->generation = get32(in + 20);
  h->connId = get64(in + 24);
  if (h->nStreams == 0 || h->nStreams > 64 || h->stream >= h->nStreams)
    return *err = "bad stream index " + std::to_string(h->stream) + "/" + std::to_string(h->nStreams), false;
  return true;
}

void encodeFrame(const Frame& f, void* outv) {
  uint8_t* out = (uint8_t*)outv;
  out[0] = f.type;
  out[1] = f.flags;
  put16(out + 2, f.stream);
  put32(out + 4, f.len);
  put64(out + 8, f.seq);
  put48(out + 16, f.offset);
  put48(out + 22, f.total);
  put32(out + 28, (uint32_t)f.tag);
}

bool decodeFrame(const void* inv, Frame* f, std::string* err) {
  const uint8_t* in = (const uint8_t*)inv;
  f->type = in[0];
  f->flags = in[1];
  f->stream = get16(in + 2);
  f->len = get32(in + 4);
  f->seq = get64(in + 8);
  f->offset = get48(in + 16);
  f->total = get48(in + 22);
  f->tag = (int32_t)get32(in + 28);
  switch (f->type) {
    case kData:
      if (f->len > kMaxChunkBytes) return *err = "DATA frame length " + std::to_string(f->len) + " exceeds the bound", false;
      if (f->total > kMaxMessageBytes) return *err = "DATA frame message size exceeds 1 TiB", false;
      if (f->offset > f->total || f->len > f->total - f->offset)
        return *err = "DATA frame chunk [" + std::to_string(f->offset) + "+" + std::to_string(f->len) +
                      ") lies outside its message of " + std::to_string(f->total) + " bytes",
               false;
      return true;
    case kProbe:
    case kProbeAck:
      if (f->len > 65536) return *err = "PROBE frame padding exceeds 64 KiB", false;
      return true;
    case kAck:
    case kResume:
    case kResumeAck:
    case kNack:
    case kClose:
      if (f->len != 0) return *err = "control frame carries a payload", false;
      return true;
    default:
      return *err = "unknown frame type " + std::to_string(f->type), false;
  }
}

uint64_t chunkSize(uint64_t size, int nStreams, uint64_t minChunk, uint64_t maxChunk) {
  if (nStreams < 1) nStreams = 1;
  uint64_t c = (size + nStreams - 1) / nStreams;
  c = (c + 127) & ~uint64_t(127);
  if (c < minChunk) c = minChunk;
  if (c > maxChunk) c = maxChunk & ~uint64_t(127);
  if (c == 0) c = 128;
  return c;
}

}  // namespace wire
}  // namespace railover
