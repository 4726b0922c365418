// Unit tests: the state file's content as the plugin renders it (plugin/state_file.h). The
// member names and their order are what `railover status` and the exporter read
// (docs/OPERATIONS.md); this pins them, with JSON escaping and health's view of each NIC.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "plugin/runtime.h"
#include "plugin/state_file.h"
#include "tests/scripted_health.h"
#include "tests/test_nic.h"

namespace railover {
namespace {

TEST(StateFile, MembersKeepTheirNamesOrderAndEscaping) {
  Runtime rt;  // a runtime of its own: the process's one is not touched
  rt.cfg.eventLog = "/var/log/ro \"x\".jsonl";
  rt.nics = {testbed::makeNic(0, "eth0", "10.0.0.1"), testbed::makeNic(1, "eth1", "10.0.1.1", 3)};
  rt.nics[1].speedMbps = 25000;
  fake::ScriptedHealth h;
  h.nics[1] = false;
  std::string f = renderStateFields(rt, &h);
  const std::string head =
      R"("event_log":"/var/log/ro \"x\".jsonl","transport":"","nics":[)"
      R"({"index":0,"name":"eth0","addr":"10.0.0.1","rail":0,"speed_mbps":10000,"up":true},)"
      R"({"index":1,"name":"eth1","addr":"10.0.1.1","rail":3,"speed_mbps":25000,"up":false}],"pairs":[],"comms":[)";
  EXPECT_EQ(f.substr(0, head.size()), head) << f;
  // Comms of other tests in this binary may be open or closed: the totals' shape, not values.
  const std::regex tail(
      R"(\],"totals":\{"comms":[0-9]+,"failovers":[0-9]+,"failbacks":[0-9]+,"flaps":[0-9]+,"bytes_resent":[0-9]+,"fatal_errors":[0-9]+\}$)");
  EXPECT_TRUE(std::regex_search(f, tail)) << f;
  EXPECT_EQ(f.find('\n'), std::string::npos) << "members only: the envelope (telemetry/state.cc) ends the line";

  // Before the health monitor starts every NIC reads up and there are no pairs.
  f = renderStateFields(rt, nullptr);
  EXPECT_NE(f.find(R"("rail":3,"speed_mbps":25000,"up":true}],"pairs":[],)"), std::string::npos) << f;
}

}  // namespace
}  // namespace railover
