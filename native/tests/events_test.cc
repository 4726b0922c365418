// Unit tests: the journal's typed emitters write every declared event with exactly its
// declared fields, in order, with values of the declared JSON types; the self-description
// lists every parameter and event.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/params.h"
#include "telemetry/describe.h"
#include "telemetry/events.h"
#include "telemetry/journal.h"

using namespace railover;

namespace {

// A flat JSON object's members: (key, raw value text). Enough for journal lines, whose values
// are strings, integers and booleans.
bool flatMembers(const std::string& s, std::vector<std::pair<std::string, std::string>>* out) {
  size_t i = 0;
  auto str = [&](std::string* v) {
    if (s[i] != '"') return false;
    size_t start = i++;
    while (i < s.size() && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
    if (i >= s.size()) return false;
    *v = s.substr(start, ++i - start);
    return true;
  };
  if (s.empty() || s[i++] != '{') return false;
  while (i < s.size()) {
    std::string k, v;
    if (!str(&k) || s[i++] != ':') return false;
    if (s[i] == '"') {
      if (!str(&v)) return false;
    } else {
      size_t start = i;
      while (i < s.size() && s[i] != ',' && s[i] != '}') ++i;
      v = s.substr(start, i - start);
    }
    out->emplace_back(k.substr(1, k.size() - 2), v);
    if (s[i] == '}') return i + 1 == s.size();
    if (s[i++] != ',') return false;
  }
  return false;
}

bool isInt(const std::string& v) { return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos; }

bool hasType(const std::string& v, const char* type) {
  std::string t = eventFieldJsonType(type);
  if (t == "string") return v.size() >= 2 && v.front() == '"';
  if (t == "comm") return v.size() >= 3 && v.front() == '"' && isInt(v.substr(1, v.size() - 2));
  if (t == "integer" || t == "integer?") return isInt(v);
  if (t == "boolean") return v == "true" || v == "false";
  return false;
}

// Sample values by field type; the string has characters JSON must escape.
std::string sample_Str() { return "eth\"0\\\n"; }
uint64_t sample_U64() { return 42; }
uint64_t sample_Comm() { return 18446744073709551615ull; }
bool sample_Bool() { return true; }
uint64_t sample_OptU64() { return 7; }

}  // namespace

TEST(Journal, EveryEventIsWrittenWithItsDeclaredFields) {
  char path[] = "/tmp/railover-events-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    FileJournal j(path);
    ASSERT_TRUE(j.enabled());
    EXPECT_EQ(j.path(), path);
    // Every declared event, through its emitter (generated from the declaration itself).
#define SAMPLE_FIRST(n, t, m) sample_##t()
#define SAMPLE_NEXT(n, t, m) , sample_##t()
#define EMIT(name, meaning) j.name(RO_EVENT_FIELDS_##name(SAMPLE_FIRST, SAMPLE_NEXT));
    RAILOVER_JOURNAL_EVENTS(EMIT)
#undef EMIT
    // An optional field left out.
    j.path_down(1u, "recv", "eth1", "10.0.0.2", "reset", false, std::nullopt);
  }  // closes the file

  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  unlink(path);
  ASSERT_EQ(lines.size(), kEventCount + 1);
  for (size_t i = 0; i < kEventCount; ++i) {
    const EventSpec& e = kEvents[i];
    SCOPED_TRACE(lines[i]);
    std::vector<std::pair<std::string, std::string>> m;
    ASSERT_TRUE(flatMembers(lines[i], &m));
    ASSERT_EQ(m.size(), 3 + e.nFields);
    EXPECT_EQ(m[0].first, "t_us");
    EXPECT_TRUE(isInt(m[0].second));
    EXPECT_EQ(m[1].first, "pid");
    EXPECT_EQ(m[1].second, std::to_string(getpid()));
    EXPECT_EQ(m[2].first, "event");
    EXPECT_EQ(m[2].second, std::string("\"") + e.name + "\"");
    for (size_t j = 0; j < e.nFields; ++j) {
      EXPECT_EQ(m[3 + j].first, e.fields[j].name);
      EXPECT_TRUE(hasType(m[3 + j].second, e.fields[j].type)) << e.fields[j].name << " " << e.fields[j].type;
      if (std::string(e.fields[j].type) == "Str") {
        EXPECT_EQ(m[3 + j].second, "\"eth\\\"0\\\\\\u000a\"");
      }
      if (std::string(e.fields[j].type) == "Comm") {
        EXPECT_EQ(m[3 + j].second, "\"18446744073709551615\"");
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> m;
  ASSERT_TRUE(flatMembers(lines.back(), &m));
  ASSERT_EQ(m.size(), 3 + 6u);  // path_down without detection_us
  EXPECT_EQ(m.back().first, "active");
  EXPECT_EQ(m.back().second, "false");
}

TEST(Journal, EmittersAreSilentWhenTheJournalIsOff) {
  FileJournal off("");  // RAILOVER_EVENT_LOG unset
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.path(), "");
  off.failover(1u, "eth1", "10.0.0.2", 5u, 0u, 100u);  // must not crash or write anywhere
  FileJournal unopenable("/nonexistent-railover-dir/x/journal.jsonl");
  EXPECT_FALSE(unopenable.enabled());
  unopenable.failover(1u, "eth1", "10.0.0.2", 5u, 0u, 100u);
}

// The line format the Python readers and docs/OPERATIONS.md depend on, byte for byte (t_us
// aside): the common fields, then the event's fields in declaration order; an optional field
// left out is absent.
TEST(Journal, LinesKeepTheirExactFormat) {
  MemoryJournal j;
  j.failover(1u, "eth1", "10.0.0.2", 5u, 0u, 100u);
  j.path_down(18446744073709551615ull, "recv", "eth\"1", "10.0.0.2", "reset", false, std::nullopt);
  j.pair_up("eth0", "10.0.1.2", 12u, 3u);
  std::vector<std::string> lines = j.lines();
  ASSERT_EQ(lines.size(), 3u);
  const std::string pid = std::to_string(getpid());
  auto withoutTime = [](const std::string& l) {
    size_t a = l.find("\"t_us\":"), b = l.find(',');
    return a == 1 && b != std::string::npos ? "{" + l.substr(b + 1) : "(no t_us first): " + l;
  };
  EXPECT_EQ(withoutTime(lines[0]), "{\"pid\":" + pid +
                                       ",\"event\":\"failover\",\"comm\":\"1\",\"to_nic\":\"eth1\",\"peer\":\"10.0.0.2\","
                                       "\"resumed_seq\":5,\"bytes_resent\":0,\"convergence_us\":100}\n");
  EXPECT_EQ(withoutTime(lines[1]), "{\"pid\":" + pid +
                                       ",\"event\":\"path_down\",\"comm\":\"18446744073709551615\",\"dir\":\"recv\","
                                       "\"nic\":\"eth\\\"1\",\"peer\":\"10.0.0.2\",\"cause\":\"reset\",\"active\":false}\n");
  EXPECT_EQ(withoutTime(lines[2]), "{\"pid\":" + pid +
                                       ",\"event\":\"pair_up\",\"nic\":\"eth0\",\"peer\":\"10.0.1.2\",\"down_for_us\":12,"
                                       "\"probes_while_down\":3}\n");
  EXPECT_EQ(j.events("failover").size(), 1u);
  EXPECT_EQ(j.events("path_down").size(), 1u);
  EXPECT_EQ(j.events("path_up").size(), 0u);
}

// A file journal writes the same bytes a memory journal keeps; "%p" in the path is the pid,
// and a directory gets railover-<pid>.jsonl inside.
TEST(Journal, FileAndMemoryJournalsWriteTheSameLines) {
  char dir[] = "/tmp/railover-journal-dir-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string pid = std::to_string(getpid());
  MemoryJournal mem;
  std::vector<std::string> files;
  {
    FileJournal inDir(dir);
    FileJournal named(std::string(dir) + "/j-%p.jsonl");
    ASSERT_TRUE(inDir.enabled() && named.enabled());
    EXPECT_EQ(inDir.path(), std::string(dir) + "/railover-" + pid + ".jsonl");
    EXPECT_EQ(named.path(), std::string(dir) + "/j-" + pid + ".jsonl");
    files = {inDir.path(), named.path()};
    for (Journal* j : std::initializer_list<Journal*>{&inDir, &named, &mem}) {
      j->nic_down("eth0", "carrier");
      j->flap(7u, "eth1", 2u, 400u);
    }
  }
  auto strip = [](std::string l) { return l.substr(l.find(',')); };  // t_us differs
  std::vector<std::string> want = mem.lines();
  ASSERT_EQ(want.size(), 2u);
  for (const std::string& f : files) {
    std::ifstream in(f);
    std::vector<std::string> got;
    for (std::string l; std::getline(in, l);) got.push_back(l + "\n");
    unlink(f.c_str());
    ASSERT_EQ(got.size(), want.size()) << f;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(strip(got[i]), strip(want[i])) << f;
  }
  rmdir(dir);
}

// A relative RAILOVER_EVENT_LOG is the job's working directory's: path() (what the state file
// names for `railover status`, the exporter and the drill, which run elsewhere) is absolute.
// It was the value as given, and the readers looked for the journal in their own directory.
TEST(Journal, ARelativePathIsNamedAbsolute) {
  char dir[] = "/tmp/railover-journal-cwd-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  char old[4096];
  ASSERT_NE(getcwd(old, sizeof old), nullptr);
  ASSERT_EQ(chdir(dir), 0);
  const std::string pid = std::to_string(getpid());
  {
    FileJournal rel("j-%p.jsonl");
    ASSERT_TRUE(rel.enabled());
    EXPECT_EQ(rel.path(), std::string(dir) + "/j-" + pid + ".jsonl");
  }
  {
    // every "%p" is the pid (only the first was: "j-<pid>-%p.jsonl")
    FileJournal twice("j-%p-%p.jsonl");
    EXPECT_EQ(twice.path(), std::string(dir) + "/j-" + pid + "-" + pid + ".jsonl");
    unlink(twice.path().c_str());
  }
  {
    ASSERT_EQ(mkdir("logs", 0755), 0);
    FileJournal relDir("logs/");
    EXPECT_EQ(relDir.path(), std::string(dir) + "/logs/railover-" + pid + ".jsonl");
  }
  ASSERT_EQ(chdir(old), 0);
  unlink((std::string(dir) + "/j-" + pid + ".jsonl").c_str());
  unlink((std::string(dir) + "/logs/railover-" + pid + ".jsonl").c_str());
  rmdir((std::string(dir) + "/logs").c_str());
  rmdir(dir);
}

TEST(Journal, EventNamesAndFieldsAreUniqueAndDescribed) {
  for (size_t i = 0; i < kEventCount; ++i) {
    EXPECT_TRUE(*kEvents[i].meaning) << kEvents[i].name;
    EXPECT_STREQ(eventName((Event)i), kEvents[i].name);
    for (size_t j = i + 1; j < kEventCount; ++j) EXPECT_STRNE(kEvents[i].name, kEvents[j].name);
    for (size_t a = 0; a < kEvents[i].nFields; ++a) {
      const EventFieldSpec& f = kEvents[i].fields[a];
      EXPECT_TRUE(*f.meaning) << kEvents[i].name << "." << f.name;
      EXPECT_STRNE(eventFieldJsonType(f.type), "?");
      for (const char* common : {"t_us", "pid", "event"}) EXPECT_STRNE(f.name, common);
      for (size_t b = a + 1; b < kEvents[i].nFields; ++b) EXPECT_STRNE(f.name, kEvents[i].fields[b].name);
    }
  }
}

TEST(Describe, ListsEveryParameterAndEvent) {
  std::string d = describeJson();
  std::vector<std::pair<std::string, std::string>> m;
  for (const ParamSpec& p : kParams) EXPECT_NE(d.find(std::string("{\"name\":\"") + p.name + "\""), std::string::npos) << p.name;
  for (const EventSpec& e : kEvents) EXPECT_NE(d.find(std::string("{\"name\":\"") + e.name + "\""), std::string::npos) << e.name;
}
