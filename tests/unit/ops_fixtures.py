"""Builders for synthetic railover state files, journals and a fake procfs (unit tests of
railover.ops.state, railover.ops.exporter, railover.ops.drill)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional


def write_proc(proc: Path, pid: int, start: int, env: Optional[Dict[str, str]] = None) -> None:
    """A fake /proc/<pid> with a stat line whose field 22 is ``start`` (the command name has
    a space and a parenthesis, as real ones may) and, optionally, an environ."""
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 30   # fields 3 .. 52; index 19 = field 22
    (d / "stat").write_text(f"{pid} (rail over) x) " + " ".join(fields) + "\n")
    if env is not None:
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")


def path(nic: str, peer: str, state: str, primary: bool) -> Dict[str, Any]:
    return {"nic": nic, "peer": peer, "state": state, "primary": primary, "flaps": 0, "hold_down_ms": 0,
            "last_error": ""}


def comm(cid: str, dir_: str = "send", active: str = "eth0", primary: str = "eth0", failovers: int = 0,
         failbacks: int = 0, flaps: int = 0, resent: int = 0, fatal: bool = False,
         paths: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    if paths is None:
        paths = [path("eth0", "10.0.0.2", "active" if active == "eth0" else "failed", True),
                 path("eth1", "10.0.1.2", "active" if active == "eth1" else "standby", False)]
    return {"id": cid, "dir": dir_, "peer": "10.0.0.2", "active_nic": active, "primary_nic": primary, "fatal": fatal,
            "failovers": failovers, "failbacks": failbacks, "flaps": flaps, "bytes_resent": resent,
            "last_detection_us": 1500 if failovers else 0, "last_convergence_us": 2500 if failovers else 0,
            "paths": paths}


def rdma_port(hca: str, port: int = 1, active: bool = True, gid_index: int = 3, gid: str = "::ffff:10.0.0.1",
              lid: int = 0, ib: bool = False, mtu: int = 4096, why: str = "") -> Dict[str, Any]:
    """A NIC's ``rdma`` object as the plugin writes it (RoCE by default; ``ib``: InfiniBand, LID
    addressing, gid_index -1 and no GID)."""
    return {"hca": hca, "port": port, "link_layer": "InfiniBand" if ib else "Ethernet", "port_active": active,
            "gid_index": -1 if ib else gid_index, "gid": "" if ib else gid, "lid": lid if ib else 0, "mtu": mtu,
            "why": why or (f"{hca} port {port}: InfiniBand, LID {lid}" if ib else f"{hca} port {port} GID {gid_index}")}


def state(pid: int, start: int, comms: List[Dict[str, Any]], event_log: str = "", host: str = "node1",
          nic_up: Optional[Dict[str, bool]] = None, transport: Optional[str] = "tcp",
          rdma: Optional[Dict[str, Optional[Dict[str, Any]]]] = None) -> Dict[str, Any]:
    """A state file as the plugin writes it; ``transport`` None leaves the field out (a plugin
    that predates it). ``rdma``: each NIC's ``rdma`` object by NIC name (a NIC not named gets
    null, as with TCP); None leaves the field out of every NIC (a plugin that predates it)."""
    nic_up = nic_up or {}
    nics = [{"index": i, "name": n, "addr": a, "rail": i, "speed_mbps": 100000, "up": nic_up.get(n, True)}
            for i, (n, a) in enumerate((("eth0", "10.0.0.1"), ("eth1", "10.0.1.1")))]
    if rdma is not None:
        for n in nics:
            n["rdma"] = rdma.get(n["name"])
    tot = {"comms": len(comms), "failovers": sum(c["failovers"] for c in comms),
           "failbacks": sum(c["failbacks"] for c in comms), "flaps": sum(c["flaps"] for c in comms),
           "bytes_resent": sum(c["bytes_resent"] for c in comms), "fatal_errors": sum(1 for c in comms if c["fatal"])}
    out = {"version": 1, "pid": pid, "start_time": start, "host": host, "updated_us": 1000, "event_log": event_log,
            "nics": nics, "pairs": [{"nic": "eth0", "peer": "10.0.0.2", "up": nic_up.get("eth0", True), "cause": ""}],
            "comms": comms, "totals": tot}
    if transport is not None:
        out["transport"] = transport
    return out


def write_state(d: Path, st: Dict[str, Any]) -> Path:
    """Write like the plugin: temporary file, then rename."""
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"railover-{st['pid']}.json"
    tmp = d / f"railover-{st['pid']}.json.tmp"
    tmp.write_text(json.dumps(st))
    tmp.replace(p)
    return p


def append_events(path_: Path, events: List[Dict[str, Any]], partial: str = "") -> None:
    with open(path_, "a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
        f.write(partial)
