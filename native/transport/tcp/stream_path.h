// Stream paths: the path interface (transport/transport.h) over N byte streams (`Conn`), with
// the TCP transport's framing (protocol v2, transport/tcp/wire.h, docs/PROTOCOL.md). Used for
// real TCP sockets and for the in-memory streams of the unit tests and fuzz targets.
//
// Send side: every stream starts with a HELLO; chunks go out as a DATA frame header followed
// by the payload taken straight from the caller's buffer (one writev per attempt: no copy, no
// allocation per chunk beyond the queue's blocks); control messages are 32-byte frames on
// stream 0, written only between two DATA frames of that stream. Partial writes and partial
// reads are resumed from the same byte on the next call.
//
// Thread-safety: as the path interface (one thread at a time).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transport/tcp/wire.h"
#include "transport/transport.h"

namespace railover {

// A transport whose paths are stream paths over connect()'s byte streams: TCP, and the
// in-memory streams of the unit tests and fuzz targets.
class StreamTransport : public Transport {
 public:
  std::unique_ptr<SendPath> openSendPath(int nic, const sockaddr_storage& remote, socklen_t len, int nStreams,
                                         const PathIdentity& id, const ChunkPolicy& chunks, std::string* err) override;
  std::unique_ptr<RecvPath> newRecvPath(int nStreams) override;
  bool endLivenessCheck(Conn& c, std::string* err) override;
  // The handle in protocol v2's layout (wire::Handle), naming name().
  bool encodeHandle(const PeerHandle& h, void* out, std::string* err) override;
  bool decodeHandle(const void* in, size_t len, PeerHandle* h, std::string* err) override;
};

// The engine-level view of a HELLO, and of a decoded handle.
StreamHello helloToStream(const wire::Hello& h);
PeerHandle handleToPeer(const wire::Handle& h);
// A listen handle in protocol v2's layout (wire::Handle: addresses, ports, rails, secret,
// primary index, transport byte from h.transport: "tcp" or "rdma"), written to
// out[0, kTransportHandleBytes); the TCP and RDMA transports both use it (RDMA's addresses are
// its bootstrap streams' listeners). False with *err when `h` cannot be encoded.
bool encodeWireHandle(const PeerHandle& h, void* out, std::string* err);
// wire::decodeHandle on at most kTransportHandleBytes of `in`, then handleToPeer.
bool decodeWireHandle(const void* in, size_t len, PeerHandle* h, std::string* err);

class StreamSendPath : public SendPath {
 public:
  // Takes the streams (already connecting); `id` goes into each stream's HELLO.
  StreamSendPath(std::vector<std::unique_ptr<Conn>> conns, const PathIdentity& id, const ChunkPolicy& chunks);
  int connectState(std::string* err) override;
  uint64_t chunkBytes(uint64_t size) const override;
  void post(const ChunkRef& c, const void* src) override;
  void sendCtl(const CtlMsg& m) override;
  int progress(std::string* err) override;
  int recvCtl(CtlMsg* m, std::string* err) override;
  int recvNotice(bool withCtl, CtlMsg* m, std::string* err) override;
  void sendClose() override;
  void fence() override;
  bool peerAckedWithinMs(uint32_t ms) override;
  uint32_t unackedSilenceMs() override;
  // Tests: stream i's connection (nullptr after fence()).
  Conn* stream(size_t i) { return i < s_.size() ? s_[i].conn.get() : nullptr; }
  size_t streams() const { return s_.size(); }

 private:
  struct Queued {
    ChunkRef c;
    const uint8_t* src;
  };
  struct Stream {
    std::unique_ptr<Conn> conn;
    bool connected = false;  // connected and HELLO written
    std::deque<Queued> q;
    uint64_t queuedBytes = 0;
    uint8_t hdr[wire::kFrameBytes];  // DATA header of q.front() while it is being written
    size_t hdrDone = 0;
    uint64_t payloadDone = 0;
    bool hdrBuilt = false;
    uint8_t rx[wire::kFrameBytes];  // frame from the receiver being read (stream 0: control)
    size_t rxGot = 0;
  };
  int writeStream(Stream& s, bool isCtl, std::string* err);
 public:
  // Shared with the receive side: frame <-> control message.
  static CtlMsg toCtl(const wire::Frame& f);
  static bool encodeCtl(const CtlMsg& m, uint8_t* out /* wire::kFrameBytes */);

 private:
  // Reads one whole frame from stream `s` into `f`: 1 got, 0 not yet, -1 error.
  int readFrame(Stream& s, wire::Frame* f, std::string* err);
  std::vector<Stream> s_;
  PathIdentity id_;
  ChunkPolicy chunks_;
  std::string ctlOut_;  // encoded control frames waiting for stream 0
};

// Receive side: streams arrive one at a time from the acceptor (each after its HELLO) and are
// adopted by index; DATA frames are read header first, then the payload straight into the
// destination the sink chose (or into a per-thread scratch buffer when it said discard).
class StreamRecvPath : public RecvPath {
 public:
  explicit StreamRecvPath(int nStreams);
  // Adopts stream `i` (0 <= i < nStreams), replacing one already there.
  bool adopt(int i, std::unique_ptr<Conn> c) override;
  int connectState(std::string* err) override;
  int progress(RecvSink& sink, std::string* err) override;
  void sendCtl(const CtlMsg& m) override;
  int flushCtl(std::string* err) override;
  int recvCtl(CtlMsg* m, std::string* err) override;
  void sendClose(uint64_t reason) override;
  void fence() override;
  size_t streams() const { return s_.size(); }
  Conn* stream(size_t i) { return i < s_.size() ? s_[i].conn.get() : nullptr; }

 private:
  struct Stream {
    std::unique_ptr<Conn> conn;
    uint8_t hdr[wire::kFrameBytes];
    size_t hdrGot = 0;
    bool haveHdr = false;  // cur is a DATA frame whose payload is being read
    bool placed = false;   // the sink answered for cur (dst / discard)
    bool discard = false;
    uint8_t* dst = nullptr;
    wire::Frame cur;
    uint64_t curGot = 0;
  };
  int readStream(Stream& s, RecvSink& sink, std::string* err);
  std::vector<Stream> s_;
  std::string ctlOut_;  // encoded control frames waiting for stream 0
  uint8_t ctlIn_[wire::kFrameBytes];  // control frame being read on stream 0 of a standby
  size_t ctlInGot_ = 0;
};

}  // namespace railover
