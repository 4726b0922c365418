// NIC discovery: one railover device per usable interface, chosen with NCCL_SOCKET_IFNAME
// syntax (comma list of prefixes; leading '^' excludes, '=' asks for exact names), and the
// properties NCCL reads (from sysfs).
//
// Thread-safety: the device table is built once at first init and then only read, except
// for each NIC's current address, which the health monitor may re-learn (common/nic.h).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <functional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/nic.h"

namespace railover {

// True when interface `name` is selected by `spec` (NCCL_SOCKET_IFNAME syntax).
bool ifnameMatches(const std::string& spec, const std::string& name);

// Enumerates interfaces (getifaddrs) and applies the selection. Returns false with `err`
// when the configuration selects nothing usable.
bool discoverNics(const Config& cfg, std::vector<Nic>* out, std::string* err);

// Logs the init WARNs about how the NICs share subnets (arpFluxWarnings, rpFilterWarnings) with
// the sysctls and routes of this host now. `selected`: the NICs discoverNics gave; `devices`:
// those NCCL is given (after RAILOVER_TRANSPORT=auto left out the NICs without an RDMA port;
// matched by name). Only devices are judged, as `railover doctor` judges them; the NICs left
// out, and every other interface of this host with an IPv4 address but lo (not selected by
// RAILOVER_IFNAMES / NCCL_SOCKET_IFNAME, or beyond the first 16), still count as sharing a
// subnet (they keep their address, routes and ARP answers: a management NIC on a rail's subnet
// with arp_ignore=0 takes that rail's traffic).
// Also the RAILOVER_STANDBY pairs naming a NIC that is no device (standbyPairWarnings).
void warnNicSetup(const Config& cfg, const std::vector<Nic>& selected, const std::vector<Nic>& devices);

// One warning per name in an explicit RAILOVER_STANDBY pair (`pairs`) that is none of `devices`
// (the NICs NCCL is given): "left out of NCCL's devices" where it is among `selected` (the NICs
// discovered, before RAILOVER_TRANSPORT=auto left out those without an RDMA port), else "not a
// selected NIC"; either way that pair gives no standby path. Pure.
std::vector<std::string> standbyPairWarnings(const std::vector<std::pair<std::string, std::string>>& pairs,
                                             const std::vector<std::string>& selected,
                                             const std::vector<std::string>& devices);

// Keeps only the NICs named in `keep` (in their order in *nics), numbered again from 0 (index
// and the per-device guid follow the new position; names, rails and addresses stay). Returns
// the names of the NICs left out. For RAILOVER_TRANSPORT=auto, which leaves out the NICs
// without an RDMA port when some have one.
std::vector<std::string> keepOnlyNics(std::vector<Nic>* nics, const std::vector<std::string>& keep);

// The selected NICs sharing nics[i]'s IPv4 subnet: the indices j != i, in order, of the NICs
// whose address is IPv4 with a known prefix length and whose subnet overlaps nics[i]'s, i.e. whose
// address agrees with nics[i]'s in the first min(prefixLen[i], prefixLen[j]) bits (the same
// subnet, or one holding the other: 10.0.0.1/24 shares with 10.0.0.17/28 and with 10.0.1.1/16).
// IPv4 only: {} when nics[i] is not IPv4 or its prefix length is unknown, and no IPv6 NIC is
// listed. `prefixLen[k]`: the prefix length of nics[k]'s address (as lookupSubnets gives it; 0
// to 32 for IPv4), -1 when unknown; a shorter vector leaves the rest unknown. Pure.
std::vector<size_t> nicsSharingSubnet(const std::vector<Nic>& nics, const std::vector<int>& prefixLen, size_t i);

// NICs that share an IPv4 subnet and answer ARP for each other's addresses (effective
// arp_ignore 0, the kernel default): a peer may send one NIC's traffic to another, where the
// device-bound sockets railover opens do not take it (connects refused, probes lost), so that
// rail looks broken from the start. Returns one warning per such group of NICs, naming them and
// the subnet ({} when none); a group: a NIC and those nicsSharingSubnet lists for it.
// `prefixLen[i]`: the prefix length of nics[i]'s address, -1 when unknown (ignored where the
// address is not IPv4); `arpIgnore(name)`: the NIC's effective arp_ignore (the larger of
// net.ipv4.conf.all and net.ipv4.conf.<name>), -1 when unknown. `served[i]`: whether nics[i]
// is a device of NCCL (empty: all are); a group is named only where a member with arp_ignore=0
// can take the traffic of a served member other than itself (the one answering may be a NIC
// left out, which the warning says). Pure.
std::vector<std::string> arpFluxWarnings(const std::vector<Nic>& nics, const std::vector<int>& prefixLen,
                                         const std::function<int(const std::string&)>& arpIgnore,
                                         const std::vector<bool>& served = {});

// NICs that share an IPv4 subnet with another selected NIC, under strict reverse-path filtering
// (effective rp_filter 1: the larger of net.ipv4.conf.all and net.ipv4.conf.<name>; the default
// of several distributions), whose own traffic to that subnet the kernel routes through another
// NIC (no source-based policy routing). The kernel then drops what peers send to the NIC, since
// the route back to them does not leave through it: railover's paths and probes on it never
// get an answer, so its rail is down from the start. Its traffic is looked up to one address of
// its subnet outside the subnets of sharing NICs with a longer prefix, then to one of each of
// those (the kernel routes there by the longest prefix: beside a1 10.0.1.1/24, a0 10.0.0.1/16's
// traffic to 10.0.1.0/24 leaves through a1), an address no selected NIC holds each. Returns one
// warning per such NIC, naming it, the subnet, the NICs sharing it (nicsSharingSubnet, a prefix
// length of 0 left out), the part of the subnet whose traffic leaves elsewhere, the NIC it
// leaves through and the fixes ({} when none). `hostAddrs`: every IPv4 address of this host (host
// byte order; of any interface, secondary ones too), never a lookup's destination, as no
// selected NIC's address is: the kernel routes them through lo whatever the source. `prefixLen[i]` as for
// arpFluxWarnings; `rpFilter(name)`: the NIC's effective rp_filter, -1 when unknown;
// `routeOif(src, dst)`: the NIC the kernel routes from src to dst through ("" when unknown: no
// claim), routeOifFrom at init (in the NIC's VRF where it is enslaved to one: l3mdevMaster).
// IPv4 only (rp_filter is IPv4's): a NIC whose address is IPv6 is neither warned about nor
// counted as sharing, and its route is never looked up. `served[i]`: whether nics[i] is a
// device of NCCL (empty: all are): only those are warned about; the others count as sharing.
// Pure apart from those two.
std::vector<std::string> rpFilterWarnings(
    const std::vector<Nic>& nics, const std::vector<int>& prefixLen, const std::function<int(const std::string&)>& rpFilter,
    const std::function<std::string(const sockaddr_in&, const sockaddr_in&)>& routeOif,
    const std::vector<uint32_t>& hostAddrs = {}, const std::vector<bool>& served = {});

// Served NICs (`served` as for rpFilterWarnings) whose IPv4 address has prefix length 0: the
// kernel adds no subnet route for a /0 address (`ip route` lists none), so nothing is on the
// NIC's link by its address, and a stand-in peer "in its subnet" would be no address
// (0.0.0.1): rpFilterWarnings leaves such a NIC out, and `railover doctor` makes no stand-in
// lookup for it; one warning each says so instead ({} when none). Pure.
std::vector<std::string> zeroPrefixWarnings(const std::vector<Nic>& nics, const std::vector<int>& prefixLen,
                                            const std::vector<bool>& served = {});

// "eth1,eth2": NIC names as the logs list them.
std::string joinNames(const std::vector<std::string>& names);

}  // namespace railover
