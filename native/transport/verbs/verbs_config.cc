#include "transport/verbs/verbs_config.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace railover {
namespace verbs {

const char* gidTypeName(GidType t) {
  switch (t) {
    case GidType::kIb: return "IB";
    case GidType::kRoceV1: return "RoCE v1";
    case GidType::kRoceV2: return "RoCE v2";
    default: return "unknown";
  }
}

namespace {

bool isZero(const uint8_t g[16]) {
  for (int i = 0; i < 16; ++i)
    if (g[i]) return false;
  return true;
}

// fe80::/64 (the first 64 bits fe80:0:0:0), as NCCL tests it.
bool isLinkLocal(const uint8_t g[16]) {
  static const uint8_t ll[8] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0};
  return std::memcmp(g, ll, 8) == 0;
}

std::string addrText(const uint8_t g[16]) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (gidFamily(g) == AF_INET) {
    inet_ntop(AF_INET, g + 12, buf, sizeof buf);
    return std::string("IPv4 ") + buf;
  }
  inet_ntop(AF_INET6, g, buf, sizeof buf);
  return std::string("IPv6 ") + buf;
}

std::string gidText(const uint8_t g[16]) {
  char buf[INET6_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET6, g, buf, sizeof buf);
  return buf;
}

const char* familyName(int f) { return f == AF_INET6 ? "AF_INET6" : "AF_INET"; }
const char* familyWord(int f) { return f == AF_INET6 ? "IPv6" : "IPv4"; }

std::string where(const PortFacts& p) { return p.dev + " port " + std::to_string(p.port); }

// A short list of entries for error messages: "1 ::ffff:10.1.0.1 RoCE v1, 2 ..." (at most 8).
std::string listEntries(const std::vector<const GidEntry*>& es) {
  std::string o;
  size_t n = 0;
  for (const GidEntry* e : es) {
    if (n == 8) {
      o += ", ... (" + std::to_string(es.size()) + " in all)";
      break;
    }
    o += (n++ ? ", " : "") + std::to_string(e->index) + " " + gidText(e->gid) + " " + gidTypeName(e->type);
  }
  return o;
}

std::string readSmallFile(const std::string& path, bool* ok) {
  *ok = false;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n < 0) return "";
  *ok = true;
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// "fe80:0000:...:0001" (8 groups of 4 hex digits, as sysfs writes a GID) -> 16 bytes.
bool parseSysfsGid(const std::string& s, uint8_t out[16]) {
  std::string hex;
  for (char c : s)
    if (c != ':') hex += c;
  if (hex.size() != 32) return false;
  for (int i = 0; i < 16; ++i) {
    unsigned v = 0;
    for (int k = 0; k < 2; ++k) {
      char c = hex[2 * i + k];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else return false;
    }
    out[i] = static_cast<uint8_t>(v);
  }
  return true;
}

GidType typeFromSysfs(const std::string& t, bool roce) {
  if (t.rfind("RoCE v2", 0) == 0) return GidType::kRoceV2;
  if (t.rfind("IB/RoCE v1", 0) == 0 || t.rfind("RoCE v1", 0) == 0) return roce ? GidType::kRoceV1 : GidType::kIb;
  return GidType::kUnknown;
}

// The NIC's first address of `family` as a GID (IPv4 mapped), skipping IPv6 link-local ones.
bool nicAddress(const std::string& netdev, int family, uint8_t out[16]) {
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return false;
  bool found = false;
  for (ifaddrs* p = ifa; p && !found; p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != family || netdev != p->ifa_name) continue;
    std::memset(out, 0, 16);
    if (family == AF_INET) {
      out[10] = out[11] = 0xff;
      std::memcpy(out + 12, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, 4);
      found = true;
    } else {
      std::memcpy(out, &reinterpret_cast<sockaddr_in6*>(p->ifa_addr)->sin6_addr, 16);
      found = !isLinkLocal(out);
    }
  }
  freeifaddrs(ifa);
  return found;
}

// The HCA and port an IPoIB NIC sits on (sysfs: the NIC's device's infiniband/ directory and
// its 0-based dev_port). false for a NIC that is not IPoIB.
bool ipoibPort(const std::string& netdev, std::string* dev, int* port) {
  std::string base = "/sys/class/net/" + netdev;
  DIR* d = opendir((base + "/device/infiniband").c_str());
  if (!d) return false;
  std::string name;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') {
      name = e->d_name;
      break;
    }
  closedir(d);
  if (name.empty()) return false;
  bool ok = false;
  std::string dp = readSmallFile(base + "/dev_port", &ok);
  char* end = nullptr;
  long v = ok ? strtol(dp.c_str(), &end, 10) : 0;
  if (!ok || end == dp.c_str() || v < 0 || v > 254) v = 0;
  *dev = name;
  *port = static_cast<int>(v) + 1;
  return true;
}

struct DevList {
  const VerbsApi& api;
  ibv_device** list = nullptr;
  int n = 0;
  explicit DevList(const VerbsApi& a) : api(a) { list = api.get_device_list(&n); }
  ~DevList() {
    if (list) api.free_device_list(list);
  }
};

}  // namespace

std::vector<std::string> ipoibNetdevs(const std::string& dev, int port) {
  std::vector<std::string> out;
  DIR* d = opendir("/sys/class/net");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string hca;
    int p = 0;
    if (ipoibPort(e->d_name, &hca, &p) && hca == dev && p == port) out.push_back(e->d_name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

int gidFamily(const uint8_t g[16]) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g, mapped, 12) == 0 ? AF_INET : AF_INET6;
}

bool gidInRange(const IbConfig& s, const uint8_t g[16]) {
  if (!s.addrRangeSet) return true;
  int fam = gidFamily(g);
  if (fam != s.addrRangeFamily) return false;
  const uint8_t* a = fam == AF_INET ? g + 12 : g;
  int bits = s.addrRangePrefix;
  for (int i = 0; bits > 0; ++i, bits -= 8) {
    uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
    if ((a[i] & mask) != (s.addrRange[i] & mask)) return false;
  }
  return true;
}

bool chooseGid(const IbConfig& s, const PortFacts& port, const std::vector<GidEntry>& table, GidChoice* out,
               std::string* err) {
  GidChoice c;
  if (!port.roce) {
    c.type = GidType::kIb;
    c.why = where(port) + ": InfiniBand, LID " + std::to_string(port.lid) + " (LID addressing, no GRH" +
            (s.gidIndex >= 0 ? "; NCCL_IB_GID_INDEX=" + std::to_string(s.gidIndex) + " does not apply" : "") + ")";
    *out = c;
    return true;
  }
  auto fill = [&](const GidEntry& e, const std::string& how) {
    c.index = e.index;
    std::memcpy(c.gid, e.gid, 16);
    c.type = e.type;
    c.netdev = e.netdev;
    std::string bound = e.netdev.empty() ? "bound to no NIC" : "bound to " + e.netdev;
    if (!port.netdev.empty() && e.netdev != port.netdev) bound += ", not " + port.netdev;
    c.why = where(port) + " GID " + std::to_string(e.index) + " (" + gidTypeName(e.type) + ", " + addrText(e.gid) +
            ", " + bound + "; " + how + ")";
    *out = c;
  };
  if (s.gidIndex >= 0) {
    std::vector<const GidEntry*> all;
    for (const GidEntry& e : table) {
      if (e.index == s.gidIndex) {
        fill(e, "NCCL_IB_GID_INDEX=" + std::to_string(s.gidIndex));
        return true;
      }
      all.push_back(&e);
    }
    *err = "NCCL_IB_GID_INDEX=" + std::to_string(s.gidIndex) + ": HCA " + where(port) + " has no GID at index " +
           std::to_string(s.gidIndex) + (all.empty() ? " (its GID table is empty)" : " (its GIDs: " + listEntries(all) + ")");
    return false;
  }
  GidType want = s.roceVersion == 1 ? GidType::kRoceV1 : GidType::kRoceV2;
  std::vector<const GidEntry*> bound, fits;
  for (const GidEntry& e : table) {
    if (!port.netdev.empty() && e.netdev != port.netdev) continue;
    bound.push_back(&e);
    if (isZero(e.gid) || isLinkLocal(e.gid) || e.type != want || gidFamily(e.gid) != s.addrFamily ||
        !gidInRange(s, e.gid))
      continue;
    fits.push_back(&e);
  }
  std::string vars = "NCCL_IB_ROCE_VERSION_NUM=" + std::to_string(s.roceVersion) +
                     ", NCCL_IB_ADDR_FAMILY=" + familyName(s.addrFamily) +
                     (s.addrRangeSet ? ", NCCL_IB_ADDR_RANGE=" + s.addrRangeText : "") + ", NCCL_IB_GID_INDEX unset";
  std::string nic = port.netdev.empty() ? std::string() : " bound to " + port.netdev;
  if (fits.empty()) {
    *err = "HCA " + where(port) + " has no " + gidTypeName(want) + " " + familyWord(s.addrFamily) + " GID" + nic +
           (s.addrRangeSet ? " in " + s.addrRangeText : "") + " (" + vars + "); " +
           (bound.empty() ? "no GID is" + (nic.empty() ? std::string(" populated") : nic)
                          : "GIDs" + nic + ": " + listEntries(bound));
    return false;
  }
  std::sort(fits.begin(), fits.end(), [](const GidEntry* a, const GidEntry* b) { return a->index < b->index; });
  const GidEntry* pick = fits.front();
  bool preferred = false;
  if (port.hasPreferred)
    for (const GidEntry* e : fits)
      if (std::memcmp(e->gid, port.preferred, 16) == 0) {
        pick = e;
        preferred = fits.size() > 1;
        break;
      }
  std::string how = "NCCL_IB_GID_INDEX unset";
  if (s.addrRangeSet) how += ", in NCCL_IB_ADDR_RANGE " + s.addrRangeText;
  if (preferred) how += ", the NIC's first address";
  fill(*pick, how);
  return true;
}

bool readGidTableSysfs(const std::string& root, const std::string& dev, int port, bool roce,
                       std::vector<GidEntry>* out, std::string* err) {
  std::string base = root + "/" + dev + "/ports/" + std::to_string(port);
  DIR* d = opendir((base + "/gids").c_str());
  if (!d) {
    *err = "cannot list " + base + "/gids: " + std::strerror(errno);
    return false;
  }
  std::vector<int> idx;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long v = strtol(e->d_name, &end, 10);
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && *end == 0 && v >= 0 && v < (1 << 20))
      idx.push_back(static_cast<int>(v));
  }
  closedir(d);
  std::sort(idx.begin(), idx.end());
  out->clear();
  for (int i : idx) {
    bool ok = false;
    std::string g = readSmallFile(base + "/gids/" + std::to_string(i), &ok);
    GidEntry e;
    e.index = i;
    if (!ok || !parseSysfsGid(g, e.gid) || isZero(e.gid)) continue;  // an empty slot
    std::string t = readSmallFile(base + "/gid_attrs/types/" + std::to_string(i), &ok);
    e.type = ok ? typeFromSysfs(t, roce) : (roce ? GidType::kUnknown : GidType::kIb);
    e.netdev = readSmallFile(base + "/gid_attrs/ndevs/" + std::to_string(i), &ok);
    if (!ok) e.netdev.clear();
    out->push_back(e);
  }
  return true;
}

bool readGidTable(const VerbsApi& api, ibv_context* ctx, const std::string& dev, int port, int tableLen, bool roce,
                  std::vector<GidEntry>* out, std::string* err) {
  out->clear();
  for (int i = 0; i < tableLen; ++i) {
    ibv_gid_entry ge{};
    int rc = api.query_gid_ex(ctx, static_cast<uint32_t>(port), static_cast<uint32_t>(i), &ge, 0, sizeof ge);
    if (rc == ENODATA) continue;  // an empty slot
    if (rc != 0) {
      std::string serr;
      if (readGidTableSysfs("/sys/class/infiniband", dev, port, roce, out, &serr)) return true;
      *err = "ibv_query_gid_ex(" + dev + ", port " + std::to_string(port) + ", index " + std::to_string(i) +
             "): " + std::strerror(rc) + "; sysfs: " + serr;
      return false;
    }
    GidEntry e;
    e.index = i;
    std::memcpy(e.gid, ge.gid.raw, 16);
    if (isZero(e.gid)) continue;
    switch (ge.gid_type) {
      case IBV_GID_TYPE_ROCE_V2: e.type = GidType::kRoceV2; break;
      case IBV_GID_TYPE_ROCE_V1: e.type = GidType::kRoceV1; break;
      case IBV_GID_TYPE_IB: e.type = roce ? GidType::kRoceV1 : GidType::kIb; break;
      default: e.type = GidType::kUnknown;
    }
    char nd[IF_NAMESIZE] = {0};
    if (ge.ndev_ifindex && if_indextoname(ge.ndev_ifindex, nd)) e.netdev = nd;
    out->push_back(e);
  }
  return true;
}

namespace {

// Port facts + GID choice + PortSel for one port of an opened context.
bool choosePort(const VerbsApi& api, ibv_context* ctx, const std::string& dev, int port, const ibv_port_attr& pa,
                const std::vector<GidEntry>& table, const std::string& netdev, const IbConfig& s, PortSel* out,
                std::string* err) {
  PortFacts f;
  f.dev = dev;
  f.port = port;
  f.roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  f.lid = pa.lid;
  f.netdev = netdev;
  if (f.roce && !netdev.empty()) f.hasPreferred = nicAddress(netdev, s.addrFamily, f.preferred);
  GidChoice c;
  if (!chooseGid(s, f, table, &c, err)) return false;
  PortSel ps;
  ps.active = pa.state == IBV_PORT_ACTIVE;
  ps.state = api.port_state_str(pa.state);
  if (!ps.active) *err = "HCA " + dev + " port " + std::to_string(port) + " is " + ps.state + ", not ACTIVE";
  ps.dev = dev;
  ps.netdev = netdev;
  ps.port = port;
  ps.roce = f.roce;
  ps.gidIndex = c.index;
  std::memcpy(ps.gid.raw, c.gid, 16);
  ps.lid = pa.lid;
  ps.activeMtu = pa.active_mtu;
  ps.speedMbps = ps.active ? portSpeedMbps(pa.active_speed, pa.active_width) : 0;  // a DOWN port's rate means nothing
  ps.why = c.why;
  *out = ps;
  return true;
}

}  // namespace

PortChoice choosePortForNetdev(const std::string& netdev, const IbConfig& s, PortSel* out, std::string* err) {
  const VerbsApi* a = verbsApi(err);
  if (!a) return PortChoice::kFailed;
  const VerbsApi& api = *a;
  if (if_nametoindex(netdev.c_str()) == 0) {
    *err = "no network interface named '" + netdev + "'";
    return PortChoice::kFailed;
  }
  DevList dl(api);
  if (!dl.list || dl.n == 0) {
    *err = "no RDMA device found (is an RDMA driver or rdma_rxe loaded, and libibverbs' provider installed?)";
    return PortChoice::kFailed;
  }
  std::string ibDev;
  int ibPort = 0;
  bool ipoib = ipoibPort(netdev, &ibDev, &ibPort);
  std::vector<std::string> excluded, errors, unreadable;  // unreadable: GID tables that could not be read
  PortSel down;  // the first port bound to the NIC that is usable but not ACTIVE now
  std::string downWhy;
  bool haveDown = false;
  for (int d = 0; d < dl.n; ++d) {
    std::string dev = api.get_device_name(dl.list[d]);
    ibv_context* ctx = api.open_device(dl.list[d]);
    if (!ctx) continue;
    ibv_device_attr da{};
    if (api.query_device(ctx, &da) != 0) {
      api.close_device(ctx);
      continue;
    }
    for (int port = 1; port <= da.phys_port_cnt; ++port) {
      ibv_port_attr pa{};
      if (queryPort(api, ctx, static_cast<uint8_t>(port), &pa) != 0) continue;
      bool roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
      std::vector<GidEntry> table;
      bool bound = false;
      if (roce) {
        std::string terr;
        if (!readGidTable(api, ctx, dev, port, pa.gid_tbl_len, roce, &table, &terr)) {
          unreadable.push_back(terr);
          continue;
        }
        for (const GidEntry& e : table) bound = bound || e.netdev == netdev;
      } else {
        bound = ipoib && ibDev == dev && ibPort == port;
      }
      if (!bound) continue;
      if (!s.hca.allows(dev, port)) {
        excluded.push_back(dev + " port " + std::to_string(port));
        continue;
      }
      std::string perr;
      PortSel ps;
      if (choosePort(api, ctx, dev, port, pa, table, netdev, s, &ps, &perr)) {
        if (ps.active) {
          api.close_device(ctx);
          *out = ps;
          return PortChoice::kChosen;
        }
        if (!haveDown) down = ps, downWhy = perr, haveDown = true;  // an ACTIVE one may still come
        continue;
      }
      errors.push_back(perr);
    }
    api.close_device(ctx);
  }
  if (haveDown) {
    *out = down;
    *err = downWhy;
    return PortChoice::kChosenDown;
  }
  if (!errors.empty()) {
    *err = errors.front();
    for (size_t i = 1; i < errors.size(); ++i) *err += "; " + errors[i];
    return PortChoice::kFailed;
  }
  if (!excluded.empty()) {
    *err = "HCA " + excluded.front();
    for (size_t i = 1; i < excluded.size(); ++i) *err += ", " + excluded[i];
    *err += " behind NIC " + netdev + " is excluded by NCCL_IB_HCA='" + s.hcaText + "': no RDMA on this NIC";
    return PortChoice::kExcluded;
  }
  *err = "no RDMA device is bound to NIC " + netdev + " (for Soft-RoCE: rdma link add rxe0 type rxe netdev " + netdev +
         ")";
  for (const std::string& u : unreadable) *err += "; " + u;
  return PortChoice::kFailed;
}

bool reselectGid(Hca& hca, const IbConfig& s, const PortSel& cur, PortSel* out, bool* changed, std::string* err) {
  if (!hca.ok()) {
    *err = "HCA " + hca.name() + " is not open";
    return false;
  }
  const VerbsApi& api = hca.api();
  ibv_port_attr pa{};
  if (queryPort(api, hca.ctx(), static_cast<uint8_t>(cur.port), &pa) != 0) {
    *err = "ibv_query_port(" + cur.dev + ", port " + std::to_string(cur.port) + "): " + std::strerror(errno);
    return false;
  }
  bool roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  std::vector<GidEntry> table;
  if (roce && !readGidTable(api, hca.ctx(), cur.dev, cur.port, pa.gid_tbl_len, roce, &table, err)) return false;
  PortFacts f;
  f.dev = cur.dev;
  f.port = cur.port;
  f.roce = roce;
  f.lid = pa.lid;
  f.netdev = cur.netdev;
  if (roce && !cur.netdev.empty()) f.hasPreferred = nicAddress(cur.netdev, s.addrFamily, f.preferred);
  GidChoice c;
  if (!chooseGid(s, f, table, &c, err)) return false;
  PortSel n = cur;
  n.roce = roce;
  n.gidIndex = c.index;
  std::memcpy(n.gid.raw, c.gid, 16);
  n.lid = pa.lid;
  n.activeMtu = pa.active_mtu;
  n.speedMbps = portSpeedMbps(pa.active_speed, pa.active_width);
  n.why = c.why;
  *changed = n.gidIndex != cur.gidIndex || std::memcmp(n.gid.raw, cur.gid.raw, 16) != 0 || n.lid != cur.lid ||
             n.roce != cur.roce;
  *out = n;
  return true;
}

RcParams rcParamsFor(const IbConfig& s, int commTrafficClass) {
  RcParams p;
  p.timeout = static_cast<int>(s.timeout);
  p.retryCnt = static_cast<int>(s.retryCnt);
  p.pkeyIndex = static_cast<int>(s.pkeyIndex);
  if (s.trafficClassSet) p.trafficClass = static_cast<int>(s.trafficClass);
  else p.trafficClass = commTrafficClass >= 0 && commTrafficClass <= 255 ? commTrafficClass : 0;
  if (s.slSet) p.sl = static_cast<int>(s.sl);
  else p.sl = commTrafficClass >= 0 && commTrafficClass <= 15 ? commTrafficClass : 0;
  return p;
}

bool relaxedOrderingChoice(const IbConfig& s, const VerbsApi* api, std::string* why) {
  const std::string var = "NCCL_IB_PCI_RELAXED_ORDERING=" + std::to_string(s.relaxedOrdering);
  if (s.relaxedOrdering == 0) return *why = var + ": off", false;
  if (!api || !api->reg_mr_iova2) {
    *why = var + (s.relaxedOrdering == 1 ? " asks for it, but" : " (on where capable), but") +
           " this libibverbs has no ibv_reg_mr_iova2 (rdma-core 28 or later): off, as in NCCL";
    return false;
  }
  *why = var + (s.relaxedOrdering == 2 ? " (on where capable)" : "") +
         " and libibverbs has ibv_reg_mr_iova2: NCCL's buffers are registered with IBV_ACCESS_RELAXED_ORDERING "
         "(an HCA without it ignores the flag)";
  return true;
}

bool checkPkeyIndex(Hca& hca, int port, int index, uint16_t* pkey, std::string* err) {
  if (!hca.ok()) {
    *err = "HCA " + hca.name() + " is not open";
    return false;
  }
  const VerbsApi& api = hca.api();
  std::string at = "HCA " + hca.name() + " port " + std::to_string(port);
  ibv_port_attr pa{};
  if (queryPort(api, hca.ctx(), static_cast<uint8_t>(port), &pa) != 0) {
    *err = "ibv_query_port(" + hca.name() + ", port " + std::to_string(port) + "): " + std::strerror(errno);
    return false;
  }
  if (index < 0 || static_cast<uint32_t>(index) >= static_cast<uint32_t>(pa.pkey_tbl_len)) {
    *err = "NCCL_IB_PKEY=" + std::to_string(index) + ": " + at + " has a P_Key table of " +
           std::to_string(pa.pkey_tbl_len) + " entries (NCCL_IB_PKEY is an index into it)";
    return false;
  }
  __be16 be = 0;
  if (api.query_pkey(hca.ctx(), static_cast<uint8_t>(port), index, &be) != 0) {
    *err = "NCCL_IB_PKEY=" + std::to_string(index) + ": ibv_query_pkey(" + hca.name() + ", port " +
           std::to_string(port) + "): " + std::strerror(errno);
    return false;
  }
  uint16_t v = ntohs(be);
  if ((v & 0x7fff) == 0) {
    *err = "NCCL_IB_PKEY=" + std::to_string(index) + ": entry " + std::to_string(index) + " of " + at +
           "'s P_Key table is empty";
    return false;
  }
  *pkey = v;
  return true;
}

}  // namespace verbs
}  // namespace railover
