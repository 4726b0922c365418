// GPUDirect building blocks (transport/verbs/verbs_gdr.h, verbs_mr.h) against the fake verbs
// provider: peer-memory detection from sysfs files, the dmabuf probe, dmabuf registration on
// every HCA, and the flush QP (1-byte RDMA READs through a QP connected to itself: completion
// order, depth, access errors).
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "fake_verbs.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_gdr.h"
#include "transport/verbs/verbs_mr.h"

using namespace railover::verbs;

namespace {

PortSel portOf(const char* dev, int port) {
  PortSel p;
  p.dev = dev;
  p.port = port;
  p.gidIndex = 1;
  p.roce = true;
  p.gid.raw[15] = 1;
  return p;
}

RcParams params() {
  RcParams p;
  p.retryCnt = 6;
  return p;
}

std::string tempDir() {
  char tmpl[] = "/tmp/railover-gdr-XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d ? d : "";
}

void touch(const std::string& root, const std::string& rel) {
  std::string p = root;
  size_t pos = 0;
  while ((pos = rel.find('/', pos + 1)) != std::string::npos) mkdir((root + rel.substr(0, pos)).c_str(), 0755);
  std::ofstream(root + rel) << "1.0\n";
}

TEST(GdrDetect, PeerMemoryClientFoundByAnyOfNcclsThreeFiles) {
  for (const char* rel : {"/kernel/mm/memory_peers/nv_mem/version", "/kernel/mm/memory_peers/nv_mem_nc/version",
                          "/module/nvidia_peermem/version"}) {
    std::string root = tempDir();
    ASSERT_FALSE(root.empty());
    std::string which;
    EXPECT_FALSE(gdrPeerMemLoaded(root, &which)) << "empty sysfs";
    touch(root, rel);
    EXPECT_TRUE(gdrPeerMemLoaded(root, &which)) << rel;
    EXPECT_EQ(which, std::string("/sys") + rel);
    std::string cmd = "rm -rf " + root;
    ASSERT_EQ(system(cmd.c_str()), 0);
  }
}

TEST(GdrDetect, OtherModulesDoNotCountAsPeerMemory) {
  std::string root = tempDir();
  touch(root, "/module/nvidia/version");
  touch(root, "/kernel/mm/memory_peers/other/version");
  EXPECT_FALSE(gdrPeerMemLoaded(root));
  std::string cmd = "rm -rf " + root;
  ASSERT_EQ(system(cmd.c_str()), 0);
}

TEST(GdrDetect, DmabufProbeReadsTheDriversAnswer) {
  fake::reset();
  std::string err, why;
  Hca h("fake0", &err);
  ASSERT_TRUE(h.ok()) << err;
  fake::setDmabuf(true);  // the probe's fd -1 gets EBADF: the call exists in the driver
  EXPECT_TRUE(dmabufSupported(h, &why)) << why;
  fake::setDmabuf(false);  // EOPNOTSUPP
  EXPECT_FALSE(dmabufSupported(h, &why));
  EXPECT_NE(why.find("not supported"), std::string::npos) << why;
  EXPECT_EQ(fake::dmabufRegistrations(), 0) << "the probe registers nothing";
}

TEST(GdrMr, DmabufRegisteredOnEveryHcaWithReadAccess) {
  fake::reset();
  std::string err;
  Hca a("fake0", &err), b("fake1", &err);
  std::vector<uint8_t> buf(4096);
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);  // stands for the CUDA driver's dmabuf fd
  ASSERT_GE(fd, 0);
  MrSet mr({&a, &b}, buf.data(), buf.size(), /*offset=*/0, fd, &err);
  ASSERT_TRUE(mr.ok()) << err;
  EXPECT_EQ(fake::dmabufRegistrations(), 2);
  EXPECT_NE(mr.rkey(0), mr.rkey(1));
  fake::setDmabuf(false);
  MrSet refused({&a, &b}, buf.data(), buf.size(), 0, fd, &err);
  close(fd);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(err.find("ibv_reg_dmabuf_mr(fake0"), std::string::npos) << err;
}

// A flush QP on fake0 port 1 (fresh fake provider per test).
class GdrFlush : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::reset();
    hca.reset(new Hca("fake0", &err));
    ASSERT_TRUE(hca->ok()) << err;
    flush.reset(new FlushQp(*hca, portOf("fake0", 1), params(), &err));
    ASSERT_TRUE(flush->ok()) << err;
  }
  std::string err;
  std::unique_ptr<Hca> hca;
  std::unique_ptr<FlushQp> flush;
};

TEST_F(GdrFlush, ReadOfTheBufferCompletesTheFlush) {
  Hca& h = *hca;
  FlushQp& f = *flush;
  std::vector<uint8_t> buf(64, 0x5a);
  MrSet mr({&h}, buf.data(), buf.size(), &err);
  ASSERT_TRUE(mr.ok()) << err;
  uint64_t t = f.request((uint64_t)(uintptr_t)&buf[63], mr.rkey(0));
  EXPECT_EQ(f.test(t, &err), 0) << "not done before the READ completes";
  ASSERT_EQ(fake::outstanding(f.qp()).size(), 1u);
  const fake::PostedSend& s = fake::outstanding(f.qp())[0];
  EXPECT_EQ(s.opcode, IBV_WR_RDMA_READ);
  EXPECT_EQ(s.remoteAddr, (uint64_t)(uintptr_t)&buf[63]);
  EXPECT_EQ(s.localLen, 1u);
  ASSERT_EQ(fake::deliver(f.qp(), f.qp()), 1) << "the QP answers its own READ";
  EXPECT_EQ(f.test(t, &err), 1) << err;
  EXPECT_EQ(f.test(t, &err), 1) << "stays done";
  EXPECT_EQ(f.completed(), 1u);
}

TEST_F(GdrFlush, TicketsCompleteInOrderAndBeyondTheDepthWait) {
  Hca& h = *hca;
  FlushQp& f = *flush;
  std::vector<uint8_t> buf(8);
  MrSet mr({&h}, buf.data(), buf.size(), &err);
  std::vector<uint64_t> t;
  for (int i = 0; i < FlushQp::kDepth + 5; ++i) t.push_back(f.request((uint64_t)(uintptr_t)buf.data(), mr.rkey(0)));
  EXPECT_EQ(fake::outstanding(f.qp()).size(), (size_t)FlushQp::kDepth) << "no more than the depth posted";
  ASSERT_EQ(fake::deliver(f.qp(), f.qp(), 3), 3);
  EXPECT_EQ(f.test(t[2], &err), 1);
  EXPECT_EQ(f.test(t[0], &err), 1) << "an earlier ticket is done when a later one is";
  EXPECT_EQ(f.test(t[3], &err), 0);
  EXPECT_EQ(fake::outstanding(f.qp()).size(), (size_t)FlushQp::kDepth) << "test() posted the waiting READs";
  while (fake::deliver(f.qp(), f.qp()) > 0) f.test(t.back(), &err);
  EXPECT_EQ(f.test(t.back(), &err), 1) << err;
  EXPECT_EQ(f.completed(), (uint64_t)t.size());
}

TEST_F(GdrFlush, AnAccessErrorFailsEveryTicketWithTheStatus) {
  Hca& h = *hca;
  FlushQp& f = *flush;
  std::vector<uint8_t> buf(8);
  // through the layer's table: verbs.h's ibv_reg_mr is a macro that may call ibv_reg_mr_iova2
  ibv_mr* noRead = h.api().reg_mr(h.pd(), buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  uint64_t a = f.request((uint64_t)(uintptr_t)buf.data(), noRead->rkey);
  uint64_t b = f.request((uint64_t)(uintptr_t)buf.data(), noRead->rkey);
  fake::deliver(f.qp(), f.qp());
  EXPECT_EQ(f.test(a, &err), -1);
  EXPECT_NE(err.find("flush READ on fake0"), std::string::npos) << err;
  err.clear();
  EXPECT_EQ(f.test(b, &err), -1) << "the QP is in error: nothing more completes";
  EXPECT_FALSE(err.empty());
  h.api().dereg_mr(noRead);
}

TEST(GdrFlushOnAnotherHca, RailoverRegistrationsAllowTheFlushRead) {
  fake::reset();
  std::string err;
  Hca a("fake0", &err), b("fake1", &err);
  std::vector<uint8_t> buf(256);
  MrSet mr({&a, &b}, buf.data(), buf.size(), &err);
  ASSERT_TRUE(mr.ok()) << err;
  FlushQp f(b, portOf("fake1", 2), params(), &err);
  ASSERT_TRUE(f.ok()) << err;
  uint64_t t = f.request((uint64_t)(uintptr_t)&buf[100], mr.rkey((size_t)mr.indexOf(&b)));
  fake::deliver(f.qp(), f.qp());
  EXPECT_EQ(f.test(t, &err), 1) << err;
}

}  // namespace
