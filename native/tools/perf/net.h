// railover-perf: loading an NCCL net plugin and calling it through one ABI-neutral interface.
//
// Plugin::load() does what NCCL does: dlopen(path, RTLD_NOW|RTLD_LOCAL), then looks up the data
// symbols ncclNetPlugin_v12, v11, ... v7 (newest first) or only the forced version. Each
// version's table is wrapped by an adapter (net.cc) implementing NetAbi:
//   - sizes are size_t here; int-sized versions (v7/v8 isend/irecv, v7 regMr) are range-checked
//     like NCCL's compat shims (messages <= 1 GiB, registrations < 2 GiB);
//   - v7/v8: the optional-receive-completion marker is cleared before irecv (NCCL's shim does);
//     v9+: the marker reaches the plugin, which must overwrite *request;
//   - v10: init(logger, profiler), connect(dev, config, ...), isend/irecv profiler handles;
//   - v11/v12: init(ctx, commId, config, logger, profiler) per context, finalize(ctx);
//   - <= v10: like NCCL's shim, the plugin's init runs once per load; contexts are the
//     adapter's own objects (v10: holding the traffic-class config passed to connect).
// Plugin adds the bookkeeping every call needs: per-function call counters, the "call in
// progress" record the watchdog reads, and turning non-success into a Fatal error naming the
// call (exit code 3).
//
// Thread-safety: NetAbi adapters are as thread-safe as the plugin (NCCL's contract: several
// threads may call concurrently). Plugin's counters are atomics; load/reload/unload must not
// race with any other call (the driver calls them with no comm open).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "abi/nccl_net_abi.h"

namespace rperf {

// Largest message an int-sized ABI version may carry (NCCL's MAX_NET_SIZE, 1 GiB).
constexpr size_t kIntAbiMaxMessage = size_t(1) << 30;

// Version-independent copy of a device's properties (fields absent in an ABI keep defaults).
struct NetProps {
  std::string name, pciPath;
  uint64_t guid = 0;
  int ptrSupport = 0, regIsGlobal = -1, forceFlush = -1, speed = 0, port = 0;
  float latency = 0;
  int maxComms = 0, maxRecvs = 0, netDeviceType = 0, netDeviceVersion = 0;
  std::vector<int> vDevs;                       // v9+: fused members (empty before v9)
  size_t maxP2pBytes = 0, maxCollBytes = 0;     // v9+: 0 = not reported by this ABI
  int maxMultiRequestSize = -1;                 // v11+
  int railId = -1, planeId = -1;                // v12
};

// One ABI version's function table behind a common signature set (see file comment).
class NetAbi {
 public:
  virtual ~NetAbi() = default;
  virtual int version() const = 0;
  virtual const char* name() const = 0;
  // v11+: plugin init per call. <= v10: plugin init on the first call of this load only
  // (never when skipPluginInit, emulating NCCL 2.22-2.23 after a reload).
  virtual ncclResult_t init(void** ctx, uint64_t commId, ncclNetCommConfig_t* config) = 0;
  virtual ncclResult_t finalize(void* ctx) = 0;
  virtual ncclResult_t devices(int* ndev) = 0;
  virtual ncclResult_t getProperties(int dev, NetProps* props) = 0;
  virtual ncclResult_t listen(void* ctx, int dev, void* handle, void** listenComm) = 0;
  virtual ncclResult_t connect(void* ctx, int dev, void* handle, void** sendComm,
                               ncclNetDeviceHandle_t** devHandle) = 0;
  virtual ncclResult_t accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** devHandle) = 0;
  virtual ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) = 0;
  virtual ncclResult_t deregMr(void* comm, void* mhandle) = 0;
  virtual ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                             void** request) = 0;
  virtual ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                             void** phandles, void** request) = 0;
  virtual ncclResult_t test(void* request, int* done, int* sizes) = 0;
  virtual ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) = 0;
  virtual ncclResult_t closeSend(void* sendComm) = 0;
  virtual ncclResult_t closeRecv(void* recvComm) = 0;
  virtual ncclResult_t closeListen(void* listenComm) = 0;
  virtual bool hasIrecvConsumed() const = 0;
  virtual ncclResult_t irecvConsumed(void* recvComm, int n, void* request) = 0;
  virtual bool hasSetNetAttr() const = 0;
  virtual ncclResult_t setNetAttr(void* ctx, ncclNetAttr_t* attr) = 0;
  virtual bool hasFinalize() const = 0;  // v11+: table's finalize non-NULL; <= v10: true (shim)
  // Largest single message this ABI can carry (int versions: 1 GiB).
  virtual size_t maxMessageBytes() const = 0;
  void setSkipPluginInit(bool v) { skipPluginInit_ = v; }

 protected:
  bool skipPluginInit_ = false;
};

// Identifiers for per-call statistics and the watchdog.
enum Fn : int {
  kFnInit, kFnFinalize, kFnDevices, kFnGetProperties, kFnListen, kFnConnect, kFnAccept, kFnRegMr,
  kFnDeregMr, kFnIsend, kFnIrecv, kFnTest, kFnCloseSend, kFnCloseRecv, kFnCloseListen, kFnIrecvConsumed,
  kFnSetNetAttr, kFnIflush, kFnCount
};
const char* fnName(int fn);

// Records, per thread, which plugin call is running and since when; the watchdog (engine)
// reports a call blocked for longer than --op-timeout. Thread-safe.
class CallTracker {
 public:
  struct Slot {
    std::string thread;
    std::atomic<uint64_t> sinceUs{0};  // 0 = not inside a plugin call
    std::atomic<int> fn{-1};
  };
  static CallTracker& get();
  // Registers the calling thread (idempotent per thread); name shows in reports.
  void registerThread(const std::string& name);
  Slot* mine();
  // Calls f(slot) for every registered slot.
  void forEach(const std::function<void(Slot&)>& f);

 private:
  std::mutex mu_;
  std::deque<std::unique_ptr<Slot>> slots_;
};

// The loaded plugin. All call wrappers return true on ncclSuccess; otherwise they raise a Fatal
// error "<call> failed: <result> (<context>)" and return false.
class Plugin {
 public:
  Plugin() = default;
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  // dlopen + symbol choice. forceAbi = 0: newest available; else exactly that version.
  bool load(const std::string& path, int forceAbi, std::string* err);
  // dlclose then dlopen again, re-resolving the same ABI version (NCCL's unload after the last
  // communicator). skipInit: emulate NCCL 2.22-2.23, which do not call init after a reload.
  bool reload(bool skipInit, std::string* err);
  void unload();
  int abi() const { return net_ ? net_->version() : 0; }
  std::string name() const { return net_ && net_->name() ? net_->name() : ""; }
  const std::string& path() const { return path_; }
  std::vector<int> availableVersions() const { return available_; }
  NetAbi* raw() { return net_.get(); }
  int loads() const { return loads_; }

  bool init(void** ctx, uint64_t commId, ncclNetCommConfig_t* config);
  bool finalize(void* ctx);
  bool devices(int* n);
  bool getProperties(int dev, NetProps* p);
  bool listen(void* ctx, int dev, void* handle, void** lc, const std::string& what);
  bool connect(void* ctx, int dev, void* handle, void** sc, const std::string& what);
  bool accept(void* lc, void** rc, const std::string& what);
  bool regMr(void* comm, void* data, size_t size, void** mh, const std::string& what);
  bool deregMr(void* comm, void* mh, const std::string& what);
  bool isend(void* sc, void* data, size_t size, int tag, void* mh, void* ph, void** req, const std::string& what);
  bool irecv(void* rc, void* data, size_t size, int tag, void* mh, void* ph, void** req, const std::string& what);
  // A grouped receive of n (1..8) buffers, one request (NCCL's shared comms: tags[i] names the
  // sender whose message goes into buffer i).
  bool irecvGroup(void* rc, int n, void** datas, size_t* sizes, int* tags, void** mhs, void** phs, void** req,
                  const std::string& what);
  bool test(void* req, int* done, int* size, const std::string& what);
  // NCCL's flush after a GPUDirect receive: one buffer of `size` received bytes. *req NULL:
  // nothing to flush (counted in nulls(kFnIflush)).
  bool iflush(void* rc, int n, void** datas, int* sizes, void** mhs, void** req, const std::string& what);
  bool closeSend(void* sc, const std::string& what);
  bool closeRecv(void* rc, const std::string& what);
  bool closeListen(void* lc, const std::string& what);
  bool irecvConsumed(void* rc, void* req, const std::string& what);
  bool setNetAttr(void* ctx, ncclNetAttr_t* attr);

  // Statistics (monotonic over the process, across reloads).
  uint64_t calls(int fn) const { return calls_[fn].load(std::memory_order_relaxed); }
  uint64_t nulls(int fn) const { return nulls_[fn].load(std::memory_order_relaxed); }
  void countNull(int fn) { nulls_[fn].fetch_add(1, std::memory_order_relaxed); }

 private:
  bool check(int fn, ncclResult_t r, const std::string& what);
  void enter(int fn);
  void leave();

  std::string path_;
  void* dl_ = nullptr;
  int version_ = 0;
  int forced_ = 0;
  int loads_ = 0;
  std::vector<int> available_;
  std::unique_ptr<NetAbi> net_;
  std::atomic<uint64_t> calls_[kFnCount] = {};
  std::atomic<uint64_t> nulls_[kFnCount] = {};
};

const char* resultName(ncclResult_t r);

// NCCL-style logger handed to the plugin: prints "host:pid:tid [rank] NCCL LEVEL msg" lines to
// stderr according to NCCL_DEBUG (VERSION/WARN/INFO/TRACE; unset = WARN) and NCCL_DEBUG_SUBSYS
// (INIT, NET, PROXY, ALL, comma list, leading ^ excludes). Thread-safe.
void loggerConfigure(int rank);
extern "C" void rperfLogger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                            const char* fmt, ...);
// Profiler callback handed to v10+ plugins: counts events, sets *eHandle to NULL.
extern "C" ncclResult_t rperfProfiler(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData);
uint64_t profilerEvents();
// Times the plugin's own init ran (for <= v10 fewer than Plugin::calls(kFnInit), which counts
// contexts created through the adapter).
uint64_t pluginInitCalls();

}  // namespace rperf
