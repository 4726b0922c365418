// A scripted health view for the engine tests: NICs and pairs go up and down when the test
// says so. Used with the byte-stream fake (fake_net.h) and the chunk-level fake
// (engine_only/fake_paths.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "health/health.h"
#include "plugin/devices.h"

namespace railover {
namespace fake {

// Health the test scripts: NICs and pairs go up and down when the test says so.
class ScriptedHealth : public Health {
 public:
  struct PairInfo {
    int nic;
    std::string remote;
    bool up = true, hard = false;
    std::string cause;
    uint64_t repairedUs = 0;
    uint64_t queuedUs = 0;  // last answer that showed a queue (markQueued)
    uint64_t hardSinceUs = 0;  // when the latest hard verdict was set (setPair)
    bool answering = true;     // its probes are answered now (setAnswering; setPair up sets it)
    bool delivering = false;   // pairDeliveredWithinUs says true (setDelivering)
    uint64_t deliveries = 0;   // noteDelivered calls
  };
  std::vector<uint64_t> nicRepairedUs = std::vector<uint64_t>(8, 0);
  std::vector<bool> nics = std::vector<bool>(8, true);
  std::vector<PairInfo> pairs;
  std::vector<std::string> bursts;
  std::vector<bool> burstOn = std::vector<bool>(16, false);  // pairs with a full-size burst running
  std::vector<int> dataAcked;                                // noteDataAcked calls, by pair id

  bool nicUp(int nic) const override { return nic < 0 || nic >= (int)nics.size() || nics[nic]; }
  int registerPair(int nic, const sockaddr_storage& remote, socklen_t) override {
    std::string ra = addrToString(remote);
    for (size_t i = 0; i < pairs.size(); ++i)
      if (pairs[i].nic == nic && pairs[i].remote == ra) return (int)i;
    PairInfo pi;
    pi.nic = nic, pi.remote = ra;
    pairs.push_back(pi);
    return (int)pairs.size() - 1;
  }
  void unregisterPair(int) override {}
  bool pairUp(int id) const override { return id < 0 || pairs[id].up; }
  bool pairHardDown(int id) const override { return id >= 0 && !pairs[id].up && pairs[id].hard; }
  uint64_t pairHardDownSinceUs(int id) const override { return pairHardDown(id) ? pairs[id].hardSinceUs : 0; }
  std::string pairDownCause(int id) const override { return pairs[id].cause; }
  bool pairAnsweredWithinUs(int id, uint64_t) const override { return id < 0 || pairs[id].answering; }
  // The pairs between local NIC `nic` and `remote` answer their probes, or fall silent (a pair
  // still up whose verdict has not come yet).
  void setAnswering(int nic, const std::string& remote, bool answering) {
    for (auto& p : pairs)
      if (p.nic == nic && p.remote == remote) p.answering = answering;
  }
  void requestBurst(int id) override { bursts.push_back(pairs[id].remote); }
  bool burstActive(int id) const override { return id >= 0 && id < (int)burstOn.size() && burstOn[id]; }
  void noteDataAcked(int id) override { dataAcked.push_back(id); }
  void noteDelivered(int id) override {
    if (id >= 0 && id < (int)pairs.size()) pairs[id].deliveries++;
  }
  // Scripted: the window (Monitor's, tested in health_monitor_test.cc) is not modelled.
  bool pairDeliveredWithinUs(int id, uint64_t) const override {
    return id >= 0 && id < (int)pairs.size() && pairs[id].delivering;
  }
  // The pairs between local NIC `nic` and `remote` brought some comm the peer's data or ACKs
  // just now (a busy rail), or nothing lately.
  void setDelivering(int nic, const std::string& remote, bool delivering) {
    for (auto& p : pairs)
      if (p.nic == nic && p.remote == remote) p.delivering = delivering;
  }
  uint64_t repairedUs(int nic, int id) const override {
    uint64_t t = nic >= 0 && nic < (int)nicRepairedUs.size() ? nicRepairedUs[nic] : 0;
    return id >= 0 ? std::max(t, pairs[id].repairedUs) : t;
  }

  uint64_t queuedUs(int id) const override { return id >= 0 ? pairs[id].queuedUs : 0; }
  // A probe answer on every pair between local NIC `nic` and `remote` came back late while
  // another rail answered promptly: congestion on that rail, now.
  void markQueued(int nic, const std::string& remote) {
    for (auto& p : pairs)
      if (p.nic == nic && p.remote == remote) p.queuedUs = nowUs();
  }

  // Sets every pair between local NIC `nic` and address `remote` (both directions' views).
  void setPair(int nic, const std::string& remote, bool up, bool hard, const std::string& cause) {
    for (auto& p : pairs)
      if (p.nic == nic && p.remote == remote) {
        if (up && !p.up) p.repairedUs = nowUs();
        if (up) p.answering = true;
        if (!up && hard) p.hardSinceUs = nowUs();
        p.up = up, p.hard = hard, p.cause = cause;
      }
    bump();
  }
  void setNic(int nic, bool up) {
    if (up && !nics[nic]) nicRepairedUs[nic] = nowUs();
    nics[nic] = up;
    bump();
  }
};

}  // namespace fake
}  // namespace railover
