// The fake verbs provider's own fidelity (fake_verbs.h): where the other tests rely on it
// behaving as rxe does, these pin that behaviour down on bare RC QPs (verbs::RcQp), without
// the path logic on top.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "fake_verbs.h"
#include "verbs_test_sinks.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_qp.h"

using namespace railover::verbs;

namespace {

using verbstest::params;
using verbstest::portOf;

// A requester QP on fake0 port 1 and a responder QP on fake1 port 1, both RTS towards each
// other; the responder's remote access is `respAccess` and it has kRecvs receives posted.
class FakeResponderErrors : public ::testing::Test {
 protected:
  static constexpr int kRecvs = 4;
  void bringUp(int respAccess) {  // once per test
    fake::reset();
    std::string err;
    ha = std::make_unique<Hca>("fake0", &err);
    hb = std::make_unique<Hca>("fake1", &err);
    ASSERT_TRUE(ha->ok() && hb->ok()) << err;
    req = std::make_unique<RcQp>(*ha, portOf("fake0", 1), 16, 16, &err);
    resp = std::make_unique<RcQp>(*hb, portOf("fake1", 1), 16, 16, &err);
    ASSERT_TRUE(req->ok() && resp->ok()) << err;
    ASSERT_TRUE(req->toInit(0, RcQp::kDataQpAccess, &err)) << err;
    ASSERT_TRUE(resp->toInit(0, respAccess, &err)) << err;
    ASSERT_TRUE(req->toRts(resp->local(), params(), &err)) << err;
    ASSERT_TRUE(resp->toRts(req->local(), params(), &err)) << err;
    for (int i = 0; i < kRecvs; ++i) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(recvBuf[i]), sizeof recvBuf[i], 1};
      ibv_recv_wr wr{}, *bad = nullptr;
      wr.wr_id = 100 + i, wr.sg_list = &sge, wr.num_sge = 1;
      ASSERT_EQ(ibv_post_recv(resp->qp(), &wr, &bad), 0);
    }
    // One SEND of the responder's stays outstanding (never delivered): a QP in ERR flushes it too.
    ibv_sge sge{reinterpret_cast<uintptr_t>(recvBuf[0]), 8, 1};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = 7, wr.sg_list = &sge, wr.num_sge = 1, wr.opcode = IBV_WR_SEND;
    ASSERT_EQ(ibv_post_send(resp->qp(), &wr, &bad), 0);
    ASSERT_EQ(fake::postedRecvs(resp->qp()), (size_t)kRecvs);
  }
  // Posts `op` from the requester: 16 bytes of 0x5a to `dst` with `rkey` (READ: from `dst`).
  void post(ibv_wr_opcode op, void* dst, uint32_t rkey, uint64_t wrId) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), 16, 1};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = wrId, wr.sg_list = &sge, wr.num_sge = 1, wr.opcode = op;
    wr.imm_data = htonl(16);
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst);
    wr.wr.rdma.rkey = rkey;
    ASSERT_EQ(ibv_post_send(req->qp(), &wr, &bad), 0);
  }
  std::vector<ibv_wc> poll(ibv_cq* cq) {
    std::vector<ibv_wc> out;
    ibv_wc wc[16];
    int n;
    while ((n = ibv_poll_cq(cq, 16, wc)) > 0) out.insert(out.end(), wc, wc + n);
    return out;
  }
  // What every case must show once the responder refused the requester's first WR (wrId 1,
  // a second one, wrId 2, queued behind it): the requester's WR fails with `status` and the
  // next one flushes; both QPs are in ERR; every receive the responder had posted, and its
  // outstanding SEND, complete with IBV_WC_WR_FLUSH_ERR; no receive is consumed successfully.
  void expectRefused(ibv_wc_status status) {
    EXPECT_EQ(fake::state(req->qp()), IBV_QPS_ERR) << "the requester's QP stayed up after the NAK";
    EXPECT_EQ(fake::state(resp->qp()), IBV_QPS_ERR) << "the responder's QP stayed up after refusing the request";
    std::vector<ibv_wc> rq = poll(req->cq());
    ASSERT_EQ(rq.size(), 2u);
    EXPECT_EQ(rq[0].wr_id, 1u);
    EXPECT_EQ(rq[0].status, status) << ibv_wc_status_str(rq[0].status);
    EXPECT_EQ(rq[1].wr_id, 2u);
    EXPECT_EQ(rq[1].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(fake::postedRecvs(resp->qp()), 0u);
    std::vector<ibv_wc> sq = poll(resp->cq());
    ASSERT_EQ(sq.size(), (size_t)kRecvs + 1) << "the responder's receives and its SEND did not all flush";
    int recvs = 0;
    for (const ibv_wc& c : sq) {
      EXPECT_EQ(c.status, IBV_WC_WR_FLUSH_ERR) << "wr " << c.wr_id;
      if (c.wr_id >= 100) ++recvs;
    }
    EXPECT_EQ(recvs, kRecvs);
    for (uint8_t b : dst) EXPECT_EQ(b, 0) << "the refused request wrote";
  }

  std::unique_ptr<Hca> ha, hb;
  std::unique_ptr<RcQp> req, resp;
  uint8_t recvBuf[kRecvs][64] = {};
  std::vector<uint8_t> src = std::vector<uint8_t>(16, 0x5a), dst = std::vector<uint8_t>(64, 0);
};

// A WRITE (with immediate: it would consume a receive) to a QP without IBV_ACCESS_REMOTE_WRITE:
// rxe's check_op_valid refuses it as an invalid request (RC, class C): NAK, requester
// IBV_WC_REM_INV_REQ_ERR, responder QP to ERR (do_class_ac_error -> rxe_qp_error).
TEST_F(FakeResponderErrors, AWriteToAQpWithoutRemoteWriteMovesTheResponderToErrAndFlushesItsReceives) {
  bringUp(IBV_ACCESS_LOCAL_WRITE);
  post(IBV_WR_RDMA_WRITE_WITH_IMM, dst.data(), 0, 1);
  post(IBV_WR_RDMA_WRITE, dst.data(), 0, 2);
  EXPECT_EQ(fake::deliver(req->qp(), resp->qp()), 0);
  expectRefused(IBV_WC_REM_INV_REQ_ERR);
}

// The same for a plain WRITE (no receive involved): the responder's receives flush all the same.
TEST_F(FakeResponderErrors, APlainWriteRefusedByTheQpFlushesTheResponderToo) {
  bringUp(IBV_ACCESS_LOCAL_WRITE);
  post(IBV_WR_RDMA_WRITE, dst.data(), 0, 1);
  post(IBV_WR_RDMA_WRITE, dst.data(), 0, 2);
  EXPECT_EQ(fake::deliver(req->qp(), resp->qp()), 0);
  expectRefused(IBV_WC_REM_INV_REQ_ERR);
}

// An R_Key violation (the rkey of an MR on another HCA opening than the responder QP's): rxe's
// check_rkey -> RESPST_ERR_RKEY_VIOLATION, class C: NAK remote access error, responder to ERR.
TEST_F(FakeResponderErrors, AWriteWithAnRkeyOfAnotherOpeningMovesTheResponderToErr) {
  bringUp(RcQp::kDataQpAccess);
  ibv_mr* other = ha->api().reg_mr(ha->pd(), dst.data(), dst.size(),
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);  // fake0's, not fake1's
  ASSERT_TRUE(other);
  post(IBV_WR_RDMA_WRITE, dst.data(), other->rkey, 1);
  post(IBV_WR_RDMA_WRITE, dst.data(), other->rkey, 2);
  EXPECT_EQ(fake::deliver(req->qp(), resp->qp()), 0);
  expectRefused(IBV_WC_REM_ACCESS_ERR);
  ha->api().dereg_mr(other);
}

// A READ from a QP without IBV_ACCESS_REMOTE_READ: an invalid request (rxe's check_op_valid).
TEST_F(FakeResponderErrors, AReadFromAQpWithoutRemoteReadMovesTheResponderToErr) {
  bringUp(RcQp::kDataQpAccess);  // no REMOTE_READ on the QP
  ibv_mr* mr = hb->api().reg_mr(hb->pd(), dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_TRUE(mr);
  post(IBV_WR_RDMA_READ, dst.data(), mr->rkey, 1);
  post(IBV_WR_RDMA_READ, dst.data(), mr->rkey, 2);
  EXPECT_EQ(fake::deliver(req->qp(), resp->qp()), 0);
  expectRefused(IBV_WC_REM_INV_REQ_ERR);
  hb->api().dereg_mr(mr);
}

// A READ through an MR registered without remote read: an R_Key violation (rxe's check_rkey).
TEST_F(FakeResponderErrors, AReadThroughAnMrWithoutRemoteReadMovesTheResponderToErr) {
  bringUp(RcQp::kDataQpAccess | IBV_ACCESS_REMOTE_READ);
  ibv_mr* noRead = hb->api().reg_mr(hb->pd(), dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(noRead);
  post(IBV_WR_RDMA_READ, dst.data(), noRead->rkey, 1);
  post(IBV_WR_RDMA_READ, dst.data(), noRead->rkey, 2);
  EXPECT_EQ(fake::deliver(req->qp(), resp->qp()), 0);
  expectRefused(IBV_WC_REM_ACCESS_ERR);
  hb->api().dereg_mr(noRead);
}

// A request the responder takes is not affected (the control for the cases above): the WRITE
// lands, the receive is consumed with the immediate, both QPs stay in RTS.
TEST_F(FakeResponderErrors, AnAllowedWriteLeavesBothQpsUp) {
  bringUp(RcQp::kDataQpAccess);
  post(IBV_WR_RDMA_WRITE_WITH_IMM, dst.data(), 0, 1);
  EXPECT_EQ(fake::deliver(req->qp(), resp->qp()), 1);
  EXPECT_EQ(fake::state(req->qp()), IBV_QPS_RTS);
  EXPECT_EQ(fake::state(resp->qp()), IBV_QPS_RTS);
  EXPECT_EQ(fake::postedRecvs(resp->qp()), (size_t)kRecvs - 1);
  EXPECT_EQ(dst[0], 0x5a);
  std::vector<ibv_wc> got = poll(resp->cq());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
}

}  // namespace
