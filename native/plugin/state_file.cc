#include "plugin/state_file.h"

#include <memory>

#include "common/nic.h"
#include "failover/link.h"
#include "health/health.h"
#include "plugin/runtime.h"
#include "telemetry/journal.h"

namespace railover {

// The NIC's "rdma" member: the device port the transport uses for NIC `nic`
// (Transport::devicePort), or null where there is none (TCP).
static std::string rdmaPortJson(const Transport* t, int nic) {
  Transport::DevicePort d;
  if (!t || !t->devicePort(nic, &d)) return "null";
  return "{\"hca\":" + jsonStr(d.hca) + ",\"port\":" + std::to_string(d.port) + ",\"link_layer\":\"" +
         (d.roce ? "Ethernet" : "InfiniBand") + "\",\"port_active\":" + (d.active ? "true" : "false") +
         ",\"gid_index\":" + std::to_string(d.gidIndex) + ",\"gid\":" + jsonStr(d.gid) + ",\"lid\":" +
         std::to_string(d.lid) + ",\"mtu\":" + std::to_string(d.mtuBytes) + ",\"why\":" + jsonStr(d.why) + "}";
}

// The "nics" array's elements.
static std::string renderNics(Runtime& rt, Health* hl) {
  std::string o;
  for (size_t i = 0; i < rt.nics.size(); ++i) {
    const Nic& n = rt.nics[i];
    if (i) o += ",";
    o += "{\"index\":" + std::to_string(n.index) + ",\"name\":" + jsonStr(n.name) + ",\"addr\":" +
         jsonStr(addrToString(n.getAddr(nullptr))) + ",\"rail\":" + std::to_string(n.rail) +
         ",\"speed_mbps\":" + std::to_string(n.speedMbps) + ",\"up\":" + (!hl || hl->nicUp((int)i) ? "true" : "false") +
         ",\"rdma\":" + rdmaPortJson(rt.transport, (int)i) +
         ",\"transport\":" + jsonStr(rt.transport ? rt.transport->nicTransport((int)i) : "") + "}";
  }
  return o;
}

std::string renderStateFields(Runtime& rt, Health* hl) {
  // the file the journal writes; RAILOVER_EVENT_LOG as given when it could not be opened
  std::string o = "\"event_log\":" + jsonStr(rt.journalFile.empty() ? rt.cfg.eventLog : rt.journalFile) +
                  ",\"transport\":" + jsonStr(rt.transport ? rt.transport->kinds() : "") + ",\"nics\":[" +
                  renderNics(rt, hl);
  o += "],\"pairs\":" + (hl ? hl->pairsJson() : std::string("[]")) + ",\"comms\":[";
  LinkCounters tot;
  uint64_t fatals = 0;
  bool first = true;
  int ncomms = 0;
  rt.links.forEach([&](Link& l) {
    LinkSnap s = l.snapshot();
    if (s.secret == 0) return;
    ++ncomms;
    if (!first) o += ",";
    first = false;
    auto nic = [&](int i) { return i >= 0 && i < (int)rt.nics.size() ? rt.nics[i].name : std::string(); };
    o += "{\"id\":\"" + std::to_string(s.secret) + "\",\"dir\":\"" + (s.isSend ? "send" : "recv") + "\",\"peer\":" +
         jsonStr(s.peer) + ",\"active_nic\":" + jsonStr(s.active >= 0 && s.active < (int)s.paths.size() ? nic(s.paths[s.active].localNic) : "") +
         ",\"primary_nic\":" + jsonStr(s.primary < (int)s.paths.size() ? nic(s.paths[s.primary].localNic) : "") +
         ",\"fatal\":" + (s.fatal ? "true" : "false") + ",\"failovers\":" + std::to_string(s.counters.failovers) +
         ",\"failbacks\":" + std::to_string(s.counters.failbacks) + ",\"flaps\":" + std::to_string(s.counters.flaps) +
         ",\"bytes_resent\":" + std::to_string(s.counters.bytesResent) + ",\"last_detection_us\":" +
         std::to_string(s.counters.lastDetectUs) + ",\"last_convergence_us\":" + std::to_string(s.counters.lastConvergeUs) +
         ",\"paths\":[";
    for (size_t i = 0; i < s.paths.size(); ++i) {
      const PathSnap& p = s.paths[i];
      if (i) o += ",";
      o += "{\"nic\":" + jsonStr(nic(p.localNic)) + ",\"peer\":" + jsonStr(p.peer) + ",\"state\":\"" +
           pathStateName(p.state) + "\",\"primary\":" + ((int)i == s.primary ? "true" : "false") +
           ",\"flaps\":" + std::to_string(p.flaps) + ",\"hold_down_ms\":" + std::to_string(p.holdDownMs) +
           ",\"last_error\":" + jsonStr(p.lastError) + "}";
    }
    o += "]}";
    tot.failovers += s.counters.failovers, tot.failbacks += s.counters.failbacks, tot.flaps += s.counters.flaps;
    tot.bytesResent += s.counters.bytesResent;
    fatals += s.fatal;
  });
  // Lifetime totals: closed comms keep counting, so metrics built on them never go down.
  uint64_t closedFatals = 0;
  LinkCounters closed = rt.links.closedTotals(&closedFatals);
  tot.failovers += closed.failovers, tot.failbacks += closed.failbacks, tot.flaps += closed.flaps;
  tot.bytesResent += closed.bytesResent;
  fatals += closedFatals;
  o += "],\"totals\":{\"comms\":" + std::to_string(ncomms) + ",\"failovers\":" + std::to_string(tot.failovers) +
       ",\"failbacks\":" + std::to_string(tot.failbacks) + ",\"flaps\":" + std::to_string(tot.flaps) +
       ",\"bytes_resent\":" + std::to_string(tot.bytesResent) + ",\"fatal_errors\":" + std::to_string(fatals) + "}";
  return o;
}

StateSource processStateSource(Runtime& rt) {
  StateSource src;
  // The links say when they changed; the NIC entries change without them (a port error or a
  // GID re-choice in the transport, health's view of a NIC that no comm uses): they are
  // rendered and compared (a few short strings every writer period, on the writer thread).
  auto lastNics = std::make_shared<std::string>();
  src.takeChanged = [&rt, lastNics] {
    bool links = rt.links.takeDirty();
    std::string nics = renderNics(rt, Health::get());
    bool changed = nics != *lastNics;
    if (changed) *lastNics = std::move(nics);
    return links || changed;
  };
  src.renderFields = [&rt] { return renderStateFields(rt, Health::get()); };
  return src;
}

}  // namespace railover
