#include "common/nic.h"

#include <arpa/inet.h>

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

}  // namespace railover
