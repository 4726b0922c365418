// The journal's events (RAILOVER_EVENT_LOG), declared once: each event's name, meaning and
// fields (name, type, meaning). From this list come
//   * railover::Event, an enum of the events;
//   * one typed emitter per event, a method of railover::Journal (telemetry/journal.h),
//     journal-><event>(field values...), the only way to write a journal line: an undeclared
//     event, a missing or extra field, or a value of the wrong kind does not compile;
//   * kEvents, the table that `railover_describe_json` publishes for the Python readers and
//     docs/OPERATIONS.md (tests fail when either misses an event or a field).
//
// Every line also carries "t_us" (CLOCK_MONOTONIC µs), "pid" and "event" before the fields.
// Compatibility: old journals must still read, so an existing event keeps its name and fields;
// add fields (optional ones when old lines lack them) rather than rename.
//
// Adding an event: add EVENT(name, meaning) to RAILOVER_JOURNAL_EVENTS and define
// RO_EVENT_FIELDS_<name>(FIRST, NEXT) listing its fields, the first one with FIRST, the others
// with NEXT (this spares the generated parameter lists a leading comma).
// Field types: Str (JSON string), U64 (JSON integer), Bool (true/false), Comm (the comm id,
// a decimal string), OptU64 (JSON integer, left out when the emitter passes std::nullopt).
//
// Thread-safety: the emitters may be called from any thread (see journal.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#define RAILOVER_JOURNAL_EVENTS(EVENT)                                                                          \
  EVENT(nic_down, "a local NIC lost carrier, was set down, removed or renamed, or lost its address (netlink)")   \
  EVENT(nic_up, "a local NIC is usable again (carrier, admin up and an address)")                              \
  EVENT(nic_addr_change, "a local NIC's address changed; railover listens on the new one and tells its peers") \
  EVENT(peer_addr_change, "a peer's NIC moved to another address (its notice arrived)")                        \
  EVENT(pair_down, "probes between a local NIC and a peer address stopped answering, or a peer's NIC-down "    \
                   "notice arrived")                                                                           \
  EVENT(pair_up, "probes between a local NIC and a peer address answer again")                                 \
  EVENT(path_up, "one path of a comm connected (HELLO accepted); it is a standby until traffic moves to it")   \
  EVENT(path_down, "one path of a comm failed")                                                                \
  EVENT(path_state, "one path of a comm changed state (connecting, standby, active, failed, closed), with the "  \
                    "reason: every transition of the path state machine, one line each")                        \
  EVENT(no_standby, "a connection got no standby path (one NIC, or no NIC on the peer's rail): it cannot "     \
                    "fail over")                                                                               \
  EVENT(rail_mismatch, "the two hosts' rails do not match (cabling, NIC selection or RAILOVER_RAILS differ): "    \
                       "a path was paired on its NIC's subnet instead of by rail, kept off it, or not opened; "   \
                       "once per local NIC and kind, with the WARN")                                            \
  EVENT(failover, "traffic of a comm moved from a failed path to a standby path and resumed")                  \
  EVENT(failback, "traffic moved back to the repaired primary path after its hold-down")                       \
  EVENT(recover, "traffic resumed on the very path that failed (no standby was usable)")                       \
  EVENT(resume, "the receiver accepted a RESUME on a path (the receiving side of a switch)")                   \
  EVENT(flap, "a path failed again within its hold-down; the hold-down doubles")                               \
  EVENT(fatal, "the comm gave up: no usable path for RAILOVER_FATAL_TIMEOUT, the peer process exited, or the " \
               "peer closed the comm with requests pending; the pending call returns an error to NCCL (with "       \
               "RAILOVER_ABORT_ON_FATAL=1 the process exits)")                                                          \
  EVENT(health_late, "the health thread woke late (a busy host): probe deadlines were extended by the delay "   \
                     "instead of reading it as loss (at most one line a second)")                              \
  EVENT(peer_silence, "every rail to one peer went silent at once: held as the peer (or this host) not "        \
                      "running, not as a network fault, for a bounded time")                                    \
  EVENT(pair_queued, "probe answers on a NIC pair came back late while the same peer answered another rail "    \
                     "promptly: a queue on this rail (congestion); failback onto it waits a hold-down of prompt "  \
                     "answers")                                                                                    \
  EVENT(transport_slow, "a call into a path's transport held the calling thread (NCCL's, or the sweeper) for "  \
                        "longer than 200 ms: no other path of that thread moved meanwhile (at most one line a "  \
                        "second per comm, direction and kind of call)")                                                          \
  EVENT(size_loss_ignored, "a probe burst lost its full-size probes but TCP data was still acknowledged: "      \
                           "congestion, not a size-dependent black hole; no verdict")                                 \
  EVENT(hca_addr_change, "the address a NIC's new RDMA paths use changed while its HCA port stayed up: the GID "  \
                         "chosen again after the GID table changed (RoCE; connected paths keep theirs), or a LID "  \
                         "the subnet manager re-assigned (InfiniBand; connected paths fail over)")

#define RO_EVENT_FIELDS_nic_down(FIRST, NEXT) \
  FIRST(nic, Str, "NIC name")                 \
  NEXT(signal, Str, "what showed it (health.cc, setNic): 'carrier lost', 'admin down', 'link removed', 'renamed', 'address removed', 'RDMA port error' or 'RDMA device fatal error'")
#define RO_EVENT_FIELDS_nic_up(FIRST, NEXT)                                         \
  FIRST(nic, Str, "NIC name")                                                       \
  NEXT(signal, Str, "what showed it: 'link up' (carrier and admin up), 'address added', 'RDMA port active' or 'RDMA device re-opened, port active'")  \
  NEXT(neigh_cleared, U64, "unresolved ARP/ND entries deleted at the repair (0 without CAP_NET_ADMIN)")
#define RO_EVENT_FIELDS_nic_addr_change(FIRST, NEXT) \
  FIRST(nic, Str, "NIC name")                        \
  NEXT(old, Str, "previous address")                 \
  NEXT(new, Str, "new address")
#define RO_EVENT_FIELDS_peer_addr_change(FIRST, NEXT) \
  FIRST(old, Str, "the peer NIC's previous address")  \
  NEXT(new, Str, "its new address")                   \
  NEXT(port, U64, "its listening port")
#define RO_EVENT_FIELDS_pair_down(FIRST, NEXT)                      \
  FIRST(nic, Str, "local NIC name")                                 \
  NEXT(peer, Str, "peer address")                                   \
  NEXT(cause, Str, "why: probe timeout, peer notice, local NIC down") \
  NEXT(detection_us, U64, "µs from the last answered probe to the verdict (0 when unknown)")
#define RO_EVENT_FIELDS_pair_up(FIRST, NEXT) \
  FIRST(nic, Str, "local NIC name")          \
  NEXT(peer, Str, "peer address")            \
  NEXT(down_for_us, U64, "how long the pair was down, µs")  \
  NEXT(probes_while_down, OptU64, "probes sent to the pair while it was down (they back off)")
// The fields every event about one path of a comm starts with.
#define RO_PATH_FIELDS(FIRST, NEXT)               \
  FIRST(comm, Comm, "comm id")                    \
  NEXT(dir, Str, "send or recv")                  \
  NEXT(nic, Str, "local NIC of the path")         \
  NEXT(peer, Str, "peer address of the path")
#define RO_EVENT_FIELDS_path_up(FIRST, NEXT)              \
  RO_PATH_FIELDS(FIRST, NEXT)                             \
  NEXT(generation, U64, "connection generation of the path (grows on every reconnect)") \
  NEXT(open_us, U64, "send: how long opening the path (the transport's openSendPath) held the caller's thread, µs (RDMA creates the path's CQ and QPs on its worker, not in this call); recv: 0")
#define RO_EVENT_FIELDS_path_down(FIRST, NEXT)                                    \
  RO_PATH_FIELDS(FIRST, NEXT)                                                     \
  NEXT(cause, Str, "why the path failed")                                         \
  NEXT(active, Bool, "whether it carried the comm's traffic")                     \
  NEXT(detection_us, OptU64, "send side: µs from the active path's last progress to the verdict")
#define RO_EVENT_FIELDS_path_state(FIRST, NEXT)                            \
  RO_PATH_FIELDS(FIRST, NEXT)                                               \
  NEXT(from, Str, "state before: connecting, standby, active, failed or closed") \
  NEXT(to, Str, "state after")                                              \
  NEXT(reason, Str, "why it changed (the fault, the switch and its cause, the close)")
#define RO_EVENT_FIELDS_no_standby(FIRST, NEXT) \
  FIRST(nic, Str, "local NIC of the primary path") \
  NEXT(peer, Str, "the peer")
#define RO_EVENT_FIELDS_rail_mismatch(FIRST, NEXT)                                                        \
  FIRST(nic, Str, "local NIC the note is about")                                                          \
  NEXT(peer, Str, "the peer (its address on the comm's primary path)")                                    \
  NEXT(kind, Str, "primary_repaired, primary_off_subnet, standby_repaired, standby_skipped or no_partner") \
  NEXT(message, Str, "the WARN's text: the NICs, addresses and subnets, and what railover does")
#define RO_RESUMED_FIELDS(FIRST, NEXT)                                                    \
  FIRST(comm, Comm, "comm id")                                                           \
  NEXT(to_nic, Str, "local NIC now carrying the traffic")                                \
  NEXT(peer, Str, "peer address of that path")                                           \
  NEXT(resumed_seq, U64, "first message sequence number sent again")                     \
  NEXT(bytes_resent, U64, "bytes sent again (unacknowledged when the path failed)")      \
  NEXT(convergence_us, U64, "µs from the fault's detection (or the planned switch) to traffic resumed")
#define RO_EVENT_FIELDS_failover(FIRST, NEXT) RO_RESUMED_FIELDS(FIRST, NEXT)
#define RO_EVENT_FIELDS_failback(FIRST, NEXT) RO_RESUMED_FIELDS(FIRST, NEXT)
#define RO_EVENT_FIELDS_recover(FIRST, NEXT) RO_RESUMED_FIELDS(FIRST, NEXT)
#define RO_EVENT_FIELDS_resume(FIRST, NEXT)   \
  FIRST(comm, Comm, "comm id")                \
  NEXT(dir, Str, "recv")                      \
  NEXT(nic, Str, "local NIC of the path")     \
  NEXT(peer, Str, "peer address of the path") \
  NEXT(next_seq, U64, "next message sequence number the receiver expects") \
  NEXT(waited_us, U64, "from the RESUME's arrival to the answer, µs (0: answered at once)") \
  NEXT(fence_queue_us, U64, "of that wait, the part until a fence thread started the old path's fence (the one that ended last; all parts 0 when the answer waited for no fence), µs") \
  NEXT(fence_us, U64, "the part while that fence ran (RDMA: QP to ERR and drained, after any wait for the path's grant of remote write, see fence_grant_wait_us), µs") \
  NEXT(fence_to_answer_us, U64, "the part from that fence's end to the answer (until the comm's progress saw it), µs") \
  NEXT(fence_grant_wait_us, U64, "of fence_us, the part that fence waited for a grant of remote write to the old path's QPs that was already running (RDMA: an ibv_modify_qp; 0 when none ran), µs")
#define RO_EVENT_FIELDS_flap(FIRST, NEXT)     \
  FIRST(comm, Comm, "comm id")                \
  NEXT(nic, Str, "local NIC of the path")     \
  NEXT(flaps, U64, "flaps of this path so far") \
  NEXT(hold_down_ms, U64, "the path's hold-down from now on, ms")
#define RO_EVENT_FIELDS_fatal(FIRST, NEXT) \
  FIRST(comm, Comm, "comm id")             \
  NEXT(dir, Str, "send or recv")           \
  NEXT(message, Str, "the error NCCL gets (NICs, with RDMA the HCA port behind each, peer and cause)")
#define RO_EVENT_FIELDS_transport_slow(FIRST, NEXT)                                   \
  RO_PATH_FIELDS(FIRST, NEXT)                                                           \
  NEXT(call, Str, "progress (moving data, completions, control messages) or close (fencing and releasing a path: a failed one, the old active one of a failover or failback, one a reconnect replaces, or those of a comm being closed), or open (creating a send path and starting its connect: the verbs transport's CQ and QPs, at a retry on NCCL's thread)") \
  NEXT(us, U64, "how long the call held the thread, µs") \
  NEXT(fence_grant_wait_us, U64, "of us, the part a receive path's blocking fence (call close; RDMA, at the comm's close) waited for a grant of remote write to the path's QPs that was already running (an ibv_modify_qp; 0 when none ran, and for other calls), µs")
#define RO_EVENT_FIELDS_health_late(FIRST, NEXT)                     \
  FIRST(late_us, U64, "how late the health thread woke this round, µs") \
  NEXT(late_rounds, U64, "late rounds since the process started")     \
  NEXT(max_late_us, U64, "the latest wake-up seen so far, µs")
#define RO_EVENT_FIELDS_peer_silence(FIRST, NEXT)                   \
  FIRST(nic, Str, "local NIC name")                                 \
  NEXT(peer, Str, "peer address")                                   \
  NEXT(rails, U64, "NIC pairs to that peer, all silent")            \
  NEXT(age_us, U64, "µs since this pair's last answered probe")
#define RO_EVENT_FIELDS_pair_queued(FIRST, NEXT)                    \
  FIRST(nic, Str, "local NIC name")                                 \
  NEXT(peer, Str, "peer address")                                   \
  NEXT(rtt_us, U64, "round trip of the late answer, µs")
#define RO_EVENT_FIELDS_size_loss_ignored(FIRST, NEXT)              \
  FIRST(nic, Str, "local NIC name")                                 \
  NEXT(peer, Str, "peer address")                                   \
  NEXT(big_sent, U64, "full-size probes sent in the burst")         \
  NEXT(small_answered, U64, "small probes answered in the burst")   \
  NEXT(tcp_acked, Bool, "the peer's kernel acknowledged data during the burst")
#define RO_EVENT_FIELDS_hca_addr_change(FIRST, NEXT)                                      \
  FIRST(nic, Str, "local NIC name")                                                       \
  NEXT(hca, Str, "the HCA port behind it, e.g. \"mlx5_0 port 1\"")                         \
  NEXT(kind, Str, "gid or lid")                                                            \
  NEXT(old, Str, "previous address: \"<GID index> <GID>\" (gid) or the LID in decimal (lid)") \
  NEXT(new, Str, "the address new paths use, same form")                                  \
  NEXT(why, Str, "one line: what changed and what railover did")

namespace railover {

enum class Event : uint8_t {
#define RO_EV_ENUM(name, meaning) name,
  RAILOVER_JOURNAL_EVENTS(RO_EV_ENUM)
#undef RO_EV_ENUM
};

// Argument kinds of the emitters: each accepts exactly the C++ values that fit its JSON type
// (no bool as an integer, no pointer as a bool, no integer as a string).
namespace jarg {
struct Str {
  std::string v;
  Str(const std::string& s) : v(s) {}
  Str(const char* s) : v(s) {}
};
template <class T>
constexpr bool kInt = std::is_integral<T>::value && !std::is_same<T, bool>::value;
struct U64 {
  uint64_t v;
  template <class T, std::enable_if_t<kInt<T>, int> = 0>
  U64(T x) : v((uint64_t)x) {}
};
struct Comm {
  uint64_t v;
  template <class T, std::enable_if_t<kInt<T>, int> = 0>
  Comm(T x) : v((uint64_t)x) {}
};
struct Bool {
  bool v;
  template <class T, std::enable_if_t<std::is_same<T, bool>::value, int> = 0>
  Bool(T x) : v(x) {}
};
struct OptU64 {
  std::optional<uint64_t> v;
  OptU64(std::nullopt_t) {}
  template <class T, std::enable_if_t<kInt<T>, int> = 0>
  OptU64(T x) : v((uint64_t)x) {}
};
void put(std::string* out, const char* name, const Str& x);
void put(std::string* out, const char* name, const U64& x);
void put(std::string* out, const char* name, const Comm& x);
void put(std::string* out, const char* name, const Bool& x);
void put(std::string* out, const char* name, const OptU64& x);
}  // namespace jarg

// The declaration as data (for railover_describe_json and the tests).
struct EventFieldSpec {
  const char* name;
  const char* type;  // Str, U64, Bool, Comm, OptU64
  const char* meaning;
};
struct EventSpec {
  const char* name;
  const char* meaning;
  const EventFieldSpec* fields;
  size_t nFields;
};

namespace detail {
#define RO_EV_FSPEC(n, t, m) {#n, #t, m},
#define RO_EV_FIELDS(name, meaning) \
  inline constexpr EventFieldSpec kFields_##name[] = {RO_EVENT_FIELDS_##name(RO_EV_FSPEC, RO_EV_FSPEC)};
RAILOVER_JOURNAL_EVENTS(RO_EV_FIELDS)
#undef RO_EV_FIELDS
#undef RO_EV_FSPEC
}  // namespace detail

inline constexpr EventSpec kEvents[] = {
#define RO_EV_SPEC(name, meaning) \
  {#name, meaning, detail::kFields_##name, sizeof(detail::kFields_##name) / sizeof(detail::kFields_##name[0])},
    RAILOVER_JOURNAL_EVENTS(RO_EV_SPEC)
#undef RO_EV_SPEC
};
inline constexpr size_t kEventCount = sizeof(kEvents) / sizeof(kEvents[0]);

inline const char* eventName(Event e) { return kEvents[(size_t)e].name; }

}  // namespace railover
