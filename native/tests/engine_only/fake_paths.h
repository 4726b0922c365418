// A chunk-level fake transport: implements the path interface (transport/transport.h)
// directly, with no framing and no byte streams, so the failover engine can be tested (and
// linked) without anything from transport/tcp/.
//
// A sender path and its receiver path share a Channel: `lanes` ordered queues of items (a
// chunk with a copy of its bytes, or a control message) toward the receiver, striped like a
// multi-stream transport, and one control queue back. A "wire" groups every path opened from
// one local NIC to one remote address (one NIC pair) and carries the faults:
//   drop       chunks and control messages sent toward the receiver vanish (a black hole)
//   broken     every call on both ends fails (a reset)
//   stalled    the sender moves nothing (a full send queue)
//   maxChunks  at most this many chunks move per progress call (partial progress)
//   refuse     new paths fail as the network would (no route to host)
//   peerGone   new paths are refused by the peer (its process exited)
//   hangConnect  paths opened now never connect
//   connectPolls paths opened now connect on their this-many-th connectState() call (0 or 1:
//              the first), as a transport whose connect moves one stage per poll (the verbs
//              bootstrap: HELLO, endpoint, QP bring-up)
//   recvConnectPolls  the same for the receive side of paths routed now (the verbs receiver
//              brings its QPs up on its worker before it answers)
//   peerAcks   the peer's transport still acknowledges (a slow, not dead, path)
//   acksTell   the transport's own acknowledgements prove delivery, as RDMA RC's (the peer's
//              HCA acknowledges whatever its process does): unackedSilenceMs counts from the
//              first chunk or control message the wire dropped since the last one it carried,
//              and ackSilenceIsFault is true (the flow-stall rule applies); the same for the
//              receiver's control messages (FakeRecvPath) with backDrop
//   backDrop   control messages the receiver sends toward the sender vanish (the reverse
//              direction of the path's flow is cut; the data direction still works)
//   slowFence  a receive path's fenceAsync() stays pending (its FenceWait is kept in
//              `heldFences`) until the test sets done, as an RDMA QP whose move to ERR blocks
//   slowCalls  the next this many sender progress calls hold the caller for slowCallUs
//              first (a provider call that blocks, as rxe's after a link loss)
//   slowCloses the next this many sender fences (a path's close) hold the caller as long
//   slowRecvCloses  the next this many receiver fences (fence(), which fenceAsync() calls too:
//              set it just before the comm's close) hold the caller as long, and report that recvGrantWaitUs of it waited for a
//              running grant of remote write (RecvPath::lastFenceGrantWait), as an RDMA receive
//              path whose grant's modify of its QPs was still running
//   slowOpens  the next this many openSendPath calls hold the caller as long (creating a
//              path's QPs blocked in the provider)
//   silentDrop a receiver's drop of a path (its fence) reaches the sender only when the sender
//              nudges it (SendPath::nudge): its FIN was lost with its NIC and its socket
//              reaped, and a real kernel then answers only the sender's next byte (a reset).
//              Until then what the sender sends vanishes. `nudges` counts the nudges.
// Per path (on its Channel):
//   laneStalled[i]  lane i only stops (one stream of several)
//   backStalled     the receiver's control channel stops: its ACKs stay queued at the receiver
//                   (dropped when it fences); notices (CLOSE, NACK), which a multi-stream
//                   transport sends on every stream, still get through
//   senderTimedOut  the sender's transport gave up on the path (a kernel user timeout): its
//                   calls fail; the receiver sees the path closed once the sender fences it
// PathTransport::tellsReceives: the transport tells the sender what the receiver posted, as
// RDMA's advertisements do: RecvPath::advertise reaches the sender's path at once
// (Channel::posted, SendPath::postedReceive), and each message moves as one chunk, so that,
// as with RDMA, a buffer is taken exactly when its message is whole.
//
// Thread-safety: single-threaded tests only.
#pragma once

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <climits>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "failover/link.h"
#include "plugin/devices.h"
#include "transport/transport.h"

namespace railover {
namespace chunkfake {

struct Wire {
  bool drop = false, broken = false, stalled = false, refuse = false, peerGone = false;
  bool hangConnect = false, peerAcks = false, acksTell = false, backDrop = false;
  size_t maxChunks = SIZE_MAX;
  uint64_t bytes = 0;  // payload bytes sent toward the receiver
  bool slowFence = false;
  std::vector<std::shared_ptr<FenceWait>> heldFences;
  int slowCalls = 0, slowCloses = 0, slowOpens = 0, slowRecvCloses = 0;
  uint64_t slowCallUs = 0, recvGrantWaitUs = 0;
  bool silentDrop = false;
  int nudges = 0;
  int connectPolls = 0;
  int recvConnectPolls = 0;  // receive paths opened now connect on their this-many-th connectState() call
};

struct Item {
  bool isCtl = false;
  CtlMsg ctl;
  ChunkRef c;
  std::vector<uint8_t> bytes;
};

struct Channel {
  std::vector<std::deque<Item>> lanes;  // sender -> receiver; control messages on lane 0
  std::deque<CtlMsg> back;              // receiver -> sender
  std::vector<bool> laneStalled;
  bool backStalled = false, senderTimedOut = false;
  bool senderGone = false, receiverGone = false;
  bool receiverGoneSilently = false;  // Wire::silentDrop: gone, not yet known to the sender
  std::shared_ptr<Wire> wire;
  bool wholeMessages = false;                    // tellsReceives: one chunk per message
  std::map<uint64_t, PostedReceive> posted;      // tellsReceives: what the receiver advertised, by first seq
};

// What the receiver's acceptor gets for a fake path: a token naming the channel (the engine
// hands it to the receive path through RecvPath::adopt, as a stream transport's streams).
class Token : public Conn {
 public:
  explicit Token(std::shared_ptr<Channel> ch) : ch(std::move(ch)) {}
  int connectState(std::string*) override { return 1; }
  ssize_t writev(const iovec*, int, std::string* err) override { return *err = "not a stream", -1; }
  ssize_t read(void*, size_t, std::string* err) override { return *err = "not a stream", -1; }
  bool dead(std::string*) override { return false; }
  std::shared_ptr<Channel> ch;
};

class FakeSendPath : public SendPath {
 public:
  FakeSendPath(std::shared_ptr<Channel> ch, bool hangs, ChunkPolicy chunks)
      : ch_(ch), hangs_(hangs), chunks_(chunks), pollsToConnect_(ch->wire->connectPolls) {
    queued_.resize(ch->lanes.size(), 0);
  }
  ~FakeSendPath() override { fence(); }
  int connectState(std::string* err) override {
    if (ch_->wire->broken) return *err = "connection reset (fake)", -1;
    if (hangs_) return 0;
    return ++polls_ >= pollsToConnect_ ? 1 : 0;
  }
  uint64_t chunkBytes(uint64_t size) const override {
    if (ch_->wholeMessages) return size ? size : 1;
    uint64_t n = ch_->lanes.size();
    uint64_t c = ((size + n - 1) / n + 127) & ~uint64_t(127);
    return std::min(std::max(c, std::max<uint64_t>(chunks_.minChunkBytes, 128)), std::max<uint64_t>(chunks_.maxChunkBytes, 128));
  }
  void post(const ChunkRef& c, const void* src) override {
    size_t lane = 0;
    for (size_t i = 0; i < queued_.size(); ++i)
      if (queued_[i] < queued_[lane]) lane = i;
    if (c.len == 0) lane = 0;
    q_.push_back({c, (const uint8_t*)src, lane});
    queued_[lane] += c.len;
  }
  void sendCtl(const CtlMsg& m) override { ctl_.push_back(m); }
  int progress(std::string* err) override {
    if (ch_->wire->slowCalls > 0) {
      ch_->wire->slowCalls--;
      std::this_thread::sleep_for(std::chrono::microseconds(ch_->wire->slowCallUs));  // the blocked call itself
    }
    if (ch_->senderGone) return *err = "path fenced", -1;
    if (ch_->senderTimedOut) return *err = "Connection timed out (fake)", -1;
    if (ch_->wire->broken) return *err = "connection reset (fake)", -1;
    if (ch_->receiverGone) return *err = "Broken pipe (fake)", -1;
    if (ch_->wire->stalled) return 0;
    int moved = 0;
    while (!ctl_.empty()) {
      Item it;
      it.isCtl = true, it.ctl = ctl_.front();
      ctl_.pop_front();
      carried(!ch_->wire->drop);
      if (!ch_->wire->drop) ch_->lanes[0].push_back(std::move(it));
    }
    size_t budget = ch_->wire->maxChunks;
    for (auto e = q_.begin(); e != q_.end() && budget;) {
      if (ch_->laneStalled[e->lane]) {
        ++e;
        continue;
      }
      Item it;
      it.c = e->c;
      it.bytes.assign(e->src, e->src + e->c.len);
      ch_->wire->bytes += e->c.len;
      carried(!ch_->wire->drop);
      if (!ch_->wire->drop) ch_->lanes[e->lane].push_back(std::move(it));
      queued_[e->lane] -= e->c.len;
      e = q_.erase(e);
      moved = 1, --budget;
    }
    return moved;
  }
  int recvCtl(CtlMsg* m, std::string* err) override {
    if (ch_->senderTimedOut) return *err = "Connection timed out (fake)", -1;
    if (ch_->wire->broken) return *err = "connection reset (fake)", -1;
    if (ch_->back.empty()) return ch_->receiverGone ? (*err = "connection closed by peer", -1) : 0;
    *m = ch_->back.front();
    ch_->back.pop_front();
    return 1;
  }
  int recvNotice(bool withCtl, CtlMsg* m, std::string* err) override {
    if (ch_->senderTimedOut) return *err = "Connection timed out (fake)", -1;
    if (ch_->wire->broken) return *err = "connection reset (fake)", -1;
    if (withCtl || (!ch_->back.empty() && (ch_->back.front().type == CtlType::kClose || ch_->back.front().type == CtlType::kNack)))
      return recvCtl(m, err);
    if (ch_->back.empty() && ch_->receiverGone) return *err = "connection closed by peer", -1;
    return 0;
  }
  void sendClose() override {
    std::string err;
    CtlMsg m;
    m.type = CtlType::kClose;
    sendCtl(m);
    if (!ch_->wire->broken && !ch_->receiverGone) progress(&err);
  }
  void fence() override {
    if (ch_->wire->slowCloses > 0) {
      ch_->wire->slowCloses--;
      std::this_thread::sleep_for(std::chrono::microseconds(ch_->wire->slowCallUs));
    }
    ch_->senderGone = true;
    q_.clear(), ctl_.clear();
  }
  bool peerAckedWithinMs(uint32_t) override { return ch_->wire->peerAcks && !q_.empty(); }
  uint32_t unackedSilenceMs() override {
    return ch_->wire->acksTell && silentSinceUs_ ? (uint32_t)((nowUs() - silentSinceUs_) / 1000) : 0;
  }
  bool ackSilenceIsFault() const override { return ch_->wire->acksTell; }
  void nudge() override {
    ch_->wire->nudges++;
    if (ch_->receiverGoneSilently) ch_->receiverGone = true;  // the reset that answers the byte
  }
  bool postedReceive(uint64_t seq, PostedReceive* out) const override {
    if (!ch_->wholeMessages || ch_->senderGone || ch_->wire->broken) return false;
    auto it = ch_->posted.upper_bound(seq);
    if (it == ch_->posted.begin()) return false;
    --it;
    if (seq - it->first >= (uint64_t)it->second.n) return false;
    *out = it->second;
    return true;
  }
  Channel& channel() { return *ch_; }

 private:
  struct Queued {
    ChunkRef c;
    const uint8_t* src;
    size_t lane;
  };
  std::shared_ptr<Channel> ch_;
  bool hangs_;
  ChunkPolicy chunks_;
  int pollsToConnect_ = 0, polls_ = 0;  // Wire::connectPolls when opened; connectState() calls so far
  std::deque<Queued> q_;
  std::deque<CtlMsg> ctl_;
  std::vector<uint64_t> queued_;
  uint64_t silentSinceUs_ = 0;  // acksTell: the first drop since the wire last carried something
  void carried(bool ok) {
    if (ok) silentSinceUs_ = 0;
    else if (!silentSinceUs_) silentSinceUs_ = nowUs();
  }
};

class FakeRecvPath : public RecvPath {
 public:
  ~FakeRecvPath() override { fence(); }
  bool adopt(int, std::unique_ptr<Conn> c) override {
    auto* t = dynamic_cast<Token*>(c.get());
    if (!t) return false;
    ch_ = t->ch;
    return true;
  }
  int connectState(std::string*) override {
    if (!ch_) return 0;
    if (!pollsToConnect_) pollsToConnect_ = std::max(1, ch_->wire->recvConnectPolls);
    return ++polls_ >= pollsToConnect_ ? 1 : 0;
  }
  int progress(RecvSink& sink, std::string* err) override {
    if (!ch_) return *err = "path fenced", -1;
    if (ch_->wire->broken) return *err = "connection reset (fake)", -1;
    if (flushCtl(err) < 0) return -1;
    int moved = 0;
    for (auto& lane : ch_->lanes) {
      while (!lane.empty()) {
        Item& it = lane.front();
        if (it.isCtl) {
          if (!sink.control(it.ctl, err)) return -1;
          lane.pop_front();
          continue;
        }
        uint8_t* dst = nullptr;
        int how = sink.place(it.c, &dst, err);
        if (how < 0) return -1;
        if (how == RecvSink::kHold) break;
        if (how == RecvSink::kWrite && it.c.len) memcpy(dst, it.bytes.data(), it.c.len);
        sink.arrived(it.c, how == RecvSink::kDiscard);
        lane.pop_front();
        moved = 1;
      }
    }
    if (!moved && ch_->senderGone && empty()) return *err = "connection closed by peer", -1;
    return moved;
  }
  void sendCtl(const CtlMsg& m) override { out_.push_back(m); }
  int flushCtl(std::string* err) override {
    if (!ch_) return *err = "path fenced", -1;
    if (ch_->wire->broken) return *err = "connection reset (fake)", -1;
    if (ch_->senderGone) out_.clear();
    if (ch_->backStalled) {
      std::deque<CtlMsg> held;
      for (auto& m : out_)
        if (m.type == CtlType::kClose || m.type == CtlType::kNack) ch_->back.push_back(m);
        else held.push_back(m);
      out_.swap(held);
      return 0;
    }
    if (ch_->wire->backDrop) {  // what leaves this end vanishes, unacknowledged
      if (!out_.empty() && !silentSinceUs_) silentSinceUs_ = nowUs();
      out_.clear();
      return 0;
    }
    if (!out_.empty()) silentSinceUs_ = 0;
    for (auto& m : out_) ch_->back.push_back(m);
    out_.clear();
    return 0;
  }
  uint32_t unackedSilenceMs() override {
    return ch_ && ch_->wire->acksTell && silentSinceUs_ ? (uint32_t)((nowUs() - silentSinceUs_) / 1000) : 0;
  }
  int pollsToConnect_ = 0, polls_ = 0;  // Wire::recvConnectPolls when adopted (at least 1); connectState() calls so far
  bool ackSilenceIsFault() const override { return ch_ && ch_->wire->acksTell; }
  int recvCtl(CtlMsg* m, std::string* err) override {
    if (!ch_) return *err = "path fenced", -1;
    if (ch_->wire->broken) return *err = "connection reset (fake)", -1;
    auto& l0 = ch_->lanes[0];
    if (l0.empty()) return ch_->senderGone ? (*err = "connection closed by peer", -1) : 0;
    if (!l0.front().isCtl) {
      m->type = CtlType::kOther, m->arg = 2;  // data where a control message was expected
    } else {
      *m = l0.front().ctl;
    }
    l0.pop_front();
    return 1;
  }
  void sendClose(uint64_t reason) override {
    std::string err;
    CtlMsg m;
    m.type = CtlType::kClose, m.seq = reason;
    sendCtl(m);
    if (ch_ && !ch_->wire->broken) flushCtl(&err);
  }
  void fence() override {
    if (ch_ && ch_->wire->slowRecvCloses > 0) {
      ch_->wire->slowRecvCloses--;
      std::this_thread::sleep_for(std::chrono::microseconds(ch_->wire->slowCallUs));  // the blocked fence itself
      grantWait_.waited = true, grantWait_.us = ch_->wire->recvGrantWaitUs;
    }
    if (ch_ && ch_->wire->silentDrop) {
      ch_->receiverGoneSilently = true;
      for (auto& l : ch_->lanes) l.clear();
    } else if (ch_) {
      ch_->receiverGone = true;
    }
    out_.clear();
  }
  void advertise(uint64_t seq, const AdvertEntry* entries, int n, bool grouped) override {
    if (!ch_ || !ch_->wholeMessages) return;
    PostedReceive pr;
    pr.firstSeq = seq, pr.n = n, pr.grouped = grouped;
    for (int i = 0; i < n && i < kMaxReceiveBuffers; ++i) pr.tags[i] = entries[i].tag;
    // A re-advertisement after a RESUME replaces what it overlaps.
    ch_->posted.erase(ch_->posted.lower_bound(seq), ch_->posted.end());
    ch_->posted[seq] = pr;
  }
  FenceGrantWait lastFenceGrantWait() const override { return grantWait_; }
  std::shared_ptr<FenceWait> fenceAsync() override {
    bool slow = ch_ && ch_->wire->slowFence;
    std::shared_ptr<Wire> w = ch_ ? ch_->wire : nullptr;
    fence();
    if (!slow) return nullptr;
    auto f = std::make_shared<FenceWait>();
    f->queuedUs = nowUs();  // the test that releases it sets startUs and endUs
    w->heldFences.push_back(f);
    return f;
  }
  Channel& channel() { return *ch_; }

 private:
  bool empty() const {
    for (auto& l : ch_->lanes)
      if (!l.empty()) return false;
    return true;
  }
  std::shared_ptr<Channel> ch_;
  std::deque<CtlMsg> out_;
  uint64_t silentSinceUs_ = 0;  // acksTell + backDrop: the first control message dropped since one got through
  FenceGrantWait grantWait_;    // slowRecvCloses: what the last fence() reports
};

// Paths wait in `pending` until connected; pump() hands them to the engine's acceptor entry.
class PathTransport : public railover::Transport {
 public:
  struct Pending {
    std::shared_ptr<Channel> ch;
    StreamHello hello;
    int remoteNic;
    sockaddr_storage clientAddr;
    bool hangs;
  };
  std::map<std::pair<int, std::string>, std::shared_ptr<Wire>> wires;
  std::vector<Pending> pending;
  std::vector<std::string> nicAddr;  // address per local NIC index
  int lanes = 2;
  bool tellsReceives = false;  // see the header comment
  bool tellsPostedReceives() const override { return tellsReceives; }
  bool groupedReceives() const override { return true; }  // the engine's grouped-receive scenarios
  // The transport per local NIC, as the RDMA transport's mixed mode answers (RAILOVER_TRANSPORT=
  // auto: "rdma" where an RDMA port backs the NIC, "tcp" elsewhere); empty: name() for every
  // NIC. A "tcp" NIC tells the sender no posted receive.
  std::vector<std::string> kinds;
  const char* nicTransport(int nic) const override {
    return nic >= 0 && (size_t)nic < kinds.size() ? kinds[(size_t)nic].c_str() : name();
  }
  bool tellsPostedReceivesOn(int nic) const override {
    return tellsReceives && (kinds.empty() || std::string(nicTransport(nic)) != "tcp");
  }
  // As RDMA names the HCA port behind a NIC ("fakehca<nic> port 1") when set; "" (TCP) else.
  bool namesDevices = false;
  std::string nicDevice(int nic) const override {
    return namesDevices ? "fakehca" + std::to_string(nic) + " port 1" : std::string();
  }
  StreamRouter* router = nullptr;    // where pump() routes paths (a LinkRegistry); nullptr: none known

  std::shared_ptr<Wire> wire(int nic, const std::string& remote) {
    auto& w = wires[{nic, remote}];
    if (!w) w = std::make_shared<Wire>();
    return w;
  }
  // Liveness checks of the peer process (the receiver's peer-gone verdict) see the wire.
  std::unique_ptr<Conn> connect(int nic, const sockaddr_storage& remote, socklen_t, std::string* err) override {
    auto w = wire(nic, addrToString(remote));
    if (w->peerGone) return *err = "connect: Connection refused (fake)", nullptr;
    if (w->refuse || w->broken) return *err = "connect: No route to host (fake)", nullptr;
    return std::unique_ptr<Conn>(new Token(std::make_shared<Channel>()));
  }
  bool endLivenessCheck(Conn&, std::string*) override { return true; }
  std::unique_ptr<SendPath> openSendPath(int nic, const sockaddr_storage& remote, socklen_t, int,
                                         const PathIdentity& id, const ChunkPolicy& chunks, std::string* err) override {
    std::string ra = addrToString(remote);
    auto w = wire(nic, ra);
    if (w->slowOpens > 0) {  // creating the path's QPs blocked in the provider
      w->slowOpens--;
      std::this_thread::sleep_for(std::chrono::microseconds(w->slowCallUs));
    }
    if (w->peerGone) return *err = "connect: Connection refused (fake)", nullptr;
    if (w->refuse || w->broken) return *err = "connect: No route to host (fake)", nullptr;
    auto ch = std::make_shared<Channel>();
    ch->lanes.resize((size_t)std::max(lanes, 1));
    ch->laneStalled.assign(ch->lanes.size(), false);
    ch->wire = w;
    ch->wholeMessages = tellsReceives;
    Pending p;
    p.ch = ch;
    p.hello.id = id;
    p.hello.stream = 0, p.hello.nStreams = 1;  // a fake path arrives whole
    p.remoteNic = -1;
    for (size_t i = 0; i < nicAddr.size(); ++i)
      if (nicAddr[i] == ra) p.remoteNic = (int)i;
    memset(&p.clientAddr, 0, sizeof(p.clientAddr));
    auto* sin = (sockaddr_in*)&p.clientAddr;
    sin->sin_family = AF_INET;
    inet_pton(AF_INET, nicAddr[nic].c_str(), &sin->sin_addr);
    p.hangs = w->hangConnect;
    pending.push_back(p);
    return std::unique_ptr<SendPath>(new FakeSendPath(ch, p.hangs, chunks));
  }
  std::unique_ptr<RecvPath> newRecvPath(int) override { return std::unique_ptr<RecvPath>(new FakeRecvPath()); }

  // Plays the acceptor: routes every connected path to its receiver.
  void pump() {
    for (size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      if (p.hangs || p.ch->wire->broken || p.ch->senderGone) {
        if (p.ch->senderGone) pending.erase(pending.begin() + i);
        else ++i;
        continue;
      }
      std::unique_ptr<Conn> t(new Token(p.ch));
      if (!(router && router->route(t, p.hello, p.clientAddr, p.remoteNic)) && p.hello.id.connId != 0) {
        CtlMsg m;  // as the acceptor: the comm is unknown here
        m.type = CtlType::kNack, m.seq = kNackReasonUnknownComm;
        p.ch->back.push_back(m);
        p.ch->receiverGone = true;
      }
      pending.erase(pending.begin() + i);
    }
  }
};

}  // namespace chunkfake
}  // namespace railover
