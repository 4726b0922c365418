// The process runtime's accessor and its unit-test setup, apart from init() and the acceptor
// (runtime.cc, TCP listeners): the failover engine needs only these, so it links without TCP
// (the engine-only test target).
#include "plugin/runtime.h"

#include "health/health.h"

namespace railover {

Runtime& Runtime::get() {
  static Runtime* r = new Runtime();  // never destroyed: the library is -z nodelete
  return *r;
}

LinkDeps Runtime::linkDeps() {
  LinkDeps d;
  d.cfg = &cfg;
  d.nics = &nics;
  d.ports = &ports;
  d.transport = transport;
  d.health = Health::get();
  d.journal = journal;
  d.registry = &links;
  return d;
}

void Runtime::initForTest(const Config& c, const std::vector<Nic>& n, Transport* t, Journal* j) {
  std::lock_guard<std::mutex> g(mu_);
  cfg = c;
  journal = j;
  nics = n;
  ports.assign(nics.size(), 0);
  for (size_t i = 0; i < ports.size(); ++i) ports[i] = (uint16_t)(1000 + i);
  transport = t;
  tried_ = true;
  result_ = ncclSuccess;
  ok_.store(true, std::memory_order_release);
}

}  // namespace railover
