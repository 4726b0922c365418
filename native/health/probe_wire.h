// Health probe datagrams (UDP, one per packet): a 32-byte frame header (transport/tcp/wire.h,
// type kProbe or kProbeAck) followed by `len` bytes. Two probe flags carry a payload that the
// receiver parses:
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

#include "transport/tcp/wire.h"

namespace railover {
namespace probe {

constexpr uint8_t kFlagBig = 1;         // full-size probe (size-dependent loss check)
constexpr uint8_t kFlagNotice = 2;      // "my NIC with this address is down"
constexpr uint8_t kFlagAddrChange = 4;  // "my NIC moved from this address to that one"
constexpr size_t kBigProbeBytes = 4000;
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
  wire::Frame frame;   // the decoded header (flags, seq, ...)
  NicNotice notice;    // kind == kNotice
  AddrChange change;   // kind == kAddrChange
};

// Writes kFrameBytes + kNoticeBytes bytes to `out`.
void encodeNotice(const NicNotice& n, uint8_t* out);
// Writes kFrameBytes + kAddrChangeBytes bytes to `out`.
void encodeAddrChange(const AddrChange& c, uint8_t* out);

// Parses a datagram of `n` bytes. Returns false with `err` naming the problem when it is not
// a probe or probe ack (short, bad header, other frame type), or a notice / address change
// with a truncated payload or an unknown address family. Never reads past buf[n).
bool decodeDatagram(const void* buf, size_t n, Datagram* d, std::string* err);

}  // namespace probe
}  // namespace railover
