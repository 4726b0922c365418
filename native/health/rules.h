// Pure decision rules and payload helpers of the probe monitor (health.cc), kept apart so they
// can be unit-tested and fuzzed without sockets or threads. Every function is stateless and
// thread-safe; times are CLOCK_MONOTONIC microseconds (µs), intervals milliseconds (ms).
#pragma once

#include <cstddef>
#include <cstdint>

namespace railover {
namespace health {

// ---- probe payload (UDP, see docs/PROTOCOL.md "Probes") --------------------------------
// A probe is one 32-byte probe header (probe_wire.h: type PROBE or PROBE_ACK) plus `padding`
// zero bytes: flags bit 0 = full size; seq = probe id; sentUs = the prober's send time (µs, its
// own clock, echoed back unchanged); responder = 0 in a probe, the responder's instance id in
// an answer (a random non-zero number per process; 0 from a peer that predates it).
struct Probe {
  bool ack = false;
  bool big = false;
  uint64_t id = 0;
  uint64_t sentUs = 0;
  uint64_t responder = 0;
  uint32_t padding = 0;
  uint16_t mtu = 0;  // the sender NIC's MTU, bytes (0: unknown)
};
constexpr size_t kProbeHeaderBytes = 32;
// Writes the 32-byte header of `p` to `out`.
void encodeProbe(const Probe& p, uint8_t* out);
// Decodes a datagram of `n` bytes: true for a plain probe or answer (not a notice, address
// change or anything else) whose padding matches the datagram length; false otherwise.
bool decodeProbe(const uint8_t* in, size_t n, Probe* p);
// Rewrites a received probe header in place into its answer from `responder`, whose NIC has
// MTU `mtu` (same size, so a full-size probe tests the reverse direction too).
void answerProbe(uint8_t* buf, uint64_t responder, uint16_t mtu = 0);
// Padding of a full-size probe on a pair whose local NIC has MTU `localMtu` and whose peer NIC
// told `peerMtu` (either 0: unknown), for IPv6 when `ipv6`: kBigProbeBytes, or less so that the
// datagram is one frame of the smaller MTU (a frame either NIC takes: TCP's segments are sized
// by both ends' MSS, so a bigger probe would be dropped where the data is not).
uint32_t bigProbePadding(int localMtu, int peerMtu, bool ipv6);

// ---- rules --------------------------------------------------------------------------------

// The health thread ran its probe round `gapUs` after the previous one, `intervalUs` being
// the schedule. While it was not running it sent no probes and read no answers, so a silence
// of that length says nothing about the network: returns how far to push every pair's answer
// deadline (0 when the round was on time, i.e. within 2 intervals).
inline uint64_t lateWakeCreditUs(uint64_t gapUs, uint64_t intervalUs) {
  return gapUs > 2 * intervalUs ? gapUs - intervalUs : 0;
}

// Next probe gap of a down pair (exponential back-off): the interval, doubling per probe
// sent, capped at `capMs` (never below the interval).
inline uint32_t nextProbeGapMs(uint32_t gapMs, uint32_t intervalMs, uint32_t capMs) {
  if (capMs < intervalMs) capMs = intervalMs;
  if (gapMs < intervalMs) return intervalMs;
  uint64_t g = (uint64_t)gapMs * 2;
  return g > capMs ? capMs : (uint32_t)g;
}

// How long a pair whose every sibling (the other NIC pairs to the same peer process) went
// silent at the same time is held up: a silence shared by every rail to one peer is that
// peer's (or this host's) scheduling, not a network fault; past this it is judged anyway
// (a peer whose every NIC is cut must still end in an error).
inline uint64_t peerWideHoldUs(uint64_t detectUs) {
  uint64_t floor = 1000000;  // 1 s: well past the scheduling stalls of a loaded host (tens of ms)
  return detectUs * 4 > floor ? detectUs * 4 : floor;
}

// Whether a sibling pair (another rail to the same peer process) counts as silent for the
// peer-wide rule: down, or no answer for half the detection time, or it ended such a silence
// only `sinceWakeUs` ago, less than the detection time: the peer has just woken up and answers
// rail by rail (a busy peer may be preempted in between), so this pair's answer may be a
// moment behind. `sinceWakeUs` = UINT64_MAX when it never was silent.
inline bool siblingSilent(bool up, uint64_t sinceAnswerUs, uint64_t sinceWakeUs, uint64_t detectUs) {
  if (!up) return true;
  if (sinceAnswerUs > detectUs / 2) return true;
  return sinceWakeUs <= detectUs;
}

// A pair's probe answers are `ageUs` old; `siblingsSilent` of its `siblings` other pairs to
// the same peer process are silent too (answers older than half the detection time). True
// when the timeout must not be read as a network fault yet: every rail to that peer went
// quiet together and the shared silence is shorter than peerWideHoldUs.
inline bool holdForPeerWideSilence(uint64_t ageUs, uint64_t detectUs, int siblings, int siblingsSilent) {
  return siblings > 0 && siblingsSilent == siblings && ageUs < detectUs + peerWideHoldUs(detectUs);
}

// Verdict at the end of a full-size probe burst: size-dependent loss (an MTU black hole)
// only when every full-size probe of the burst was lost (at least `minBig` of them), small
// probes kept being answered, and no comm saw the peer's TCP acknowledge data on this pair
// during the burst: a congested queue also drops big datagrams first, but then TCP still
// delivers, so the rail works.
inline bool sizeDependentLoss(int bigSent, int bigAnswered, int smallAnswered, bool dataAcked, int minBig) {
  return bigSent >= minBig && bigAnswered == 0 && smallAnswered > 0 && !dataAcked;
}

// A probe answer that took `rttUs` (send to read, µs) shows a queue on its rail when it used
// more than half the detection budget `detectUs` while the same peer process answered another
// rail promptly (under half the budget) for a probe sent no earlier than this one
// (`siblingPromptSentUs`: send time of that sibling's latest prompt answer, 0 = none;
// `sentUs`: this probe's send time). The prompt sibling proves the delay was neither this
// host's nor the peer's scheduling (a late thread delays every rail's answers alike, and a
// late reader here inflates the sibling's round trip too), so it sat in this rail's queue:
// congestion. A rail with such a queue is not taken back (failback) until its answers have
// been prompt for a whole hold-down, or a comm would return, fill the queue again and leave.
inline bool answerQueued(uint64_t rttUs, uint64_t detectUs, uint64_t sentUs, uint64_t siblingPromptSentUs) {
  return rttUs > detectUs / 2 && siblingPromptSentUs != 0 && siblingPromptSentUs >= sentUs;
}

// A pair whose probes time out (`ageUs` since its last answer) but whose answers showed a
// queue `sinceQueuedUs` ago (UINT64_MAX = never) within `memoryUs`: its answers are late, not
// lost, so the verdict waits up to the peer-wide hold past the detection time. A saturated
// rail's queue swings past the detection budget without losing anything; a rail that dies
// while congested is still judged, within detection + peerWideHoldUs (and hard signals, a
// carrier loss or the peer's NIC-down notice, never wait).
inline bool holdForQueue(uint64_t ageUs, uint64_t detectUs, uint64_t sinceQueuedUs, uint64_t memoryUs) {
  return sinceQueuedUs < memoryUs && ageUs < detectUs + peerWideHoldUs(detectUs);
}

}  // namespace health
}  // namespace railover
