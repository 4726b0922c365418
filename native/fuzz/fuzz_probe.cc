// Fuzz target: health probe datagrams (probe::decodeDatagram), which the health thread reads
// from a UDP socket any host on a NIC's network can send to: probes, probe acks, NIC-down
// notices and address-change notices. A bad notice must not mark a pair down or remap a peer.
//
// Contract checked, for any datagram of any length (held in an exact-size buffer, so ASan
// reports any read past its end):
//  * accepted iff: >= 32 bytes; the header decodes (decodeFrame's own contract is fuzzed by
//    fuzz_frame); type PROBE or PROBE_ACK; a NIC-down notice carries >= 20 payload bytes and
//    family 4 or 6; an address change carries >= 40 payload bytes and family 4 or 6.
//    Rejections come with a non-empty error;
//  * the decoded kind follows the flags (notice before address change, only on PROBE);
//  * decoded addresses and port equal the payload bytes; IPv4 leaves addr[4..16) zero;
//  * a decoded notice / address change re-encodes and decodes to the same fields;
//  * structured direction: any valid notice / address change built from the input survives
//    encode -> decode unchanged.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <memory>
#include <string>

#include "fuzz/fuzz_check.h"
#include "health/probe_wire.h"

using namespace railover;
using namespace railover::probe;

namespace {

bool sameNotice(const NicNotice& a, const NicNotice& b) { return a.family == b.family && !memcmp(a.addr, b.addr, 16); }
bool sameChange(const AddrChange& a, const AddrChange& b) {
  return a.family == b.family && a.port == b.port && !memcmp(a.oldAddr, b.oldAddr, 16) && !memcmp(a.newAddr, b.newAddr, 16);
}
bool zeroFrom(const uint8_t* a, size_t from) {
  for (size_t i = from; i < 16; ++i)
    if (a[i]) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<uint8_t[]> dg(new uint8_t[size]);
  if (size) memcpy(dg.get(), data, size);
  Datagram d;
  std::string err;
  bool ok = decodeDatagram(dg.get(), size, &d, &err);

  // Expected verdict, from the layout in probe_wire.h.
  bool expect = false;
  Kind kind = Kind::kProbe;
  wire::Frame f;
  std::string ferr;
  if (size >= wire::kFrameBytes && wire::decodeFrame(data, &f, &ferr) && (f.type == wire::kProbe || f.type == wire::kProbeAck)) {
    size_t pl = size - wire::kFrameBytes;
    uint8_t fam = pl ? data[wire::kFrameBytes] : 0;
    bool famOk = fam == 4 || fam == 6;
    if (f.type == wire::kProbe && (f.flags & kFlagNotice)) kind = Kind::kNotice, expect = pl >= kNoticeMinBytes && famOk;
    else if (f.type == wire::kProbe && (f.flags & kFlagAddrChange)) kind = Kind::kAddrChange, expect = pl >= kAddrChangeBytes && famOk;
    else kind = f.type == wire::kProbe ? Kind::kProbe : Kind::kProbeAck, expect = true;
  }
  FUZZ_CHECK(ok == expect, "decodeDatagram said %d (err '%s') for %zu bytes", ok, err.c_str(), size);
  if (!ok) {
    FUZZ_CHECK(!err.empty(), "rejected without an error message");
  } else {
    FUZZ_CHECK(d.kind == kind, "kind %d, flags say %d", (int)d.kind, (int)kind);
    const uint8_t* p = data + wire::kFrameBytes;
    if (d.kind == Kind::kNotice) {
      size_t al = d.notice.family == 4 ? 4 : 16;
      FUZZ_CHECK(d.notice.family == p[0] && !memcmp(d.notice.addr, p + 4, al) && zeroFrom(d.notice.addr, al),
                 "notice fields differ from the payload");
      uint8_t buf[wire::kFrameBytes + kNoticeBytes];
      encodeNotice(d.notice, buf);
      Datagram d2;
      std::string e2;
      FUZZ_CHECK(decodeDatagram(buf, sizeof(buf), &d2, &e2) && d2.kind == Kind::kNotice && sameNotice(d.notice, d2.notice),
                 "notice does not survive encode -> decode (%s)", e2.c_str());
    } else if (d.kind == Kind::kAddrChange) {
      size_t al = d.change.family == 4 ? 4 : 16;
      FUZZ_CHECK(d.change.family == p[0] && !memcmp(d.change.oldAddr, p + 4, al) && !memcmp(d.change.newAddr, p + 20, al) &&
                     zeroFrom(d.change.oldAddr, al) && zeroFrom(d.change.newAddr, al) && d.change.port == (p[36] | p[37] << 8),
                 "address change fields differ from the payload");
      uint8_t buf[wire::kFrameBytes + kAddrChangeBytes];
      encodeAddrChange(d.change, buf);
      Datagram d2;
      std::string e2;
      FUZZ_CHECK(decodeDatagram(buf, sizeof(buf), &d2, &e2) && d2.kind == Kind::kAddrChange && sameChange(d.change, d2.change),
                 "address change does not survive encode -> decode (%s)", e2.c_str());
    }
  }

  // Structured direction.
  FuzzedDataProvider fdp(data, size);
  if (fdp.ConsumeBool()) {
    NicNotice n;
    n.family = fdp.ConsumeBool() ? 6 : 4;
    for (size_t i = 0; i < (n.family == 4 ? 4u : 16u); ++i) n.addr[i] = fdp.ConsumeIntegral<uint8_t>();
    uint8_t buf[wire::kFrameBytes + kNoticeBytes];
    encodeNotice(n, buf);
    Datagram back;
    std::string e;
    FUZZ_CHECK(decodeDatagram(buf, sizeof(buf), &back, &e), "valid notice rejected: %s", e.c_str());
    FUZZ_CHECK(back.kind == Kind::kNotice && sameNotice(n, back.notice), "decode(encode(notice)) != notice");
  } else {
    AddrChange c;
    c.family = fdp.ConsumeBool() ? 6 : 4;
    for (size_t i = 0; i < (c.family == 4 ? 4u : 16u); ++i) c.oldAddr[i] = fdp.ConsumeIntegral<uint8_t>();
    for (size_t i = 0; i < (c.family == 4 ? 4u : 16u); ++i) c.newAddr[i] = fdp.ConsumeIntegral<uint8_t>();
    c.port = fdp.ConsumeIntegral<uint16_t>();
    uint8_t buf[wire::kFrameBytes + kAddrChangeBytes];
    encodeAddrChange(c, buf);
    Datagram back;
    std::string e;
    FUZZ_CHECK(decodeDatagram(buf, sizeof(buf), &back, &e), "valid address change rejected: %s", e.c_str());
    FUZZ_CHECK(back.kind == Kind::kAddrChange && sameChange(c, back.change), "decode(encode(change)) != change");
  }
  return 0;
}
