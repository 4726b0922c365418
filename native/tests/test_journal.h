// The journal file a test binary writes its links' events to (a temp file per process, named
// after the suite and the process id) is removed when the binary exits, unless a test failed:
// then it is kept for the post-mortem and its path is printed. ctest runs every test in a
// process of its own, so without this a run left ~500 files in the temp directory.
// Header only; gtest and POSIX only (the engine-only binary includes it).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace railover {
namespace testbed {

inline std::string& journalToRemove() {
  static std::string path;
  return path;
}

// Removes `path` now and at exit (std::atexit) unless a test of the binary failed. Call once
// the path is known, before the journal is opened: a file kept by an earlier failed process
// that had the same pid would otherwise be appended to, and its old lines read as this run's
// (seen once: a test read path_up lines of a build 10 hours older). A later call replaces the
// path.
inline void removeJournalAtExit(const std::string& path) {
  static bool registered = false;
  unlink(path.c_str());
  journalToRemove() = path;
  if (registered) return;
  registered = true;
  std::atexit([] {
    const std::string& p = journalToRemove();
    if (p.empty()) return;
    if (::testing::UnitTest::GetInstance()->Failed()) fprintf(stderr, "railover test journal kept: %s\n", p.c_str());
    else unlink(p.c_str());
  });
}

}  // namespace testbed
}  // namespace railover
