// One NIC railover uses (a railover device): what every layer needs to know about it. Built by
// NIC discovery (plugin/devices.h) and handed down to the engine, health and the transports,
// which look nothing up themselves except a NIC's current address (lookupIfAddr below, which
// the health monitor calls when netlink reports an address change).
//
// Thread-safety: every field is fixed after discovery except the current address, which the
// health monitor may re-learn (getAddr/setAddr, guarded by addrMu).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace railover {

struct Nic {
  int index = 0;            // railover device index (what NCCL calls dev)
  std::string name;         // interface name, e.g. "eth0"
  int ifindex = 0;          // kernel interface index at discovery (health follows the name to a re-registered device)
  int rail = -1;            // rail id: RAILOVER_RAILS, else position in the device list
  std::string pciPath;      // realpath of /sys/class/net/<if>/device, "" for virtual NICs
  int speedMbps = 10000;    // /sys/class/net/<if>/speed, 10 Gb/s when unknown
  uint64_t guid = 0;        // "rail" + index, or the transport's (Transport::DeviceProps)
  int port = 0;             // NCCL's property "port": 0, or the transport's (RDMA: HCA port)
  int maxComms = 65536;     // NCCL's property "maxComms", or the transport's
  sockaddr_storage addr{};  // current address (port 0); guarded by addrMu after init
  socklen_t addrLen = 0;
  mutable std::mutex addrMu;

  Nic() = default;
  Nic(const Nic& o) { *this = o; }
  Nic& operator=(const Nic& o) {
    index = o.index, name = o.name, ifindex = o.ifindex, rail = o.rail, pciPath = o.pciPath;
    speedMbps = o.speedMbps, guid = o.guid, port = o.port, maxComms = o.maxComms, addr = o.addr, addrLen = o.addrLen;
    return *this;
  }
  // Copy of the current address (thread-safe).
  sockaddr_storage getAddr(socklen_t* len) const;
  void setAddr(const sockaddr_storage& a, socklen_t len);
};

// The address of `a` without its port ("10.0.0.1", "fd00::1"; "?" for another family).
std::string addrToString(const sockaddr_storage& a);

// Looks up the current address of interface `name` (getifaddrs): the first one of `family`
// (AF_INET or AF_INET6; 0 = IPv4 first, then IPv6), never an IPv6 link-local one. Fills *out
// (port 0) and *len; false when the interface has no such address (or getifaddrs fails).
// Used by NIC discovery and by the health monitor to re-learn a NIC's address after a change.
// Thread-safety: stateless; safe from any thread.
bool lookupIfAddr(const std::string& name, int family, sockaddr_storage* out, socklen_t* len);

// A NIC's subnet: its address and prefix length in bits (-1: unknown, e.g. a fake NIC in a
// test or an address the kernel no longer lists).
struct Subnet {
  sockaddr_storage addr{};
  int prefixLen = -1;
};

// Whether `a` lies in `s`: same family, the first prefixLen bits equal. False when s is unknown.
bool inSubnet(const sockaddr_storage& a, const Subnet& s);
// "10.0.1.0/24", "fd00::/64"; "?" when unknown.
std::string subnetToString(const Subnet& s);

// The subnets of `nics` now: each NIC's current address with the prefix length the kernel lists
// for it (one getifaddrs call); prefixLen -1 where the address is not found.
// Thread-safety: reads each NIC's address under its lock; safe from any thread.
std::vector<Subnet> lookupSubnets(const std::vector<Nic>& nics);

// The ifindex of the VRF (an l3mdev master: `ip link add <name> type vrf table <N>`) that
// interface `ifindex` is enslaved to; 0 when none (no master, or a master of another kind: bond,
// bridge), when the interface is gone or netlink does not answer within 1 s. One RTM_GETLINK.
// Thread-safety: stateless; safe from any thread.
int l3mdevMaster(int ifindex);

// The NIC the kernel routes IPv4 traffic from local address `src` to `dst` through, as
// `ip route get <dst> from <src>` shows it (one RTM_GETROUTE on a netlink socket: the policy
// rules and tables are applied, no socket is bound to a device). `vrf`: the ifindex of the VRF
// (l3mdevMaster) of the NIC holding `src`, 0 for none: the lookup is then made in the VRF's table,
// as `ip route get <dst> from <src> vrf <name>` makes it (without it, the rules send a lookup
// from a VRF's address to the main table, which has none of the VRF's routes). "" when there is
// no route or netlink does not answer within 1 s. Thread-safety: stateless; safe from any thread.
std::string routeOifFrom(const sockaddr_in& src, const sockaddr_in& dst, int vrf = 0);

}  // namespace railover
