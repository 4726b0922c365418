// railover-rdma-report: prints the plugin's RDMA report (railover_rdma_report_json, the JSON
// `railover doctor` shows; shape: native/plugin/rdma_report.h) where Python is not available,
// e.g. inside the RDMA test bed's guests.
//
//   railover-rdma-report PLUGIN.so [NIC,NIC,...]
//
// NIC list empty or absent: the plugin's own NIC discovery. Reads this process's environment
// (RAILOVER_*, NCCL_IB_*). Exit 0 with the JSON on stdout; 2 with a message on stderr when the
// plugin cannot be loaded or lacks the function.
#include <dlfcn.h>
#include <cstdio>

using ReportFn = const char* (*)(const char*, const char* const*);

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s PLUGIN.so [NIC,NIC,...]\n", argv[0]);
    return 2;
  }
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "railover-rdma-report: cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  auto fn = reinterpret_cast<ReportFn>(dlsym(h, "railover_rdma_report_json"));
  if (!fn) {
    fprintf(stderr, "railover-rdma-report: %s has no railover_rdma_report_json (an older build)\n", argv[1]);
    return 2;
  }
  puts(fn(argc == 3 ? argv[2] : "", nullptr));
  return 0;
}
