#include "common/nic_socket.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "common/log.h"

namespace railover {

int bindToDevice(int fd, const std::string& ifname) {
  if (ifname.empty()) return 0;
  if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ifname.c_str(), (socklen_t)ifname.size()) == 0) return 0;
  int e = errno;
  static std::atomic<bool> warned{false};
  if (e == EPERM && !warned.exchange(true))
    RO_WARN("railover: cannot bind sockets to NIC %s (SO_BINDTODEVICE: %s; needs CAP_NET_RAW before Linux 5.7): "
            "they are bound to the NIC's address only, and egress follows the routing table",
            ifname.c_str(), strerror(e));
  return e;
}

bool bindDeviceOrFail(int fd, const std::string& ifname, std::string* err) {
  int e = bindToDevice(fd, ifname);
  if (e == 0 || e == EPERM) return true;
  *err = "bind to device " + ifname + ": " + strerror(e);
  return false;
}

int udpOn(const sockaddr_storage& addrIn, socklen_t len, uint16_t port, const std::string& ifname, std::string* err) {
  sockaddr_storage addr = addrIn;
  if (addr.ss_family == AF_INET) ((sockaddr_in*)&addr)->sin_port = htons(port);
  else ((sockaddr_in6*)&addr)->sin6_port = htons(port);
  int fd = socket(addr.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return *err = std::string("socket: ") + strerror(errno), -1;
  int one = 1;
  setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &one, sizeof(one));
  if (!bindDeviceOrFail(fd, ifname, err)) {
    close(fd);
    return -1;
  }
  if (bind(fd, (sockaddr*)&addr, len) != 0) {
    *err = std::string("bind udp: ") + strerror(errno);
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace railover
