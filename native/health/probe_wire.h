// Health probe datagrams (UDP, one per packet): a 32-byte probe header (below) followed by
// `len` bytes. Two probe flags carry a payload that the receiver parses:
//
//   NIC-down notice (flags & kFlagNotice), payload >= 20 bytes (senders send 32):
//     0 u8 family (4 or 6)   4 u8 addr[16] (IPv4: first 4 bytes)      "my NIC at addr is down"
//   Address change (flags & kFlagAddrChange), payload >= 40 bytes:
//     0 u8 family (4 or 6)   4 u8 old[16]   20 u8 new[16]   36 u16 port (little-endian)
//                                           "my NIC moved from old to new; its probe/listen port"
// Every other probe is echoed as a kProbeAck of the same size; acks carry no payload the
// receiver reads (only flags & kFlagBig).
//
// These are pure functions (no sockets, no state), so they can be unit-tested and fuzzed.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace railover {
namespace probe {

// ---- the 32-byte probe header (docs/PROTOCOL.md, "Probes") ---------------------------------
// Its layout is the TCP transport's frame header (docs/PROTOCOL.md, "Streams and frames"):
// same offsets, little-endian, and the probe types are numbers of that frame type space (6
// PROBE, 7 PROBE_ACK), so a probe datagram also reads as a valid frame of that type. Health
// encodes it itself and needs nothing of the transport; native/tests/probe_wire_test.cc
// proves the two encodings agree byte for byte.
//   0 u8 type (6 or 7)   1 u8 flags   2 u16 mtu: the sender NIC's MTU, 0 = unknown (a frame's
//   stream)   4 u32 len: bytes that follow
//   8 u64 seq: probe id   16 u48 sentUs (a frame's offset)   22 u48 responder (a frame's total)
//   28 u32 0 (a frame's tag)
constexpr size_t kHeaderBytes = 32;
constexpr uint8_t kTypeProbe = 6;
constexpr uint8_t kTypeProbeAck = 7;
constexpr uint32_t kMaxLenBytes = 65536;  // largest `len` a receiver accepts (64 KiB)

struct Header {
  uint8_t type = kTypeProbe;  // kTypeProbe or kTypeProbeAck
  uint8_t flags = 0;          // kFlag* below
  uint32_t len = 0;           // bytes after the header
  uint64_t seq = 0;           // probe id
  uint64_t sentUs = 0;        // the prober's send time, µs of its CLOCK_MONOTONIC (48 bits on the wire)
  uint64_t responder = 0;     // an answer's responder instance id, 0 in a probe (48 bits on the wire)
  uint16_t mtu = 0;           // the MTU of the NIC that sent it, bytes (0: unknown, or a railover before 2026-12-06)
};

// Writes the kHeaderBytes bytes of `h` to `out` (the unused bytes 28..31 as 0).
void encodeHeader(const Header& h, uint8_t* out);
// Reads the header at in[0, kHeaderBytes) (the caller checked the length). False with `err`
// when the type is not a probe or answer ("frame type N is not a probe") or `len` exceeds
// kMaxLenBytes.
bool decodeHeader(const uint8_t* in, Header* h, std::string* err);
// Rewrites a probe header in place into its answer from `responder`, whose NIC has MTU `mtu`
// (0: unknown): type kTypeProbeAck, the responder and mtu fields; every other byte (flags, len,
// id, send time) stays as received.
void answerHeader(uint8_t* hdr, uint64_t responder, uint16_t mtu = 0);

constexpr uint8_t kFlagBig = 1;         // full-size probe (size-dependent loss check)
constexpr uint8_t kFlagNotice = 2;      // "my NIC with this address is down"
constexpr uint8_t kFlagAddrChange = 4;  // "my NIC moved from this address to that one"
constexpr size_t kBigProbeBytes = 4000;  // a full-size probe's padding at most (less where the MTUs are smaller)
constexpr size_t kNoticeBytes = 32;      // payload a notice sender writes
constexpr size_t kNoticeMinBytes = 20;   // payload a receiver needs
constexpr size_t kAddrChangeBytes = 40;  // payload an address-change sender writes (and a receiver needs)

// A NIC-down notice: the sender's NIC at `addr` is down. IPv4 uses addr[0..4), the rest is 0.
struct NicNotice {
  uint8_t family = 4;  // 4 or 6
  uint8_t addr[16] = {};
};

// A peer NIC moved from `oldAddr` to `newAddr`; `port` is its listener/probe port (host order).
struct AddrChange {
  uint8_t family = 4;  // 4 or 6 (both addresses)
  uint8_t oldAddr[16] = {};
  uint8_t newAddr[16] = {};
  uint16_t port = 0;
};

enum class Kind { kProbe, kProbeAck, kNotice, kAddrChange };

// What one received datagram says.
struct Datagram {
  Kind kind = Kind::kProbe;
  Header header;       // the decoded header (flags, seq, ...)
  NicNotice notice;    // kind == kNotice
  AddrChange change;   // kind == kAddrChange
};

// Writes kHeaderBytes + kNoticeBytes bytes to `out`.
void encodeNotice(const NicNotice& n, uint8_t* out);
// Writes kHeaderBytes + kAddrChangeBytes bytes to `out`.
void encodeAddrChange(const AddrChange& c, uint8_t* out);

// Parses a datagram of `n` bytes. Returns false with `err` naming the problem when it is not
// a probe or probe ack (short, other type, `len` over 64 KiB), or a notice / address change
// with a truncated payload or an unknown address family. Never reads past buf[n).
bool decodeDatagram(const void* buf, size_t n, Datagram* d, std::string* err);

}  // namespace probe
}  // namespace railover
