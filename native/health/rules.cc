#include "health/rules.h"

#include <string>

#include "health/probe_wire.h"

namespace railover {
namespace health {

static_assert(kProbeHeaderBytes == probe::kHeaderBytes, "a probe's header is the probe header of probe_wire.h");

void encodeProbe(const Probe& p, uint8_t* out) {
  probe::Header h;
  h.type = p.ack ? probe::kTypeProbeAck : probe::kTypeProbe;
  h.flags = p.big ? probe::kFlagBig : 0;
  h.len = p.padding;
  h.seq = p.id;
  h.sentUs = p.sentUs;
  h.responder = p.ack ? p.responder : 0;
  probe::encodeHeader(h, out);
}

bool decodeProbe(const uint8_t* in, size_t n, Probe* p) {
  if (n < kProbeHeaderBytes) return false;
  probe::Header h;
  std::string err;
  if (!probe::decodeHeader(in, &h, &err)) return false;
  if (h.flags & ~probe::kFlagBig) return false;  // notices and address changes are parsed elsewhere
  if (n != kProbeHeaderBytes + h.len) return false;
  p->ack = h.type == probe::kTypeProbeAck;
  p->big = h.flags & probe::kFlagBig;
  p->id = h.seq;
  p->sentUs = h.sentUs;
  p->responder = p->ack ? h.responder : 0;
  p->padding = h.len;
  return true;
}

void answerProbe(uint8_t* buf, uint64_t responder) { probe::answerHeader(buf, responder); }

}  // namespace health
}  // namespace railover
