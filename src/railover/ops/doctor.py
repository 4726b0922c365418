"""``railover doctor``: check a host before a job and say what to fix.

Checks, each reported as OK / WARN / FAIL (FAIL = blocking: the job would not use railover,
or would run without the redundancy railover is there for):

* configuration: every variable of the plugin's parameter table (``native/common/params.h``,
  read through :mod:`railover.params`) that is set, validated by the plugin's own parser
  (``railover_check_param``); unknown ``RAILOVER_*`` names (typos); a NIC listed twice in
  ``RAILOVER_RAILS``; an empty value is the same as an unset one, as in the plugin;
* interfaces: which ones the plugin will select and why (``RAILOVER_IFNAMES`` /
  ``NCCL_SOCKET_IFNAME`` syntax: comma list of prefixes, ``^`` excludes, ``=`` exact; by
  default every interface with an address except ``lo``, ``docker*``, ``virbr*``), their
  addresses, link state (admin, carrier) and rails (``RAILOVER_RAILS`` or interface order);
  two selected NICs on one physical port (VLAN/macvlan/ipvlan beside its parent, a bond's
  port) are a WARN: failing over between them does not survive that port's fault;
  with ``RAILOVER_TRANSPORT=auto`` a selected NIC without an RDMA port, while others have one,
  is shown as not a device, as the plugin leaves it out of NCCL's devices (the RDMA report
  below says so), and the counts and per-NIC checks that follow leave it out too;
* NICs sharing an IPv4 subnet: ``arp_ignore`` (0 = ARP flux: a peer's traffic to one NIC
  may arrive on another, where railover's device-bound sockets do not take it) and
  ``arp_announce``; an interface that is not selected (a management NIC) but holds an address
  on a device's subnet counts as sharing it;
* source routing per NIC: traffic sourced from a NIC's address to a peer (or, without
  ``--peer``, to a neighbour in its subnet) should leave through that NIC; where it does not
  but a socket bound to the NIC (as railover's are) has a route through it, only strict
  ``rp_filter`` makes that blocking (it drops what arrives on the NIC);
* rails: with ``--peer`` addresses of which some are on a selected NIC's subnet, a selected
  NIC with none on its subnet, or a peer on no NIC's subnet, is a WARN (the hosts' rails do
  not match);
* reachability of each ``--peer`` address from each NIC that should reach it (TCP connect
  bound to the NIC's address and device, like the plugin's streams: an answer, even a
  refusal, proves the path);
* NCCL settings that conflict (``NCCL_NET``/``NCCL_NET_PLUGIN`` pointing elsewhere, the
  plugin not on ``LD_LIBRARY_PATH``), and which ``NCCL_IB_*`` set here railover's RDMA
  transport reads and which only tune NCCL's own IB transport;
* the RDMA transport, as the plugin itself answers it (``railover_rdma_report_json``, through
  :meth:`railover.params.Native.rdma_report`): whether libibverbs loads, per selected NIC the
  HCA port behind it, its state and link layer, the GID the plugin would choose and why (or
  why none), the transport ``RAILOVER_TRANSPORT`` would give, and GPUDirect facts (railover
  registers host memory only for now);
* the plugin loads (``dlopen`` with ``RTLD_NOW``) and which net ABI versions it exports;
* with PyTorch installed: the NCCL version it bundles, the ABI that NCCL will use, and the
  known bugs of that release;
* system programs railover's tools run (``ip``, ``nft``, ``iperf3``, ``taskset``, and
  ``cmake``/``c++`` for building): a missing one is a WARN naming its Debian package (a job
  needs none of them; the test bed, demo, bench and builds do).

The evaluation is split from the fact gathering (:func:`gather` vs :func:`diagnose`) so the
checks can be tested on synthetic hosts.
"""
from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from railover import _paths, params, prereqs
from railover.ops.state import path_kind

__all__ = ["OK", "WARN", "FAIL", "Check", "Iface", "Facts", "Report", "ifname_matches", "validate_config",
           "select_interfaces", "nccl_abi", "plugin_exports", "torch_nccl", "list_interfaces", "route_get",
           "tcp_probe", "gather", "diagnose", "known_vars", "unknown_var_checks", "duplicate_rail_checks", "effective_env", "rdma_report", "rdma_checks",
           "rdma_fates", "LEFT_OUT", "OVER_TCP", "nic_sysctls"]

OK, WARN, FAIL, INFO = "OK", "WARN", "FAIL", "INFO"

MAX_NICS = 16
#: Probe interval x multiplier below which doctor warns (ms): on a loaded host (many ranks per
#: node, CPU-bound data loaders) probe answers are delayed by tens of ms, see docs/OPERATIONS.md.
MIN_DETECTION_MS = 50
DEFAULT_EXCLUDED = ("lo", "docker", "virbr")  # "lo" exact, the others prefixes


@dataclass
class Check:
    """One finding. ``status``: OK, WARN, FAIL (blocking) or INFO; ``what`` the subject
    (a NIC, a variable...); ``detail`` what was seen; ``fix`` what to do (empty when OK)."""

    section: str
    what: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Iface:
    """A network interface as the plugin sees it: ``addrs`` are ``addr/prefixlen`` strings
    (IPv4 and global IPv6, link-local excluded), ``admin_up`` (IFF_UP), ``carrier``,
    ``operstate`` (``UP``, ``DOWN``, ``LOWERLAYERDOWN``, ``UNKNOWN``...), ``speed_mbps``
    (None when unknown), ``ports`` (the physical interfaces beneath it)."""

    name: str
    index: int
    addrs: List[str] = field(default_factory=list)
    admin_up: bool = True
    carrier: bool = True
    operstate: str = "UP"
    speed_mbps: Optional[int] = None
    #: the interfaces at the bottom of this one's stack, by name (itself when it has none below
    #: it): a VLAN, macvlan or ipvlan interface's parent's, a bond's or team's ports'
    ports: List[str] = field(default_factory=list)
    #: the VRF (l3mdev) it is enslaved to, by name (None: none): its routes are the VRF's
    vrf: Optional[str] = None
    #: it resolves neighbours with ARP on a shared link (IFF_NOARP, IFF_POINTOPOINT and
    #: IFF_LOOPBACK clear: not a dummy, tunnel, WireGuard or loopback interface)
    arp: bool = True

    def addr(self, family: int = 0) -> Optional[str]:
        """The address the plugin uses: the first IPv4 one (unless ``family`` is AF_INET6),
        else the first IPv6 one, without prefix length; None when it has none."""
        order = [socket.AF_INET6] if family == socket.AF_INET6 else ([socket.AF_INET] if family == socket.AF_INET
                                                                    else [socket.AF_INET, socket.AF_INET6])
        for fam in order:
            for a in self.addrs:
                ip = ipaddress.ip_interface(a)
                if (ip.version == 4) == (fam == socket.AF_INET):
                    return str(ip.ip)
        return None

    def network_of(self, addr: str) -> Optional[ipaddress._BaseNetwork]:
        for a in self.addrs:
            ip = ipaddress.ip_interface(a)
            if str(ip.ip) == addr:
                return ip.network
        return None


@dataclass
class Facts:
    """What :func:`gather` observed, the input of :func:`diagnose`. ``plugin``: dict with
    ``path``, ``loaded`` (bool), ``error``, ``abi`` (exported net ABI versions, ints),
    ``collnet``, ``foreign`` (tuner/profiler symbols that NCCL would also pick up),
    ``native_dir_error`` (True when not found because ``RAILOVER_NATIVE_DIR`` is unusable);
    ``torch``: dict with ``torch`` (version), ``nccl`` (``[major, minor, patch]``) or
    ``error``, ``{"skipped": True}`` when not asked (``gather(check_torch=False)``), or None
    when PyTorch is not installed; ``ld_resolve``: the file NCCL's
    ``dlopen("libnccl-net-railover.so")`` would open given LD_LIBRARY_PATH (None if none)."""

    env: Dict[str, str]
    ifaces: List[Iface]
    plugin: Dict[str, Any]
    torch: Optional[Dict[str, Any]] = None
    ld_resolve: Optional[str] = None
    tools: Optional[Dict[str, Optional[str]]] = None  # program -> path or None (railover.prereqs)
    tools_off_path: Optional[Dict[str, str]] = None  # missing program -> where it is, off PATH (prereqs.found_off_path)
    #: the plugin's RDMA report (:func:`rdma_report`; shape ``native/plugin/rdma_report.h``), or
    #: ``{"error": why}`` when it could not be asked; None: not gathered (no RDMA section)
    rdma: Optional[Dict[str, Any]] = None
    #: per interface (lo aside: the selected NICs and the others, which may share a subnet with
    #: them), the kernel's effective IPv4 settings that decide whether a NIC sharing
    #: an IPv4 subnet with another one sends and receives its own traffic (:func:`nic_sysctls`):
    #: ``arp_ignore``, ``arp_announce``, ``rp_filter``; None: not gathered (no such checks)
    sysctls: Optional[Dict[str, Dict[str, int]]] = None


@dataclass
class Report:
    """The doctor's result: ``checks``; ``nics`` (one row per interface: selected (a device of
    NCCL: False for a NIC the RDMA transport leaves out, :func:`rdma_fates`), reason, address,
    state, rail); ``rdma``: the plugin's RDMA report (None when not gathered);
    ``ok`` is False when any check FAILed."""

    checks: List[Check]
    nics: List[Dict[str, Any]]
    rdma: Optional[Dict[str, Any]] = None

    @property
    def ok(self) -> bool:
        return not any(c.status == FAIL for c in self.checks)

    def to_json(self) -> Dict[str, Any]:
        return {"ok": self.ok, "nics": self.nics, "rdma": self.rdma, "checks": [asdict(c) for c in self.checks]}


# --------------------------------------------------------------------------- configuration

def _uint(s: str, lo: int, hi: int) -> Optional[int]:
    if not s or not s.isdigit() or not s.isascii():
        return None
    v = int(s)
    return v if lo <= v <= hi else None


def _split(s: str, sep: str) -> List[str]:
    return [p.strip(" \t") for p in s.split(sep)]


def _blank(v: str) -> bool:
    return not v.strip(" \t")


def effective_env(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` without the variables set to an empty or blank value: railover treats those as
    unset (the rule of the parameter table, for every variable)."""
    return {k: v for k, v in env.items() if not _blank(v)}


def known_vars(table: Optional[Sequence[Mapping[str, Any]]] = None) -> set:
    """Names of every variable railover reads (the plugin's parameter table)."""
    return {p["name"] for p in (table if table is not None else params.params())}


def ifname_matches(spec: str, name: str) -> bool:
    """Whether interface ``name`` is selected by ``spec`` (NCCL_SOCKET_IFNAME syntax: a comma
    list of prefixes; a leading ``^`` excludes the listed ones, a leading ``=`` (after the
    optional ``^``) makes them exact names); blanks around an item are no part of it. Same
    rule as the plugin's ``ifnameMatches``."""
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    hit = any(item and (name == item if exact else name.startswith(item)) for item in _split(spec, ","))
    return not hit if exclude else hit


def validate_config(env: Mapping[str, str], native: Optional[params.Native] = None) -> List[Check]:
    """Validate the variables of the plugin's parameter table that ``env`` sets, with the
    plugin's own parser (``native``: a loaded :class:`railover.params.Native`, default the
    installed plugin). One FAIL per bad variable, naming it and the accepted values (the plugin
    stops at the first; doctor reports all), a WARN per unknown ``RAILOVER_*`` name, per NIC
    listed twice in ``RAILOVER_RAILS`` and for risky combinations, OK for each valid one that is set. When the plugin cannot be loaded,
    one WARN says the configuration was not checked."""
    out: List[Check] = []
    try:
        native = native or params.load()
    except OSError as e:
        return [Check("config", "parameter table", WARN, f"configuration not checked: cannot load the plugin's "
                      f"parameter table ({e})", "build or install railover (the plugin check below says more)")]
    table = native.describe["params"]
    defaults = {p["name"]: p.get("default_value") for p in table}

    def good(var: str, note: str = "") -> None:
        out.append(Check("config", var, OK, f"{var}='{env[var]}'" + (f" ({note})" if note else "")))

    values: Dict[str, int] = {}
    refused = params.refused(env, native)
    for p in table:
        var = p["name"]
        if var not in env or "plugin" not in p["readers"]:
            continue
        v = env[var]
        if _blank(v):
            good(var, f"empty: the same as unset, the default ({p['default']}) applies")
            continue
        err = refused.get(var)
        if err:
            out.append(Check("config", var, FAIL, err, f"fix or unset {var} (NCCL init fails with this value)"))
            continue
        if p["type"] == "uint":
            values[var] = int(v)
        if var in ("RAILOVER_IFNAMES", "NCCL_SOCKET_IFNAME"):
            used = var == "RAILOVER_IFNAMES" or _blank(env.get("RAILOVER_IFNAMES", ""))
            good(var, "used by railover" if used else
                 "ignored by railover (RAILOVER_IFNAMES wins); NCCL's bootstrap still uses it")
        elif var == "RAILOVER_RAILS" and (dups := duplicate_rail_checks(env)):
            out += dups
        elif var == "RAILOVER_STANDBY" and v.strip(" \t") == "none":
            out.append(Check("config", var, WARN, f"{var}='{v}' (no standby paths: failover disabled)",
                             "unset RAILOVER_STANDBY (or 'all') to have standby paths"))
        elif var == "RAILOVER_STATE_DIR" and v.strip(" \t") == "off":
            good(var, "no state file: railover status and the exporter will not see this job")
        elif var in ("RAILOVER_STATE_DIR", "RAILOVER_EVENT_LOG") and not os.path.isabs(v.strip(" \t")):
            out.append(Check("config", var, WARN, f"{var}='{v}' is a relative path: each rank resolves it against its "
                             "own working directory, so the files land wherever the job was started from, and "
                             "railover status and the exporter look elsewhere",
                             f"give {var} an absolute path"))
        elif var == "RAILOVER_STATE_DIR":
            problem = state_dir_problem(Path(v))
            if problem:
                out.append(Check("config", var, WARN, f"{var}='{v}': {problem[0]}; the job writes no state file "
                                 "(railover status and the exporter will not see it)", problem[1]))
            else:
                good(var)
        elif var == "RAILOVER_EVENT_LOG":
            path = Path(v.replace("%p", str(os.getpid())))
            is_dir = path_kind(path)[0] == "dir"
            d = path if is_dir else path.parent
            d_kind, why = path_kind(d)
            if d_kind == "unreachable":
                out.append(Check("config", var, WARN, f"{var}='{v}': {d} cannot be looked at ({why}); the job "
                                 "writes no journal if it cannot reach it either",
                                 f"make the directories above {d} searchable for the job's user, or change {var}"))
            elif v.endswith("/") and not is_dir:
                # "dir/" is a directory to the plugin (open() of it fails): it does not create one
                out.append(Check("config", var, WARN, f"{var}='{v}' names a directory, {path}, that does not exist: "
                                 "the plugin does not create it, and the job writes no journal",
                                 f"create {path} writable for the job's user, or change {var}"))
            elif d_kind != "dir" or not os.access(d, os.W_OK):
                out.append(Check("config", var, WARN, f"{var}='{v}': {d} is not a writable directory",
                                 f"create {d} writable for the job's user, or change {var}"))
            else:
                good(var)
        else:
            good(var)
    for var, err in refused.items():  # a rule between variables that names none of them
        if var not in defaults:
            out.append(Check("config", var, FAIL, err, "fix the variables it names (NCCL init fails with them)"))
    hd = values.get("RAILOVER_HOLD_DOWN_MS", defaults["RAILOVER_HOLD_DOWN_MS"])
    hdm = values.get("RAILOVER_HOLD_DOWN_MAX_MS")
    if hdm is not None and hdm < hd:
        out.append(Check("config", "RAILOVER_HOLD_DOWN_MAX_MS", WARN,
                         f"RAILOVER_HOLD_DOWN_MAX_MS={hdm} < RAILOVER_HOLD_DOWN_MS={hd}: the plugin raises it to {hd}",
                         "set RAILOVER_HOLD_DOWN_MAX_MS >= RAILOVER_HOLD_DOWN_MS"))
    di, dm = defaults["RAILOVER_PROBE_INTERVAL_MS"], defaults["RAILOVER_PROBE_MULT"]
    pi, pm = values.get("RAILOVER_PROBE_INTERVAL_MS", di), values.get("RAILOVER_PROBE_MULT", dm)
    if pi * pm < MIN_DETECTION_MS:
        out.append(Check("config", "RAILOVER_PROBE_INTERVAL_MS", WARN,
                         f"probe detection time {pi} ms x {pm} = {pi * pm} ms is very short: scheduling hiccups "
                         "on a busy host can declare healthy NIC pairs down",
                         f"keep RAILOVER_PROBE_INTERVAL_MS x RAILOVER_PROBE_MULT >= {MIN_DETECTION_MS} ms "
                         f"(default {di * dm} ms)"))
    out += unknown_var_checks(env, known_vars(table))
    return out


def duplicate_rail_checks(env: Mapping[str, str]) -> List[Check]:
    """One WARN per NIC that ``RAILOVER_RAILS`` lists more than once (a typo, e.g.
    ``eth0=0,eth0=1`` meant for eth1), naming the NIC, its entries and the rail the plugin
    uses (the last entry's; the other NIC then keeps its interface-order rail). Shared by
    doctor and ``railover launch``."""
    entries: Dict[str, List[str]] = {}
    for name, rail in _split_rails(env):
        entries.setdefault(name, []).append(rail)
    return [Check("config", "RAILOVER_RAILS", WARN,
                  f"RAILOVER_RAILS lists {name} {len(rails)} times ({', '.join(f'{name}={r}' for r in rails)}): "
                  f"the plugin uses the last, rail {rails[-1]}",
                  f"list {name} once in RAILOVER_RAILS (is one of them another NIC?)")
            for name, rails in entries.items() if len(rails) > 1]


def state_dir_problem(path: Path) -> Optional[Tuple[str, str]]:
    """``(what, fix)`` when the plugin could not use ``path`` as ``RAILOVER_STATE_DIR``, by its
    rule (telemetry/state.cc makeDir: an existing writable directory, or one ``mkdir`` creates,
    without its parents); None when it can. Whether ``mkdir`` would succeed is tried (a
    directory made and removed at once in the parent): as root, ``os.access`` says yes where
    mkdir fails (``/proc``, a read-only bind mount's own rules)."""
    kind, why = path_kind(path)
    if kind == "unreachable":
        return (f"{path} cannot be looked at ({why})",
                "make the directories above it searchable for the job's user, or change RAILOVER_STATE_DIR")
    if kind != "missing" or os.path.islink(path):
        if kind != "dir":
            return (f"{path} exists and is not a directory", "point RAILOVER_STATE_DIR at a directory")
        if not os.access(path, os.W_OK):
            return (f"{path} is not writable", f"make {path} writable for the job's user, or change RAILOVER_STATE_DIR")
        return None
    parent = path.parent
    if path_kind(parent)[0] != "dir":
        return (f"{parent} does not exist (the plugin creates {path.name} in it, not its parents)",
                f"create {parent} writable for the job's user, or change RAILOVER_STATE_DIR")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".railover-doctor-", dir=parent))
    except OSError as e:
        return (f"the plugin cannot create {path}: {e.strerror or e}",
                f"make {parent} writable for the job's user, or change RAILOVER_STATE_DIR")
    return None


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions of one character)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        diag, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            diag, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diag + (ca != cb))
    return row[-1]


def close_var(var: str, names: Collection[str]) -> Optional[str]:
    """The known ``RAILOVER_*`` name ``var`` was probably meant to be, or None; the plugin's rule
    (config.cc unknownVarWarnings), so its init and doctor suggest the same. Over the part after
    ``RAILOVER_`` (the shared prefix would make any two names look alike): the shortest known
    name it is the start of (a unit left off: ``RAILOVER_HOLD_DOWN_MAX``), else the nearest by
    edit distance if that is at most a fifth of the longer of the two (a letter or an underscore
    dropped, swapped or added: ``RAILOVER_HOLDDOWN_MS``); ties go to the first alphabetically."""
    pre = "RAILOVER_"
    tail = var[len(pre):]
    tails = sorted(n for n in names if n.startswith(pre))
    longer = [n for n in tails if tail and n[len(pre):].startswith(tail)]
    if longer:
        return min(longer, key=lambda n: (len(n), n))
    scored = [(_edit_distance(tail, n[len(pre):]), n) for n in tails]
    near = [(d, n) for d, n in scored if d * 5 <= max(len(tail), len(n) - len(pre))]
    return min(near)[1] if near else None


def unknown_var_checks(env: Mapping[str, str], names: Optional[set] = None) -> List[Check]:
    """One WARN per ``RAILOVER_*`` name in ``env`` that railover does not read (a typo: the
    plugin would ignore it silently). ``names``: the known variables (default
    :func:`known_vars`). Shared by doctor and ``railover launch``."""
    names = known_vars() if names is None else names

    def check(var: str) -> Check:
        name = close_var(var, names)
        if name:
            return Check("config", var, WARN, f"{var} is not a railover variable (did you mean {name}?); it is ignored",
                         f"rename it to {name}, or see `railover env --list`")
        return Check("config", var, WARN, f"{var} is not a railover variable (typo?); it is ignored",
                     "see `railover env --list` or the configuration table in README.md")

    return [check(var) for var in sorted(env) if var.startswith("RAILOVER_") and var not in names]


def socket_family(env: Mapping[str, str]) -> int:
    """The address family ``NCCL_SOCKET_FAMILY`` makes the plugin use: AF_INET, AF_INET6, or 0
    (any: unset, blank or refused). Blanks around the value are ignored, as the plugin ignores
    them."""
    return {"AF_INET": socket.AF_INET, "AF_INET6": socket.AF_INET6}.get(
        env.get("NCCL_SOCKET_FAMILY", "").strip(" \t"), 0)


def select_interfaces(env: Mapping[str, str], ifaces: Sequence[Iface]) -> Tuple[List[Iface], Dict[str, str], str]:
    """Reproduce the plugin's NIC discovery: ``(selected, reasons, source)`` where
    ``selected`` are in the plugin's order (by ifindex, at most 16), ``reasons`` maps every
    interface name to why it is or is not selected, ``source`` names the variable used
    (``RAILOVER_IFNAMES``, ``NCCL_SOCKET_IFNAME`` or ``default``). Empty values count as unset."""
    env = effective_env(env)
    fam = socket_family(env)
    var = "RAILOVER_IFNAMES" if "RAILOVER_IFNAMES" in env else ("NCCL_SOCKET_IFNAME" if "NCCL_SOCKET_IFNAME" in env else "")
    reasons: Dict[str, str] = {}
    cands = []
    for i in sorted(ifaces, key=lambda x: x.index):
        if i.addr(fam) is None:
            fam_s = {socket.AF_INET: "IPv4 ", socket.AF_INET6: "IPv6 "}.get(fam, "")
            reasons[i.name] = f"no {fam_s}address: the plugin does not see it"
            continue
        cands.append(i)
    chosen: List[Iface] = []
    if var:
        spec = env[var]
        for i in cands:
            if ifname_matches(spec, i.name):
                chosen.append(i)
                reasons[i.name] = f"selected by {var}='{spec}'"
            else:
                reasons[i.name] = f"{'excluded' if spec.startswith('^') else 'not matched'} by {var}='{spec}'"
    else:
        for i in cands:
            if i.name == "lo" or i.name.startswith("docker") or i.name.startswith("virbr"):
                reasons[i.name] = "excluded by default (lo, docker*, virbr*)"
            else:
                chosen.append(i)
                reasons[i.name] = "selected (default: every interface with an address except lo, docker*, virbr*)"
        if not chosen:
            chosen = [i for i in cands if i.name == "lo"]
            for i in chosen:
                reasons[i.name] = "selected: no other interface has an address"
    for i in chosen[MAX_NICS:]:
        reasons[i.name] = f"dropped: the plugin uses at most {MAX_NICS} NICs"
    return chosen[:MAX_NICS], reasons, var or "default"


def rails_of(env: Mapping[str, str], selected: Sequence[Iface]) -> Dict[str, int]:
    """Rail of each selected NIC: its ``RAILOVER_RAILS`` entry, else its position among
    ``selected``. Pass every selected NIC, also those the RDMA transport leaves out
    (:func:`rdma_fates`): the plugin numbers rails at discovery, before it leaves any out, and
    the NICs it keeps keep their rail; drop the left-out ones from the result."""
    env = effective_env(env)
    rails = {i.name: n for n, i in enumerate(selected)}
    for item in _split(env.get("RAILOVER_RAILS", ""), ","):
        kv = _split(item, "=")
        if len(kv) == 2 and kv[0] in rails and _uint(kv[1], 0, 32767) is not None:
            rails[kv[0]] = int(kv[1])
    return rails


# --------------------------------------------------------------------------- NCCL / plugin / torch

#: Newest NCCL release (major, minor) whose net-plugin ABI is known: 2.31.2 and 2.32.3 are
#: released and, like 2.30, look for ncclNetPlugin_v12 first. Later releases: v12 expected.
NEWEST_KNOWN_NCCL = (2, 32)


def nccl_abi(version: Sequence[int]) -> Optional[int]:
    """Net-plugin ABI version NCCL ``(major, minor, ...)`` looks for first: 2.19 v7,
    2.20-2.23 v8, 2.24-2.25 v9, 2.26-2.27 v10, 2.28-2.29 v11, 2.30-2.32 v12 (later than
    :data:`NEWEST_KNOWN_NCCL` is an expectation, not verified). None for releases before 2.19
    (unsupported)."""
    major, minor = int(version[0]), int(version[1])
    if major != 2:
        return 12 if major > 2 else None
    if minor < 19:
        return None
    for hi, abi in ((19, 7), (23, 8), (25, 9), (27, 10), (29, 11)):
        if minor <= hi:
            return abi
    return 12


def parse_nccl_version(v: Any) -> Optional[List[int]]:
    """``torch.cuda.nccl.version()`` as ``[major, minor, patch]``: accepts a tuple/list or the
    old integer code (``major*10000 + minor*100 + patch`` since 2.9, ``*1000`` before)."""
    if isinstance(v, (list, tuple)) and len(v) >= 2:
        return [int(x) for x in v[:3]] + [0] * (3 - len(v[:3]))
    if isinstance(v, int):
        if v >= 20900:
            return [v // 10000, (v // 100) % 100, v % 100]
        return [v // 1000, (v // 100) % 10, v % 100]
    return None


def plugin_exports(path: Path) -> Dict[str, Any]:
    """dlopen the plugin like NCCL does (``RTLD_NOW | RTLD_LOCAL``) and look up its symbols.
    Returns ``{"path", "loaded", "error", "abi": [versions of ncclNetPlugin_vN], "collnet":
    [...], "foreign": [tuner/profiler symbol names], "railover": whether it is a railover build
    (it exports ``railover_describe_json``)}``, and ``"absent": "missing"`` or ``"directory"``
    when there is no file to load; never raises."""
    out: Dict[str, Any] = {"path": str(path), "loaded": False, "error": "", "abi": [], "collnet": [], "foreign": [],
                           "railover": False}
    kind, why = path_kind(Path(path))
    if kind != "file":  # missing, a directory, or a path this user cannot reach
        out["absent"] = "directory" if kind == "dir" else "missing"
        out["error"] = {"dir": "a directory, not the plugin file", "missing": "no such file"}.get(
            kind, f"cannot be looked at ({why})")
        return out
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        out["error"] = str(e)
        return out
    out["loaded"] = True

    def has(sym: str) -> bool:
        try:
            ctypes.c_void_p.in_dll(lib, sym)
            return True
        except ValueError:
            return False

    out["abi"] = [v for v in range(1, 21) if has(f"ncclNetPlugin_v{v}")]
    out["collnet"] = [v for v in range(1, 21) if has(f"ncclCollNetPlugin_v{v}")]
    out["foreign"] = [s for s in [f"ncclTunerPlugin_v{v}" for v in range(1, 8)] +
                      [f"ncclProfiler_v{v}" for v in range(1, 8)] if has(s)]
    out["railover"] = hasattr(lib, "railover_describe_json")
    return out


def torch_nccl(python: str = sys.executable, timeout_s: float = 60.0) -> Optional[Dict[str, Any]]:
    """PyTorch's version and the NCCL it bundles, asked in a child interpreter (importing
    torch is slow and loads CUDA libraries; a crash there must not take doctor down).
    Returns None when torch is not installed, else ``{"torch", "cuda", "nccl": [M, m, p] or
    None, "error"}``."""
    code = ("import json\ntry:\n import torch\nexcept ImportError:\n print(json.dumps(None)); raise SystemExit\n"
            "r={'torch':torch.__version__,'cuda':torch.version.cuda,'nccl':None,'error':''}\n"
            "try:\n v=torch.cuda.nccl.version(); r['nccl']=list(v) if isinstance(v,(tuple,list)) else v\n"
            "except Exception as e:\n r['error']='%s: %s'%(type(e).__name__,e)\n"
            "print(json.dumps(r))\n")
    try:
        cp = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"torch": "?", "cuda": None, "nccl": None, "error": f"could not ask PyTorch: {e}"}
    try:
        r = json.loads(cp.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"torch": "?", "cuda": None, "nccl": None, "error": f"importing torch failed: {cp.stderr.strip()[-300:]}"}
    if r is not None and r.get("nccl") is not None:
        r["nccl"] = parse_nccl_version(r["nccl"])
    return r


def _ld_path_export(d: Path) -> str:
    """The shell line that puts ``d`` first on LD_LIBRARY_PATH, ``d`` quoted for the shell (a
    directory with a blank broke the pasted line; found by a fresh-user trial)."""
    return f"export LD_LIBRARY_PATH={shlex.quote(str(d))}:$LD_LIBRARY_PATH"


def _other_build_checks(item: str, what: str, path: str, checked: str, name: str, fix: str = "") -> List[Check]:
    """The file NCCL will open (``path``, described as ``what``) when it is not the one doctor
    checked (``checked``; "" when none could be): a FAIL when it does not load as a railover
    plugin (NCCL would fail at init with NCCL_NET=railover, or fall back without it; ``railover
    launch`` refuses it too), else a WARN that it is another railover build. [] when it is the
    checked file or no file was checked."""
    if not checked or os.path.realpath(path) == os.path.realpath(checked):
        return []
    try:
        params.load(Path(path))
    except OSError as e:
        return [Check("nccl", item, FAIL, f"{what}, which is not a loadable railover plugin ({e})",
                      fix or f"export NCCL_NET_PLUGIN={name}")]
    return [Check("nccl", item, WARN, f"{what} (not the checked file {checked}: another railover build)",
                  fix or f"export NCCL_NET_PLUGIN={name}")]


#: NCCL's own transports: always there after the plugins NCCL_NET_PLUGIN lists (not plugins).
NCCL_BUILTIN_NETS = ("ib", "socket")

#: How many entries of an ``NCCL_NET_PLUGIN`` list NCCL reads (2.27.3 to 2.30.7,
#: src/plugin/net.cc): its table holds NCCL_NET_MAX_PLUGINS (16) networks, 2 of them its own IB
#: and Socket transports, so the entries after the 14th are dropped (an INFO line says so).
NCCL_PLUGIN_LIST_MAX = 14
#: The longest ``NCCL_NET_PLUGIN`` entry NCCL reads (its MAX_STR_LEN, 255, less the NUL): a
#: longer one is dropped (2.27+; it takes no place in the list), older releases cut the value there.
NCCL_PLUGIN_NAME_MAX = 254


def _plugin_words(value: str) -> List[str]:
    """Every entry of ``NCCL_NET_PLUGIN=value`` (split at ``,``, empty ones skipped, blanks
    kept), before NCCL's limits; ``none`` (any case, the whole value) lists none."""
    return [] if value.lower() == "none" else [p for p in value.split(",") if p]


def plugin_entries(value: str) -> List[str]:
    """The plugins ``NCCL_NET_PLUGIN=value`` lists, as NCCL 2.27 and later read it: entries
    separated by ``,``, empty ones skipped, blanks kept (NCCL does not trim them: ``" ib"`` is
    looked up as the file `` ib`` and ``libnccl-net- ib.so``), an entry longer than
    :data:`NCCL_PLUGIN_NAME_MAX` dropped, and only the first :data:`NCCL_PLUGIN_LIST_MAX` of the
    rest kept. ``none`` (any case) lists none: 2.28+ read it so; 2.27 and older look for a plugin
    file ``none`` (``libnccl-net-none.so``), which loads none either, unless such a file exists.
    Releases before 2.27 take the whole value as one name."""
    return [p for p in _plugin_words(value) if len(p) <= NCCL_PLUGIN_NAME_MAX][:NCCL_PLUGIN_LIST_MAX]


def is_railover_entry(entry: str) -> bool:
    """Whether one ``NCCL_NET_PLUGIN`` entry opens a railover build: ``railover``, its file
    name, or a path to that file, with no blank around it (NCCL would not find the file)."""
    return entry == entry.strip() and (entry in (_paths.PLUGIN_NAME, _paths.PLUGIN_FILE)
                                       or ("/" in entry and Path(entry).name == _paths.PLUGIN_FILE))


def plugin_list_problem(value: str) -> Optional[str]:
    """Why ``NCCL_NET_PLUGIN=value`` (set, not empty) opens no railover build, in words, or
    None when an entry of it does (:func:`plugin_entries`, :func:`is_railover_entry`)."""
    entries = plugin_entries(value)
    if any(is_railover_entry(p) for p in entries):
        return None
    words = _plugin_words(value)
    ours = [k for k, p in enumerate(words) if is_railover_entry(p)]
    if ours and len(words[ours[0]]) > NCCL_PLUGIN_NAME_MAX:
        return (f"NCCL_NET_PLUGIN: its railover entry is {len(words[ours[0]])} characters long; NCCL reads at most "
                f"{NCCL_PLUGIN_NAME_MAX} (2.27+ drop a longer entry, older releases cut the value there), so it "
                "opens no railover plugin")
    if ours:
        return (f"NCCL_NET_PLUGIN lists {len(words)} plugins and railover is entry {ours[0] + 1}: NCCL reads only "
                f"the first {NCCL_PLUGIN_LIST_MAX} (its table of {NCCL_PLUGIN_LIST_MAX + 2} networks keeps 2 for its "
                "own IB and Socket transports) and drops the rest, so it opens no railover plugin (older releases "
                "take the whole value as one name)")
    padded = [p for p in entries if is_railover_entry(p.strip())]
    if padded:
        return (f"NCCL_NET_PLUGIN='{value}': NCCL does not trim blanks around its entries, so '{padded[0]}' "
                f"opens no plugin (NCCL looks for the file '{padded[0]}', then 'libnccl-net-{padded[0]}.so')")
    if not words:
        return (f"NCCL_NET_PLUGIN='{value}' loads no network plugin, not railover (NCCL 2.28+ read 'none' as no "
                "plugin; older releases look for a plugin file of that name)")
    if len(words) > 1:
        return (f"NCCL_NET_PLUGIN='{value}' lists no railover plugin (entries: {', '.join(words)}), so "
                f"NCCL_NET={_paths.PLUGIN_NAME} finds none")
    return f"NCCL_NET_PLUGIN={value} selects another plugin"


def plugin_list_note(value: str) -> Optional[str]:
    """For ``NCCL_NET_PLUGIN=value`` listing railover among other entries: what NCCL makes of
    the list (None for one entry)."""
    entries = plugin_entries(value)
    if len(entries) < 2:
        return None
    builtin = [p for p in entries if p.strip().lower() in NCCL_BUILTIN_NETS]
    return (f"NCCL_NET_PLUGIN='{value}' lists several plugins: NCCL 2.27+ opens each in turn and, with "
            f"NCCL_NET={_paths.PLUGIN_NAME}, uses railover alone; older NCCL takes the whole value as one plugin "
            f"name and fails at init (NCCL_NET_PLUGIN={_paths.PLUGIN_NAME} works with every release)"
            + (f"; {', '.join(repr(p) for p in builtin)}: no plugin (NCCL's IB and Socket transports are built in; "
               f"NCCL looks for libnccl-net-{builtin[0].strip()}.so)" if builtin else ""))


def ld_resolve(env: Mapping[str, str], fname: str = _paths.PLUGIN_FILE) -> Optional[str]:
    """Where ``dlopen(fname)`` would find the file in a process started with ``env``:
    the first ``LD_LIBRARY_PATH`` entry holding it, else the ldconfig cache; None if nowhere."""
    for d in env.get("LD_LIBRARY_PATH", "").split(":"):
        if d and path_kind(Path(d) / fname)[0] == "file":  # an entry this user cannot search: skipped, as ld.so does
            return str(Path(d) / fname)
    try:
        cp = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10)
        for line in cp.stdout.splitlines():
            if line.strip().startswith(fname + " ") and "=>" in line:
                return line.split("=>", 1)[1].strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return None


def ref_count_keeps_plugin(value: Optional[str]) -> bool:
    """Whether ``NCCL_NET_PLUGIN_REF_COUNT=value`` works around NCCL 2.28/2.29's reload bug:
    NCCL starts the plugin's reference count at this value, adds one per communicator and
    unloads the plugin when a destroyed one brings the count to 0, so any count >= 1 keeps it
    loaded (1 is what railover sets). Unset, 0, negative or not a number: it does not. The
    value is read as NCCL reads it: ``strtoll(value, NULL, 0)`` (leading blanks skipped, 0x hex,
    a leading 0 octal, the rest of the text ignored; out of range: NCCL's default, 0) stored
    in a C ``int`` (so "08" is 0 and 4294967296 is 0)."""
    m = re.match(r"([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", (value or "").lstrip(" \t\n\v\f\r"))
    if not m:
        return False  # no number: strtoll gives 0
    digits = m.group(2)
    n = int(digits, 16 if digits[:2].lower() == "0x" else 8 if digits.startswith("0") else 10)
    n = -n if m.group(1) == "-" else n
    if not -2 ** 63 <= n < 2 ** 63:
        return False  # ERANGE: NCCL keeps its default, 0
    return (n + 2 ** 31) % 2 ** 32 - 2 ** 31 >= 1  # the int NCCL counts with


def nccl_checks(env: Mapping[str, str], plugin: Mapping[str, Any], torch: Optional[Mapping[str, Any]],
                resolved: Optional[str]) -> List[Check]:
    """NCCL variables, plugin file, exported ABIs, PyTorch's NCCL and its known bugs."""
    out: List[Check] = []
    name = _paths.PLUGIN_NAME
    nver = torch.get("nccl") if torch else None
    abi = nccl_abi(nver) if nver else None

    # the plugin file itself
    if not plugin.get("path"):
        out.append(Check("plugin", _paths.PLUGIN_FILE, FAIL, plugin.get("error") or "plugin not found",
                         "fix or unset RAILOVER_NATIVE_DIR" if plugin.get("native_dir_error") else
                         "install it from the source tree: ./scripts/install.sh (or pip install .)"))
    elif plugin.get("absent") == "missing":
        out.append(Check("plugin", plugin["path"], FAIL, "no such file",
                         f"give the path of a built plugin ({_paths.PLUGIN_FILE}), or leave --plugin out to check the "
                         "installed one"))
    elif plugin.get("absent") == "directory":
        out.append(Check("plugin", plugin["path"], FAIL, "a directory, not the plugin file",
                         f"give the file: {Path(plugin['path']) / _paths.PLUGIN_FILE}"))
    elif not plugin.get("loaded"):
        out.append(Check("plugin", plugin["path"], FAIL, f"dlopen failed: {plugin.get('error')}",
                         "check 'ldd' on the file for missing libraries and the glibc version"))
    else:
        abis = plugin.get("abi", [])
        foreign_build = abis and plugin.get("railover") is False  # absent: a caller's own summary, not checked
        out.append(Check("plugin", plugin["path"], OK if abis and not foreign_build else FAIL,
                         f"loads; exports net ABI {', '.join('v%d' % v for v in abis) or 'none'}"
                         + ("; but it is not a railover build (no railover_describe_json): NCCL would run it "
                            "without railover's failover" if foreign_build else ""),
                         "" if abis and not foreign_build else "the file is not a railover plugin build"))
        if plugin.get("foreign"):
            out.append(Check("plugin", "symbols", WARN, f"also exports {', '.join(plugin['foreign'])}: NCCL would use "
                             "them as tuner/profiler plugins", "rebuild with hidden visibility"))
        if abi is not None and abi not in abis:
            out.append(Check("plugin", "ABI", FAIL, f"NCCL {'.'.join(map(str, nver))} looks for ncclNetPlugin_v{abi}, "
                             f"which this plugin does not export", "use a railover build that exports it"))

    # NCCL_NET
    net = env.get("NCCL_NET")
    if net is None:
        out.append(Check("nccl", "NCCL_NET", WARN, "unset: if railover fails to load, NCCL silently falls back to "
                         "its own IB/Socket transports (no failover)", f"export NCCL_NET={name}"))
    elif net.lower() != name:
        out.append(Check("nccl", "NCCL_NET", FAIL, f"NCCL_NET='{net}': NCCL will use that network, not railover",
                         f"export NCCL_NET={name} (or 'railover launch')"))
    else:
        out.append(Check("nccl", "NCCL_NET", OK, f"NCCL_NET={net}: a plugin load failure is fatal, not a silent fallback"))

    # NCCL_NET_PLUGIN
    plug = env.get("NCCL_NET_PLUGIN")
    our_file = plugin.get("path") or ""
    if plug is None:
        out.append(Check("nccl", "NCCL_NET_PLUGIN", FAIL, "unset: NCCL only opens libnccl-net.so, not railover",
                         f"export NCCL_NET_PLUGIN={name} and put {Path(our_file).parent if our_file else 'its directory'} "
                         "on LD_LIBRARY_PATH ('railover env --shell' prints both)"))
    else:
        items = plugin_entries(plug)
        ours = [p for p in items if is_railover_entry(p)]
        problem = plugin_list_problem(plug)
        if problem is not None:
            out.append(Check("nccl", "NCCL_NET_PLUGIN", FAIL, problem, f"export NCCL_NET_PLUGIN={name}"))
        else:
            note = plugin_list_note(plug)
            if note is not None:
                # 2.27+ read a list (src/plugin/net.cc); older releases look the whole value up as one name
                old_nccl = nver is not None and tuple(nver[:2]) < (2, 27)
                out.append(Check("nccl", "NCCL_NET_PLUGIN", FAIL if old_nccl else WARN if nver is None else OK,
                                 note + (f" (this NCCL is {'.'.join(map(str, nver))})" if nver else
                                         " (NCCL version unknown here)"),
                                 f"export NCCL_NET_PLUGIN={name}" if nver is None or old_nccl else ""))
            p = ours[0]
            if p == _paths.PLUGIN_FILE and (nver is None or nver[1] in (19, 20)):
                # 2.19/2.20 (src/net.cc) open only libnccl-net-<value>.so: the file name becomes
                # libnccl-net-libnccl-net-railover.so.so, not found, and NCCL falls back silently
                # (or fails with NCCL_NET set); 2.21+ try the value verbatim first
                out.append(Check("nccl", "NCCL_NET_PLUGIN", FAIL if nver else WARN,
                                 f"file name '{p}': NCCL 2.19 and 2.20 open only libnccl-net-<NCCL_NET_PLUGIN>.so, "
                                 f"here libnccl-net-{p}.so, which does not exist"
                                 + (f" (this NCCL is {'.'.join(map(str, nver))})" if nver else ""),
                                 f"export NCCL_NET_PLUGIN={name}"))
            if "/" in p:
                bad_rel = nver is not None and ((nver[1] in (19, 20)) or tuple(nver[:3]) == (2, 27, 3))
                out.append(Check("nccl", "NCCL_NET_PLUGIN", FAIL if bad_rel else WARN,
                                 f"absolute path '{p}': NCCL 2.19, 2.20 and 2.27.3 cannot open a plugin by path"
                                 + (f" (this NCCL is {'.'.join(map(str, nver))})" if bad_rel else ""),
                                 f"export NCCL_NET_PLUGIN={name} and {_ld_path_export(Path(p).parent)}"))
                if path_kind(Path(p))[0] != "file":
                    out.append(Check("nccl", "NCCL_NET_PLUGIN", FAIL, f"'{p}' does not exist", f"export NCCL_NET_PLUGIN={name}"))
                else:
                    out += _other_build_checks("NCCL_NET_PLUGIN", f"NCCL_NET_PLUGIN={p}", p, our_file, name)
            elif resolved is None:
                out.append(Check("nccl", "LD_LIBRARY_PATH", FAIL, f"NCCL_NET_PLUGIN={p} but no {_paths.PLUGIN_FILE} on "
                                 "LD_LIBRARY_PATH or in the ldconfig cache: NCCL cannot open it",
                                 _ld_path_export(Path(our_file).parent) if our_file else "export LD_LIBRARY_PATH=<plugin dir>:$LD_LIBRARY_PATH"))
            else:
                checks = _other_build_checks("NCCL_NET_PLUGIN", f"NCCL_NET_PLUGIN={p} -> {resolved}", resolved, our_file,
                                             name, fix="put the intended plugin directory first on LD_LIBRARY_PATH")
                out += checks or [Check("nccl", "NCCL_NET_PLUGIN", OK, f"NCCL_NET_PLUGIN={p} -> {resolved}")]

    # reload bug 2.28/2.29
    rc = env.get("NCCL_NET_PLUGIN_REF_COUNT")
    affected = nver is None or (nver[0] == 2 and nver[1] in (28, 29))
    if not ref_count_keeps_plugin(rc) and affected:
        out.append(Check("nccl", "NCCL_NET_PLUGIN_REF_COUNT", WARN,
                         ("unset" if rc is None else f"'{rc}'") + ": NCCL 2.28/2.29 forget a non-default plugin name when the "
                         "last communicator is destroyed (NCCL issue 1978) and later ones fall back"
                         + ("" if nver else " (NCCL version unknown here)"), "export NCCL_NET_PLUGIN_REF_COUNT=1"))
    # NCCL_IB_*: railover's RDMA transport reads some (the parameter table says which), the
    # others only tune NCCL's own IB transport, which NCCL does not use with NCCL_NET=railover
    ib = sorted(k for k in env if k.startswith("NCCL_IB_"))
    if ib:
        try:
            ours = sorted(p["name"] for p in params.params() if p["name"].startswith("NCCL_IB_") and "plugin" in p["readers"])
        except OSError:
            ours = None
        if ours is None:
            out.append(Check("nccl", "NCCL_IB_*", INFO, f"{', '.join(ib)} set; which of them railover's RDMA transport "
                             "reads is unknown here (the plugin's parameter table cannot be loaded)"))
        else:
            read = [k for k in ib if k in ours]
            other = [k for k in ib if k not in ours]
            parts = []
            if read:
                parts.append(f"{', '.join(read)}: read by railover's RDMA transport (RAILOVER_TRANSPORT=rdma or auto), "
                             "with NCCL's meaning")
            if other:
                parts.append(f"{', '.join(other)}: only tune NCCL's own IB transport, which NCCL does not use with "
                             "NCCL_NET=railover (NCCL's own IB port failover does not apply either)")
            out.append(Check("nccl", "NCCL_IB_*", INFO, "; ".join(parts) +
                             f" (railover reads {len(ours)} of NCCL's IB variables: `railover env --list`)"))
    sock = sorted(k for k in env if k in ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"))
    if sock:
        out.append(Check("nccl", ", ".join(sock), INFO, "only tune NCCL's Socket transport; railover uses "
                         "RAILOVER_NSTREAMS streams per path"))
    if env.get("NCCL_IB_DISABLE") == "0" and net and net.lower() == name:
        pass  # harmless: NCCL_NET=railover wins

    # PyTorch / NCCL version
    if torch is None:
        out.append(Check("nccl", "PyTorch", INFO, "PyTorch is not installed here: NCCL version not checked"))
    elif torch.get("skipped"):
        out.append(Check("nccl", "PyTorch", INFO, "PyTorch check skipped (--no-torch): NCCL version not checked"))
    elif not nver:
        out.append(Check("nccl", "PyTorch", INFO, f"PyTorch {torch.get('torch')} has no NCCL ({torch.get('error') or 'CPU build'})"))
    else:
        v = ".".join(map(str, nver))
        if abi is None:
            out.append(Check("nccl", "NCCL", FAIL, f"PyTorch {torch.get('torch')} bundles NCCL {v}: railover needs 2.19 or later",
                             "use a PyTorch built with NCCL >= 2.19"))
        else:
            newest = ".".join(map(str, NEWEST_KNOWN_NCCL))
            note = f" (expected: releases after {newest} are not verified)" if tuple(nver[:2]) > NEWEST_KNOWN_NCCL else ""
            out.append(Check("nccl", "NCCL", OK, f"PyTorch {torch.get('torch')} bundles NCCL {v}, which uses net ABI v{abi}{note}"))
            if 22 <= nver[1] <= 25:
                out.append(Check("nccl", "NCCL", INFO, f"NCCL {v} unloads the plugin after the last communicator and does "
                                 "not call init again after reloading it; railover is linked -z nodelete for this"))
    return out


# --------------------------------------------------------------------------- host facts

def list_interfaces(ns: Optional[str] = None) -> List[Iface]:
    """Interfaces of this network namespace (or of named netns ``ns``) via netlink.
    Raises OSError when netlink is unavailable."""
    from pyroute2 import IPRoute
    ipr = IPRoute(netns=ns) if ns else IPRoute()
    try:
        out: Dict[int, Iface] = {}
        parent: Dict[int, int] = {}          # stacked interface -> the one it sits on
        members: Dict[int, List[int]] = {}   # bond/team/bridge/vrf -> its ports
        kinds: Dict[int, Optional[str]] = {}  # IFLA_INFO_KIND of each
        for link in ipr.get_links():
            name = link.get("IFLA_IFNAME")
            idx = link["index"]
            speed = None
            try:
                s = int(Path(f"/sys/class/net/{name}/speed").read_text().strip()) if not ns else -1
                speed = s if s > 0 else None
            except (OSError, ValueError):
                pass
            flags = link["flags"]
            out[idx] = Iface(name, idx, [], bool(flags & 1), bool(link.get("IFLA_CARRIER")),
                             str(link.get("IFLA_OPERSTATE")), speed,
                             arp=not flags & (IFF_LOOPBACK | IFF_POINTOPOINT | IFF_NOARP))
            info = link.get("IFLA_LINKINFO")
            kind = info.get("IFLA_INFO_KIND") if info else None
            if kind in STACKED_KINDS and link.get("IFLA_LINK") and link.get("IFLA_LINK_NETNSID") is None:
                parent[idx] = link.get("IFLA_LINK")
            if link.get("IFLA_MASTER"):
                members.setdefault(link.get("IFLA_MASTER"), []).append(idx)
            kinds[idx] = kind
        for idx, i in out.items():
            i.ports = sorted(_ports_of(idx, out, parent, members))
        for m, slaves in members.items():
            for idx in slaves if kinds.get(m) == "vrf" else []:
                out[idx].vrf = out[m].name
        for a in ipr.get_addr():
            i = out.get(a["index"])
            addr = a.get("IFA_ADDRESS")
            if i is None or addr is None:
                continue
            ip = ipaddress.ip_address(addr)
            if ip.version == 6 and ip.is_link_local:
                continue
            i.addrs.append(f"{addr}/{a['prefixlen']}")
        return sorted(out.values(), key=lambda x: x.index)
    finally:
        ipr.close()


#: link flags (linux/if.h)
IFF_LOOPBACK, IFF_POINTOPOINT, IFF_NOARP = 0x8, 0x10, 0x80

#: interface kinds that sit on another interface of this namespace (IFLA_LINK): they share its port
STACKED_KINDS = ("vlan", "macvlan", "macvtap", "ipvlan", "ipvtap")


def _ports_of(idx: int, links: Mapping[int, Iface], parent: Mapping[int, int], members: Mapping[int, List[int]],
              seen: Optional[set] = None) -> set:
    """Names of the interfaces at the bottom of ``idx``'s stack: follows a stacked interface to
    its parent and a master (bond, team) to its ports; an interface with neither is its own."""
    seen = set() if seen is None else seen
    if idx in seen or idx not in links:
        return set()
    seen.add(idx)
    if idx in parent:
        return _ports_of(parent[idx], links, parent, members, seen) or {links[idx].name}
    if members.get(idx):
        out: set = set()
        for m in members[idx]:
            out |= _ports_of(m, links, parent, members, seen)
        return out or {links[idx].name}
    return {links[idx].name}


def route_get(dst: str, src: str, oif: Optional[str] = None) -> Tuple[Optional[str], str]:
    """``ip route get <dst> from <src> [oif <oif>]``: ``(outgoing interface name, "")``, or
    ``(None, reason)`` when the kernel has no route (e.g. "Network is unreachable"). With
    ``oif``, the route a socket bound to that device gets; ``oif`` a VRF: the route in that
    VRF (``ip route get <dst> from <src> vrf <oif>``)."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
    with IPRoute() as ipr:
        try:
            kw: Dict[str, Any] = {"oif": ipr.link_lookup(ifname=oif)[0]} if oif else {}
            r = ipr.route("get", dst=dst, src=src, **kw)
        except IndexError:
            return None, f"no interface {oif}"
        except NetlinkError as e:
            return None, os.strerror(e.code) if e.code else str(e)
        if not r:
            return None, "no route"
        rt = r[0]
        if rt.get("type", 1) not in (1, 2):  # unicast, local
            return None, {7: "unreachable route", 6: "blackhole route", 8: "prohibited route"}.get(rt.get("type"), f"route type {rt.get('type')}")
        oif = rt.get("RTA_OIF")
        links = ipr.get_links(oif) if oif else []
        return (links[0].get("IFLA_IFNAME") if links else None), ""


def tcp_probe(src: str, dst: str, port: int = 22, timeout_s: float = 1.0, ifname: str = "") -> Tuple[bool, str]:
    """Open a TCP connection from ``src`` to ``dst:port``, bound like the plugin's streams: to
    the address and, when ``ifname`` is given, to that device (``SO_BINDTODEVICE``; skipped
    without the privilege, as in the plugin), so it leaves through that NIC whatever the
    routing table says. ``(True, how)`` when the peer's kernel answered (accepted or refused:
    both prove the path), ``(False, why)`` on timeout or a network error. ``timeout_s`` in
    seconds."""
    fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout_s)
        if ifname:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
            except PermissionError:
                pass   # no CAP_NET_RAW before Linux 5.7: the plugin keeps the address binding only, too
        s.bind((src, 0))
        s.connect((dst, port))
        return True, f"TCP port {port} accepted"
    except ConnectionRefusedError:
        return True, f"TCP port {port} refused (host answered)"
    except socket.timeout:
        return False, f"no answer on TCP port {port} within {timeout_s:g} s (unreachable or filtered)"
    except OSError as e:
        return False, e.strerror or str(e)
    finally:
        s.close()


def rdma_report(nics: Sequence[str], env: Mapping[str, str], plugin: Optional[Path] = None) -> Dict[str, Any]:
    """The plugin's own answer about its RDMA transport for NICs ``nics`` under ``env``
    (:meth:`railover.params.Native.rdma_report` of the plugin at ``plugin``, default the
    installed one). Never raises: ``{"error": why}`` when the plugin cannot be loaded, lacks the
    function (an older build) or answers something that is not JSON."""
    try:
        return params.load(plugin).rdma_report(list(nics), dict(env))
    except FileNotFoundError as e:
        return {"error": f"plugin not found: {e}"}
    except OSError as e:
        return {"error": str(e)}
    except ValueError as e:
        return {"error": f"the plugin's RDMA report is not JSON: {e}"}


def nic_sysctls(names: Sequence[str], root: Path = Path("/proc/sys/net/ipv4/conf")) -> Dict[str, Dict[str, int]]:
    """The effective ``arp_ignore``, ``arp_announce`` and ``rp_filter`` of each NIC in
    ``names`` (this network namespace): the larger of ``conf/all/<key>`` and
    ``conf/<nic>/<key>``, as the kernel applies them. A value that cannot be read is left out."""
    out: Dict[str, Dict[str, int]] = {}
    for n in names:
        vals: Dict[str, int] = {}
        for key in ("arp_ignore", "arp_announce", "rp_filter"):
            try:
                vals[key] = max(int((root / "all" / key).read_text()), int((root / n / key).read_text()))
            except (OSError, ValueError):
                pass
        out[n] = vals
    return out


def gather(env: Optional[Mapping[str, str]] = None, plugin: Optional[Path] = None, check_torch: bool = True) -> Facts:
    """Observe this host (current network namespace): interfaces, the plugin, PyTorch's NCCL,
    and the plugin's RDMA report for the NICs it would select."""
    env = dict(os.environ if env is None else env)
    if plugin is None:
        try:
            plugin = _paths.plugin_path()
        except FileNotFoundError as e:
            pinfo: Dict[str, Any] = {"path": "", "loaded": False, "error": str(e), "abi": [], "collnet": [], "foreign": [],
                                     "native_dir_error": isinstance(e, _paths.NativeDirError)}
            plugin = None
    if plugin is not None:
        pinfo = plugin_exports(Path(plugin))
    ifaces = list_interfaces()
    selected, _reasons, _source = select_interfaces(env, ifaces)
    rdma = (rdma_report([i.name for i in selected], env, Path(plugin)) if pinfo.get("loaded") and plugin is not None
            else {"error": "the plugin could not be loaded (see the plugin check)"})
    return Facts(env=env, ifaces=ifaces, plugin=pinfo,
                 torch=torch_nccl() if check_torch else {"skipped": True}, ld_resolve=ld_resolve(env),
                 tools=prereqs.found(path=env.get("PATH")), tools_off_path=prereqs.found_off_path(path=env.get("PATH")),
                 rdma=rdma,
                 sysctls=nic_sysctls([i.name for i in ifaces if i.name != "lo"]))


def _conf(name: str) -> str:
    """Interface ``name`` as a component of a dotted sysctl key: sysctl(8) reads a '/' there as
    the '.' of a VLAN's name (``net.ipv4.conf.bond0/100.rp_filter`` is bond0.100's)."""
    return name.replace(".", "/")


def _unselected_ipv4_nets(ifaces: Sequence[Iface], chosen: Collection[str]) -> Dict[str, List[ipaddress.IPv4Network]]:
    """The IPv4 subnets of each interface in ``ifaces`` that is not ``chosen`` (the NICs the
    plugin discovers) and can take part in a device's subnet, by name: up with carrier, ARP on a
    shared link (not loopback, dummy, tunnel or WireGuard: :attr:`Iface.arp`), and subnets of 2
    or more hosts (a /31 or /32 shares no link: a service address). The same rule as the plugin's
    init (devices.cc, otherIpv4Interfaces). Interfaces with no such subnet are not listed."""
    out: Dict[str, List[ipaddress.IPv4Network]] = {}
    for x in ifaces or ():
        if x.name in chosen or not (x.arp and x.admin_up and x.carrier):
            continue
        nets = [n for n in (ipaddress.ip_interface(a).network for a in x.addrs) if n.version == 4 and n.prefixlen <= 30]
        if nets:
            out[x.name] = nets
    return out


def _neighbour(net: ipaddress._BaseNetwork, local: Collection[str],
               skip: Sequence[ipaddress._BaseNetwork] = ()) -> Optional[str]:
    """A stand-in for a peer on ``net`` when no ``--peer`` is given: one of its first host
    addresses that is none of this host's addresses ``local`` (the kernel routes those through
    lo whatever the source, so a NIC sharing its subnet with another NIC of this host got a
    routing finding that no source routing could clear) and in none of the networks ``skip``
    (subnets of other NICs inside ``net``, checked on their own). None when ``net`` has no
    such one. No cap on the addresses tried (doctor tried 64 and then checked nothing, where
    the plugin's init looks further): each one tried is either returned or one of ``local``,
    and each subnet of ``skip`` is passed in one step, so at most ``len(local) + len(skip) + 1``
    steps are taken, as in the plugin (rpFilterWarnings)."""
    if net.num_addresses < 4:
        return None
    a, last = int(net.network_address) + 1, int(net.broadcast_address)
    while a < last:
        ip = type(net.network_address)(a)
        inner = [n for n in skip if ip in n]
        if inner:
            a = max(int(n.broadcast_address) for n in inner) + 1
            continue
        if str(ip) not in local:
            return str(ip)
        a += 1
    return None


def _facts_native(plugin: Mapping[str, Any]) -> Optional[params.Native]:
    """The parameter table of the plugin doctor was asked about (``--plugin``, else the one
    found): the settings are checked with the parser of the build NCCL will load. None (the
    installed plugin's table is used) when that file is no loadable railover build."""
    if not (plugin.get("loaded") and plugin.get("railover") and plugin.get("path")):
        return None
    try:
        return params.load(Path(plugin["path"]))
    except OSError:
        return None


def diagnose(facts: Facts, peers: Sequence[str] = (), *,
             route: Optional[Callable[[str, str], Tuple[Optional[str], str]]] = None,
             probe: Optional[Callable[[str, str], Tuple[bool, str]]] = None) -> Report:
    """Evaluate ``facts`` into a :class:`Report`. ``peers`` are IP addresses of other hosts'
    NICs. ``route(dst, src[, oif])`` answers "which interface does traffic from src to dst
    leave through" (with ``oif``: for a socket bound to that device, or, a VRF, in that VRF,
    as for a NIC enslaved to it; default
    :func:`route_get`); ``probe(src, dst, ifname)`` tests reachability from NIC ``ifname``
    (default :func:`tcp_probe`). Raises ValueError for a peer that is not an IP address."""
    route = route or route_get
    probe = probe or (lambda src, dst, ifname: tcp_probe(src, dst, ifname=ifname))
    env = facts.env
    checks = validate_config(env, _facts_native(facts.plugin))
    for p in peers:
        ipaddress.ip_address(p)  # ValueError names the bad one
    # a --peer that is an address of this host: one --peer list for every host of a job (srun
    # runs the same command on each) names each host's own NICs too; checking them judged the
    # route through lo and failed the host
    mine = {ipaddress.ip_address(a.split("/")[0]): i.name for i in facts.ifaces for a in i.addrs}
    own = [p for p in peers if ipaddress.ip_address(p) in mine]
    peers = [p for p in peers if p not in own]
    selected, reasons, source = select_interfaces(env, facts.ifaces)
    # A selection the plugin refuses ('^', 'eth0,,lo': FAIL above) selects nothing: NCCL's init
    # fails. Doctor's own matcher would read it somehow (all NICs, lo included) and judge a
    # selection the job never gets.
    sel_refused = any(c.what == source and c.status == FAIL for c in checks if c.section == "config")
    if sel_refused:
        selected = []
        reasons = {i.name: f"not evaluated: the plugin refuses {source}" for i in facts.ifaces}
    fam = socket_family(env)
    rails = rails_of(env, selected)  # numbered before the RDMA transport leaves any NIC out, as in the plugin
    # The RDMA transport's say (the plugin's report): with RAILOVER_TRANSPORT=auto the selected
    # NICs without an RDMA port are left out of NCCL's devices when others have one; with
    # rdma+tcp they stay, served over TCP. From here on `selected` is NCCL's devices.
    fates = {name: f for name, f in rdma_fates(facts.rdma).items() if name in rails}
    left_out = [i for i in selected if fates.get(i.name) == LEFT_OUT]
    over_tcp = [i for i in selected if fates.get(i.name) == OVER_TCP]
    for i in left_out:
        reasons[i.name] += ", but " + rdma_fate_reason(facts.rdma, i.name, LEFT_OUT)
        del rails[i.name]
    for i in over_tcp:
        reasons[i.name] += "; " + rdma_fate_reason(facts.rdma, i.name, OVER_TCP)
    discovered = list(selected)   # the NICs the plugin discovers, those left out included
    selected = [i for i in selected if i not in left_out]
    out_note = (f"; {', '.join(i.name for i in left_out)} left out of NCCL's devices: no RDMA port, and "
                "RAILOVER_TRANSPORT=auto uses the RDMA NICs only" if left_out else "")
    nics = []
    for i in sorted(facts.ifaces, key=lambda x: x.index):
        nics.append({"name": i.name, "selected": i in selected, "reason": reasons.get(i.name, ""),
                     "addrs": i.addrs, "admin_up": i.admin_up, "carrier": i.carrier, "operstate": i.operstate,
                     "rail": rails.get(i.name), "speed_mbps": i.speed_mbps})
        if (i not in selected and source != "default" and not sel_refused and i.addr(fam) is None
                and ifname_matches(env[source], i.name)):
            checks.append(Check("nics", i.name, WARN, f"matches {source} but has no address: railover ignores it",
                                f"give {i.name} an address, or drop it from {source}"))
    if sel_refused:
        checks.append(Check("nics", "selection", FAIL, f"not evaluated: the plugin refuses {source}='{env[source]}' "
                            "(config above), so NCCL's init fails and no NIC is selected",
                            f"fix {source} (the config check above says what it accepts)"))
    elif not selected:
        checks.append(Check("nics", "selection", FAIL,
                            f"{source}='{env.get(source, '')}' selects no interface with an address" if source != "default"
                            else "no network interface with an address", "set RAILOVER_IFNAMES to the job's NICs"))
    elif len(selected) == 1 and left_out:
        out = ", ".join(i.name for i in left_out)
        checks.append(Check("nics", "selection", WARN, f"only {selected[0].name} is a device of NCCL ({source}{out_note}): "
                            "no standby NIC, failover is impossible",
                            f"give {out} an RDMA port, select another RDMA NIC, or set RAILOVER_TRANSPORT=tcp (every NIC "
                            f"on TCP); RAILOVER_TRANSPORT=rdma+tcp gives {selected[0].name}'s comms no standby (they fail "
                            "over only to other RDMA NICs)"))
    elif len(selected) == 1:
        checks.append(Check("nics", "selection", WARN, f"only {selected[0].name} is selected ({source}): no standby NIC, "
                            "failover is impossible", "select at least two NICs with RAILOVER_IFNAMES"))
    else:
        kind = {i.name: " tcp" if i in over_tcp else " rdma" for i in selected} if over_tcp else {}
        alone = [i.name for i in selected if over_tcp and sum(kind[j.name] == kind[i.name] for j in selected) == 1]
        detail = (f"{len(selected)} NICs selected via {source}: "
                  + ", ".join(f"{i.name} (rail {rails[i.name]}{',' + kind[i.name] if kind else ''})" for i in selected)
                  + out_note)
        if alone:
            checks.append(Check("nics", "selection", WARN, detail + f"; with RAILOVER_TRANSPORT=rdma+tcp a comm fails over "
                                f"only to NICs of its own kind: the comms of {', '.join(alone)} have no standby",
                                "give the NICs without an RDMA port one and use RAILOVER_TRANSPORT=auto, or set "
                                "RAILOVER_TRANSPORT=tcp (every NIC on TCP)"))
        else:
            checks.append(Check("nics", "selection", OK, detail))
        if any(i.name == "lo" for i in selected):
            checks.append(Check("nics", "lo", WARN, "loopback is selected: it only reaches this host",
                                "exclude it (RAILOVER_IFNAMES)"))
    for name, _r in _split_rails(env):
        if name not in rails and fates.get(name) != LEFT_OUT:  # a NIC left out is warned about once, in rdma
            checks.append(Check("nics", "RAILOVER_RAILS", WARN, f"RAILOVER_RAILS names {name}, which is not a selected NIC",
                                "fix the name or the NIC selection"))
    standby = effective_env(env).get("RAILOVER_STANDBY", "").strip(" \t")
    if standby not in ("", "all", "none"):
        for item in _split(standby, ";"):
            kv = _split(item, "=")
            for name in kv if len(kv) == 2 else []:
                if name and name not in rails:
                    what = ("which is left out of NCCL's devices (no RDMA port, and RAILOVER_TRANSPORT=auto uses the "
                            "RDMA NICs only)" if fates.get(name) == LEFT_OUT else "which is not a selected NIC")
                    checks.append(Check("nics", "RAILOVER_STANDBY", WARN,
                                        f"RAILOVER_STANDBY pair {item} names {name}, {what}: "
                                        "that pair gives no standby path", "fix the name or the NIC selection"))
    # NICs on one port (a VLAN beside its parent, two VLANs of one port, a bond and a VLAN of
    # its port): a standby path between them shares the cable, optic and switch port it is
    # meant to survive.
    for k, i in enumerate(selected):
        for j in selected[k + 1:]:
            shared = sorted(set(i.ports or [i.name]) & set(j.ports or [j.name]))
            if shared:
                checks.append(Check("nics", f"{i.name}, {j.name}", WARN,
                                    f"{i.name} and {j.name} are on the same port ({', '.join(shared)}): a comm failing "
                                    "over between them shares the cable, optic and switch port that failed",
                                    "select one interface per physical port (RAILOVER_IFNAMES)"))
    speeds = {i.speed_mbps for i in selected if i.speed_mbps}
    if len(speeds) > 1:
        checks.append(Check("nics", "speed", INFO, "selected NICs have different speeds "
                            f"({', '.join(f'{i.name} {i.speed_mbps} Mb/s' for i in selected if i.speed_mbps)}): "
                            "after a failover the job runs at the standby's speed"))

    # link state
    for i in selected:
        addr = i.addr(fam)
        if not i.admin_up:
            checks.append(Check("nics", i.name, FAIL, f"{i.name} ({addr}) is administratively down",
                                f"ip link set {i.name} up"))
        elif not i.carrier or i.operstate in ("DOWN", "LOWERLAYERDOWN"):
            checks.append(Check("nics", i.name, FAIL, f"{i.name} ({addr}) has no carrier (operstate {i.operstate}): "
                                "cable, optic or switch port", "repair the link before running jobs on this host"))
        else:
            checks.append(Check("nics", i.name, OK, f"{i.name} {', '.join(i.addrs)} up, rail {rails[i.name]}"))

    # several NICs in one IPv4 subnet: each must answer ARP for its own address only, else a
    # peer's traffic to one NIC arrives on another, where railover's device-bound sockets do not
    # take it (a connect is refused, a probe lost). IPv6 neighbour discovery answers per NIC.
    # The NICs judged are the devices (`selected`), as in the plugin's init; the NICs left out
    # (RAILOVER_TRANSPORT=auto) still share their subnet: they keep their address, routes and
    # ARP answers, so one with arp_ignore=0 can take a device's traffic.
    sel_addrs = {i.name: i.addr(fam) for i in discovered}
    nets = {i.name: i.network_of(sel_addrs[i.name]) for i in discovered if sel_addrs[i.name]}
    nets = {n: net for n, net in nets.items() if net is not None and net.version == 4}
    out_names = {i.name for i in left_out}
    # every other interface of this host that can share a link, with its IPv4 subnets
    # (_unselected_ipv4_nets): not selected, but its addresses, routes and ARP answers are the
    # kernel's all the same (a management NIC on a rail's subnet); the plugin's init counts them too
    unselected = _unselected_ipv4_nets(facts.ifaces, {i.name for i in discovered})
    sysctls = facts.sysctls or {}
    for i in selected:
        mates = [n for n in nets if n != i.name and i.name in nets and nets[n].overlaps(nets[i.name])]
        mates += [n for n, ns in unselected.items() if i.name in nets and any(x.overlaps(nets[i.name]) for x in ns)]
        vals = sysctls.get(i.name, {})
        if not mates or not vals:
            continue
        served_mates = [n for n in mates if n not in out_names and n not in unselected]
        out_flux = [n for n in mates if (n in out_names or n in unselected)
                    and sysctls.get(n, {}).get("arp_ignore") == 0]
        share = (f"{i.name} ({sel_addrs[i.name]}) shares subnet {nets[i.name]} with "
                 + ", ".join(n + (" (left out of NCCL's devices)" if n in out_names else
                                  " (not selected)" if n in unselected else "") for n in mates))
        answers = vals.get("arp_ignore") == 0 and bool(served_mates)
        if answers or out_flux:
            said = []
            if answers:
                said.append(f"{i.name} answers ARP for the addresses of {', '.join(served_mates)} too (ARP flux: "
                            f"arp_ignore of the NIC a request arrives on), so a peer's traffic to {served_mates[0]} "
                            f"may arrive on {i.name}, where railover's sockets, bound to {served_mates[0]}, do not "
                            "take it (connects refused, probes lost)")
            if out_flux:
                one = len(out_flux) == 1
                said.append(f"{', '.join(out_flux)} {'has' if one else 'have'} arp_ignore=0 and "
                            f"{'answers' if one else 'answer'} ARP for {i.name}'s address too "
                            f"(ARP flux), so a peer's traffic to {i.name} may arrive on "
                            f"{' or '.join(out_flux)}, which railover does not use (connects refused, probes lost)")
            keys = [f"net.ipv4.conf.{_conf(n)}.arp_ignore=1" for n in ([i.name] if answers else []) + out_flux]
            checks.append(Check("arp", i.name, FAIL, f"{share}{' and arp_ignore=0' if answers else ''}: "
                                + "; and ".join(said),
                                f"sysctl -w net.ipv4.conf.all.arp_ignore=1 (or {' '.join(keys)}), persistently in "
                                "/etc/sysctl.d"))
        elif vals.get("arp_announce") is not None and vals["arp_announce"] != 2:
            checks.append(Check("arp", i.name, WARN,
                                f"{share} and arp_announce={vals['arp_announce']}: an ARP request sent from "
                                f"another NIC may carry {sel_addrs[i.name]} as its sender, teaching peers "
                                f"that NIC's hardware address for {i.name}",
                                f"sysctl -w net.ipv4.conf.all.arp_announce=2 (or net.ipv4.conf.{_conf(i.name)}.arp_announce=2)"))
        elif "arp_ignore" in vals:
            checks.append(Check("arp", i.name, OK, f"{share}: arp_ignore={vals['arp_ignore']}, "
                                f"arp_announce={vals.get('arp_announce')}"))

    # source routing and reachability
    targets: List[Tuple[Iface, str, bool]] = []   # (nic, destination, on the NIC's own subnet)
    peer_nics: Dict[str, List[Iface]] = {}
    for p in peers:
        onlink = [i for i in selected if i.network_of(sel_addrs[i.name]) is not None and
                  ipaddress.ip_address(p) in i.network_of(sel_addrs[i.name])]
        peer_nics[p] = onlink or list(selected)
        for i in peer_nics[p]:
            targets.append((i, p, bool(onlink)))
    # rails: where some peers are on a NIC's subnet (a rail per subnet), a selected NIC with no
    # peer on its subnet, or a peer on none, means the hosts' rails do not match (a NIC missing,
    # on another subnet or not selected there); railover pairs by rail and, where the subnets
    # show the mismatch, by subnet, and WARNs once at connect (docs/DESIGN.md: which peer NIC
    # each path goes to). Not when no peer is on any subnet (a routed fabric).
    nets_of = {i.name: i.network_of(sel_addrs[i.name]) for i in selected}
    onlink_of = {p: [i.name for i in selected if nets_of[i.name] is not None
                     and ipaddress.ip_address(p) in nets_of[i.name]] for p in peers}
    if any(onlink_of.values()):
        have = ", ".join(f"{p} on {' '.join(n)}" for p, n in onlink_of.items() if n)
        for i in selected:
            net = nets_of[i.name]
            if net is None or any(i.name in n for n in onlink_of.values()):
                continue
            if not any(ipaddress.ip_address(p).version == net.version for p in peers):
                continue
            checks.append(Check("rails", i.name, WARN,
                                f"no --peer address is on {i.name}'s subnet {net} ({have}): if these are the "
                                f"peers' NICs, their rails do not match this host's; railover's paths from "
                                f"{i.name} go to a peer NIC on another subnet (connects time out unless routed) "
                                f"or are not opened",
                                f"give every host a NIC on each rail's subnet and select the same NICs "
                                f"(RAILOVER_IFNAMES/NCCL_SOCKET_IFNAME, RAILOVER_RAILS) on every host"))
        for p, n in onlink_of.items():
            if not n:
                checks.append(Check("rails", p, WARN,
                                    f"{p} is on no selected NIC's subnet while other peers are ({have}): a peer "
                                    f"NIC on another subnet than this host's NICs of its rail",
                                    "put the peer's NIC on the subnet of its rail, or check that it is routed"))
    if not peers:
        local = {a.split("/")[0] for x in facts.ifaces for a in x.addrs}
        for i in selected:
            net = i.network_of(sel_addrs[i.name])
            if net is None:
                continue
            if net.prefixlen == 0:
                # the kernel adds no subnet route for a /0 address: nothing is on the NIC's link
                # by its address, and a stand-in "in its subnet" would be no address (0.0.0.1);
                # the plugin's init leaves it out too, with the same WARN (zeroPrefixWarnings)
                if net.version == 4:
                    checks.append(Check("routing", i.name, WARN,
                                        f"{i.name}'s address {sel_addrs[i.name]}/0 has prefix length 0: the kernel "
                                        "gives it no subnet route, so no peer is on its link by its address and what "
                                        "it sends leaves wherever other routes say (under rp_filter=1, what arrives "
                                        "on it is dropped unless the route back leaves through it); its routes are "
                                        "not checked without --peer",
                                        f"give {i.name} its subnet's prefix length (ip addr replace "
                                        f"{sel_addrs[i.name]}/<len> dev {i.name}), or pass --peer addresses"))
                continue
            # other NICs' subnets inside this one with a longer prefix: the kernel routes there
            # through them (the longest prefix), so each gets a stand-in of its own, the rest of
            # the subnet one outside them (as the plugin's init looks them up)
            inner = sorted({n for n in [x.network_of(sel_addrs[x.name]) for x in discovered if sel_addrs[x.name]]
                            + [x for ns in unselected.values() for x in ns]
                            if n is not None and n.version == net.version
                            and n.prefixlen > net.prefixlen and n.subnet_of(net)})
            for sub, skip in [(net, inner)] + [(n, []) for n in inner]:
                nb = _neighbour(sub, local, skip)
                if nb:
                    targets.append((i, nb, True))
    mismatched = set()   # (nic, peer) whose address families differ: no route or probe possible
    for i, dst, onlink in targets:
        src = sel_addrs[i.name]
        what = f"{i.name} -> {dst}"
        dv, sv = ipaddress.ip_address(dst).version, ipaddress.ip_address(src).version
        if dv != sv:
            mismatched.add((i.name, dst))
            want = "AF_INET6" if dv == 6 else "AF_INET"
            other = i.addr(socket.AF_INET6 if dv == 6 else socket.AF_INET)
            checks.append(Check("routing", what, FAIL,
                                f"{dst} is an IPv{dv} address but {i.name}'s address {src} is IPv{sv}: railover "
                                f"cannot reach it from {i.name}",
                                f"pass the peer NIC's IPv{sv} address" +
                                (f", or set NCCL_SOCKET_FAMILY={want} on every host (railover then uses {other})"
                                 if other else f", or give {i.name} an IPv{dv} address")))
            continue
        # a NIC in a VRF: the lookup in the VRF's table (the VRF as the device, as the plugin
        # does), where its routes are and where the kernel's reverse-path filter looks
        oif, err = route(dst, src, i.vrf) if i.vrf else route(dst, src)
        if oif is None:
            vrf = f" vrf {i.vrf}" if i.vrf else ""
            checks.append(Check("routing", what, FAIL, f"ip route get {dst} from {src}{vrf}: {err}",
                                f"add a route for {dst} via {i.name} (is {i.name} up with its subnet route?)"))
        elif oif != i.name:
            fix = (f"add source routing: ip rule add from {src} table <N>; ip route add "
                   f"{dst if not onlink else i.network_of(src)} dev {i.name} table <N>")
            rpf = sysctls.get(i.name, {}).get("rp_filter")
            if rpf is not None and sv == 6:
                rpf = 0   # reverse-path filtering is IPv4's (net.ipv4.conf); IPv6 has none
            # railover binds its sockets to the NIC (SO_BINDTODEVICE): what they send leaves
            # through it when a route via the NIC exists; what arrives on it is dropped by strict
            # reverse-path filtering, whose route back to dst is the one without a device.
            bound = route(dst, src, i.name)[0] == i.name if rpf is not None else False
            if bound and rpf == 1:
                checks.append(Check("routing", what, FAIL,
                                    f"traffic from {src} to {dst} leaves through {oif}, not {i.name}: railover's "
                                    f"sockets, bound to {i.name}, still send through it, but strict reverse-path "
                                    f"filtering (rp_filter=1 on {i.name}) drops what {dst} sends to {i.name}",
                                    fix + f", or loose filtering: sysctl -w net.ipv4.conf.all.rp_filter=2 "
                                    f"net.ipv4.conf.{_conf(i.name)}.rp_filter=2"))
            elif bound:
                checks.append(Check("routing", what, WARN,
                                    f"traffic from {src} to {dst} leaves through {oif}, not {i.name}: railover's "
                                    f"sockets, bound to {i.name}, still use it (rp_filter={rpf}), but software "
                                    f"bound to {src} only (NCCL's bootstrap, other tools) leaves through {oif}", fix))
            else:
                checks.append(Check("routing", what, FAIL if onlink else WARN,
                                    f"traffic from {src} to {dst} leaves through {oif}, not {i.name}", fix))
        else:
            checks.append(Check("routing", what, OK, f"from {src} leaves through {i.name}"))
    if peers:
        jobs = [(i, p) for p in peers for i in peer_nics[p] if (i.name, p) not in mismatched]
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(jobs)))) as ex:
            results = list(ex.map(lambda j: probe(sel_addrs[j[0].name], j[1], j[0].name), jobs))
        reach: Dict[str, List[str]] = {p: [] for p in peers}
        for (i, p), (ok, how) in zip(jobs, results):
            if ok:
                reach[p].append(i.name)
                checks.append(Check("reach", f"{i.name} -> {p}", OK, how))
            else:
                checks.append(Check("reach", f"{i.name} -> {p}", FAIL, f"{p} not reachable from {i.name} "
                                    f"({sel_addrs[i.name]}): {how}", f"check {i.name}'s link, routes and the peer"))
    for p in own:
        checks.append(Check("reach", p, INFO, f"{p} is an address of this host ({mine[ipaddress.ip_address(p)]}), "
                            "not a peer's: not checked"))
    checks += nccl_checks(env, facts.plugin, facts.torch, facts.ld_resolve)
    if facts.rdma is not None:
        checks += rdma_checks(facts.rdma, ifaces=facts.ifaces)
    if facts.tools is not None:
        checks += [Check("system", what, status, detail, fix) for what, status, detail, fix in prereqs.doctor_rows(facts.tools, facts.tools_off_path)]
    return Report(checks, nics, facts.rdma)


# --------------------------------------------------------------------------- RDMA

def rate_text(mbps: int) -> str:
    """A port rate in Mbps as people write it: ``100 Gb/s``, ``2.5 Gb/s``; ``-`` when unknown (0)."""
    return f"{mbps / 1000:g} Gb/s" if mbps > 0 else "-"


def rdma_nic_line(n: Mapping[str, Any]) -> str:
    """One line for a NIC of the RDMA report: the HCA port, its link layer and state, the GID
    (or LID addressing) when one was chosen."""
    if n.get("choice") not in ("chosen", "down"):
        return "no HCA port"
    rate = f", {rate_text(n.get('rate_mbps', 0))}" if n.get("rate_mbps", 0) > 0 else ""
    where = f"{n.get('hca')} port {n.get('port')} ({n.get('link_layer') or '?'}, {n.get('state') or '?'}{rate})"
    if n.get("gid_index", -1) >= 0:
        return f"{where}, GID {n['gid_index']} {n.get('gid', '')}".rstrip()
    return f"{where}, LID addressing"


#: :func:`rdma_fates`' values: the plugin leaves the NIC out of NCCL's devices / serves it over TCP
LEFT_OUT, OVER_TCP = "left out", "tcp"


def _has_rdma_port(n: Mapping[str, Any]) -> bool:
    return n.get("choice") in ("chosen", "down")  # down: chosen, its port not ACTIVE now


def rdma_fates(r: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    """What the plugin's init does with each NIC of its RDMA report ``r`` that is not an RDMA
    device while other NICs are, by NIC name, from each NIC's ``device`` (the plugin's own
    rule, ``planTransport`` in native/plugin/rdma_report.h, which init applies):
    :data:`LEFT_OUT` (``left_out``: ``RAILOVER_TRANSPORT=auto`` with a mix leaves it out of
    NCCL's devices, as NCCL's own IB transport lists only RDMA devices), :data:`OVER_TCP`
    (``tcp`` beside RDMA NICs: ``rdma+tcp`` serves it over TCP, a device of its own). Empty
    when every NIC is a device of the one transport the job uses (``tcp`` everywhere, or
    ``rdma`` everywhere), when init would fail, or when the report is missing or did not
    evaluate (``error``, ``config_error``). A report of a plugin built before ``device`` (doctor
    ``--plugin`` of an older build) is read with the rule that plugin applied: setting,
    transport and each NIC's ``choice``."""
    if not r or "error" in r or r.get("config_error") or r.get("transport") not in ("rdma", "rdma+tcp"):
        return {}
    nics = r.get("nics") or []
    if nics and not any("device" in n for n in nics):  # older plugin: its rule, as it applied it
        if not (r.get("libibverbs") or {}).get("loaded") or not any(_has_rdma_port(n) for n in nics):
            return {}
        how = (r.get("setting"), r.get("transport"))
        fate = LEFT_OUT if how == ("auto", "rdma") else OVER_TCP if how == ("rdma+tcp", "rdma+tcp") else None
        return {n["nic"]: fate for n in nics if fate and not _has_rdma_port(n)}
    fates = {"left_out": LEFT_OUT, "tcp": OVER_TCP}
    return {n["nic"]: fates[n["device"]] for n in nics if n.get("device") in fates}


def rdma_fate_reason(r: Mapping[str, Any], nic: str, fate: str) -> str:
    """Why NIC ``nic`` of report ``r`` is left out / served over TCP (:func:`rdma_fates`), in
    the words of the plugin's own WARN at init (``Runtime::chooseTransport``)."""
    n = next((x for x in r.get("nics", []) if x.get("nic") == nic), {})
    port = "no RDMA port (NCCL_IB_HCA excludes its HCA port)" if n.get("choice") == "excluded" else "no RDMA port"
    rdma_nics = ",".join(x["nic"] for x in r.get("nics", []) if _has_rdma_port(x))
    if fate == LEFT_OUT:
        return (f"left out of NCCL's devices: {port}, and with RAILOVER_TRANSPORT=auto NCCL's devices are the RDMA "
                f"NIC(s) {rdma_nics} only, as with NCCL's own IB transport (RAILOVER_TRANSPORT=rdma+tcp serves it over "
                f"TCP as a device of its own, RAILOVER_TRANSPORT=tcp puts every NIC on TCP)")
    return (f"served over TCP as a device of its own: {port}, and RAILOVER_TRANSPORT=rdma+tcp puts the NICs without one "
            f"on TCP beside the RDMA NIC(s) {rdma_nics}; its comms fail over only to other TCP NICs")


def rdma_checks(r: Mapping[str, Any], ifaces: Optional[Sequence[Iface]] = None) -> List[Check]:
    """Checks of section ``rdma`` from the plugin's RDMA report ``r`` (shape:
    ``native/plugin/rdma_report.h``, or ``{"error": why}``). FAIL only when the job's init
    would fail (``RAILOVER_TRANSPORT=rdma`` without a usable HCA port on every NIC); a NIC
    without an RDMA port is INFO when the job uses TCP anyway, WARN when other NICs have one
    (``auto`` then leaves it out of NCCL's devices; ``rdma+tcp`` serves it over TCP beside the
    RDMA NICs, and its comms fail over only to other TCP NICs). ``ifaces``: this host's
    interfaces, where known (an unused port's interface without an address needs one before
    selecting it helps)."""
    out: List[Check] = []
    if "error" in r:
        return [Check("rdma", "RDMA transport", INFO, f"not checked: {r['error']}")]
    setting = r.get("setting", "auto")
    if r.get("config_error"):
        return [Check("rdma", "RDMA transport", INFO, f"not evaluated: the configuration does not parse "
                      f"({r['config_error']}); see the config checks")]
    if not r.get("built_with_verbs"):
        status = FAIL if r.get("transport") == "error" else INFO
        out.append(Check("rdma", "build", status, "this plugin build has no RDMA transport (built without "
                         "rdma-core's headers): every NIC is served by TCP",
                         "install libibverbs-dev and rebuild railover" if status == FAIL else ""))
    else:
        lib = r.get("libibverbs", {})
        if lib.get("loaded"):
            out.append(Check("rdma", "libibverbs", OK, "rdma-core's libibverbs.so.1 loads"))
        else:
            out.append(Check("rdma", "libibverbs", FAIL if setting == "rdma" else INFO,
                             f"{lib.get('error') or 'cannot be loaded'}: every NIC is served by TCP",
                             "install rdma-core's libibverbs1 (and the provider for the HCA)" if setting == "rdma" else ""))
        nics = r.get("nics", [])
        chosen = [n for n in nics if _has_rdma_port(n)]
        fates = rdma_fates(r)
        for n in nics:
            choice = n.get("choice")
            if choice == "chosen":
                out.append(Check("rdma", n["nic"], OK, f"{rdma_nic_line(n)}: {n.get('why', '')}"))
                continue
            if choice == "down":  # the transport keeps it: down until its port is ACTIVE
                out.append(Check("rdma", n["nic"], WARN, f"{rdma_nic_line(n)}: {n.get('why', '')}",
                                 f"check the cable, optic and switch port of {n['nic']} ({n.get('hca')} port "
                                 f"{n.get('port')})"))
                continue
            ports = n.get("ports", [])
            seen = "; HCA ports behind it: " + ", ".join(
                f"{p['hca']} port {p['port']} ({p['link_layer']}, {p['state']}"
                f"{'' if p.get('allowed', True) else ', excluded by NCCL_IB_HCA'})" for p in ports) if ports else ""
            fate = {LEFT_OUT: " (left out of NCCL's devices: the job uses the RDMA NICs only)",
                    OVER_TCP: " (served over TCP, a device of its own)"}.get(fates.get(n["nic"], ""), "")
            if choice == "excluded":
                out.append(Check("rdma", n["nic"], INFO, f"{n.get('why', '')}{fate}{seen}"))
                continue
            if setting == "rdma":
                status, fix = FAIL, f"bring an ACTIVE RDMA port with a GID to {n['nic']}, or set RAILOVER_TRANSPORT=auto"
            elif setting == "auto" and chosen:
                status, fix = WARN, (f"{n['nic']} is left out of NCCL's devices (as with NCCL's IB transport): give it "
                                     f"an RDMA port, set RAILOVER_TRANSPORT=rdma+tcp to serve it over TCP, or leave it "
                                     f"out of RAILOVER_IFNAMES to silence this")
            elif setting == "rdma+tcp" and chosen:
                status, fix = WARN, (f"{n['nic']} is served over TCP beside the RDMA NICs, and its comms fail over "
                                     f"only to other TCP NICs: give it an RDMA port, or use RAILOVER_TRANSPORT=auto "
                                     f"to leave it out")
            else:
                status, fix = INFO, ""
            out.append(Check("rdma", n["nic"], status, f"no RDMA: {n.get('why', '')}{fate}{seen}", fix))
    t, why = r.get("transport"), r.get("transport_why", "")
    out.extend(_unused_port_checks(r.get("unused_ports", []), t, setting, ifaces))
    if t == "error":
        out.append(Check("rdma", "RAILOVER_TRANSPORT", FAIL, f"NCCL init would fail: {why}",
                         "fix the NICs above, or set RAILOVER_TRANSPORT=auto (TCP where RDMA is not usable)"))
    else:
        # the plugin's why (its init log line) names the setting first: said once, not twice
        why = why[len(f"RAILOVER_TRANSPORT={setting}: "):] if why.startswith(f"RAILOVER_TRANSPORT={setting}: ") else why
        out.append(Check("rdma", "RAILOVER_TRANSPORT", OK if t == "rdma" or setting == "tcp" else INFO,
                         f"RAILOVER_TRANSPORT={setting}: the job would use {t} ({why})"))
    mem = r.get("memory", {}).get("ptr_support", [])
    gd = r.get("gpudirect", {})
    facts = ["NVIDIA driver " + ("loaded" if gd.get("nvidia_driver") else "not loaded"),
             f"peer-memory module: {gd['peermem']}" if gd.get("peermem") else "no peer-memory module (nvidia-peermem)"]
    for d in gd.get("dmabuf", []):
        sup = d.get("supported")
        facts.append(f"dmabuf on {d.get('hca')}: " + ("supported" if sup else "unknown" if sup is None else "not supported")
                     + (f" ({d['detail']})" if d.get("detail") else ""))
    cuda = any(p in mem for p in ("CUDA", "DMABUF"))
    if t == "error":
        what = "not evaluated: NCCL init would fail (RAILOVER_TRANSPORT above)"
    elif cuda:
        what = "railover registers GPU memory (ptrSupport " + "|".join(mem) + ")"
    elif t == "tcp":
        what = ("not used: the job would use the tcp transport, which registers host memory only "
                "(GPUDirect needs the rdma transport); NCCL stages GPU buffers through host memory")
    else:
        what = ("not used: railover registers host memory only (ptrSupport " + ("|".join(mem) or "none") +
                "): no GPU peer-memory client and no HCA that takes dmabufs; NCCL stages GPU buffers "
                "through host memory")
    out.append(Check("rdma", "GPUDirect RDMA", INFO, what + ". This host: " + "; ".join(facts)))
    memory = r.get("memory", {})
    if "relaxed_ordering" in memory and t in ("rdma", "rdma+tcp"):  # plugins before it have no key
        out.append(Check("rdma", "relaxed ordering", INFO,
                         ("on" if memory["relaxed_ordering"] else "off") + ": " + memory.get("relaxed_ordering_why", "")))
    return out


def _unused_port_checks(ports: Sequence[Mapping[str, Any]], transport: Optional[str], setting: Optional[str] = None,
                        ifaces: Optional[Sequence[Iface]] = None) -> List[Check]:
    """Checks for the HCA ports no selected NIC uses (the report's ``unused_ports``). An ACTIVE
    one is a WARN when ``auto`` (or ``rdma+tcp``) would fall back to TCP (RDMA sits idle beside
    it: typically InfiniBand without IPoIB, which railover cannot use) unless NCCL_IB_HCA
    excludes it, exactly as the plugin's init WARNs; INFO when the job uses RDMA on other ports, or when
    ``RAILOVER_TRANSPORT=tcp`` asks for TCP whatever the ports (the plugin says nothing then, and
    no fix would make it use them). Ports that are not ACTIVE share one INFO line. An interface
    on the port that has no address (``ifaces``: an IPoIB interface the driver made but nobody
    configured) is named as needing one: the plugin sees only interfaces with an address."""
    out: List[Check] = []
    idle = []
    addressed = None if ifaces is None else {i.name for i in ifaces if i.addrs}
    for p in ports:
        name = f"{p.get('hca')} port {p.get('port')}"
        if p.get("state") != "ACTIVE":
            idle.append(f"{name} ({p.get('link_layer')}, {p.get('state')})")
            continue
        why = p.get("why", "")
        netdevs = p.get("netdevs", [])
        if why.startswith("excluded by NCCL_IB_HCA"):
            fix = ""
        elif why.startswith("InfiniBand port without an IPoIB interface"):
            fix = (f"configure IPoIB on {name} (an interface with an IP address) and select it, or leave this port "
                   f"to NCCL's own IB transport")
        elif netdevs and "have no IP address" in why:  # the plugin found no address on any of them
            fix = (f"give {', '.join(netdevs)} an IP address (IPoIB / the port's interface), then select it "
                   f"(RAILOVER_IFNAMES or NCCL_SOCKET_IFNAME) if the job should use it")
        elif netdevs and "not among the selected NICs" in why:
            bare = [n for n in netdevs if addressed is not None and n not in addressed]
            if bare:
                fix = (f"{', '.join(bare)} has no IP address, so the plugin cannot select it: give it one (IPoIB / the "
                       f"port's interface) and add {', '.join(netdevs)} to RAILOVER_IFNAMES (or NCCL_SOCKET_IFNAME) "
                       f"if the job should use it")
            else:
                fix = f"add {', '.join(netdevs)} to RAILOVER_IFNAMES (or NCCL_SOCKET_IFNAME) if the job should use it"
        else:
            fix = ""
        excluded = why.startswith("excluded by NCCL_IB_HCA")
        if setting == "tcp":  # TCP asked for: nothing about the port changes that
            fix = ""
        # WARN exactly where the plugin's init WARNs (idleRdmaPortsWarning): auto or rdma+tcp
        # falling back to TCP beside this ACTIVE port, unless NCCL_IB_HCA excludes it.
        status = WARN if transport == "tcp" and setting != "tcp" and not excluded else INFO
        out.append(Check("rdma", name, status, f"unused ({p.get('link_layer')}, ACTIVE): {why}", fix))
    if idle:
        out.append(Check("rdma", "other HCA ports", INFO, "unused and not ACTIVE: " + ", ".join(idle)))
    return out


def _split_rails(env: Mapping[str, str]) -> List[Tuple[str, str]]:
    env = effective_env(env)
    if "RAILOVER_RAILS" not in env:
        return []
    out = []
    for item in _split(env["RAILOVER_RAILS"], ","):
        kv = _split(item, "=")
        if len(kv) == 2:
            out.append((kv[0], kv[1]))
    return out
