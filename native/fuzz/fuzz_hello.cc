// Fuzz target: the HELLO frame, the first 32 bytes on every TCP stream, parsed by the
// acceptor thread (wire::decodeHello) before it knows whether the connection is a railover
// sender at all: any host that can reach a listener port can send these bytes.
//
// Contract checked:
//  * decodeHello accepts exactly: magic, the protocol version (kVersion), 1 <= nStreams <= 64, stream < nStreams;
//    otherwise false with a non-empty error;
//  * an accepted HELLO re-encodes to the same 32 bytes (24..31 carry the connection id) and
//    decodes again to the same fields;
//  * any valid Hello built from the input survives encode -> decode unchanged.
// Inputs shorter than a frame are padded with zeros: the acceptor only decodes complete
// 32-byte HELLOs (a connection that closes earlier is dropped before parsing).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <memory>
#include <string>

#include "fuzz/fuzz_check.h"
#include "transport/tcp/wire.h"

using namespace railover::wire;

namespace {

bool sameHello(const Hello& a, const Hello& b) {
  return a.version == b.version && a.stream == b.stream && a.nStreams == b.nStreams && a.secret == b.secret &&
         a.path == b.path && a.srcRail == b.srcRail && a.probePort == b.probePort && a.generation == b.generation &&
         a.connId == b.connId;
}

bool validBytes(const uint8_t* d) {
  uint32_t magic = d[0] | d[1] << 8 | d[2] << 16 | (uint32_t)d[3] << 24;
  return magic == kMagic && (d[4] | d[5] << 8) == kVersion && d[7] >= 1 && d[7] <= 64 && d[6] < d[7];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<uint8_t[]> frame(new uint8_t[kFrameBytes]);  // exactly one frame: ASan sees over-reads
  memset(frame.get(), 0, kFrameBytes);
  memcpy(frame.get(), data, size < kFrameBytes ? size : kFrameBytes);
  Hello h;
  std::string err;
  bool ok = decodeHello(frame.get(), &h, &err);
  FUZZ_CHECK(ok == validBytes(frame.get()), "decodeHello said %d (err '%s')", ok, err.c_str());
  if (!ok) {
    FUZZ_CHECK(!err.empty(), "rejected without an error message");
  } else {
    uint8_t out[kFrameBytes];
    encodeHello(h, out);
    FUZZ_CHECK(memcmp(out, frame.get(), kFrameBytes) == 0, "re-encoding changed the HELLO");
    Hello h2;
    std::string err2;
    FUZZ_CHECK(decodeHello(out, &h2, &err2), "re-encoded HELLO rejected: %s", err2.c_str());
    FUZZ_CHECK(sameHello(h, h2), "decode(encode(h)) != h");
  }

  FuzzedDataProvider fdp(data, size);
  Hello in;
  in.nStreams = fdp.ConsumeIntegralInRange<uint8_t>(1, 64);
  in.stream = fdp.ConsumeIntegralInRange<uint8_t>(0, in.nStreams - 1);
  in.secret = fdp.ConsumeIntegral<uint64_t>();
  in.path = fdp.ConsumeIntegral<uint8_t>();
  in.srcRail = fdp.ConsumeIntegral<uint8_t>();
  in.probePort = fdp.ConsumeIntegral<uint16_t>();
  in.generation = fdp.ConsumeIntegral<uint32_t>();
  in.connId = fdp.ConsumeIntegral<uint64_t>();
  uint8_t buf[kFrameBytes];
  encodeHello(in, buf);
  Hello back;
  std::string err3;
  FUZZ_CHECK(decodeHello(buf, &back, &err3), "valid HELLO rejected: %s", err3.c_str());
  FUZZ_CHECK(sameHello(in, back), "decode(encode(x)) != x");
  return 0;
}
