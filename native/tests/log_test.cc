// Rate limit of per-comm failover WARNs (common/log.h).
#include <gtest/gtest.h>

#include "common/log.h"

using namespace railover;

TEST(EventWarn, AtMostTheBudgetPerSecondThenInfo) {
  // 3x the budget in a burst (well inside one second): no more than the budget is WARN, the
  // rest is INFO, and once demoted the burst stays demoted.
  int warns = 0, infos = 0;
  bool demoted = false;
  for (int i = 0; i < 3 * kEventWarnsPerSecond; ++i) {
    unsigned sup = 0;
    ncclDebugLogLevel l = eventWarnLevel(&sup);
    if (l == RO_LOG_WARN) {
      EXPECT_FALSE(demoted) << "a WARN after the budget was used up, call " << i;
      warns++;
    } else {
      EXPECT_EQ(l, RO_LOG_INFO);
      demoted = true;
      infos++;
    }
  }
  EXPECT_LE(warns, kEventWarnsPerSecond);
  EXPECT_GE(infos, 2 * kEventWarnsPerSecond);
}
