#include "plugin/runtime.h"

#include "common/log.h"
#include "failover/link.h"
#include "health/health.h"
#include "plugin/devices.h"
#include "plugin/rdma_report.h"
#include "plugin/state_file.h"
#include "telemetry/journal.h"
#include "telemetry/state.h"
#include "transport/tcp/tcp_transport.h"
#ifdef RAILOVER_HAVE_VERBS
#include "transport/rdma/rdma_transport.h"
#endif

namespace railover {

ncclResult_t Runtime::init(ncclDebugLogger_t logger) {
  if (logger) setLogger(logger);
  std::lock_guard<std::mutex> g(mu_);
  if (tried_) {
    if (result_ != ncclSuccess) RO_WARN("railover: init failed earlier: %s", error_.c_str());
    return result_;
  }
  tried_ = true;
  std::string err;
  if (!parseConfig(processEnv(), &cfg, &err)) {
    error_ = err;
    RO_WARN("railover: %s", err.c_str());
    return result_ = ncclInvalidArgument;
  }
  if (!discoverNics(cfg, &nics, &err)) {
    error_ = err;
    RO_WARN("railover: %s", err.c_str());
    return result_ = ncclSystemError;
  }
  ports.assign(nics.size(), 0);
  if (!transport && !chooseTransport(&err)) {
    error_ = err;
    RO_WARN("railover: %s", err.c_str());
    return result_ = ncclSystemError;
  }
  applyDeviceProps(*transport, &nics);
  for (auto& n : nics) {
    socklen_t len = 0;
    sockaddr_storage a = n.getAddr(&len);
    uint16_t port = 0;
    if (!transport->listen(n.index, a, len, &port, &links, &err)) {
      error_ = "cannot listen on NIC " + n.name + " (" + addrToString(a) + "): " + err;
      RO_WARN("railover: %s", error_.c_str());
      delete transport;  // closes the listeners opened so far (this process keeps no railover)
      transport = nullptr;
      return result_ = ncclSystemError;
    }
    ports[n.index] = port;
    RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: NIC %d %s addr %s rail %d speed %d Mbps pci %s port %u",
            n.index, n.name.c_str(), addrToString(a).c_str(), n.rail, n.speedMbps,
            n.pciPath.empty() ? "(virtual)" : n.pciPath.c_str(), port);
  }
  Health::setAddrChangeHook([](int nic, const sockaddr_storage& a, socklen_t l) { Runtime::get().relisten(nic, a, l); });
  fileJournal_.reset(new FileJournal(cfg.eventLog));
  journal = fileJournal_.get();
  stateStart(cfg, cfg.stateDirSet, processStateSource(*this));
  links.startSweeper();
  Health::setEpochHook([] { Runtime::get().links.notifySweeper(); });
  Health::start(cfg, nics.data(), (int)nics.size(), ports.data(), journal);
#ifdef RAILOVER_HAVE_VERBS
  if (auto* rt = dynamic_cast<rdma::RdmaTransport*>(transport))
    rt->startPortWatch(
        [](int nic, bool up, const std::string& why) {
          if (Health* h = Health::get()) h->transportNicSignal(nic, up, why);
        },
        [this, rt](int nic, const std::string& kind, const std::string& oldAddr, const std::string& newAddr,
                   const std::string& why) {
          if (journal && nic >= 0 && nic < (int)nics.size())
            journal->hca_addr_change(nics[nic].name, rt->nicDevice(nic), kind, oldAddr, newAddr, why);
        });
#endif
  ok_.store(true, std::memory_order_release);
  return result_ = ncclSuccess;
}


void applyDeviceProps(const Transport& t, std::vector<Nic>* nics) {
  for (auto& n : *nics) {
    Transport::DeviceProps dp;
    if (!t.deviceProps(n.index, &dp)) continue;
    if (dp.guid) n.guid = dp.guid;
    n.port = dp.port;
    if (dp.speedMbps > 0) n.speedMbps = dp.speedMbps;
    if (dp.maxComms > 0) n.maxComms = dp.maxComms;
    if (!dp.pciPath.empty()) n.pciPath = dp.pciPath;
    RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: NIC %s device properties from %s: guid 0x%016llx port %d speed %d Mbps maxComms %d",
            n.name.c_str(), dp.why.c_str(), (unsigned long long)n.guid, n.port, n.speedMbps, n.maxComms);
  }
}

bool Runtime::chooseTransport(std::string* err) {
  TransportKind k = cfg.transport;
#ifdef RAILOVER_HAVE_VERBS
  bool mixed = false;
  if (k == TransportKind::kAuto || k == TransportKind::kMixed) {
    std::string why;
    std::vector<std::string> withRdma;
    bool all = rdma::rdmaUsable(nics, cfg, &why, &withRdma);
    const char* setting = transportName(cfg.transport);
    if (withRdma.empty()) {  // no RDMA port behind any NIC, or libibverbs does not load
      k = TransportKind::kTcp;
      RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: RAILOVER_TRANSPORT=%s: using tcp (%s)", setting, why.c_str());
      // ACTIVE RDMA ports none of the NICs is on (InfiniBand without IPoIB, or their interfaces
      // not selected): the job runs over TCP beside them, which the operator must hear of.
      std::vector<std::string> names;
      for (const Nic& n : nics) names.push_back(n.name);
      std::string idle = idleRdmaPortsWarning(setting, names, cfg.ib);
      if (!idle.empty()) RO_WARN("railover: %s", idle.c_str());
    } else if (all || k == TransportKind::kMixed) {
      k = TransportKind::kRdma;
      mixed = !all;  // rdma+tcp: the NICs without a port are served over TCP, as devices of their own
    } else {
      // auto with a mix (typically a management NIC in the list): the NICs without an RDMA port
      // are left out of NCCL's devices, as NCCL's IB transport lists only RDMA devices. Serving
      // them over TCP as devices of their own (rdma+tcp) is opt-in: NCCL picks each rank's
      // device for a connection by its own topology, and may pair a TCP NIC on one rank with an
      // RDMA NIC on another, which no comm can carry (GPU memory on one end, host on the other).
      std::string outNames = joinNames(keepOnlyNics(&nics, withRdma));
      ports.assign(nics.size(), 0);
      RO_WARN("railover: RAILOVER_TRANSPORT=auto: NIC(s) %s have no RDMA port (first: %s) and are left out: NCCL's "
              "devices are the RDMA NIC(s) %s only, as with NCCL's own IB transport. RAILOVER_TRANSPORT=rdma+tcp serves "
              "them over TCP as devices of their own, RAILOVER_TRANSPORT=tcp puts every NIC on TCP; leaving them out "
              "of RAILOVER_IFNAMES or NCCL_SOCKET_IFNAME silences this",
              outNames.c_str(), why.c_str(), joinNames(withRdma).c_str());
      k = TransportKind::kRdma;
    }
  }
  if (k == TransportKind::kRdma) {
    auto* t = new rdma::RdmaTransport(&nics, &cfg, err, mixed);
    if (!t->ok()) {
      *err = "RAILOVER_TRANSPORT=" + std::string(transportName(cfg.transport)) + ": cannot use RDMA: " + *err;
      delete t;
      return false;
    }
    if (t->mixed()) {
      // Said loudly: a comm on a NIC served over TCP sends from host memory only and cannot
      // fail over to the RDMA NICs (nor the reverse).
      std::vector<std::string> tcpList, rdmaList;
      for (auto& n : nics) (t->overTcp(n.index) ? tcpList : rdmaList).push_back(n.name);
      const std::string tcpNics = joinNames(tcpList), rdmaNics = joinNames(rdmaList);
      RO_WARN("railover: RAILOVER_TRANSPORT=rdma+tcp: rdma on NIC(s) %s, tcp on NIC(s) %s (no RDMA port behind them). "
              "Each comm stays on its NIC's kind: comms of a tcp NIC fail over only to other tcp NICs, and rdma comms "
              "only to rdma NICs; a connection NCCL pairs across kinds (a tcp NIC here, an rdma NIC on the peer) fails "
              "with an error naming both. RAILOVER_TRANSPORT=auto leaves the tcp NIC(s) out instead",
              rdmaNics.c_str(), tcpNics.c_str());
      if (cfg.maxRecvs > 1)
        RO_WARN("railover: RAILOVER_MAX_RECVS=%u applies to the rdma NIC(s) %s only: the tcp NIC(s) %s offer maxRecvs 1 "
                "(a TCP sender is not told the receiver's grouped receives)",
                cfg.maxRecvs, rdmaNics.c_str(), tcpNics.c_str());
    }
    RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: transport %s: %s", t->kinds().c_str(), t->describe().c_str());
    transport = t;
    return true;
  }
#else
  if (k == TransportKind::kRdma) {
    *err = "RAILOVER_TRANSPORT=rdma, but this build of railover has no RDMA transport (built without rdma-core's "
           "headers: install libibverbs-dev and rebuild)";
    return false;
  }
#endif
  transport = new TcpTransport(&nics, &cfg);
  if (cfg.maxRecvs > 1)  // set on purpose, and without effect here: say so once
    RO_WARN("railover: RAILOVER_MAX_RECVS=%u has no effect with the tcp transport: maxRecvs stays 1, as NCCL's "
            "socket transport's (a TCP sender is not told the receiver's grouped receives, which NCCL's shared "
            "comms need it to match sends against by tag)",
            cfg.maxRecvs);
  return true;
}

void Runtime::relisten(int nic, const sockaddr_storage& a, socklen_t len) {
  uint16_t port = ports[nic];
  std::string err;
  if (!transport->listen(nic, a, len, &port, &links, &err))
    RO_WARN("railover: NIC %s moved to %s but cannot listen there on port %u: %s; peers cannot reconnect to it",
            nics[nic].name.c_str(), addrToString(a).c_str(), ports[nic], err.c_str());
}

}  // namespace railover
