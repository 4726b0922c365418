// The content of the state file (telemetry/state.h writes it, schema: docs/OPERATIONS.md):
// the runtime's NICs with health's view of them and the transport's device port behind each
// (Transport::devicePort: the "rdma" member, null for TCP), the NIC pairs, every comm with its
// paths, and lifetime totals. It lives in the plugin layer because it reads the runtime, the engine's
// links and health; telemetry below only writes what this renders.
//
// Thread-safety: called on the state writer's thread; reads links through their snapshots
// (Link::snapshot), NIC addresses through Nic::getAddr, and health through its thread-safe
// readers, and the transport's device ports through Transport::devicePort (a copy under the
// transport's lock).
#pragma once

#include <string>

#include "telemetry/state.h"

namespace railover {

class Runtime;
class Health;

// The state document's members after the process identity (StateSource::renderFields) for
// runtime `rt` and health monitor `hl` (nullptr: every NIC reads up, no pairs).
std::string renderStateFields(Runtime& rt, Health* hl);

// The state file's source for the process: changes flagged by the engine's links or seen in
// the NIC entries (health's view, the transport's device port: Transport::devicePort), content
// from renderStateFields over `rt` and the health monitor of the moment (Health::get()).
StateSource processStateSource(Runtime& rt);

}  // namespace railover
