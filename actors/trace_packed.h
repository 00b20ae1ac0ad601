// Spans in compact form: the mini-batch records each span of a step as one fixed-size record (a
// few stores, no strings, no allocation once its buffer has grown) and sends what it gathered at
// most every kTraceFlush as one raw block (trace_packed). Only the console turns them into
// trace_events, so formatting costs nothing on the serving node.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "actors/messages.h"

namespace fd {

// How long spans wait in a mini-batch before they travel, and how many force an earlier send.
constexpr auto kTraceFlush = std::chrono::milliseconds(100);
constexpr size_t kTraceFlushSpans = 8192;

// What a packed span is; its args, in order, are those of span_arg_names(). Times travel as
// integer microseconds and become the milliseconds of the *_ms arguments on unpacking.
enum class SpanKind : uint8_t {
  step = 0,  // mini-batch step: rows, seqs, micro_batches, s_ms, r_ms, comm_ms, kv_tokens
  s = 1,     // S-part on the mini-batch's GPU stream: rows
  r = 2,     // R-part on a shard: layer, rtt_ms
};
constexpr int kSpanKinds = 3;
constexpr int kSpanArgs = 7;

// One span, copied byte for byte into trace_packed::spans (host byte order: the nodes and the
// console are assumed to share it, as every little-endian machine does).
struct PackedSpan {
  int64_t ts_us = 0;   // microseconds on the gpu node's steady clock
  int32_t dur_us = 0;
  int32_t actor = 0;   // mini-batch index for step and S, the scheduler's shard id for R
  uint8_t kind = 0;    // SpanKind
  uint8_t pad[3] = {};
  int32_t args[kSpanArgs] = {};  // counts, and microseconds for the *_ms arguments
};
static_assert(sizeof(PackedSpan) == 48, "PackedSpan travels as raw bytes");

// The argument names of a span kind, kSpanArgs at most.
const std::vector<std::string>& span_arg_names(SpanKind kind);

// A span kind's actor kind ("mini_batch", "gpu_stream", "shard") and span name ("step", "S", "R").
const char* span_actor_kind(SpanKind kind);
const char* span_name(SpanKind kind);

// The value of argument i of a span: args[i], or args[i] / 1000 for the *_ms arguments.
double span_arg(const PackedSpan& s, size_t i);

// The spans in p, a trailing partial record left out, and the i-th of them.
size_t span_count(const trace_packed& p);
PackedSpan span_at(const trace_packed& p, size_t i);

// Adds p's table of shard nodes to shard_nodes (shard id -> node).
void learn_shard_nodes(const trace_packed& p, std::map<int32_t, std::string>& shard_nodes);

// The track and node of a span: a shard's node from shard_nodes, else kLocalNode.
std::string span_track(const PackedSpan& s);
const std::string& span_node(const PackedSpan& s,
                             const std::map<int32_t, std::string>& shard_nodes);

// The node name of the gpu node's own actors and of shards in its process.
constexpr const char* kLocalNode = "local";

// Track names, shared by the console's live view and recording.
std::string mini_batch_track(int32_t index);  // "mini_batch-<index>"
std::string stream_track(int32_t index);      // "gpu_stream-<index>"
std::string shard_track(int32_t id);          // "shard <id>"

// Appends the trace_events of p's spans to out. Spans of an unknown kind, and a trailing partial
// record (a malformed peer), are skipped. shard_nodes learns p's table first, so a shard that left
// before its spans arrived keeps the node it was last seen on.
void unpack_spans(const trace_packed& p, std::map<int32_t, std::string>& shard_nodes,
                  std::vector<trace_event>& out);

}  // namespace fd
