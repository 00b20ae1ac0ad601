// The live view of fastdecode-trace: per-track figures of the events received in the last
// window (spans) and the latest values of every counter, one row per actor with the node it
// lives on in its own column.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "actors/messages.h"

namespace fd {

class TraceView {
 public:
  void add(const trace_event& e);
  // The spans of p, as add() of each of unpack_spans(p) would count them, without building
  // events: a few lookups per message, not per span. shard_nodes must already know p's table.
  void add_spans(const trace_packed& p, const std::map<int32_t, std::string>& shard_nodes);
  // The text of the window that ends now and lasted window_s seconds; starts the next window.
  // Spans give, per track and span name: rate, mean duration, busy and idle fractions and the
  // mean of each numeric argument, and for tracks other than mini-batches the time per
  // mini-batch step; the "tokens" (else "seqs") arguments of mini-batch steps give tokens/s.
  std::string render(double window_s, const std::string& title);
  uint64_t events() const { return events_; }

 private:
  struct SpanStats {
    uint64_t count = 0;
    double dur_us = 0;                      // summed
    std::map<std::string, double> arg_sum;  // argument -> sum over the spans
    std::vector<std::string> arg_order;     // arguments in first-seen order
  };
  struct Track {
    std::string kind;
    std::string node;
    std::map<std::string, SpanStats> spans;  // this window
    std::vector<std::string> span_order;
    std::map<std::string, std::vector<std::pair<std::string, double>>> counters;  // latest
    std::vector<std::string> counter_order;
  };
  Track& track(const std::string& node, const std::string& name, const std::string& kind);
  SpanStats& span(Track& t, const std::string& name);
  double& arg_sum(SpanStats& s, const std::string& arg);

  std::map<std::pair<std::string, std::string>, Track> tracks_;  // (node, track) ->
  uint64_t events_ = 0;
};

}  // namespace fd
