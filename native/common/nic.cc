#include "common/nic.h"

#include <arpa/inet.h>
#include <ifaddrs.h>

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

}  // namespace railover
