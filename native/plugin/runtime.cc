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

#include <unistd.h>  // environ
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
  // Before the values: a misspelt name may be why a value init refuses is not the one meant.
  for (const std::string& w : unknownVarWarnings(environ)) RO_WARN("railover: %s", w.c_str());
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
  const std::vector<Nic> selected = nics;  // before RAILOVER_TRANSPORT=auto leaves any out
  if (!transport && !chooseTransport(&err)) {
    error_ = err;
    RO_WARN("railover: %s", err.c_str());
    return result_ = ncclSystemError;
  }
  // Judged on the NICs served, as doctor judges them (the NICs left out still share subnets).
  warnNicSetup(cfg, selected, nics);
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
  journalFile = fileJournal_->path();
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
  // The one rule (planTransport, plugin/rdma_report.h), which `railover doctor` reads through
  // the report: the same choice, the same warnings.
  const TransportPlan plan = planTransport(nics, cfg);
  for (const std::string& w : plan.warnings) RO_WARN("railover: %s", w.c_str());
  if (plan.name == "error") {
    *err = plan.why;
    return false;
  }
  if (!plan.rdma())
    RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: %s: using tcp", plan.why.c_str());
#ifdef RAILOVER_HAVE_VERBS
  if (!plan.leftOut.empty()) {
    keepOnlyNics(&nics, plan.rdmaNics);
    ports.assign(nics.size(), 0);
  }
  const bool mixed = plan.name == "rdma+tcp";
  if (plan.rdma()) {
    auto* t = new rdma::RdmaTransport(&nics, &cfg, err, mixed);
    if (!t->ok()) {
      *err = "RAILOVER_TRANSPORT=" + std::string(transportName(cfg.transport)) + ": cannot use RDMA: " + *err;
      delete t;
      return false;
    }
    RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: transport %s: %s", t->kinds().c_str(), t->describe().c_str());
    transport = t;
    return true;
  }
#endif
  transport = new TcpTransport(&nics, &cfg);
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
