// Two C functions besides NCCL's ncclNetPlugin_v* symbols, for railover's own Python tools
// (railover.params loads the plugin with ctypes; the .so is the one artefact present both in
// an installed wheel and in a build tree, and it describes exactly the code NCCL will run).
// NCCL never calls them; they start nothing (no threads, no init).
#include <cstddef>
#include <cstring>
#include <string>

#include "common/config.h"
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
