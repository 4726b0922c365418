#include "plugin/rdma_report.h"

#include <dlfcn.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "abi/nccl_net_abi.h"
#include "plugin/devices.h"
#include "telemetry/journal.h"
#ifdef RAILOVER_HAVE_VERBS
#include "transport/rdma/rdma_transport.h"
#include "transport/verbs/verbs_gdr.h"
#include "transport/verbs/verbs_config.h"
#endif

namespace railover {

namespace {

std::string q(const std::string& s) { return jsonStr(s); }
const char* b(bool v) { return v ? "true" : "false"; }

bool exists(const char* path) {
  struct stat st;
  return stat(path, &st) == 0;
}

std::string ptrList(uint32_t bits) {
  std::string o;
  auto add = [&](uint32_t bit, const char* name) {
    if (bits & bit) o += std::string(o.empty() ? "" : ",") + "\"" + name + "\"";
  };
  add(RAILOVER_NCCL_PTR_HOST, "HOST");
  add(RAILOVER_NCCL_PTR_CUDA, "CUDA");
  add(RAILOVER_NCCL_PTR_DMABUF, "DMABUF");
  return "[" + o + "]";
}

// The files NCCL's IB transport looks at for a peer-memory module (MOFED's nv_peer_mem, the
// driver's nvidia-peermem); the first that exists, "" when none.
std::string peermemFile() {
  for (const char* p : {"/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
                        "/sys/module/nvidia_peermem/version", "/sys/module/nvidia_peermem", "/sys/module/nv_peer_mem"})
    if (exists(p)) return p;
  return "";
}

#ifdef RAILOVER_HAVE_VERBS

const char* portStateName(int s) {
  switch (s) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "UNKNOWN";
  }
}

const char* linkLayerName(int ll) { return ll == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand" : "Ethernet"; }

struct PortFact {
  std::string hca;
  int port = 0;
  std::string state, linkLayer;
  bool roce = true;
  std::vector<std::string> netdevs;  // RoCE: NICs its GID entries are bound to; IB: its IPoIB NICs
};

// Every port of every HCA: state, link layer and (RoCE) the NICs its GIDs are bound to.
std::vector<PortFact> scanPorts(const verbs::VerbsApi& api) {
  std::vector<PortFact> out;
  int n = 0;
  ibv_device** list = api.get_device_list(&n);
  for (int d = 0; list && d < n; ++d) {
    std::string dev = api.get_device_name(list[d]);
    ibv_context* ctx = api.open_device(list[d]);
    if (!ctx) continue;
    ibv_device_attr da{};
    if (api.query_device(ctx, &da) == 0) {
      for (int port = 1; port <= da.phys_port_cnt; ++port) {
        ibv_port_attr pa{};
        if (verbs::queryPort(api, ctx, static_cast<uint8_t>(port), &pa) != 0) continue;
        PortFact f;
        f.hca = dev;
        f.port = port;
        f.state = portStateName(pa.state);
        f.roce = pa.link_layer != IBV_LINK_LAYER_INFINIBAND;
        f.linkLayer = linkLayerName(pa.link_layer);
        std::vector<verbs::GidEntry> table;
        std::string e;
        if (f.roce && verbs::readGidTable(api, ctx, dev, port, pa.gid_tbl_len, true, &table, &e))
          for (const verbs::GidEntry& g : table)
            if (!g.netdev.empty() && std::find(f.netdevs.begin(), f.netdevs.end(), g.netdev) == f.netdevs.end())
              f.netdevs.push_back(g.netdev);
        if (!f.roce) f.netdevs = verbs::ipoibNetdevs(dev, port);
        out.push_back(f);
      }
    }
    api.close_device(ctx);
  }
  if (list) api.free_device_list(list);
  return out;
}

// NCCL's test for dmabuf support of an HCA: ibv_reg_dmabuf_mr with fd -1 fails with
// EOPNOTSUPP / EPROTONOSUPPORT when the kernel or provider has none, with another error
// (EBADF) when it has.
std::string dmabufProbe(const std::string& dev, bool* supported) {
  std::string e;
  verbs::Hca hca(dev, &e);
  *supported = false;
  if (!hca.ok()) return "{\"hca\":" + q(dev) + ",\"supported\":null,\"detail\":" + q(e) + "}";
  if (!hca.api().reg_dmabuf_mr)
    return "{\"hca\":" + q(dev) + ",\"supported\":null,\"detail\":\"this libibverbs has no ibv_reg_dmabuf_mr\"}";
  std::string why;
  *supported = verbs::dmabufSupported(hca, &why);
  return "{\"hca\":" + q(dev) + ",\"supported\":" + b(*supported) + ",\"detail\":" +
         q(*supported ? "ibv_reg_dmabuf_mr(fd -1) answered with another error than \"not supported\"" : why) + "}";
}

// Whether interface `name` has an address railover's NIC discovery would take (IPv4, or IPv6
// that is not link-local: common/nic.cc).
bool hasIpAddress(const std::string& name) {
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return true;  // unknown: do not claim it has none
  bool found = false;
  for (ifaddrs* p = ifa; p && !found; p = p->ifa_next) {
    if (!p->ifa_addr || !p->ifa_name || name != p->ifa_name) continue;
    if (p->ifa_addr->sa_family == AF_INET) found = true;
    if (p->ifa_addr->sa_family == AF_INET6 &&
        !IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(p->ifa_addr)->sin6_addr))
      found = true;
  }
  freeifaddrs(ifa);
  return found;
}

// What one NIC's port choice came to: the HCA port it uses ("" when none) or why not.
struct NicChoice {
  std::string nic, hca;
  int port = 0;
  std::string err;
};

// The ports of `ports` no NIC in `choices` uses, with why (UnusedRdmaPort).
std::vector<UnusedRdmaPort> unusedFrom(const std::vector<PortFact>& ports, const std::vector<NicChoice>& choices,
                                       const IbConfig& ib) {
  std::vector<UnusedRdmaPort> out;
  for (const PortFact& f : ports) {
    bool used = false;
    for (const NicChoice& c : choices) used = used || (c.hca == f.hca && c.port == f.port);
    if (used) continue;
    UnusedRdmaPort u;
    u.hca = f.hca, u.port = f.port, u.state = f.state, u.linkLayer = f.linkLayer, u.netdevs = f.netdevs;
    const NicChoice* on = nullptr;  // a selected NIC on this port (it uses another port, or none)
    for (const NicChoice& c : choices)
      if (!on && std::find(f.netdevs.begin(), f.netdevs.end(), c.nic) != f.netdevs.end()) on = &c;
    if (!ib.hca.allows(f.hca, f.port)) {
      u.why = "excluded by NCCL_IB_HCA='" + ib.hcaText + "'";
    } else if (on && !on->hca.empty()) {
      u.why = "NIC " + on->nic + " is on it but uses " + on->hca + " port " + std::to_string(on->port) +
              " (one HCA port per NIC)";
    } else if (on) {
      u.why = "NIC " + on->nic + " is on it but has no usable RDMA port: " + on->err;
    } else if (!f.netdevs.empty()) {
      std::vector<std::string> bare;  // interfaces with no address: never a NIC (discoverNics)
      for (const std::string& n : f.netdevs)
        if (!hasIpAddress(n)) bare.push_back(n);
      if (bare.size() == f.netdevs.size())
        u.why = "its interface(s) " + joinNames(f.netdevs) +
                " have no IP address, and railover's NICs are interfaces with one: give it an address, then select it "
                "(RAILOVER_IFNAMES, NCCL_SOCKET_IFNAME, or the default: every interface with an address)";
      else
        u.why = "its interface(s) " + joinNames(f.netdevs) +
                " are not among the selected NICs (RAILOVER_IFNAMES, NCCL_SOCKET_IFNAME, or the default: every "
                "interface with an address)";
    } else if (f.roce) {
      u.why = "no network interface is bound to its GIDs";
    } else {
      u.why = "InfiniBand port without an IPoIB interface: railover runs each path over a NIC with an IP address (the "
              "path's bootstrap stream), so it cannot use this port; configure IPoIB on it, or use NCCL's own IB "
              "transport";
    }
    out.push_back(std::move(u));
  }
  return out;
}

std::string unusedJson(const std::vector<UnusedRdmaPort>& v) {
  std::string o;
  for (const UnusedRdmaPort& u : v) {
    std::string nd;
    for (const std::string& n : u.netdevs) nd += std::string(nd.empty() ? "" : ",") + q(n);
    o += std::string(o.empty() ? "" : ",") + "{\"hca\":" + q(u.hca) + ",\"port\":" + std::to_string(u.port) +
         ",\"state\":" + q(u.state) + ",\"link_layer\":" + q(u.linkLayer) + ",\"netdevs\":[" + nd +
         "],\"why\":" + q(u.why) + "}";
  }
  return o;
}

#endif  // RAILOVER_HAVE_VERBS

}  // namespace

std::string idleRdmaPortsWarning(const std::string& setting, const std::vector<std::string>& nics, const IbConfig& ib) {
  std::string idle;
  // An exclusion by NCCL_IB_HCA is the operator's choice: not named.
  for (const UnusedRdmaPort& u : unusedRdmaPorts(nics, ib))
    if (u.state == "ACTIVE" && u.why.rfind("excluded by NCCL_IB_HCA", 0) != 0)
      idle += std::string(idle.empty() ? "" : "; ") + u.hca + " port " + std::to_string(u.port) + " (" + u.linkLayer +
              "): " + u.why;
  if (idle.empty()) return idle;
  return "RAILOVER_TRANSPORT=" + setting + " runs over tcp on NIC(s) " + joinNames(nics) +
         ", but ACTIVE RDMA ports are unused: " + idle + " (railover doctor lists them)";
}

std::vector<UnusedRdmaPort> unusedRdmaPorts(const std::vector<std::string>& nics, const IbConfig& ib) {
#ifdef RAILOVER_HAVE_VERBS
  std::string e;
  const verbs::VerbsApi* api = verbs::verbsApi(&e);
  if (!api) return {};
  std::vector<NicChoice> choices;
  for (const std::string& n : nics) {
    verbs::PortSel sel;
    NicChoice c;
    c.nic = n;
    verbs::PortChoice pc = verbs::choosePortForNetdev(n, ib, &sel, &c.err);
    if (pc == verbs::PortChoice::kChosen || pc == verbs::PortChoice::kChosenDown) c.hca = sel.dev, c.port = sel.port;
    choices.push_back(c);
  }
  return unusedFrom(scanPorts(*api), choices, ib);
#else
  (void)nics, (void)ib;
  return {};
#endif
}

std::string rdmaReportJson(const std::vector<std::string>& names, const EnvLookup& env) {
  uint32_t ptrSupport = RAILOVER_NCCL_PTR_HOST;
  Config cfg;
  std::string cfgErr, nicErr;
  bool cfgOk = parseConfig(env, &cfg, &cfgErr);
  std::vector<Nic> nics;
  if (cfgOk && names.empty()) {
    if (!discoverNics(cfg, &nics, &nicErr)) nics.clear();
  } else {
    for (size_t i = 0; i < names.size(); ++i) {
      Nic n;
      n.index = static_cast<int>(i);
      n.name = names[i];
      nics.push_back(n);
    }
  }
  std::string setting = transportName(cfg.transport);
  std::string libOk = "false", libErr, transport = "tcp", why, nicsJson, dmabuf, unused;
#ifdef RAILOVER_HAVE_VERBS
  const bool built = true;
  std::string e;
  const verbs::VerbsApi* api = verbs::verbsApi(&e);
  libOk = b(api != nullptr);
  libErr = api ? "" : e;
  if (cfgOk) {
    std::vector<PortFact> ports;
    if (api) ports = scanPorts(*api);
    std::vector<std::string> chosenHcas;
    std::vector<NicChoice> choices;
    for (const Nic& n : nics) {
      verbs::PortSel sel;
      std::string err;
      verbs::PortChoice c = verbs::choosePortForNetdev(n.name, cfg.ib, &sel, &err);
      bool down = c == verbs::PortChoice::kChosenDown;  // chosen, its port not ACTIVE now
      bool chosen = c == verbs::PortChoice::kChosen || down;
      choices.push_back(NicChoice{n.name, chosen ? sel.dev : "", chosen ? sel.port : 0, err});
      if (down) sel.why += "; " + err + " now: the NIC starts down and its comms move to it once the port is ACTIVE";
      std::string state, ll;
      std::string pj;
      for (const PortFact& f : ports) {
        bool bound = std::find(f.netdevs.begin(), f.netdevs.end(), n.name) != f.netdevs.end();
        if (chosen && f.hca == sel.dev && f.port == sel.port) state = f.state, ll = f.linkLayer;
        if (!bound) continue;
        pj += std::string(pj.empty() ? "" : ",") + "{\"hca\":" + q(f.hca) + ",\"port\":" + std::to_string(f.port) +
              ",\"state\":" + q(f.state) + ",\"link_layer\":" + q(f.linkLayer) +
              ",\"allowed\":" + b(cfg.ib.hca.allows(f.hca, f.port)) + "}";
      }
      if (chosen && ll.empty()) ll = sel.roce ? "Ethernet" : "InfiniBand";
      if (chosen && std::find(chosenHcas.begin(), chosenHcas.end(), sel.dev) == chosenHcas.end())
        chosenHcas.push_back(sel.dev);
      nicsJson += std::string(nicsJson.empty() ? "" : ",") + "{\"nic\":" + q(n.name) + ",\"choice\":\"" +
                  (down ? "down" : chosen ? "chosen" : c == verbs::PortChoice::kExcluded ? "excluded" : "failed") +
                  "\",\"why\":" + q(chosen ? sel.why : err) + ",\"hca\":" + q(chosen ? sel.dev : "") +
                  ",\"port\":" + std::to_string(chosen ? sel.port : 0) + ",\"link_layer\":" + q(ll) +
                  ",\"state\":" + q(state) + ",\"gid_index\":" + std::to_string(chosen ? sel.gidIndex : -1) +
                  ",\"gid\":" + q(chosen && sel.roce ? verbs::gidString(sel.gid) : "") +
                  ",\"rate_mbps\":" + std::to_string(chosen ? sel.speedMbps : 0) + ",\"ports\":[" + pj + "]}";
    }
    unused = unusedJson(unusedFrom(ports, choices, cfg.ib));
    bool allDmabuf = !chosenHcas.empty();
    for (const std::string& h : chosenHcas) {
      bool sup = false;
      dmabuf += std::string(dmabuf.empty() ? "" : ",") + dmabufProbe(h, &sup);
      allDmabuf &= sup;
    }
    // The rule of Runtime::chooseTransport (plugin/runtime.cc).
    std::string uwhy;
    std::vector<std::string> withRdma;
    bool usable = !nics.empty() && rdma::rdmaUsable(nics, cfg, &uwhy, &withRdma);
    if (nics.empty()) uwhy = nicErr.empty() ? "no NIC" : nicErr;
    if (cfg.transport == TransportKind::kTcp) {
      transport = "tcp", why = "RAILOVER_TRANSPORT=tcp";
    } else if (usable) {
      transport = "rdma";
      why = "RAILOVER_TRANSPORT=" + setting + ": every NIC has an RDMA port with a GID";
      if (verbs::gdrPeerMemLoaded()) ptrSupport |= RAILOVER_NCCL_PTR_CUDA;
      if (allDmabuf) ptrSupport |= RAILOVER_NCCL_PTR_DMABUF;
    } else if (cfg.transport == TransportKind::kRdma) {
      transport = "error", why = "RAILOVER_TRANSPORT=rdma: cannot use RDMA: " + uwhy;
    } else if (!withRdma.empty()) {  // a mix: auto leaves the others out, rdma+tcp serves them over TCP
      const std::string names = joinNames(withRdma);
      if (cfg.transport == TransportKind::kMixed) {
        transport = "rdma+tcp";
        why = "RAILOVER_TRANSPORT=rdma+tcp: rdma on " + names + ", tcp on the others (first without an RDMA port: " +
              uwhy + "); each comm fails over only within its kind (GPU memory on the rdma NICs only)";
      } else {
        transport = "rdma";
        why = "RAILOVER_TRANSPORT=auto: rdma on " + names + "; the NICs without an RDMA port are left out of NCCL's "
              "devices (first: " + uwhy + ")";
      }
      if (verbs::gdrPeerMemLoaded()) ptrSupport |= RAILOVER_NCCL_PTR_CUDA;  // on the rdma NICs
      if (allDmabuf) ptrSupport |= RAILOVER_NCCL_PTR_DMABUF;
    } else {
      transport = "tcp", why = "RAILOVER_TRANSPORT=" + setting + ": " + uwhy;
    }
  }
#else
  const bool built = false;
  libErr = "this build of railover has no RDMA transport (built without rdma-core's headers)";
  for (const Nic& n : nics)
    nicsJson += std::string(nicsJson.empty() ? "" : ",") + "{\"nic\":" + q(n.name) +
                ",\"choice\":\"failed\",\"why\":" + q(libErr) +
                ",\"hca\":\"\",\"port\":0,\"link_layer\":\"\",\"state\":\"\",\"gid_index\":-1,\"gid\":\"\",\"rate_mbps\":0,\"ports\":[]}";
  if (cfg.transport == TransportKind::kRdma) transport = "error", why = "RAILOVER_TRANSPORT=rdma: " + libErr;
  else why = "RAILOVER_TRANSPORT=" + setting + ": " + libErr;
#endif
  if (!cfgOk) transport = "error", why = cfgErr, nicsJson.clear(), unused.clear();
  return "{\"version\":1,\"built_with_verbs\":" + std::string(b(built)) + ",\"libibverbs\":{\"loaded\":" + libOk +
         ",\"error\":" + q(libErr) + "},\"config_error\":" + q(cfgOk ? "" : cfgErr) + ",\"nic_error\":" + q(nicErr) +
         ",\"setting\":" + q(setting) + ",\"transport\":" + q(transport) + ",\"transport_why\":" + q(why) +
         ",\"nics\":[" + nicsJson + "],\"unused_ports\":[" + unused + "],\"memory\":{\"ptr_support\":" + ptrList(ptrSupport) +
         "},\"gpudirect\":{\"nvidia_driver\":" + b(exists("/sys/module/nvidia")) + ",\"peermem\":" + q(peermemFile()) +
         ",\"dmabuf\":[" + dmabuf + "]}}";
}

}  // namespace railover
