// Sockets bound to one NIC, for every layer that opens them (the TCP transport's streams and
// listeners, the health monitor's UDP probe sockets).
//
// A socket railover opens on a NIC is bound to that NIC's address and to its device
// (SO_BINDTODEVICE), so its traffic leaves through that NIC whatever the routing table says,
// even when several NICs share one subnet without per-address policy routing.
// SO_BINDTODEVICE needs CAP_NET_RAW before Linux 5.7; without it the socket keeps the address
// binding only (logged once per process: egress then follows the routing table).
// Thread-safety: stateless functions on file descriptors the caller owns (the log-once flag
// is atomic).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace railover {

// Binds `fd` to device `ifname` (SO_BINDTODEVICE). Returns 0, or the errno of the failure
// (ENODEV: no such device; EPERM: no CAP_NET_RAW on kernels before 5.7). Empty name: no-op.
int bindToDevice(int fd, const std::string& ifname);

// bindToDevice, where a failure for lack of privilege (EPERM) is not an error (the address
// binding remains). False with `err` ("bind to device <if>: <reason>") on any other failure.
bool bindDeviceOrFail(int fd, const std::string& ifname, std::string* err);

// Opens a non-blocking UDP socket bound to `addr` (its port replaced by `port`, host order) and
// to device `ifname` (when not empty), with IP_FREEBIND (it may be bound while the address is
// absent). Returns the fd, or -1 with `err` naming the failed step.
int udpOn(const sockaddr_storage& addr, socklen_t len, uint16_t port, const std::string& ifname, std::string* err);

}  // namespace railover
