// railover-verbs-probe: verbs-level observation tool for the RDMA test bed (Soft-RoCE guests).
//
// Not part of the plugin; built only when libibverbs headers are present. Every output line is
// one JSON object with "t_us", CLOCK_MONOTONIC in microseconds (the clock of the plugin's
// journal in the same kernel). Sub-commands:
//
//   now                         print CLOCK_MONOTONIC (µs) and exit
//   events [DEV...] [--duration S]
//        watch IBV async events of every (or the named) RDMA device and rtnetlink link changes
//        (carrier, admin state); prints {"ev":"ready"} once subscribed. Runs until SIGTERM/SIGINT
//        or the duration (s) passes.
//   stream --server -d DEV [-g GIDX] [-p PORT] [--duration S]
//   stream -d DEV -a ADDR [-g GIDX] [-p PORT] [--timeout T] [--retry N] [--depth D] [--size B]
//          [--duration S] [--stall-ms MS] [--max-errors N]
//        RC RDMA-WRITE streamer. The server registers a buffer and waits; the client connects over
//        TCP (bootstrap: QPN, PSN, GID, rkey, address), keeps D signalled WRITEs of B bytes in
//        flight, and reports every non-success CQE (status name and code, µs since the last good
//        CQE), stalls (no completion for --stall-ms), resumption, async events of its device, and
//        the time ibv_destroy_qp took. --timeout is the RC local ACK timeout exponent
//        (4.096 µs * 2^T), --retry the RC retry count (rxe treats 7 as infinite).
//   relay --listen-unix PATH --connect-tcp HOST:PORT [--deadline S]
//   relay --listen-tcp PORT --connect-unix PATH [--deadline S]
//        byte relay between a pathname UNIX socket and TCP, one forked child per connection; the
//        outgoing connect is retried (ENOENT/ECONNREFUSED) until the deadline (default 120 s).
//        Lets programs that meet over UNIX sockets (railover-perf's rendezvous) span two guests.
//
// Exit status: 0 ok, 1 runtime failure (message on stderr and as {"ev":"error"}), 2 usage.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <linux/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop = 0;
static void on_signal(int s) { (void)s; g_stop = 1; }

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

// One JSON line: {"t_us":..,"ev":"<ev>"<rest>} where rest is a printf fragment starting with ','.
static void emit(const char* ev, const char* fmt, ...) {
  char rest[1024] = "";
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rest, sizeof rest, fmt, ap);
    va_end(ap);
  }
  printf("{\"t_us\":%llu,\"ev\":\"%s\"%s}\n", (unsigned long long)now_us(), ev, rest);
  fflush(stdout);
}

static int fail(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "railover-verbs-probe: %s\n", msg);
  for (char* p = msg; *p; p++)
    if (*p == '"' || *p == '\\') *p = '\'';
  emit("error", ",\"message\":\"%s\"", msg);
  return 1;
}

static void usage(void) {
  fprintf(stderr,
          "usage: railover-verbs-probe now | events [DEV...] [--duration S] |\n"
          "       stream [--server] -d DEV [-a ADDR] [-g GIDX] [-p PORT] [--timeout T] [--retry N]\n"
          "              [--depth D] [--size B] [--duration S] [--stall-ms MS] [--max-errors N] |\n"
          "       relay (--listen-unix PATH --connect-tcp HOST:PORT | --listen-tcp PORT --connect-unix PATH)"
          " [--deadline S]\n");
  exit(2);
}

static void install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
}

// ------------------------------------------------------------------------------------ events

static int open_rtnl(void) {
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
  if (fd < 0) return -1;
  struct sockaddr_nl sa;
  memset(&sa, 0, sizeof sa);
  sa.nl_family = AF_NETLINK;
  sa.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR;
  if (bind(fd, (struct sockaddr*)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void drain_rtnl(int fd) {
  char buf[16384];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return;
    for (struct nlmsghdr* h = (struct nlmsghdr*)buf; NLMSG_OK(h, (unsigned)n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == RTM_NEWLINK || h->nlmsg_type == RTM_DELLINK) {
        struct ifinfomsg* ifi = NLMSG_DATA(h);
        const char* name = "?";
        int carrier = -1;
        int len = (int)IFLA_PAYLOAD(h);
        for (struct rtattr* a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
          if (a->rta_type == IFLA_IFNAME) name = RTA_DATA(a);
          if (a->rta_type == IFLA_CARRIER) carrier = *(unsigned char*)RTA_DATA(a);
        }
        emit("link", ",\"ifname\":\"%s\",\"admin_up\":%d,\"carrier\":%d,\"running\":%d", name,
             (ifi->ifi_flags & IFF_UP) ? 1 : 0, carrier, (ifi->ifi_flags & IFF_RUNNING) ? 1 : 0);
      } else if (h->nlmsg_type == RTM_NEWADDR || h->nlmsg_type == RTM_DELADDR) {
        struct ifaddrmsg* ifa = NLMSG_DATA(h);
        char addr[INET6_ADDRSTRLEN] = "?";
        int len = (int)IFA_PAYLOAD(h);
        for (struct rtattr* a = IFA_RTA(ifa); RTA_OK(a, len); a = RTA_NEXT(a, len))
          if (a->rta_type == IFA_LOCAL) inet_ntop(ifa->ifa_family, RTA_DATA(a), addr, sizeof addr);
        emit(h->nlmsg_type == RTM_NEWADDR ? "addr_add" : "addr_del", ",\"ifindex\":%d,\"addr\":\"%s\"",
             ifa->ifa_index, addr);
      }
    }
  }
}

static void emit_async(const char* dev, struct ibv_async_event* e) {
  int port = (e->event_type == IBV_EVENT_PORT_ERR || e->event_type == IBV_EVENT_PORT_ACTIVE ||
              e->event_type == IBV_EVENT_GID_CHANGE || e->event_type == IBV_EVENT_LID_CHANGE)
                 ? e->element.port_num
                 : 0;
  emit("async", ",\"dev\":\"%s\",\"type\":\"%s\",\"code\":%d,\"port\":%d", dev,
       ibv_event_type_str(e->event_type), (int)e->event_type, port);
}

static double parse_seconds(const char* s) {
  char* end;
  double v = strtod(s, &end);
  if (*end || v < 0) {
    fprintf(stderr, "railover-verbs-probe: not a duration in seconds: %s\n", s);
    exit(2);
  }
  return v;
}

static int cmd_events(int argc, char** argv) {
  double duration = 0;
  const char* want[16];
  int nwant = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--duration") && i + 1 < argc)
      duration = parse_seconds(argv[++i]);
    else if (argv[i][0] != '-' && nwant < 16)
      want[nwant++] = argv[i];
    else
      usage();
  }
  int ndev = 0;
  struct ibv_device** list = ibv_get_device_list(&ndev);
  if (!list) return fail("ibv_get_device_list: %s", strerror(errno));
  struct ibv_context* ctx[32];
  const char* names[32];
  int nctx = 0;
  for (int i = 0; i < ndev && nctx < 32; i++) {
    const char* n = ibv_get_device_name(list[i]);
    int take = nwant == 0;
    for (int j = 0; j < nwant; j++) take |= !strcmp(want[j], n);
    if (!take) continue;
    ctx[nctx] = ibv_open_device(list[i]);
    if (!ctx[nctx]) return fail("ibv_open_device(%s): %s", n, strerror(errno));
    fcntl(ctx[nctx]->async_fd, F_SETFL, fcntl(ctx[nctx]->async_fd, F_GETFL) | O_NONBLOCK);
    names[nctx++] = n;
  }
  if (nctx == 0) return fail("no RDMA device matched");
  int nl = open_rtnl();
  if (nl < 0) return fail("rtnetlink socket: %s", strerror(errno));
  install_signals();
  char devs[512] = "";
  for (int i = 0; i < nctx; i++)
    snprintf(devs + strlen(devs), sizeof devs - strlen(devs), "%s\"%s\"", i ? "," : "", names[i]);
  emit("ready", ",\"devices\":[%s]", devs);
  uint64_t end = duration > 0 ? now_us() + (uint64_t)(duration * 1e6) : 0;
  while (!g_stop && (!end || now_us() < end)) {
    struct pollfd p[33];
    for (int i = 0; i < nctx; i++) p[i] = (struct pollfd){ctx[i]->async_fd, POLLIN, 0};
    p[nctx] = (struct pollfd){nl, POLLIN, 0};
    int r = poll(p, nctx + 1, 200);
    if (r < 0 && errno != EINTR) return fail("poll: %s", strerror(errno));
    if (r <= 0) continue;
    for (int i = 0; i < nctx; i++) {
      struct ibv_async_event e;
      while ((p[i].revents & POLLIN) && ibv_get_async_event(ctx[i], &e) == 0) {
        emit_async(names[i], &e);
        ibv_ack_async_event(&e);
      }
    }
    if (p[nctx].revents & POLLIN) drain_rtnl(nl);
  }
  emit("end", NULL);
  for (int i = 0; i < nctx; i++) ibv_close_device(ctx[i]);
  ibv_free_device_list(list);
  return 0;
}

// ------------------------------------------------------------------------------------ stream

struct wire {  // bootstrap message, both directions (network byte order for integers)
  uint32_t qpn, psn, rkey, pad;
  uint64_t addr;
  uint8_t gid[16];
};

struct opts {
  int server;
  const char *dev, *addr;
  int gidx, port, timeout, retry, depth, stall_ms, max_errors;
  size_t size;
  double duration;
};

static int write_all(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, void* p, size_t n, int timeout_ms) {
  char* c = p;
  while (n) {
    struct pollfd pf = {fd, POLLIN, 0};
    int r = poll(&pf, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    ssize_t got = read(fd, c, n);
    if (got <= 0) return -1;
    c += got;
    n -= (size_t)got;
  }
  return 0;
}

static int qp_to_rts(struct ibv_qp* qp, const struct opts* o, const struct wire* peer, uint32_t my_psn) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return fail("modify QP to INIT: %s", strerror(errno));
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;  // rxe's active MTU on a 1500-byte netdev
  a.dest_qp_num = ntohl(peer->qpn);
  a.rq_psn = ntohl(peer->psn);
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
  a.ah_attr.grh.sgid_index = (uint8_t)o->gidx;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return fail("modify QP to RTR: %s", strerror(errno));
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = (uint8_t)o->timeout;
  a.retry_cnt = (uint8_t)o->retry;
  a.rnr_retry = 7;
  a.sq_psn = my_psn;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                IBV_QP_MAX_QP_RD_ATOMIC))
    return fail("modify QP to RTS: %s", strerror(errno));
  return 0;
}

static int tcp_connect(const char* host, int port, int timeout_ms) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  if (getaddrinfo(host, ps, &hints, &res) != 0 || !res) return -1;
  uint64_t deadline = now_us() + (uint64_t)timeout_ms * 1000u;
  int fd = -1;
  while (!g_stop && now_us() < deadline) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
    struct timespec ts = {0, 100 * 1000 * 1000};  // retry pacing while the peer starts
    nanosleep(&ts, NULL);
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

static int tcp_listen(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (bind(fd, (struct sockaddr*)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void drain_async(struct ibv_context* ctx, const char* dev) {
  struct ibv_async_event e;
  while (ibv_get_async_event(ctx, &e) == 0) {
    emit_async(dev, &e);
    ibv_ack_async_event(&e);
  }
}

static int cmd_stream(int argc, char** argv) {
  struct opts o = {0, NULL, NULL, 1, 18515, 14, 6, 16, 2000, 1000000, 65536, 10.0};
  for (int i = 0; i < argc; i++) {
    const char* k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(k, "--server")) { o.server = 1; continue; }
    if (!v) usage();
    i++;
    if (!strcmp(k, "-d")) o.dev = v;
    else if (!strcmp(k, "-a")) o.addr = v;
    else if (!strcmp(k, "-g")) o.gidx = atoi(v);
    else if (!strcmp(k, "-p")) o.port = atoi(v);
    else if (!strcmp(k, "--timeout")) o.timeout = atoi(v);
    else if (!strcmp(k, "--retry")) o.retry = atoi(v);
    else if (!strcmp(k, "--depth")) o.depth = atoi(v);
    else if (!strcmp(k, "--size")) o.size = (size_t)strtoull(v, NULL, 10);
    else if (!strcmp(k, "--duration")) o.duration = parse_seconds(v);
    else if (!strcmp(k, "--stall-ms")) o.stall_ms = atoi(v);
    else if (!strcmp(k, "--max-errors")) o.max_errors = atoi(v);
    else usage();
  }
  if (!o.dev || (!o.server && !o.addr) || o.timeout < 0 || o.timeout > 31 || o.retry < 0 || o.retry > 7 ||
      o.depth < 1 || o.depth > 256 || o.size < 1 || o.size > (64u << 20) || o.stall_ms < 1)
    usage();
  install_signals();
  int ndev = 0;
  struct ibv_device** list = ibv_get_device_list(&ndev);
  struct ibv_device* dev = NULL;
  for (int i = 0; list && i < ndev; i++)
    if (!strcmp(ibv_get_device_name(list[i]), o.dev)) dev = list[i];
  if (!dev) return fail("no RDMA device %s", o.dev);
  struct ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) return fail("ibv_open_device(%s): %s", o.dev, strerror(errno));
  fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  size_t bytes = o.server ? o.size * (size_t)o.depth : o.size;
  char* buf = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
  memset(buf, 0x5a, bytes);
  struct ibv_mr* mr = pd ? ibv_reg_mr(pd, buf, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : NULL;
  struct ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  struct ibv_cq* cq = ch ? ibv_create_cq(ctx, o.depth * 2 + 8, NULL, ch, 0) : NULL;
  if (!mr || !cq) return fail("allocating PD/MR/CQ on %s: %s", o.dev, strerror(errno));
  fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
  struct ibv_qp_init_attr qa;
  memset(&qa, 0, sizeof qa);
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = (uint32_t)o.depth;
  qa.cap.max_recv_wr = 1;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  struct ibv_qp* qp = ibv_create_qp(pd, &qa);
  if (!qp) return fail("ibv_create_qp: %s", strerror(errno));
  union ibv_gid gid;
  if (ibv_query_gid(ctx, 1, o.gidx, &gid)) return fail("ibv_query_gid(%s, %d): %s", o.dev, o.gidx, strerror(errno));
  srand48((long)now_us());
  uint32_t psn = (uint32_t)lrand48() & 0xffffff;
  struct wire mine = {htonl(qp->qp_num), htonl(psn), htonl(mr->rkey), 0, 0, {0}};
  uint64_t a64 = (uint64_t)(uintptr_t)buf;
  memcpy(&mine.addr, &a64, 8);
  memcpy(mine.gid, gid.raw, 16);
  struct wire peer;
  int conn;
  if (o.server) {
    int lfd = tcp_listen(o.port);
    if (lfd < 0) return fail("listen on TCP port %d: %s", o.port, strerror(errno));
    emit("listening", ",\"port\":%d,\"dev\":\"%s\"", o.port, o.dev);
    struct pollfd pf = {lfd, POLLIN, 0};
    int r = 0;
    uint64_t deadline = now_us() + (uint64_t)((o.duration + 120) * 1e6);
    while (!g_stop && now_us() < deadline && (r = poll(&pf, 1, 200)) == 0) {}
    if (r <= 0) return fail("no client connected on port %d", o.port);
    conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    close(lfd);
  } else {
    conn = tcp_connect(o.addr, o.port, 120000);
    if (conn < 0) return fail("connecting to %s:%d: %s", o.addr, o.port, strerror(errno));
  }
  if (write_all(conn, &mine, sizeof mine) || read_all(conn, &peer, sizeof peer, 60000))
    return fail("bootstrap exchange failed");
  if (qp_to_rts(qp, &o, &peer, psn)) return 1;
  char ok = 'k';
  if (write_all(conn, &ok, 1) || read_all(conn, &ok, 1, 60000)) return fail("bootstrap sync failed");
  emit("connected", ",\"dev\":\"%s\",\"qpn\":%u,\"peer_qpn\":%u,\"timeout\":%d,\"retry_cnt\":%d,\"role\":\"%s\"", o.dev,
       qp->qp_num, ntohl(peer.qpn), o.timeout, o.retry, o.server ? "server" : "client");
  int rc = 0;
  if (o.server) {
    // The client closes the bootstrap connection when it is done; keep the QP until then.
    uint64_t deadline = now_us() + (uint64_t)((o.duration + 120) * 1e6);
    while (!g_stop && now_us() < deadline) {
      struct pollfd p[2] = {{conn, POLLIN, 0}, {ctx->async_fd, POLLIN, 0}};
      if (poll(p, 2, 200) > 0) {
        if (p[1].revents & POLLIN) drain_async(ctx, o.dev);
        if (p[0].revents) break;
      }
    }
  } else {
    uint64_t raddr;
    memcpy(&raddr, &peer.addr, 8);
    uint64_t t_end = now_us() + (uint64_t)(o.duration * 1e6), last_ok = now_us(), last_report = now_us();
    uint64_t posted = 0, ok_cqes = 0, err_cqes = 0, flushes = 0, bytes_ok = 0;
    int inflight = 0, broken = 0;
    uint64_t stalled = 0;  // CLOCK_MONOTONIC µs of the last good CQE when a stall was reported, else 0
    ibv_req_notify_cq(cq, 0);
    while (!g_stop && now_us() < t_end) {
      while (!broken && inflight < o.depth) {
        struct ibv_sge sge = {(uintptr_t)buf, (uint32_t)o.size, mr->lkey};
        struct ibv_send_wr wr, *bad;
        memset(&wr, 0, sizeof wr);
        wr.wr_id = posted;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = raddr + (posted % (uint64_t)o.depth) * o.size;
        wr.wr.rdma.rkey = ntohl(peer.rkey);
        if (ibv_post_send(qp, &wr, &bad)) {
          emit("post_error", ",\"errno\":%d,\"message\":\"%s\"", errno, strerror(errno));
          broken = 1;
          break;
        }
        posted++;
        inflight++;
      }
      struct pollfd p[2] = {{ch->fd, POLLIN, 0}, {ctx->async_fd, POLLIN, 0}};
      poll(p, 2, 100);
      if (p[1].revents & POLLIN) drain_async(ctx, o.dev);
      if (p[0].revents & POLLIN) {
        struct ibv_cq* ecq;
        void* ectx;
        if (ibv_get_cq_event(ch, &ecq, &ectx) == 0) ibv_ack_cq_events(ecq, 1);
        ibv_req_notify_cq(cq, 0);
      }
      struct ibv_wc wc[32];
      int n;
      while ((n = ibv_poll_cq(cq, 32, wc)) > 0) {
        for (int i = 0; i < n; i++) {
          inflight--;
          if (wc[i].status == IBV_WC_SUCCESS) {
            ok_cqes++;
            bytes_ok += o.size;
            last_ok = now_us();
            if (stalled) {
              emit("resumed", ",\"stalled_us\":%llu", (unsigned long long)(last_ok - stalled));
              stalled = 0;
            }
          } else if (wc[i].status == IBV_WC_WR_FLUSH_ERR && broken) {
            flushes++;
          } else {
            err_cqes++;
            emit("cqe_error", ",\"status\":\"%s\",\"code\":%d,\"vendor_err\":%u,\"wr_id\":%llu,\"since_last_ok_us\":%llu",
                 ibv_wc_status_str(wc[i].status), (int)wc[i].status, wc[i].vendor_err,
                 (unsigned long long)wc[i].wr_id, (unsigned long long)(now_us() - last_ok));
            broken = 1;
          }
        }
      }
      if (n < 0) return fail("ibv_poll_cq failed");
      uint64_t t = now_us();
      if (!broken && !stalled && inflight > 0 && t - last_ok > (uint64_t)o.stall_ms * 1000u) {
        emit("stall", ",\"since_last_ok_us\":%llu,\"inflight\":%d", (unsigned long long)(t - last_ok), inflight);
        stalled = last_ok;
      }
      if (t - last_report >= 1000000u) {
        emit("progress", ",\"ok\":%llu,\"bytes\":%llu,\"inflight\":%d", (unsigned long long)ok_cqes,
             (unsigned long long)bytes_ok, inflight);
        last_report = t;
      }
      if (broken && inflight == 0) break;
      if ((int)err_cqes >= o.max_errors) break;
    }
    emit("end", ",\"ok\":%llu,\"bytes\":%llu,\"errors\":%llu,\"flushed\":%llu,\"inflight\":%d,\"broken\":%d",
         (unsigned long long)ok_cqes, (unsigned long long)bytes_ok, (unsigned long long)err_cqes,
         (unsigned long long)flushes, inflight, broken);
    rc = 0;
  }
  close(conn);
  uint64_t t0 = now_us();
  int d = ibv_destroy_qp(qp);
  emit("destroy_qp", ",\"us\":%llu,\"ok\":%d", (unsigned long long)(now_us() - t0), d == 0);
  ibv_destroy_cq(cq);
  ibv_destroy_comp_channel(ch);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  free(buf);
  return rc;
}

// ------------------------------------------------------------------------------------ relay

static void pump(int a, int b) {
  char buf[65536];
  struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
  for (;;) {
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < 2; i++) {
      if (!p[i].revents) continue;
      ssize_t n = read(p[i].fd, buf, sizeof buf);
      if (n <= 0 || write_all(p[1 - i].fd, buf, (size_t)n)) return;
    }
  }
}

static int unix_connect_retry(const char* path, uint64_t deadline) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  while (now_us() < deadline) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, (struct sockaddr*)&sa, sizeof sa) == 0) return fd;
    close(fd);
    if (errno != ENOENT && errno != ECONNREFUSED) return -1;
    struct timespec ts = {0, 50 * 1000 * 1000};  // the target binds later: pace the retries
    nanosleep(&ts, NULL);
  }
  return -1;
}

static int cmd_relay(int argc, char** argv) {
  const char *lu = NULL, *ct = NULL, *cu = NULL;
  int lt = 0;
  double deadline_s = 120;
  for (int i = 0; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--listen-unix")) lu = argv[i + 1];
    else if (!strcmp(argv[i], "--connect-tcp")) ct = argv[i + 1];
    else if (!strcmp(argv[i], "--listen-tcp")) lt = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--connect-unix")) cu = argv[i + 1];
    else if (!strcmp(argv[i], "--deadline")) deadline_s = parse_seconds(argv[i + 1]);
    else usage();
  }
  if (argc % 2 || !((lu && ct && !lt && !cu) || (lt && cu && !lu && !ct))) usage();
  install_signals();
  signal(SIGCHLD, SIG_IGN);  // children are reaped by the kernel
  int lfd;
  char host[256] = "";
  int tport = 0;
  if (lu) {
    const char* colon = strrchr(ct, ':');
    if (!colon || (size_t)(colon - ct) >= sizeof host) usage();
    memcpy(host, ct, (size_t)(colon - ct));
    tport = atoi(colon + 1);
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", lu);
    unlink(lu);
    if (bind(lfd, (struct sockaddr*)&sa, sizeof sa) || listen(lfd, 64))
      return fail("listen on %s: %s", lu, strerror(errno));
  } else {
    lfd = tcp_listen(lt);
    if (lfd < 0) return fail("listen on TCP port %d: %s", lt, strerror(errno));
  }
  emit("ready", ",\"listen\":\"%s\"", lu ? lu : "tcp");
  while (!g_stop) {
    struct pollfd pf = {lfd, POLLIN, 0};
    if (poll(&pf, 1, 200) <= 0) continue;
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) continue;
    pid_t pid = fork();
    if (pid == 0) {
      close(lfd);
      uint64_t dl = now_us() + (uint64_t)(deadline_s * 1e6);
      int o = lu ? tcp_connect(host, tport, (int)(deadline_s * 1000)) : unix_connect_retry(cu, dl);
      if (o < 0) {
        fprintf(stderr, "railover-verbs-probe relay: connect to %s failed\n", lu ? ct : cu);
        _exit(1);
      }
      pump(c, o);
      _exit(0);
    }
    close(c);
  }
  if (lu) unlink(lu);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) usage();
  if (!strcmp(argv[1], "now")) {
    printf("%llu\n", (unsigned long long)now_us());
    return 0;
  }
  if (!strcmp(argv[1], "events")) return cmd_events(argc - 2, argv + 2);
  if (!strcmp(argv[1], "stream")) return cmd_stream(argc - 2, argv + 2);
  if (!strcmp(argv[1], "relay")) return cmd_relay(argc - 2, argv + 2);
  usage();
  return 2;
}
