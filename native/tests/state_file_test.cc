// Unit tests: the state file's content as the plugin renders it (plugin/state_file.h). The
// member names and their order are what `railover status` and the exporter read
// (docs/OPERATIONS.md); this pins them, with JSON escaping and health's view of each NIC.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <regex>
#include <string>

#include "plugin/runtime.h"
#include "plugin/state_file.h"
#include "telemetry/state.h"
#include "tests/scripted_health.h"
#include "tests/test_nic.h"
#include "transport/tcp/tcp_transport.h"

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
      R"({"index":0,"name":"eth0","addr":"10.0.0.1","rail":0,"speed_mbps":10000,"up":true,"rdma":null,"transport":""},)"
      R"({"index":1,"name":"eth1","addr":"10.0.1.1","rail":3,"speed_mbps":25000,"up":false,"rdma":null,"transport":""}],)"
      R"("pairs":[],"comms":[)";
  EXPECT_EQ(f.substr(0, head.size()), head) << f;
  // Comms of other tests in this binary may be open or closed: the totals' shape, not values.
  const std::regex tail(
      R"(\],"totals":\{"comms":[0-9]+,"failovers":[0-9]+,"failbacks":[0-9]+,"flaps":[0-9]+,"bytes_resent":[0-9]+,"fatal_errors":[0-9]+\}$)");
  EXPECT_TRUE(std::regex_search(f, tail)) << f;
  EXPECT_EQ(f.find('\n'), std::string::npos) << "members only: the envelope (telemetry/state.cc) ends the line";

  // Before the health monitor starts every NIC reads up and there are no pairs.
  f = renderStateFields(rt, nullptr);
  EXPECT_NE(f.find(R"("rail":3,"speed_mbps":25000,"up":true,"rdma":null,"transport":""}],"pairs":[],)"), std::string::npos) << f;

  // TCP has no device port behind a NIC: "rdma" stays null (the RDMA transport's object is
  // pinned in tests/rdma/rdma_transport_test.cc, RdmaStateFile); every NIC's "transport" is tcp.
  TcpTransport tcp(&rt.nics, &rt.cfg);
  rt.transport = &tcp;
  f = renderStateFields(rt, &h);
  EXPECT_NE(f.find(R"("transport":"tcp","nics":[{"index":0,"name":"eth0","addr":"10.0.0.1","rail":0,)"
                   R"("speed_mbps":10000,"up":true,"rdma":null,"transport":"tcp"},)"),
            std::string::npos)
      << f;
  EXPECT_NE(f.find(R"("up":false,"rdma":null,"transport":"tcp"}],"pairs":[],)"), std::string::npos) << f;
  rt.transport = nullptr;

  // event_log is the file the journal writes (absolute, resolved) once it is open
  rt.cfg.eventLog = "logs/";
  rt.journalFile = "/home/u/job/logs/railover-42.jsonl";
  EXPECT_EQ(renderStateFields(rt, &h).rfind(R"("event_log":"/home/u/job/logs/railover-42.jsonl",)", 0), 0u);
}

}  // namespace
}  // namespace railover

namespace railover {
namespace {

// The writer thread is detached and renders within 100 ms of a change; a change just before
// exit makes its write race the exit cleanup. Here the render is held while stateRemove() (what
// exit runs) is called: once the render is let go, the file must not come back. Before the
// two shared a lock, the writer renamed its file over the removed path (a tester saw one normal
// exit in eight leave a file).
TEST(StateFileExit, AWriteRacingTheExitCleanupDoesNotBringTheFileBack) {
  char tmpl[] = "/tmp/railover-statefile-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  Config cfg;
  cfg.stateDir = dir;
  struct Gate {  // shared with the detached writer thread, which may outlive this test's frame
    std::mutex mu;
    std::condition_variable cv;
    bool rendering = false, release = false;
    int renders = 0;
  };
  auto gate = std::make_shared<Gate>();
  Gate& st = *gate;
  StateSource src;
  src.takeChanged = [] { return true; };
  src.renderFields = [gate] {
    std::unique_lock<std::mutex> g(gate->mu);
    if (++gate->renders == 2) {  // the second write: hold it until the cleanup ran
      gate->rendering = true;
      gate->cv.notify_all();
      gate->cv.wait(g, [&] { return gate->release; });
    }
    return std::string("\"x\":1");
  };
  stateStart(cfg, true, src);
  std::string path = statePath();
  {
    std::unique_lock<std::mutex> g(st.mu);
    ASSERT_TRUE(st.cv.wait_for(g, std::chrono::seconds(30), [&] { return st.rendering; }))
        << "the writer never rendered twice";
  }
  ASSERT_EQ(access(path.c_str(), F_OK), 0) << "the first write made the file";
  stateRemove();  // what exit runs, while the writer is inside its second render
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  {
    std::lock_guard<std::mutex> g(st.mu);
    st.release = true;
  }
  st.cv.notify_all();
  // The writer finishes that render, then would open, write and rename within microseconds;
  // give it ample time (300 ms: three of its 100 ms periods) and check the file stays gone.
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_NE(access(path.c_str(), F_OK), 0) << "the writer brought the file back after the exit cleanup";
    ASSERT_NE(access((path + ".tmp").c_str(), F_OK), 0);
  }
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace railover
