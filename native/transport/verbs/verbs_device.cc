#include "transport/verbs/verbs_device.h"

#include "transport/verbs/verbs_config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <endian.h>
#include <limits.h>
#include <stdlib.h>
#include <time.h>

#include <cerrno>
#include <cstring>

namespace railover {
namespace verbs {

uint64_t nowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000u + static_cast<uint64_t>(ts.tv_nsec) / 1000u;
}

std::string gidString(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET6, g.raw, buf, sizeof buf);
  return buf;
}

int portSpeedMbps(uint8_t activeSpeed, uint8_t activeWidth) {
  int lane = 0;
  switch (activeSpeed) {
    case 1: lane = 2500; break;     // SDR
    case 2: lane = 5000; break;     // DDR
    case 4: lane = 10000; break;    // QDR
    case 8: lane = 10000; break;    // FDR10
    case 16: lane = 14000; break;   // FDR
    case 32: lane = 25000; break;   // EDR
    case 64: lane = 50000; break;   // HDR
    case 128: lane = 100000; break; // NDR
    default: return 0;
  }
  int lanes = 0;
  switch (activeWidth) {
    case 1: lanes = 1; break;
    case 16: lanes = 2; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    default: return 0;
  }
  return lane * lanes;
}

namespace {

bool isV4Mapped(const ibv_gid& g, in_addr* a) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(g.raw, prefix, 12) != 0) return false;
  if (a) std::memcpy(&a->s_addr, g.raw + 12, 4);
  return true;
}

struct DevList {
  const VerbsApi& api;
  ibv_device** list = nullptr;
  int n = 0;
  explicit DevList(const VerbsApi& a) : api(a) { list = api.get_device_list(&n); }
  ~DevList() {
    if (list) api.free_device_list(list);
  }
};

// Fills the port fields of *out from an opened context. false + *err if the port is unusable.
bool fillPort(const VerbsApi& api, ibv_context* ctx, int port, PortSel* out, std::string* err) {
  ibv_port_attr pa{};
  if (queryPort(api, ctx, static_cast<uint8_t>(port), &pa) != 0) {
    *err = "ibv_query_port(" + out->dev + ", port " + std::to_string(port) + "): " + std::strerror(errno);
    return false;
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    *err = "HCA " + out->dev + " port " + std::to_string(port) + " is " + api.port_state_str(pa.state) +
           ", not ACTIVE";
    return false;
  }
  out->port = port;
  out->roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  out->lid = pa.lid;
  out->activeMtu = pa.active_mtu;
  out->speedMbps = portSpeedMbps(pa.active_speed, pa.active_width);
  return true;
}

}  // namespace

bool findPortForNetdev(const std::string& netdev, PortSel* out, std::string* err) {
  // NCCL's defaults (IbConfig's initial values): every HCA, automatic RoCE v2 IPv4 GID.
  return choosePortForNetdev(netdev, IbConfig{}, out, err) == PortChoice::kChosen;
}

bool findPortByDevice(const std::string& dev, int port, int gidIndex, PortSel* out, std::string* err) {
  const VerbsApi* a = verbsApi(err);
  if (!a) return false;
  const VerbsApi& api = *a;
  DevList dl(api);
  for (int d = 0; d < dl.n; ++d) {
    if (dev != api.get_device_name(dl.list[d])) continue;
    ibv_context* ctx = api.open_device(dl.list[d]);
    if (!ctx) {
      *err = "cannot open RDMA device " + dev + ": " + std::strerror(errno);
      return false;
    }
    out->dev = dev;
    bool ok = fillPort(api, ctx, port, out, err);
    if (ok && out->roce) {
      ibv_port_attr pa{};
      queryPort(api, ctx, static_cast<uint8_t>(port), &pa);
      ok = false;
      for (int gi = 0; gi < pa.gid_tbl_len && !ok; ++gi) {
        if (gidIndex >= 0 && gi != gidIndex) continue;
        ibv_gid_entry ge{};
        if (api.query_gid_ex(ctx, static_cast<uint32_t>(port), static_cast<uint32_t>(gi), &ge, 0, sizeof ge) != 0)
          continue;
        if (gidIndex < 0 && (ge.gid_type != IBV_GID_TYPE_ROCE_V2 ||
                             !isV4Mapped(reinterpret_cast<const ibv_gid&>(ge.gid), nullptr)))
          continue;
        out->gidIndex = gi;
        std::memcpy(out->gid.raw, ge.gid.raw, 16);
        char nd[IF_NAMESIZE] = {0};
        if (ge.ndev_ifindex && if_indextoname(ge.ndev_ifindex, nd)) out->netdev = nd;
        out->why = "GID " + std::to_string(gi) + " of " + dev + " port " + std::to_string(port) +
                   (gidIndex >= 0 ? " (given)" : " (first RoCE v2 GID with an IPv4 address)");
        ok = true;
      }
      if (!ok)
        *err = "HCA " + dev + " port " + std::to_string(port) +
               (gidIndex >= 0 ? " has no GID index " + std::to_string(gidIndex) : " has no RoCE v2 IPv4 GID");
    } else if (ok) {
      out->gidIndex = -1;
      out->why = "InfiniBand port " + std::to_string(port) + " of " + dev + ", LID " + std::to_string(out->lid);
    }
    api.close_device(ctx);
    return ok;
  }
  *err = "no RDMA device named '" + dev + "'";
  return false;
}

bool Hca::openOnce(Opening* o, Attrs* a, std::string* err) {
  const VerbsApi& api = *api_;
  DevList dl(api);
  bool listed = false;
  for (int d = 0; d < dl.n && !o->ctx; ++d)
    if (dev_ == api.get_device_name(dl.list[d])) {
      listed = true;
      o->ctx = api.open_device(dl.list[d]);
    }
  if (!o->ctx) {
    *err = listed ? "cannot open RDMA device '" + dev_ + "': " + std::strerror(errno)
                  : "no RDMA device named '" + dev_ + "'";
    return false;
  }
  o->pd = api.alloc_pd(o->ctx);
  if (!o->pd) {
    *err = "ibv_alloc_pd(" + dev_ + "): " + std::strerror(errno);
    api.close_device(o->ctx);
    o->ctx = nullptr;
    return false;
  }
  int fl = fcntl(o->ctx->async_fd, F_GETFL);
  fcntl(o->ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
  ibv_device_attr da{};
  if (api.query_device(o->ctx, &da) == 0) {
    a->sysImageGuid = be64toh(da.sys_image_guid);
    a->maxQp = da.max_qp;
    a->physPorts = da.phys_port_cnt;
  }
  return true;
}

Hca::Hca(const std::string& dev, std::string* err) : dev_(dev) {
  api_ = verbsApi(err);
  if (!api_) return;
  Opening o;
  Attrs a;
  if (!openOnce(&o, &a, err)) return;
  o.epoch = 1;
  cur_ = o;
  attrs_ = a;
  char real[PATH_MAX];
  if (realpath(("/sys/class/infiniband/" + dev_ + "/device").c_str(), real)) pciPath_ = real;
}

Hca::Attrs Hca::attrs() const {
  std::lock_guard<std::mutex> g(mu_);
  return attrs_;
}

bool Hca::ok() const {
  std::lock_guard<std::mutex> g(mu_);
  return cur_.ctx != nullptr && cur_.pd != nullptr;
}

Hca::Opening Hca::current() const {
  std::lock_guard<std::mutex> g(mu_);
  Opening o = cur_;
  o.dead = deviceFatal_;
  return o;
}

bool Hca::reopen(std::string* err) {
  if (!api_) return *err = "libibverbs is not loaded", false;
  Opening o;
  Attrs a;
  if (!openOnce(&o, &a, err)) return false;
  std::lock_guard<std::mutex> g(mu_);
  o.epoch = cur_.epoch + 1;
  if (cur_.ctx) retired_.push_back(cur_);
  cur_ = o;
  attrs_ = a;
  deviceFatal_ = false;
  fatalQps_.clear();  // QP numbers of the new opening start afresh
  fatalWhat_.clear();
  return true;
}

const VerbsApi& Hca::api() const {
  static const VerbsApi kNone{};  // never called through: nothing is built on an Hca that is not ok()
  return api_ ? *api_ : kNone;
}

Hca::~Hca() {
  if (!api_) return;
  const VerbsApi& api = *api_;
  retired_.push_back(cur_);
  for (Opening& o : retired_) {  // errors ignored: a dead device's calls may fail, memory is freed
    if (o.pd) api.dealloc_pd(o.pd);
    if (o.ctx) api.close_device(o.ctx);
  }
}

std::vector<AsyncEvent> Hca::pollAsyncFromDataPath() {
  if (watched_.load(std::memory_order_acquire) &&
      nowUs() - lastReadUs_.load(std::memory_order_relaxed) < kDataPathReadUs)
    return {};
  return pollAsync();
}

std::vector<AsyncEvent> Hca::pollAsync() {
  std::vector<AsyncEvent> got;
  std::lock_guard<std::mutex> g(mu_);
  if (!cur_.ctx || deviceFatal_) return got;
  lastReadUs_.store(nowUs(), std::memory_order_relaxed);
  asyncReads_.fetch_add(1, std::memory_order_relaxed);
  const VerbsApi& api = *api_;
  ibv_async_event e;
  while (!deviceFatal_ && api.get_async_event(cur_.ctx, &e) == 0) {  // non-blocking: async_fd is O_NONBLOCK
    AsyncEvent a;
    a.type = e.event_type;
    a.tUs = nowUs();
    switch (e.event_type) {
      case IBV_EVENT_PORT_ERR:
      case IBV_EVENT_PORT_ACTIVE:
      case IBV_EVENT_GID_CHANGE:
      case IBV_EVENT_LID_CHANGE:
      case IBV_EVENT_PKEY_CHANGE:
      case IBV_EVENT_SM_CHANGE:
      case IBV_EVENT_CLIENT_REREGISTER:
        a.port = e.element.port_num;
        if (static_cast<size_t>(a.port) >= portErr_.size()) {
          portErr_.resize(a.port + 1, 0);
          gidChg_.resize(a.port + 1, 0);
          lidChg_.resize(a.port + 1, 0);
          portEv_.resize(a.port + 1, 0);
        }
        if (e.event_type == IBV_EVENT_PORT_ERR) ++portErr_[a.port];
        if (e.event_type == IBV_EVENT_PORT_ERR || e.event_type == IBV_EVENT_PORT_ACTIVE) ++portEv_[a.port];
        if (e.event_type == IBV_EVENT_GID_CHANGE) ++gidChg_[a.port];
        if (e.event_type == IBV_EVENT_LID_CHANGE) ++lidChg_[a.port];
        break;
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_PATH_MIG_ERR:
        a.qpn = e.element.qp ? e.element.qp->qp_num : 0;
        fatalQps_.insert(a.qpn);
        fatalWhat_ = api.event_type_str(e.event_type);
        break;
      case IBV_EVENT_DEVICE_FATAL:
        deviceFatal_ = true;
        fatalWhat_ = api.event_type_str(e.event_type);
        break;
      default:
        break;
    }
    api.ack_async_event(&e);
    got.push_back(a);
  }
  return got;
}

uint64_t Hca::portErrors(int port) {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<size_t>(port) < portErr_.size() ? portErr_[port] : 0;
}

uint64_t Hca::gidChanges(int port) {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<size_t>(port) < gidChg_.size() ? gidChg_[port] : 0;
}

uint64_t Hca::lidChanges(int port) {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<size_t>(port) < lidChg_.size() ? lidChg_[port] : 0;
}

void Hca::notePortLid(int port, uint16_t lid) {
  if (port < 0 || lid == 0) return;
  std::lock_guard<std::mutex> g(mu_);
  if (static_cast<size_t>(port) >= lid_.size()) lid_.resize(port + 1, 0), lidMoves_.resize(port + 1, 0);
  if (lid_[port] != 0 && lid_[port] != lid) ++lidMoves_[port];
  lid_[port] = lid;
}

uint16_t Hca::portLid(int port, uint64_t* changes) {
  std::lock_guard<std::mutex> g(mu_);
  bool in = port >= 0 && static_cast<size_t>(port) < lid_.size();
  if (changes) *changes = in ? lidMoves_[port] : 0;
  return in ? lid_[port] : 0;
}

uint16_t Hca::portStatus(int port, uint64_t* portErrors, uint64_t* lidChanges) {
  std::lock_guard<std::mutex> g(mu_);
  bool inErr = port >= 0 && static_cast<size_t>(port) < portErr_.size();
  bool inLid = port >= 0 && static_cast<size_t>(port) < lid_.size();
  *portErrors = inErr ? portErr_[port] : 0;
  *lidChanges = inLid ? lidMoves_[port] : 0;
  return inLid ? lid_[port] : 0;
}

uint64_t Hca::portStateEvents(int port) {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<size_t>(port) < portEv_.size() ? portEv_[port] : 0;
}

bool Hca::deviceFatal() {
  std::lock_guard<std::mutex> g(mu_);
  return deviceFatal_;
}

void Hca::forgetQp(uint32_t qpn, uint64_t epoch) {
  std::lock_guard<std::mutex> g(mu_);
  if (epoch == cur_.epoch) fatalQps_.erase(qpn);
}

bool Hca::qpFatal(uint32_t qpn, uint64_t epoch, std::string* what) {
  std::lock_guard<std::mutex> g(mu_);
  if (epoch != cur_.epoch) {
    if (what) *what = "device fatal error (the HCA was re-opened since this QP was built)";
    return true;
  }
  if (deviceFatal_ || fatalQps_.count(qpn)) {
    if (what) *what = fatalWhat_;
    return true;
  }
  return false;
}

}  // namespace verbs
}  // namespace railover
