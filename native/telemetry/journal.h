// JSON-lines event journal (RAILOVER_EVENT_LOG): one object per line with "t_us"
// (CLOCK_MONOTONIC µs, the test bed's clock), "pid" and "event", then the event's fields:
//   {"t_us":12,"pid":345,"event":"failover","comm":"678","to_nic":"eth1",...}
// The events and their fields are declared in telemetry/events.h; lines are written only
// through the typed emitters of a Journal, one method per event (journal->failover(...)).
//
// There is no process-wide journal: the runtime owns the process's (a FileJournal on
// RAILOVER_EVENT_LOG) and hands it to every link (LinkDeps::journal) and to the health
// monitor; a test passes its own (a MemoryJournal, or a FileJournal on a temp file) and reads
// what its links wrote without touching any process global.
//
// Thread-safety: the emitters may be called from any thread at once; each line is written
// whole. Lifetime: a journal must outlive every link and thread it was handed to.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "telemetry/events.h"

namespace railover {

class Journal {
 public:
  virtual ~Journal() = default;
  // Whether lines go anywhere; the emitters build nothing when they do not.
  virtual bool enabled() const = 0;

  // The emitters: <event>(values of its fields, in declaration order), e.g.
  // failover(comm, to_nic, peer, resumed_seq, bytes_resent, convergence_us).
#define RO_JOURNAL_PARAM_FIRST(n, t, m) ::railover::jarg::t f_##n
#define RO_JOURNAL_PARAM_NEXT(n, t, m) , ::railover::jarg::t f_##n
#define RO_JOURNAL_PUT(n, t, m) ::railover::jarg::put(&fields, #n, f_##n);
#define RO_JOURNAL_EMITTER(name, meaning)                                            \
  void name(RO_EVENT_FIELDS_##name(RO_JOURNAL_PARAM_FIRST, RO_JOURNAL_PARAM_NEXT)) { \
    if (!enabled()) return;                                                          \
    std::string fields;                                                              \
    RO_EVENT_FIELDS_##name(RO_JOURNAL_PUT, RO_JOURNAL_PUT)                           \
    emit(::railover::Event::name, fields);                                           \
  }
  RAILOVER_JOURNAL_EVENTS(RO_JOURNAL_EMITTER)
#undef RO_JOURNAL_EMITTER
#undef RO_JOURNAL_PUT
#undef RO_JOURNAL_PARAM_NEXT
#undef RO_JOURNAL_PARAM_FIRST

 protected:
  // One whole line (ending in '\n'). Called from any thread; must be thread-safe.
  virtual void writeLine(const std::string& line) = 0;

 private:
  // Writes one line: the common fields, "event", then `fields` (a JSON fragment built by
  // jarg::put, starting with a comma).
  void emit(Event e, const std::string& fields);
};

// The journal in a file, as RAILOVER_EVENT_LOG asks: each line is one write(2) on an O_APPEND
// descriptor, so several processes may share the file.
class FileJournal final : public Journal {
 public:
  // Opens `path` for appending ("%p" replaced by the pid; a directory gets
  // railover-<pid>.jsonl inside). Empty path: the journal is off. A file that cannot be
  // opened: off, with one WARN naming it.
  explicit FileJournal(const std::string& path);
  ~FileJournal() override;  // closes the file
  FileJournal(const FileJournal&) = delete;
  FileJournal& operator=(const FileJournal&) = delete;
  bool enabled() const override { return fd_ >= 0; }
  // the file written, absolute ("" when off): '%p' replaced, a directory's railover-<pid>.jsonl,
  // a relative path taken from the working directory at construction
  const std::string& path() const { return path_; }

 protected:
  void writeLine(const std::string& line) override;

 private:
  int fd_ = -1;
  std::string path_;
};

// The journal in memory, for tests: keeps every line (unbounded). Thread-safe.
class MemoryJournal final : public Journal {
 public:
  bool enabled() const override { return true; }
  std::vector<std::string> lines() const;  // every line so far, in order, each ending in '\n'
  // The lines whose "event" is `name`, in order.
  std::vector<std::string> events(const std::string& name) const;

 protected:
  void writeLine(const std::string& line) override;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

std::string jsonStr(const std::string& s);  // quoted, escaped JSON string

}  // namespace railover
