// railover-perf: drives any NCCL net plugin the way NCCL's proxy does, without GPUs.
//
// One process per rank; ranks meet through pathname UNIX sockets in --rendezvous DIR (works
// across network namespaces). See usage() for options, report.h for the output formats,
// engine.h for the thread model and workload.h for the data patterns.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tools/perf/engine.h"
#include "tools/perf/net.h"
#include "tools/perf/rendezvous.h"
#include "tools/perf/report.h"
#include "tools/perf/util.h"
#include "tools/perf/workload.h"

using namespace rperf;

namespace {

// The longest value of any seconds option (7 days): far above any test's, and every sum the
// driver forms from them stays exact in a double and within a uint64_t of µs.
constexpr double kMaxSeconds = 7 * 86400;
// The longest timed run with --timeseries (24 h): its 1 ms buckets are allocated up front, 8
// bytes each (about 690 MB for 24 h), plus at most an hour of tail (Workload::runDuration).
constexpr double kMaxTimeseriesSeconds = 86400;

const char* kUsage = R"(usage: railover-perf --plugin PATH --rank R --nranks N --rendezvous DIR [options]

Loads an NCCL net plugin (dlopen RTLD_NOW|RTLD_LOCAL, symbols ncclNetPlugin_v12..v7) and drives
it like NCCL's proxy: a service thread (listen/connect/accept/regMr/close, connect and accept
polled) and a progress thread (isend/irecv/test, 8 requests in flight per connection, oldest
tested first). One process per rank; start all N with the same DIR, in any order.

workload and sizes (nccl-tests style; sizes accept 8, 64K, 1M, 256M, 1G):
  -W, --workload sendrecv|allreduce   sendrecv: send to rank+1, receive from rank-1
                                      allreduce: ring reduce-scatter + all-gather, float32 sum
  --pattern ring|pairs|oneway  sendrecv peers: ring (default, as nccl-tests), pairs (2k <-> 2k+1)
                           or oneway (2k -> 2k+1 only: the shape of perftest's ib_write_bw)
  -b, --minbytes SIZE      smallest size            (default 8)
  -e, --maxbytes SIZE      largest size             (default 8M)
  -f, --stepfactor F       multiply size by F       (default 2)
  -i, --stepbytes SIZE     add SIZE instead of multiplying
  -n, --iters N            timed iterations per size (default 20)
  -w, --warmup N           warm-up iterations per size (default 5)
  -c, --check 0|1          generate and verify data (default 1)
  --channels C             channels; each has its own send+recv comm pair (default 1)
  --contexts K             plugin init contexts, channel c uses context c%K (default 1;
                           v11+: one init(ctx) per context; <=v10: NCCL-style shim contexts)
  --dev D                  plugin device for listen/connect (default 0)
  --dev-spread             channel c uses device (D + c) % ndev, as NCCL spreads channels
                           over NICs (default: every channel on device D)
  --slot-size SIZE         SIMPLE step size = receive size posted (default 512K)
  --ll-slot SIZE           LL step size (default 64K)
  --ll-max SIZE            sizes up to this use LL steps with the optional-completion
                           marker 0x1 in *request before irecv (v9+) (default 16K)

plugin and life cycle:
  --plugin PATH            plugin .so (required)
  --abi N                  use ncclNetPlugin_vN only (7..12); default: newest exported
  --reload                 run twice as two communicators; dlclose+dlopen in between
  --reload-no-init         like --reload, but (<=v10) skip init/devices after the reload,
                           as NCCL 2.22-2.23 do
  --reconnect-every N      every N iterations switch to connections the service thread
                           opened while the previous ones carried data (0 = off)
  --no-close-inflight      do not leave extra requests in flight when closing
  --no-profiler-handles    pass NULL profiler handles to v10+ isend/irecv
  --group N                post SIMPLE receive steps N at a time (1..8) as one grouped irecv
                           (NCCL's shared comms; needs maxRecvs >= N; sendrecv only, whose steps
                           do not depend on each other): buffers in reverse step
                           order, each with its own tag (rank * 8 + step % 8), so the plugin must
                           place every message by its tag (default 1: one step per irecv)
  --send-ahead             with --group N: each pass first tries the isend of a later step,
                           alternately the next-but-one (it may share the next step's irecv)
                           and the one N steps on (always a later irecv), as the connections
                           sharing a comm under PXN post out of each other's order; the plugin
                           must answer a step with a NULL request until its irecv is the oldest
                           not yet filled
  --flush                  iflush every SIMPLE receive (with --group: every grouped irecv) with
                           bytes before handing it on, as NCCL does with GPUDirect RDMA (the
                           footer and the JSON count the flushes)
  --traffic-class TC       ncclNetCommConfig_t.trafficClass (default -1)

timed run (failover timelines):
  --duration SECONDS       run the -b size repeatedly for this long (rank 0 keeps time; any
                           seconds option: 0 to 7 days; with --timeseries at most 24 h: 8
                           bytes of buckets per ms)
  --timeseries FILE        bytes received per 1 ms bucket + per-iteration latency
                           (.csv → CSV, otherwise JSON lines; %r = rank); in a sweep
                           (no --duration): per-iteration latency of the timed iterations
  --stop-file PATH         rank 0 ends the timed run as soon as PATH exists (checked every
                           10 ms); --duration stays the upper bound
  --no-iter-records        timed run: keep no per-iteration record (the time series then
                           has only the 1 ms byte buckets, which are allocated up front), so
                           the process's memory stays flat however long it runs

benchmark helpers:
  --hold SECONDS           after the run, keep every comm connected and idle (no request in
                           flight, progress thread parked) for SECONDS before closing
  --pause-recv R:AT:FOR    timed run: rank R's progress thread stops posting and testing
                           receives AT s after the start, for FOR s (sends go on)

output and limits:
  --json FILE              machine-readable results (%r = rank; without %r only rank 0)
  --op-timeout SECONDS     a request, connection setup or plugin call stuck this long is
                           reported and ends the run (default 30)
  --rendezvous-timeout S   time for all ranks to join / pass a barrier (default 60)
  --idle-sleep-us N        progress thread sleeps N us after 64 passes without progress
                           (default 0: spin with sched_yield, as NCCL does; use on
                           oversubscribed machines where ranks outnumber cores)
  --selftest-corrupt K     flip one byte of rank 0's K-th non-empty message (checks the checker)
  --all-ranks-print        every rank prints the table (default: rank 0 only)
  -v, --verbose            driver INFO lines on stderr (also with NCCL_DEBUG=INFO)
  -h, --help

Plugin log lines go to stderr per NCCL_DEBUG (WARN [default], INFO, TRACE) and
NCCL_DEBUG_SUBSYS (INIT, NET, PROXY, ALL; ^ excludes).
Exit codes: 0 ok, 1 wrong data, 2 usage/load error, 3 plugin error, 4 timeout (stuck request
or call), 5 rendezvous failure or peer exit, 6 internal error.
)";

[[noreturn]] void usageError(const std::string& msg) {
  fprintf(stderr, "railover-perf: %s\n(try --help)\n", msg.c_str());
  exit(kExitUsage);
}

bool parseInt(const std::string& s, long lo, long hi, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  long v = strtol(s.c_str(), &end, 10);
  if (*end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

Options parseArgs(int argc, char** argv) {
  Options o;
  std::vector<std::string> a(argv + 1, argv + argc);
  for (size_t i = 0; i < a.size(); i++) {
    std::string k = a[i], v;
    size_t eq = k.find('=');
    bool hasEq = k.rfind("--", 0) == 0 && eq != std::string::npos;
    if (hasEq) {
      v = k.substr(eq + 1);
      k = k.substr(0, eq);
    }
    auto val = [&]() -> std::string {
      if (hasEq) return v;
      if (i + 1 >= a.size()) usageError("missing value for " + k);
      return a[++i];
    };
    auto sizeVal = [&]() {
      uint64_t x;
      std::string s = val();
      if (!parseSize(s, &x)) usageError("bad size for " + k + ": " + s);
      return x;
    };
    auto intVal = [&](long lo, long hi) {
      long x;
      std::string s = val();
      if (!parseInt(s, lo, hi, &x)) usageError(strf("bad value for %s: %s (expected %ld..%ld)", k.c_str(), s.c_str(), lo, hi));
      return x;
    };
    auto secVal = [&]() {
      double x;
      std::string s = val();
      if (!parseSeconds(s, &x) || x > kMaxSeconds)
        usageError("bad seconds for " + k + ": " + s + strf(" (expected 0 to %.0f: 7 days)", kMaxSeconds));
      return x;
    };
    if (k == "-h" || k == "--help") {
      fputs(kUsage, stdout);
      exit(0);
    } else if (k == "--plugin") o.plugin = val();
    else if (k == "--abi") o.abi = int(intVal(7, 12));
    else if (k == "--rank") o.rank = int(intVal(0, 1 << 20));
    else if (k == "--nranks") o.nranks = int(intVal(1, 4096));
    else if (k == "--rendezvous") o.rendezvous = val();
    else if (k == "-W" || k == "--workload") {
      std::string w = val();
      if (w == "sendrecv") o.workload = Workload::kSendRecv;
      else if (w == "allreduce") o.workload = Workload::kAllReduce;
      else usageError("unknown workload " + w + " (sendrecv, allreduce)");
    } else if (k == "--pattern") {
      std::string pt = val();
      if (pt == "ring") o.pairs = o.oneway = false;
      else if (pt == "pairs") o.pairs = true, o.oneway = false;
      else if (pt == "oneway") o.pairs = o.oneway = true;
      else usageError("unknown pattern " + pt + " (ring, pairs, oneway)");
    } else if (k == "-b" || k == "--minbytes") o.minBytes = sizeVal();
    else if (k == "-e" || k == "--maxbytes") o.maxBytes = sizeVal();
    else if (k == "-f" || k == "--stepfactor") {
      double f;
      std::string s = val();
      if (!parseSeconds(s, &f) || f <= 1.0) usageError("bad factor (must be > 1): " + s);
      o.factor = f;
    } else if (k == "-i" || k == "--stepbytes") o.stepBytes = sizeVal();
    else if (k == "-n" || k == "--iters") o.iters = int(intVal(0, 1L << 30));
    else if (k == "-w" || k == "--warmup") o.warmup = int(intVal(0, 1L << 30));
    else if (k == "-c" || k == "--check") o.check = intVal(0, 1) != 0;
    else if (k == "--channels") o.channels = int(intVal(1, 1024));
    else if (k == "--contexts") o.contexts = int(intVal(1, 64));
    else if (k == "--dev") o.dev = int(intVal(0, 1 << 16));
    else if (k == "--dev-spread") o.devSpread = true;
    else if (k == "--stop-file") o.stopFile = val();
    else if (k == "--hold") o.holdS = secVal();
    else if (k == "--pause-recv") {
      std::string pv = val();
      size_t a = pv.find(':'), b = a == std::string::npos ? a : pv.find(':', a + 1);
      long r;
      double at, dur;
      if (b == std::string::npos || !parseInt(pv.substr(0, a), 0, 1 << 20, &r) ||
          !parseSeconds(pv.substr(a + 1, b - a - 1), &at) || !parseSeconds(pv.substr(b + 1), &dur) || dur <= 0)
        usageError("bad value for --pause-recv: " + pv + " (expected RANK:AT_SECONDS:FOR_SECONDS)");
      o.pauseRecvRank = int(r);
      o.pauseRecvAtS = at;
      o.pauseRecvForS = dur;
    }
    else if (k == "--slot-size") o.slotBytes = sizeVal();
    else if (k == "--ll-slot") o.llSlotBytes = sizeVal();
    else if (k == "--ll-max") o.llMax = sizeVal();
    else if (k == "--reconnect-every") o.reconnectEvery = int(intVal(0, 1L << 30));
    else if (k == "--reload") o.reload = true;
    else if (k == "--reload-no-init") o.reload = o.reloadNoInit = true;
    else if (k == "--duration") o.duration = secVal();
    else if (k == "--timeseries") o.timeseries = val();
    else if (k == "--json") o.json = val();
    else if (k == "--op-timeout") o.opTimeout = secVal();
    else if (k == "--idle-sleep-us") o.idleSleepUs = int(intVal(0, 100000));
    else if (k == "--rendezvous-timeout") o.rvTimeout = secVal();
    else if (k == "--traffic-class") o.trafficClass = int(intVal(-1, 1 << 20));
    else if (k == "--no-close-inflight") o.closeInflight = false;
    else if (k == "--no-profiler-handles") o.profilerHandles = false;
    else if (k == "--flush") o.flush = true;
    else if (k == "--group") o.group = int(intVal(1, 8));
    else if (k == "--send-ahead") o.sendAhead = true;
    else if (k == "--selftest-corrupt") o.selftestCorrupt = intVal(0, 1L << 40);
    else if (k == "--all-ranks-print") o.allRanksPrint = true;
    else if (k == "--no-iter-records") o.iterRecords = false;
    else if (k == "-v" || k == "--verbose") setVerbose(true);
    else usageError("unknown option " + k);
  }
  if (o.plugin.empty()) usageError("--plugin is required");
  if (o.rank < 0 || o.nranks < 1) usageError("--rank and --nranks are required");
  if (o.rank >= o.nranks) usageError("--rank must be below --nranks");
  if (o.rendezvous.empty()) usageError("--rendezvous DIR is required");
  if (o.pairs && (o.workload != Workload::kSendRecv || o.nranks % 2))
    usageError(std::string("--pattern ") + (o.oneway ? "oneway" : "pairs") +
               " needs the sendrecv workload and an even number of ranks");
  // A group completes only when all its messages arrived; in a ring all-reduce a step's send
  // needs the previous step's receive, so grouping one connection's consecutive steps would
  // wait on itself (NCCL groups the same step of independent senders instead).
  if (o.sendAhead && o.group < 2)
    usageError("--send-ahead needs --group 2 or more (single receives take sends in isend order, as NCCL's socket "
               "transport)");
  if (o.group > 1 && o.workload != Workload::kSendRecv)
    usageError("--group needs the sendrecv workload (all-reduce steps depend on the step before)");
  for (size_t s : {o.slotBytes, o.llSlotBytes})
    if (s < 8 || s % 8 || s > kIntAbiMaxMessage)
      usageError(strf("bad value for %s: %zu bytes (expected a multiple of 8 between 8 B and 1 GiB)",
                      s == o.slotBytes ? "--slot-size" : "--ll-slot", s));
  if (o.minBytes > o.maxBytes && o.duration <= 0) usageError("-b must not exceed -e");
  if (!o.stopFile.empty() && o.duration <= 0) usageError("--stop-file needs --duration");
  if (o.pauseRecvRank >= 0 && o.duration <= 0) usageError("--pause-recv needs --duration");
  if (o.opTimeout <= 0) usageError("--op-timeout must be > 0");
  if (o.duration <= 0 && o.iters < 1) usageError("-n must be >= 1");
  if (o.duration > kMaxTimeseriesSeconds && !o.timeseries.empty())
    usageError(strf("--timeseries keeps a 1 ms bucket (8 bytes) for every ms of --duration, which must then be at most "
                    "%.0f s (24 h); got %.0f s", kMaxTimeseriesSeconds, o.duration));
  return o;
}

// State reachable from the watchdog's emergency exit.
Options* gOpt = nullptr;
Plugin* gNet = nullptr;
RunState* gState = nullptr;

int exitCodeNow() {
  int c = Fatal::get().code();
  if (c) return c;
  return gState && wrongTotal(*gState, false) ? kExitWrongData : kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parseArgs(argc, argv);
  setLogRank(o.rank);
  loggerConfigure(o.rank);
  CallTracker::get().registerThread("main");
  static RunState st;
  static Plugin net;
  gOpt = &o;
  gNet = &net;
  gState = &st;
  const std::string jsonPath = outputPath(o.json, o.rank);

  std::string err;
  if (!net.load(o.plugin, o.abi, &err)) {
    Fatal::get().raise(kExitUsage, err);
    writeJson(jsonPath, o, net, st, kExitUsage);
    return kExitUsage;
  }
  if (o.slotBytes > net.raw()->maxMessageBytes() || o.llSlotBytes > net.raw()->maxMessageBytes())
    usageError("slot size exceeds what this ABI version can carry");

  Watchdog wd;
  wd.start(secToUs(o.opTimeout), [] {
    writeJson(outputPath(gOpt->json, gOpt->rank), *gOpt, *gNet, *gState, Fatal::get().code());
    fflush(stdout);
    fflush(stderr);
    _exit(Fatal::get().code());
  });

  Rendezvous rv;
  if (!rv.start(o.rendezvous, o.rank, o.nranks, nowUs() + secToUs(o.rvTimeout), &err)) {
    Fatal::get().raise(kExitPeer, err);
    wd.stop();
    writeJson(jsonPath, o, net, st, kExitPeer);
    return kExitPeer;
  }
  logInfo("rendezvous complete: %d rank(s) in %s", o.nranks, o.rendezvous.c_str());
  if (o.duration > 0) {
    // Timed runs stop early when a peer exits; plugin errors caused by that exit (seen within a
    // second of it) are reported as warnings, not failures.
    Fatal::get().setPeerExitTolerance([&rv] { return rv.waitAnyGone(nowUs() + 1000000); });
  }

  printHeader(o, net, st);
  const int ncomms = o.reload ? 2 : 1;
  for (int comm = 0; comm < ncomms && !Fatal::get().aborted(); comm++) {
    if (comm > 0) {
      if (!st.stoppedEarly.empty()) break;
      // NCCL unloads the plugin when the last communicator is destroyed and loads it again for
      // the next one.
      if (!net.reload(o.reloadNoInit, &err)) {
        Fatal::get().raise(kExitUsage, "reload: " + err);
        break;
      }
      printCommBanner(o, comm);
    }
    Communicator c(net, rv, o, comm, st);
    c.run();
  }
  // Final barrier: nobody closes its rendezvous socket (the peer-exit signal) while others
  // still wait for results.
  if (!Fatal::get().aborted() && st.stoppedEarly.empty()) {
    if (!rv.barrier(uint32_t(++st.barrierSeq), nowUs() + secToUs(o.rvTimeout), &err))
      logWarn("final barrier: %s", err.c_str());
  }
  int code = exitCodeNow();
  printFooter(o, net, st);
  writeTimeseries(outputPath(o.timeseries, o.rank), st);  // "" (no --timeseries): nothing
  wd.stop();
  writeJson(jsonPath, o, net, st, code);
  rv.stop();
  if (code != kExitOk && code != kExitWrongData) logError("exiting with code %d", code);
  fflush(stdout);
  // Threads of a misbehaving plugin must not keep the process alive or crash it at exit:
  // no static destructors, only the at_quick_exit handlers (the plugin's state-file removal).
  std::quick_exit(code);
}
