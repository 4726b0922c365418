#include "health/rules.h"

#include <string>

#include "transport/tcp/wire.h"

namespace railover {
namespace health {

constexpr uint8_t kFlagBig = 1;
static_assert(kProbeHeaderBytes == wire::kFrameBytes, "a probe header is one wire frame");

void encodeProbe(const Probe& p, uint8_t* out) {
  wire::Frame f;
  f.type = p.ack ? wire::kProbeAck : wire::kProbe;
  f.flags = p.big ? kFlagBig : 0;
  f.len = p.padding;
  f.seq = p.id;
  f.offset = p.sentUs;
  f.total = p.ack ? p.responder : 0;
  wire::encodeFrame(f, out);
}

bool decodeProbe(const uint8_t* in, size_t n, Probe* p) {
  if (n < kProbeHeaderBytes) return false;
  wire::Frame f;
  std::string err;
  if (!wire::decodeFrame(in, &f, &err) || (f.type != wire::kProbe && f.type != wire::kProbeAck)) return false;
  if (f.flags & ~kFlagBig) return false;  // notices and address changes are parsed elsewhere
  if (n != kProbeHeaderBytes + f.len) return false;
  p->ack = f.type == wire::kProbeAck;
  p->big = f.flags & kFlagBig;
  p->id = f.seq;
  p->sentUs = f.offset;
  p->responder = p->ack ? f.total : 0;
  p->padding = f.len;
  return true;
}

void answerProbe(uint8_t* buf, uint64_t responder) {
  wire::Frame f;
  std::string err;
  wire::decodeFrame(buf, &f, &err);
  f.type = wire::kProbeAck;
  f.total = responder;
  wire::encodeFrame(f, buf);
}

}  // namespace health
}  // namespace railover
