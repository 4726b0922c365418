#include "health/rules.h"

#include <algorithm>
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
  h.mtu = p.mtu;
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
  p->mtu = h.mtu;
  return true;
}

void answerProbe(uint8_t* buf, uint64_t responder, uint16_t mtu) { probe::answerHeader(buf, responder, mtu); }

uint32_t bigProbePadding(int localMtu, int peerMtu, bool ipv6) {
  int mtu = localMtu > 0 && (peerMtu <= 0 || localMtu < peerMtu) ? localMtu : peerMtu;
  if (mtu <= 0) return (uint32_t)probe::kBigProbeBytes;
  int room = mtu - (ipv6 ? 40 : 20) - 8 - (int)kProbeHeaderBytes;  // IP, UDP and probe headers
  return (uint32_t)std::max(0, std::min(room, (int)probe::kBigProbeBytes));
}

}  // namespace health
}  // namespace railover
