#include "examples/common/trace_view.h"

#include <algorithm>
#include <cstdio>

#include "actors/trace_packed.h"

namespace fd {
namespace {

// Kinds in pipeline order; unknown kinds come last, alphabetically.
int kind_rank(const std::string& kind) {
  static const char* const order[] = {"scheduler", "mini_batch", "micro_batch", "gpu_stream",
                                      "shard"};
  for (int i = 0; i < 5; ++i)
    if (kind == order[i]) return i;
  return 5;
}

std::string num(double v) {
  char buf[32];
  if (v == static_cast<double>(static_cast<int64_t>(v)) && v < 1e12 && v > -1e12)
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  else if (v >= 100 || v <= -100)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string fixed(const char* fmt, double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

template <class Map>
void remember(Map& m, std::vector<std::string>& order, const std::string& key) {
  if (m.find(key) == m.end()) order.push_back(key);
}

}  // namespace

TraceView::Track& TraceView::track(const std::string& node, const std::string& name,
                                   const std::string& kind) {
  Track& t = tracks_[{node, name}];
  t.kind = kind;
  t.node = node;
  return t;
}

TraceView::SpanStats& TraceView::span(Track& t, const std::string& name) {
  remember(t.spans, t.span_order, name);
  return t.spans[name];
}

double& TraceView::arg_sum(SpanStats& s, const std::string& arg) {
  remember(s.arg_sum, s.arg_order, arg);
  return s.arg_sum[arg];
}

void TraceView::add(const trace_event& e) {
  ++events_;
  Track& t = track(e.node.empty() ? std::string(kLocalNode) : e.node, e.track, e.kind);
  const size_t n = std::min(e.arg_names.size(), e.arg_values.size());
  if (e.ph == 'C') {
    remember(t.counters, t.counter_order, e.name);
    auto& values = t.counters[e.name];
    for (size_t i = 0; i < n; ++i) {
      auto it = std::find_if(values.begin(), values.end(),
                             [&](const auto& kv) { return kv.first == e.arg_names[i]; });
      if (it == values.end()) values.emplace_back(e.arg_names[i], e.arg_values[i]);
      else it->second = e.arg_values[i];
    }
    return;
  }
  SpanStats& s = span(t, e.name);
  ++s.count;
  s.dur_us += static_cast<double>(e.dur_us);
  for (size_t i = 0; i < n; ++i) arg_sum(s, e.arg_names[i]) += e.arg_values[i];
}

void TraceView::add_spans(const trace_packed& p,
                          const std::map<int32_t, std::string>& shard_nodes) {
  // The few actors of the message, each resolved to its figures once.
  struct Slot {
    uint8_t kind;
    int32_t actor;
    SpanStats* stats;
    std::vector<double*> sums;  // [args]
  };
  std::vector<Slot> slots;
  const size_t n = span_count(p);
  for (size_t i = 0; i < n; ++i) {
    const PackedSpan s = span_at(p, i);
    if (s.kind >= kSpanKinds) continue;
    auto slot = std::find_if(slots.begin(), slots.end(), [&](const Slot& x) {
      return x.kind == s.kind && x.actor == s.actor;
    });
    if (slot == slots.end()) {
      const auto kind = static_cast<SpanKind>(s.kind);
      Track& t = track(span_node(s, shard_nodes), span_track(s), span_actor_kind(kind));
      Slot x{s.kind, s.actor, &span(t, span_name(kind)), {}};
      for (const std::string& arg : span_arg_names(kind)) x.sums.push_back(&arg_sum(*x.stats, arg));
      slot = slots.insert(slots.end(), std::move(x));
    }
    ++events_;
    ++slot->stats->count;
    slot->stats->dur_us += static_cast<double>(std::max<int32_t>(0, s.dur_us));
    for (size_t a = 0; a < slot->sums.size(); ++a) *slot->sums[a] += span_arg(s, a);
  }
}

std::string TraceView::render(double window_s, const std::string& title) {
  using Key = std::pair<std::string, std::string>;  // (node, track)
  std::vector<Key> names;
  for (auto& [key, t] : tracks_) names.push_back(key);
  // By kind, then node, then track.
  std::stable_sort(names.begin(), names.end(), [&](const Key& a, const Key& b) {
    const int ra = kind_rank(tracks_[a].kind), rb = kind_rank(tracks_[b].kind);
    if (ra != rb) return ra < rb;
    if (tracks_[a].kind != tracks_[b].kind) return tracks_[a].kind < tracks_[b].kind;
    return a < b;
  });
  size_t node_width = 4, width = 10;
  for (auto& [node, track] : names) {
    node_width = std::max(node_width, node.size());
    width = std::max(width, track.size());
  }

  double tokens = 0, steps = 0;
  for (auto& [name, t] : tracks_) {
    if (t.kind != "mini_batch") continue;
    auto it = t.spans.find("step");
    if (it == t.spans.end()) continue;
    steps += it->second.count;
    // Each sequence of a step samples one token: "seqs" counts them when "tokens" is absent.
    const auto& sums = it->second.arg_sum;
    auto tk = sums.find("tokens");
    if (tk == sums.end()) tk = sums.find("seqs");
    if (tk != sums.end()) tokens += tk->second;
  }
  std::string out = title + "   window " + fixed("%.1f", window_s) + " s   " +
                    std::to_string(events_) + " events\n";
  out += "tokens/s " + fixed("%.1f", tokens / window_s) + "   steps/s " +
         fixed("%.1f", steps / window_s) + "\n";
  if (names.empty()) out += "\n(no trace events yet)\n";
  else out += "\n  node" + std::string(node_width - 2, ' ') + "actor\n";
  std::string kind;
  for (auto& key : names) {
    Track& t = tracks_[key];
    const std::string& name = key.second;
    if (t.kind != kind) {
      kind = t.kind;
      out += "\n" + kind + "\n";
    }
    std::string head = "  " + t.node + std::string(node_width - t.node.size() + 2, ' ') + name +
                       std::string(width - name.size() + 2, ' ');
    const std::string pad(head.size(), ' ');
    bool first = true;
    auto line = [&](const std::string& text) {
      out += (first ? head : pad) + text + "\n";
      first = false;
    };
    for (auto& sn : t.span_order) {
      const SpanStats& s = t.spans[sn];
      if (s.count == 0) {
        line(sn + ": idle");
        continue;
      }
      const double busy = std::min(1.0, s.dur_us / 1e6 / window_s);
      std::string text = sn + ": " + fixed("%.1f", s.count / window_s) + "/s  " +
                         fixed("%.2f", s.dur_us / 1e3 / s.count) + " ms each  busy " +
                         fixed("%.0f", busy * 100) + "%  idle " +
                         fixed("%.0f", (1 - busy) * 100) + "%";
      if (t.kind != "mini_batch" && steps > 0)
        text += "  " + fixed("%.2f", s.dur_us / 1e3 / steps) + " ms/step";
      for (auto& an : s.arg_order) text += "  " + an + " " + num(s.arg_sum.at(an) / s.count);
      line(text);
    }
    for (auto& cn : t.counter_order) {
      std::string text = cn + ":";
      for (auto& [an, v] : t.counters[cn]) text += "  " + an + " " + num(v);
      line(text);
    }
    if (first) line("");
  }
  for (auto& [name, t] : tracks_)
    for (auto& [sn, s] : t.spans) {
      s.count = 0;
      s.dur_us = 0;
      for (auto& kv : s.arg_sum) kv.second = 0;
    }
  return out;
}

}  // namespace fd
