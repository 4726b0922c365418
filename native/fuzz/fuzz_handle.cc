// Fuzz target: the 128-byte connection handle NCCL carries from the listener to the
// connector (wire::decodeHandle). The bytes come from another process over NCCL's bootstrap,
// so every field is untrusted.
//
// Contract checked, for any input of any length:
//  * decodeHandle accepts exactly the inputs the format allows (header comment of wire.h):
//    >= 16 bytes, magic, version 1, 1..5 addresses that fit in the input, primary < naddr,
//    every address family 4 or 6 and port != 0, and (when the input reaches it) a transport
//    byte at kHandleTransportOffset of tcp (0) or rdma (1); otherwise it returns false with a
//    non-empty error;
//  * an accepted handle re-encodes to the same bytes (every byte up to the last address is
//    meaningful, and the transport byte) and decodes again to the same fields;
//  * structured direction: any Handle with valid fields built from the input survives
//    encode -> decode unchanged.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <memory>
#include <string>

#include "fuzz/fuzz_check.h"
#include "transport/tcp/wire.h"

using namespace railover::wire;

namespace {

uint32_t le32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

bool sameHandle(const Handle& a, const Handle& b) {
  if (a.version != b.version || a.naddr != b.naddr || a.primary != b.primary || a.secret != b.secret ||
      a.transport != b.transport)
    return false;
  for (int i = 0; i < a.naddr; ++i) {
    const HandleAddr &x = a.addrs[i], &y = b.addrs[i];
    if (x.rail != y.rail || x.family != y.family || x.port != y.port || memcmp(x.addr, y.addr, 16)) return false;
  }
  return true;
}

// The format, restated from wire.h: is this input a valid handle?
bool validBytes(const uint8_t* d, size_t n) {
  if (n < 16 || le32(d) != kMagic || (d[4] | d[5] << 8) != kVersion) return false;
  int naddr = d[6];
  if (naddr < 1 || naddr > kMaxHandleAddrs || 16 + 20 * (size_t)naddr > n || d[7] >= naddr) return false;
  for (int i = 0; i < naddr; ++i) {
    const uint8_t* a = d + 16 + 20 * i;
    if ((a[1] != 4 && a[1] != 6) || (a[2] | a[3] << 8) == 0) return false;
  }
  if (n > kHandleTransportOffset && d[kHandleTransportOffset] != kTransportTcp &&
      d[kHandleTransportOffset] != kTransportRdma)
    return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Byte direction: decode whatever arrived.
  Handle h;
  std::string err;
  bool ok = decodeHandle(data, size, &h, &err);
  FUZZ_CHECK(ok == validBytes(data, size), "decodeHandle said %d (err '%s') for a %s handle of %zu bytes", ok,
             err.c_str(), validBytes(data, size) ? "valid" : "invalid", size);
  if (!ok) {
    FUZZ_CHECK(!err.empty(), "rejected without an error message");
  } else {
    uint8_t out[kHandleBytes];
    encodeHandle(h, out);
    size_t used = 16 + 20 * (size_t)h.naddr;
    FUZZ_CHECK(memcmp(out, data, used) == 0, "re-encoding changed the first %zu bytes", used);
    for (size_t i = used; i < kHandleBytes; ++i)
      FUZZ_CHECK(out[i] == (i == kHandleTransportOffset ? h.transport : 0), "encoder wrote byte %zu as %u", i, out[i]);
    uint8_t want = size > kHandleTransportOffset ? data[kHandleTransportOffset] : kTransportTcp;
    FUZZ_CHECK(h.transport == want, "transport %u decoded, %u on the wire", h.transport, want);
    Handle h2;
    std::string err2;
    FUZZ_CHECK(decodeHandle(out, sizeof(out), &h2, &err2), "re-encoded handle rejected: %s", err2.c_str());
    FUZZ_CHECK(sameHandle(h, h2), "decode(encode(h)) != h");
  }

  // Structured direction: a handle with valid fields, chosen by the input.
  FuzzedDataProvider fdp(data, size);
  Handle in;
  in.naddr = fdp.ConsumeIntegralInRange<uint8_t>(1, kMaxHandleAddrs);
  in.primary = fdp.ConsumeIntegralInRange<uint8_t>(0, in.naddr - 1);
  in.secret = fdp.ConsumeIntegral<uint64_t>();
  in.transport = fdp.ConsumeBool() ? kTransportRdma : kTransportTcp;
  for (int i = 0; i < in.naddr; ++i) {
    in.addrs[i].rail = fdp.ConsumeIntegral<uint8_t>();
    in.addrs[i].family = fdp.ConsumeBool() ? 6 : 4;
    in.addrs[i].port = fdp.ConsumeIntegralInRange<uint16_t>(1, 65535);
    for (auto& b : in.addrs[i].addr) b = fdp.ConsumeIntegral<uint8_t>();
  }
  uint8_t buf[kHandleBytes];
  encodeHandle(in, buf);
  Handle back;
  std::string err3;
  FUZZ_CHECK(decodeHandle(buf, sizeof(buf), &back, &err3), "valid handle rejected: %s", err3.c_str());
  FUZZ_CHECK(sameHandle(in, back), "decode(encode(x)) != x for a valid handle");
  // A truncated copy of it must be rejected, never read past its end.
  size_t cut = fdp.ConsumeIntegralInRange<size_t>(0, 16 + 20 * (size_t)in.naddr - 1);
  std::unique_ptr<uint8_t[]> shortCopy(new uint8_t[cut]);  // exact size: ASan sees any over-read
  memcpy(shortCopy.get(), buf, cut);
  Handle t;
  std::string err4;
  FUZZ_CHECK(!decodeHandle(shortCopy.get(), cut, &t, &err4) && !err4.empty(), "truncated handle (%zu bytes) accepted", cut);
  return 0;
}
