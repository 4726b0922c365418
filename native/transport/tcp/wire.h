// railover wire format, TCP transport (protocol version 2). docs/PROTOCOL.md describes it
// in prose; this header is the one place that defines the bytes. All integers are
// little-endian on the wire.
//
// Handle (<= 128 bytes, exchanged by NCCL's bootstrap):
//   0  u32 magic 'RLVR'   4 u16 version   6 u8 naddr   7 u8 primary (index into addrs)
//   8  u64 secret (random, per listen comm)
//   16 naddr x { u8 rail, u8 family (4 or 6), u16 port, u8 addr[16] }   (at most 5)
//   116 u8 transport of the listener's paths (kTransportTcp 0, kTransportRdma 1); a sender
//       whose transport differs refuses the handle with an error naming both
// Frames: every frame is 32 bytes; DATA frames are followed by `len` payload bytes.
// Version 2 (this one) added the connection id to the HELLO (several connections per listen
// handle), the tag to DATA frames (grouped receives) and the NACK reason codes; a peer of
// another version is refused (handle, HELLO).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace railover {
namespace wire {

constexpr uint32_t kMagic = 0x52564C52;  // "RLVR" read as little-endian bytes R L V R
constexpr uint16_t kVersion = 2;
constexpr size_t kHandleBytes = 128;
constexpr int kMaxHandleAddrs = 5;
constexpr size_t kFrameBytes = 32;
// Largest message the protocol accepts (NCCL's own bound for maxP2pBytes, 1 TiB).
constexpr uint64_t kMaxMessageBytes = 1ULL << 40;
// Largest chunk a DATA frame may carry (bounds a reader's trust in `len`).
constexpr uint32_t kMaxChunkBytes = 16u << 20;

struct HandleAddr {
  uint8_t rail = 0;
  uint8_t family = 4;  // 4 = IPv4, 6 = IPv6
  uint16_t port = 0;
  uint8_t addr[16] = {};
};

constexpr size_t kHandleTransportOffset = 116;
constexpr uint8_t kTransportTcp = 0;
constexpr uint8_t kTransportRdma = 1;
const char* transportWireName(uint8_t t);  // "tcp", "rdma", "unknown"

struct Handle {
  uint16_t version = kVersion;
  uint8_t transport = kTransportTcp;
  uint8_t naddr = 0;
  uint8_t primary = 0;
  uint64_t secret = 0;
  HandleAddr addrs[kMaxHandleAddrs];
};

void encodeHandle(const Handle& h, void* out /* kHandleBytes */);
// Checks magic, version, address count/family and primary index; `err` names the problem.
bool decodeHandle(const void* in, size_t len, Handle* h, std::string* err);

enum FrameType : uint8_t {
  kHello = 1,      // sender -> receiver, first frame on every stream
  kData = 2,       // sender -> receiver: one chunk of message `seq`
  kAck = 3,        // receiver -> sender: every message with seq < `seq` is complete
  kResume = 4,     // sender -> receiver on a newly activated path: first unacknowledged seq
  kResumeAck = 5,  // receiver -> sender: next seq the receiver expects
  kProbe = 6,      // either way: liveness probe, `seq` = probe id, `total` = padding bytes that follow
  kProbeAck = 7,   // answer to a probe
  kNack = 8,       // receiver -> sender: refused; `seq` = reason code (kNack*)
  kClose = 9,      // either way, on the active path: the comm is being closed (orderly, not a fault)
};

struct Hello {
  uint16_t version = kVersion;
  uint8_t stream = 0;     // stream index within the path
  uint8_t nStreams = 1;   // streams in this path
  uint64_t secret = 0;
  uint8_t path = 0;       // receiver address index this path targets
  uint8_t srcRail = 0;    // sender NIC's rail
  uint16_t probePort = 0; // sender NIC's listener/probe port (for health probes back)
  uint32_t generation = 0;  // increments every time the sender re-opens this path
  // Which connection to the listen handle this stream belongs to (random, chosen by connect;
  // every path and generation of one send comm carries the same id). 0 = a liveness check:
  // the acceptor closes it without a log line (the peer only wanted to know whether this
  // process still listens).
  uint64_t connId = 0;
};

// NACK reason codes (`seq` of a kNack frame), sent by the acceptor before it closes a stream.
constexpr uint64_t kNackUnknownComm = 1;  // no open listen comm or live recv comm has this secret/connId

struct Frame {
  uint8_t type = 0;
  uint8_t flags = 0;
  uint16_t stream = 0;
  uint32_t len = 0;     // payload bytes after the header (kData, kProbe)
  uint64_t seq = 0;
  uint64_t offset = 0;  // byte offset of the chunk within its message (< 2^48 on the wire)
  uint64_t total = 0;   // message size in bytes (< 2^48 on the wire)
  int32_t tag = 0;      // kData: the isend's tag (picks the buffer of a grouped receive)
};

void encodeHello(const Hello& h, void* out /* kFrameBytes */);
// Checks magic and version. Returns false with `err` ("bad magic", "unsupported version N").
bool decodeHello(const void* in, Hello* h, std::string* err);

void encodeFrame(const Frame& f, void* out /* kFrameBytes */);
// Decodes and bounds-checks a frame: known type; for kData len <= kMaxChunkBytes,
// offset + len <= total <= kMaxMessageBytes. `err` names the violated bound.
bool decodeFrame(const void* in, Frame* f, std::string* err);

// Splits a message of `size` bytes into chunk lengths for `nStreams` streams: each chunk a
// multiple of 128 bytes (except the last), between minChunk and maxChunk. Returns the chunk
// size to use; callers cut [0,size) into pieces of that size.
uint64_t chunkSize(uint64_t size, int nStreams, uint64_t minChunk, uint64_t maxChunk);

}  // namespace wire
}  // namespace railover
