#include "common/nic.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>

namespace railover {

sockaddr_storage Nic::getAddr(socklen_t* len) const {
  std::lock_guard<std::mutex> g(addrMu);
  if (len) *len = addrLen;
  return addr;
}

void Nic::setAddr(const sockaddr_storage& a, socklen_t len) {
  std::lock_guard<std::mutex> g(addrMu);
  addr = a, addrLen = len;
}

std::string addrToString(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN + 8] = "?";
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((const sockaddr_in&)a).sin_addr, buf, sizeof(buf));
  } else if (a.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((const sockaddr_in6&)a).sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

bool lookupIfAddr(const std::string& name, int family, sockaddr_storage* out, socklen_t* len) {
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return false;
  bool found = false;
  for (int pass = 0; pass < 2 && !found; ++pass) {
    int want = family ? family : (pass == 0 ? AF_INET : AF_INET6);
    for (ifaddrs* p = ifa; p; p = p->ifa_next) {
      if (!p->ifa_addr || name != p->ifa_name || p->ifa_addr->sa_family != want) continue;
      if (want == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((sockaddr_in6*)p->ifa_addr)->sin6_addr)) continue;
      memset(out, 0, sizeof(*out));
      *len = want == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      memcpy(out, p->ifa_addr, *len);
      found = true;
      break;
    }
    if (family) break;
  }
  freeifaddrs(ifa);
  return found;
}

bool inSubnet(const sockaddr_storage& a, const Subnet& s) {
  if (s.prefixLen < 0 || a.ss_family != s.addr.ss_family) return false;
  const uint8_t* x;
  const uint8_t* y;
  int bits;
  if (a.ss_family == AF_INET) {
    x = (const uint8_t*)&((const sockaddr_in&)a).sin_addr, y = (const uint8_t*)&((const sockaddr_in&)s.addr).sin_addr;
    bits = 32;
  } else if (a.ss_family == AF_INET6) {
    x = ((const sockaddr_in6&)a).sin6_addr.s6_addr, y = ((const sockaddr_in6&)s.addr).sin6_addr.s6_addr;
    bits = 128;
  } else {
    return false;
  }
  int n = s.prefixLen < bits ? s.prefixLen : bits;
  if (memcmp(x, y, n / 8) != 0) return false;
  if (n % 8 == 0) return true;
  uint8_t mask = (uint8_t)(0xff << (8 - n % 8));
  return (x[n / 8] & mask) == (y[n / 8] & mask);
}

std::string subnetToString(const Subnet& s) {
  if (s.prefixLen < 0) return "?";
  sockaddr_storage net = s.addr;
  uint8_t* b = net.ss_family == AF_INET ? (uint8_t*)&((sockaddr_in&)net).sin_addr
                                        : ((sockaddr_in6&)net).sin6_addr.s6_addr;
  int bytes = net.ss_family == AF_INET ? 4 : 16;
  for (int i = 0; i < bytes; ++i) {
    int keep = s.prefixLen - 8 * i;
    b[i] &= keep >= 8 ? 0xff : keep <= 0 ? 0 : (uint8_t)(0xff << (8 - keep));
  }
  return addrToString(net) + "/" + std::to_string(s.prefixLen);
}

std::vector<Subnet> lookupSubnets(const std::vector<Nic>& nics) {
  std::vector<Subnet> out(nics.size());
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return out;
  for (size_t i = 0; i < nics.size(); ++i) {
    socklen_t len = 0;
    sockaddr_storage a = nics[i].getAddr(&len);
    for (ifaddrs* p = ifa; p; p = p->ifa_next) {
      if (!p->ifa_addr || !p->ifa_netmask || nics[i].name != p->ifa_name || p->ifa_addr->sa_family != a.ss_family) continue;
      Subnet s;
      memcpy(&s.addr, p->ifa_addr, a.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
      if (!inSubnet(a, Subnet{s.addr, a.ss_family == AF_INET ? 32 : 128})) continue;  // another address of the NIC
      const uint8_t* m = a.ss_family == AF_INET ? (const uint8_t*)&((const sockaddr_in*)p->ifa_netmask)->sin_addr
                                                : ((const sockaddr_in6*)p->ifa_netmask)->sin6_addr.s6_addr;
      int bytes = a.ss_family == AF_INET ? 4 : 16, bits = 0;
      for (int b = 0; b < bytes; ++b) bits += __builtin_popcount(m[b]);
      s.prefixLen = bits;
      out[i] = s;
      break;
    }
  }
  freeifaddrs(ifa);
  return out;
}

namespace {

// Fills the header of a one-shot rtnetlink request of `type` whose fixed payload is `payload` bytes.
void startRequest(nlmsghdr* h, uint16_t type, size_t payload) {
  h->nlmsg_len = NLMSG_LENGTH(payload);
  h->nlmsg_type = type;
  h->nlmsg_flags = NLM_F_REQUEST;
  h->nlmsg_seq = 1;
}

// Sends one rtnetlink request (`req`, its nlmsg_len bytes) and receives the kernel's first
// answer into `buf` (`size` bytes). Returns the bytes received, or -1 when no socket, the send
// failed or no answer came within 1 s (SO_RCVTIMEO: init must not hang on netlink).
ssize_t askRouteNetlink(const nlmsghdr* req, char* buf, size_t size) {
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return -1;
  timeval tv{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  ssize_t n = -1;
  if (sendto(fd, req, req->nlmsg_len, 0, (sockaddr*)&kernel, sizeof(kernel)) >= 0) n = recv(fd, buf, size, 0);
  close(fd);
  return n;
}

}  // namespace

int l3mdevMaster(int ifindex) {
  if (ifindex <= 0) return 0;
  struct {
    nlmsghdr h;
    ifinfomsg i;
  } req;
  memset(&req, 0, sizeof(req));
  startRequest(&req.h, RTM_GETLINK, sizeof(ifinfomsg));
  req.i.ifi_family = AF_UNSPEC;
  req.i.ifi_index = ifindex;
  alignas(nlmsghdr) char buf[32768];  // one RTM_NEWLINK: its statistics and link info included
  ssize_t n = askRouteNetlink(&req.h, buf, sizeof(buf));
  int left = n > 0 ? (int)n : 0, master = 0;
  bool vrf = false;
  auto* h = (nlmsghdr*)buf;
  if (!NLMSG_OK(h, left) || h->nlmsg_type != RTM_NEWLINK) return 0;  // NLMSG_ERROR: no such interface
  int len = (int)IFLA_PAYLOAD(h);
  for (auto* at = IFLA_RTA((ifinfomsg*)NLMSG_DATA(h)); RTA_OK(at, len); at = RTA_NEXT(at, len)) {
    if (at->rta_type == IFLA_MASTER && RTA_PAYLOAD(at) >= sizeof(int)) memcpy(&master, RTA_DATA(at), sizeof(master));
    if (at->rta_type != IFLA_LINKINFO) continue;
    // the kind of the master's driver, as `ip -d link` shows it ("vrf_slave", "bridge_slave")
    int inner = (int)RTA_PAYLOAD(at);
    for (auto* in = (rtattr*)RTA_DATA(at); RTA_OK(in, inner); in = RTA_NEXT(in, inner))
      if (in->rta_type == IFLA_INFO_SLAVE_KIND)
        vrf = std::string((const char*)RTA_DATA(in), strnlen((const char*)RTA_DATA(in), RTA_PAYLOAD(in))) == "vrf";
  }
  return vrf ? master : 0;
}

std::string routeOifFrom(const sockaddr_in& src, const sockaddr_in& dst, int vrf) {
  struct {
    nlmsghdr h;
    rtmsg r;
    char attrs[3 * RTA_SPACE(sizeof(in_addr))];
  } req;
  memset(&req, 0, sizeof(req));
  startRequest(&req.h, RTM_GETROUTE, sizeof(rtmsg));
  req.r.rtm_family = AF_INET;
  req.r.rtm_dst_len = 32;
  req.r.rtm_src_len = 32;
  auto add = [&](unsigned short type, const void* data, size_t size) {
    auto* at = (rtattr*)((char*)&req + NLMSG_ALIGN(req.h.nlmsg_len));
    at->rta_type = type;
    at->rta_len = RTA_LENGTH(size);
    memcpy(RTA_DATA(at), data, size);
    req.h.nlmsg_len = NLMSG_ALIGN(req.h.nlmsg_len) + RTA_ALIGN(at->rta_len);
  };
  add(RTA_DST, &dst.sin_addr, sizeof(in_addr));
  add(RTA_SRC, &src.sin_addr, sizeof(in_addr));
  // The VRF as the output device: the kernel's l3mdev rule then looks up in its table, as for
  // `ip route get ... vrf <name>` (and as for a socket bound to a NIC of the VRF); without it the
  // VRF's routes are not looked at (no rule sends a lookup without a device to its table).
  if (vrf > 0) add(RTA_OIF, &vrf, sizeof(vrf));
  std::string out;
  alignas(nlmsghdr) char buf[8192];
  ssize_t n = askRouteNetlink(&req.h, buf, sizeof(buf));
  int left = n > 0 ? (int)n : 0;
  for (auto* h = (nlmsghdr*)buf; out.empty() && NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
    if (h->nlmsg_type != RTM_NEWROUTE) break;  // NLMSG_ERROR: no route (ENETUNREACH, ...)
    auto* r = (rtmsg*)NLMSG_DATA(h);
    int len = (int)RTM_PAYLOAD(h);
    for (auto* at = RTM_RTA(r); RTA_OK(at, len); at = RTA_NEXT(at, len)) {
      if (at->rta_type != RTA_OIF || RTA_PAYLOAD(at) < sizeof(int)) continue;
      int idx = 0;
      memcpy(&idx, RTA_DATA(at), sizeof(idx));
      char name[IF_NAMESIZE] = {};
      if (if_indextoname((unsigned)idx, name)) out = name;
    }
  }
  return out;
}

}  // namespace railover
