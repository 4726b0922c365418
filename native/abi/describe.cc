// Four C functions besides NCCL's ncclNetPlugin_v* symbols, for railover's own Python tools
// (railover.params loads the plugin with ctypes; the .so is the one artefact present both in
// an installed wheel and in a build tree, and it describes exactly the code NCCL will run).
// NCCL never calls them; they start nothing (no threads, no init).
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "abi/nccl_net_abi.h"
#include "common/config.h"
#include "plugin/rdma_report.h"
#include "telemetry/describe.h"

#define RO_EXPORT extern "C" __attribute__((visibility("default")))

// railover's parameter table and journal events as JSON (shape: telemetry/describe.h). The
// string is built once and lives as long as the process; thread-safe.
RO_EXPORT const char* railover_describe_json(void) {
  static const std::string* s = new std::string(railover::describeJson());
  return s->c_str();
}

// Checks the value of one variable with the plugin's own parser. Returns 1 when valid (an
// empty value is valid: it means "unset"), 0 when not, with the message (naming the variable
// and the accepted values) copied, NUL-terminated and possibly cut, into err[errlen].
// Thread-safe.
RO_EXPORT int railover_check_param(const char* name, const char* value, char* err, size_t errlen) {
  std::string e;
  if (!name) e = "no variable name given";
  else if (railover::checkParam(name, value ? value : "", &e)) return 1;
  if (err && errlen) {
    size_t n = e.size() < errlen - 1 ? e.size() : errlen - 1;
    memcpy(err, e.data(), n);
    err[n] = 0;
  }
  return 0;
}

namespace {

// Variables read from `env`, a NULL-terminated array of "NAME=VALUE" strings (NULL: this
// process's environment). The array must outlive the lookup.
railover::EnvLookup envOf(const char* const* env) {
  if (!env) return railover::processEnv();
  return [env](const char* k) -> const char* {
    size_t n = strlen(k);
    for (const char* const* e = env; *e; ++e)
      if (strncmp(*e, k, n) == 0 && (*e)[n] == '=') return *e + n + 1;
    return nullptr;
  };
}

}  // namespace

// Checks the whole configuration as the plugin's init parses it: every variable (as
// railover_check_param does) and the rules between variables (NCCL_IB_ADDR_RANGE's family
// against NCCL_IB_ADDR_FAMILY), which no single variable's check sees. `env` as in
// railover_rdma_report_json. Returns 1 when init would accept it, 0 when not, with init's
// message (naming the variable) copied, NUL-terminated and possibly cut, into err[errlen].
// Thread-safe.
RO_EXPORT int railover_check_config(const char* const* env, char* err, size_t errlen) {
  railover::Config cfg;
  std::string e;
  if (railover::parseConfig(envOf(env), &cfg, &e)) return 1;
  if (err && errlen) {
    size_t n = e.size() < errlen - 1 ? e.size() : errlen - 1;
    memcpy(err, e.data(), n);
    err[n] = 0;
  }
  return 0;
}

// What the RDMA transport would do on this host (`railover doctor`): JSON of the shape in
// plugin/rdma_report.h, from the plugin's own parser, NIC discovery, port/GID choice and auto
// rule. `nic_names_csv`: comma-separated NIC names to evaluate (NULL or "" = the plugin's own
// NIC discovery). `env`: a NULL-terminated array of "NAME=VALUE" strings the variables are read
// from (NULL = this process's environment). Starts no thread, does not call init; opens and
// closes the HCAs it inspects (can take a few ms per HCA). The string stays valid until the
// next call on the same thread. Thread-safe.
RO_EXPORT const char* railover_rdma_report_json(const char* nic_names_csv, const char* const* env) {
  static thread_local std::string out;
  std::vector<std::string> nics;
  if (nic_names_csv) {
    std::string s(nic_names_csv), cur;
    for (size_t i = 0; i <= s.size(); ++i) {
      if (i == s.size() || s[i] == ',') {
        if (!cur.empty()) nics.push_back(cur);
        cur.clear();
      } else if (s[i] != ' ' && s[i] != '\t') {
        cur += s[i];
      }
    }
  }
  out = railover::rdmaReportJson(nics, envOf(env));
  return out.c_str();
}
