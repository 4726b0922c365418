// A fake verbs provider for unit tests of the verbs layer: the test binary defines the libibverbs
// functions the layer calls (resolved through loadVerbsApi(RTLD_DEFAULT) by a global test
// environment) and fills the context ops that verbs.h's inline post/poll calls dispatch through,
// so the real layer code runs against an in-process "wire" the test drives:
// sends stay outstanding until the test delivers them (fake::deliver) or fails them
// (fake::fail), async events are injected (fake::asyncEvent), and moving a QP to ERR flushes its
// outstanding work requests (or not, with fake::holdFlushes, to exercise the fence's bound).
//
// Two fake HCAs exist: "fake0" and "fake1", two ports each. Not thread-safe (tests are
// single-threaded).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace fake {

struct PostedSend {
  uint64_t wrId;
  ibv_wr_opcode opcode;
  std::vector<uint8_t> data;  // copied at post time
  uint64_t remoteAddr;
  uint32_t rkey;
  uint32_t immBe;  // as posted (network order)
  uint64_t localAddr = 0;  // RDMA READ: where the read bytes go (first SGE)
  uint32_t localLen = 0;
  bool badLkey = false;  // an SGE's lkey is an MR of another context (completes LOC_PROT_ERR)
};

// Resets every fake object (call at the start of each test).
void reset();
// Sends posted on `qp` and not yet completed, oldest first.
// A QP destroyed since the caller read it (the transport's worker) has none, and deliver() and
// fail() leave such a QP alone.
const std::vector<PostedSend>& outstanding(ibv_qp* qp);
// Receive WRs posted on `qp` and not consumed.
size_t postedRecvs(ibv_qp* qp);
// Delivers up to `max` of `from`'s outstanding sends to `to`, in order: WRITE copies into
// remoteAddr, WRITE_WITH_IMM copies and consumes one of `to`'s receives (RECV_RDMA_WITH_IMM),
// SEND copies into one of `to`'s receive buffers (RECV). The sender gets a success completion
// per WR. Returns how many were delivered (stops when `to` has no receive posted). Nothing
// reaches a `to` in ERR (dropped, as an HCA drops packets for a QP in the error state; the
// sends stay outstanding).
int deliver(ibv_qp* from, ibv_qp* to, int max = 1 << 30);
// RDMA READs are delivered by deliver() too: the bytes at remoteAddr go to the READ's local
// buffer, but only when an MR registered with IBV_ACCESS_REMOTE_READ and that rkey covers
// them and the responding QP (`to`) was given IBV_ACCESS_REMOTE_READ; otherwise the responder
// refuses it as RC's does (see "responder errors" below).
//
// Responder errors, as rxe's responder handles them (drivers/infiniband/sw/rxe/rxe_resp.c: RC
// "Class C", do_class_ac_error, then rxe_qp_error) and its requester completes them
// (rxe_comp.c): nothing is written or read; the requester's WR completes with the NAK's status
// and the requester's QP moves to ERR, its other sends flushed (IBV_WC_WR_FLUSH_ERR); the
// responder's QP (`to`) moves to ERR as well and its posted receives and sends flush with
// IBV_WC_WR_FLUSH_ERR (unless holdFlushes). No async event is queued: rxe raises none for
// either QP (an mlx5 HCA may report the responder's as IBV_EVENT_QP_REQ_ERR / QP_ACCESS_ERR).
// The statuses: an operation the responder QP's access flags do not enable (a WRITE without
// IBV_ACCESS_REMOTE_WRITE, a READ without IBV_ACCESS_REMOTE_READ; rxe's check_op_valid) is an
// "invalid request": IBV_WC_REM_INV_REQ_ERR; an R_Key violation (the rkey of an MR of another
// opening, an MR without the access, an address outside it; rxe's check_rkey) is
// IBV_WC_REM_ACCESS_ERR. The QP's access is checked first, as rxe does.
// Completes `from`'s oldest outstanding send with `status`; the rest get WR_FLUSH_ERR when
// `flushRest` (as a QP entering the error state does) and the QP moves to ERR.
void fail(ibv_qp* from, ibv_wc_status status, bool flushRest = true);
// Queues an async event on HCA context `ctx` (port events name `port`, QP events `qp`).
void asyncEvent(ibv_context* ctx, ibv_event_type type, int port, ibv_qp* qp = nullptr);
// State ibv_query_port reports for `port` of HCA `dev` (ACTIVE until set). Thread-safe, as is
// asyncEvent (a port watch thread may read both).
void setPortState(const std::string& dev, int port, ibv_port_state st);
// The LID ibv_query_port reports for the port (default 0).
void setPortLid(const std::string& dev, int port, uint16_t lid);
// What ibv_query_port reports as the port's rate codes (active_speed, active_width); default
// (0, 0), which no port reports: an unknown rate.
void setPortRate(const std::string& dev, int port, uint8_t activeSpeed, uint8_t activeWidth);
// What ibv_query_port reports as the port's link layer (IBV_LINK_LAYER_*); default Ethernet.
// Only what the port reports: the fake's QPs behave the same either way.
void setLinkLayer(const std::string& dev, int port, uint8_t linkLayer);
// What ibv_query_device reports for HCA `dev`: sys_image_guid (host order here; the fake
// answers it in network order, as verbs does) and max_qp. Default: both 0. Always 2 ports.
void setDeviceAttrs(const std::string& dev, uint64_t sysImageGuid, int maxQp);
// DEVICE_FATAL on every open context of HCA `dev`: queues the async event, and from then on
// that context refuses new objects (PD, CQ, channel, QP, MR: EIO) and its ports answer no
// query. A context opened later (Hca::reopen) is alive. Thread-safe.
void deviceFatal(const std::string& dev);
// Whether ibv_get_device_list lists HCA `dev` (and ibv_open_device opens it): a device being
// repaired is absent. Default: present. deviceListCalls(): ibv_get_device_list calls so far.
void setDevicePresent(const std::string& dev, bool present);
int deviceListCalls();
// ibv_fork_init calls since the process started (reset() does not clear them), and whether one
// came after the first ibv_get_device_list / ibv_open_device / ibv_reg_mr (libibverbs: too late
// to protect the registrations made before it). Thread-safe.
int forkInitCalls();
bool forkInitCameLate();
// True when `rkey` names a live MR registered on a context that reported DEVICE_FATAL.
bool mrOnDeadContext(uint32_t rkey);
// Keys are checked per opening: a send whose lkey belongs to an MR of another context completes
// with IBV_WC_LOC_PROT_ERR, a WRITE whose rkey belongs to an MR of a context other than the
// target QP's is a responder error with IBV_WC_REM_ACCESS_ERR (keys the fake never issued are
// not checked). A WRITE (with or without immediate) to a QP whose access flags (INIT, or a
// later modify with IBV_QP_ACCESS_FLAGS) lack IBV_ACCESS_REMOTE_WRITE is a responder error with
// IBV_WC_REM_INV_REQ_ERR: nothing is written, and both QPs move to ERR (above).
// While true, moving a QP to ERR does not flush its work requests (a stuck HCA).
void holdFlushes(bool hold);
// While true, ibv_modify_qp to ERR blocks (as rxe's was seen to for ~3 s after a local link
// loss) until it is set false again (reset() does); other calls go on meanwhile.
// blockedErrTransitions(): how many such calls are blocked now. Thread-safe.
void blockErrTransitions(bool block);
int blockedErrTransitions();
// While true, ibv_create_qp blocks until it is set false again (reset() does): a QP build on
// another thread (the transport's worker) held in the middle. blockedQpCreations(): how many
// such calls are blocked now. Thread-safe.
void blockQpCreation(bool block);
int blockedQpCreations();
// While true, ibv_destroy_qp blocks until it is set false again (reset() does), as rxe's was
// seen to for ~3 s after a local link loss (it waits for packets queued on the dead link);
// other calls go on meanwhile. blockedQpDestroys(): how many such calls are blocked now;
// qpDestroyers(): the thread of every ibv_destroy_qp that returned. Thread-safe.
void blockQpDestroy(bool block);
int blockedQpDestroys();
std::vector<std::thread::id> qpDestroyers();
// Holds every ibv_modify_qp of the access flags alone (RTS -> RTS, RcQp::setAccess) until
// released; blockedAccessModifies(): how many wait now; accessModifiers(): the thread of every
// such call since reset(), in order. Thread-safe.
void blockAccessModify(bool block);
int blockedAccessModifies();
// While true, ibv_reg_mr and ibv_reg_mr_iova2 block until it is set false again (reset()
// does): a registration held in the middle, e.g. a re-opened HCA's re-registration of every
// buffer (MrSet::refresh, under the transport's registry lock). ibv_reg_dmabuf_mr is not held.
// blockedMrRegistrations():
// how many such calls are blocked now. Thread-safe.
void blockMrRegistration(bool block);
int blockedMrRegistrations();
std::vector<std::thread::id> accessModifiers();
// Makes the next ibv_modify_qp (of `qp` only, when given) fail with `err` (0: none).
void failNextModify(int err, ibv_qp* qp = nullptr);
// Makes the next `times` ibv_destroy_qp calls of `qp` fail with `err` (the QP stays alive;
// 0: none).
void failNextDestroy(int err, ibv_qp* qp, int times = 1);
// The GID table of port `port` of HCA `dev` ("fake0"/"fake1"); empty after reset().
void setGids(const std::string& dev, int port, const std::vector<ibv_gid_entry>& table);
// The P_Key table of port `port` of HCA `dev` (host order); {0xffff} (the default partition)
// when never set.
void setPkeys(const std::string& dev, int port, const std::vector<uint16_t>& table);
// The P_Key index the last ibv_modify_qp with IBV_QP_PKEY_INDEX set on `qp` (-1: never).
int pkeyIndex(ibv_qp* qp);
// The (GRH traffic class, service level) the QP was given at RTR (IBV_QP_AV); (-1, -1) if never.
std::pair<int, int> qos(ibv_qp* qp);
// The address vector the QP was given at RTR (IBV_QP_AV): GRH or not, destination LID, source
// GID index, and the RTS retry settings (IBV_QP_TIMEOUT / RETRY_CNT / RNR_RETRY); -1 if never.
struct QpPath {
  int isGlobal = -1, dlid = -1, sgidIndex = -1;
  int timeout = -1, retryCnt = -1, rnrRetry = -1;
  int64_t destQpn = -1;  // IBV_QP_DEST_QPN at RTR: the peer QP this one is connected to
};
QpPath qpPath(ibv_qp* qp);
// Whether `qp` was created and not destroyed yet (safe on a destroyed QP's pointer).
bool qpAlive(ibv_qp* qp);
// How ibv_reg_dmabuf_mr answers: supported (registers like ibv_reg_mr; fd must be open, else
// EBADF), or not (EOPNOTSUPP). Default: supported. dmabufRegistrations(): successful ones.
void setDmabuf(bool supported);
int dmabufRegistrations();
// MRs registered (ibv_reg_mr, ibv_reg_mr_iova2, ibv_reg_dmabuf_mr) and not deregistered yet,
// on every device.
int liveMrs();
// One live MR as registered: the device of its context, the call that made it
// ("ibv_reg_mr", "ibv_reg_mr_iova2", "ibv_reg_dmabuf_mr"), its access flags as passed and its
// iova (ibv_reg_mr: the address). mrInfo(rkey): found false when no live MR has that rkey.
struct MrInfo {
  bool found = false;
  std::string dev, call;
  int access = 0;
  uint64_t iova = 0, len = 0;
};
MrInfo mrInfo(uint32_t rkey);
std::vector<MrInfo> liveMrInfos();
// ibv_reg_mr_iova2 (rdma-core 28+, IBVERBS_1.8): exported and resolved by default; present
// false re-loads the verbs table (verbs::loadVerbsApiWith) without it, as an older libibverbs
// would have (reg_mr_iova2 nullptr), true puts it back. reset() puts it back. Call it while no
// other thread uses the table (before a transport or HCA is made).
void setRegMrIova2(bool present);
// While true for HCA `dev`, ibv_reg_mr_iova2 and ibv_reg_dmabuf_mr refuse a registration whose
// access has IBV_ACCESS_RELAXED_ORDERING with EINVAL (a kernel that predates optional access
// flags); without the flag they register as usual. relaxedOrderingRefusals(): how many were
// refused since reset(). reset() clears both.
void refuseRelaxedOrdering(const std::string& dev, bool refuse);
int relaxedOrderingRefusals();
// The thread that made each ibv_create_qp call since reset(), in order. Thread-safe.
std::vector<std::thread::id> qpCreators();
// How many times ibv_poll_cq was called on `cq` (a test can see that a caller is polling, not
// blocked or gone). Thread-safe.
uint64_t cqPolls(ibv_cq* cq);
// The number the next ibv_create_qp gives its QP (as HCAs reuse the numbers of destroyed QPs).
void setNextQpn(uint32_t qpn);
// How the HCA `dev` treats a QP's remote access flags (the RC responder's check of
// IBV_ACCESS_REMOTE_WRITE): kEnforced (default; rxe, mlx5: a QP without it NAKs every WRITE,
// and ibv_query_qp reads back what it enforces), kIgnoredReported (the QP takes WRITEs
// whatever its flags, and ibv_query_qp says so: IBV_ACCESS_REMOTE_WRITE always set, as irdma
// reports the write-response enable it sets at QP creation), kQueryFails (enforced, but
// ibv_query_qp of IBV_QP_ACCESS_FLAGS fails with EOPNOTSUPP). reset() restores kEnforced.
enum class QpAccess { kEnforced, kIgnoredReported, kQueryFails };
void setQpAccess(const std::string& dev, QpAccess mode);
// Current state of a QP as the fake sees it.
ibv_qp_state state(ibv_qp* qp);

}  // namespace fake
