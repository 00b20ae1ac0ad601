#include "examples/common/trace_record.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include "actors/trace_packed.h"
#include "examples/common/json.h"
#include "runtime/error.h"

namespace fd {

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

ChromeTraceWriter::ChromeTraceWriter(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw Error(path + ": cannot create the trace file (" + std::strerror(errno) + ")");
  std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", f_);
}

ChromeTraceWriter::~ChromeTraceWriter() {
  try {
    close();
  } catch (const Error&) {
  }
}

void ChromeTraceWriter::write(const std::string& obj) {
  if (!f_) return;
  if (!first_) std::fputs(",\n", f_);
  else std::fputs("\n", f_);
  first_ = false;
  std::fwrite(obj.data(), 1, obj.size(), f_);
}

void ChromeTraceWriter::add(const trace_event& e) {
  if (!f_ || (e.ph != 'X' && e.ph != 'C')) return;
  static const std::string local = kLocalNode;
  const std::string& node = e.node.empty() ? local : e.node;
  auto p = procs_.find(node);
  if (p == procs_.end()) {
    p = procs_.emplace(node, Process{static_cast<int>(procs_.size()) + 1, {}}).first;
    write("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(p->second.pid) +
          ",\"tid\":0,\"args\":{\"name\":" + json_string("node " + node) + "}}");
  }
  const int pid = p->second.pid;
  auto t = p->second.tids.find(e.track);
  if (t == p->second.tids.end()) {
    t = p->second.tids.emplace(e.track, next_tid_++).first;
    write("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
          ",\"tid\":" + std::to_string(t->second) + ",\"args\":{\"name\":" +
          json_string("node " + node + " / " + e.track) + "}}");
  }
  const bool counter = e.ph == 'C';
  std::string& o = line_;
  o.clear();
  o += "{\"name\":";
  o += json_string(counter ? e.track + " " + e.name : e.name);
  o += ",\"cat\":";
  o += json_string(e.kind);
  o += ",\"ph\":\"";
  o += e.ph;
  o += "\",\"ts\":";
  o += std::to_string(e.ts_us);
  o += ",\"pid\":";
  o += std::to_string(pid);
  o += ",\"tid\":";
  o += std::to_string(t->second);
  if (e.ph == 'X') {
    o += ",\"dur\":";
    o += std::to_string(e.dur_us);
  }
  o += ",\"args\":{";
  const size_t n = std::min(e.arg_names.size(), e.arg_values.size());
  for (size_t i = 0; i < n; ++i) {
    if (i) o += ',';
    o += json_string(e.arg_names[i]);
    o += ':';
    o += json_number(e.arg_values[i]);
  }
  o += "}}";
  write(o);
  ++events_;
}

void ChromeTraceWriter::close() {
  if (!f_) return;
  std::fputs("\n]}\n", f_);
  const bool ok = std::ferror(f_) == 0;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || !closed) throw Error(path_ + ": writing the trace failed (disk full?)");
}

}  // namespace fd
