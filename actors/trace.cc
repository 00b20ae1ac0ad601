#include <chrono>
#include <cstring>

#include "actors/trace_packed.h"

namespace fd {

int64_t trace_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const std::vector<std::string>& span_arg_names(SpanKind kind) {
  static const std::vector<std::string> names[kSpanKinds] = {
      {"rows", "seqs", "micro_batches", "s_ms", "r_ms", "comm_ms", "kv_tokens"},
      {"rows"},
      {"layer", "rtt_ms"},
  };
  return names[static_cast<int>(kind)];
}

const char* span_actor_kind(SpanKind kind) {
  static const char* const kinds[kSpanKinds] = {"mini_batch", "gpu_stream", "shard"};
  return kinds[static_cast<int>(kind)];
}

const char* span_name(SpanKind kind) {
  static const char* const names[kSpanKinds] = {"step", "S", "R"};
  return names[static_cast<int>(kind)];
}

double span_arg(const PackedSpan& s, size_t i) {
  // Which arguments are milliseconds sent as microseconds, per kind (bit i: argument i).
  static const unsigned ms_args[kSpanKinds] = {0x38, 0x0, 0x2};
  const bool ms = s.kind < kSpanKinds && ((ms_args[s.kind] >> i) & 1u);
  return ms ? s.args[i] / 1e3 : double(s.args[i]);
}

size_t span_count(const trace_packed& p) { return p.spans.size() / sizeof(PackedSpan); }

PackedSpan span_at(const trace_packed& p, size_t i) {
  PackedSpan s;
  std::memcpy(&s, p.spans.data() + i * sizeof(PackedSpan), sizeof s);
  return s;
}

void learn_shard_nodes(const trace_packed& p, std::map<int32_t, std::string>& shard_nodes) {
  for (size_t k = 0; k < p.shard_ids.size() && k < p.shard_nodes.size(); ++k)
    if (!p.shard_nodes[k].empty()) shard_nodes[p.shard_ids[k]] = p.shard_nodes[k];
}

std::string mini_batch_track(int32_t index) { return "mini_batch-" + std::to_string(index); }
std::string stream_track(int32_t index) { return "gpu_stream-" + std::to_string(index); }
std::string shard_track(int32_t id) { return "shard " + std::to_string(id); }

std::string span_track(const PackedSpan& s) {
  switch (static_cast<SpanKind>(s.kind)) {
    case SpanKind::step: return mini_batch_track(s.actor);
    case SpanKind::s: return stream_track(s.actor);
    case SpanKind::r: return shard_track(s.actor);
  }
  return "?";
}

const std::string& span_node(const PackedSpan& s,
                             const std::map<int32_t, std::string>& shard_nodes) {
  static const std::string local = kLocalNode;
  if (static_cast<SpanKind>(s.kind) != SpanKind::r) return local;
  auto it = shard_nodes.find(s.actor);
  return it == shard_nodes.end() ? local : it->second;
}

void unpack_spans(const trace_packed& p, std::map<int32_t, std::string>& shard_nodes,
                  std::vector<trace_event>& out) {
  learn_shard_nodes(p, shard_nodes);
  const size_t n = span_count(p);
  out.reserve(out.size() + n);
  for (size_t i = 0; i < n; ++i) {
    const PackedSpan s = span_at(p, i);
    if (s.kind >= kSpanKinds) continue;
    const auto kind = static_cast<SpanKind>(s.kind);
    trace_event e;
    e.kind = span_actor_kind(kind);
    e.name = span_name(kind);
    e.node = span_node(s, shard_nodes);
    e.track = span_track(s);
    e.ph = 'X';
    e.ts_us = s.ts_us;
    e.dur_us = s.dur_us < 0 ? 0 : s.dur_us;
    e.arg_names = span_arg_names(kind);
    e.arg_values.resize(e.arg_names.size());
    for (size_t a = 0; a < e.arg_values.size(); ++a) e.arg_values[a] = span_arg(s, a);
    out.push_back(std::move(e));
  }
}

}  // namespace fd
