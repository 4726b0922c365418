// Fuzz target: the bytes the RDMA (verbs) transport takes from its peer before or outside the
// engine's own framing.
//  * The QP endpoint (verbs::QpEndpoint, 40 bytes), read from the bootstrap TCP stream after the
//    HELLO: QP number, PSN, GID, LID, MTU and link layer the local QP is then connected to.
//  * The control slot (verbs::ctlwire, 48 bytes), received by a SEND on the path's QP: the
//    receiver's buffer advertisements and the control messages (ACK, RESUME, RESUME_ACK, NACK,
//    CLOSE) of either direction.
// Input layout: bytes [0, 40) are the endpoint and [40, 88) the control slot, each padded with
// zeros when the input is shorter (both are fixed-size records on the wire: a short read never
// reaches the decoder).
//
// Contract checked:
//  * QpEndpoint::unpack accepts exactly what validEndpoint() below describes (magic "ROVQ",
//    version 1, QPN 1..0xFFFFFF, PSN < 2^24, MTU code 1..5, link layer 0/1, an InfiniBand peer
//    with a unicast LID 1..0xBFFF, a RoCE peer with a non-zero GID, reserved bytes 34..39 zero);
//    a refusal carries a non-empty error; an accepted endpoint packs back to the same 40 bytes;
//  * ctlwire::decode returns 0, kAdvert or kControl; kControl only with a type ACK..CLOSE;
//    whatever it accepts re-encodes to a message that decodes to the same fields (the encoders
//    are the decoder's inverse on everything the decoder reads);
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
  for (int i = 34; i < 40; ++i)
    if (d[i]) return false;
  return true;
}

bool sameEndpoint(const QpEndpoint& a, const QpEndpoint& b) {
  return a.qpn == b.qpn && a.psn == b.psn && memcmp(a.gid, b.gid, 16) == 0 && a.lid == b.lid && a.mtu == b.mtu &&
         a.roce == b.roce;
}

bool sameAdvert(const Advert& a, const Advert& b) {
  return a.seq == b.seq && a.tag == b.tag && a.addr == b.addr && a.size == b.size && a.rkey == b.rkey;
}

bool sameCtl(const CtlMsg& a, const CtlMsg& b) { return a.type == b.type && a.seq == b.seq && a.arg == b.arg; }

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
  Advert a;
  CtlMsg m;
  int k = ctlwire::decode(in, &a, &m);
  FUZZ_CHECK(k == 0 || k == ctlwire::kAdvert || k == ctlwire::kControl, "decode returned kind %d", k);
  uint8_t out[ctlwire::kBytes];
  if (k == ctlwire::kAdvert) {
    FUZZ_CHECK(in[0] == ctlwire::kAdvert, "advert decoded from kind byte %u", in[0]);
    ctlwire::encodeAdvert(a, out);
    Advert a2;
    CtlMsg m2;
    FUZZ_CHECK(ctlwire::decode(out, &a2, &m2) == ctlwire::kAdvert, "re-encoded advert not decoded as one");
    FUZZ_CHECK(sameAdvert(a, a2), "decode(encode(advert)) != advert");
  } else if (k == ctlwire::kControl) {
    FUZZ_CHECK(in[0] == ctlwire::kControl, "control decoded from kind byte %u", in[0]);
    FUZZ_CHECK(m.type >= CtlType::kAck && m.type <= CtlType::kClose, "control type %u accepted", (unsigned)m.type);
    ctlwire::encodeCtl(m, out);
    Advert a2;
    CtlMsg m2;
    FUZZ_CHECK(ctlwire::decode(out, &a2, &m2) == ctlwire::kControl, "re-encoded control not decoded as one");
    FUZZ_CHECK(sameCtl(m, m2), "decode(encode(control)) != control");
  } else {
    bool ctlOk = in[0] == ctlwire::kControl && in[1] >= 1 && in[1] <= 5;
    FUZZ_CHECK(in[0] != ctlwire::kAdvert && !ctlOk, "a well-formed message (kind %u type %u) was refused", in[0],
               in[1]);
  }
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
  uint8_t wire[kEp];
  e.pack(wire);
  QpEndpoint e2;
  std::string err;
  FUZZ_CHECK(e2.unpack(wire, &err), "packed endpoint refused: %s", err.c_str());
  FUZZ_CHECK(sameEndpoint(e, e2), "unpack(pack(endpoint)) != endpoint");

  uint8_t msg[kCtl];
  Advert a, a2;
  CtlMsg m, m2;
  if (fdp.ConsumeBool()) {
    a.seq = fdp.ConsumeIntegral<uint64_t>();
    a.tag = fdp.ConsumeIntegral<uint64_t>();
    a.addr = fdp.ConsumeIntegral<uint64_t>();
    a.size = fdp.ConsumeIntegral<uint64_t>();
    a.rkey = fdp.ConsumeIntegral<uint32_t>();
    ctlwire::encodeAdvert(a, msg);
    FUZZ_CHECK(ctlwire::decode(msg, &a2, &m2) == ctlwire::kAdvert, "encoded advert not decoded as one");
    FUZZ_CHECK(sameAdvert(a, a2), "decode(encode(advert)) != advert");
  } else {
    m.type = static_cast<CtlType>(fdp.ConsumeIntegralInRange<uint8_t>(1, 5));
    m.seq = fdp.ConsumeIntegral<uint64_t>();
    m.arg = fdp.ConsumeIntegral<uint64_t>();
    ctlwire::encodeCtl(m, msg);
    FUZZ_CHECK(ctlwire::decode(msg, &a2, &m2) == ctlwire::kControl, "encoded control not decoded as one");
    FUZZ_CHECK(sameCtl(m, m2), "decode(encode(control)) != control");
  }
  return 0;
}
