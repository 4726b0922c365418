// ABI adapters: one ncclNetPlugin_vN table per NCCL ABI version (v7..v12), each converting
// its argument types onto railover's internal API (plugin/api.h). These six data symbols are
// the only symbols the plugin exports (exports.map).
#include <cstring>

#include "abi/nccl_net_abi.h"
#include "failover/link.h"
#include "plugin/api.h"

using namespace railover;

namespace {

template <typename P>
void fillBase(const api::Props& in, P* out) {
  out->name = (char*)in.name;
  out->pciPath = (char*)in.pciPath;
  out->guid = in.guid;
  out->ptrSupport = in.ptrSupport;
  out->speed = in.speed;
  out->port = in.port;
  out->latency = in.latency;
  out->maxComms = in.maxComms;
  out->maxRecvs = in.maxRecvs;
  out->netDeviceType = RO_NET_DEVICE_HOST;
  out->netDeviceVersion = 0;
}

template <typename P>
void fillV9(const api::Props& in, int dev, P* out) {
  fillBase(in, out);
  out->regIsGlobal = 0;
  out->forceFlush = 0;
  out->vProps.ndevs = 1;
  out->vProps.devs[0] = dev;
  out->maxP2pBytes = in.maxP2pBytes;
  out->maxCollBytes = in.maxCollBytes;
}

ncclResult_t props7(int dev, ncclNetProperties_v7_t* p) {
  api::Props in;
  memset(p, 0, sizeof(*p));
  ncclResult_t r = api::getProperties(dev, &in);
  if (r == ncclSuccess) fillBase(in, p);
  return r;
}
ncclResult_t props8(int dev, ncclNetProperties_v8_t* p) {
  api::Props in;
  memset(p, 0, sizeof(*p));
  ncclResult_t r = api::getProperties(dev, &in);
  if (r == ncclSuccess) fillBase(in, p), p->regIsGlobal = 0;
  return r;
}
ncclResult_t props9(int dev, ncclNetProperties_v9_t* p) {
  api::Props in;
  memset(p, 0, sizeof(*p));
  ncclResult_t r = api::getProperties(dev, &in);
  if (r == ncclSuccess) fillV9(in, dev, p);
  return r;
}
ncclResult_t props11(int dev, ncclNetProperties_v11_t* p) {
  api::Props in;
  memset(p, 0, sizeof(*p));
  ncclResult_t r = api::getProperties(dev, &in);
  if (r == ncclSuccess) fillV9(in, dev, p), p->maxMultiRequestSize = 1;
  return r;
}
ncclResult_t props12(int dev, ncclNetProperties_v12_t* p) {
  api::Props in;
  memset(p, 0, sizeof(*p));
  ncclResult_t r = api::getProperties(dev, &in);
  if (r == ncclSuccess) fillV9(in, dev, p), p->maxMultiRequestSize = 1, p->railId = in.railId, p->planeId = in.planeId;
  return r;
}

// ---- shared shims --------------------------------------------------------------------------
ncclResult_t init7(ncclDebugLogger_t l) { return api::init(l); }
ncclResult_t init10(ncclDebugLogger_t l, ncclProfilerCallback_t) { return api::init(l); }
ncclResult_t init11(void** ctx, uint64_t commId, ncclNetCommConfig_t* cfg, ncclDebugLogger_t l,
                    ncclProfilerCallback_t) {
  return api::initCtx(ctx, commId, l, cfg ? cfg->trafficClass : -1);
}
ncclResult_t listen7(int dev, void* h, void** lc) { return api::listen(dev, h, lc); }
ncclResult_t listen11(void*, int dev, void* h, void** lc) { return api::listen(dev, h, lc); }
ncclResult_t connect7(int dev, void* h, void** sc, ncclNetDeviceHandle_t**) { return api::connect(dev, h, sc); }
ncclResult_t connect10(int dev, ncclNetCommConfig_t* cfg, void* h, void** sc, ncclNetDeviceHandle_t**) {
  return api::connect(dev, h, sc, cfg ? cfg->trafficClass : -1);
}
ncclResult_t connect11(void* ctx, int dev, void* h, void** sc, ncclNetDeviceHandle_t**) {
  return api::connect(dev, h, sc, api::ctxTrafficClass(ctx));
}
ncclResult_t accept7(void* lc, void** rc, ncclNetDeviceHandle_t**) { return api::accept(lc, rc); }
ncclResult_t regMrInt(void* c, void* d, int size, int type, void** mh) {
  if (size < 0) return ncclInvalidArgument;
  return api::regMr(c, d, (size_t)size, type, mh);
}
ncclResult_t regMrSz(void* c, void* d, size_t size, int type, void** mh) { return api::regMr(c, d, size, type, mh); }
ncclResult_t isendInt(void* sc, void* d, int size, int tag, void* mh, void** req) {
  if (size < 0) return *req = nullptr, ncclInvalidArgument;
  return api::isend(sc, d, (size_t)size, tag, mh, req);
}
ncclResult_t isendSz(void* sc, void* d, size_t size, int tag, void* mh, void** req) {
  return api::isend(sc, d, size, tag, mh, req);
}
ncclResult_t isend10(void* sc, void* d, size_t size, int tag, void* mh, void*, void** req) {
  return api::isend(sc, d, size, tag, mh, req);
}
ncclResult_t irecvInt(void* rc, int n, void** d, int* sizes, int* tags, void** mh, void** req) {
  // n beyond maxRecvs or a negative size: the caller's misuse (NCCL's plugin contract:
  // ncclInternalError); api::irecv names the bad n.
  if (n < 1 || n > kMaxRecvs) return api::irecv(rc, n, d, nullptr, tags, mh, req);
  size_t s[kMaxRecvs];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) return *req = nullptr, ncclInternalError;
    s[i] = (size_t)sizes[i];
  }
  return api::irecv(rc, n, d, s, tags, mh, req);
}
ncclResult_t irecvSz(void* rc, int n, void** d, size_t* sizes, int* tags, void** mh, void** req) {
  return api::irecv(rc, n, d, sizes, tags, mh, req);
}
ncclResult_t irecv10(void* rc, int n, void** d, size_t* sizes, int* tags, void** mh, void**, void** req) {
  return api::irecv(rc, n, d, sizes, tags, mh, req);
}

}  // namespace

#define RO_COMMON_TAIL                                                                                       \
  api::iflush, api::test, api::closeSend, api::closeRecv, api::closeListen, nullptr /* getDeviceMr */, \
      nullptr /* irecvConsumed */

extern "C" {

__attribute__((visibility("default"))) ncclNet_v7_t ncclNetPlugin_v7 = {
    "railover", init7,     api::devices, props7,   listen7,  connect7, accept7,
    regMrInt,   api::regMrDmaBuf, api::deregMr, isendInt, irecvInt, RO_COMMON_TAIL};

__attribute__((visibility("default"))) ncclNet_v8_t ncclNetPlugin_v8 = {
    "railover", init7,     api::devices, props8,   listen7,  connect7, accept7,
    regMrSz,    api::regMrDmaBuf, api::deregMr, isendInt, irecvInt, RO_COMMON_TAIL};

__attribute__((visibility("default"))) ncclNet_v9_t ncclNetPlugin_v9 = {
    "railover", init7,     api::devices, props9,  listen7, connect7, accept7,
    regMrSz,    api::regMrDmaBuf, api::deregMr, isendSz, irecvSz, RO_COMMON_TAIL, nullptr /* makeVDevice */};

__attribute__((visibility("default"))) ncclNet_v10_t ncclNetPlugin_v10 = {
    "railover", init10,    api::devices, props9,  listen7, connect10, accept7,
    regMrSz,    api::regMrDmaBuf, api::deregMr, isend10, irecv10, RO_COMMON_TAIL, nullptr /* makeVDevice */};

__attribute__((visibility("default"))) ncclNet_v11_t ncclNetPlugin_v11 = {
    "railover", init11, api::devices, props11, listen11, connect11, accept7, regMrSz, api::regMrDmaBuf, api::deregMr,
    isend10, irecv10, RO_COMMON_TAIL, nullptr /* makeVDevice */, api::finalizeCtx, nullptr /* setNetAttr */};

__attribute__((visibility("default"))) ncclNet_v12_t ncclNetPlugin_v12 = {
    "railover", init11, api::devices, props12, listen11, connect11, accept7, regMrSz, api::regMrDmaBuf, api::deregMr,
    isend10, irecv10, RO_COMMON_TAIL, nullptr /* makeVDevice */, api::finalizeCtx, nullptr /* setNetAttr */};

}  // extern "C"
