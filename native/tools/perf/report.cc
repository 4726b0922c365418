// railover-perf output; see report.h.
#include "tools/perf/report.h"

#include <cstdio>
#include <cstring>

#include "tools/perf/util.h"

namespace rperf {

namespace {
bool printer(const Options& o) { return o.rank == 0 || o.allRanksPrint; }
const char* typeName(const Options& o) { return o.workload == Workload::kAllReduce ? "float" : "int8"; }
const char* redopName(const Options& o) { return o.workload == Workload::kAllReduce ? "sum" : "none"; }
const char* workloadName(const Options& o) { return o.workload == Workload::kAllReduce ? "allreduce" : "sendrecv"; }

std::string jstr(const std::string& s) { return "\"" + jsonEscape(s) + "\""; }
std::string jnum(double v) {
  if (!(v == v) || v > 1e300 || v < -1e300) return "null";
  return strf("%.6g", v);
}
}  // namespace

std::string outputPath(const std::string& pattern, int rank) {
  if (pattern.empty()) return "";
  size_t p = pattern.find("%r");
  if (p == std::string::npos) return rank == 0 ? pattern : "";
  std::string out = pattern;
  while ((p = out.find("%r")) != std::string::npos) out.replace(p, 2, std::to_string(rank));
  return out;
}

void printHeader(const Options& o, Plugin& net, RunState& st) {
  if (!printer(o)) return;
  std::string exported;
  for (int v : net.availableVersions()) exported += strf("%sv%d", exported.empty() ? "" : ",", v);
  std::lock_guard<std::mutex> g(st.mu);
  printf("# railover-perf: %s, %d rank(s), %d channel(s), %d context(s), device %d%s\n", workloadName(o), o.nranks,
         o.channels, o.contexts, o.dev, o.rank != 0 ? strf(" (rank %d)", o.rank).c_str() : "");
  printf("# plugin: %s (name \"%s\", ABI v%d%s; exports %s)\n", net.path().c_str(), net.name().c_str(), net.abi(),
         o.abi ? ", forced" : "", exported.c_str());
  printf("# steps: SIMPLE %s, LL %s for sizes <= %s; %d slots per connection\n", humanBytes(o.slotBytes).c_str(),
         humanBytes(o.llSlotBytes).c_str(), humanBytes(o.llMax).c_str(), kSteps);
  if (o.group > 1 || o.flush)
    printf("#%s%s\n", o.group > 1 ? strf(" grouped receives: up to %d SIMPLE steps per irecv;", o.group).c_str() : "",
           o.flush ? (o.group > 1 ? " iflush after each SIMPLE irecv with bytes" : " iflush after each SIMPLE receive with bytes")
                   : "");
  if (o.duration > 0)
    printf("# timed run: %.3g s at %s%s\n", o.duration, humanBytes(o.minBytes).c_str(),
           o.reconnectEvery ? strf(", new connections every %d iterations", o.reconnectEvery).c_str() : "");
  else
    printf("# sweep: %s .. %s, %s %s, %d iterations + %d warmup%s\n", humanBytes(o.minBytes).c_str(),
           humanBytes(o.maxBytes).c_str(), o.stepBytes ? "step" : "factor",
           o.stepBytes ? humanBytes(o.stepBytes).c_str() : strf("%g", o.factor).c_str(), o.iters, o.warmup,
           o.reconnectEvery ? strf(", new connections every %d iterations", o.reconnectEvery).c_str() : "");
  printf("#\n");
  printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %8s\n", "size", "count", "type", "redop", "root", "time",
         "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %8s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
         "(GB/s)", "");
  fflush(stdout);
}

void printCommBanner(const Options& o, int comm) {
  if (!printer(o)) return;
  printf("# communicator %d (plugin reloaded%s)\n", comm, o.reloadNoInit ? ", init not called again" : "");
  fflush(stdout);
}

void printRow(const Options& o, const Row& r) {
  if (!printer(o)) return;
  printf("  %10llu  %12llu  %8s  %6s  %6d  %9.2f  %7.2f  %7.2f  %8llu%s\n", (unsigned long long)r.bytes,
         (unsigned long long)r.count, typeName(o), redopName(o), -1, r.timeUs, r.algbw, r.busbw,
         (unsigned long long)r.wrong, r.gathered ? "" : "  (local)");
  fflush(stdout);
}

uint64_t wrongTotal(RunState& st, bool local) {
  std::lock_guard<std::mutex> g(st.mu);
  uint64_t w = 0;
  for (auto& r : st.rows) w += local ? r.localWrong : r.wrong;
  // Iterations of an interrupted timed run never made it into a row.
  if (st.rows.empty()) {
    for (auto& it : st.iterRecords) w += it.wrong;
    if (st.iterRecords.empty()) w += st.timedWrong;  // --no-iter-records
  }
  return w;
}

void printFooter(const Options& o, Plugin& net, RunState& st) {
  if (!printer(o)) return;
  double sum = 0;
  size_t n;
  {
    std::lock_guard<std::mutex> g(st.mu);
    n = st.rows.size();
    for (auto& r : st.rows) sum += r.busbw;
    if (!st.stoppedEarly.empty()) printf("# stopped early: %s\n", st.stoppedEarly.c_str());
  }
  uint64_t w = wrongTotal(st, false);
  bool anyChecked;
  {
    std::lock_guard<std::mutex> g(st.mu);
    anyChecked = o.check && (!st.rows.empty() || !st.iterRecords.empty());
  }
  int code = Fatal::get().code();
  // "0 OK" only when data was checked and the run did not fail: a run that failed before any
  // data moved (a failed init, connect or listen) checked nothing.
  if (!anyChecked)
    printf("# Wrong bytes          : n/a (%s)\n", code ? "the run failed before any data was checked"
                                                   : o.check ? "no data was received" : "not checked (-c 0)");
  else
    printf("# Wrong bytes          : %llu %s\n", (unsigned long long)w,
           w ? "FAILED" : code ? "(in the data checked before the failure)" : "OK");
  auto errs = Fatal::get().messages();
  if (!errs.empty()) printf("# Errors               : %zu (first: %s)\n", errs.size(), errs[0].c_str());
  if (code) printf("# Result               : FAILED (exit code %d)\n", code);
  if (o.flush)
    printf("# iflush               : %llu calls, %llu with nothing to flush (NULL request)\n",
           (unsigned long long)net.calls(kFnIflush), (unsigned long long)net.nulls(kFnIflush));
  printf("# Avg bus bandwidth    : %g\n", n ? sum / double(n) : 0.0);
  printf("#\n");
  fflush(stdout);
}

bool writeJson(const std::string& path, const Options& o, Plugin& net, RunState& st, int exitCode) {
  if (path.empty()) return true;
  std::string j = "{\n";
  j += "  \"tool\": \"railover-perf\", \"schema\": 1,\n";
  j += strf("  \"rank\": %d, \"nranks\": %d,\n", o.rank, o.nranks);
  std::string exported;
  for (int v : net.availableVersions()) exported += strf("%s%d", exported.empty() ? "" : ", ", v);
  j += strf("  \"plugin\": {\"path\": %s, \"name\": %s, \"abi\": %d, \"abi_forced\": %s, \"exported_abis\": [%s], "
            "\"loads\": %d},\n",
            jstr(o.plugin).c_str(), jstr(net.name()).c_str(), net.abi(), o.abi ? "true" : "false", exported.c_str(),
            net.loads());
  j += strf("  \"config\": {\"workload\": %s, \"pattern\": \"%s\", \"channels\": %d, \"contexts\": %d, \"dev\": %d, \"slot_size\": %zu, "
            "\"ll_slot_size\": %zu, \"ll_max\": %llu, \"iters\": %d, \"warmup\": %d, \"min_bytes\": %llu, "
            "\"max_bytes\": %llu, \"factor\": %s, \"step_bytes\": %llu, \"duration_s\": %s, \"reconnect_every\": %d, "
            "\"reload\": %s, \"reload_no_init\": %s, \"op_timeout_s\": %s, \"check\": %s, \"close_inflight\": %s, "
            "\"group\": %d, \"send_ahead\": %s, \"flush\": %s},\n",
            jstr(workloadName(o)).c_str(), o.oneway ? "oneway" : o.pairs ? "pairs" : "ring", o.channels, o.contexts, o.dev, o.slotBytes, o.llSlotBytes,
            (unsigned long long)o.llMax, o.iters, o.warmup, (unsigned long long)o.minBytes,
            (unsigned long long)o.maxBytes, jnum(o.factor).c_str(), (unsigned long long)o.stepBytes,
            jnum(o.duration).c_str(), o.reconnectEvery, o.reload || o.reloadNoInit ? "true" : "false",
            o.reloadNoInit ? "true" : "false", jnum(o.opTimeout).c_str(), o.check ? "true" : "false",
            o.closeInflight ? "true" : "false", o.group, o.sendAhead ? "true" : "false", o.flush ? "true" : "false");
  std::string errs;
  for (auto& e : Fatal::get().messages()) errs += (errs.empty() ? "" : ", ") + jstr(e);
  uint64_t wrong = wrongTotal(st, false), lwrong = wrongTotal(st, true);
  {
    std::lock_guard<std::mutex> g(st.mu);
    const NetProps& p = st.props;
    std::string vd;
    for (int d : p.vDevs) vd += strf("%s%d", vd.empty() ? "" : ", ", d);
    j += strf("  \"device\": {\"ndev\": %d, \"name\": %s, \"pci_path\": %s, \"guid\": %llu, \"ptr_support\": %d, "
              "\"speed_mbps\": %d, \"port\": %d, \"latency_us\": %s, \"max_comms\": %d, \"max_recvs\": %d, "
              "\"net_device_type\": %d, \"vdevs\": [%s], \"max_p2p_bytes\": %zu, \"max_coll_bytes\": %zu, "
              "\"rail_id\": %d, \"plane_id\": %d},\n",
              st.ndev, jstr(p.name).c_str(), jstr(p.pciPath).c_str(), (unsigned long long)p.guid, p.ptrSupport,
              p.speed, p.port, jnum(p.latency).c_str(), p.maxComms, p.maxRecvs, p.netDeviceType, vd.c_str(),
              p.maxP2pBytes, p.maxCollBytes, p.railId, p.planeId);
    j += "  \"rows\": [";
    double sum = 0;
    for (size_t i = 0; i < st.rows.size(); i++) {
      const Row& r = st.rows[i];
      sum += r.busbw;
      j += strf("%s\n    {\"comm\": %d, \"size\": %llu, \"count\": %llu, \"type\": %s, \"redop\": %s, \"root\": -1, "
                "\"time_us\": %s, \"algbw_gbps\": %s, \"busbw_gbps\": %s, \"wrong\": %llu, \"local_time_us\": %s, "
                "\"local_wrong\": %llu, \"iters\": %d, \"gathered\": %s}",
                i ? "," : "", r.comm, (unsigned long long)r.bytes, (unsigned long long)r.count,
                jstr(typeName(o)).c_str(), jstr(redopName(o)).c_str(), jnum(r.timeUs).c_str(), jnum(r.algbw).c_str(),
                jnum(r.busbw).c_str(), (unsigned long long)r.wrong, jnum(r.localTimeUs).c_str(),
                (unsigned long long)r.localWrong, r.iters, r.gathered ? "true" : "false");
    }
    j += st.rows.empty() ? "],\n" : "\n  ],\n";
    j += strf("  \"avg_busbw_gbps\": %s, \"wrong_total\": %llu, \"local_wrong_total\": %llu,\n",
              jnum(st.rows.empty() ? 0 : sum / double(st.rows.size())).c_str(), (unsigned long long)wrong,
              (unsigned long long)lwrong);
    j += "  \"errors\": [" + errs + "],\n";
    std::string warns;
    for (auto& e : Fatal::get().warnings()) warns += (warns.empty() ? "" : ", ") + jstr(e);
    j += "  \"warnings\": [" + warns + "],\n";
    j += strf("  \"exit_code\": %d,\n", exitCode);
    j += "  \"stopped_early\": " + (st.stoppedEarly.empty() ? std::string("null") : jstr(st.stoppedEarly)) + ",\n";
    std::string calls;
    for (int f = 0; f < kFnCount; f++)
      calls += strf("%s\"%s\": %llu", f ? ", " : "", fnName(f), (unsigned long long)net.calls(f));
    j += "  \"stats\": {\"calls\": {" + calls + "}, ";
    j += strf("\"null_returns\": {\"connect\": %llu, \"accept\": %llu, \"isend\": %llu, \"irecv\": %llu, \"iflush\": %llu}, ",
              (unsigned long long)net.nulls(kFnConnect), (unsigned long long)net.nulls(kFnAccept),
              (unsigned long long)net.nulls(kFnIsend), (unsigned long long)net.nulls(kFnIrecv),
              (unsigned long long)net.nulls(kFnIflush));
    j += strf("\"plugin_init_calls\": %llu, \"profiler_events\": %llu, \"reconnects\": %llu, \"conns_opened\": %llu, \"bytes_received\": %llu, "
              "\"max_inflight\": %d, \"left_inflight_at_close\": %llu, \"setup_us\": %llu, \"hold_start_us\": %llu, "
              "\"hold_end_us\": %llu},\n",
              (unsigned long long)pluginInitCalls(), (unsigned long long)profilerEvents(), (unsigned long long)st.reconnects,
              (unsigned long long)st.connsOpened, (unsigned long long)st.bytesReceived, st.maxInflight,
              (unsigned long long)st.leftInflight, (unsigned long long)st.setupUs, (unsigned long long)st.holdStartUs,
              (unsigned long long)st.holdEndUs);
    std::string tsPath = outputPath(o.timeseries, o.rank);
    if (o.duration > 0)
      j += strf("  \"timeseries\": {\"path\": %s, \"t0_us\": %llu, \"end_us\": %llu, \"iterations\": %zu}\n",
                tsPath.empty() ? "null" : jstr(tsPath).c_str(), (unsigned long long)st.tsStartUs,
                (unsigned long long)st.tsEndUs, st.iterRecords.size());
    else
      j += "  \"timeseries\": null\n";
  }
  j += "}\n";
  std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) {
    logError("cannot write %s: %s", tmp.c_str(), strerror(errno));
    return false;
  }
  fwrite(j.data(), 1, j.size(), f);
  bool ok = fclose(f) == 0 && rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) logError("cannot write %s: %s", path.c_str(), strerror(errno));
  return ok;
}

bool writeTimeseries(const std::string& path, RunState& st) {
  if (path.empty()) return true;
  bool csv = path.size() >= 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  FILE* f = fopen(path.c_str(), "w");
  if (!f) {
    logError("cannot write %s: %s", path.c_str(), strerror(errno));
    return false;
  }
  std::lock_guard<std::mutex> g(st.mu);
  if (csv) fprintf(f, "kind,t_us,bytes,iter,lat_us,wrong\n");
  for (size_t i = 0; i < st.tsBuckets.size(); i++) {
    unsigned long long t = (unsigned long long)(st.tsStartUs + i * 1000), b = (unsigned long long)st.tsBuckets[i];
    if (csv) fprintf(f, "bytes,%llu,%llu,,,\n", t, b);
    else fprintf(f, "{\"kind\": \"bytes\", \"t_us\": %llu, \"bytes\": %llu}\n", t, b);
  }
  for (auto& it : st.iterRecords) {
    // iter records: the bytes column holds the iteration's message size.
    if (csv)
      fprintf(f, "iter,%llu,%llu,%llu,%llu,%llu\n", (unsigned long long)it.startUs, (unsigned long long)it.bytes,
              (unsigned long long)it.iter, (unsigned long long)it.latUs, (unsigned long long)it.wrong);
    else
      fprintf(f, "{\"kind\": \"iter\", \"t_us\": %llu, \"iter\": %llu, \"lat_us\": %llu, \"wrong\": %llu, \"bytes\": %llu}\n",
              (unsigned long long)it.startUs, (unsigned long long)it.iter, (unsigned long long)it.latUs,
              (unsigned long long)it.wrong, (unsigned long long)it.bytes);
  }
  bool ok = fclose(f) == 0;
  if (!ok) logError("cannot write %s: %s", path.c_str(), strerror(errno));
  return ok;
}

}  // namespace rperf
