// railover-perf: out-of-band rendezvous between rank processes over pathname AF_UNIX sockets.
//
// Pathname UNIX sockets live in the file system, not in a network namespace, so ranks placed in
// different network namespaces (but sharing the directory) can still meet. Rank R binds
// DIR/rank<R>.sock; every rank connects to each lower rank's socket (retrying ENOENT /
// ECONNREFUSED until the deadline, so start order does not matter) and accepts the higher ranks,
// giving one stream connection per pair. A reader thread files incoming tagged messages into a
// mailbox; end-of-file on a peer's connection marks that peer gone (the "peer exited" signal).
//
// Messages are tagged (kind, a, b, c); the handle exchange uses kind kHandle with
// (channel, direction, round). Sending to oneself is allowed (single-rank runs).
//
// Thread-safety: after start(), send/recv/tryRecv/barrier/allgather/peerGone may be called from
// any thread concurrently. start() and stop() must be called by one thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace rperf {

class Rendezvous {
 public:
  enum Kind : uint32_t { kHello = 1, kHandle = 2, kBarrier = 3, kGather = 4, kPermit = 5 };
  struct Tag {
    uint32_t kind, a, b, c;
    bool operator<(const Tag& o) const { return std::tie(kind, a, b, c) < std::tie(o.kind, o.a, o.b, o.c); }
  };
  enum class Status { kOk, kNotYet, kTimeout, kPeerGone, kError };

  Rendezvous() = default;
  ~Rendezvous();
  // Binds DIR/rank<rank>.sock and connects the full mesh; returns false (with *err) when the
  // mesh is not complete by deadlineUs (CLOCK_MONOTONIC µs).
  bool start(const std::string& dir, int rank, int nranks, uint64_t deadlineUs, std::string* err);
  // Closes every socket and removes our socket file. Safe to call twice.
  void stop();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  bool send(int peer, Tag tag, const void* data, size_t len, std::string* err);
  // Blocks until a message with this tag from peer arrives (kOk), the deadline passes (kTimeout)
  // or the peer is gone with no such message queued (kPeerGone).
  Status recv(int peer, Tag tag, std::vector<char>* out, uint64_t deadlineUs);
  // Non-blocking variant: kNotYet when nothing is queued and the peer is alive.
  Status tryRecv(int peer, Tag tag, std::vector<char>* out);
  // Every rank sends (kBarrier, seq) to every other and waits for all of them.
  bool barrier(uint32_t seq, uint64_t deadlineUs, std::string* err);
  // Each rank contributes `mine`; on success all[r] holds rank r's bytes.
  bool allgather(uint32_t seq, const std::vector<char>& mine, std::vector<std::vector<char>>* all,
                 uint64_t deadlineUs, std::string* err);

  // First peer seen gone (connection closed), or -1.
  int firstGonePeer() const { return firstGone_.load(std::memory_order_acquire); }
  bool peerGone(int peer) const;
  // Waits until some peer is gone (true) or the deadline passes (false).
  bool waitAnyGone(uint64_t deadlineUs);

 private:
  struct Peer {
    int fd = -1;
    std::mutex wmu;  // serialises writers
    bool gone = false;
  };
  void readerLoop();
  bool readMsg(int peer);
  void markGone(int peer);

  int rank_ = -1, nranks_ = 0;
  std::string path_;
  int listenFd_ = -1;
  int wakeFd_[2] = {-1, -1};
  std::vector<std::unique_ptr<Peer>> peers_;
  std::thread reader_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, Tag>, std::deque<std::vector<char>>> box_;
  std::atomic<int> firstGone_{-1};
  bool started_ = false;
};

}  // namespace rperf
