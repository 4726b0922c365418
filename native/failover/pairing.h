// Which peer NIC each local NIC of a send comm connects to (the primary and standby paths),
// and what does not match between the two hosts' rails. Pure: no I/O, no locks; the caller
// looks the subnets up (lookupSubnets) and logs the notes (SendLink::create).
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

#include "common/nic.h"
#include "transport/transport.h"

namespace railover {

// What planPaths needs of each local NIC (indexed like the process's NICs).
struct LocalNicView {
  std::string name;
  int rail = -1;
  Subnet subnet;
};

// A pairing that does not match the peer's rails, for the WARN (said once per local NIC and
// kind by the caller: the same cabling shows in every comm).
enum class PairingNote {
  kPrimaryRepaired = 0,  // NCCL's pair left the local NIC's subnet; paired on the subnet instead
  kPrimaryOffSubnet,     // NCCL's pair is on another local NIC's subnet and none on this one: kept
  kStandbyRepaired,      // the peer's NIC on this rail is not on this NIC's subnet; paired on the subnet
  kStandbySkipped,       // the peer's NIC on this rail is on another local NIC's subnet: no path
  kNoPartner,            // the peer lists no NIC on this NIC's rail or subnet: no standby path
};
constexpr int kPairingNoteKinds = 5;
// The kind's name in the journal's rail_mismatch event: "primary_repaired", "primary_off_subnet",
// "standby_repaired", "standby_skipped", "no_partner".
const char* pairingNoteName(PairingNote kind);

struct PathPlan {
  struct Pair {
    int localNic;
    int remote;  // index into the handle's addresses
  };
  std::vector<Pair> pairs;  // pairs[0]: the primary, from `dev`; then the standbys
  struct Note {
    int localNic;
    PairingNote kind;
    std::string text;  // one sentence naming the NICs, addresses and what railover does
  };
  std::vector<Note> notes;
};

// Pairs local NIC `dev` (NCCL's choice) and the candidate standby NICs `standbyNics` with the
// addresses of handle `h`, each address at most once (the receiver keys paths by it) and each
// local NIC at most once (a candidate listed twice, or `dev` among them, counts once).
// By rail, as always, where the subnets agree or are unknown. Where they show the rails do not
// match (hosts cabled or configured differently: a NIC missing, other RAILOVER_RAILS, another
// NIC order), a NIC connects to the peer's address on its own subnet when the handle has one
// (the kernel routes that one through it), and a standby whose rail partner is on another
// local NIC's subnet is not opened (its connects would only time out); each such choice is noted.
PathPlan planPaths(int dev, const std::vector<int>& standbyNics, const std::vector<LocalNicView>& nics,
                   const PeerHandle& h);

}  // namespace railover
