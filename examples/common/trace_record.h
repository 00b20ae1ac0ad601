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

  // One process (pid) per node, named "node <node>", and one thread (tid) per actor on it,
  // named "node <node> / <track>", each by an "M" metadata event the first time it appears. An
  // event without a node is on "local" (the gpu node); events other than spans ('X') and counters
  // ('C') are skipped. Counters are named "<track> <name>", since Chrome keeps one counter per
  // process and name.
  void add(const trace_event& e);
  // Ends the JSON and closes the file; throws fd::Error when the data did not reach the disk.
  void close();
  size_t events() const { return events_; }

 private:
  struct Process {
    int pid = 0;
    std::map<std::string, int> tids;  // track -> tid
  };
  void write(const std::string& json_object);

  std::string path_;
  std::FILE* f_ = nullptr;
  bool first_ = true;
  size_t events_ = 0;                   // trace events written (metadata not counted)
  int next_tid_ = 1;
  std::map<std::string, Process> procs_;  // node -> its process
  std::string line_;                    // the event being written, reused
};

// A JSON number for v: integral values without a fraction, non-finite ones as null.
std::string json_number(double v);

}  // namespace fd
