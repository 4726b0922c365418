#include "health/probe_wire.h"

#include <cstring>

namespace railover {
namespace probe {
namespace {

void putLe(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
uint64_t getLe(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

void encodeHeader(const Header& h, uint8_t* out) {
  memset(out, 0, kHeaderBytes);
  out[0] = h.type;
  out[1] = h.flags;
  putLe(out + 2, h.mtu, 2);
  putLe(out + 4, h.len, 4);
  putLe(out + 8, h.seq, 8);
  putLe(out + 16, h.sentUs, 6);
  putLe(out + 22, h.responder, 6);
}

bool decodeHeader(const uint8_t* in, Header* h, std::string* err) {
  h->type = in[0];
  h->flags = in[1];
  h->mtu = (uint16_t)getLe(in + 2, 2);
  h->len = (uint32_t)getLe(in + 4, 4);
  h->seq = getLe(in + 8, 8);
  h->sentUs = getLe(in + 16, 6);
  h->responder = getLe(in + 22, 6);
  if (h->type != kTypeProbe && h->type != kTypeProbeAck)
    return *err = "frame type " + std::to_string(h->type) + " is not a probe", false;
  if (h->len > kMaxLenBytes) return *err = "PROBE frame padding exceeds 64 KiB", false;
  return true;
}

void answerHeader(uint8_t* hdr, uint64_t responder, uint16_t mtu) {
  hdr[0] = kTypeProbeAck;
  putLe(hdr + 2, mtu, 2);
  putLe(hdr + 22, responder, 6);
}

void encodeNotice(const NicNotice& n, uint8_t* out) {
  memset(out, 0, kHeaderBytes + kNoticeBytes);
  Header h;
  h.flags = kFlagNotice;
  h.len = (uint32_t)kNoticeBytes;
  encodeHeader(h, out);
  uint8_t* b = out + kHeaderBytes;
  b[0] = n.family;
  memcpy(b + 4, n.addr, n.family == 4 ? 4 : 16);
}

void encodeAddrChange(const AddrChange& c, uint8_t* out) {
  memset(out, 0, kHeaderBytes + kAddrChangeBytes);
  Header h;
  h.flags = kFlagAddrChange;
  h.len = (uint32_t)kAddrChangeBytes;
  encodeHeader(h, out);
  uint8_t* b = out + kHeaderBytes;
  size_t al = c.family == 4 ? 4 : 16;
  b[0] = c.family;
  memcpy(b + 4, c.oldAddr, al);
  memcpy(b + 20, c.newAddr, al);
  b[36] = (uint8_t)(c.port & 0xff), b[37] = (uint8_t)(c.port >> 8);
}

bool decodeDatagram(const void* bufv, size_t n, Datagram* d, std::string* err) {
  const uint8_t* buf = (const uint8_t*)bufv;
  if (n < kHeaderBytes) return *err = "probe datagram of " + std::to_string(n) + " bytes is shorter than a frame header", false;
  if (!decodeHeader(buf, &d->header, err)) return false;
  const Header& f = d->header;
  const uint8_t* b = buf + kHeaderBytes;
  size_t pl = n - kHeaderBytes;
  if (f.type == kTypeProbe && (f.flags & kFlagNotice)) {
    if (pl < kNoticeMinBytes) return *err = "NIC-down notice truncated (" + std::to_string(pl) + " payload bytes)", false;
    if (b[0] != 4 && b[0] != 6) return *err = "NIC-down notice has unknown address family " + std::to_string(b[0]), false;
    d->kind = Kind::kNotice;
    d->notice = NicNotice();
    d->notice.family = b[0];
    memcpy(d->notice.addr, b + 4, b[0] == 4 ? 4 : 16);
    return true;
  }
  if (f.type == kTypeProbe && (f.flags & kFlagAddrChange)) {
    if (pl < kAddrChangeBytes) return *err = "address change notice truncated (" + std::to_string(pl) + " payload bytes)", false;
    if (b[0] != 4 && b[0] != 6) return *err = "address change notice has unknown address family " + std::to_string(b[0]), false;
    size_t al = b[0] == 4 ? 4 : 16;
    d->kind = Kind::kAddrChange;
    d->change = AddrChange();
    d->change.family = b[0];
    memcpy(d->change.oldAddr, b + 4, al);
    memcpy(d->change.newAddr, b + 20, al);
    d->change.port = (uint16_t)(b[36] | (b[37] << 8));
    return true;
  }
  d->kind = f.type == kTypeProbe ? Kind::kProbe : Kind::kProbeAck;
  return true;
}

}  // namespace probe
}  // namespace railover
