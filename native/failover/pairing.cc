#include "failover/pairing.h"

#include <algorithm>

namespace railover {

const char* pairingNoteName(PairingNote kind) {
  switch (kind) {
    case PairingNote::kPrimaryRepaired: return "primary_repaired";
    case PairingNote::kPrimaryOffSubnet: return "primary_off_subnet";
    case PairingNote::kStandbyRepaired: return "standby_repaired";
    case PairingNote::kStandbySkipped: return "standby_skipped";
    case PairingNote::kNoPartner: return "no_partner";
  }
  return "unknown";
}

PathPlan planPaths(int dev, const std::vector<int>& standbyNics, const std::vector<LocalNicView>& nics,
                   const PeerHandle& h) {
  PathPlan plan;
  std::vector<bool> used(h.naddr > 0 ? h.naddr : 0, false);
  auto on = [&](int nic, int k) { return inSubnet(h.addrs[k].addr, nics[nic].subnet); };
  // The local NIC whose subnet holds address k, -1 if none.
  auto owner = [&](int k) {
    for (int m = 0; m < (int)nics.size(); ++m)
      if (on(m, k)) return m;
    return -1;
  };
  // An unused address on `nic`'s subnet, the one on its rail first; -1 if none.
  auto onSubnet = [&](int nic) {
    int any = -1;
    for (int k = 0; k < h.naddr; ++k) {
      if (used[k] || !on(nic, k)) continue;
      if (h.addrs[k].rail == nics[nic].rail) return k;
      if (any < 0) any = k;
    }
    return any;
  };
  // The unused address on `rail` (the pairing by rail), -1 if none.
  auto onRail = [&](int rail) {
    for (int k = 0; k < h.naddr; ++k)
      if (!used[k] && h.addrs[k].rail == rail) return k;
    return -1;
  };
  auto peerAddr = [&](int k) {
    return addrToString(h.addrs[k].addr) + " (rail " + std::to_string(h.addrs[k].rail) + ")";
  };
  std::string peerList;
  for (int k = 0; k < h.naddr; ++k) peerList += (k ? ", " : "") + peerAddr(k);
  auto nicText = [&](int nic) { return nics[nic].name + " (" + subnetToString(nics[nic].subnet) + ", rail " +
                                       std::to_string(nics[nic].rail) + ")"; };
  auto note = [&](int nic, PairingNote kind, const std::string& text) {
    plan.notes.push_back({nic, kind, text + "; the peer's NICs: " + peerList +
                                         ". The hosts' rails do not match: check the cabling, the NIC selection "
                                         "(RAILOVER_IFNAMES, NCCL_SOCKET_IFNAME) and RAILOVER_RAILS on both hosts"});
  };

  // The primary: NCCL's pair, unless it leaves dev's subnet while the handle has an address on it.
  int r = h.primary;
  if (nics[dev].subnet.prefixLen >= 0 && !on(dev, r)) {
    int k = onSubnet(dev);
    int m = owner(r);
    if (k >= 0) {
      note(dev, PairingNote::kPrimaryRepaired,
           "NIC " + nicText(dev) + " was to connect to the peer's " + peerAddr(r) +
               " (its NIC NCCL chose), which is not on its subnet; it connects to the peer's " + peerAddr(k) +
               " on its subnet instead");
      r = k;
    } else if (m >= 0) {
      note(dev, PairingNote::kPrimaryOffSubnet,
           "NIC " + nicText(dev) + " connects to the peer's " + peerAddr(r) + " (its NIC NCCL chose), which is on the " +
               "subnet of local NIC " + nics[m].name + ", and the peer has no NIC on " + nics[dev].name +
               "'s subnet: railover still tries it (the kernel sends it on " + nics[dev].name +
               "'s link; without a route or a shared link its connects time out) and carries these comms on "
               "their standby paths");
    }
  }
  used[r] = true;
  plan.pairs.push_back({dev, r});

  // Standbys: first every NIC that has an address on its subnet, then the others by rail.
  std::vector<int> left;
  std::vector<PathPlan::Pair> standbys;
  // A NIC listed twice (RAILOVER_STANDBY=explicit with a pair given twice) is one candidate:
  // a second path from it would take a second address, and the path order pass below would
  // add its pair once per listing.
  std::vector<int> cand;
  for (int j : standbyNics)
    if (j != dev && std::find(cand.begin(), cand.end(), j) == cand.end()) cand.push_back(j);
  for (int j : cand) {
    // The rail pairing (before any standby took an address), to say what changed.
    int byRail = -1;
    for (int a = 0; a < h.naddr && byRail < 0; ++a)
      if (a != r && h.addrs[a].rail == nics[j].rail) byRail = a;
    int k = onSubnet(j);
    if (k < 0) {
      left.push_back(j);
      continue;
    }
    // A mismatch when the rail's partner is off this subnet, or the peer has no NIC on this rail
    // at all (not when NCCL's pair took it: in a flat layout every address is on the subnet).
    bool railKnown = false;
    for (int a = 0; a < h.naddr; ++a) railKnown = railKnown || h.addrs[a].rail == nics[j].rail;
    if (k != byRail && (byRail >= 0 ? !on(j, byRail) : !railKnown))
      note(j, PairingNote::kStandbyRepaired,
           "NIC " + nicText(j) + (byRail >= 0 ? " would pair by rail with the peer's " + peerAddr(byRail) + ", not on its subnet"
                                              : " has no partner on its rail at the peer") +
               "; its standby paths connect to the peer's " + peerAddr(k) + " on its subnet instead");
    used[k] = true;
    standbys.push_back({j, k});
  }
  for (int j : left) {
    int k = onRail(nics[j].rail);
    int m = k >= 0 && nics[j].subnet.prefixLen >= 0 ? owner(k) : -1;
    if (k >= 0 && m >= 0 && m != j) {
      note(j, PairingNote::kStandbySkipped,
           "NIC " + nicText(j) + " would pair by rail with the peer's " + peerAddr(k) + ", which is on the subnet of " +
               "local NIC " + nics[m].name + ": no standby path from " + nics[j].name + " (its connects could only time out)");
      continue;
    }
    if (k < 0) {
      if (nics[j].subnet.prefixLen >= 0)  // unknown subnets: the rail pairing as always, nothing to say
        note(j, PairingNote::kNoPartner,
             "NIC " + nicText(j) + " has no partner at the peer (no free address on its rail or subnet): no standby path "
             "from " + nics[j].name);
      continue;
    }
    used[k] = true;
    standbys.push_back({j, k});
  }
  // In the order of the candidates, as before (path order is what the state file and tests show).
  for (int j : cand)
    for (auto& p : standbys)
      if (p.localNic == j) plan.pairs.push_back(p);
  return plan;
}

}  // namespace railover
