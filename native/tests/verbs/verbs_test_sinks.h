// Shared by the verbs path unit tests (verbs_path_test.cc, verbs_lanes_test.cc): sinks that
// record what a path reports, the fake HCA ports, RC parameters that rxe-style tests use, and
// a raw SEND of one control slot (to play a peer that breaks the rules). Single-threaded.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "transport/verbs/verbs_path.h"

namespace verbstest {

using railover::verbs::Arrival;
using railover::verbs::Broken;
using railover::verbs::ChunkRef;
using railover::verbs::CtlMsg;

struct SSink : railover::verbs::SendPath::Sink {
  std::vector<ChunkRef> done;
  std::vector<CtlMsg> ctls;
  std::vector<Broken> breaks;
  void chunkDone(const ChunkRef& c) override { done.push_back(c); }
  void ctl(const CtlMsg& m) override { ctls.push_back(m); }
  void broken(const Broken& b) override { breaks.push_back(b); }
};

struct RSink : railover::verbs::RecvPath::Sink {
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> got;  // seq, tag, bytes
  std::vector<Arrival> all;
  std::vector<CtlMsg> ctls;
  std::vector<Broken> breaks;
  void arrived(const Arrival& a) override {
    got.emplace_back(a.seq, a.tag, a.bytes);
    all.push_back(a);
  }
  void ctl(const CtlMsg& m) override { ctls.push_back(m); }
  void broken(const Broken& b) override { breaks.push_back(b); }
};

// Port `port` of fake HCA `dev` ("fake0"/"fake1"), RoCE, GID index 1.
inline railover::verbs::PortSel portOf(const char* dev, int port = 1) {
  railover::verbs::PortSel p;
  p.dev = dev;
  p.port = port;
  p.gidIndex = 1;
  p.roce = true;
  return p;
}

// timeout 14, retry_cnt 6 (rxe retries forever with 7: verbs_qp.h).
inline railover::verbs::RcParams params() {
  railover::verbs::RcParams p;
  p.timeout = 14;
  p.retryCnt = 6;
  return p;
}

// Posts one 48-byte control slot `msg` as a SEND on `from` through a static buffer (the fake
// provider copies a SEND's bytes when it is posted). 0 or the errno of ibv_post_send.
inline int rawSend(ibv_qp* from, const uint8_t* msg) {
  static uint8_t buf[railover::verbs::ctlwire::kBytes];
  std::memcpy(buf, msg, sizeof buf);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf), static_cast<uint32_t>(sizeof buf), 1};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_send(from, &wr, &bad);
}

}  // namespace verbstest
