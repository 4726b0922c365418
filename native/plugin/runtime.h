// Process-wide railover state, and the wiring of the layers: configuration, the NIC table, the
// transport (which listens on every NIC and accepts streams: Transport::listen; its listener
// port per NIC is also the health monitor's UDP probe port), the link registry (the engine's
// stream routing handed to the transport, and the failover sweeper), the journal and the
// health monitor. The runtime opens no socket itself. It is the one owner of the process's
// journal and link registry: the engine gets them through linkDeps(), never by looking them up.
//
// Created once per process at the first successful init and never destroyed (the plugin is
// linked -z nodelete, so NCCL's dlclose/dlopen cycles keep it). init is idempotent and
// thread-safe; a refcount counts live contexts (v11+) for finalize.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "abi/nccl_net_abi.h"
#include "common/config.h"
#include "failover/deps.h"
#include "failover/registry.h"
#include "plugin/devices.h"
#include "telemetry/journal.h"
#include "transport/transport.h"

namespace railover {

// Takes the transport's device properties (Transport::deviceProps: RDMA, the HCA port behind
// each NIC) into the NIC table that getProperties reports to NCCL: guid, port, speed, maxComms
// and PCI path, each where the transport knows it; logs one INFO line per NIC. Called by
// init() once, before any listener exists; not thread-safe (the NIC table is not shared yet).
void applyDeviceProps(const Transport& t, std::vector<Nic>* nics);

class Runtime {
 public:
  static Runtime& get();
  // Parses the configuration, discovers NICs, chooses the transport and has it listen on every
  // NIC, starts health and telemetry, once. Later calls return the first call's result (and
  // its error message).
  ncclResult_t init(ncclDebugLogger_t logger);
  bool initialized() const { return ok_.load(std::memory_order_acquire); }
  // A NIC moved to a new address: the transport listens there instead (same port), so peers
  // can reconnect. Logs a WARN when it cannot.
  void relisten(int nic, const sockaddr_storage& a, socklen_t len);

  // Unit tests: adopt this configuration and NIC table, with `t` as the transport and
  // `journal` as the journal (nullptr: none; the test keeps it alive), without listeners or
  // threads (the test installs its own Health and plays the acceptor, routing streams through
  // `links`, and runs links.sweepIdle() in place of the sweeper thread).
  void initForTest(const Config& c, const std::vector<Nic>& n, Transport* t, Journal* journal = nullptr);
  // Unit tests: RAILOVER_TRANSPORT's choice (chooseTransport below) for `cfg` and `nics` as
  // set, with its log lines; sets `transport` (the caller deletes it), nothing else started.
  bool chooseTransportForTest(std::string* err) { return chooseTransport(err); }

  // What links get from the process (its configuration, NICs, ports, transport, health,
  // journal and link registry).
  LinkDeps linkDeps();

  Config cfg;
  std::vector<Nic> nics;
  Transport* transport = nullptr;  // TCP unless a test installed another
  std::vector<uint16_t> ports;  // listener port per NIC (TCP and UDP)
  std::atomic<int> refs{0};
  // The process's journal (RAILOVER_EVENT_LOG; off when unset), opened by init(); nullptr
  // before init.
  Journal* journal = nullptr;
  // The file that journal writes (FileJournal::path(): absolute, '%p' and a directory resolved),
  // set by init(); "" when it writes none. The state file's event_log, so readers running in
  // another directory find a relative RAILOVER_EVENT_LOG's file.
  std::string journalFile;
  // The process's links, their routing and the failover sweeper (started by init()).
  LinkRegistry links;

 private:
  // RAILOVER_TRANSPORT: sets `transport`. auto: rdma where some NIC has an RDMA port behind it
  // (the NICs without one are left out of `nics`, so NCCL sees RDMA devices only, as with its
  // IB transport), tcp where none has; rdma+tcp: rdma on the NICs with a port and tcp on the
  // others (the RDMA transport's mixed mode); rdma: every NIC must have one. false with *err
  // when rdma was asked and cannot be used.
  bool chooseTransport(std::string* err);
  std::mutex mu_;
  bool tried_ = false;
  ncclResult_t result_ = ncclSuccess;
  std::string error_;
  std::atomic<bool> ok_{false};
  std::unique_ptr<FileJournal> fileJournal_;  // what `journal` points to after init()
};

}  // namespace railover
