// The fake verbs provider (see fake_verbs.h). Defines the libibverbs entry points the verbs layer
// uses; the test binary is linked without libibverbs.
#include "fake_verbs.h"

#include <arpa/inet.h>
#include <endian.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <condition_variable>
#include <mutex>
#include <atomic>
#include <memory>
#include <thread>

#include "transport/verbs/verbs_api.h"

namespace {

// Whether the table resolves ibv_reg_mr_iova2 (fake::setRegMrIova2).
std::atomic<bool> g_iova2{true};
void* fakeSym(const char* name) {
  if (!g_iova2.load() && std::strcmp(name, "ibv_reg_mr_iova2") == 0) return nullptr;
  return dlsym(RTLD_DEFAULT, name);
}

// The layer reaches libibverbs through dlsym: point it at this binary's definitions below.
class FakeVerbsEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    std::string err;
    ASSERT_TRUE(railover::verbs::loadVerbsApiWith(fakeSym, &err)) << err;
  }
};
::testing::Environment* const g_env = ::testing::AddGlobalTestEnvironment(new FakeVerbsEnv);

struct FakeCq {
  ibv_cq cq;  // first: the layer sees &cq
  std::deque<ibv_wc> wcs;
  uint64_t polls = 0;  // ibv_poll_cq calls
};

struct FakeRecv {
  uint64_t wrId;
  uint64_t addr;
  uint32_t len;
};

struct FakeQp {
  ibv_qp qp;  // first
  std::vector<fake::PostedSend> sends;
  std::deque<FakeRecv> recvs;
};

// The fake is called from several threads, as real libibverbs is: the test thread, the
// transport's port watch (async events, port states) and its worker (QP and flush-QP
// rebuilds create, modify and destroy QPs while the test thread polls and destroys others).
// Every entry point that touches the shared World, a CQ or a QP's queues holds worldMu;
// recursive because some entry points call others (reg_dmabuf_mr -> reg_mr).
std::recursive_mutex worldMu;
using WorldLock = std::lock_guard<std::recursive_mutex>;

struct World {
  ibv_device devs[2];
  ibv_device* list[3];
  std::map<ibv_context*, std::deque<ibv_async_event>> async;
  std::map<std::pair<std::string, int>, ibv_port_state> portState;  // default ACTIVE
  std::map<std::pair<std::string, int>, uint16_t> portLid;          // default 0
  std::map<std::pair<std::string, int>, std::pair<uint8_t, uint8_t>> portRate;  // default (0, 0)
  std::map<std::pair<std::string, int>, uint8_t> linkLayer;  // default Ethernet
  std::map<std::string, std::pair<uint64_t, int>> devAttrs;         // sys_image_guid, max_qp
  uint32_t nextQpn = 100, nextKey = 1000;
  std::vector<std::thread::id> qpCreators;  // the thread of every ibv_create_qp, in order
  std::vector<std::thread::id> qpDestroyers;  // the thread of every ibv_destroy_qp that got past the gate
  std::vector<std::thread::id> accessModifiers;  // the thread of every access-only ibv_modify_qp
  bool holdFlushes = false;
  int failModify = 0;
  ibv_qp* failModifyQp = nullptr;  // nullptr: any QP
  int failDestroy = 0, failDestroyTimes = 0;
  ibv_qp* failDestroyQp = nullptr;
  std::map<std::pair<std::string, int>, std::vector<ibv_gid_entry>> gids;
  std::map<std::pair<std::string, int>, std::vector<uint16_t>> pkeys;
  std::map<ibv_qp*, int> qpPkeyIndex;
  std::map<ibv_qp*, std::pair<int, int>> qpQos;  // (GRH traffic class, SL) given at RTR (IBV_QP_AV)
  std::map<ibv_qp*, unsigned> qpAccess;  // qp_access_flags set at INIT
  std::map<std::string, fake::QpAccess> accessMode;  // per HCA; default kEnforced
  std::map<ibv_qp*, fake::QpPath> qpPath;  // address vector (RTR) and retry settings (RTS)
  std::set<ibv_qp*> liveQps;               // created and not destroyed
  struct Mr {
    uint64_t addr, len;
    int access;
    ibv_context* ctx;
    const char* call;  // the registering call
  };
  std::map<uint32_t, ibv_context*> lkeyCtx;   // lkey -> the context (opening) its MR is on
  std::set<std::string> absent;               // devices ibv_get_device_list does not list
  std::map<ibv_context*, std::string> opened; // open contexts and their device
  std::set<ibv_context*> dead;                // contexts whose device reported DEVICE_FATAL
  int listCalls = 0;
  std::map<uint32_t, Mr> mrs;  // by rkey
  bool dmabuf = true;
  int dmabufRegs = 0;
  std::set<std::string> refuseRo;  // devices whose registrations refuse IBV_ACCESS_RELAXED_ORDERING
  int roRefusals = 0;
  World() {
    std::memset(devs, 0, sizeof devs);
    std::strcpy(devs[0].name, "fake0");
    std::strcpy(devs[1].name, "fake1");
    list[0] = &devs[0];
    list[1] = &devs[1];
    list[2] = nullptr;
  }
};
std::unique_ptr<World> g;

// The blocking gates of the calls below (blockErrTransitions, blockQpCreation, blockQpDestroy,
// blockAccessModify, blockMrRegistration): a caller that finds its gate closed waits there,
// outside worldMu, so every other thread goes on. One mutex and condition variable for all.
std::mutex gateMu;
std::condition_variable gateCv;
struct Gate {
  bool closed = false;
  int waiting = 0;  // callers held at the gate now
  void set(bool close) {
    {
      std::lock_guard<std::mutex> l(gateMu);
      closed = close;
    }
    gateCv.notify_all();
  }
  int held() {
    std::lock_guard<std::mutex> l(gateMu);
    return waiting;
  }
  // Returns once the gate is open (at once when it is).
  void pass() {
    std::unique_lock<std::mutex> gl(gateMu);
    ++waiting;
    gateCv.notify_all();
    gateCv.wait(gl, [this] { return !closed; });
    --waiting;
  }
};
Gate errGate;      // a modify to ERR
Gate createGate;   // ibv_create_qp
Gate destroyGate;  // ibv_destroy_qp
Gate accessGate;   // a modify of the access flags alone (RTS -> RTS)
Gate regGate;      // ibv_reg_mr and ibv_reg_mr_iova2
World& w() {
  if (!g) g = std::make_unique<World>();
  return *g;
}

// How the QP's HCA treats its access flags (fake::setQpAccess), and the flags its responder
// acts on: an HCA that ignores them takes WRITEs as if IBV_ACCESS_REMOTE_WRITE were set.
fake::QpAccess accessMode(ibv_qp* qp) {
  auto m = w().accessMode.find(qp->context->device->name);
  return m == w().accessMode.end() ? fake::QpAccess::kEnforced : m->second;
}
unsigned effectiveAccess(ibv_qp* qp) {
  unsigned a = w().qpAccess[qp];
  return accessMode(qp) == fake::QpAccess::kIgnoredReported ? a | IBV_ACCESS_REMOTE_WRITE : a;
}

FakeCq* fcq(ibv_cq* c) { return reinterpret_cast<FakeCq*>(c); }
FakeQp* fqp(ibv_qp* q) { return reinterpret_cast<FakeQp*>(q); }

void pushWc(ibv_cq* cq, uint64_t wrId, ibv_wc_status st, ibv_wc_opcode op, uint32_t len = 0, uint32_t immBe = 0,
            ibv_qp* qp = nullptr) {
  ibv_wc c{};
  c.wr_id = wrId;
  c.status = st;
  c.opcode = op;
  c.byte_len = len;
  c.imm_data = immBe;
  c.qp_num = qp ? qp->qp_num : 0;
  fcq(cq)->wcs.push_back(c);
}

void flushAll(FakeQp* q) {
  for (auto& s : q->sends) pushWc(q->qp.send_cq, s.wrId, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  q->sends.clear();
  for (auto& r : q->recvs) pushWc(q->qp.recv_cq, r.wrId, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
  q->recvs.clear();
}

// A request the RC responder refuses (rxe_resp.c: "RC Only - Class C", do_class_ac_error): it
// NAKs it and moves its own QP to ERR, so its posted receives (and sends) flush as a QP in ERR
// does; the requester's WR completes with `status` (the NAK's: REM_INV_REQ_ERR for an operation
// the QP's access flags do not enable, REM_ACCESS_ERR for an R_Key violation) and the rest of
// its send queue flushes (rxe_comp.c, COMPST_ERROR). rxe raises no async event for either QP.
void responderError(ibv_qp* from, ibv_qp* to, ibv_wc_status status) {
  if (to != from) {  // a QP connected to itself (the flush QP) goes to ERR below anyway
    to->state = IBV_QPS_ERR;
    if (!w().holdFlushes) flushAll(fqp(to));
  }
  fake::fail(from, status);
}

int opPollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  WorldLock l(worldMu);
  fcq(cq)->polls++;
  auto& d = fcq(cq)->wcs;
  int k = 0;
  while (k < n && !d.empty()) {
    wc[k++] = d.front();
    d.pop_front();
  }
  return k;
}

int opNotify(ibv_cq*, int) { return 0; }

int opPostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  WorldLock l(worldMu);
  FakeQp* q = fqp(qp);
  for (; wr; wr = wr->next) {
    if (qp->state != IBV_QPS_RTS) {
      *bad = wr;
      return EINVAL;
    }
    fake::PostedSend s;
    s.wrId = wr->wr_id;
    s.opcode = wr->opcode;
    for (int i = 0; i < wr->num_sge; ++i) {
      auto* p = reinterpret_cast<const uint8_t*>(wr->sg_list[i].addr);
      s.data.insert(s.data.end(), p, p + wr->sg_list[i].length);
    }
    s.remoteAddr = wr->wr.rdma.remote_addr;
    s.rkey = wr->wr.rdma.rkey;
    s.immBe = wr->imm_data;
    bool bad = false;
    for (int i = 0; i < wr->num_sge; ++i) {
      auto k = w().lkeyCtx.find(wr->sg_list[i].lkey);
      if (k != w().lkeyCtx.end() && k->second != qp->context) bad = true;  // unknown keys: tests' own
    }
    if (wr->opcode == IBV_WR_RDMA_READ) {
      s.data.clear();  // a READ carries nothing out
      s.localAddr = wr->num_sge ? wr->sg_list[0].addr : 0;
      s.localLen = wr->num_sge ? wr->sg_list[0].length : 0;
    }
    s.badLkey = bad;
    q->sends.push_back(std::move(s));
  }
  return 0;
}

int opPostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  WorldLock l(worldMu);
  FakeQp* q = fqp(qp);
  for (; wr; wr = wr->next) {
    if (qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_ERR) {
      *bad = wr;
      return EINVAL;
    }
    q->recvs.push_back({wr->wr_id, wr->num_sge ? wr->sg_list[0].addr : 0, wr->num_sge ? wr->sg_list[0].length : 0});
  }
  return 0;
}

}  // namespace

namespace fake {

std::vector<std::thread::id> qpCreators() {
  WorldLock l(worldMu);
  return w().qpCreators;
}
void reset() {
  if (!g_iova2.load()) setRegMrIova2(true);
  blockErrTransitions(false);
  blockQpCreation(false);
  blockQpDestroy(false);
  blockAccessModify(false);
  blockMrRegistration(false);
  WorldLock l(worldMu);
  g = std::make_unique<World>();
}
void blockErrTransitions(bool block) { errGate.set(block); }
int blockedErrTransitions() { return errGate.held(); }
void blockMrRegistration(bool block) { regGate.set(block); }
int blockedMrRegistrations() { return regGate.held(); }
void blockQpCreation(bool block) { createGate.set(block); }
int blockedQpCreations() { return createGate.held(); }
void blockQpDestroy(bool block) { destroyGate.set(block); }
int blockedQpDestroys() { return destroyGate.held(); }
std::vector<std::thread::id> qpDestroyers() {
  WorldLock l(worldMu);
  return w().qpDestroyers;
}
void blockAccessModify(bool block) { accessGate.set(block); }
int blockedAccessModifies() { return accessGate.held(); }
std::vector<std::thread::id> accessModifiers() {
  WorldLock l(worldMu);
  return w().accessModifiers;
}
const std::vector<PostedSend>& outstanding(ibv_qp* qp) {
  WorldLock l(worldMu);
  static const std::vector<PostedSend> kNone;
  if (!w().liveQps.count(qp)) return kNone;  // destroyed meanwhile (the transport's worker): nothing queued
  return fqp(qp)->sends;
}
size_t postedRecvs(ibv_qp* qp) {
  WorldLock l(worldMu);
  return fqp(qp)->recvs.size();
}
void holdFlushes(bool hold) {
  WorldLock l(worldMu);
  w().holdFlushes = hold;
}
std::pair<int, int> qos(ibv_qp* qp) {
  WorldLock l(worldMu);
  auto it = w().qpQos.find(qp);
  return it == w().qpQos.end() ? std::make_pair(-1, -1) : it->second;
}
bool qpAlive(ibv_qp* qp) {
  WorldLock l(worldMu);
  return w().liveQps.count(qp) != 0;
}
QpPath qpPath(ibv_qp* qp) {
  WorldLock l(worldMu);
  auto it = w().qpPath.find(qp);
  return it == w().qpPath.end() ? QpPath{} : it->second;
}
int pkeyIndex(ibv_qp* qp) {
  WorldLock l(worldMu);
  auto it = w().qpPkeyIndex.find(qp);
  return it == w().qpPkeyIndex.end() ? -1 : it->second;
}

void setPkeys(const std::string& dev, int port, const std::vector<uint16_t>& table) {
  WorldLock l(worldMu);
  w().pkeys[{dev, port}] = table;
}

void setGids(const std::string& dev, int port, const std::vector<ibv_gid_entry>& table) {
  WorldLock l(worldMu);
  w().gids[{dev, port}] = table;
}
void failNextModify(int err, ibv_qp* qp) {
  WorldLock l(worldMu);
  w().failModify = err;
  w().failModifyQp = qp;
}
void failNextDestroy(int err, ibv_qp* qp, int times) {
  WorldLock l(worldMu);
  w().failDestroy = err;
  w().failDestroyQp = qp;
  w().failDestroyTimes = times;
}
void setDmabuf(bool supported) {
  WorldLock l(worldMu);
  w().dmabuf = supported;
}
uint64_t cqPolls(ibv_cq* cq) {
  WorldLock l(worldMu);
  return fcq(cq)->polls;
}
void setNextQpn(uint32_t qpn) {
  WorldLock l(worldMu);
  w().nextQpn = qpn - 1;
}

int dmabufRegistrations() {
  WorldLock l(worldMu);
  return w().dmabufRegs;
}
int liveMrs() {
  WorldLock l(worldMu);
  return (int)w().mrs.size();
}
namespace {
MrInfo infoOf(const World::Mr& m) {
  MrInfo i;
  i.found = true;
  auto d = w().opened.find(m.ctx);
  i.dev = d != w().opened.end() ? d->second : "";
  i.call = m.call;
  i.access = m.access;
  i.iova = m.addr;
  i.len = m.len;
  return i;
}
}  // namespace
MrInfo mrInfo(uint32_t rkey) {
  WorldLock l(worldMu);
  auto m = w().mrs.find(rkey);
  return m == w().mrs.end() ? MrInfo() : infoOf(m->second);
}
std::vector<MrInfo> liveMrInfos() {
  WorldLock l(worldMu);
  std::vector<MrInfo> v;
  for (auto& m : w().mrs) v.push_back(infoOf(m.second));
  return v;
}
void setRegMrIova2(bool present) {
  g_iova2 = present;
  std::string err;
  if (!railover::verbs::loadVerbsApiWith(fakeSym, &err)) ADD_FAILURE() << err;
}
void refuseRelaxedOrdering(const std::string& dev, bool refuse) {
  WorldLock l(worldMu);
  if (refuse)
    w().refuseRo.insert(dev);
  else
    w().refuseRo.erase(dev);
}
int relaxedOrderingRefusals() {
  WorldLock l(worldMu);
  return w().roRefusals;
}
ibv_qp_state state(ibv_qp* qp) {
  WorldLock l(worldMu);
  return qp->state;
}

int deliver(ibv_qp* from, ibv_qp* to, int max) {
  WorldLock l(worldMu);
  // A QP the transport's worker destroyed since the test read it sends and takes nothing.
  if (!w().liveQps.count(from) || !w().liveQps.count(to)) return 0;
  FakeQp* a = fqp(from);
  FakeQp* b = fqp(to);
  int n = 0;
  // A QP in ERR places nothing: packets for it are dropped (rxe drops them before placement),
  // and the sender's WRs wait (a real requester retries until its retry count runs out).
  if (to->state == IBV_QPS_ERR && to != from) return 0;
  while (n < max && !a->sends.empty()) {
    PostedSend& s = a->sends.front();
    if (s.badLkey) {  // an lkey of another HCA opening: the local HCA refuses the WR
      fail(from, IBV_WC_LOC_PROT_ERR);
      return n;
    }
    if (s.opcode == IBV_WR_RDMA_WRITE || s.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
      if (!(effectiveAccess(to) & IBV_ACCESS_REMOTE_WRITE)) {  // the responder QP takes no WRITE
        responderError(from, to, IBV_WC_REM_INV_REQ_ERR);
        return n;
      }
      auto mr = w().mrs.find(s.rkey);
      if (mr != w().mrs.end() && mr->second.ctx != to->context) {  // the rkey of another opening
        responderError(from, to, IBV_WC_REM_ACCESS_ERR);
        return n;
      }
    }
    if (s.opcode == IBV_WR_RDMA_READ) {
      if (!(effectiveAccess(to) & IBV_ACCESS_REMOTE_READ)) {  // the responder QP serves no READ
        responderError(from, to, IBV_WC_REM_INV_REQ_ERR);
        return n;
      }
      auto mr = w().mrs.find(s.rkey);
      bool ok = mr != w().mrs.end() && (mr->second.access & IBV_ACCESS_REMOTE_READ) &&
                s.remoteAddr >= mr->second.addr && s.remoteAddr + s.localLen <= mr->second.addr + mr->second.len;
      if (!ok) {  // R_Key violation: no such key, no remote read on the MR, outside it
        responderError(from, to, IBV_WC_REM_ACCESS_ERR);
        return n;
      }
      std::memcpy(reinterpret_cast<void*>(s.localAddr), reinterpret_cast<void*>(s.remoteAddr), s.localLen);
      pushWc(from->send_cq, s.wrId, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, s.localLen);
      a->sends.erase(a->sends.begin());
      ++n;
      continue;
    }
    bool needsRecv = s.opcode == IBV_WR_SEND || s.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (needsRecv && b->recvs.empty()) break;
    if (s.opcode == IBV_WR_RDMA_WRITE || s.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
      if (!s.data.empty()) std::memcpy(reinterpret_cast<void*>(s.remoteAddr), s.data.data(), s.data.size());
    }
    if (needsRecv) {
      FakeRecv r = b->recvs.front();
      b->recvs.pop_front();
      if (s.opcode == IBV_WR_SEND) {
        std::memcpy(reinterpret_cast<void*>(r.addr), s.data.data(), std::min<size_t>(r.len, s.data.size()));
        pushWc(to->recv_cq, r.wrId, IBV_WC_SUCCESS, IBV_WC_RECV, static_cast<uint32_t>(s.data.size()), 0, to);
      } else {
        pushWc(to->recv_cq, r.wrId, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, static_cast<uint32_t>(s.data.size()),
               s.immBe, to);
      }
    }
    pushWc(from->send_cq, s.wrId, IBV_WC_SUCCESS, s.opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE);
    a->sends.erase(a->sends.begin());
    ++n;
  }
  return n;
}

void fail(ibv_qp* from, ibv_wc_status status, bool flushRest) {
  WorldLock l(worldMu);
  if (!w().liveQps.count(from)) return;  // destroyed meanwhile: nothing left to fail
  FakeQp* a = fqp(from);
  if (a->sends.empty()) return;
  pushWc(from->send_cq, a->sends.front().wrId, status, IBV_WC_SEND);
  a->sends.erase(a->sends.begin());
  if (flushRest) {
    from->state = IBV_QPS_ERR;
    flushAll(a);
  }
}

void asyncEvent(ibv_context* ctx, ibv_event_type type, int port, ibv_qp* qp) {
  ibv_async_event e{};
  e.event_type = type;
  if (qp)
    e.element.qp = qp;
  else
    e.element.port_num = port;
  {
    WorldLock l(worldMu);
    w().async[ctx].push_back(e);
  }
  uint64_t one = 1;  // the context's async_fd becomes readable, as with a real HCA
  if (write(ctx->async_fd, &one, sizeof one) < 0) std::abort();
}

void deviceFatal(const std::string& dev) {
  std::vector<ibv_context*> hit;
  {
    WorldLock l(worldMu);
    for (auto& o : w().opened)
      if (o.second == dev && !w().dead.count(o.first)) hit.push_back(o.first);
    for (ibv_context* c : hit) w().dead.insert(c);
  }
  for (ibv_context* c : hit) asyncEvent(c, IBV_EVENT_DEVICE_FATAL, 0);
}
void setDevicePresent(const std::string& dev, bool present) {
  WorldLock l(worldMu);
  if (present)
    w().absent.erase(dev);
  else
    w().absent.insert(dev);
}
// Outside the world (reset() keeps them): the layer calls ibv_fork_init once, when it loads.
std::atomic<int> g_forkInits{0};
std::atomic<bool> g_forkLate{false};
std::atomic<bool> g_verbsUsed{false};  // a device listed or opened, or memory registered
int forkInitCalls() { return g_forkInits.load(); }
bool forkInitCameLate() { return g_forkLate.load(); }
int deviceListCalls() {
  WorldLock l(worldMu);
  return w().listCalls;
}
bool mrOnDeadContext(uint32_t rkey) {
  WorldLock l(worldMu);
  auto m = w().mrs.find(rkey);
  return m != w().mrs.end() && w().dead.count(m->second.ctx);
}

void setPortState(const std::string& dev, int port, ibv_port_state st) {
  WorldLock l(worldMu);
  w().portState[{dev, port}] = st;
}
void setPortLid(const std::string& dev, int port, uint16_t lid) {
  WorldLock l(worldMu);
  w().portLid[{dev, port}] = lid;
}
void setPortRate(const std::string& dev, int port, uint8_t activeSpeed, uint8_t activeWidth) {
  WorldLock l(worldMu);
  w().portRate[{dev, port}] = {activeSpeed, activeWidth};
}
void setLinkLayer(const std::string& dev, int port, uint8_t linkLayer) {
  WorldLock l(worldMu);
  w().linkLayer[{dev, port}] = linkLayer;
}
void setDeviceAttrs(const std::string& dev, uint64_t sysImageGuid, int maxQp) {
  WorldLock l(worldMu);
  w().devAttrs[dev] = {sysImageGuid, maxQp};
}

void setQpAccess(const std::string& dev, QpAccess mode) {
  WorldLock l(worldMu);
  w().accessMode[dev] = mode;
}

}  // namespace fake

// ---- the libibverbs entry points (C linkage from verbs.h's declarations)

int ibv_fork_init(void) {
  ++fake::g_forkInits;
  if (fake::g_verbsUsed.load()) fake::g_forkLate = true;
  return 0;
}

ibv_device** ibv_get_device_list(int* n) {
  fake::g_verbsUsed = true;
  WorldLock l(worldMu);
  World& W = w();
  ++W.listCalls;
  int k = 0;
  for (auto& d : W.devs)
    if (!W.absent.count(d.name)) W.list[k++] = &d;
  W.list[k] = nullptr;
  if (n) *n = k;
  return W.list;
}
void ibv_free_device_list(ibv_device**) {}
const char* ibv_get_device_name(ibv_device* d) { return d->name; }

ibv_context* ibv_open_device(ibv_device* d) {
  fake::g_verbsUsed = true;
  WorldLock l(worldMu);
  if (w().absent.count(d->name)) return errno = ENODEV, nullptr;
  auto* c = new ibv_context{};
  w().opened[c] = d->name;
  c->device = d;
  c->ops.poll_cq = opPollCq;
  c->ops.req_notify_cq = opNotify;
  c->ops.post_send = opPostSend;
  c->ops.post_recv = opPostRecv;
  c->async_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  c->abi_compat = nullptr;  // not an extended context: inline helpers fall back to the calls below
  return c;
}
int ibv_close_device(ibv_context* c) {
  WorldLock l(worldMu);
  close(c->async_fd);
  if (g) g->async.erase(c), g->opened.erase(c), g->dead.erase(c);
  delete c;
  return 0;
}

ibv_pd* ibv_alloc_pd(ibv_context* c) {
  WorldLock l(worldMu);
  if (w().dead.count(c)) return errno = EIO, nullptr;
  auto* p = new ibv_pd{};
  p->context = c;
  return p;
}
int ibv_dealloc_pd(ibv_pd* p) {
  delete p;
  return 0;
}

namespace {
// ibv_reg_mr's work, with worldMu held (ibv_reg_dmabuf_mr's too: its gate is not ibv_reg_mr's).
ibv_mr* regMrLocked(ibv_pd* pd, void* addr, size_t len, int access, const char* call) {
  if (w().dead.count(pd->context)) return errno = EIO, nullptr;
  if ((access & IBV_ACCESS_RELAXED_ORDERING) && w().refuseRo.count(w().opened[pd->context]))
    return ++w().roRefusals, errno = EINVAL, nullptr;
  auto* m = new ibv_mr{};
  m->context = pd->context;
  m->pd = pd;
  m->addr = addr;
  m->length = len;
  m->lkey = ++w().nextKey;
  m->rkey = ++w().nextKey;
  w().mrs[m->rkey] = {(uint64_t)(uintptr_t)addr, (uint64_t)len, access, pd->context, call};
  w().lkeyCtx[m->lkey] = pd->context;
  return m;
}

}  // namespace

#undef ibv_reg_mr
ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t len, int access) {
  fake::g_verbsUsed = true;
  regGate.pass();
  WorldLock l(worldMu);
  // libibverbs' exported ibv_reg_mr takes no optional access flags (verbs.h's inline wrapper
  // sends them to ibv_reg_mr_iova2): the fake keeps what it is given, for tests to see.
  return regMrLocked(pd, addr, len, access, "ibv_reg_mr");
}
ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t len, uint64_t iova, unsigned int access) {
  fake::g_verbsUsed = true;
  regGate.pass();
  WorldLock l(worldMu);
  // The fake addresses MRs by address: an iova other than the address is not modelled.
  if (iova != (uint64_t)(uintptr_t)addr) return errno = ENOTSUP, nullptr;
  return regMrLocked(pd, addr, len, (int)access, "ibv_reg_mr_iova2");
}
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t, size_t len, uint64_t iova, int fd, int access) {
  WorldLock l(worldMu);
  if (!w().dmabuf) return errno = EOPNOTSUPP, nullptr;
  if (fd < 0 || fcntl(fd, F_GETFD) == -1) return errno = EBADF, nullptr;  // a closed fd too
  ibv_mr* m = regMrLocked(pd, reinterpret_cast<void*>(iova), len, access, "ibv_reg_dmabuf_mr");
  if (m) ++w().dmabufRegs;
  return m;
}
int ibv_dereg_mr(ibv_mr* m) {
  WorldLock l(worldMu);
  w().mrs.erase(m->rkey);
  w().lkeyCtx.erase(m->lkey);
  delete m;
  return 0;
}

ibv_comp_channel* ibv_create_comp_channel(ibv_context* c) {
  {
    WorldLock l(worldMu);
    if (w().dead.count(c)) return errno = EIO, nullptr;
  }
  auto* ch = new ibv_comp_channel{};
  ch->context = c;
  ch->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  return ch;
}
int ibv_destroy_comp_channel(ibv_comp_channel* ch) {
  close(ch->fd);
  delete ch;
  return 0;
}
int ibv_get_cq_event(ibv_comp_channel*, ibv_cq**, void**) {
  errno = EAGAIN;
  return -1;
}
void ibv_ack_cq_events(ibv_cq*, unsigned int) {}

ibv_cq* ibv_create_cq(ibv_context* c, int cqe, void* ctx, ibv_comp_channel* ch, int) {
  {
    WorldLock l(worldMu);
    if (w().dead.count(c)) return errno = EIO, nullptr;
  }
  auto* f = new FakeCq{};
  f->cq.context = c;
  f->cq.channel = ch;
  f->cq.cq_context = ctx;
  f->cq.cqe = cqe;
  return &f->cq;
}
int ibv_destroy_cq(ibv_cq* cq) {
  delete fcq(cq);
  return 0;
}

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* ia) {
  createGate.pass();
  WorldLock l(worldMu);
  if (w().dead.count(pd->context)) return errno = EIO, nullptr;
  auto* f = new FakeQp{};
  f->qp.context = pd->context;
  f->qp.pd = pd;
  f->qp.send_cq = ia->send_cq;
  f->qp.recv_cq = ia->recv_cq;
  f->qp.qp_num = ++w().nextQpn;
  w().qpCreators.push_back(std::this_thread::get_id());
  f->qp.state = IBV_QPS_RESET;
  f->qp.qp_type = ia->qp_type;
  w().liveQps.insert(&f->qp);
  return &f->qp;
}
int ibv_destroy_qp(ibv_qp* qp) {
  destroyGate.pass();
  WorldLock l(worldMu);
  w().qpDestroyers.push_back(std::this_thread::get_id());
  if (w().failDestroy && w().failDestroyQp == qp && w().failDestroyTimes > 0) {
    int e = w().failDestroy;
    if (--w().failDestroyTimes == 0) w().failDestroy = 0, w().failDestroyQp = nullptr;
    return e;
  }
  w().qpPkeyIndex.erase(qp);
  w().qpQos.erase(qp);
  w().qpPath.erase(qp);
  w().liveQps.erase(qp);
  delete fqp(qp);
  return 0;
}
int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* a, int mask) {
  if ((mask & IBV_QP_STATE) && a->qp_state == IBV_QPS_ERR) errGate.pass();
  if (mask == IBV_QP_ACCESS_FLAGS) accessGate.pass();
  WorldLock l(worldMu);
  if (mask == IBV_QP_ACCESS_FLAGS) w().accessModifiers.push_back(std::this_thread::get_id());
  if (!(mask & IBV_QP_STATE) && qp->state == IBV_QPS_ERR) {
    // A modify that stays in ERR takes no attributes (the IB spec's ERR -> ERR: none; mlx5's
    // ib_modify_qp_is_ok refuses it): an access-only modify (RTS -> RTS) of a QP that went to
    // ERR meanwhile fails with EINVAL.
    errno = EINVAL;
    return EINVAL;
  }
  if (w().failModify && (!w().failModifyQp || w().failModifyQp == qp)) {
    int e = w().failModify;
    w().failModify = 0;
    w().failModifyQp = nullptr;
    errno = e;
    return e;
  }
  if (mask & IBV_QP_PKEY_INDEX) w().qpPkeyIndex[qp] = a->pkey_index;
  if (mask & IBV_QP_AV) {
    w().qpQos[qp] = {a->ah_attr.grh.traffic_class, a->ah_attr.sl};
    fake::QpPath& qp2 = w().qpPath[qp];
    qp2.isGlobal = a->ah_attr.is_global, qp2.dlid = a->ah_attr.dlid;
    qp2.sgidIndex = a->ah_attr.is_global ? a->ah_attr.grh.sgid_index : -1;
  }
  if (mask & IBV_QP_DEST_QPN) w().qpPath[qp].destQpn = a->dest_qp_num;
  if (mask & IBV_QP_TIMEOUT) w().qpPath[qp].timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) w().qpPath[qp].retryCnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) w().qpPath[qp].rnrRetry = a->rnr_retry;
  if (mask & IBV_QP_ACCESS_FLAGS) w().qpAccess[qp] = a->qp_access_flags;
  if (mask & IBV_QP_STATE) {
    qp->state = a->qp_state;
    if (a->qp_state == IBV_QPS_ERR && !w().holdFlushes) flushAll(fqp(qp));
  }
  return 0;
}
int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* a, int mask, ibv_qp_init_attr*) {
  WorldLock l(worldMu);
  if ((mask & IBV_QP_ACCESS_FLAGS) && accessMode(qp) == fake::QpAccess::kQueryFails) {
    errno = EOPNOTSUPP;
    return EOPNOTSUPP;
  }
  a->qp_state = qp->state;
  a->qp_access_flags = effectiveAccess(qp);
  return 0;
}

int ibv_get_async_event(ibv_context* c, ibv_async_event* e) {
  WorldLock l(worldMu);
  auto& q = w().async[c];
  if (q.empty()) {
    uint64_t v;
    while (read(c->async_fd, &v, sizeof v) > 0) {  // drained: the fd is not readable any more
    }
    errno = EAGAIN;
    return -1;
  }
  *e = q.front();
  q.pop_front();
  return 0;
}
void ibv_ack_async_event(ibv_async_event*) {}

int ibv_query_device(ibv_context* c, ibv_device_attr* a) {
  std::memset(a, 0, sizeof *a);
  a->phys_port_cnt = 2;
  WorldLock l(worldMu);
  auto d = w().devAttrs.find(c->device->name);
  if (d != w().devAttrs.end()) {
    a->sys_image_guid = htobe64(d->second.first);
    a->max_qp = d->second.second;
  }
  return 0;
}
#undef ibv_query_port
int ibv_query_port(ibv_context* c, uint8_t port, _compat_ibv_port_attr* pa) {
  auto* p = reinterpret_cast<ibv_port_attr*>(pa);
  {
    WorldLock l(worldMu);
    if (w().dead.count(c)) return EIO;
    auto st = w().portState.find({c->device->name, port});
    p->state = st == w().portState.end() ? IBV_PORT_ACTIVE : st->second;
    auto lid = w().portLid.find({c->device->name, port});
    p->lid = lid == w().portLid.end() ? 0 : lid->second;
    auto rate = w().portRate.find({c->device->name, port});
    if (rate != w().portRate.end()) p->active_speed = rate->second.first, p->active_width = rate->second.second;
    auto ll = w().linkLayer.find({c->device->name, port});
    p->link_layer = ll == w().linkLayer.end() ? static_cast<uint8_t>(IBV_LINK_LAYER_ETHERNET) : ll->second;
  }
  p->active_mtu = IBV_MTU_1024;
  {
    WorldLock l(worldMu);
    p->gid_tbl_len = static_cast<int>(w().gids[{c->device->name, port}].size());
  }
  auto pk = w().pkeys.find({c->device->name, port});
  p->pkey_tbl_len = pk == w().pkeys.end() ? 1 : static_cast<uint16_t>(pk->second.size());
  return 0;
}
int _ibv_query_gid_ex(ibv_context* c, uint32_t port, uint32_t idx, ibv_gid_entry* e, uint32_t, size_t) {
  WorldLock l(worldMu);
  auto& t = w().gids[{c->device->name, static_cast<int>(port)}];
  if (idx >= t.size() || t[idx].gid_type == 0xff) return ENODATA;  // 0xff: an empty slot
  *e = t[idx];
  return 0;
}

int ibv_query_pkey(ibv_context* c, uint8_t port, int index, __be16* pkey) {
  WorldLock l(worldMu);
  auto pk = w().pkeys.find({c->device->name, port});
  std::vector<uint16_t> t = pk == w().pkeys.end() ? std::vector<uint16_t>{0xffff} : pk->second;
  if (index < 0 || static_cast<size_t>(index) >= t.size()) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htons(t[static_cast<size_t>(index)]);
  return 0;
}

const char* ibv_wc_status_str(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    default: return "other error";
  }
}
const char* ibv_event_type_str(ibv_event_type e) {
  switch (e) {
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_PORT_ACTIVE: return "port active";
    case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
    case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
    default: return "other event";
  }
}
const char* ibv_port_state_str(ibv_port_state) { return "PORT_ACTIVE"; }
