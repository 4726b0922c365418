// railover-perf output: the nccl-tests style table on stdout, the --json twin and the
// --timeseries file.
//
// Table columns and units follow nccl-tests: size (B), count (elements), type, redop, root,
// time (µs per iteration, averaged over ranks), algbw and busbw (GB/s, 1 GB = 1e9 B), #wrong
// (wrong bytes summed over ranks); footer "# Avg bus bandwidth". allreduce rows are float/sum,
// sendrecv rows int8/none (count = bytes).
//
// JSON (--json FILE; "%r" in FILE is replaced by the rank, otherwise only rank 0 writes):
//   {"tool":"railover-perf","schema":1,"rank","nranks",
//    "plugin":{"path","name","abi","abi_forced","exported_abis":[..],"loads"},
//    "config":{"workload","pattern","channels","contexts","dev","slot_size","ll_slot_size","ll_max","iters",
//              "warmup","min_bytes","max_bytes","factor","step_bytes","duration_s",
//              "reconnect_every","reload","reload_no_init","op_timeout_s","check","close_inflight"},
//    "device":{"ndev","name","pci_path","guid","ptr_support","speed_mbps","port","latency_us",
//              "max_comms","max_recvs","net_device_type","vdevs":[..],"max_p2p_bytes",
//              "max_coll_bytes","rail_id","plane_id"},
//    "rows":[{"comm","size","count","type","redop","root","time_us","algbw_gbps","busbw_gbps",
//             "wrong","local_time_us","local_wrong","iters","gathered"}],
//    "avg_busbw_gbps","wrong_total" (sum of the rows' wrong),"local_wrong_total" (this rank's),
//    "errors":[..] (fatal),"warnings":[..] (plugin errors tolerated after a peer exit),"exit_code",
//    "stopped_early":null|"...",
//    "stats":{"calls":{fn:n},"null_returns":{"connect","accept","isend","irecv"},
//             "plugin_init_calls" (the plugin's own init calls), "profiler_events","reconnects",
//             "conns_opened","bytes_received","max_inflight","left_inflight_at_close",
//             "setup_us" (listen..connect/accept of every comm of the first communicator),
//             "hold_start_us","hold_end_us" (--hold window, CLOCK_MONOTONIC µs; 0 without)},
//    "timeseries":null|{"path","t0_us","end_us","iterations"}}
//
// Time series (--timeseries FILE): ".csv" → CSV with header
// "kind,t_us,bytes,iter,lat_us,wrong"; anything else → JSON lines. Two record kinds:
//   bytes: t_us = start of a 1 ms bucket (CLOCK_MONOTONIC µs), bytes = bytes received in it
//          (every bucket from the start to the end of the run, zeros included; timed runs only);
//   iter:  t_us = iteration start, iter = index, lat_us = its duration, wrong = wrong bytes,
//          bytes = the iteration's message size (sweeps: the timed iterations of every size).
//
// Thread-safety: printing/writing functions take RunState::mu; call from one thread at a time
// (the watchdog may call writeJson while the main thread is blocked in the plugin).
#pragma once

#include <string>

#include "tools/perf/net.h"
#include "tools/perf/workload.h"

namespace rperf {

// Replaces "%r" with the rank; returns "" when this rank should not write (no %r, rank != 0).
std::string outputPath(const std::string& pattern, int rank);
void printHeader(const Options& o, Plugin& net, RunState& st);
void printCommBanner(const Options& o, int comm);
void printRow(const Options& o, const Row& r);
void printFooter(const Options& o, Plugin& net, RunState& st);
uint64_t wrongTotal(RunState& st, bool local);
bool writeJson(const std::string& path, const Options& o, Plugin& net, RunState& st, int exitCode);
bool writeTimeseries(const std::string& path, RunState& st);

}  // namespace rperf
