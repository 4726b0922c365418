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

std::string TransportPlan::deviceOf(const std::string& nic) const {
  if (!rdma()) return name == "tcp" ? "tcp" : "";
  if (std::find(rdmaNics.begin(), rdmaNics.end(), nic) != rdmaNics.end()) return "rdma";
  return name == "rdma+tcp" ? "tcp" : "left_out";
}

TransportPlan planTransport(const std::vector<Nic>& nics, const Config& cfg) {
  TransportPlan p;
  const std::string setting = transportName(cfg.transport);
  // RAILOVER_MAX_RECVS set on purpose, and without effect on TCP NICs: said once.
  auto maxRecvsOnTcp = [&](const std::vector<std::string>& tcpNics, const std::vector<std::string>& rdmaNics) {
    if (cfg.maxRecvs <= 1) return;
    if (rdmaNics.empty())
      p.warnings.push_back("RAILOVER_MAX_RECVS=" + std::to_string(cfg.maxRecvs) +
                           " has no effect with the tcp transport: maxRecvs stays 1, as NCCL's socket transport's (a "
                           "TCP sender is not told the receiver's grouped receives, which NCCL's shared comms need it "
                           "to match sends against by tag)");
    else
      p.warnings.push_back("RAILOVER_MAX_RECVS=" + std::to_string(cfg.maxRecvs) + " applies to the rdma NIC(s) " +
                           joinNames(rdmaNics) + " only: the tcp NIC(s) " + joinNames(tcpNics) +
                           " offer maxRecvs 1 (a TCP sender is not told the receiver's grouped receives)");
  };
  if (cfg.transport == TransportKind::kTcp) {
    p.name = "tcp", p.why = "RAILOVER_TRANSPORT=tcp";
    maxRecvsOnTcp({}, {});
    return p;
  }
#ifdef RAILOVER_HAVE_VERBS
  std::string uwhy;
  const bool all = rdma::rdmaUsable(nics, cfg, &uwhy, &p.rdmaNics);
  if (cfg.transport == TransportKind::kRdma) {
    if (all) p.name = "rdma", p.why = "RAILOVER_TRANSPORT=rdma: every NIC has an RDMA port with a GID";
    else p.name = "error", p.why = "RAILOVER_TRANSPORT=rdma: cannot use RDMA: " + uwhy;
    return p;
  }
  if (all) {
    p.name = "rdma", p.why = "RAILOVER_TRANSPORT=" + setting + ": every NIC has an RDMA port with a GID";
  } else if (p.rdmaNics.empty()) {  // no RDMA port behind any NIC, or libibverbs does not load
    p.name = "tcp", p.why = "RAILOVER_TRANSPORT=" + setting + ": " + uwhy;
    // ACTIVE RDMA ports none of the NICs is on (InfiniBand without IPoIB, or their interfaces
    // not selected): the job runs over TCP beside them, which the operator must hear of.
    std::vector<std::string> names;
    for (const Nic& n : nics) names.push_back(n.name);
    std::string idle = idleRdmaPortsWarning(setting, names, cfg.ib);
    if (!idle.empty()) p.warnings.push_back(idle);
    maxRecvsOnTcp({}, {});
  } else if (cfg.transport == TransportKind::kMixed) {
    p.name = "rdma+tcp";
    p.why = "RAILOVER_TRANSPORT=rdma+tcp: rdma on " + joinNames(p.rdmaNics) +
            ", tcp on the others (first without an RDMA port: " + uwhy +
            "); each comm fails over only within its kind (GPU memory on the rdma NICs only)";
    std::vector<std::string> tcpNics;
    for (const Nic& n : nics)
      if (std::find(p.rdmaNics.begin(), p.rdmaNics.end(), n.name) == p.rdmaNics.end()) tcpNics.push_back(n.name);
    // Said loudly: a comm on a NIC served over TCP sends from host memory only and cannot fail
    // over to the RDMA NICs (nor the reverse).
    p.warnings.push_back("RAILOVER_TRANSPORT=rdma+tcp: rdma on NIC(s) " + joinNames(p.rdmaNics) + ", tcp on NIC(s) " +
                         joinNames(tcpNics) +
                         " (no RDMA port behind them). Each comm stays on its NIC's kind: comms of a tcp NIC fail "
                         "over only to other tcp NICs, and rdma comms only to rdma NICs; a connection NCCL pairs "
                         "across kinds (a tcp NIC here, an rdma NIC on the peer) fails with an error naming both. "
                         "RAILOVER_TRANSPORT=auto leaves the tcp NIC(s) out instead");
    maxRecvsOnTcp(tcpNics, p.rdmaNics);
  } else {
    // auto with a mix (typically a management NIC in the list): the NICs without an RDMA port
    // are left out of NCCL's devices, as NCCL's IB transport lists only RDMA devices. Serving
    // them over TCP as devices of their own (rdma+tcp) is opt-in: NCCL picks each rank's
    // device for a connection by its own topology, and may pair a TCP NIC on one rank with an
    // RDMA NIC on another, which no comm can carry (GPU memory on one end, host on the other).
    p.name = "rdma";
    for (const Nic& n : nics)
      if (std::find(p.rdmaNics.begin(), p.rdmaNics.end(), n.name) == p.rdmaNics.end()) p.leftOut.push_back(n.name);
    const std::string rdmaNames = joinNames(p.rdmaNics), outNames = joinNames(p.leftOut);
    p.why = "RAILOVER_TRANSPORT=auto: rdma on " + rdmaNames +
            "; the NICs without an RDMA port are left out of NCCL's devices (first: " + uwhy + ")";
    p.warnings.push_back("RAILOVER_TRANSPORT=auto: NIC(s) " + outNames + " have no RDMA port (first: " + uwhy +
                         ") and are left out: NCCL's devices are the RDMA NIC(s) " + rdmaNames +
                         " only, as with NCCL's own IB transport. RAILOVER_TRANSPORT=rdma+tcp serves them over TCP "
                         "as devices of their own, RAILOVER_TRANSPORT=tcp puts every NIC on TCP; leaving them out "
                         "of RAILOVER_IFNAMES or NCCL_SOCKET_IFNAME silences this");
  }
#else
  (void)nics;
  const std::string none = "this build of railover has no RDMA transport (built without rdma-core's headers: "
                           "install libibverbs-dev and rebuild)";
  if (cfg.transport == TransportKind::kRdma) p.name = "error", p.why = "RAILOVER_TRANSPORT=rdma: " + none;
  else p.name = "tcp", p.why = "RAILOVER_TRANSPORT=" + setting + ": " + none;
  if (p.name == "tcp") maxRecvsOnTcp({}, {});
#endif
  return p;
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
  std::string libOk = "false", libErr, transport = "tcp", why, nicsJson, dmabuf, unused, warnings;
  bool ro = false;  // NCCL_IB_PCI_RELAXED_ORDERING as the RDMA transport would apply it
  std::string roWhy = "not used: the job would use the tcp transport, which registers nothing with verbs";
  TransportPlan plan;
  if (cfgOk) {
    plan = planTransport(nics, cfg);
    transport = plan.name, why = plan.why;
    const std::string noNic = "no NIC";  // rdmaUsable's reason for an empty list: discovery's is better
    if (nics.empty() && !nicErr.empty() && why.size() >= noNic.size() &&
        why.compare(why.size() - noNic.size(), noNic.size(), noNic) == 0)
      why = why.substr(0, why.size() - noNic.size()) + nicErr;
    for (const std::string& w : plan.warnings) warnings += std::string(warnings.empty() ? "" : ",") + q(w);
  }
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
                  ",\"rate_mbps\":" + std::to_string(chosen ? sel.speedMbps : 0) + ",\"ports\":[" + pj +
                  "],\"device\":" + q(plan.deviceOf(n.name)) + "}";
    }
    unused = unusedJson(unusedFrom(ports, choices, cfg.ib));
    bool allDmabuf = !chosenHcas.empty();
    for (const std::string& h : chosenHcas) {
      bool sup = false;
      dmabuf += std::string(dmabuf.empty() ? "" : ",") + dmabufProbe(h, &sup);
      allDmabuf &= sup;
    }
    // What getProperties advertises with the plan's transport (RdmaTransport::ptrSupport):
    // GPU memory on the rdma NICs where GPUDirect is detected.
    if (plan.rdma()) {
      if (verbs::gdrPeerMemLoaded()) ptrSupport |= RAILOVER_NCCL_PTR_CUDA;
      if (allDmabuf) ptrSupport |= RAILOVER_NCCL_PTR_DMABUF;
      ro = verbs::relaxedOrderingChoice(cfg.ib, api, &roWhy);  // RdmaTransport::chooseRelaxedOrdering's rule
    }
  }
#else
  const bool built = false;
  libErr = "this build of railover has no RDMA transport (built without rdma-core's headers)";
  for (const Nic& n : nics)
    nicsJson += std::string(nicsJson.empty() ? "" : ",") + "{\"nic\":" + q(n.name) +
                ",\"choice\":\"failed\",\"why\":" + q(libErr) +
                ",\"hca\":\"\",\"port\":0,\"link_layer\":\"\",\"state\":\"\",\"gid_index\":-1,\"gid\":\"\",\"rate_mbps\":0,\"ports\":[]" +
                ",\"device\":" + q(plan.deviceOf(n.name)) + "}";
#endif
  if (!cfgOk) transport = "error", why = cfgErr, nicsJson.clear(), unused.clear(), warnings.clear();
  if (!cfgOk) roWhy = "not evaluated: " + cfgErr;
  else if (transport == "error") roWhy = "not evaluated: NCCL init would fail";
  return "{\"version\":1,\"built_with_verbs\":" + std::string(b(built)) + ",\"libibverbs\":{\"loaded\":" + libOk +
         ",\"error\":" + q(libErr) + "},\"config_error\":" + q(cfgOk ? "" : cfgErr) + ",\"nic_error\":" + q(nicErr) +
         ",\"setting\":" + q(setting) + ",\"transport\":" + q(transport) + ",\"transport_why\":" + q(why) +
         ",\"warnings\":[" + warnings + "],\"nics\":[" + nicsJson + "],\"unused_ports\":[" + unused + "],\"memory\":{\"ptr_support\":" + ptrList(ptrSupport) +
         ",\"relaxed_ordering\":" + b(ro) + ",\"relaxed_ordering_why\":" + q(roWhy) + "},\"gpudirect\":{\"nvidia_driver\":" + b(exists("/sys/module/nvidia")) + ",\"peermem\":" + q(peermemFile()) +
         ",\"dmabuf\":[" + dmabuf + "]}}";
}

}  // namespace railover
