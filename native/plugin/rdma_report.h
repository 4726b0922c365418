// What the RDMA transport would do on this host, for `railover doctor`: the plugin's own
// answer (its parser of the environment, its NIC discovery, verbs_config.h's port and GID
// choice through the dlopen()ed libibverbs table, rdma_transport.h's auto rule), as JSON. The
// plugin exports it as railover_rdma_report_json (abi/describe.cc). It starts no thread, does
// not call init and leaves nothing open (it opens and closes the HCAs it inspects).
//
// Shape (every key always present; "" / null / [] when it does not apply):
//   {"version": 1,
//    "built_with_verbs": bool,            // RAILOVER_HAVE_VERBS: rdma-core's headers at build time
//    "libibverbs": {"loaded": bool, "error": str},
//    "config_error": str,                 // the environment does not parse (then nothing else is evaluated)
//    "nic_error": str,                    // NIC discovery failed (no NIC list given and none selected)
//    "setting": "auto" | "tcp" | "rdma" | "rdma+tcp",  // RAILOVER_TRANSPORT
//    "transport": "rdma" | "tcp" | "rdma+tcp" | "error",  // what init would use ("rdma" with
//                                         // auto and a mix: the NICs without a port are left
//                                         // out; "rdma+tcp": setting rdma+tcp and a mix, the
//                                         // others served over TCP); "error": init fails
//    "transport_why": str,                // one line
//    "warnings": [str],                   // the WARN lines init logs about this choice
//                                         // (TransportPlan::warnings): NICs auto leaves out,
//                                         // ACTIVE RDMA ports left idle while the job runs TCP
//    "nics": [{"nic": str,
//              "choice": "chosen" | "down" | "excluded" | "failed",  // verbs::PortChoice
//                                         // down: chosen, the port not ACTIVE now (kChosenDown)
//              "why": str,                // chosen/down: how the GID was chosen (down: and the
//                                         // port's state); else why there is none
//              "hca": str, "port": int,   // the chosen HCA port ("" / 0 when none)
//              "link_layer": "Ethernet" | "InfiniBand" | "",
//              "state": str,              // ACTIVE, DOWN, INIT, ARMED, ACTIVE_DEFER, "" (none)
//              "gid_index": int,          // -1: none (InfiniBand, or no choice)
//              "gid": str,                // "" when none
//              "rate_mbps": int,          // the port's rate (verbs::portSpeedMbps), what NCCL
//                                         // is told as the device's speed; 0: unknown / down
//              "ports": [{"hca", "port", "state", "link_layer", "allowed"}],
//                                         // the ports behind the NIC (any state): RoCE ports with
//                                         // a GID bound to it, the port of an IPoIB NIC;
//                                         // allowed: NCCL_IB_HCA lets the transport use it
//              "device": "rdma" | "tcp" | "left_out" | ""}],
//                                         // what init makes of the NIC (TransportPlan): an NCCL
//                                         // device served over RDMA or TCP, left out of NCCL's
//                                         // devices (auto with a mix), "" when init fails
//    "unused_ports": [{"hca": str, "port": int, "state": str, "link_layer": str,
//                      "netdevs": [str],  // interfaces on it: RoCE GIDs' netdevs, IPoIB on IB
//                      "why": str}],      // every HCA port no evaluated NIC uses, and why (not
//                                         // selected, NCCL_IB_HCA, no IPoIB interface, ...)
//    "memory": {"ptr_support": [str],     // what getProperties advertises: "HOST", "CUDA", "DMABUF"
//               "relaxed_ordering": bool, // NCCL's buffers registered with IBV_ACCESS_RELAXED_ORDERING
//                                         // (NCCL_IB_PCI_RELAXED_ORDERING and ibv_reg_mr_iova2:
//                                         // verbs::relaxedOrderingChoice, as the transport applies it;
//                                         // false with the tcp transport or a failing init)
//               "relaxed_ordering_why": str},  // one line: the value and why
//    "gpudirect": {"nvidia_driver": bool, // /sys/module/nvidia
//                  "peermem": str,        // the file that shows a peer-memory module, "" = none
//                  "dmabuf": [{"hca": str, "supported": bool | null, "detail": str}]}}
//                                         // per chosen HCA: ibv_reg_dmabuf_mr with fd -1 answers
//                                         // EBADF-like (supported) or EOPNOTSUPP (not), as NCCL tests it
//
// Thread-safety: reentrant (it reads the environment through `env` only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "plugin/devices.h"

namespace railover {

// `nics`: the NIC names to evaluate (empty: the plugin's own discovery with `env`). The
// report's "memory.ptr_support" is what getProperties would advertise with that transport
// (TCP: HOST; RDMA: + CUDA / DMABUF where GPUDirect is detected, as RdmaTransport::ptrSupport).
std::string rdmaReportJson(const std::vector<std::string>& nics, const EnvLookup& env);

// An HCA port that none of the NICs railover runs on uses, so its RDMA goes unused: the
// report's "unused_ports" entries, and the WARN at init when RAILOVER_TRANSPORT=auto falls
// back to TCP although RDMA ports are ACTIVE (typically InfiniBand without IPoIB: railover
// runs each path over a NIC with an IP address, its bootstrap stream, so it cannot use a port
// with none; NCCL's own IB transport can).
struct UnusedRdmaPort {
  std::string hca;
  int port = 0;                      // 1-based
  std::string state;                 // ACTIVE, DOWN, ...
  std::string linkLayer;             // Ethernet | InfiniBand
  std::vector<std::string> netdevs;  // interfaces on it (RoCE: bound to its GIDs; IB: IPoIB)
  std::string why;                   // one line
};

// The HCA ports that none of `nics` (NIC names, as the plugin selected them) uses, with why.
// Empty where libibverbs does not load or the build has no verbs. Opens and closes every HCA
// (milliseconds): call at init or from the report, never on NCCL's progress thread. Reentrant.
std::vector<UnusedRdmaPort> unusedRdmaPorts(const std::vector<std::string>& nics, const IbConfig& ib);

// The init WARN's text (without the "railover: " prefix) when RAILOVER_TRANSPORT=`setting`
// runs over TCP on `nics` although some HCA port none of them uses is ACTIVE: names each such
// port, its link layer and why it is unused; "" when there is none. A port excluded by
// NCCL_IB_HCA is not named (the operator chose it). As unusedRdmaPorts.
std::string idleRdmaPortsWarning(const std::string& setting, const std::vector<std::string>& nics, const IbConfig& ib);

// What init does with RAILOVER_TRANSPORT on `nics` (as discovered, before any is left out):
// the one rule that Runtime::chooseTransport applies and the report shows, so doctor and the
// plugin cannot disagree.
//   tcp            every NIC over TCP (setting tcp; or auto / rdma+tcp and no NIC has an RDMA
//                  port, or libibverbs does not load: warnings then name any ACTIVE HCA port
//                  left idle, idleRdmaPortsWarning)
//   rdma           every NIC has an RDMA port (a chosen one that is down counts); or auto
//                  with a mix: the NICs without one are left out of NCCL's devices (leftOut,
//                  with a warning), as NCCL's own IB transport lists only RDMA devices
//   rdma+tcp       setting rdma+tcp and a mix: the NICs without a port served over TCP
//   error          setting rdma and some NIC has no usable RDMA port, or no verbs in this
//                  build; `why` is init's error
// Opens and closes every HCA (milliseconds): init or the report only, never NCCL's progress
// thread. Reentrant.
struct TransportPlan {
  std::string name;                    // "tcp" | "rdma" | "rdma+tcp" | "error"
  std::string why;                     // one line: the report's transport_why, init's INFO or error
  std::vector<std::string> rdmaNics;   // the NICs with an RDMA port (in `nics` order)
  std::vector<std::string> leftOut;    // auto with a mix: the NICs left out of NCCL's devices
  std::vector<std::string> warnings;   // the WARN lines init logs (no "railover: " prefix)
  bool rdma() const { return name == "rdma" || name == "rdma+tcp"; }
  // "rdma", "tcp", "left_out" for NIC `nic` of the plan's `nics`; "" for an error.
  std::string deviceOf(const std::string& nic) const;
};
TransportPlan planTransport(const std::vector<Nic>& nics, const Config& cfg);

}  // namespace railover
