// Fuzz target: the 32-byte frame header (wire::decodeFrame) that both directions of a comm
// and the health probes parse before trusting `len`, `offset` and `total`.
//
// Contract checked:
//  * decodeFrame accepts exactly the frames wire.h allows: a known type; DATA with
//    len <= kMaxChunkBytes, total <= kMaxMessageBytes and offset + len <= total (computed
//    here without overflow); PROBE/PROBE_ACK with len <= 64 KiB; control frames with len 0.
//    Otherwise false with a non-empty error;
//  * every accepted frame re-encodes to the identical 32 bytes (all bytes are meaningful:
//    offset and total are 48-bit fields, the last 4 bytes the DATA tag);
//  * any valid Frame built from the input survives encode -> decode unchanged.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <memory>
#include <string>

#include "fuzz/fuzz_check.h"
#include "transport/tcp/wire.h"

using namespace railover::wire;

namespace {

bool sameFrame(const Frame& a, const Frame& b) {
  return a.type == b.type && a.flags == b.flags && a.stream == b.stream && a.len == b.len && a.seq == b.seq &&
         a.offset == b.offset && a.total == b.total && a.tag == b.tag;
}

// The bounds, restated from wire.h (128-bit sums, so no overflow can hide a bad chunk).
bool validFrame(const Frame& f) {
  switch (f.type) {
    case kData:
      return f.len <= kMaxChunkBytes && f.total <= kMaxMessageBytes &&
             (unsigned __int128)f.offset + f.len <= (unsigned __int128)f.total;
    case kProbe:
    case kProbeAck:
      return f.len <= 65536;
    case kAck:
    case kResume:
    case kResumeAck:
    case kNack:
    case kClose:
      return f.len == 0;
    default:
      return false;
  }
}

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<uint8_t[]> hdr(new uint8_t[kFrameBytes]);
  memset(hdr.get(), 0, kFrameBytes);
  memcpy(hdr.get(), data, size < kFrameBytes ? size : kFrameBytes);
  const uint8_t* d = hdr.get();
  Frame raw;  // the fields as the bytes say, independent of the decoder
  raw.type = d[0], raw.flags = d[1], raw.stream = (uint16_t)le(d + 2, 2), raw.len = (uint32_t)le(d + 4, 4);
  raw.seq = le(d + 8, 8), raw.offset = le(d + 16, 6), raw.total = le(d + 22, 6);
  raw.tag = (int32_t)(uint32_t)le(d + 28, 4);

  Frame f;
  std::string err;
  bool ok = decodeFrame(d, &f, &err);
  FUZZ_CHECK(ok == validFrame(raw), "decodeFrame said %d (err '%s') for type %u len %u offset %llu total %llu", ok,
             err.c_str(), raw.type, raw.len, (unsigned long long)raw.offset, (unsigned long long)raw.total);
  FUZZ_CHECK(sameFrame(f, raw), "decoded fields differ from the bytes");
  if (!ok) {
    FUZZ_CHECK(!err.empty(), "rejected without an error message");
  } else {
    uint8_t out[kFrameBytes];
    encodeFrame(f, out);
    FUZZ_CHECK(memcmp(out, d, kFrameBytes) == 0, "re-encoding changed the frame");
  }

  FuzzedDataProvider fdp(data, size);
  static const uint8_t kTypes[] = {kHello, kData, kAck, kResume, kResumeAck, kProbe, kProbeAck, kNack, kClose};
  Frame in;
  in.type = fdp.PickValueInArray(kTypes);
  in.flags = fdp.ConsumeIntegral<uint8_t>();
  in.stream = fdp.ConsumeIntegral<uint16_t>();
  in.seq = fdp.ConsumeIntegral<uint64_t>();
  in.tag = fdp.ConsumeIntegral<int32_t>();
  constexpr uint64_t k48 = (1ULL << 48) - 1;  // offset and total travel as 48-bit fields
  if (in.type == kData) {
    in.total = fdp.ConsumeIntegralInRange<uint64_t>(0, kMaxMessageBytes);
    in.offset = fdp.ConsumeIntegralInRange<uint64_t>(0, in.total);
    uint64_t room = in.total - in.offset;
    in.len = (uint32_t)fdp.ConsumeIntegralInRange<uint64_t>(0, room < kMaxChunkBytes ? room : kMaxChunkBytes);
  } else if (in.type == kProbe || in.type == kProbeAck) {
    in.len = fdp.ConsumeIntegralInRange<uint32_t>(0, 65536);
    in.offset = fdp.ConsumeIntegralInRange<uint64_t>(0, k48);
    in.total = fdp.ConsumeIntegralInRange<uint64_t>(0, k48);
  } else {
    in.offset = fdp.ConsumeIntegralInRange<uint64_t>(0, k48);
    in.total = fdp.ConsumeIntegralInRange<uint64_t>(0, k48);
  }
  uint8_t buf[kFrameBytes];
  encodeFrame(in, buf);
  Frame back;
  std::string err2;
  bool ok2 = decodeFrame(buf, &back, &err2);
  if (in.type == kHello) {
    FUZZ_CHECK(!ok2 && !err2.empty(), "a HELLO is not a frame decodeFrame may accept");
  } else {
    FUZZ_CHECK(ok2, "valid frame of type %u rejected: %s", in.type, err2.c_str());
    FUZZ_CHECK(sameFrame(in, back), "decode(encode(x)) != x");
  }
  return 0;
}
