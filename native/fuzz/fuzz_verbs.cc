// Fuzz target: the bytes the RDMA (verbs) transport takes from its peer before or outside the
// engine's own framing.
//  * The QP endpoint (verbs::QpEndpoint, 40 bytes), read from the bootstrap TCP stream after the
//    HELLO: QP number, PSN, GID, LID, MTU and link layer the local QP is then connected to.
//  * The control slot (verbs::ctlwire, 48 bytes), received by a SEND on the path's QP: the
//    receiver's buffer advertisements (single, and the entries of a grouped receive), the
//    sender's DONE for a grouped message, the PART that ends a message's share on each further
//    QP of a path, and the control messages (ACK, RESUME, RESUME_ACK, NACK, CLOSE) of either
//    direction.
// Input layout: bytes [0, 40) are the endpoint and [40, 88) the control slot, each padded with
// zeros when the input is shorter (both are fixed-size records on the wire: a short read never
// reaches the decoder).
//
// Contract checked:
//  * QpEndpoint::unpack accepts exactly what validEndpoint() below describes (magic "ROVQ",
//    version 1, QPN 1..0xFFFFFF, PSN < 2^24, MTU code 1..5, link layer 0/1, an InfiniBand peer
//    with a unicast LID 1..0xBFFF, a RoCE peer with a non-zero GID, the path's QP count - 1 in
//    byte 34 below 128, the QoS flag in byte 35 0 or 1 with bytes 36..37 zero when it is 0
//    and the service level in byte 37 below 16, reserved bytes 38..39 zero);
//    a refusal carries a non-empty error; an accepted endpoint packs back to the same 40 bytes;
//  * ctlwire::decode accepts exactly what validCtl() below describes (ADVERT: reserved bytes
//    zero; CONTROL: a type ACK..CLOSE, reserved bytes zero; GROUP_ENTRY: count 1..8, index below
//    it, the buffer's end within 64 bits, a 32-bit tag; DONE: status 0/1, entry 0..7, or 255
//    when refused, 32-bit size and tag; PART: a seq only; reserved bytes zero everywhere),
//    returns the kind, and
//    a refusal carries a non-empty error; an accepted message re-encodes to the same 48 bytes;
//  * any endpoint and any message built from the input survive pack/encode -> unpack/decode.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <memory>
#include <string>

#include "fuzz/fuzz_check.h"
#include "transport/verbs/verbs_path.h"
#include "transport/verbs/verbs_qp.h"

using namespace railover::verbs;

namespace {

uint32_t be32(const uint8_t* p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

bool validEndpoint(const uint8_t* d) {
  if (be32(d) != 0x524f5651u || (d[4] << 8 | d[5]) != 1) return false;
  uint32_t qpn = be32(d + 8), psn = be32(d + 12);
  unsigned lid = d[6] << 8 | d[7];
  if (qpn == 0 || qpn > 0xFFFFFF || psn > 0xFFFFFF) return false;
  if (d[32] < 1 || d[32] > 5 || d[33] > 1) return false;
  if (d[33] == 0 && (lid == 0 || lid > 0xBFFF)) return false;
  bool gidZero = true;
  for (int i = 16; i < 32; ++i) gidZero = gidZero && d[i] == 0;
  if (d[33] == 1 && gidZero) return false;
  if (d[34] >= 128) return false;
  if (d[35] > 1 || (d[35] == 0 && (d[36] || d[37])) || d[37] > 15) return false;
  for (int i = 38; i < 40; ++i)
    if (d[i]) return false;
  return true;
}

bool sameEndpoint(const QpEndpoint& a, const QpEndpoint& b) {
  return a.qpn == b.qpn && a.psn == b.psn && memcmp(a.gid, b.gid, 16) == 0 && a.lid == b.lid && a.mtu == b.mtu &&
         a.roce == b.roce && a.lanes == b.lanes && a.qos == b.qos && a.trafficClass == b.trafficClass && a.sl == b.sl;
}

bool sameAdvert(const Advert& a, const Advert& b) {
  return a.seq == b.seq && a.tag == b.tag && a.addr == b.addr && a.size == b.size && a.rkey == b.rkey;
}

bool sameCtl(const CtlMsg& a, const CtlMsg& b) { return a.type == b.type && a.seq == b.seq && a.arg == b.arg; }

bool sameDone(const Done& a, const Done& b) {
  return a.seq == b.seq && a.tag == b.tag && a.bytes == b.bytes && a.index == b.index && a.written == b.written;
}

uint64_t be64(const uint8_t* p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

bool zeros(const uint8_t* p, int from, int to) {
  for (int i = from; i < to; ++i)
    if (p[i]) return false;
  return true;
}

// The valid control slots, written from docs/PROTOCOL.md's table independently of the decoder.
int validCtl(const uint8_t* d) {
  switch (d[0]) {
    case ctlwire::kAdvert:
      return zeros(d, 1, 4) && zeros(d, 40, 48) ? ctlwire::kAdvert : 0;
    case ctlwire::kControl:
      return d[1] >= 1 && d[1] <= 5 && zeros(d, 2, 8) && zeros(d, 24, 48) ? ctlwire::kControl : 0;
    case ctlwire::kGroupEntry: {
      uint64_t addr = be64(d + 16), size = be64(d + 24), tag = be64(d + 32);
      bool ok = d[1] == 0 && d[2] >= 1 && d[2] <= kMaxGroup && d[3] < d[2] && addr + size >= addr &&
                tag <= 0xffffffffull && zeros(d, 40, 48);
      return ok ? ctlwire::kGroupEntry : 0;
    }
    case ctlwire::kDone: {
      bool written = d[1] == 0;
      bool entryOk = d[3] < kMaxGroup || (!written && d[3] == kNoEntry);
      bool ok = d[1] <= 1 && entryOk && be64(d + 24) <= 0xffffffffull && be64(d + 32) <= 0xffffffffull && d[2] == 0 &&
                zeros(d, 4, 8) && zeros(d, 16, 24) && zeros(d, 40, 48);
      return ok ? ctlwire::kDone : 0;
    }
    case ctlwire::kPart:
      return zeros(d, 1, 8) && zeros(d, 16, 48) ? ctlwire::kPart : 0;
    default:
      return 0;
  }
}

void checkEndpoint(const uint8_t* in) {
  QpEndpoint ep;
  std::string err;
  bool ok = ep.unpack(in, &err);
  FUZZ_CHECK(ok == validEndpoint(in), "QpEndpoint::unpack said %d (err '%s')", ok, err.c_str());
  if (!ok) {
    FUZZ_CHECK(!err.empty(), "endpoint rejected without an error message");
    return;
  }
  uint8_t out[QpEndpoint::kWireBytes];
  ep.pack(out);
  FUZZ_CHECK(memcmp(out, in, QpEndpoint::kWireBytes) == 0, "re-packing changed the endpoint");
}

void checkCtl(const uint8_t* in) {
  ctlwire::Decoded d;
  std::string err;
  int k = ctlwire::decode(in, &d, &err);
  int want = validCtl(in);
  FUZZ_CHECK(k == want, "decode returned kind %d, the format says %d (kind byte %u, err '%s')", k, want, in[0],
             err.c_str());
  if (!k) {
    FUZZ_CHECK(!err.empty(), "control slot refused without an error message");
    return;
  }
  uint8_t out[ctlwire::kBytes];
  if (k == ctlwire::kAdvert || k == ctlwire::kGroupEntry)
    ctlwire::encodeAdvert(d.advert, out);
  else if (k == ctlwire::kControl)
    ctlwire::encodeCtl(d.ctl, out);
  else if (k == ctlwire::kPart)
    ctlwire::encodePart(d.partSeq, out);
  else
    ctlwire::encodeDone(d.done, out);
  FUZZ_CHECK(memcmp(out, in, ctlwire::kBytes) == 0, "re-encoding changed a control slot of kind %d", k);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kEp = QpEndpoint::kWireBytes, kCtl = ctlwire::kBytes;
  // Exactly-sized heap copies, so ASan sees any read past a record.
  std::unique_ptr<uint8_t[]> ep(new uint8_t[kEp]), ctl(new uint8_t[kCtl]);
  memset(ep.get(), 0, kEp);
  memset(ctl.get(), 0, kCtl);
  memcpy(ep.get(), data, size < kEp ? size : kEp);
  if (size > kEp) memcpy(ctl.get(), data + kEp, size - kEp < kCtl ? size - kEp : kCtl);
  checkEndpoint(ep.get());
  checkCtl(ctl.get());

  // Round trips of values built from the input (the encoders' side of the contract).
  FuzzedDataProvider fdp(data, size);
  QpEndpoint e;
  e.qpn = fdp.ConsumeIntegralInRange<uint32_t>(1, 0xFFFFFF);
  e.psn = fdp.ConsumeIntegralInRange<uint32_t>(0, 0xFFFFFF);
  e.mtu = fdp.ConsumeIntegralInRange<uint8_t>(1, 5);
  e.roce = fdp.ConsumeBool() ? 1 : 0;
  e.lid = e.roce ? fdp.ConsumeIntegral<uint16_t>() : fdp.ConsumeIntegralInRange<uint16_t>(1, 0xBFFF);
  for (auto& g : e.gid) g = fdp.ConsumeIntegral<uint8_t>();
  if (e.roce) e.gid[15] |= 1;  // a RoCE GID is never all zero
  e.lanes = fdp.ConsumeIntegralInRange<uint8_t>(1, QpEndpoint::kMaxLanes);
  uint8_t wire[kEp];
  e.pack(wire);
  QpEndpoint e2;
  std::string err;
  FUZZ_CHECK(e2.unpack(wire, &err), "packed endpoint refused: %s", err.c_str());
  FUZZ_CHECK(sameEndpoint(e, e2), "unpack(pack(endpoint)) != endpoint");

  uint8_t msg[kCtl];
  ctlwire::Decoded back;
  switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: {
      Advert a;
      a.count = fdp.ConsumeIntegralInRange<uint8_t>(0, kMaxGroup);
      a.index = a.count ? fdp.ConsumeIntegralInRange<uint8_t>(0, a.count - 1) : 0;
      a.seq = fdp.ConsumeIntegral<uint64_t>();
      a.tag = a.count ? fdp.ConsumeIntegral<uint32_t>() : fdp.ConsumeIntegral<uint64_t>();
      a.addr = fdp.ConsumeIntegral<uint64_t>();
      a.size = a.count ? fdp.ConsumeIntegralInRange<uint64_t>(0, ~a.addr) : fdp.ConsumeIntegral<uint64_t>();
      a.rkey = fdp.ConsumeIntegral<uint32_t>();
      ctlwire::encodeAdvert(a, msg);
      int k = ctlwire::decode(msg, &back, &err);
      FUZZ_CHECK(k == (a.count ? ctlwire::kGroupEntry : ctlwire::kAdvert), "encoded advert decoded as %d: %s", k,
                 err.c_str());
      FUZZ_CHECK(sameAdvert(a, back.advert) && back.advert.count == a.count && back.advert.index == a.index,
                 "decode(encode(advert)) != advert");
      break;
    }
    case 1: {
      CtlMsg m;
      m.type = static_cast<CtlType>(fdp.ConsumeIntegralInRange<uint8_t>(1, 5));
      m.seq = fdp.ConsumeIntegral<uint64_t>();
      m.arg = fdp.ConsumeIntegral<uint64_t>();
      ctlwire::encodeCtl(m, msg);
      FUZZ_CHECK(ctlwire::decode(msg, &back, &err) == ctlwire::kControl, "encoded control refused: %s", err.c_str());
      FUZZ_CHECK(sameCtl(m, back.ctl), "decode(encode(control)) != control");
      break;
    }
    case 3: {
      uint64_t seq = fdp.ConsumeIntegral<uint64_t>();
      ctlwire::encodePart(seq, msg);
      FUZZ_CHECK(ctlwire::decode(msg, &back, &err) == ctlwire::kPart, "encoded PART refused: %s", err.c_str());
      FUZZ_CHECK(back.partSeq == seq, "decode(encode(PART)) != PART");
      break;
    }
    default: {
      Done x;
      x.written = fdp.ConsumeBool();
      x.index = x.written || fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint8_t>(0, kMaxGroup - 1) : kNoEntry;
      x.seq = fdp.ConsumeIntegral<uint64_t>();
      x.bytes = fdp.ConsumeIntegral<uint32_t>();
      x.tag = fdp.ConsumeIntegral<uint32_t>();
      ctlwire::encodeDone(x, msg);
      FUZZ_CHECK(ctlwire::decode(msg, &back, &err) == ctlwire::kDone, "encoded DONE refused: %s", err.c_str());
      FUZZ_CHECK(sameDone(x, back.done), "decode(encode(DONE)) != DONE");
    }
  }
  return 0;
}
