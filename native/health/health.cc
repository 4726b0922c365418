#include "health/health.h"
#include "health/probe_wire.h"

#include <arpa/inet.h>
#include <linux/netlink.h>
#include <linux/neighbour.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/nic.h"
#include "common/nic_socket.h"
#include "health/rules.h"
#include "common/tuning.h"
#include "telemetry/journal.h"

namespace railover {
namespace {

constexpr int kMaxPairs = 4096;
constexpr int kMaxNics = 16;
using probe::kBigProbeBytes;
using probe::kFlagBig;

struct Pair {
  std::atomic<bool> used{false};  // read without mu by the burst check in run()
  int refs = 0;
  int nic = -1;
  sockaddr_storage remote{};
  socklen_t len = 0;
  std::atomic<bool> up{true};
  std::atomic<bool> hard{false};
  // When the latest hard evidence came (a peer's NIC-down notice, our NIC down): a path that
  // connected over the pair after it proves the verdict stale (Health::pairHardDownSinceUs).
  std::atomic<uint64_t> hardSinceUs{0};
  // Where this down episode's hard evidence came from (under mu): our own NIC's loss, and the
  // peer's notice of its NIC's loss (peerHardCause, empty when none came). When our NIC comes
  // back and no peer notice came, the verdict is no longer hard, only unconfirmed (setNic).
  bool hardByLocalNic = false;
  // Softened when its local NIC came back (hardByLocalNic), not answered since: a peer's probe
  // request resets its back-off once, as for a hard pair (onUdp): the peer probing us is awake.
  bool awaitingAfterLocalNic = false;
  std::string peerHardCause;
  bool reprobedOnRequest = false;  // this down episode's back-off was reset by a peer's probe (once)
  bool peerWideDown = false;       // down after a silence of every rail to its peer (held, then judged)
  uint64_t lastAckUs = 0;
  // The latest answer (lastAckUs, credited for this thread's own late rounds), for links:
  // Health::pairAnsweredWithinUs. 0 until the pair's first answer.
  std::atomic<uint64_t> answeredUs{0};
  uint64_t wokeUs = 0;  // when an answer last ended a silence of half the detection time (peer woke up)
  uint64_t lastBigAckUs = 0;
  uint64_t burstUntilUs = 0;
  uint64_t downSinceUs = 0;
  // Down pairs are re-probed with back-off: next probe due at nextProbeUs, gap probeGapMs
  // (interval doubling to RAILOVER_PROBE_BACKOFF_MAX_MS); downProbes counts this outage's.
  uint64_t nextProbeUs = 0;
  uint32_t probeGapMs = 0;
  uint64_t downProbes = 0;
  uint64_t nextRoundUs = 0;  // an up pair is probed once per round, not again on a burst's extra round
  // The peer process answering on this pair (its instance id from the answers; 0 = unknown).
  uint64_t peerId = 0;
  uint16_t peerMtu = 0;  // the MTU the peer's NIC told in its answers (0: not yet, or an older railover); under mu
  bool silenceHeld = false;  // this timeout is being held as a peer-wide silence (journaled once)
  uint64_t silenceHeldSinceUs = 0;  // when that hold began (the round that first held it)
  bool queueHeld = false;    // this timeout is being held as congestion (health::holdForQueue)
  // Full-size burst bookkeeping (size-dependent loss needs every big probe lost, small ones
  // answered, and no TCP progress reported on the pair meanwhile).
  int burstBigSent = 0, burstBigAnswered = 0, burstSmallAnswered = 0;
  uint64_t burstStartUs = 0;
  std::atomic<uint64_t> dataAckedUs{0};  // a comm saw TCP acknowledge data on this pair (noteDataAcked)
  std::atomic<uint64_t> deliveredUs{0};  // a link took in the peer's data or ACK on this pair (noteDelivered)
  std::atomic<bool> burstOn{false};      // a full-size burst is running (read by links: burstActive)
  std::atomic<bool> burst{false};
  std::atomic<uint64_t> upSinceUs{0};  // last down -> up transition (0 = never down)
  // Queueing on this rail (health::answerQueued): send time of the latest answer that came
  // back within half the detection budget, and when the latest queued answer arrived (read by
  // links: failback waits a whole hold-down after it).
  uint64_t promptSentUs = 0;
  std::atomic<uint64_t> queuedUs{0};
  std::string cause;  // guarded by Monitor::mu
};

void (*gAddrHook)(int, const sockaddr_storage&, socklen_t) = nullptr;

void putAddr(uint8_t* out, const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) memcpy(out, &((const sockaddr_in&)a).sin_addr, 4);
  else memcpy(out, &((const sockaddr_in6&)a).sin6_addr, 16);
}
void getAddr(const uint8_t* in, int fam, sockaddr_storage* a) {
  memset(a, 0, sizeof(*a));
  a->ss_family = fam == 4 ? AF_INET : AF_INET6;
  if (fam == 4) memcpy(&((sockaddr_in*)a)->sin_addr, in, 4);
  else memcpy(&((sockaddr_in6*)a)->sin6_addr, in, 16);
}
void setPortOf(sockaddr_storage* a, uint16_t port) {
  if (a->ss_family == AF_INET) ((sockaddr_in*)a)->sin_port = htons(port);
  else ((sockaddr_in6*)a)->sin6_port = htons(port);
}

struct NicState {
  std::atomic<bool> up{true};
  std::atomic<uint64_t> upSinceUs{0};  // last down -> up transition (0 = never down)
  bool linkUp = true, hasAddr = true;
  bool portUp = true;  // the transport's port behind the NIC (RDMA HCA port); health thread only
  // The latest up -> down transition and its signal ("carrier lost", a transport's port
  // event...), for the cause of a held silence it ended (Monitor::heldSilenceEnd); health thread only.
  uint64_t downSinceUs = 0;
  std::string downSignal;
  int udp = -1;
  // The kernel interface that carries the NIC's name now (0: none). Starts as Nic::ifindex; a
  // device registered again under the name (driver reload, device reset: a new ifindex) is
  // followed, a device renamed away is not. Health thread only.
  int ifindex = 0;
  // The probe socket and the transport's listener are bound to a device that is gone: re-open
  // them on the NIC's address once it has one. Health thread only.
  bool reopen = false;
  int sockIfindex = 0;  // the interface the probe socket and listener were bound to; health thread only
  int mtu = 0;          // the NIC's MTU, bytes (0: unknown), from sysfs at start and netlink after; health thread only
};

bool sameIp(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) return ((const sockaddr_in&)a).sin_addr.s_addr == ((const sockaddr_in&)b).sin_addr.s_addr;
  return !memcmp(&((const sockaddr_in6&)a).sin6_addr, &((const sockaddr_in6&)b).sin6_addr, 16);
}
bool sameEndpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (!sameIp(a, b)) return false;
  if (a.ss_family == AF_INET) return ((const sockaddr_in&)a).sin_port == ((const sockaddr_in&)b).sin_port;
  return ((const sockaddr_in6&)a).sin6_port == ((const sockaddr_in6&)b).sin6_port;
}

class Monitor : public Health {
 public:
  // The health thread's buffers (members, not statics: a test may run a private monitor).
  // Aligned for the netlink headers read in place (a char array after the base class's members
  // may start at any address: UBSan's misaligned nlmsghdr in flushFailedNeighbours).
  alignas(nlmsghdr) char nlBuf[32768];
  uint8_t probeBuf[probe::kHeaderBytes + kBigProbeBytes];
  uint8_t udpBuf[probe::kHeaderBytes + 65536];
  // A private monitor (Health::startPrivate) stops its thread when destroyed; the
  // process-wide one never is.
  std::atomic<bool> stopping{false};
  std::thread thread;
  ~Monitor() override {
    if (thread.joinable()) {
      stopping.store(true, std::memory_order_release);
      uint64_t one = 1;
      if (write(sigFd, &one, sizeof(one)) < 0) {
        // cannot happen with a valid eventfd; the thread then ends at its next round
      }
      thread.join();
    }
    for (int i = 0; i < nNics; ++i)
      if (nicState[i].udp >= 0) ::close(nicState[i].udp);
    for (int fd : {nl, sigFd, ep_})
      if (fd >= 0) ::close(fd);
  }
  Config cfg;
  Nic* nics = nullptr;
  Journal* journal = nullptr;  // nullptr: no journal
  int nNics = 0;
  NicState nicState[kMaxNics];
  Pair pairs[kMaxPairs];
  // Slots [0, hw) may be used; every loop over pairs stops there instead of walking the whole
  // table (4096 x ~224 B) on every wake-up (that walk was ~40 % of an idle process's CPU).
  // Written under mu; read without it only by the burst check in run() (relaxed is enough).
  std::atomic<int> hw{0};
  struct Range {
    Pair* b;
    Pair* e;
    Pair* begin() const { return b; }
    Pair* end() const { return e; }
  };
  Range live() { return {pairs, pairs + hw.load(std::memory_order_relaxed)}; }
  mutable std::mutex mu;
  std::vector<std::pair<sockaddr_storage, sockaddr_storage>> remaps;  // peer NIC old -> new endpoint
  std::vector<uint16_t> ports;
  int nl = -1;
  // Transport NIC signals, queued by any thread and applied by the health thread.
  struct TransportSignal {
    int nic;
    bool up;
    std::string signal;
  };
  std::mutex sigMu;
  std::vector<TransportSignal> sigs;
  int sigFd = -1;  // eventfd: wakes the health thread
  void transportNicSignal(int nic, bool up, const std::string& signal) override {
    if (nic < 0 || nic >= nNics) return;
    {
      std::lock_guard<std::mutex> g(sigMu);
      sigs.push_back({nic, up, signal});
    }
    uint64_t one = 1;
    if (sigFd >= 0 && write(sigFd, &one, sizeof(one)) < 0) {
      // the counter cannot overflow in practice; the signal waits for the next wake-up
    }
  }
  void onTransportSignals(uint64_t now) {
    uint64_t v;
    while (read(sigFd, &v, sizeof(v)) > 0) {
    }
    std::vector<TransportSignal> got;
    {
      std::lock_guard<std::mutex> g(sigMu);
      got.swap(sigs);
    }
    for (auto& t : got) {
      NicState& st = nicState[t.nic];
      if (st.portUp == t.up) continue;
      st.portUp = t.up;
      setNic(t.nic, st.linkUp, st.hasAddr, t.signal.c_str(), now);
    }
  }
  uint64_t nextProbeUs = 0;
  uint64_t probeSeq = 0;
  uint64_t instanceId = 0;     // sent in every probe answer: tells peers which rails reach one process
  uint64_t lastRoundUs = 0;    // previous probe round (late-wake check)
  // Some pair was hard down at the last probe round (onUdp walks the pairs on a peer's probe
  // request only then).
  std::atomic<bool> hardDownSeen{false};
  uint64_t lateRounds = 0, lateMaxUs = 0, lastLateLogUs = 0;

  void setPairDown(Pair& p, const std::string& cause, uint64_t now, bool hard = false) {
    if (hard) {
      bool wasHard = p.hard.load();
      p.hardSinceUs.store(now, std::memory_order_release);
      p.hard.store(true, std::memory_order_release);
      // Already down: links re-check now (a refreshed verdict is news to a path kept after the
      // previous one; RecvLink::failPathsDownByHealth runs on an epoch change). A soft verdict
      // (probe timeout) that hard evidence now confirms takes the hard cause.
      if (!p.up.load()) {
        if (!wasHard) {
          p.cause = cause;
          p.peerWideDown = false;
          RO_INFO(RO_SUBSYS_NET, "railover: NIC pair %s -> %s down, now for a hard reason: %s", nics[p.nic].name.c_str(),
                  addrToString(p.remote).c_str(), cause.c_str());
        }
        bump();
      }
    }
    if (!p.up.load()) return;
    p.cause = cause;
    p.reprobedOnRequest = false;
    p.peerWideDown = false;  // onTimer sets it after a probe timeout shared by every rail to the peer
    p.downSinceUs = now;
    p.nextProbeUs = now + (uint64_t)cfg.probeIntervalMs * 1000;
    p.probeGapMs = cfg.probeIntervalMs;
    p.downProbes = 0;
    p.up.store(false, std::memory_order_release);
    if (journal)
      journal->pair_down(nics[p.nic].name, addrToString(p.remote), cause,
                         p.lastAckUs && now > p.lastAckUs ? now - p.lastAckUs : 0);
    RO_INFO(RO_SUBSYS_NET, "railover: NIC pair %s -> %s down: %s", nics[p.nic].name.c_str(),
            addrToString(p.remote).c_str(), cause.c_str());
    bump();
  }
  void setPairUp(Pair& p, uint64_t now) {
    if (p.up.load()) return;
    p.hardByLocalNic = p.awaitingAfterLocalNic = false;
    p.peerHardCause.clear();
    p.hard.store(false, std::memory_order_release);
    p.upSinceUs.store(now, std::memory_order_release);
    p.up.store(true, std::memory_order_release);
    if (journal) journal->pair_up(nics[p.nic].name, addrToString(p.remote), now - p.downSinceUs, p.downProbes);
    bump();
  }

  void setNic(int i, bool linkUp, bool hasAddr, const char* signal, uint64_t now) {
    NicState& s = nicState[i];
    bool was = s.up.load();
    s.linkUp = linkUp, s.hasAddr = hasAddr;
    bool up = linkUp && hasAddr && s.portUp;
    if (up == was) return;
    // Before anyone sees the NIC up (and reconnects through it): forget the neighbour entries
    // that failed to resolve during the outage, or the first packets would wait for the
    // kernel's next ARP/ND retransmission (retrans_time_ms, 1 s by default).
    int cleared = up ? flushFailedNeighbours(i) : 0;
    if (up) {
      // Before anyone sees the NIC up: a pair down because this NIC was is now down only for
      // want of an answer, soft, as a probe timeout. Kept hard, it failed every connect over it
      // until its first answer: with the peer's process late (a stopped or descheduled rank) a
      // repaired rail's reconnect was cut at every slow tick, however well the network carried
      // it. A peer's notice in the same episode keeps it hard, with the notice's cause.
      // Probes to its pairs backed off during the outage: probe them at the next round.
      std::lock_guard<std::mutex> g(mu);
      for (Pair& p : live()) {
        if (!p.used || p.nic != i) continue;
        p.nextProbeUs = 0, p.probeGapMs = cfg.probeIntervalMs;
        if (p.up.load() || !p.hard.load() || !p.hardByLocalNic) continue;
        p.hardByLocalNic = false;
        if (!p.peerHardCause.empty()) {
          p.cause = p.peerHardCause;
        } else {
          p.hard.store(false, std::memory_order_release);
          p.hardSinceUs.store(0, std::memory_order_release);
          p.awaitingAfterLocalNic = true;
          p.reprobedOnRequest = false;
          p.cause = std::string("no probe answered yet since local NIC ") + nics[i].name + " came back (" + signal + ")";
        }
      }
    }
    if (up) s.upSinceUs.store(nowUs(), std::memory_order_release);
    else s.downSinceUs = now, s.downSignal = signal;
    s.up.store(up, std::memory_order_release);
    if (journal && up) journal->nic_up(nics[i].name, signal, cleared);
    if (journal && !up) journal->nic_down(nics[i].name, signal);
    if (up) {
      RO_INFO(RO_SUBSYS_NET, "railover: NIC %s up (%s)", nics[i].name.c_str(), signal);
      sockaddr_storage a;
      socklen_t l;
      if (lookupIfAddr(nics[i].name, cfg.family, &a, &l)) nics[i].setAddr(a, l);  // re-learn the address
    } else {
      RO_WARN("railover: NIC %s down (%s); moving its comms to standby paths", nics[i].name.c_str(), signal);
      std::lock_guard<std::mutex> g(mu);
      for (Pair& p : live())
        if (p.used && p.nic == i) {
          setPairDown(p, std::string("local NIC ") + nics[i].name + " down (" + signal + ")", now, true);
          p.hardByLocalNic = true;
        }
      sendNotices(i);
    }
    bump();
  }

  // Deletes the INCOMPLETE and FAILED neighbour (ARP/ND) entries of NIC i (returns how many), so the next packet
  // to a peer resolves at once (a new entry sends its first solicitation immediately). Needs
  // CAP_NET_ADMIN; without it this is a no-op (logged once) and recovery after a repair waits
  // for the kernel's retransmission timer. Runs on the health thread; blocks at most ~100 ms.
  bool neighFlushDenied = false;
  int flushFailedNeighbours(int i) {
    if (neighFlushDenied || nicState[i].ifindex == 0) return 0;  // 0 would name every interface
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) return 0;
    timeval tv{0, tuning::kNeighFlushTimeoutUs};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct {
      nlmsghdr h;
      ndmsg n;
    } req{};
    req.h.nlmsg_len = sizeof(req);
    req.h.nlmsg_type = RTM_GETNEIGH;
    req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.h.nlmsg_seq = 1;
    req.n.ndm_family = AF_UNSPEC;
    req.n.ndm_ifindex = nicState[i].ifindex;
    std::vector<std::vector<uint8_t>> dels;  // RTM_DELNEIGH requests built from the dump
    if (send(fd, &req, sizeof(req), 0) == (ssize_t)sizeof(req)) {
      char* buf = nlBuf;
      bool done = false;
      while (!done) {
        ssize_t n = recv(fd, buf, sizeof(nlBuf), 0);
        if (n <= 0) break;
        for (nlmsghdr* h = (nlmsghdr*)buf; NLMSG_OK(h, (unsigned)n); h = NLMSG_NEXT(h, n)) {
          if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
            done = true;
            break;
          }
          if (h->nlmsg_type != RTM_NEWNEIGH) continue;
          auto* nd = (ndmsg*)NLMSG_DATA(h);
          if (nd->ndm_ifindex != nicState[i].ifindex || !(nd->ndm_state & (NUD_INCOMPLETE | NUD_FAILED))) continue;
          int alen = (int)h->nlmsg_len - (int)NLMSG_LENGTH(sizeof(ndmsg));
          for (rtattr* a = (rtattr*)((char*)nd + NLMSG_ALIGN(sizeof(ndmsg))); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
            if (a->rta_type != NDA_DST) continue;
            std::vector<uint8_t> d(NLMSG_SPACE(sizeof(ndmsg)) + RTA_SPACE(RTA_PAYLOAD(a)), 0);
            auto* dh = (nlmsghdr*)d.data();
            dh->nlmsg_len = (uint32_t)d.size();
            dh->nlmsg_type = RTM_DELNEIGH;
            dh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
            dh->nlmsg_seq = 2 + (uint32_t)dels.size();
            auto* dn = (ndmsg*)NLMSG_DATA(dh);
            dn->ndm_family = nd->ndm_family;
            dn->ndm_ifindex = nd->ndm_ifindex;
            auto* da = (rtattr*)(d.data() + NLMSG_SPACE(sizeof(ndmsg)));
            da->rta_type = NDA_DST;
            da->rta_len = (unsigned short)RTA_LENGTH(RTA_PAYLOAD(a));
            memcpy(RTA_DATA(da), RTA_DATA(a), RTA_PAYLOAD(a));
            dels.push_back(std::move(d));
          }
        }
      }
    }
    int deleted = 0;
    for (auto& d : dels) {
      if (send(fd, d.data(), d.size(), 0) != (ssize_t)d.size()) break;
      alignas(nlmsghdr) char ack[256];
      ssize_t n = recv(fd, ack, sizeof(ack), 0);
      if (n < (ssize_t)NLMSG_LENGTH(sizeof(nlmsgerr))) break;
      auto* h = (nlmsghdr*)ack;
      int e = h->nlmsg_type == NLMSG_ERROR ? -((nlmsgerr*)NLMSG_DATA(h))->error : 0;
      if (e == EPERM || e == EACCES) {
        neighFlushDenied = true;
        RO_INFO(RO_SUBSYS_NET, "railover: no CAP_NET_ADMIN: failed ARP/ND entries are not cleared when a NIC comes "
                "back; recovery may wait up to net.ipv4.neigh.<nic>.retrans_time_ms");
        break;
      }
      if (e == 0) deleted++;
    }
    ::close(fd);
    if (deleted)
      RO_INFO(RO_SUBSYS_NET, "railover: NIC %s back: cleared %d unresolved neighbour entr%s", nics[i].name.c_str(),
              deleted, deleted == 1 ? "y" : "ies");
    return deleted;
  }

  // A local NIC moved to a new address: re-open its probe socket and listener there and tell
  // every peer (over every NIC) where it went, so their reconnects and probes follow it.
  void onLocalAddrChange(int i, const sockaddr_storage& oldA, const sockaddr_storage& newA, socklen_t len, uint64_t now) {
    reopenSockets(i, newA, len);
    uint8_t buf[probe::kHeaderBytes + probe::kAddrChangeBytes];
    probe::AddrChange c;
    c.family = newA.ss_family == AF_INET ? 4 : 6;
    putAddr(c.oldAddr, oldA);
    putAddr(c.newAddr, newA);
    c.port = ports[i];
    probe::encodeAddrChange(c, buf);
    std::lock_guard<std::mutex> g(mu);
    for (Pair& p : live())
      if (p.used && nicState[p.nic].udp >= 0)
        sendto(nicState[p.nic].udp, buf, sizeof(buf), MSG_DONTWAIT, (sockaddr*)&p.remote, p.len);
    if (journal) journal->nic_addr_change(nics[i].name, addrToString(oldA), addrToString(newA));
    (void)now;
  }

  // Re-opens NIC i's probe socket on address `newA` (bound to the device that carries the NIC's
  // name now) and has the transport listen there again (the address-change hook).
  void reopenSockets(int i, const sockaddr_storage& newA, socklen_t len) {
    nicState[i].sockIfindex = nicState[i].ifindex;
    std::string err;
    int fd = udpOn(newA, len, ports[i], nics[i].name, &err);
    if (fd >= 0) {
      if (nicState[i].udp >= 0) {
        epoll_ctl(ep_, EPOLL_CTL_DEL, nicState[i].udp, nullptr);
        ::close(nicState[i].udp);
      }
      nicState[i].udp = fd;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = (uint32_t)i;
      epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
    } else {
      RO_WARN("railover: cannot re-open the probe socket of NIC %s on %s: %s", nics[i].name.c_str(),
              addrToString(newA).c_str(), err.c_str());
    }
    if (gAddrHook && notifyHooks_) gAddrHook(i, newA, len);  // a private monitor's NIC is not the runtime's
  }

  // Re-learns NIC i's address (lookupIfAddr by its name) after an address event or after its
  // name moved to another device; returns whether it has one. A new address is handled as a
  // move (onLocalAddrChange); the same address on a new device re-opens the sockets only.
  bool relearnAddr(int i, uint64_t now) {
    sockaddr_storage a;
    socklen_t l;
    bool has = lookupIfAddr(nics[i].name, cfg.family, &a, &l);
    if (!has) return false;
    socklen_t ol;
    sockaddr_storage old = nics[i].getAddr(&ol);
    if (!sameIp(old, a)) {
      RO_WARN("railover: NIC %s address changed %s -> %s; re-learned", nics[i].name.c_str(), addrToString(old).c_str(),
              addrToString(a).c_str());
      nics[i].setAddr(a, l);
      onLocalAddrChange(i, old, a, l, now);
    } else if (nicState[i].reopen) {
      reopenSockets(i, a, l);
    }
    nicState[i].reopen = false;
    return true;
  }

  // Bilateral detection: tell every peer, over our surviving NICs, that NIC `down` is gone.
  void sendNotices(int down) {
    socklen_t l;
    sockaddr_storage a = nics[down].getAddr(&l);
    uint8_t buf[probe::kHeaderBytes + probe::kNoticeBytes];
    probe::NicNotice notice;
    notice.family = a.ss_family == AF_INET ? 4 : 6;
    putAddr(notice.addr, a);
    probe::encodeNotice(notice, buf);
    for (Pair& p : live())
      if (p.used && p.nic != down && nicState[p.nic].up.load() && nicState[p.nic].udp >= 0)
        sendto(nicState[p.nic].udp, buf, sizeof(buf), MSG_DONTWAIT, (sockaddr*)&p.remote, p.len);
  }

  void sendProbe(Pair& p, bool big) {
    uint8_t* buf = probeBuf;
    health::Probe pr;
    pr.big = big;
    pr.padding = big ? health::bigProbePadding(nicState[p.nic].mtu, p.peerMtu, p.remote.ss_family == AF_INET6) : 0;
    pr.mtu = (uint16_t)std::min(nicState[p.nic].mtu, 65535);
    pr.id = ++probeSeq;
    pr.sentUs = nowUs();
    health::encodeProbe(pr, buf);
    sendto(nicState[p.nic].udp, buf, probe::kHeaderBytes + pr.padding, MSG_DONTWAIT, (sockaddr*)&p.remote, p.len);
    if (!p.up.load()) p.downProbes++;
  }

  void onUdp(int nic) {
    uint8_t* buf = udpBuf;
    while (true) {
      sockaddr_storage from{};
      socklen_t fl = sizeof(from);
      ssize_t n = recvfrom(nicState[nic].udp, buf, sizeof(udpBuf), MSG_DONTWAIT, (sockaddr*)&from, &fl);
      if (n < 0) return;
      probe::Datagram d;
      std::string err;
      if (!probe::decodeDatagram(buf, (size_t)n, &d, &err)) continue;
      uint64_t now = nowUs();
      if (d.kind == probe::Kind::kNotice) {
        sockaddr_storage gone;
        getAddr(d.notice.addr, d.notice.family, &gone);
        std::lock_guard<std::mutex> g(mu);
        for (Pair& p : live())
          if (p.used && sameIp(p.remote, gone)) {
            p.peerHardCause = "peer reported its NIC " + addrToString(gone) + " down";
            setPairDown(p, p.peerHardCause, now, true);
          }
        continue;
      }
      if (d.kind == probe::Kind::kAddrChange) {
        sockaddr_storage oldA, newA;
        getAddr(d.change.oldAddr, d.change.family, &oldA);
        getAddr(d.change.newAddr, d.change.family, &newA);
        uint16_t port = d.change.port;
        setPortOf(&oldA, port);
        setPortOf(&newA, port);
        std::lock_guard<std::mutex> g(mu);
        bool known = false;
        for (auto& r : remaps) {
          if (sameEndpoint(r.second, oldA)) r.second = newA;  // chains: a -> b -> c
          known |= sameEndpoint(r.first, oldA);
        }
        if (!known) remaps.push_back({oldA, newA});
        for (Pair& p : live())
          if (p.used && sameEndpoint(p.remote, oldA)) p.remote = newA;
        if (journal) journal->peer_addr_change(addrToString(oldA), addrToString(newA), port);
        RO_INFO(RO_SUBSYS_NET, "railover: peer NIC moved %s -> %s", addrToString(oldA).c_str(), addrToString(newA).c_str());
        bump();
        continue;
      }
      health::Probe pr;
      if (!health::decodeProbe(buf, (size_t)n, &pr)) continue;
      if (!pr.ack) {  // answer with the same size, so big probes test both directions
        health::answerProbe(buf, instanceId, (uint16_t)std::min(nicState[nic].mtu, 65535));
        sendto(nicState[nic].udp, buf, (size_t)n, MSG_DONTWAIT, (sockaddr*)&from, fl);
        // The peer probes us from that NIC again: if our pair to it is hard down (its NIC-down
        // notice) and its re-probes backed off (up to RAILOVER_PROBE_BACKOFF_MAX_MS), re-probe
        // at the next round, once per down episode. Its own NIC-up resets only its side;
        // without this, our verdict outlived its repair by up to the back-off, and a path it
        // reconnected meanwhile was failed here as a flap. Not for a soft down (size-dependent
        // or one-way loss: the peer's probes keep coming, and the back-off must hold), and the
        // walk only while some pair is hard down or awaiting its first answer after its local NIC's
        // return (hardDownSeen, refreshed every round).
        if (!hardDownSeen.load(std::memory_order_relaxed)) continue;
        std::lock_guard<std::mutex> g(mu);
        for (Pair& p : live())
          if (p.used && p.nic == nic && !p.up.load() && (p.hard.load() || p.awaitingAfterLocalNic) && !p.reprobedOnRequest &&
              p.probeGapMs > cfg.probeIntervalMs && sameIp(p.remote, from)) {
            p.nextProbeUs = 0, p.probeGapMs = cfg.probeIntervalMs;
            p.reprobedOnRequest = true;
          }
        continue;
      }
      std::lock_guard<std::mutex> g(mu);
      for (Pair& p : live()) {
        if (!p.used || p.nic != nic || !sameEndpoint(p.remote, from)) continue;
        uint64_t detectUs = (uint64_t)cfg.probeIntervalMs * cfg.probeMultiplier * 1000;
        if (p.lastAckUs && now > p.lastAckUs + detectUs / 2) p.wokeUs = now;  // this answer ended a silence
        p.lastAckUs = now;
        p.answeredUs.store(now, std::memory_order_release);
        if (pr.responder) p.peerId = pr.responder;
        if (pr.mtu) p.peerMtu = pr.mtu;
        if (pr.big) p.lastBigAckUs = now;
        uint64_t rtt = now > pr.sentUs ? now - pr.sentUs : 0;
        if (rtt <= detectUs / 2) {
          p.promptSentUs = std::max(p.promptSentUs, pr.sentUs);
        } else if (p.peerId) {
          uint64_t siblingPrompt = 0;
          for (Pair& o : live())
            if (&o != &p && o.used && o.peerId == p.peerId) siblingPrompt = std::max(siblingPrompt, o.promptSentUs);
          if (health::answerQueued(rtt, detectUs, pr.sentUs, siblingPrompt)) {
            uint64_t last = p.queuedUs.exchange(now, std::memory_order_acq_rel);
            if (journal && (!last || now - last > tuning::kQueuedEpisodeGapUs))
              journal->pair_queued(nics[p.nic].name, addrToString(p.remote), rtt);
          }
        }
        if (p.burstStartUs && pr.sentUs >= p.burstStartUs) {
          if (pr.big) p.burstBigAnswered++;
          else p.burstSmallAnswered++;
        }
        if (!p.up.load() && nicState[nic].up.load() &&
            now - p.downSinceUs > tuning::kPairUpAfterIntervals * cfg.probeIntervalMs * 1000) {
          setPairUp(p, now);
          // The peer answers again after a silence shared by all its rails (it was stopped,
          // or this host was): its other rails are back too, and their answers are only
          // waiting for our backed-off re-probes (up to RAILOVER_PROBE_BACKOFF_MAX_MS). Probe
          // them at the next round, so a comm active there does not see one rail up and its
          // own still down for up to a second.
          if (p.peerId)
            for (Pair& o : live())
              if (&o != &p && o.used && o.peerId == p.peerId && !o.up.load() && o.peerWideDown)
                o.nextProbeUs = 0, o.probeGapMs = cfg.probeIntervalMs, o.peerWideDown = false;
        }
      }
    }
  }

  // One probe round (every interval, and at once when a comm asks for a burst).
  void onTimer(uint64_t now) {
    std::lock_guard<std::mutex> g(mu);
    uint64_t interval = (uint64_t)cfg.probeIntervalMs * 1000;
    uint64_t detect = interval * cfg.probeMultiplier;
    // This thread's own lateness is not the network's: if the previous round was more than 2
    // intervals ago (descheduled on a busy host), no probes went out and no answers were read
    // meanwhile, so push every deadline back by the gap.
    uint64_t credit = lastRoundUs ? health::lateWakeCreditUs(now - lastRoundUs, interval) : 0;
    lastRoundUs = now;
    if (credit) {
      lateRounds++;
      lateMaxUs = std::max(lateMaxUs, credit);
      for (Pair& p : live())
        if (p.used && p.lastAckUs) {
          p.lastAckUs = std::min(now, p.lastAckUs + credit);
          if (p.answeredUs.load(std::memory_order_relaxed)) p.answeredUs.store(p.lastAckUs, std::memory_order_release);
        }
      if (credit > detect / 2 && now - lastLateLogUs > tuning::kHealthLateLogIntervalUs) {
        lastLateLogUs = now;
        if (journal) journal->health_late(credit, lateRounds, lateMaxUs);
      }
    }
    bool anyHard = false;
    for (Pair& p : live()) {
      anyHard |= p.used && !p.up.load() && (p.hard.load() || p.awaitingAfterLocalNic);
      if (!p.used || !nicState[p.nic].up.load()) continue;
      bool burst = p.burst.exchange(false);
      if (burst && !(p.burstUntilUs && now < p.burstUntilUs)) {
        p.burstUntilUs = now + detect;
        p.lastBigAckUs = 0;
        p.burstStartUs = now;
        p.burstBigSent = p.burstBigAnswered = p.burstSmallAnswered = 0;
        p.burstOn.store(true, std::memory_order_relaxed);
      }
      // During a burst every interval carries a small and a full-size probe, so lost big ones
      // with answered small ones show size-dependent loss. Re-probes of a down pair are always
      // full size (no failback while big frames still drop) and back off: interval doubling
      // to RAILOVER_PROBE_BACKOFF_MAX_MS, so an outage of minutes costs a few probes a second.
      bool inBurst = p.burstUntilUs && now < p.burstUntilUs;
      if (!p.up.load()) {
        p.burstUntilUs = 0, p.burstStartUs = 0;  // a down pair is probed full size anyway
        p.burstOn.store(false, std::memory_order_relaxed);
        if (now >= p.nextProbeUs) {
          sendProbe(p, true);
          p.nextProbeUs = now + (uint64_t)p.probeGapMs * 1000;
          p.probeGapMs = health::nextProbeGapMs(p.probeGapMs, cfg.probeIntervalMs, cfg.probeBackoffMaxMs);
        }
        continue;
      }
      if (now < p.nextRoundUs && !inBurst) continue;  // a burst's extra round: only bursting pairs
      p.nextRoundUs = now + interval / 2;
      sendProbe(p, false);
      if (inBurst) sendProbe(p, true), p.burstBigSent++;
      if (!p.lastAckUs) p.lastAckUs = now;  // grace for a new pair
      uint64_t age = p.lastAckUs >= now ? 0 : now - p.lastAckUs;  // acks are stamped after `now` was read
      if (age > detect) {
        // Every other rail to the same peer process silent too: that peer (or this host) is
        // not running its probe thread, not a network fault. Hold, up to peerWideHoldUs.
        int sib = 0, sibSilent = 0;
        const Pair* answering = nullptr;  // the first sibling that is not silent
        if (p.peerId)
          for (Pair& o : live()) {
            if (&o == &p || !o.used || o.peerId != p.peerId || !nicState[o.nic].up.load()) continue;
            sib++;
            bool silent = !o.lastAckUs ||
                          health::siblingSilent(o.up.load(), now - std::min(now, o.lastAckUs),
                                                o.wokeUs ? now - std::min(now, o.wokeUs) : UINT64_MAX, detect);
            sibSilent += silent;
            if (!silent && !answering) answering = &o;
          }
        uint64_t queued = p.queuedUs.load(std::memory_order_relaxed);
        uint64_t sinceQueued = queued ? now - std::min(now, queued) : UINT64_MAX;
        if (health::holdForQueue(age, detect, sinceQueued, tuning::kQueuedMemoryUs)) {
          p.queueHeld = true;
          continue;
        }
        if (health::holdForPeerWideSilence(age, detect, sib, sibSilent)) {
          if (!p.silenceHeld) {
            p.silenceHeld = true;
            p.silenceHeldSinceUs = now;
            if (journal) journal->peer_silence(nics[p.nic].name, addrToString(p.remote), (uint64_t)sib + 1, age);
          }
          continue;
        }
        // Every rail to the peer silent at the verdict (whichever hold ran first: a rail held
        // as congestion is also the one a stopped peer leaves with queued probes): when one of
        // them answers again, this one is re-probed at once (onUdp). A silence held as the
        // peer's that ends otherwise, with this rail still silent, is judged as this rail's
        // own timeout, and its cause says what ended the hold (heldSilenceEnd).
        bool everyRailSilent = sib > 0 && sibSilent == sib;
        std::string held = !p.silenceHeld ? std::string() : heldSilenceEnd(p, everyRailSilent, answering);
        setPairDown(p, "probe timeout: no answer for " + std::to_string(age / 1000) + " ms" + held +
                           (p.queueHeld ? " (held as congestion: the rail's answers were queueing)" : ""), now);
        p.peerWideDown = everyRailSilent;
        p.silenceHeld = false;
        p.queueHeld = false;
        continue;
      }
      p.silenceHeld = false;
      p.queueHeld = false;
      if (p.burstUntilUs && now >= p.burstUntilUs) {
        bool dataAcked = p.dataAckedUs.load(std::memory_order_acquire) >= p.burstStartUs;
        if (health::sizeDependentLoss(p.burstBigSent, p.burstBigAnswered, p.burstSmallAnswered, dataAcked,
                                      (int)cfg.probeMultiplier - 1)) {
          RO_WARN("railover: NIC pair %s -> %s passes small probes but loses full-size ones: size-dependent loss "
                  "(MTU mismatch?)", nics[p.nic].name.c_str(), addrToString(p.remote).c_str());
          setPairDown(p, "size-dependent loss (full-size probes lost, small ones pass)", now);
        } else if (p.burstBigAnswered == 0 && p.burstBigSent > 0) {
          if (journal)
            journal->size_loss_ignored(nics[p.nic].name, addrToString(p.remote), p.burstBigSent, p.burstSmallAnswered,
                                       dataAcked);
        }
        p.burstUntilUs = 0;
        p.burstStartUs = 0;
        p.burstOn.store(false, std::memory_order_relaxed);
      }
    }
    hardDownSeen.store(anyHard, std::memory_order_relaxed);
  }

  // The cause's note for a probe timeout held as the peer's silence and judged now, with `p`
  // still silent (called under mu). What ended the hold, as the verdict's round saw it:
  // * every sibling still silent (`everyRailSilent`): the hold's limit (peerWideHoldUs) ran out;
  // * a sibling answering again (`answering`; it answered for a detection time after its
  //   own silence, health::siblingSilent): the peer runs, so this rail's silence is its own;
  // * no sibling left to compare with: every other rail to the peer went down with its local
  //   NIC on this host (carrier, admin, address or transport port down) during the hold; such a
  //   rail is not compared (its silence says nothing about the peer), and neither did it answer;
  // * anything else that leaves no sibling: the other rails were closed (the comms using them
  //   ended), or another process answers on them now.
  std::string heldSilenceEnd(const Pair& p, bool everyRailSilent, const Pair* answering) const {
    if (everyRailSilent) return " (every rail to this peer silent)";
    if (answering)
      return " (held as the peer's silence until another rail to it, " + nics[answering->nic].name + " -> " +
             addrToString(answering->remote) + ", answered again)";
    int rails = 0, downNics = 0;
    std::string names;
    bool nicSeen[kMaxNics] = {};
    for (int i = 0, h = hw.load(std::memory_order_relaxed); i < h; ++i) {
      const Pair& o = pairs[i];
      if (&o == &p || !o.used || o.peerId != p.peerId) continue;
      const NicState& st = nicState[o.nic];
      if (st.up.load() || st.downSinceUs < p.silenceHeldSinceUs) continue;
      rails++;
      if (nicSeen[o.nic]) continue;
      nicSeen[o.nic] = true;
      downNics++;
      names += (names.empty() ? "" : ", ") + nics[o.nic].name + " (" + st.downSignal + ")";
    }
    if (rails)
      return std::string(" (held as the peer's silence until ") + (rails == 1 ? "the other rail" : "the other rails") +
             " to it went down with " + (downNics == 1 ? "local NIC " : "local NICs ") + names + ")";
    return " (held as the peer's silence until no other rail to it was left to compare with)";
  }

  void onNetlink(uint64_t now) {
    alignas(nlmsghdr) char buf[16384];
    while (true) {
      ssize_t n = recv(nl, buf, sizeof(buf), MSG_DONTWAIT);
      if (n <= 0) return;
      for (nlmsghdr* h = (nlmsghdr*)buf; NLMSG_OK(h, (unsigned)n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == RTM_NEWLINK || h->nlmsg_type == RTM_DELLINK) {
          auto* ifi = (ifinfomsg*)NLMSG_DATA(h);
          std::string name;  // IFLA_IFNAME, "" when absent
          int alen = (int)h->nlmsg_len - (int)NLMSG_LENGTH(sizeof(ifinfomsg));
          uint32_t mtu = 0;  // IFLA_MTU, 0 when absent
          for (rtattr* a = IFLA_RTA(ifi); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
            if (a->rta_type == IFLA_IFNAME) name.assign((const char*)RTA_DATA(a), strnlen((const char*)RTA_DATA(a), RTA_PAYLOAD(a)));
            if (a->rta_type == IFLA_MTU && RTA_PAYLOAD(a) >= sizeof(uint32_t)) memcpy(&mtu, RTA_DATA(a), sizeof(mtu));
          }
          for (int i = 0; i < nNics; ++i) {
            NicState& st = nicState[i];
            bool newLink = h->nlmsg_type == RTM_NEWLINK;
            if (st.ifindex != ifi->ifi_index) {
              // A NIC is its name (what RAILOVER_IFNAMES selected and its sockets bind to): a
              // device registered again under it (driver reload, device reset) or renamed back
              // is the NIC, on a new ifindex. Its probe socket and listener are re-opened there.
              if (!newLink || name != nics[i].name) continue;
              RO_INFO(RO_SUBSYS_NET, "railover: NIC %s is interface %d now (was %d)", nics[i].name.c_str(),
                      ifi->ifi_index, st.ifindex);
              st.ifindex = ifi->ifi_index;
              st.reopen = st.sockIfindex != st.ifindex;  // renamed back: its sockets are still bound to it
              st.hasAddr = relearnAddr(i, now);
            } else if (newLink && !name.empty() && name != nics[i].name) {
              // Renamed: the device no longer carries the NIC's name, which its sockets bind to.
              st.ifindex = 0;
              setNic(i, false, st.hasAddr, "renamed", now);
              continue;
            }
            if (newLink && mtu) st.mtu = (int)std::min<uint32_t>(mtu, 65535);
            bool admin = ifi->ifi_flags & IFF_UP, running = ifi->ifi_flags & IFF_RUNNING;
            bool linkUp = newLink && admin && running;
            const char* sig = !newLink ? "link removed" : !admin ? "admin down" : !running ? "carrier lost" : "link up";
            if (!newLink) st.ifindex = 0;
            setNic(i, linkUp, st.hasAddr, sig, now);
          }
        } else if (h->nlmsg_type == RTM_NEWADDR || h->nlmsg_type == RTM_DELADDR) {
          auto* ifa = (ifaddrmsg*)NLMSG_DATA(h);
          for (int i = 0; i < nNics; ++i) {
            if (nicState[i].ifindex != (int)ifa->ifa_index) continue;
            bool has = relearnAddr(i, now);
            setNic(i, nicState[i].linkUp, has, has ? "address added" : "address removed", now);
          }
        }
      }
    }
  }

  bool nicUp(int nic) const override;
  int registerPair(int nic, const sockaddr_storage& remote, socklen_t len) override;
  void unregisterPair(int id) override;
  bool pairUp(int id) const override;
  bool pairHardDown(int id) const override;
  uint64_t pairHardDownSinceUs(int id) const override;
  // `stamp` (CLOCK_MONOTONIC µs, 0 = never) lies within the last `us` µs.
  static bool within(const std::atomic<uint64_t>& stamp, uint64_t us) {
    uint64_t last = stamp.load(std::memory_order_acquire), now = nowUs();
    return last && now - std::min(now, last) <= us;
  }
  bool pairAnsweredWithinUs(int id, uint64_t us) const override {
    return id < 0 || id >= kMaxPairs || within(pairs[id].answeredUs, us);
  }
  std::string pairDownCause(int id) const override;
  uint64_t repairedUs(int nic, int id) const override;
  uint64_t queuedUs(int id) const override {
    return id >= 0 && id < kMaxPairs ? pairs[id].queuedUs.load(std::memory_order_acquire) : 0;
  }
  void requestBurst(int id) override;
  bool burstActive(int id) const override;
  void noteDataAcked(int id) override;
  void noteDelivered(int id) override {
    if (id >= 0 && id < kMaxPairs) pairs[id].deliveredUs.store(nowUs(), std::memory_order_release);
  }
  bool pairDeliveredWithinUs(int id, uint64_t us) const override {
    return id >= 0 && id < kMaxPairs && within(pairs[id].deliveredUs, us);
  }
  std::string pairsJson() const override;
  void remapRemote(sockaddr_storage* remote) const override {
    std::lock_guard<std::mutex> g(mu);
    for (auto& r : remaps)
      if (sameEndpoint(r.first, *remote)) {
        *remote = r.second;
        return;
      }
  }

  int ep_ = -1;

  void run() {
    // Detection must not starve behind busy-polling progress threads: best effort, a higher
    // priority for this (mostly sleeping) thread; silently kept at normal without privilege.
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), tuning::kHelperThreadNice);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    ep_ = ep;
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (nl >= 0) {
      ev.data.u32 = 1000;
      epoll_ctl(ep, EPOLL_CTL_ADD, nl, &ev);
    }
    if (sigFd >= 0) {
      ev.data.u32 = 1001;
      epoll_ctl(ep, EPOLL_CTL_ADD, sigFd, &ev);
    }
    for (int i = 0; i < nNics; ++i)
      if (nicState[i].udp >= 0) {
        ev.data.u32 = (uint32_t)i;
        epoll_ctl(ep, EPOLL_CTL_ADD, nicState[i].udp, &ev);
      }
    epoll_event evs[32];
    uint64_t interval = (uint64_t)cfg.probeIntervalMs * 1000;
    nextProbeUs = nowUs() + interval;
    while (!stopping.load(std::memory_order_acquire)) {
      uint64_t now = nowUs();
      int wait = now >= nextProbeUs ? 0 : (int)((nextProbeUs - now + 999) / 1000);
      int n = epoll_wait(ep, evs, 32, wait);
      now = nowUs();
      for (int i = 0; i < n; ++i) {
        if (evs[i].data.u32 == 1000) onNetlink(now);
        else if (evs[i].data.u32 == 1001) onTransportSignals(now);
        else onUdp((int)evs[i].data.u32);
      }
      bool burstPending = false;
      for (Pair& p : live()) burstPending |= p.used && p.burst.load(std::memory_order_relaxed);
      if (now >= nextProbeUs || burstPending) {
        onTimer(now);
        if (now >= nextProbeUs) nextProbeUs = now + interval;
      }
    }
  }
};

// The first line of /sys/class/net/<name>/<file> ("" when it cannot be read).
std::string readSys(const std::string& name, const char* file) {
  FILE* f = fopen(("/sys/class/net/" + name + "/" + file).c_str(), "r");
  char b[32] = {};
  if (f) {
    if (!fgets(b, sizeof(b), f)) b[0] = 0;
    fclose(f);
  }
  std::string s(b);
  while (!s.empty() && (s.back() == '\n')) s.pop_back();
  return s;
}

Monitor* newMonitor(const Config& cfg, Nic* nics, int nNics, const uint16_t* ports, Journal* journal) {
  auto* m = new Monitor();
  m->cfg = cfg;
  m->journal = journal;
  m->nics = nics;
  m->nNics = std::min(nNics, kMaxNics);
  m->ports.assign(ports, ports + m->nNics);
  std::random_device rd;
  while (!m->instanceId) m->instanceId = ((uint64_t)rd() << 32) ^ rd() ^ (uint64_t)getpid();
  for (int i = 0; i < m->nNics; ++i) {
    socklen_t l;
    sockaddr_storage a = nics[i].getAddr(&l);
    std::string err;
    m->nicState[i].ifindex = m->nicState[i].sockIfindex = nics[i].ifindex;
    m->nicState[i].udp = udpOn(a, l, ports[i], nics[i].name, &err);
    if (m->nicState[i].udp < 0)
      RO_WARN("railover: no probe socket on NIC %s (%s); silent faults there are found by socket errors only",
              nics[i].name.c_str(), err.c_str());
    m->nicState[i].mtu = atoi(readSys(nics[i].name, "mtu").c_str());
    std::string oper = readSys(nics[i].name, "operstate");
    unsigned int flags = 0;
    bool linkUp = oper != "down" && oper != "lowerlayerdown" && oper != "notpresent";
    (void)flags;
    m->nicState[i].linkUp = linkUp;
    m->nicState[i].up.store(linkUp);
  }
  m->sigFd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  m->nl = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (m->nl >= 0) {
    sockaddr_nl sa{};
    sa.nl_family = AF_NETLINK;
    sa.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
    if (bind(m->nl, (sockaddr*)&sa, sizeof(sa)) != 0) {
      RO_WARN("railover: netlink bind failed (%s); local NIC events come from probes and socket errors only",
              strerror(errno));
      ::close(m->nl);
      m->nl = -1;
    }
  }
  return m;
}

}  // namespace

void Health::start(const Config& cfg, Nic* nics, int nNics, const uint16_t* ports, Journal* journal) {
  if (Health::get()) return;
  Monitor* m = newMonitor(cfg, nics, nNics, ports, journal);
  Health::install(m);
  std::thread([m] { m->run(); }).detach();
}

std::unique_ptr<Health> Health::startPrivate(const Config& cfg, Nic* nics, int nNics, const uint16_t* ports,
                                             Journal* journal) {
  Monitor* m = newMonitor(cfg, nics, nNics, ports, journal);
  m->notifyHooks_ = false;
  m->thread = std::thread([m] { m->run(); });
  return std::unique_ptr<Health>(m);
}


void Health::setAddrChangeHook(void (*hook)(int, const sockaddr_storage&, socklen_t)) { gAddrHook = hook; }

bool Monitor::nicUp(int nic) const {
  auto* m = this;
  return nic < 0 || nic >= m->nNics || m->nicState[nic].up.load(std::memory_order_acquire);
}

int Monitor::registerPair(int nic, const sockaddr_storage& remote, socklen_t len) {
  auto* m = this;
  std::lock_guard<std::mutex> g(m->mu);
  int freeSlot = -1;
  int h = m->hw.load();
  for (int i = 0; i < h; ++i) {
    Pair& p = m->pairs[i];
    if (p.used && p.nic == nic && sameEndpoint(p.remote, remote)) {
      p.refs++;
      return i;
    }
    if (!p.used && freeSlot < 0) freeSlot = i;
  }
  if (freeSlot < 0 && h < kMaxPairs) freeSlot = h;
  if (freeSlot < 0) return -1;  // table full: the path is then judged by socket errors only
  Pair& p = m->pairs[freeSlot];
  p.answeredUs.store(0);
  p.nic = nic, p.remote = remote, p.len = len, p.refs = 1, p.lastAckUs = 0, p.lastBigAckUs = 0, p.wokeUs = 0, p.promptSentUs = 0;
  p.queuedUs.store(0);
  p.queueHeld = false;
  p.burstUntilUs = 0, p.downSinceUs = 0, p.cause.clear();
  p.nextProbeUs = 0, p.probeGapMs = 0, p.downProbes = 0, p.nextRoundUs = 0, p.peerId = 0, p.peerMtu = 0, p.silenceHeld = false;
  p.silenceHeldSinceUs = 0;
  p.peerWideDown = false, p.reprobedOnRequest = false;
  p.hardByLocalNic = p.awaitingAfterLocalNic = false, p.peerHardCause.clear();
  p.burstBigSent = p.burstBigAnswered = p.burstSmallAnswered = 0, p.burstStartUs = 0;
  p.dataAckedUs.store(0);
  p.deliveredUs.store(0);
  p.burstOn.store(false);
  p.upSinceUs.store(0);
  p.up.store(true);
  p.hard.store(false);
  p.hardSinceUs.store(0);
  p.used = true;
  if (freeSlot >= m->hw.load()) m->hw.store(freeSlot + 1);
  return freeSlot;
}

void Monitor::unregisterPair(int id) {
  auto* m = this;
  if (id < 0 || id >= kMaxPairs) return;
  std::lock_guard<std::mutex> g(m->mu);
  Pair& p = m->pairs[id];
  if (p.used && --p.refs <= 0) p.used = false;
  int h = m->hw.load();
  while (h > 0 && !m->pairs[h - 1].used) --h;
  m->hw.store(h);
}

uint64_t Monitor::repairedUs(int nic, int id) const {
  uint64_t t = nic >= 0 && nic < nNics ? nicState[nic].upSinceUs.load(std::memory_order_acquire) : 0;
  if (id >= 0 && id < kMaxPairs) t = std::max(t, pairs[id].upSinceUs.load(std::memory_order_acquire));
  return t;
}

bool Monitor::pairUp(int id) const {
  auto* m = this;
  return id < 0 || id >= kMaxPairs || m->pairs[id].up.load(std::memory_order_acquire);
}


std::string Monitor::pairDownCause(int id) const {
  auto* m = const_cast<Monitor*>(this);
  if (id < 0 || id >= kMaxPairs) return "pair down";
  std::lock_guard<std::mutex> g(m->mu);
  return m->pairs[id].cause.empty() ? "pair down" : m->pairs[id].cause;
}

bool Monitor::burstActive(int id) const {
  if (id < 0 || id >= kMaxPairs) return false;
  const Pair& p = pairs[id];
  return p.burst.load(std::memory_order_relaxed) || p.burstOn.load(std::memory_order_relaxed);
}

void Monitor::noteDataAcked(int id) {
  if (id >= 0 && id < kMaxPairs) pairs[id].dataAckedUs.store(nowUs(), std::memory_order_release);
}

void Monitor::requestBurst(int id) {
  auto* m = this;
  if (id >= 0 && id < kMaxPairs) m->pairs[id].burst.store(true, std::memory_order_release);
}


uint64_t Monitor::pairHardDownSinceUs(int id) const {
  return pairHardDown(id) ? pairs[id].hardSinceUs.load(std::memory_order_acquire) : 0;
}

bool Monitor::pairHardDown(int id) const {
  auto* m = this;
  return id >= 0 && id < kMaxPairs && !m->pairs[id].up.load(std::memory_order_acquire) &&
         m->pairs[id].hard.load(std::memory_order_acquire);
}

std::string Monitor::pairsJson() const {
  auto* m = const_cast<Monitor*>(this);
  std::lock_guard<std::mutex> g(m->mu);
  std::string o = "[";
  for (Pair& p : m->live()) {
    if (!p.used) continue;
    if (o.size() > 1) o += ",";
    o += "{\"nic\":" + jsonStr(nics[p.nic].name) + ",\"peer\":" + jsonStr(addrToString(p.remote)) +
         ",\"up\":" + (p.up.load() ? "true" : "false") + ",\"cause\":" + jsonStr(p.up.load() ? "" : p.cause) + "}";
  }
  return o + "]";
}

}  // namespace railover
