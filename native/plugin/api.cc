#include "plugin/api.h"

#include <arpa/inet.h>
#include <sys/random.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "failover/link.h"
#include "plugin/runtime.h"

namespace railover {
namespace api {
namespace {

constexpr uint32_t kListenKind = 0x4c53544e;
constexpr uint32_t kCtxKind = 0x43545854;
// NCCL's handle size (NCCL_NET_HANDLE_MAXSIZE). Bytes [0, kTransportHandleBytes) are the
// transport's (Transport::encodeHandle); bytes [kStageOffset, 128) hold the
// connect-in-progress link between connect() calls.
constexpr size_t kHandleBytes = 128;
constexpr size_t kStageOffset = kTransportHandleBytes;
static_assert(kStageOffset + sizeof(void*) <= kHandleBytes, "the staged link fits in the handle");

struct ListenComm {
  uint32_t kind = kListenKind;
  Listener* listener = nullptr;
};

// An iflush in progress (Transport::flush), handed to NCCL as the flush request; test() frees
// it when done or failed. `kind` first, like SendReq/RecvReq.
constexpr uint32_t kKindFlush = 0x464c5348;
struct FlushReq {
  uint32_t kind = kKindFlush;
  std::vector<std::unique_ptr<FlushOp>> ops;  // one READ per NIC that wrote the receive
};

struct Ctx {
  uint32_t kind = kCtxKind;
  uint64_t commId = 0;
  bool ok = false;
  int trafficClass = -1;  // the init config's ncclNetCommConfig_t.trafficClass, -1 = none
};

Runtime& rt() { return Runtime::get(); }

// maxRecvs told to NCCL: RAILOVER_MAX_RECVS (default 1) where the transport can group, else 1.
// With maxRecvs > 1 NCCL shares one send comm and one recv comm among the connections of
// several local ranks (PXN, NCCL_NET_SHARED_COMMS) and groups their steps per irecv as they
// become ready, while each connection posts its sends on its own schedule. A send must then go
// to the oldest receive not yet filled, into a free buffer with its tag, and wait otherwise:
// sends a0, a1, b0 against receives {a0, b0}, {a1, b1} are placed a0, b0, a1. The RDMA
// transport tells the sender each posted receive (its advertisements) and the engine places
// sends so (SendLink::isend, NCCL's IB rule); TCP tells the sender nothing and offers 1, as
// NCCL's socket transport. The default stays 1 until a real PXN job has run over RDMA with 8
// (docs/DESIGN.md, "Grouped receives"). Per device: in the RDMA transport's mixed mode a NIC
// served over TCP offers 1.
int advertisedMaxRecvs(int dev) {
  return rt().transport->groupedReceivesOn(dev) ? static_cast<int>(std::min<uint32_t>(rt().cfg.maxRecvs, kMaxRecvs)) : 1;
}

bool checkDev(int dev) {
  if (!rt().initialized()) {
    RO_WARN("railover: called before a successful init");
    return false;
  }
  if (dev < 0 || dev >= (int)rt().nics.size()) {
    RO_WARN("railover: device %d does not exist (%zu devices)", dev, rt().nics.size());
    return false;
  }
  return true;
}

uint64_t randomSecret() {
  uint64_t s = 0;
  while (s == 0)
    if (getrandom(&s, sizeof(s), 0) != sizeof(s)) s = nowUs() * 0x9e3779b97f4a7c15ULL;
  return s;
}

// NIC `n`'s listener address (the transport's, port `port`), for the handle.
PeerHandle::Addr listenerAddr(const Nic& n, uint16_t port) {
  PeerHandle::Addr a;
  a.rail = n.rail;
  a.addr = n.getAddr(&a.len);
  if (a.addr.ss_family == AF_INET) ((sockaddr_in&)a.addr).sin_port = htons(port);
  else ((sockaddr_in6&)a.addr).sin6_port = htons(port);
  return a;
}

}  // namespace

ncclResult_t init(ncclDebugLogger_t logger) { return rt().init(logger); }

ncclResult_t devices(int* n) {
  *n = rt().initialized() ? (int)rt().nics.size() : 0;
  return ncclSuccess;
}

ncclResult_t getProperties(int dev, Props* p) {
  if (!checkDev(dev)) return ncclInvalidArgument;
  const Nic& n = rt().nics[dev];
  p->name = n.name.c_str();
  p->pciPath = n.pciPath.empty() ? nullptr : n.pciPath.c_str();
  p->guid = n.guid;
  p->ptrSupport = (int)rt().transport->ptrSupport(dev);
  p->speed = n.speedMbps;
  p->port = n.port;
  p->latency = 0;
  p->maxComms = n.maxComms;
  p->maxRecvs = advertisedMaxRecvs(dev);
  // The RDMA transport signals a message's size in 32 bits (immediate, DONE).
  uint64_t maxBytes = std::min<uint64_t>(RAILOVER_NCCL_MAX_NET_SIZE_BYTES, rt().transport->maxMessageBytes());
  p->maxP2pBytes = maxBytes;
  p->maxCollBytes = maxBytes;
  p->railId = (int16_t)n.rail;
  p->planeId = -1;
  return ncclSuccess;
}

ncclResult_t listen(int dev, void* handle, void** listenComm) {
  *listenComm = nullptr;
  if (!checkDev(dev)) return ncclInvalidArgument;
  // The handle: this NIC's listener first (the primary), then the other NICs' (standbys): those
  // of the same kind (Transport::nicTransport; all of them unless the RDMA transport serves some
  // NICs over TCP), and the handle names that kind.
  PeerHandle h;
  h.secret = randomSecret();
  h.transport = rt().transport->nicTransport(dev);
  h.primary = 0;
  h.addrs[0] = listenerAddr(rt().nics[dev], rt().ports[dev]);
  h.naddr = 1;
  for (auto& n : rt().nics) {
    if (n.index == dev || h.naddr >= kMaxPeerAddrs || h.transport != rt().transport->nicTransport(n.index)) continue;
    h.addrs[h.naddr++] = listenerAddr(n, rt().ports[n.index]);
  }
  std::string err;
  memset(handle, 0, kHandleBytes);
  if (!rt().transport->encodeHandle(h, handle, &err)) {
    RO_WARN("railover: listen on NIC %s: cannot make the handle: %s", rt().nics[dev].name.c_str(), err.c_str());
    return ncclSystemError;
  }
  auto* lc = new ListenComm();
  lc->listener = new Listener(rt().linkDeps(), h.secret, dev);
  *listenComm = lc;
  return ncclSuccess;
}

ncclResult_t connect(int dev, void* handle, void** sendComm, int trafficClass) {
  *sendComm = nullptr;
  if (!checkDev(dev)) return ncclInvalidArgument;
  uint8_t* hb = (uint8_t*)handle;
  SendLink* l = nullptr;
  memcpy(&l, hb + kStageOffset, sizeof(l));
  if (!l) {
    PeerHandle peer;
    std::string err;
    if (!rt().transport->decodeHandle(handle, kTransportHandleBytes, &peer, &err)) {
      RO_WARN("railover: connect on NIC %s: malformed handle: %s", rt().nics[dev].name.c_str(), err.c_str());
      return ncclInvalidArgument;
    }
    const char* mine = rt().transport->nicTransport(dev);
    if (peer.transport != mine) {
      // Ranks that disagree on RAILOVER_TRANSPORT, or on which NICs have RDMA behind them (auto
      // leaves NICs without a port out; rdma+tcp serves them over TCP, and NCCL may pair such a
      // NIC with a peer's RDMA NIC): no comm can carry this pair.
      std::string setting = transportName(rt().cfg.transport);
      std::string kinds = rt().transport->kinds();
      RO_WARN("railover: connect on NIC %s: the peer listens with the %s transport but this NIC is served by %s "
              "(RAILOVER_TRANSPORT=%s, this process runs %s): set RAILOVER_TRANSPORT to the same value on every rank, "
              "with RDMA behind the same NICs%s",
              rt().nics[dev].name.c_str(), peer.transport.c_str(), mine, setting.c_str(), kinds.c_str(),
              kinds == "rdma+tcp" ? "; with rdma+tcp NCCL may also pair a tcp NIC of one rank with an rdma NIC of "
                                    "another, which no comm can carry: auto leaves the tcp NICs out"
                                  : "");
      return ncclInvalidUsage;
    }
    l = SendLink::create(rt().linkDeps(), dev, peer, &err, trafficClass);
    if (trafficClass >= 0)
      RO_INFO(RO_SUBSYS_NET, "railover: connect on NIC %s: the comm's traffic class is %d (NCCL's comm config)%s",
              rt().nics[dev].name.c_str(), trafficClass,
              std::string(rt().transport->nicTransport(dev)) == "rdma" ? "" : ": not used by the tcp transport");
    memcpy(hb + kStageOffset, &l, sizeof(l));
  }
  std::string cause;
  int st = l->connectStep(&cause);
  if (st > 0) {
    memset(hb + kStageOffset, 0, sizeof(l));
    *sendComm = l;
    return ncclSuccess;
  }
  uint32_t limit = rt().cfg.fatalTimeoutS;
  if (st < 0 || (limit && nowUs() - l->createdUs > (uint64_t)limit * 1000000)) {
    std::string msg;
    if (st < 0) {
      msg = "railover: connect to peer " + l->peerName + " failed: " + cause;
    } else {
      std::string why;
      for (auto& p : l->paths)
        why += (why.empty() ? "" : "; ") + l->describe(p) + ": " + (p.lastError.empty() ? "still connecting" : p.lastError);
      msg = "railover: cannot connect to peer " + l->peerName + " within RAILOVER_FATAL_TIMEOUT=" + std::to_string(limit) +
            " s (" + why + ")";
    }
    memset(hb + kStageOffset, 0, sizeof(l));
    l->close();
    delete l;
    return fatalResult(msg, rt().cfg.abortOnFatal);
  }
  return ncclSuccess;
}

// Any number of connections per listen comm, like NCCL's socket and IB transports: each
// call returns the next connection that is ready (NULL = none yet, call again).
ncclResult_t accept(void* listenComm, void** recvComm) {
  *recvComm = nullptr;
  auto* lc = (ListenComm*)listenComm;
  if (!lc || lc->kind != kListenKind) {  // NCCL's plugin contract: the caller's misuse is an internal error
    RO_WARN("railover: accept called with %p, which is not an open railover listen comm", listenComm);
    return ncclInternalError;
  }
  *recvComm = lc->listener->accept();
  return ncclSuccess;
}

// The local NIC of the send or recv comm NCCL registers a buffer for (Link is the first base of
// both); -1 without one.
static int commNic(void* comm) { return comm ? static_cast<Link*>(comm)->dev() : -1; }
// The transport that registers for that NIC's comms, as the WARNs name it ("tcp" for a NIC the
// RDMA transport serves over TCP).
static const char* regTransport(int nic) { return nic >= 0 ? rt().transport->nicTransport(nic) : rt().transport->name(); }

ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  *mhandle = nullptr;
  if (!rt().initialized()) {
    RO_WARN("railover: regMr called before a successful init");
    return ncclInternalError;
  }
  if (type != RAILOVER_NCCL_PTR_HOST && type != RAILOVER_NCCL_PTR_CUDA) {
    RO_WARN("railover: regMr of memory type %d (NCCL_PTR_HOST 1 or NCCL_PTR_CUDA 2 expected)", type);
    return ncclInternalError;
  }
  std::string err;
  int nic = commNic(comm);
  *mhandle = rt().transport->regMrOn(nic, data, size, type, &err);
  if (!*mhandle) {
    RO_WARN("railover: cannot register %zu bytes of %s memory at %p with the %s transport: %s", size,
            type == RAILOVER_NCCL_PTR_CUDA ? "GPU" : "host", data, regTransport(nic), err.c_str());
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  *mhandle = nullptr;
  if (!rt().initialized()) {
    RO_WARN("railover: regMrDmaBuf called before a successful init");
    return ncclInternalError;
  }
  if (fd < 0) {
    RO_WARN("railover: regMrDmaBuf with file descriptor %d", fd);
    return ncclInvalidArgument;
  }
  (void)type;  // a dmabuf is GPU memory for NCCL (type NCCL_PTR_CUDA); the fd says what it is
  std::string err;
  int nic = commNic(comm);
  *mhandle = rt().transport->regMrDmaBufOn(nic, data, size, offset, fd, &err);
  if (!*mhandle) {
    RO_WARN("railover: cannot register dmabuf %d (%zu bytes at offset %llu, %p) with the %s transport: %s", fd, size,
            (unsigned long long)offset, data, regTransport(nic), err.c_str());
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t deregMr(void* comm, void* mhandle) {
  if (!mhandle || !rt().initialized()) return ncclSuccess;
  if (!comm) {
    rt().transport->deregMr(mhandle);
    return ncclSuccess;
  }
  // `comm` is the send or recv comm regMr was called with (Link is the first base of both).
  // The messages still on the buffer forget it under the comm's mutex, and the comm stops if
  // there were any (a teardown or abort): after that no progress call, NCCL's or the
  // sweeper's, reads the registration, so it is released without the mutex (releasing it may
  // take long: a large GPU registration on every HCA, or an HCA being re-opened; NCCL's
  // progress thread may be testing this comm meanwhile, ncclCommDeregister).
  Link* link = static_cast<Link*>(comm);
  {
    std::lock_guard<std::mutex> g(link->mu);
    link->forgetRegistration(mhandle);
  }
  rt().transport->deregMr(mhandle);
  return ncclSuccess;
}

ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  return ((SendLink*)sendComm)->isend(data, size, tag, request, mhandle);
}

ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags, void** mhandles, void** request) {
  *request = nullptr;
  auto* link = (RecvLink*)recvComm;
  int dev = link ? link->dev() : 0;
  int maxRecvs = advertisedMaxRecvs(dev);
  if (n < 1 || n > maxRecvs) {  // NCCL's plugin contract: the caller's misuse is an internal error
    RO_WARN("railover: grouped receive of %d buffers asked; maxRecvs is %d (%s transport)", n, maxRecvs,
            rt().transport->nicTransport(dev));
    return ncclInternalError;
  }
  uint64_t caps[kMaxRecvs];
  for (int i = 0; i < n; ++i) caps[i] = sizes[i];
  return ((RecvLink*)recvComm)->irecv(n, data, caps, tags, request, mhandles);
}

ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  *request = nullptr;  // NULL: nothing to flush (NCCL takes it as done)
  auto* link = (RecvLink*)recvComm;
  if (!link || n < 1 || n > kMaxRecvs) {
    RO_WARN("railover: iflush of %d buffers on comm %p (1..%d expected)", n, recvComm, kMaxRecvs);
    return ncclInternalError;
  }
  // As NCCL's IB transport: a READ of the last buffer that received bytes, through every NIC
  // the receive's data came on (the paths that completed its messages: one, unless a grouped
  // receive failed over midway; after a failover the resend rewrote every byte of each message
  // through the new NIC, see docs/DESIGN.md "GPUDirect"), as NCCL does for each device of a
  // merged NIC.
  int last = -1;
  for (int i = 0; i < n; ++i)
    if (sizes[i] > 0) last = i;
  if (last < 0) return ncclSuccess;
  uint64_t nics;
  {
    std::lock_guard<std::mutex> g(link->mu);
    nics = link->flushNics(data[last]);
  }
  std::unique_ptr<FlushReq> r(new FlushReq());
  for (int nic = 0; nic < kMaxFlushNics && nic < (int)rt().nics.size(); ++nic) {
    if (!(nics >> nic & 1)) continue;
    std::string err;
    std::unique_ptr<FlushOp> op = rt().transport->flush(nic, data[last], mhandles ? mhandles[last] : nullptr, &err);
    if (op) {
      r->ops.push_back(std::move(op));
    } else if (!err.empty()) {
      RO_WARN("railover: iflush on NIC %s: %s", rt().nics[nic].name.c_str(), err.c_str());
      return ncclSystemError;
    }
  }
  if (r->ops.empty()) return ncclSuccess;  // nothing to flush (TCP, an empty registration)
  *request = r.release();
  return ncclSuccess;
}

ncclResult_t test(void* request, int* done, int* sizes) {
  *done = 0;
  if (!request) {
    RO_WARN("railover: test called with a NULL request");
    return ncclInternalError;
  }
  uint32_t kind = *(uint32_t*)request;
  if (kind == kKindSend) {
    auto* r = (SendReq*)request;
    return ((SendLink*)r->link)->test(r, done, sizes);
  }
  if (kind == kKindRecv) {
    auto* r = (RecvReq*)request;
    return ((RecvLink*)r->link)->test(r, done, sizes);
  }
  if (kind == kKindFlush) {
    auto* r = (FlushReq*)request;
    std::string err;
    int st = 1;  // done when every READ is; failed as soon as one failed
    for (auto& op : r->ops) {
      int s = op ? op->test(&err) : 1;
      if (s < 0) {
        st = -1;
        break;
      }
      if (s > 0) op.reset();  // done: not tested again
      else st = 0;
    }
    if (st == 0) return ncclSuccess;
    delete r;  // done or failed: NCCL tests a flush request no more
    if (st < 0) {
      RO_WARN("railover: iflush: %s", err.c_str());
      return ncclSystemError;
    }
    *done = 1;
    return ncclSuccess;
  }
  RO_WARN("railover: test called with %p, which is not a pending railover request", request);
  return ncclInternalError;  // NCCL's plugin contract: the caller's misuse is an internal error
}

ncclResult_t closeSend(void* sendComm) {
  if (!sendComm) return ncclSuccess;
  auto* l = (SendLink*)sendComm;
  l->close();
  delete l;
  return ncclSuccess;
}

ncclResult_t closeRecv(void* recvComm) {
  if (!recvComm) return ncclSuccess;
  auto* l = (RecvLink*)recvComm;
  l->close();
  delete l;
  return ncclSuccess;
}

ncclResult_t closeListen(void* listenComm) {
  auto* lc = (ListenComm*)listenComm;
  if (!lc) return ncclSuccess;
  if (lc->kind != kListenKind) {
    RO_WARN("railover: closeListen called with %p, which is not an open railover listen comm", listenComm);
    return ncclInternalError;
  }
  lc->listener->close();
  delete lc->listener;
  lc->kind = 0;
  delete lc;
  return ncclSuccess;
}

ncclResult_t initCtx(void** ctx, uint64_t commId, ncclDebugLogger_t logger, int trafficClass) {
  ncclResult_t r = init(logger);
  if (r != ncclSuccess) {  // NCCL drops a plugin whose init failed and never finalizes it: no context
    *ctx = nullptr;
    return r;
  }
  auto* c = new Ctx();
  c->commId = commId;
  c->ok = true;
  c->trafficClass = trafficClass;
  rt().refs.fetch_add(1);
  *ctx = c;
  return r;
}

int ctxTrafficClass(void* ctx) {
  auto* c = (Ctx*)ctx;
  return c && c->kind == kCtxKind ? c->trafficClass : -1;
}

ncclResult_t finalizeCtx(void* ctx) {
  auto* c = (Ctx*)ctx;
  if (!c) return ncclSuccess;
  if (c->kind != kCtxKind) {
    RO_WARN("railover: finalize called with an unknown context");
    return ncclInvalidArgument;
  }
  if (c->ok) rt().refs.fetch_sub(1);
  c->kind = 0;
  delete c;
  return ncclSuccess;
}

}  // namespace api
}  // namespace railover
