// What a link needs from the process, handed to it at construction: the engine looks up no
// process-wide singleton (runtime, health) itself. The pointees outlive every link (the
// plugin's runtime is never destroyed; tests keep theirs for the whole run). Read under the
// link's mutex; the configuration may be changed by tests between calls, never during one.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/nic.h"

namespace railover {

class Health;
class Transport;

struct LinkDeps {
  const Config* cfg = nullptr;                   // RAILOVER_* settings
  const std::vector<Nic>* nics = nullptr;        // the process's NICs, by index
  const std::vector<uint16_t>* ports = nullptr;  // listener/probe port per NIC (sent in HELLOs)
  Transport* transport = nullptr;                // opens paths (and the peer liveness check)
  Health* health = nullptr;                      // per-NIC / per-pair health; nullptr = none (all up)
};

}  // namespace railover
