// Fuzz target: health probe datagrams (probe::decodeDatagram), which the health thread reads
// from a UDP socket any host on a NIC's network can send to: probes, probe acks, NIC-down
// notices and address-change notices. A bad notice must not mark a pair down or remap a peer.
//
// Contract checked, for any datagram of any length (held in an exact-size buffer, so ASan
// reports any read past its end):
//  * accepted iff: >= 32 bytes; type (byte 0) PROBE (6) or PROBE_ACK (7); len (bytes 4..8,
//    little-endian) <= 64 KiB; a NIC-down notice carries >= 20 payload bytes and family 4 or
//    6; an address change carries >= 40 payload bytes and family 4 or 6. Rejections come with
//    a non-empty error;
//  * the decoded header equals the bytes at the offsets probe_wire.h gives, and equals what
//    the TCP transport's frame decoder (wire::decodeFrame) reads there: the two layouts agree;
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
#include "transport/tcp/wire.h"  // the frame layout the probe header must match

using namespace railover;
using namespace railover::probe;

namespace {

bool sameNotice(const NicNotice& a, const NicNotice& b) { return a.family == b.family && !memcmp(a.addr, b.addr, 16); }
bool sameChange(const AddrChange& a, const AddrChange& b) {
  return a.family == b.family && a.port == b.port && !memcmp(a.oldAddr, b.oldAddr, 16) && !memcmp(a.newAddr, b.newAddr, 16);
}
uint64_t le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
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

  // Expected verdict, from the layout in probe_wire.h, read off the raw bytes.
  bool expect = false;
  Kind kind = Kind::kProbe;
  if (size >= kHeaderBytes && (data[0] == kTypeProbe || data[0] == kTypeProbeAck) && le(data + 4, 4) <= kMaxLenBytes) {
    size_t pl = size - kHeaderBytes;
    uint8_t fam = pl ? data[kHeaderBytes] : 0;
    bool famOk = fam == 4 || fam == 6;
    uint8_t flags = data[1];
    if (data[0] == kTypeProbe && (flags & kFlagNotice)) kind = Kind::kNotice, expect = pl >= kNoticeMinBytes && famOk;
    else if (data[0] == kTypeProbe && (flags & kFlagAddrChange)) kind = Kind::kAddrChange, expect = pl >= kAddrChangeBytes && famOk;
    else kind = data[0] == kTypeProbe ? Kind::kProbe : Kind::kProbeAck, expect = true;
  }
  FUZZ_CHECK(ok == expect, "decodeDatagram said %d (err '%s') for %zu bytes", ok, err.c_str(), size);
  if (size >= kHeaderBytes) {
    // The header decoders of health and of the TCP transport agree on every probe-typed header.
    Header h;
    std::string herr, ferr;
    wire::Frame f;
    bool hok = decodeHeader(data, &h, &herr);
    bool fok = wire::decodeFrame(data, &f, &ferr) && (f.type == wire::kProbe || f.type == wire::kProbeAck);
    FUZZ_CHECK(hok == fok, "probe header decode %d ('%s'), frame decode %d ('%s')", hok, herr.c_str(), fok, ferr.c_str());
    if (hok)
      FUZZ_CHECK(h.type == f.type && h.flags == f.flags && h.len == f.len && h.seq == f.seq && h.sentUs == f.offset &&
                     h.responder == f.total && h.mtu == f.stream,
                 "probe header fields differ from the frame's");
  }
  if (!ok) {
    FUZZ_CHECK(!err.empty(), "rejected without an error message");
  } else {
    FUZZ_CHECK(d.kind == kind, "kind %d, flags say %d", (int)d.kind, (int)kind);
    FUZZ_CHECK(d.header.type == data[0] && d.header.flags == data[1] && d.header.len == le(data + 4, 4) &&
                   d.header.seq == le(data + 8, 8) && d.header.sentUs == le(data + 16, 6) &&
                   d.header.responder == le(data + 22, 6) && d.header.mtu == le(data + 2, 2),
               "decoded header differs from the bytes");
    const uint8_t* p = data + kHeaderBytes;
    if (d.kind == Kind::kNotice) {
      size_t al = d.notice.family == 4 ? 4 : 16;
      FUZZ_CHECK(d.notice.family == p[0] && !memcmp(d.notice.addr, p + 4, al) && zeroFrom(d.notice.addr, al),
                 "notice fields differ from the payload");
      uint8_t buf[kHeaderBytes + kNoticeBytes];
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
      uint8_t buf[kHeaderBytes + kAddrChangeBytes];
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
    uint8_t buf[kHeaderBytes + kNoticeBytes];
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
    uint8_t buf[kHeaderBytes + kAddrChangeBytes];
    encodeAddrChange(c, buf);
    Datagram back;
    std::string e;
    FUZZ_CHECK(decodeDatagram(buf, sizeof(buf), &back, &e), "valid address change rejected: %s", e.c_str());
    FUZZ_CHECK(back.kind == Kind::kAddrChange && sameChange(c, back.change), "decode(encode(change)) != change");
  }
  return 0;
}
