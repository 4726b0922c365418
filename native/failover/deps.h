// What a link needs from the process, handed to it at construction: the engine looks up no
// process-wide singleton (runtime, health, journal, link registry) itself. The pointees
// outlive every link (the plugin's runtime is never destroyed; tests keep theirs for as long
// as their links live). Read under the link's mutex; the configuration may be changed by
// tests between calls, never during one.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/nic.h"

namespace railover {

class Health;
class Journal;
class LinkRegistry;
class Transport;

struct LinkDeps {
  const Config* cfg = nullptr;                   // RAILOVER_* settings
  const std::vector<Nic>* nics = nullptr;        // the process's NICs, by index
  const std::vector<uint16_t>* ports = nullptr;  // listener/probe port per NIC (sent in HELLOs)
  Transport* transport = nullptr;                // opens paths (and the peer liveness check)
  Health* health = nullptr;                      // per-NIC / per-pair health; nullptr = none (all up)
  Journal* journal = nullptr;                    // where events are written; nullptr = no journal
  // The links of this runtime (state file, sweeper, routing of accepted streams to recv links;
  // failover/registry.h). nullptr = the link is listed nowhere: no sweeper drives it and no
  // stream is routed to it (fuzzers and transport tests that drive one link by hand). A
  // Listener needs one.
  LinkRegistry* registry = nullptr;
};

}  // namespace railover
