// Writes trace events as Chrome Trace Event JSON ({"traceEvents":[...]}), which Perfetto and
// chrome://tracing open. Events are streamed to the file as they come, so a long recording
// needs no memory; close() (or the destructor) ends the JSON, so an interrupted run still leaves
// a valid file.
#pragma once
#include <cstdio>
#include <map>
#include <string>

#include "actors/messages.h"

namespace fd {

class ChromeTraceWriter {
 public:
  // Throws fd::Error when the file cannot be created.
  explicit ChromeTraceWriter(const std::string& path);
  ~ChromeTraceWriter();
  ChromeTraceWriter(const ChromeTraceWriter&) = delete;
  ChromeTraceWriter& operator=(const ChromeTraceWriter&) = delete;

  // One process (pid) per actor kind and one thread (tid) per track, each named by an "M"
  // metadata event the first time it appears. Counters are named "<track> <name>", since Chrome
  // keeps one counter per process and name.
  void add(const trace_event& e);
  // Ends the JSON and closes the file; throws fd::Error when the data did not reach the disk.
  void close();
  size_t events() const { return events_; }

 private:
  void write(const std::string& json_object);

  std::string path_;
  std::FILE* f_ = nullptr;
  bool first_ = true;
  size_t events_ = 0;                // trace events written (metadata not counted)
  std::map<std::string, int> pids_;  // actor kind -> pid
  std::map<std::string, int> tids_;  // track -> tid
};

// A JSON number for v: integral values without a fraction, non-finite ones as null.
std::string json_number(double v);

}  // namespace fd
