#include "plugin/devices.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "common/log.h"

namespace railover {

bool ifnameMatches(const std::string& specIn, const std::string& name) {
  std::string spec = specIn;
  bool exclude = false, exact = false;
  if (!spec.empty() && spec[0] == '^') exclude = true, spec = spec.substr(1);
  if (!spec.empty() && spec[0] == '=') exact = true, spec = spec.substr(1);
  bool hit = false;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t pos = spec.find(',', start);
    std::string item = spec.substr(start, pos == std::string::npos ? std::string::npos : pos - start);
    // blanks around an item are no part of it, as for every list the config parser reads
    // ("eth0, eth1" passes its check as eth0 and eth1, so it must select both)
    size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? std::string() : item.substr(a, b - a + 1);
    if (!item.empty() && (exact ? name == item : name.compare(0, item.size(), item) == 0)) hit = true;
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return exclude ? !hit : hit;
}

namespace {

bool sameFamilyOk(int want, int fam) { return want ? fam == want : (fam == AF_INET || fam == AF_INET6); }

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

// A NIC's guid for NCCL where no device tells a better one: "rail" + its index, unique per device.
static uint64_t nicGuid(int index) { return 0x7261696c00000000ULL | (uint64_t)index; }

std::string joinNames(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
  return s;
}

std::vector<std::string> keepOnlyNics(std::vector<Nic>* nics, const std::vector<std::string>& keep) {
  std::vector<Nic> kept;
  std::vector<std::string> out;
  for (Nic& n : *nics) {
    if (std::find(keep.begin(), keep.end(), n.name) == keep.end()) {
      out.push_back(n.name);
      continue;
    }
    n.index = (int)kept.size();
    n.guid = nicGuid(n.index);
    kept.push_back(n);
  }
  *nics = std::move(kept);
  return out;
}

std::vector<size_t> nicsSharingSubnet(const std::vector<Nic>& nics, const std::vector<int>& prefixLen, size_t i) {
  std::vector<size_t> out;
  auto v4 = [&](size_t k) { return k < prefixLen.size() && prefixLen[k] >= 0 && nics[k].addr.ss_family == AF_INET; };
  if (i >= nics.size() || !v4(i)) return out;
  auto host = [&](size_t k) { return ntohl(((const sockaddr_in&)nics[k].addr).sin_addr.s_addr); };
  for (size_t j = 0; j < nics.size(); ++j) {
    if (j == i || !v4(j)) continue;
    int len = std::min(prefixLen[i], prefixLen[j]);  // overlapping subnets: the larger one holds the other
    uint32_t mask = len <= 0 ? 0u : 0xffffffffu << (32 - std::min(len, 32));
    if ((host(i) & mask) == (host(j) & mask)) out.push_back(j);
  }
  return out;
}

// Appends `name` to `names` unless it is there already (an interface may hold several addresses).
static void addOnce(std::vector<std::string>& names, const std::string& name) {
  if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
}

// Whether nics[i] is served (a device of NCCL): `served` empty means every NIC is.
static bool isServed(const std::vector<bool>& served, size_t i) { return served.empty() || (i < served.size() && served[i]); }

// Interface `name` as a component of a dotted sysctl key: sysctl(8) reads a '/' there as the
// '.' of a VLAN's name (net.ipv4.conf.bond0/100.rp_filter is bond0.100's).
static std::string sysctlName(std::string name) {
  std::replace(name.begin(), name.end(), '.', '/');
  return name;
}

std::vector<std::string> arpFluxWarnings(const std::vector<Nic>& nics, const std::vector<int>& prefixLen,
                                         const std::function<int(const std::string&)>& arpIgnore,
                                         const std::vector<bool>& served) {
  std::vector<std::string> out;
  for (size_t i = 0; i < nics.size(); ++i) {
    std::vector<size_t> group{i};
    bool flux = false, seen = false;  // seen: the group was looked at from an earlier member
    for (size_t j : nicsSharingSubnet(nics, prefixLen, i)) {
      seen |= j < i;
      group.push_back(j);
    }
    if (seen || group.size() < 2) continue;
    // A member answering ARP for every address of the group (arp_ignore=0) harms the served
    // members other than itself: one served NIC beside it is enough.
    std::vector<std::string> names, unserved, answering;  // answering: arp_ignore=0 beside a served NIC
    for (size_t m : group) {
      addOnce(names, nics[m].name);
      if (!isServed(served, m)) addOnce(unserved, nics[m].name);
      if (arpIgnore(nics[m].name) != 0) continue;
      bool harms = false;
      for (size_t n : group) harms |= n != m && isServed(served, n);
      if (harms) addOnce(answering, nics[m].name);
      flux |= harms;
    }
    if (!flux) continue;
    std::string each;  // the per-NIC alternative to the "all" setting, one key per NIC answering
    for (const std::string& n : answering) each += (each.empty() ? "" : " ") + ("net.ipv4.conf." + sysctlName(n) + ".arp_ignore=1");
    out.push_back("railover: NICs " + joinNames(names) + " share subnet " + subnetToString(Subnet{nics[i].addr, prefixLen[i]}) +
           "; of them, " + joinNames(answering) + " (arp_ignore=0) will answer ARP for the others' addresses" +
           (unserved.empty() ? std::string()
                             : " (" + joinNames(unserved) + ": not railover's devices, but on that subnet all the same)") +
           ": a peer may send one NIC's traffic to another, "
           "where railover's sockets (bound to their NIC) do not take it, so connects are refused and probes lost on "
           "that rail; set net.ipv4.conf.all.arp_ignore=1 (or " + each +
           ") and arp_announce=2 (railover doctor checks this)");
  }
  return out;
}

std::vector<std::string> zeroPrefixWarnings(const std::vector<Nic>& nics, const std::vector<int>& prefixLen,
                                            const std::vector<bool>& served) {
  std::vector<std::string> out;
  for (size_t i = 0; i < nics.size() && i < prefixLen.size(); ++i) {
    if (!isServed(served, i) || prefixLen[i] != 0 || nics[i].addr.ss_family != AF_INET) continue;
    out.push_back("railover: NIC " + nics[i].name + "'s address " + addrToString(nics[i].addr) +
                  "/0 has prefix length 0: the kernel gives it no subnet route, so no peer is on its link by its "
                  "address and what it sends leaves wherever other routes say (under strict reverse-path filtering, "
                  "rp_filter=1, what arrives on it is dropped unless the route back leaves through it); its routes "
                  "are not checked here. Give it its subnet's prefix length (railover doctor checks this)");
  }
  return out;
}

std::vector<std::string> rpFilterWarnings(
    const std::vector<Nic>& nics, const std::vector<int>& prefixLen, const std::function<int(const std::string&)>& rpFilter,
    const std::function<std::string(const sockaddr_in&, const sockaddr_in&)>& routeOif,
    const std::vector<uint32_t>& hostAddrs, const std::vector<bool>& served) {
  // A prefix length of 0 is left out here (of the NIC and of those sharing its subnet).
  auto v4 = [&](size_t i) { return i < prefixLen.size() && prefixLen[i] > 0 && nics[i].addr.ss_family == AF_INET; };
  auto host = [&](size_t i) { return ntohl(((const sockaddr_in&)nics[i].addr).sin_addr.s_addr); };
  auto mask = [](int len) { return len <= 0 ? 0u : 0xffffffffu << (32 - len); };
  std::vector<std::string> out;
  for (size_t i = 0; i < nics.size(); ++i) {
    // A /31 or /32 holds no third host: no shared subnet to speak of. Only the NICs served are
    // judged; the others still share their subnets (their routes are the kernel's all the same).
    if (!v4(i) || prefixLen[i] > 30 || !isServed(served, i)) continue;
    std::vector<std::string> sharing;
    for (size_t j : nicsSharingSubnet(nics, prefixLen, i))
      if (v4(j)) addOnce(sharing, nics[j].name);
    if (sharing.empty() || rpFilter(nics[i].name) != 1) continue;
    // The subnets of sharing NICs that lie in this NIC's with a longer prefix: the kernel routes
    // a destination there by the longest prefix, through that NIC (a0 10.0.0.1/16 beside a1
    // 10.0.1.1/24: a peer at 10.0.1.9 on a0's link is answered through a1).
    std::vector<std::pair<uint32_t, int>> inner;  // (network, prefix length), host order
    for (size_t j : nicsSharingSubnet(nics, prefixLen, i)) {
      std::pair<uint32_t, int> sn{host(j) & mask(prefixLen[j]), prefixLen[j]};
      if (v4(j) && prefixLen[j] > prefixLen[i] && std::find(inner.begin(), inner.end(), sn) == inner.end())
        inner.push_back(sn);
    }
    // Where a peer would be answered from: the first address of a subnet that no selected NIC
    // nor other address of this host holds (a connected route covers every address of it
    // alike; the kernel routes one of this host's through lo, whatever the source), of this NIC's subnet outside
    // those inner ones, then of each inner one; 0 when none. 64-bit: a subnet may end at
    // 255.255.255.255. No cap on the addresses tried (doctor's _neighbour has none either):
    // each one is returned or an address of this host, and an inner subnet is passed in one
    // step, so the loop ends within nics + hostAddrs + inner + 1 steps.
    auto firstFree = [&](uint32_t net, int len, bool skipInner) -> uint32_t {
      uint64_t last = net | ~mask(len);
      for (uint64_t a = net + 1ull; a < last; ++a) {
        bool skip = false;
        for (const auto& sn : inner)
          if (skipInner && ((uint32_t)a & mask(sn.second)) == sn.first) skip = true, a = sn.first | ~mask(sn.second);
        if (skip) continue;
        bool ours = false;
        for (size_t j = 0; j < nics.size(); ++j) ours |= nics[j].addr.ss_family == AF_INET && host(j) == a;
        ours |= std::find(hostAddrs.begin(), hostAddrs.end(), (uint32_t)a) != hostAddrs.end();
        if (!ours) return (uint32_t)a;
      }
      return 0;
    };
    std::vector<std::pair<uint32_t, int>> tests{{host(i) & mask(prefixLen[i]), prefixLen[i]}};
    tests.insert(tests.end(), inner.begin(), inner.end());
    sockaddr_in src = (const sockaddr_in&)nics[i].addr, dst{};
    dst.sin_family = AF_INET;
    std::string oif, part = "that subnet";
    for (size_t t = 0; t < tests.size(); ++t) {
      dst.sin_addr.s_addr = htonl(firstFree(tests[t].first, tests[t].second, t == 0));
      if (!dst.sin_addr.s_addr) continue;
      oif = routeOif(src, dst);
      if (!oif.empty() && oif != nics[i].name) {
        if (t > 0) {
          Subnet sn;
          auto& in = (sockaddr_in&)sn.addr;
          in.sin_family = AF_INET;
          in.sin_addr.s_addr = htonl(tests[t].first);
          sn.prefixLen = tests[t].second;
          part = subnetToString(sn) + " (in that subnet)";
        }
        break;
      }
      oif.clear();
    }
    if (oif.empty()) continue;
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &src.sin_addr, ip, sizeof(ip));
    std::string subnet = subnetToString(Subnet{nics[i].addr, prefixLen[i]}), name = nics[i].name;
    out.push_back("railover: NIC " + name + " shares subnet " + subnet + " with " + joinNames(sharing) +
                  ", and its traffic to " + part + " leaves through " + oif +
                  " (no source routing): strict reverse-path filtering (rp_filter=1) drops what peers send to " +
                  name + ", so railover's paths and probes on it get no answer; add source routing (ip rule add from " +
                  ip + " table <N>; ip route add " + subnet + " dev " + name +
                  " table <N>) or loose filtering (sysctl -w net.ipv4.conf.all.rp_filter=2 net.ipv4.conf." + sysctlName(name) +
                  ".rp_filter=2) (railover doctor checks this)");
  }
  return out;
}

// A NIC's effective net.ipv4.conf value for `key` (arp_ignore, rp_filter): the kernel applies the
// larger of the "all" and the NIC's own value. -1 when either cannot be read.
static int effectiveIpv4Conf(const std::string& key, const std::string& name) {
  std::string all = readFile("/proc/sys/net/ipv4/conf/all/" + key), own = readFile("/proc/sys/net/ipv4/conf/" + name + "/" + key);
  if (all.empty() || own.empty()) return -1;
  return std::max(atoi(all.c_str()), atoi(own.c_str()));
}

std::vector<std::string> standbyPairWarnings(const std::vector<std::pair<std::string, std::string>>& pairs,
                                             const std::vector<std::string>& selected,
                                             const std::vector<std::string>& devices) {
  std::vector<std::string> out;
  auto has = [](const std::vector<std::string>& v, const std::string& n) { return std::find(v.begin(), v.end(), n) != v.end(); };
  for (auto& pr : pairs)
    for (const std::string* name : {&pr.first, &pr.second}) {
      if (has(devices, *name)) continue;
      std::string what = has(selected, *name)
                             ? "which is left out of NCCL's devices (no RDMA port, and RAILOVER_TRANSPORT=auto uses the "
                               "RDMA NICs only; devices: " + joinNames(devices) + ")"
                             : "which is not a selected NIC (selected: " + joinNames(selected) + ")";
      out.push_back("railover: RAILOVER_STANDBY pair " + pr.first + "=" + pr.second + " names " + *name + ", " + what +
                    "; comms of that pair get no standby path from it");
    }
  return out;
}

// The IPv4 addresses of this host's interfaces other than `selected` that can share a
// device's subnet, one entry per address (an interface's secondary addresses answer ARP too),
// in getifaddrs order: up with carrier (IFF_UP, IFF_RUNNING), ARP on a shared link (not
// IFF_LOOPBACK, IFF_POINTOPOINT, IFF_NOARP: no loopback, tunnel, WireGuard or dummy), prefix of
// at most 30 bits (a /31 or /32 shares no link: a service address). These are not railover's
// NICs, but one on a device's subnet takes part in its ARP answers and routes. An address
// label (eth0:vip) is named by its interface (eth0). The same rule as doctor's
// _unselected_ipv4_nets. `ifa`: getifaddrs' list; `prefixLen` gets each entry's prefix length.
static std::vector<Nic> otherIpv4Interfaces(const ifaddrs* ifa, const std::vector<Nic>& selected,
                                            std::vector<int>* prefixLen) {
  std::vector<Nic> out;
  for (const ifaddrs* p = ifa; p; p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET || !p->ifa_netmask) continue;
    unsigned flags = p->ifa_flags;
    if (!(flags & IFF_UP) || !(flags & IFF_RUNNING) || (flags & (IFF_LOOPBACK | IFF_POINTOPOINT | IFF_NOARP))) continue;
    int len = __builtin_popcount(((const sockaddr_in*)p->ifa_netmask)->sin_addr.s_addr);
    if (len > 30) continue;
    std::string name = p->ifa_name;
    name = name.substr(0, name.find(':'));  // glibc names an IPv4 address by its label
    bool chosen = false;
    for (const Nic& n : selected) chosen |= n.name == name;
    if (chosen) continue;
    Nic n;
    n.name = name;
    n.ifindex = (int)if_nametoindex(name.c_str());
    memcpy(&n.addr, p->ifa_addr, sizeof(sockaddr_in));
    n.addrLen = sizeof(sockaddr_in);
    out.push_back(n);
    prefixLen->push_back(len);
  }
  return out;
}

void warnNicSetup(const Config& cfg, const std::vector<Nic>& selected, const std::vector<Nic>& devices) {
  // A misspelt RAILOVER_STANDBY pair would leave the NIC's comms without failover, silently;
  // so would a pair naming a NIC left out of NCCL's devices.
  std::vector<std::string> selectedNames, deviceNames;
  for (const Nic& n : selected) selectedNames.push_back(n.name);
  for (const Nic& n : devices) deviceNames.push_back(n.name);
  for (const std::string& w : standbyPairWarnings(cfg.standbyPairs, selectedNames, deviceNames))
    RO_WARN("%s", w.c_str());
  // Judged: the devices. Counted as sharing their subnets: every other selected NIC and every
  // other interface of this host that can share a link (otherIpv4Interfaces): each keeps its
  // address, routes and ARP answers whether railover uses it or not.
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) ifa = nullptr;
  std::vector<uint32_t> hostAddrs;  // every IPv4 address of this host, secondary ones too
  for (const ifaddrs* p = ifa; p; p = p->ifa_next)
    if (p->ifa_addr && p->ifa_addr->sa_family == AF_INET)
      hostAddrs.push_back(ntohl(((const sockaddr_in*)p->ifa_addr)->sin_addr.s_addr));
  std::vector<Nic> nics = selected;
  std::vector<int> prefixLen;
  for (const Subnet& sn : lookupSubnets(selected)) prefixLen.push_back(sn.prefixLen);
  for (const Nic& n : otherIpv4Interfaces(ifa, selected, &prefixLen)) nics.push_back(n);
  if (ifa) freeifaddrs(ifa);
  std::vector<bool> served;
  for (const Nic& n : nics) {
    bool dev = false;
    for (const Nic& d : devices) dev |= d.name == n.name;
    served.push_back(dev);
  }
  for (const std::string& w : zeroPrefixWarnings(nics, prefixLen, served)) RO_WARN("%s", w.c_str());
  auto arpIgnore = [](const std::string& n) { return effectiveIpv4Conf("arp_ignore", n); };
  for (const std::string& w : arpFluxWarnings(nics, prefixLen, arpIgnore, served)) RO_WARN("%s", w.c_str());
  auto rpFilter = [](const std::string& n) { return effectiveIpv4Conf("rp_filter", n); };
  // The route of a NIC in a VRF is its VRF's: the lookup is made there (the kernel's
  // reverse-path filter looks up in the VRF of the NIC a packet arrives on).
  auto route = [&](const sockaddr_in& src, const sockaddr_in& dst) {
    int vrf = 0;
    for (const Nic& n : nics)
      if (n.addr.ss_family == AF_INET && ((const sockaddr_in&)n.addr).sin_addr.s_addr == src.sin_addr.s_addr)
        vrf = l3mdevMaster(n.ifindex);
    return routeOifFrom(src, dst, vrf);
  };
  for (const std::string& w : rpFilterWarnings(nics, prefixLen, rpFilter, route, hostAddrs, served))
    RO_WARN("%s", w.c_str());
}

bool discoverNics(const Config& cfg, std::vector<Nic>* out, std::string* err) {
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) {
    *err = std::string("getifaddrs failed: ") + strerror(errno);
    return false;
  }
  std::vector<std::string> names;
  for (ifaddrs* p = ifa; p; p = p->ifa_next) {
    if (!p->ifa_addr || !sameFamilyOk(cfg.family, p->ifa_addr->sa_family)) continue;
    if (p->ifa_addr->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((sockaddr_in6*)p->ifa_addr)->sin6_addr))
      continue;
    if (std::find(names.begin(), names.end(), p->ifa_name) == names.end()) names.push_back(p->ifa_name);
  }
  freeifaddrs(ifa);
  std::sort(names.begin(), names.end(),
            [](const std::string& a, const std::string& b) { return if_nametoindex(a.c_str()) < if_nametoindex(b.c_str()); });

  std::vector<std::string> chosen;
  if (!cfg.ifnamesVar.empty()) {
    for (auto& n : names)
      if (ifnameMatches(cfg.ifnames, n)) chosen.push_back(n);
  } else {
    // Automatic: like NCCL's socket transport, skip loopback, docker and virbr unless nothing else exists.
    for (auto& n : names)
      if (n != "lo" && n.rfind("docker", 0) != 0 && n.rfind("virbr", 0) != 0) chosen.push_back(n);
    if (chosen.empty())
      for (auto& n : names)
        if (n == "lo") chosen.push_back(n);
  }
  if (chosen.empty()) {
    *err = cfg.ifnamesVar.empty() ? std::string("no network interface with an address was found")
                                  : cfg.ifnamesVar + "='" + cfg.ifnames + "' selects no interface with an address";
    return false;
  }
  if (chosen.size() > 16) chosen.resize(16);

  out->clear();
  for (size_t i = 0; i < chosen.size(); ++i) {
    Nic nic;
    nic.index = (int)i;
    nic.name = chosen[i];
    nic.ifindex = (int)if_nametoindex(chosen[i].c_str());
    nic.rail = (int)i;
    for (auto& r : cfg.rails)
      if (r.first == nic.name) nic.rail = r.second;
    char real[PATH_MAX];
    std::string dev = "/sys/class/net/" + nic.name + "/device";
    if (realpath(dev.c_str(), real)) nic.pciPath = real;
    std::string sp = readFile("/sys/class/net/" + nic.name + "/speed");
    int speed = sp.empty() ? -1 : atoi(sp.c_str());
    nic.speedMbps = speed > 0 ? speed : 10000;
    nic.guid = nicGuid(nic.index);
    if (!lookupIfAddr(nic.name, cfg.family, &nic.addr, &nic.addrLen)) {
      *err = "interface " + nic.name + " lost its address during discovery";
      return false;
    }
    std::string oper = readFile("/sys/class/net/" + nic.name + "/operstate");
    if (oper == "down" || oper == "lowerlayerdown")
      RO_WARN("railover: NIC %s is %s at init; it is kept as a device and used once it comes up", nic.name.c_str(),
              oper.c_str());
    out->push_back(nic);
  }
  for (auto& r : cfg.rails) {
    bool known = false;
    for (auto& n : *out) known |= n.name == r.first;
    if (!known) RO_WARN("railover: RAILOVER_RAILS names %s, which is not a selected NIC", r.first.c_str());
  }
  return true;
}

}  // namespace railover
