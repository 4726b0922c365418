// libibverbs reached through dlopen: the verbs layer calls every exported libibverbs function
// through this table, so a binary built with it (the plugin, later) still loads and runs its TCP
// transport where rdma-core is absent. The calls verbs.h implements inline (post send/receive,
// poll and arm a CQ) go through the context's ops and need no symbol.
//
// verbsApi() opens "libibverbs.so.1" once (thread-safe) and resolves the table; nullptr with
// *err naming what is missing. loadVerbsApi(handle) resolves the table from an already opened
// handle instead (tests pass RTLD_DEFAULT to use a fake provider linked into the test binary);
// call it before the first verbsApi().
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace railover {
namespace verbs {

struct VerbsApi {
  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  int (*dereg_mr)(ibv_mr*);
  ibv_comp_channel* (*create_comp_channel)(ibv_context*);
  int (*destroy_comp_channel)(ibv_comp_channel*);
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ack_cq_events)(ibv_cq*, unsigned int);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*destroy_qp)(ibv_qp*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  int (*query_qp)(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*);
  int (*get_async_event)(ibv_context*, ibv_async_event*);
  void (*ack_async_event)(ibv_async_event*);
  int (*query_device)(ibv_context*, ibv_device_attr*);
  // The exported (compat) port query; queryPort() below prefers the context's extended op.
  int (*query_port_compat)(ibv_context*, uint8_t, _compat_ibv_port_attr*);
  int (*query_gid_ex)(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t);
  int (*query_pkey)(ibv_context*, uint8_t, int, __be16*);
  const char* (*wc_status_str)(ibv_wc_status);
  const char* (*event_type_str)(ibv_event_type);
  const char* (*port_state_str)(ibv_port_state);
  // Optional (nullptr when this libibverbs predates it, rdma-core < 34): registers a dmabuf
  // (GPU memory exported by the CUDA driver) for NCCL's regMrDmaBuf.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t offset, size_t length, uint64_t iova, int fd, int access);
  // Optional: ibv_fork_init. Loading the table calls it once, before anything else of libibverbs
  // (as NCCL's IB transport does at init): registered memory stays out of a forked child's
  // copy-on-write on kernels that do not copy pinned pages at fork (on those that do, rdma-core
  // makes it a no-op). Its result: forkInitResult().
  int (*fork_init)(void);
  // Optional (nullptr when this libibverbs predates it: rdma-core < 28, symbol version
  // IBVERBS_1.8): ibv_reg_mr with an explicit iova, the call that takes optional access flags.
  // NCCL's IB transport registers its buffers with it and IBV_ACCESS_RELAXED_ORDERING, and takes
  // its presence as the capability (NCCL_IB_PCI_RELAXED_ORDERING; verbs_config.h,
  // relaxedOrderingChoice; verbs_mr.h).
  ibv_mr* (*reg_mr_iova2)(ibv_pd*, void*, size_t, uint64_t iova, unsigned int access);
};

const VerbsApi* verbsApi(std::string* err);
bool loadVerbsApi(void* handle, std::string* err);
// The same with every symbol looked up through `lookup` (tests: a fake provider that leaves an
// optional symbol out, as an older libibverbs would). May be called again to replace the table
// (before anything uses it, or while nothing does); ibv_fork_init runs on the first load only.
bool loadVerbsApiWith(void* (*lookup)(const char* name), std::string* err);
// What the load's ibv_fork_init returned (0: done or not needed; an errno value; -1 when this
// libibverbs has no ibv_fork_init or the table is not loaded). Registration goes on either way,
// as with NCCL, which only warns.
int forkInitResult();

// What verbs.h's inline ibv_query_port does, through the table: the extended op of the context
// when the provider has one, else the exported compat call.
int queryPort(const VerbsApi& api, ibv_context* ctx, uint8_t port, ibv_port_attr* attr);

}  // namespace verbs
}  // namespace railover
