// railover's one internal plugin API. The ABI adapters (abi/adapters.cc) convert every NCCL
// ABI version (v7..v12) onto these functions; nothing below this layer knows the versions.
//
// Contracts (NCCL's): listen/connect/accept/isend/irecv/test never block; a NULL comm or
// request means "call again". connect returns its comm no later than the peer's accept can
// (or fails at once when the receiver closed); a listen comm accepts any number of
// connections; irecv takes up to maxRecvs buffers with tags (a grouped receive, see
// docs/PROTOCOL.md; maxRecvs is RAILOVER_MAX_RECVS, default 1, at most kMaxRecvs = 8). Errors: ncclInvalidArgument for bad input (unknown device, malformed
// handle), ncclInternalError for the caller's misuse (NCCL's plugin documentation: a comm or
// request that is not ours, n outside 1..maxRecvs, sends whose tags match no buffer of their
// grouped receive), ncclSystemError when the network is unusable past RAILOVER_FATAL_TIMEOUT
// or the peer exited or closed the comm with requests pending (or the process exits, with
// RAILOVER_ABORT_ON_FATAL=1), ncclInvalidUsage for a message larger than its posted receive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "abi/nccl_net_abi.h"

namespace railover {
namespace api {

// Superset of every version's device properties.
struct Props {
  const char* name;
  const char* pciPath;  // nullptr for virtual NICs
  uint64_t guid;
  int ptrSupport, speed, port, maxComms, maxRecvs;
  float latency;
  size_t maxP2pBytes, maxCollBytes;
  int16_t railId, planeId;
};

ncclResult_t init(ncclDebugLogger_t logger);
ncclResult_t devices(int* n);
ncclResult_t getProperties(int dev, Props* p);
ncclResult_t listen(int dev, void* handle, void** listenComm);
// trafficClass: ncclNetCommConfig_t.trafficClass (v10 connect; v11+ the init context's), -1 = none.
ncclResult_t connect(int dev, void* handle, void** sendComm, int trafficClass = -1);
ncclResult_t accept(void* listenComm, void** recvComm);
ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
ncclResult_t deregMr(void* comm, void* mhandle);
ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags, void** mhandles,
                   void** request);
ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
ncclResult_t test(void* request, int* done, int* sizes);
ncclResult_t closeSend(void* sendComm);
ncclResult_t closeRecv(void* recvComm);
ncclResult_t closeListen(void* listenComm);

// v11+ per-communicator contexts: refcounted; finalize accepts NULL and contexts of failed inits.
// trafficClass: the init config's (-1 = none); ctxTrafficClass(ctx) gives it back for connect.
ncclResult_t initCtx(void** ctx, uint64_t commId, ncclDebugLogger_t logger, int trafficClass = -1);
ncclResult_t finalizeCtx(void* ctx);
int ctxTrafficClass(void* ctx);

}  // namespace api
}  // namespace railover
