// railover-perf: plugin loading, per-ABI adapters, logger and profiler callbacks (see net.h).
#include "tools/perf/net.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "tools/perf/util.h"

namespace rperf {

// ---------------------------------------------------------------------------------------------
// Adapters
// ---------------------------------------------------------------------------------------------
namespace {

std::atomic<uint64_t> gPluginInits{0};

template <int V> struct Traits;
template <> struct Traits<7> { using Table = ncclNet_v7_t; using Props = ncclNetProperties_v7_t; };
template <> struct Traits<8> { using Table = ncclNet_v8_t; using Props = ncclNetProperties_v8_t; };
template <> struct Traits<9> { using Table = ncclNet_v9_t; using Props = ncclNetProperties_v9_t; };
template <> struct Traits<10> { using Table = ncclNet_v10_t; using Props = ncclNetProperties_v10_t; };
template <> struct Traits<11> { using Table = ncclNet_v11_t; using Props = ncclNetProperties_v11_t; };
template <> struct Traits<12> { using Table = ncclNet_v12_t; using Props = ncclNetProperties_v12_t; };

// The context an <= v10 plugin never sees (NCCL's shim keeps one too).
struct ShimCtx {
  ncclNetCommConfig_t config;
};

template <int V>
class Adapter final : public NetAbi {
  using Table = typename Traits<V>::Table;
  using Props = typename Traits<V>::Props;

 public:
  explicit Adapter(const Table* t) : t_(t) {}
  int version() const override { return V; }
  const char* name() const override { return t_->name; }

  ncclResult_t init(void** ctx, uint64_t commId, ncclNetCommConfig_t* config) override {
    if constexpr (V >= 11) {
      gPluginInits++;
      return t_->init(ctx, commId, config, rperfLogger, rperfProfiler);
    } else {
      std::lock_guard<std::mutex> g(mu_);
      if (!pluginInited_ && !skipPluginInit_) {
        gPluginInits++;
        ncclResult_t r;
        if constexpr (V == 10) r = t_->init(rperfLogger, rperfProfiler);
        else r = t_->init(rperfLogger);
        if (r != ncclSuccess) return r;
      }
      pluginInited_ = true;
      *ctx = new ShimCtx{*config};
      return ncclSuccess;
    }
  }
  ncclResult_t finalize(void* ctx) override {
    if constexpr (V >= 11) {
      return t_->finalize(ctx);
    } else {
      delete static_cast<ShimCtx*>(ctx);
      return ncclSuccess;
    }
  }
  ncclResult_t devices(int* n) override { return t_->devices(n); }
  ncclResult_t getProperties(int dev, NetProps* out) override {
    Props p;
    memset(&p, 0, sizeof p);
    ncclResult_t r = t_->getProperties(dev, &p);
    if (r != ncclSuccess) return r;
    out->name = p.name ? p.name : "";
    out->pciPath = p.pciPath ? p.pciPath : "";
    out->guid = p.guid;
    out->ptrSupport = p.ptrSupport;
    out->speed = p.speed;
    out->port = p.port;
    out->latency = p.latency;
    out->maxComms = p.maxComms;
    out->maxRecvs = p.maxRecvs;
    out->netDeviceType = int(p.netDeviceType);
    out->netDeviceVersion = p.netDeviceVersion;
    if constexpr (V >= 8) out->regIsGlobal = p.regIsGlobal;
    if constexpr (V >= 9) {
      out->forceFlush = p.forceFlush;
      int nd = p.vProps.ndevs;
      int cap = int(sizeof(p.vProps.devs) / sizeof(p.vProps.devs[0]));
      out->vDevs.clear();
      for (int i = 0; i < nd && i < cap; i++) out->vDevs.push_back(p.vProps.devs[i]);
      out->maxP2pBytes = p.maxP2pBytes;
      out->maxCollBytes = p.maxCollBytes;
    }
    if constexpr (V >= 11) out->maxMultiRequestSize = p.maxMultiRequestSize;
    if constexpr (V >= 12) {
      out->railId = p.railId;
      out->planeId = p.planeId;
    }
    return ncclSuccess;
  }
  ncclResult_t listen(void* ctx, int dev, void* handle, void** lc) override {
    if constexpr (V >= 11) return t_->listen(ctx, dev, handle, lc);
    else return t_->listen(dev, handle, lc);
  }
  ncclResult_t connect(void* ctx, int dev, void* handle, void** sc, ncclNetDeviceHandle_t** dh) override {
    if constexpr (V >= 11) return t_->connect(ctx, dev, handle, sc, dh);
    else if constexpr (V == 10) return t_->connect(dev, &static_cast<ShimCtx*>(ctx)->config, handle, sc, dh);
    else return t_->connect(dev, handle, sc, dh);
  }
  ncclResult_t accept(void* lc, void** rc, ncclNetDeviceHandle_t** dh) override { return t_->accept(lc, rc, dh); }
  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mh) override {
    if constexpr (V == 7) {
      if (size > size_t(INT_MAX)) return ncclInternalError;  // NCCL's v7 shim rejects >= 2 GiB
      return t_->regMr(comm, data, int(size), type, mh);
    } else {
      return t_->regMr(comm, data, size, type, mh);
    }
  }
  ncclResult_t deregMr(void* comm, void* mh) override { return t_->deregMr(comm, mh); }
  ncclResult_t isend(void* sc, void* data, size_t size, int tag, void* mh, void* ph, void** req) override {
    if constexpr (V <= 8) {
      if (size > kIntAbiMaxMessage) return ncclInternalError;
      return t_->isend(sc, data, int(size), tag, mh, req);
    } else if constexpr (V == 9) {
      return t_->isend(sc, data, size, tag, mh, req);
    } else {
      return t_->isend(sc, data, size, tag, mh, ph, req);
    }
  }
  ncclResult_t irecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void** phs,
                     void** req) override {
    if constexpr (V <= 8) {
      int isz[RAILOVER_NCCL_MAX_REQUESTS];
      if (n < 0 || n > RAILOVER_NCCL_MAX_REQUESTS) return ncclInternalError;
      for (int i = 0; i < n; i++) {
        if (sizes[i] > kIntAbiMaxMessage) return ncclInternalError;
        isz[i] = int(sizes[i]);
      }
      // NCCL's v7/v8 shims drop the optional-completion marker before calling the plugin.
      if (*req == RAILOVER_NCCL_OPTIONAL_RECV_COMPLETION) *req = nullptr;
      return t_->irecv(rc, n, data, isz, tags, mhs, req);
    } else if constexpr (V == 9) {
      return t_->irecv(rc, n, data, sizes, tags, mhs, req);
    } else {
      return t_->irecv(rc, n, data, sizes, tags, mhs, phs, req);
    }
  }
  ncclResult_t test(void* req, int* done, int* sizes) override { return t_->test(req, done, sizes); }
  ncclResult_t iflush(void* rc, int n, void** data, int* sizes, void** mhs, void** req) override {
    return t_->iflush(rc, n, data, sizes, mhs, req);
  }
  ncclResult_t closeSend(void* c) override { return t_->closeSend(c); }
  ncclResult_t closeRecv(void* c) override { return t_->closeRecv(c); }
  ncclResult_t closeListen(void* c) override { return t_->closeListen(c); }
  bool hasIrecvConsumed() const override { return t_->irecvConsumed != nullptr; }
  ncclResult_t irecvConsumed(void* rc, int n, void* req) override { return t_->irecvConsumed(rc, n, req); }
  bool hasSetNetAttr() const override {
    if constexpr (V >= 11) return t_->setNetAttr != nullptr;
    else return false;
  }
  ncclResult_t setNetAttr(void* ctx, ncclNetAttr_t* attr) override {
    if constexpr (V >= 11) return t_->setNetAttr(ctx, attr);
    else return ncclInternalError;
  }
  bool hasFinalize() const override {
    if constexpr (V >= 11) return t_->finalize != nullptr;
    else return true;
  }
  size_t maxMessageBytes() const override { return V <= 8 ? kIntAbiMaxMessage : (size_t(1) << 40); }

 private:
  const Table* t_;
  std::mutex mu_;
  bool pluginInited_ = false;
};

std::unique_ptr<NetAbi> makeAdapter(int v, void* sym) {
  switch (v) {
    case 7: return std::make_unique<Adapter<7>>(static_cast<const ncclNet_v7_t*>(sym));
    case 8: return std::make_unique<Adapter<8>>(static_cast<const ncclNet_v8_t*>(sym));
    case 9: return std::make_unique<Adapter<9>>(static_cast<const ncclNet_v9_t*>(sym));
    case 10: return std::make_unique<Adapter<10>>(static_cast<const ncclNet_v10_t*>(sym));
    case 11: return std::make_unique<Adapter<11>>(static_cast<const ncclNet_v11_t*>(sym));
    case 12: return std::make_unique<Adapter<12>>(static_cast<const ncclNet_v12_t*>(sym));
    default: return nullptr;
  }
}

// Mandatory table members per version (NCCL dereferences these without checks).
template <typename T>
std::string missingMembers(const T* t, int v) {
  std::string m;
  auto need = [&](const void* p, const char* n) {
    if (!p) m += std::string(m.empty() ? "" : ", ") + n;
  };
  need(reinterpret_cast<const void*>(t->init), "init");
  need(reinterpret_cast<const void*>(t->devices), "devices");
  need(reinterpret_cast<const void*>(t->getProperties), "getProperties");
  need(reinterpret_cast<const void*>(t->listen), "listen");
  need(reinterpret_cast<const void*>(t->connect), "connect");
  need(reinterpret_cast<const void*>(t->accept), "accept");
  need(reinterpret_cast<const void*>(t->regMr), "regMr");
  need(reinterpret_cast<const void*>(t->deregMr), "deregMr");
  need(reinterpret_cast<const void*>(t->isend), "isend");
  need(reinterpret_cast<const void*>(t->irecv), "irecv");
  need(reinterpret_cast<const void*>(t->test), "test");
  need(reinterpret_cast<const void*>(t->closeSend), "closeSend");
  need(reinterpret_cast<const void*>(t->closeRecv), "closeRecv");
  need(reinterpret_cast<const void*>(t->closeListen), "closeListen");
  (void)v;
  return m;
}

std::string checkTable(int v, void* sym) {
  switch (v) {
    case 7: return missingMembers(static_cast<const ncclNet_v7_t*>(sym), v);
    case 8: return missingMembers(static_cast<const ncclNet_v8_t*>(sym), v);
    case 9: return missingMembers(static_cast<const ncclNet_v9_t*>(sym), v);
    case 10: return missingMembers(static_cast<const ncclNet_v10_t*>(sym), v);
    case 11: {
      auto* t = static_cast<const ncclNet_v11_t*>(sym);
      std::string m = missingMembers(t, v);
      if (!t->finalize) m += std::string(m.empty() ? "" : ", ") + "finalize";
      return m;
    }
    case 12: {
      auto* t = static_cast<const ncclNet_v12_t*>(sym);
      std::string m = missingMembers(t, v);
      if (!t->finalize) m += std::string(m.empty() ? "" : ", ") + "finalize";
      return m;
    }
    default: return "unknown version";
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------------
const char* fnName(int fn) {
  static const char* names[kFnCount] = {"init", "finalize", "devices", "getProperties", "listen", "connect",
                                        "accept", "regMr", "deregMr", "isend", "irecv", "test", "closeSend",
                                        "closeRecv", "closeListen", "irecvConsumed", "setNetAttr", "iflush"};
  return fn >= 0 && fn < kFnCount ? names[fn] : "?";
}

const char* resultName(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return int(r) == 8 ? "ncclTimeout" : "unknown ncclResult_t";
  }
}

// ---------------------------------------------------------------------------------------------
// CallTracker
// ---------------------------------------------------------------------------------------------
namespace {
thread_local CallTracker::Slot* tlsSlot = nullptr;
}

CallTracker& CallTracker::get() {
  static CallTracker t;
  return t;
}
void CallTracker::registerThread(const std::string& name) {
  if (tlsSlot) {
    tlsSlot->thread = name;
    return;
  }
  std::lock_guard<std::mutex> g(mu_);
  slots_.push_back(std::make_unique<Slot>());
  slots_.back()->thread = name;
  tlsSlot = slots_.back().get();
}
CallTracker::Slot* CallTracker::mine() {
  if (!tlsSlot) registerThread("thread");
  return tlsSlot;
}
void CallTracker::forEach(const std::function<void(Slot&)>& f) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& s : slots_) f(*s);
}

// ---------------------------------------------------------------------------------------------
// Plugin
// ---------------------------------------------------------------------------------------------
Plugin::~Plugin() { unload(); }

bool Plugin::load(const std::string& path, int forceAbi, std::string* err) {
  path_ = path;
  forced_ = forceAbi;
  dlerror();
  dl_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl_) {
    const char* e = dlerror();
    *err = strf("dlopen(%s) failed: %s", path.c_str(), e ? e : "unknown error");
    return false;
  }
  loads_++;
  available_.clear();
  void* chosen = nullptr;
  int chosenV = 0;
  for (int v = 12; v >= 7; v--) {
    std::string sym = strf("ncclNetPlugin_v%d", v);
    void* p = dlsym(dl_, sym.c_str());
    if (!p) continue;
    available_.push_back(v);
    if (!chosen && (forceAbi == 0 || forceAbi == v)) {
      chosen = p;
      chosenV = v;
    }
  }
  if (!chosen) {
    std::string have;
    for (int v : available_) have += strf("%sv%d", have.empty() ? "" : ", ", v);
    *err = forceAbi ? strf("%s does not export ncclNetPlugin_v%d (exports: %s)", path.c_str(), forceAbi,
                           have.empty() ? "none" : have.c_str())
                    : strf("%s exports none of ncclNetPlugin_v12 ... ncclNetPlugin_v7", path.c_str());
    dlclose(dl_);
    dl_ = nullptr;
    return false;
  }
  std::string missing = checkTable(chosenV, chosen);
  if (!missing.empty()) {
    *err = strf("ncclNetPlugin_v%d in %s has NULL mandatory members: %s", chosenV, path.c_str(), missing.c_str());
    dlclose(dl_);
    dl_ = nullptr;
    return false;
  }
  version_ = chosenV;
  net_ = makeAdapter(chosenV, chosen);
  rperfLogger(RO_LOG_INFO, RO_SUBSYS_INIT, __func__, __LINE__, "NET/Plugin: loaded %s symbol ncclNetPlugin_v%d (name \"%s\")",
              path.c_str(), chosenV, net_->name() ? net_->name() : "(null)");
  return true;
}

bool Plugin::reload(bool skipInit, std::string* err) {
  int v = version_;
  unload();
  if (!load(path_, v, err)) return false;
  net_->setSkipPluginInit(skipInit);
  return true;
}

void Plugin::unload() {
  net_.reset();
  if (dl_) {
    dlclose(dl_);
    dl_ = nullptr;
  }
}

void Plugin::enter(int fn) {
  calls_[fn].fetch_add(1, std::memory_order_relaxed);
  CallTracker::Slot* s = CallTracker::get().mine();
  s->fn.store(fn, std::memory_order_relaxed);
  s->sinceUs.store(nowUs(), std::memory_order_release);
}
void Plugin::leave() { CallTracker::get().mine()->sinceUs.store(0, std::memory_order_release); }

bool Plugin::check(int fn, ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return true;
  // A failed init/devices/getProperties is this rank's own failure, never the consequence of
  // a peer's exit: it is not tolerated in timed runs.
  if (fn == kFnInit || fn == kFnDevices || fn == kFnGetProperties) {
    Fatal::get().raise(kExitPlugin, strf("plugin call %s failed: %s (%d)%s%s", fnName(fn), resultName(r), int(r),
                                         what.empty() ? "" : " on ", what.c_str()));
    return false;
  }
  Fatal::get().raisePlugin(kExitPlugin, strf("plugin call %s failed: %s (%d)%s%s", fnName(fn), resultName(r), int(r),
                                             what.empty() ? "" : " on ", what.c_str()));
  return false;
}

#define RPERF_CALL(fn, what, expr) \
  do {                             \
    enter(fn);                     \
    ncclResult_t r_ = (expr);      \
    leave();                       \
    return check(fn, r_, what);    \
  } while (0)

bool Plugin::init(void** ctx, uint64_t commId, ncclNetCommConfig_t* config) {
  RPERF_CALL(kFnInit, "", net_->init(ctx, commId, config));
}
bool Plugin::finalize(void* ctx) { RPERF_CALL(kFnFinalize, "", net_->finalize(ctx)); }
bool Plugin::devices(int* n) { RPERF_CALL(kFnDevices, "", net_->devices(n)); }
bool Plugin::getProperties(int dev, NetProps* p) {
  RPERF_CALL(kFnGetProperties, strf("dev %d", dev), net_->getProperties(dev, p));
}
bool Plugin::listen(void* ctx, int dev, void* handle, void** lc, const std::string& what) {
  RPERF_CALL(kFnListen, what, net_->listen(ctx, dev, handle, lc));
}
bool Plugin::connect(void* ctx, int dev, void* handle, void** sc, const std::string& what) {
  ncclNetDeviceHandle_t* dh = nullptr;
  enter(kFnConnect);
  ncclResult_t r = net_->connect(ctx, dev, handle, sc, &dh);
  leave();
  if (!check(kFnConnect, r, what)) return false;
  if (dh) {
    Fatal::get().raise(kExitPlugin, "connect returned a device-offload handle; railover-perf drives host plugins only");
    return false;
  }
  if (!*sc) countNull(kFnConnect);
  return true;
}
bool Plugin::accept(void* lc, void** rc, const std::string& what) {
  ncclNetDeviceHandle_t* dh = nullptr;
  enter(kFnAccept);
  ncclResult_t r = net_->accept(lc, rc, &dh);
  leave();
  if (!check(kFnAccept, r, what)) return false;
  if (dh) {
    Fatal::get().raise(kExitPlugin, "accept returned a device-offload handle; railover-perf drives host plugins only");
    return false;
  }
  if (!*rc) countNull(kFnAccept);
  return true;
}
bool Plugin::regMr(void* comm, void* data, size_t size, void** mh, const std::string& what) {
  RPERF_CALL(kFnRegMr, what, net_->regMr(comm, data, size, RAILOVER_NCCL_PTR_HOST, mh));
}
bool Plugin::deregMr(void* comm, void* mh, const std::string& what) {
  RPERF_CALL(kFnDeregMr, what, net_->deregMr(comm, mh));
}
bool Plugin::isend(void* sc, void* data, size_t size, int tag, void* mh, void* ph, void** req, const std::string& what) {
  enter(kFnIsend);
  ncclResult_t r = net_->isend(sc, data, size, tag, mh, ph, req);
  leave();
  if (!check(kFnIsend, r, what)) return false;
  if (!*req) countNull(kFnIsend);
  return true;
}
bool Plugin::irecv(void* rc, void* data, size_t size, int tag, void* mh, void* ph, void** req, const std::string& what) {
  void* datas[1] = {data};
  size_t sizes[1] = {size};
  int tags[1] = {tag};
  void* mhs[1] = {mh};
  void* phs[1] = {ph};
  return irecvGroup(rc, 1, datas, sizes, tags, mhs, phs, req, what);
}
bool Plugin::irecvGroup(void* rc, int n, void** datas, size_t* sizes, int* tags, void** mhs, void** phs, void** req,
                        const std::string& what) {
  enter(kFnIrecv);
  ncclResult_t r = net_->irecv(rc, n, datas, sizes, tags, mhs, phs, req);
  leave();
  if (!check(kFnIrecv, r, what)) return false;
  if (*req == RAILOVER_NCCL_OPTIONAL_RECV_COMPLETION) {
    Fatal::get().raise(kExitPlugin,
                       strf("plugin call irecv returned success but left NCCL_NET_OPTIONAL_RECV_COMPLETION (0x1) in "
                            "*request (NCCL would call test(0x1)) on %s",
                            what.c_str()));
    return false;
  }
  if (!*req) countNull(kFnIrecv);
  return true;
}
bool Plugin::test(void* req, int* done, int* size, const std::string& what) {
  RPERF_CALL(kFnTest, what, net_->test(req, done, size));
}
bool Plugin::iflush(void* rc, int n, void** datas, int* sizes, void** mhs, void** req, const std::string& what) {
  *req = nullptr;
  bool ok = [&]() { RPERF_CALL(kFnIflush, what, net_->iflush(rc, n, datas, sizes, mhs, req)); }();
  if (ok && !*req) countNull(kFnIflush);
  return ok;
}
bool Plugin::closeSend(void* sc, const std::string& what) { RPERF_CALL(kFnCloseSend, what, net_->closeSend(sc)); }
bool Plugin::closeRecv(void* rc, const std::string& what) { RPERF_CALL(kFnCloseRecv, what, net_->closeRecv(rc)); }
bool Plugin::closeListen(void* lc, const std::string& what) {
  RPERF_CALL(kFnCloseListen, what, net_->closeListen(lc));
}
bool Plugin::irecvConsumed(void* rc, void* req, const std::string& what) {
  RPERF_CALL(kFnIrecvConsumed, what, net_->irecvConsumed(rc, 1, req));
}
bool Plugin::setNetAttr(void* ctx, ncclNetAttr_t* attr) {
  RPERF_CALL(kFnSetNetAttr, "", net_->setNetAttr(ctx, attr));
}

// ---------------------------------------------------------------------------------------------
// Logger and profiler callbacks
// ---------------------------------------------------------------------------------------------
namespace {
std::atomic<int> gLogLevel{RO_LOG_WARN};
std::atomic<unsigned long> gLogMask{RO_SUBSYS_ALL};
std::atomic<int> gLoggerRank{0};
char gHost[64] = "localhost";
uint64_t gLogEpochUs = 0;
std::atomic<uint64_t> gProfEvents{0};

unsigned long subsysBit(const std::string& n) {
  if (n == "INIT") return 0x1;
  if (n == "NET") return 0x10;
  if (n == "PROXY") return 0x400;
  if (n == "ALL") return RO_SUBSYS_ALL;
  return 0;
}
}  // namespace

void loggerConfigure(int rank) {
  gLoggerRank = rank;
  gethostname(gHost, sizeof gHost - 1);
  gLogEpochUs = nowUs();
  const char* lv = getenv("NCCL_DEBUG");
  if (lv) {
    std::string s(lv);
    for (auto& c : s) c = char(toupper((unsigned char)c));
    if (s == "VERSION") gLogLevel = RO_LOG_VERSION;
    else if (s == "WARN") gLogLevel = RO_LOG_WARN;
    else if (s == "INFO") gLogLevel = RO_LOG_INFO;
    else if (s == "ABORT") gLogLevel = RO_LOG_ABORT;
    else if (s == "TRACE") gLogLevel = RO_LOG_TRACE;
    else if (s == "NONE" || s.empty()) gLogLevel = RO_LOG_NONE;
    else gLogLevel = RO_LOG_WARN;
  }
  const char* ss = getenv("NCCL_DEBUG_SUBSYS");
  if (ss && *ss) {
    std::string s(ss);
    for (auto& c : s) c = char(toupper((unsigned char)c));
    bool invert = s[0] == '^';
    if (invert) s = s.substr(1);
    unsigned long mask = 0;
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t comma = s.find(',', pos);
      std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      mask |= subsysBit(tok);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    gLogMask = invert ? ~mask : mask;
  }
  if (gLogLevel.load() >= RO_LOG_INFO) setVerbose(true);
}

extern "C" void rperfLogger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                            ...) {
  int cur = gLogLevel.load(std::memory_order_relaxed);
  if (level == RO_LOG_NONE || int(level) > cur) return;
  if (level != RO_LOG_WARN && level != RO_LOG_VERSION && !(flags & gLogMask.load(std::memory_order_relaxed))) return;
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt ? fmt : "", ap);
  va_end(ap);
  char out[1800];
  int pid = int(getpid());
  int tid = int(syscall(SYS_gettid));
  int rank = gLoggerRank.load();
  int n;
  switch (level) {
    case RO_LOG_WARN:
      n = snprintf(out, sizeof out, "%s:%d:%d [%d] %s:%d NCCL WARN %s\n", gHost, pid, tid, rank, file ? file : "?",
                   line, msg);
      break;
    case RO_LOG_TRACE:
      n = snprintf(out, sizeof out, "%s:%d:%d [%d] %.6f %s:%d NCCL TRACE %s\n", gHost, pid, tid, rank,
                   double(nowUs() - gLogEpochUs) / 1e3, file ? file : "?", line, msg);
      break;
    case RO_LOG_VERSION:
      n = snprintf(out, sizeof out, "%s:%d:%d [%d] NCCL VERSION %s\n", gHost, pid, tid, rank, msg);
      break;
    default:
      n = snprintf(out, sizeof out, "%s:%d:%d [%d] NCCL INFO %s\n", gHost, pid, tid, rank, msg);
  }
  if (n > 0) fwrite(out, 1, size_t(n) < sizeof out ? size_t(n) : sizeof out - 1, stderr);
}

extern "C" ncclResult_t rperfProfiler(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData) {
  gProfEvents.fetch_add(1, std::memory_order_relaxed);
  if (eHandle) *eHandle = nullptr;
  return ncclSuccess;
}
uint64_t profilerEvents() { return gProfEvents.load(); }
uint64_t pluginInitCalls() { return gPluginInits.load(); }

}  // namespace rperf
