#include "health/probe_wire.h"

#include <cstring>

namespace railover {
namespace probe {

void encodeNotice(const NicNotice& n, uint8_t* out) {
  memset(out, 0, wire::kFrameBytes + kNoticeBytes);
  wire::Frame f;
  f.type = wire::kProbe;
  f.flags = kFlagNotice;
  f.len = (uint32_t)kNoticeBytes;
  wire::encodeFrame(f, out);
  uint8_t* b = out + wire::kFrameBytes;
  b[0] = n.family;
  memcpy(b + 4, n.addr, n.family == 4 ? 4 : 16);
}

void encodeAddrChange(const AddrChange& c, uint8_t* out) {
  memset(out, 0, wire::kFrameBytes + kAddrChangeBytes);
  wire::Frame f;
  f.type = wire::kProbe;
  f.flags = kFlagAddrChange;
  f.len = (uint32_t)kAddrChangeBytes;
  wire::encodeFrame(f, out);
  uint8_t* b = out + wire::kFrameBytes;
  size_t al = c.family == 4 ? 4 : 16;
  b[0] = c.family;
  memcpy(b + 4, c.oldAddr, al);
  memcpy(b + 20, c.newAddr, al);
  b[36] = (uint8_t)(c.port & 0xff), b[37] = (uint8_t)(c.port >> 8);
}

bool decodeDatagram(const void* bufv, size_t n, Datagram* d, std::string* err) {
  const uint8_t* buf = (const uint8_t*)bufv;
  if (n < wire::kFrameBytes) return *err = "probe datagram of " + std::to_string(n) + " bytes is shorter than a frame header", false;
  if (!wire::decodeFrame(buf, &d->frame, err)) return false;
  const wire::Frame& f = d->frame;
  if (f.type != wire::kProbe && f.type != wire::kProbeAck)
    return *err = "frame type " + std::to_string(f.type) + " is not a probe", false;
  const uint8_t* b = buf + wire::kFrameBytes;
  size_t pl = n - wire::kFrameBytes;
  if (f.type == wire::kProbe && (f.flags & kFlagNotice)) {
    if (pl < kNoticeMinBytes) return *err = "NIC-down notice truncated (" + std::to_string(pl) + " payload bytes)", false;
    if (b[0] != 4 && b[0] != 6) return *err = "NIC-down notice has unknown address family " + std::to_string(b[0]), false;
    d->kind = Kind::kNotice;
    d->notice = NicNotice();
    d->notice.family = b[0];
    memcpy(d->notice.addr, b + 4, b[0] == 4 ? 4 : 16);
    return true;
  }
  if (f.type == wire::kProbe && (f.flags & kFlagAddrChange)) {
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
  d->kind = f.type == wire::kProbe ? Kind::kProbe : Kind::kProbeAck;
  return true;
}

}  // namespace probe
}  // namespace railover
