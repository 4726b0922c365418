#include "transport/verbs/verbs_api.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

namespace railover {
namespace verbs {

namespace {
VerbsApi g_api;
bool g_loaded = false;
std::string g_err;
std::mutex g_mu;
int g_forkRc = -1;

// Where symbols come from: dlsym on a handle, or a lookup function (loadVerbsApiWith).
struct Syms {
  void* h = nullptr;
  void* (*lookup)(const char*) = nullptr;
  void* get(const char* name) const { return lookup ? lookup(name) : dlsym(h, name); }
};

template <typename F>
bool sym(const Syms& h, const char* name, F* out, std::string* err) {
  void* p = h.get(name);
  if (!p) {
    *err = std::string("libibverbs has no symbol ") + name;
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

template <typename F>
bool optionalSym(const Syms& h, const char* name, F* out) {
  *out = reinterpret_cast<F>(h.get(name));  // nullptr when absent
  return true;
}

bool resolve(const Syms& h, VerbsApi* a, std::string* err) {
  return sym(h, "ibv_get_device_list", &a->get_device_list, err) &&
         sym(h, "ibv_free_device_list", &a->free_device_list, err) &&
         sym(h, "ibv_get_device_name", &a->get_device_name, err) && sym(h, "ibv_open_device", &a->open_device, err) &&
         sym(h, "ibv_close_device", &a->close_device, err) && sym(h, "ibv_alloc_pd", &a->alloc_pd, err) &&
         sym(h, "ibv_dealloc_pd", &a->dealloc_pd, err) && sym(h, "ibv_reg_mr", &a->reg_mr, err) &&
         sym(h, "ibv_dereg_mr", &a->dereg_mr, err) &&
         sym(h, "ibv_create_comp_channel", &a->create_comp_channel, err) &&
         sym(h, "ibv_destroy_comp_channel", &a->destroy_comp_channel, err) &&
         sym(h, "ibv_get_cq_event", &a->get_cq_event, err) && sym(h, "ibv_ack_cq_events", &a->ack_cq_events, err) &&
         sym(h, "ibv_create_cq", &a->create_cq, err) && sym(h, "ibv_destroy_cq", &a->destroy_cq, err) &&
         sym(h, "ibv_create_qp", &a->create_qp, err) && sym(h, "ibv_destroy_qp", &a->destroy_qp, err) &&
         sym(h, "ibv_modify_qp", &a->modify_qp, err) && sym(h, "ibv_query_qp", &a->query_qp, err) &&
         sym(h, "ibv_get_async_event", &a->get_async_event, err) &&
         sym(h, "ibv_ack_async_event", &a->ack_async_event, err) &&
         sym(h, "ibv_query_device", &a->query_device, err) && sym(h, "ibv_query_port", &a->query_port_compat, err) &&
         sym(h, "_ibv_query_gid_ex", &a->query_gid_ex, err) &&
         sym(h, "ibv_query_pkey", &a->query_pkey, err) && sym(h, "ibv_wc_status_str", &a->wc_status_str, err) &&
         sym(h, "ibv_event_type_str", &a->event_type_str, err) &&
         sym(h, "ibv_port_state_str", &a->port_state_str, err) && optionalSym(h, "ibv_reg_dmabuf_mr", &a->reg_dmabuf_mr) &&
         optionalSym(h, "ibv_fork_init", &a->fork_init) && optionalSym(h, "ibv_reg_mr_iova2", &a->reg_mr_iova2);
}

// On the first load, before the table is handed out (so before any device is listed or memory
// registered: libibverbs refuses a late ibv_fork_init); a table loaded again (tests) does not
// call it again. g_mu held.
void forkInit(const VerbsApi& a) {
  if (!g_loaded) g_forkRc = a.fork_init ? a.fork_init() : -1;
}

bool load(const Syms& s, std::string* err) {
  std::lock_guard<std::mutex> g(g_mu);
  VerbsApi a{};
  if (!resolve(s, &a, err)) return false;
  forkInit(a);
  g_api = a;
  g_loaded = true;
  g_err.clear();
  return true;
}
}  // namespace

bool loadVerbsApi(void* handle, std::string* err) {
  Syms s;
  s.h = handle;
  return load(s, err);
}

bool loadVerbsApiWith(void* (*lookup)(const char* name), std::string* err) {
  Syms s;
  s.lookup = lookup;
  return load(s, err);
}

const VerbsApi* verbsApi(std::string* err) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_loaded) return &g_api;
  if (!g_err.empty()) {  // tried and failed: do not dlopen again on every call
    if (err) *err = g_err;
    return nullptr;
  }
  void* h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    g_err = std::string("cannot load libibverbs.so.1 (install rdma-core's libibverbs1): ") + (e ? e : "?");
  } else if (VerbsApi a{}; resolve(Syms{h, nullptr}, &a, &g_err)) {
    forkInit(a);
    g_api = a;
    g_loaded = true;
    return &g_api;
  }
  if (err) *err = g_err;
  return nullptr;
}

int forkInitResult() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_forkRc;
}

int queryPort(const VerbsApi& api, ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  std::memset(attr, 0, sizeof *attr);
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx) return vctx->query_port(ctx, port, attr, sizeof *attr);
  return api.query_port_compat(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

}  // namespace verbs
}  // namespace railover
