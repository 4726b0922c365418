// NIC discovery: one railover device per usable interface, chosen with NCCL_SOCKET_IFNAME
// syntax (comma list of prefixes; leading '^' excludes, '=' asks for exact names), and the
// properties NCCL reads (from sysfs).
//
// Thread-safety: the device table is built once at first init and then only read, except
// for each NIC's current address, which the health monitor may re-learn (guarded by a mutex).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <mutex>
#include <string>
#include <vector>

#include "common/config.h"

namespace railover {

// True when interface `name` is selected by `spec` (NCCL_SOCKET_IFNAME syntax).
bool ifnameMatches(const std::string& spec, const std::string& name);

struct Nic {
  int index = 0;            // railover device index (what NCCL calls dev)
  std::string name;         // interface name, e.g. "eth0"
  int ifindex = 0;          // kernel interface index
  int rail = -1;            // rail id: RAILOVER_RAILS, else position in the device list
  std::string pciPath;      // realpath of /sys/class/net/<if>/device, "" for virtual NICs
  int speedMbps = 10000;    // /sys/class/net/<if>/speed, 10 Gb/s when unknown
  uint64_t guid = 0;
  sockaddr_storage addr{};  // current address (port 0); guarded by addrMu after init
  socklen_t addrLen = 0;
  mutable std::mutex addrMu;

  Nic() = default;
  Nic(const Nic& o) { *this = o; }
  Nic& operator=(const Nic& o) {
    index = o.index, name = o.name, ifindex = o.ifindex, rail = o.rail, pciPath = o.pciPath;
    speedMbps = o.speedMbps, guid = o.guid, addr = o.addr, addrLen = o.addrLen;
    return *this;
  }
  // Copy of the current address (thread-safe).
  sockaddr_storage getAddr(socklen_t* len) const;
  void setAddr(const sockaddr_storage& a, socklen_t len);
};

// Enumerates interfaces (getifaddrs) and applies the selection. Returns false with `err`
// when the configuration selects nothing usable.
bool discoverNics(const Config& cfg, std::vector<Nic>* out, std::string* err);

// Looks up the first address of `family` (0 = IPv4 first, then IPv6) on interface `name`.
bool lookupIfAddr(const std::string& name, int family, sockaddr_storage* out, socklen_t* len);

std::string addrToString(const sockaddr_storage& a);

}  // namespace railover
