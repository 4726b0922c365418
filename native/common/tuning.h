// The engine's and runtime's fixed tuning numbers, in one place, each with its unit and the
// reason for its value. Numbers a user may need to change are variables of the parameter
// table (common/params.h) instead; these are not configurable.
//
// Thread-safety: constants.
#pragma once

#include <cstddef>
#include <cstdint>

namespace railover {
namespace tuning {

// ---- path connection (failover/link.cc)

// A path's connect + HELLO must complete within this, µs (3 s), or the attempt fails and is
// retried with back-off. Longer than the kernel's first SYN retransmission (1 s) so one lost
// SYN on a healthy network does not fail the path; short enough that a dead NIC found at
// connect time moves on to its standby within seconds.
constexpr uint64_t kConnectTimeoutUs = 3000000;

// The most one poll of a connecting path adds to its attempt's waiting time, µs (250 ms).
// A connect moves on only when it is polled (the verbs bootstrap: HELLO, endpoint, QP
// bring-up, one stage per poll; TCP: the HELLO after the kernel's connect), by NCCL's calls or
// the sweeper's idle pass every kIdleSweepMs, so the time a late caller (a descheduled proxy
// thread on a busy host) was away is not the network's: counted in full, a caller 3 s late
// failed an attempt that the peer had answered long before. 250 ms: 25 idle-pass periods, so
// with a caller on time the attempt's waiting time is its elapsed time; with polls late by
// seconds a dead path still times out, after kConnectTimeoutUs / kConnectPollCreditUs = 12
// polls.
constexpr uint64_t kConnectPollCreditUs = 250000;

// The longest a connect attempt waits while the network has done its part and what is left
// is a process's work (SendPath::connectWaitsOffNetwork: on RDMA the receiver's answer, given on
// its own threads' polls once its kernel acknowledged our request, or this side's worker
// creating and bringing up the QPs, queued behind other comms' bring-ups), µs (30 s). Such
// waiting does not count towards kConnectTimeoutUs: a proxy thread descheduled on a busy host, a
// peer stopped in a debugger, or thousands of comms connecting at once at init are not a dead
// path, and a new attempt would wait for the same threads while it churns QPs on both ends.
// Bounded all the same, for an answer lost to a fault that came after the request was
// acknowledged and for a wedged worker: 30 s is as long as NCCL's IB transport takes to notice
// a dead link at its defaults (its RC timeout). Sooner where the health layer can tell
// (SendLink::slowTick): a NIC or hard pair verdict, or a soft one (a silent black hole) that
// came while the attempt waited for the peer's answer, with the peer answering its probes on
// another rail.
constexpr uint64_t kConnectOffNetworkMaxUs = 30000000;
static_assert(kConnectOffNetworkMaxUs > kConnectTimeoutUs, "processes get longer than the network");

// First reconnect back-off after a path fails, ms; it doubles on every failure up to
// RAILOVER_BACKOFF_MAX_MS. 100 ms: well above a connect's round trip, below a human-visible
// pause after a quick repair.
constexpr uint32_t kFirstBackoffMs = 100;

// At connect, while no path is active yet, how long traffic waits for a still-connecting
// primary before it starts on a ready standby, µs (1 s). Starting on the standby would mean a
// failback right after the primary connects.
constexpr uint64_t kPrimaryPreferenceAtConnectUs = 1000000;

// After the receiver's CLOSE, how long the sender keeps reading the active path's stream 0 for
// ACKs sent before that CLOSE (they may still be in flight on that stream while the CLOSE
// arrived on another stream or rail), µs (1 s: many round trips, short for a closing comm).
constexpr uint64_t kCloseDrainUs = 1000000;

// Peer-gone check (receiver): a liveness connect to the sender's listener that gets no answer
// at all within this is inconclusive (a network fault, not evidence the process exited), µs
// (3 s, the same bound as a path connect); inconclusive checks are retried after
// kLivenessRetryUs, and after kLivenessRoundUs once every rail answered.
constexpr uint64_t kLivenessTimeoutUs = 3000000;
constexpr uint64_t kLivenessRetryUs = 100000;
constexpr uint64_t kLivenessRoundUs = 500000;

// After this many hold-downs without a flap the flap-grown hold-down of a path halves
// (hold-downs; the doubling on every flap is undone step by step on a stable path).
constexpr uint64_t kHoldDownDecayPeriods = 4;

// ---- progress and stall detection (failover/link.cc)

// Period of a link's slow checks (timeouts, hold-downs, reconnects, fatal timeout) on NCCL's
// progress calls, µs (1 ms: finer than any timeout it checks, rare enough to cost nothing).
constexpr uint64_t kSlowTickUs = 1000;

// A caller away longer than half of RAILOVER_STALL_MS restarts the stall clock instead of
// blaming the path: µs per ms of RAILOVER_STALL_MS (500 = half). A descheduled progress
// thread must never look like a network fault.
constexpr uint64_t kCallGapUsPerStallMs = 500;

// Bytes a receive pass reads from one stream before it turns to the next, so that one fast
// stream cannot starve the others (8 MiB: several socket buffers' worth).
constexpr uint64_t kRecvBudgetBytesPerPass = 8 << 20;

// Scratch buffer into which resent data already received is read and discarded, bytes
// (256 KiB: a few socket reads per pass; allocated on the first RESUME only).
constexpr size_t kDiscardBufferBytes = 256 << 10;

// ---- sweeper (failover/link.cc)

// After a health change, the sweeper drives every comm that is not settled on a healthy path
// for up to this long, µs (1 s; every further change restarts it). Enough for all comms of a
// process to move even when NCCL is busy with others.
constexpr uint64_t kSweeperWindowUs = 1000000;

// Pause between two sweeper passes, ms (1 ms).
constexpr int kSweeperPassMs = 1;

// A recv comm that NCCL has not called for this long, ms, is driven by the sweeper every
// this many ms (10 ms): a receiver whose receives are all complete still owes its sender an
// answer to a RESUME (failback, or failover after the ACKs of its last messages were lost with
// a path), and NCCL calls it again only at its next irecv. A send comm idle as long is driven
// while it has a path to reconnect (back-off run out), a connect in progress, a RESUME out or a
// failback due (SendLink::idleSweep). Cost: one pass over the idle comms every 10 ms, a few
// non-blocking reads per recv comm; a look at its paths per send comm, a few non-blocking
// system calls only for one with work due.
constexpr int kIdleSweepMs = 10;

// An idle send comm with a connected standby is driven once per this, µs (1 s), even with
// nothing else due, so that a standby the receiver dropped, reset or refused while the comm
// was idle (its NIC still up: no health change wakes the sweeper) is found and reconnected
// before the next fault needs it, not at NCCL's next call. 1 s: a standby is looked at about as
// often as the probe monitor declares a silent pair (RAILOVER_PROBE_INTERVAL_MS x multiplier),
// at the cost of one pass (a few non-blocking system calls) per idle comm per second.
constexpr uint64_t kIdleStandbyLookUs = 1000000;

// Nice value asked for the health and sweeper threads: ahead of busy-polling threads (NCCL's
// proxy, data loaders), best effort; without privilege they stay at normal priority.
constexpr int kHelperThreadNice = -10;

// ---- health (health/health.cc)

// A NIC pair that is down is declared up again only after probes answered for this many
// probe intervals (hysteresis against a pair flapping on one lucky answer).
constexpr uint64_t kPairUpAfterIntervals = 2;

// A pair's queued answers (health::answerQueued) are journaled as pair_queued once per
// episode: again only after this long without one, µs (1 s), so a congested rail writes one
// line per episode, not one per probe.
constexpr uint64_t kQueuedEpisodeGapUs = 1000000;

// How long a pair's queue (health::answerQueued) is remembered for its timeout verdict, µs
// (30 s): probe timeouts within it wait the peer-wide hold first (health::holdForQueue). A
// saturated rail's queueing delay swings for seconds between prompt and past the detection
// budget (measured on the test bed: queued answers 4-7 s apart, 50 Mbit/s tbf with a 1 s
// queue); a memory shorter than those gaps would judge the next swing a loss again.
constexpr uint64_t kQueuedMemoryUs = 30000000;

// A call into a path's transport (its progress on NCCL's thread or the sweeper) that holds the
// thread longer than this, µs (200 ms), is journaled (transport_slow) and logged: meanwhile the
// thread could act on no other path, and the sweeper cannot take over a link whose call is
// still in the transport. Seen on rxe (guest kernel 6.1): the sender's progress held NCCL's
// thread ~3 s right after a cable pull (docs/BENCHMARKS.md, fence-thread runs). Progress calls
// take microseconds on real HCAs and a few ms on the TCG bed; 200 ms is far above both.
constexpr uint64_t kSlowTransportCallUs = 200000;
// ... at most one such line per link and kind of call (progress, close) per this, µs (1 s).
constexpr uint64_t kSlowTransportLogIntervalUs = 1000000;

// The health thread journals its late wake-ups (health_late) at most once per this, µs (1 s):
// on a busy host every round may be late, and the journal must not grow with the load.
constexpr uint64_t kHealthLateLogIntervalUs = 1000000;

// Longest wait for the kernel's neighbour (ARP/ND) dump when flushing unresolved entries at a
// NIC repair, µs (100 ms; the health thread must not block longer).
constexpr long kNeighFlushTimeoutUs = 100000;

// ---- acceptor (transport/tcp/acceptor.cc)

// An accepted connection must deliver its HELLO within this, µs (5 s), or it is dropped:
// stray or half-open connections are not kept. Longer than kConnectTimeoutUs, which bounds
// the sender's side of the same exchange while its polls come on time (with late polls the
// sender may write its HELLO later: the acceptor's drop then fails that attempt as closed by
// the peer, and it is retried).
constexpr uint64_t kHelloTimeoutUs = 5000000;

static_assert(kHelloTimeoutUs > kConnectTimeoutUs, "the acceptor must wait longer than the sender tries");

// The acceptor's longest sleep, ms (500 ms): how late at most a HELLO timeout is noticed.
constexpr int kAcceptorWaitMs = 500;

// ---- logging (common/log.cc)

// Window of the per-process WARN budget for per-comm events (RO_WARN_EVENT), µs (1 s); the
// budget itself is kEventWarnsPerSecond (common/log.h).
constexpr uint64_t kEventWarnWindowUs = 1000000;

}  // namespace tuning
}  // namespace railover
