// railover-perf workloads: one "communicator" = plugin contexts + ring connections per channel +
// channel worker threads that play the GPU (fill send slots, reduce, check received data).
//
// Topology (both workloads): on every channel, rank r has a send comm to (r+1)%n and a recv comm
// from (r-1+n)%n. sendrecv: every rank sends `size` bytes to its next rank and receives as many
// from its previous one (nccl-tests' sendrecv; 2 ranks: each sends to the other), split evenly
// over the channels; with --pattern pairs ranks 2k and 2k+1 exchange with each other instead, and
// with --pattern oneway rank 2k only sends to 2k+1 and 2k+1 only receives (perftest's one-way
// ib_write_bw / ib_send_bw shape: each host does half the work of an exchange).
// allreduce: NCCL's ring algorithm per channel, reduce-scatter then all-gather, real float32
// sums; data is cut into steps of at most one slot (LL: --ll-slot, SIMPLE: --slot-size).
//
// Data: every byte is a function of (source rank, channel, step, offset, iteration, communicator);
// sendrecv checks each received step, allreduce checks the final sums (values are small integers
// so sums are exact). Wrong, lost, duplicated or reordered data shows as wrong bytes; a received
// size different from the one sent counts |difference| extra wrong bytes.
//
// Thread-safety: a Communicator is driven by the main thread; its workers only touch their own
// channel and the shared input/output arrays at disjoint ranges.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tools/perf/engine.h"
#include "tools/perf/net.h"
#include "tools/perf/rendezvous.h"

namespace rperf {

enum class Workload { kSendRecv, kAllReduce };

struct Options {
  std::string plugin;                 // --plugin PATH (required)
  int abi = 0;                        // --abi N (0 = newest exported)
  int rank = -1, nranks = -1;         // --rank, --nranks
  std::string rendezvous;             // --rendezvous DIR
  Workload workload = Workload::kSendRecv;
  bool pairs = false;                 // --pattern pairs|oneway: sendrecv between ranks 2k and 2k+1
  bool oneway = false;                // --pattern oneway: 2k sends to 2k+1, 2k+1 receives only
  uint64_t minBytes = 8, maxBytes = 8ull << 20, stepBytes = 0;  // -b -e -i
  double factor = 2;                  // -f
  int iters = 20, warmup = 5;         // -n -w
  int channels = 1, contexts = 1, dev = 0;
  bool devSpread = false;             // --dev-spread: channel c uses device (dev + c) % ndev
  size_t slotBytes = 512 << 10;       // --slot-size: SIMPLE step size
  size_t llSlotBytes = 64 << 10;      // --ll-slot: LL step size
  uint64_t llMax = 16 << 10;          // --ll-max: collectives up to this size use LL (marker 0x1)
  int reconnectEvery = 0;             // --reconnect-every N iterations (0 = off)
  bool reload = false, reloadNoInit = false;
  double duration = 0;                // --duration SECONDS (0 = sweep mode)
  std::string timeseries, json;       // --timeseries FILE, --json FILE (%r = rank)
  std::string stopFile;               // --stop-file PATH: rank 0 ends a timed run once PATH exists
  double holdS = 0;                   // --hold SECONDS: comms stay connected and idle after the run
  int pauseRecvRank = -1;             // --pause-recv RANK:AT:FOR (timed runs)
  double pauseRecvAtS = 0, pauseRecvForS = 0;
  double opTimeout = 30, rvTimeout = 60;
  int idleSleepUs = 0;                // --idle-sleep-us N
  bool check = true, closeInflight = true, profilerHandles = true, flush = false;
  int group = 1;  // --group: SIMPLE steps per grouped irecv (1..8)
  bool sendAhead = false;  // --send-ahead: try the step after the next one first (EngineConfig)
  int trafficClass = -1;
  long selftestCorrupt = 0;           // flip one byte of rank 0's Nth non-empty sent message
  bool allRanksPrint = false;
  bool iterRecords = true;            // --no-iter-records: timed runs keep no per-iteration records
};

struct Row {
  int comm = 0;
  uint64_t bytes = 0, count = 0;
  double timeUs = 0, algbw = 0, busbw = 0;  // averaged over ranks (nccl-tests style)
  uint64_t wrong = 0;                       // summed over ranks
  double localTimeUs = 0;
  uint64_t localWrong = 0;
  int iters = 0;
  bool gathered = false;                    // false: peers' numbers missing (local only)
};

struct IterRecord {
  int comm;
  uint64_t iter, startUs, latUs, wrong;
  uint64_t bytes;  // message size of the iteration
};

// Shared run state collected for the report (main thread writes; watchdog may read: lock mu).
struct RunState {
  std::mutex mu;
  std::vector<Row> rows;
  std::vector<IterRecord> iterRecords;
  uint64_t timedWrong = 0;  // wrong bytes of the timed run's iterations so far (rows or not)
  NetProps props;
  int ndev = 0;
  std::string stoppedEarly;
  uint64_t reconnects = 0, connsOpened = 0, bytesReceived = 0, leftInflight = 0;
  uint64_t setupUs = 0;                         // first communicator: listen..connect/accept of every comm
  uint64_t holdStartUs = 0, holdEndUs = 0;      // --hold window (CLOCK_MONOTONIC µs), 0 when none
  int maxInflight = 0;
  uint64_t tsStartUs = 0, tsEndUs = 0;
  std::vector<uint64_t> tsBuckets;
  uint64_t barrierSeq = 0;  // same sequence on all ranks
};

class Communicator {
 public:
  Communicator(Plugin& net, Rendezvous& rv, const Options& opt, int commIndex, RunState& st);
  ~Communicator();
  // Full life: init contexts, connect, run the sweep or the timed run, close, finalize.
  // Returns normally (also on "peer exited" in duration mode); errors are in Fatal.
  void run();

 private:
  struct Channel;
  void setup();
  void teardown();
  std::vector<std::unique_ptr<Conn>> openRound(uint32_t round, int* ticket);
  void maybeReconnect(uint64_t iter);
  void switchRound();
  // Runs one collective on every channel; returns wrong bytes (local). Throws Aborted.
  uint64_t runIteration(uint64_t bytes, uint64_t iter, int proto);
  void runSweep();
  void runDuration();
  bool mayRunIteration(uint64_t k, uint64_t* limit, bool* final, uint64_t deadlineUs);
  void drainSends(uint64_t deadlineUs);
  void holdIdle();
  bool stopFileSeen();
  bool stopRequested() const;
  // Work of one channel for one iteration (worker thread); returns wrong bytes. Throws Aborted.
  uint64_t channelWork(Channel* ch, uint64_t bytes, uint64_t iter, int proto);
  uint32_t nextBarrier() { return uint32_t(++st_.barrierSeq); }

  Plugin& net_;
  Rendezvous& rv_;
  const Options& opt_;
  int comm_;
  RunState& st_;
  std::unique_ptr<Engine> engine_;
  std::vector<void*> ctxs_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<std::unique_ptr<Conn>> live_, pending_, closing_;
  int pendingTicket_ = -1;
  std::vector<int> closeTickets_;
  uint32_t round_ = 0;
  std::vector<float> in_, out_, hv_;  // allreduce input, output, per-element H (see workload.cc)
  bool stopEarly_ = false;
  uint64_t permitSeq_ = 0;  // duration mode, ranks > 0: next grant message from rank 0
  uint64_t stopCheckUs_ = 0;  // --stop-file: last time it was looked for
  int proto_ = kProtoSimple;
};

// Busbw factor (nccl-tests): sendrecv 1, allreduce 2(n-1)/n.
double busFactor(Workload w, int nranks);

}  // namespace rperf
