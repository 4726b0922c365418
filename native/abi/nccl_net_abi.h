// railover's own declarations of the NCCL network-plugin ABI, versions 7 to 12.
//
// Written from the documented facts in docs/ (field order, types and sizes of each
// version's function table and properties struct), not copied from NCCL. Every layout
// here is checked by the static_asserts at the end of this file against the sizes the
// ABI implies on LP64 Linux.
//
// Thread-safety: these are plain data declarations.
#pragma once

#include <cstddef>
#include <cstdint>

// ---- results and constants -------------------------------------------------------------
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

// Bytes NCCL reserves for a listen handle (all ABI versions).
#define RAILOVER_NCCL_HANDLE_MAXSIZE 128
// Requests NCCL may keep in flight per comm (2.19+).
#define RAILOVER_NCCL_MAX_REQUESTS 32
// Pointer kinds (bit flags in ptrSupport and the type argument of regMr).
#define RAILOVER_NCCL_PTR_HOST 0x1
#define RAILOVER_NCCL_PTR_CUDA 0x2
#define RAILOVER_NCCL_PTR_DMABUF 0x4
// Value NCCL 2.24+ stores in *request before irecv when completion is optional.
#define RAILOVER_NCCL_OPTIONAL_RECV_COMPLETION ((void*)0x1)
// Largest value NCCL accepts for maxP2pBytes / maxCollBytes (1 TiB).
#define RAILOVER_NCCL_MAX_NET_SIZE_BYTES (1ULL << 40)

// Logger levels and subsystem flags NCCL's logger understands.
typedef enum {
  RO_LOG_NONE = 0,
  RO_LOG_VERSION = 1,
  RO_LOG_WARN = 2,
  RO_LOG_INFO = 3,
  RO_LOG_ABORT = 4,
  RO_LOG_TRACE = 5,
} ncclDebugLogLevel;
enum : unsigned long { RO_SUBSYS_INIT = 0x1, RO_SUBSYS_NET = 0x10, RO_SUBSYS_ALL = ~0UL };

// (level, subsystem mask, source file, line, printf format, ...)
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);
// v10+: (event handle out, event kind, parent handle from isend/irecv, plugin id, extra data)
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle, int64_t pluginId,
                                               void* extData);

typedef enum { RO_NET_DEVICE_HOST = 0, RO_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

// Device-offload handle (v7+); host-only plugins never create one.
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_t;

// v10 connect argument / v11+ init argument.
typedef struct {
  int trafficClass;  // -1 = unset
} ncclNetCommConfig_t;

// v11+ setNetAttr argument.
typedef struct {
  int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer;
} ncclNetCommAttr_t;
typedef struct {
  ncclNetCommAttr_t sendCommAttr, recvCommAttr;
  uint32_t op, algo, proto;
} ncclNetAttr_t;

// ---- properties, one struct per layout ----------------------------------------------------
// v7: base fields.
typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;  // Mbps
  int port;
  float latency;  // µs, 0 = NCCL default
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v7_t;

// v8: v7 + regIsGlobal after ptrSupport.
typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

template <int N>
struct roVDeviceProps {
  int ndevs;
  int devs[N];
};
typedef roVDeviceProps<4> ncclNetVDeviceProps_v9_t;   // v9, v10, v11
typedef roVDeviceProps<8> ncclNetVDeviceProps_v12_t;  // v12

// v9 and v10: + forceFlush, vProps, maxP2pBytes, maxCollBytes.
typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} ncclNetProperties_v9_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

// v11: + maxMultiRequestSize.
typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
} ncclNetProperties_v11_t;

// v12: 8-entry vProps, + railId, planeId (int16, -1 = unknown).
typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
} ncclNetProperties_v12_t;

// ---- function tables -----------------------------------------------------------------------
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v7_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v7_t;

// v8: regMr takes size_t; properties v8.
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;

// v9: isend/irecv sizes become size_t; makeVDevice appended.
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;

// v10: init takes a profiler callback, connect a comm config, isend/irecv profiler handles.
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger, ncclProfilerCallback_t prof);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                        void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v10_t;

// v11 and v12 share one function list; only the properties / vProps types differ.
template <typename Props, typename VProps>
struct roNetCtxTable {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_t* config, ncclDebugLogger_t logger,
                       ncclProfilerCallback_t prof);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, Props* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                        void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, VProps* props);
  ncclResult_t (*finalize)(void* ctx);             // must not be NULL (NCCL calls it unconditionally)
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_t* attr);  // may be NULL
};
typedef roNetCtxTable<ncclNetProperties_v11_t, ncclNetVDeviceProps_v9_t> ncclNet_v11_t;
typedef roNetCtxTable<ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t> ncclNet_v12_t;

// Layout checks (LP64: pointer and size_t 8 bytes, int 4, natural alignment).
static_assert(sizeof(ncclNetProperties_v7_t) == 56, "v7 properties layout");
static_assert(sizeof(ncclNetProperties_v8_t) == 64, "v8 properties layout");
static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64, "v9 vProps offset");
static_assert(sizeof(ncclNetProperties_v9_t) == 104, "v9 properties layout");
static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 properties layout");
static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "v12 railId offset");
static_assert(sizeof(ncclNetProperties_v12_t) == 128, "v12 properties layout");
static_assert(sizeof(ncclNet_v7_t) == 19 * 8, "v7 table has 19 members");
static_assert(sizeof(ncclNet_v9_t) == 20 * 8, "v9 table has 20 members");
static_assert(sizeof(ncclNet_v12_t) == 22 * 8, "v12 table has 22 members");
