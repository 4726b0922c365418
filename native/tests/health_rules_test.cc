// Unit tests of the probe monitor's pure rules and probe payload helpers (health/rules.h).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "health/rules.h"

namespace railover {
namespace health {
namespace {

TEST(HealthRules, LateWakeCreditsOnlyAMissedRound) {
  const uint64_t interval = 20000;
  EXPECT_EQ(lateWakeCreditUs(20000, interval), 0u) << "on time";
  EXPECT_EQ(lateWakeCreditUs(40000, interval), 0u) << "within two intervals";
  // Descheduled for 300 ms: the deadline moves by what was not spent probing.
  EXPECT_EQ(lateWakeCreditUs(320000, interval), 300000u);
}

TEST(HealthRules, DownPairProbesBackOffToTheCap) {
  std::vector<uint32_t> gaps;
  uint32_t g = 0;
  for (int i = 0; i < 10; ++i) gaps.push_back(g = nextProbeGapMs(g, 20, 1000));
  EXPECT_EQ(gaps, (std::vector<uint32_t>{20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000}));
  EXPECT_EQ(nextProbeGapMs(500, 20, 10), 20u) << "a cap below the interval means the interval";
  // A 25 s outage costs tens of probes, not 25 s / 20 ms = 1250.
  uint64_t t = 0;
  int probes = 0;
  for (g = 0; t < 25000; ++probes) t += (g = nextProbeGapMs(g, 20, 1000));
  EXPECT_LE(probes, 32);
}

TEST(HealthRules, SilenceOnEveryRailToOnePeerIsHeldForABoundedTime) {
  const uint64_t detect = 100000;
  // One rail silent, the other answering: a network fault, judged at once.
  EXPECT_FALSE(holdForPeerWideSilence(detect + 1, detect, 1, 0));
  // A single rail to that peer: nothing to compare with.
  EXPECT_FALSE(holdForPeerWideSilence(detect + 1, detect, 0, 0));
  // Every rail silent together: the peer (or this host) is not running; held...
  EXPECT_TRUE(holdForPeerWideSilence(detect + 1, detect, 1, 1));
  EXPECT_TRUE(holdForPeerWideSilence(detect + 900000, detect, 3, 3));
  // ...but not forever: a peer whose every NIC is cut is still judged.
  EXPECT_FALSE(holdForPeerWideSilence(detect + peerWideHoldUs(detect), detect, 1, 1));
  EXPECT_GE(peerWideHoldUs(detect), 1000000u);
  EXPECT_EQ(peerWideHoldUs(2000000), 8000000u);
}

TEST(HealthRules, ASiblingThatJustWokeUpStillCountsAsSilent) {
  const uint64_t detect = 100000;
  const uint64_t never = UINT64_MAX;
  EXPECT_TRUE(siblingSilent(false, 0, never, detect)) << "a sibling that is down";
  EXPECT_TRUE(siblingSilent(true, 60000, never, detect)) << "no answer for more than half the detection time";
  EXPECT_FALSE(siblingSilent(true, 5000, never, detect)) << "answering on schedule: this rail is the odd one out";
  EXPECT_FALSE(siblingSilent(true, 5000, 2000000, detect)) << "woke up long ago";
  // The peer woke up 40 ms ago after a long stall and answered on the sibling first: this
  // pair's answer is a moment behind, not lost.
  EXPECT_TRUE(siblingSilent(true, 2000, 40000, detect));
}

TEST(HealthRules, SizeDependentLossNeedsEvidenceCongestionCannotGive) {
  EXPECT_TRUE(sizeDependentLoss(5, 0, 5, false, 4)) << "every big probe lost, small ones answered, no TCP progress";
  EXPECT_FALSE(sizeDependentLoss(5, 0, 5, true, 4)) << "TCP still acknowledged data: congestion";
  EXPECT_FALSE(sizeDependentLoss(5, 1, 5, false, 4)) << "one big probe got through";
  EXPECT_FALSE(sizeDependentLoss(5, 0, 0, false, 4)) << "small ones lost too: not size-dependent";
  EXPECT_FALSE(sizeDependentLoss(2, 0, 5, false, 4)) << "too few big probes to judge";
}

TEST(HealthRules, AQueuedAnswerNeedsAPromptSiblingSentNoEarlier) {
  const uint64_t detect = 100000, sent = 5000000;  // 20 ms x 5; the late probe left at t = 5 s
  EXPECT_TRUE(answerQueued(400000, detect, sent, sent + 20000))
      << "400 ms round trip while the peer answered another rail promptly for a later probe: a queue";
  EXPECT_TRUE(answerQueued(51000, detect, sent, sent)) << "past half the budget, sibling sent at the same instant";
  EXPECT_FALSE(answerQueued(50000, detect, sent, sent + 20000)) << "within half the detection budget: prompt";
  EXPECT_FALSE(answerQueued(400000, detect, sent, 0)) << "no sibling answered promptly: may be the peer's scheduling";
  EXPECT_FALSE(answerQueued(400000, detect, sent, sent - 1))
      << "the sibling's prompt answer is older than this probe: the peer may have stalled since";
}

TEST(HealthRules, ATimeoutOnARailThatQueuedWaitsThePeerWideHold) {
  const uint64_t detect = 100000, memory = 30000000;  // 20 ms x 5; 30 s
  EXPECT_TRUE(holdForQueue(150000, detect, 4000000, memory)) << "queued 4 s ago: late, not lost";
  EXPECT_TRUE(holdForQueue(1099000, detect, 4000000, memory)) << "still within detection + 1 s";
  EXPECT_FALSE(holdForQueue(1101000, detect, 4000000, memory)) << "past detection + the hold: judged (a dead rail)";
  EXPECT_FALSE(holdForQueue(150000, detect, 31000000, memory)) << "the queue is forgotten after 30 s";
  EXPECT_FALSE(holdForQueue(150000, detect, UINT64_MAX, memory)) << "never queued: the usual detection time";
}

TEST(HealthRules, AProbeCarriesItsNicsMtuAndTheAnswerTheAnsweringNics) {
  uint8_t buf[kProbeHeaderBytes] = {};
  Probe p;
  p.mtu = 9000;
  encodeProbe(p, buf);
  Probe q;
  ASSERT_TRUE(decodeProbe(buf, sizeof(buf), &q));
  EXPECT_EQ(q.mtu, 9000);
  answerProbe(buf, 0xfeedULL, 1500);
  ASSERT_TRUE(decodeProbe(buf, sizeof(buf), &q));
  EXPECT_TRUE(q.ack);
  EXPECT_EQ(q.mtu, 1500) << "the answer tells the answering NIC's MTU, not the prober's";
}

TEST(HealthRules, AFullSizeProbeIsOneFrameOfTheSmallerMtu) {
  EXPECT_EQ(bigProbePadding(0, 0, false), 4000u) << "unknown MTUs: the full 4000 bytes";
  EXPECT_EQ(bigProbePadding(9000, 0, false), 4000u) << "an older peer tells no MTU";
  EXPECT_EQ(bigProbePadding(9000, 9000, false), 4000u);
  EXPECT_EQ(bigProbePadding(9000, 1500, false), 1500u - 20 - 8 - 32) << "the peer's NIC takes 1500-byte frames";
  EXPECT_EQ(bigProbePadding(1500, 9000, false), 1500u - 20 - 8 - 32) << "ours sends 1500-byte frames";
  EXPECT_EQ(bigProbePadding(1500, 0, true), 1500u - 40 - 8 - 32);
  EXPECT_EQ(bigProbePadding(68, 0, false), 8u);
  EXPECT_EQ(bigProbePadding(40, 0, false), 0u);
}

TEST(HealthRules, ProbeRoundTrip) {
  uint8_t buf[kProbeHeaderBytes + 4000] = {};
  Probe p;
  p.big = true, p.id = 77, p.sentUs = 123456789, p.padding = 4000;
  encodeProbe(p, buf);
  Probe q;
  ASSERT_TRUE(decodeProbe(buf, sizeof(buf), &q));
  EXPECT_FALSE(q.ack);
  EXPECT_TRUE(q.big);
  EXPECT_EQ(q.id, 77u);
  EXPECT_EQ(q.sentUs, 123456789u);
  EXPECT_EQ(q.responder, 0u);
  answerProbe(buf, 0xfeedULL);
  ASSERT_TRUE(decodeProbe(buf, sizeof(buf), &q));
  EXPECT_TRUE(q.ack);
  EXPECT_EQ(q.responder, 0xfeedULL);
  EXPECT_EQ(q.id, 77u);
  EXPECT_EQ(q.sentUs, 123456789u) << "the prober's send time is echoed";
  // Malformed: truncated, padding not matching the datagram, other frame types, notices.
  EXPECT_FALSE(decodeProbe(buf, 31, &q));
  EXPECT_FALSE(decodeProbe(buf, sizeof(buf) - 1, &q));
  uint8_t small[kProbeHeaderBytes];
  p = Probe();
  encodeProbe(p, small);
  EXPECT_TRUE(decodeProbe(small, sizeof(small), &q));
  small[1] = 2;  // NIC-down notice flag
  EXPECT_FALSE(decodeProbe(small, sizeof(small), &q));
  small[1] = 0;
  small[0] = 2;  // DATA frame
  EXPECT_FALSE(decodeProbe(small, sizeof(small), &q));
}

}  // namespace
}  // namespace health
}  // namespace railover
