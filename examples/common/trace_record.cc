#include "examples/common/trace_record.h"

#include <cerrno>
#include <cmath>
#include <cstring>

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
  if (!f_) return;
  auto p = pids_.find(e.kind);
  if (p == pids_.end()) {
    p = pids_.emplace(e.kind, static_cast<int>(pids_.size()) + 1).first;
    write("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(p->second) +
          ",\"tid\":0,\"args\":{\"name\":" + json_string(e.kind) + "}}");
  }
  auto t = tids_.find(e.track);
  if (t == tids_.end()) {
    t = tids_.emplace(e.track, static_cast<int>(tids_.size()) + 1).first;
    write("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(p->second) +
          ",\"tid\":" + std::to_string(t->second) + ",\"args\":{\"name\":" +
          json_string(e.track) + "}}");
  }
  const bool counter = e.ph == 'C';
  std::string obj = "{\"name\":" + json_string(counter ? e.track + " " + e.name : e.name) +
                    ",\"cat\":" + json_string(e.kind) +
                    ",\"ph\":" + json_string(std::string(1, e.ph)) +
                    ",\"ts\":" + std::to_string(e.ts_us) + ",\"pid\":" +
                    std::to_string(p->second) + ",\"tid\":" + std::to_string(t->second);
  if (e.ph == 'X') obj += ",\"dur\":" + std::to_string(e.dur_us);
  obj += ",\"args\":{";
  const size_t n = std::min(e.arg_names.size(), e.arg_values.size());
  for (size_t i = 0; i < n; ++i) {
    if (i) obj += ',';
    obj += json_string(e.arg_names[i]) + ":" + json_number(e.arg_values[i]);
  }
  obj += "}}";
  write(obj);
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
