// The process's Health (whichever was started or installed) and its epoch hook: kept apart
// from the monitor (health.cc) so that the failover engine links without the monitor's
// sockets (the engine-only test target).
#include <atomic>

#include "health/health.h"

namespace railover {

namespace {
std::atomic<Health*> gHealth{nullptr};
std::atomic<void (*)()> gEpochHook{nullptr};
}  // namespace

Health* Health::get() { return gHealth.load(std::memory_order_acquire); }
void Health::install(Health* h) { gHealth.store(h, std::memory_order_release); }
void Health::setEpochHook(void (*hook)()) { gEpochHook.store(hook, std::memory_order_release); }
void Health::notifyEpoch() {
  if (auto h = gEpochHook.load(std::memory_order_acquire)) h();
}

}  // namespace railover
