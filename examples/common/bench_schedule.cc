#include "examples/common/bench_schedule.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "actors/trace_packed.h"
#include "caf/all.hpp"
#include "examples/common/json.h"
#include "examples/common/list_options.h"
#include "examples/common/stats.h"
#include "examples/common/trace_record.h"
#include "runtime/error.h"
#include "runtime/load_control.h"
#include "runtime/sim_backend.h"

namespace po = boost::program_options;

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;

struct Collected {
  std::mutex mu;
  std::vector<trace_event> events;
};

trace_sink::behavior_type collector(trace_sink::pointer, std::shared_ptr<Collected> out) {
  auto nodes = std::make_shared<std::map<int32_t, std::string>>();  // shard id -> node
  return {[out](trace_batch& b) {
            std::lock_guard<std::mutex> lock(out->mu);
            for (auto& e : b.events) out->events.push_back(std::move(e));
          },
          [out, nodes](trace_packed& p) {
            std::lock_guard<std::mutex> lock(out->mu);
            unpack_spans(p, *nodes, out->events);
          }};
}

size_t event_count(Collected& c) {
  std::lock_guard<std::mutex> lock(c.mu);
  return c.events.size();
}

double arg(const trace_event& e, const char* name) {
  for (size_t i = 0; i < e.arg_names.size() && i < e.arg_values.size(); ++i)
    if (e.arg_names[i] == name) return e.arg_values[i];
  return 0;
}

// Total length of the union of [t0, t1) intervals clipped to [lo, hi), in the intervals' unit.
double union_length(std::vector<std::pair<int64_t, int64_t>> iv, int64_t lo, int64_t hi) {
  std::sort(iv.begin(), iv.end());
  double total = 0;
  int64_t cur0 = 0, cur1 = INT64_MIN;
  for (auto [a, b] : iv) {
    a = std::max(a, lo);
    b = std::min(b, hi);
    if (b <= a) continue;
    if (a > cur1) {
      if (cur1 > cur0) total += double(cur1 - cur0);
      cur0 = a;
      cur1 = b;
    } else {
      cur1 = std::max(cur1, b);
    }
  }
  if (cur1 > cur0) total += double(cur1 - cur0);
  return total;
}

// device: the simulated S-part's profile, or null for a backend whose device time is unknown.
void collect_steps(const std::vector<trace_event>& events, ScheduleRunResult& run,
                   const SimProfile* device) {
  std::vector<const trace_event*> steps;
  std::vector<std::pair<int64_t, int64_t>> s_iv;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> r_iv;  // by shard track
  for (const trace_event& e : events) {
    if (e.ph != 'X') continue;
    if (e.kind == "mini_batch" && e.name == "step") steps.push_back(&e);
    if (e.kind == "gpu_stream" && e.name == "S") s_iv.emplace_back(e.ts_us, e.ts_us + e.dur_us);
    if (e.kind == "shard" && e.name == "R") r_iv[e.track].emplace_back(e.ts_us, e.ts_us + e.dur_us);
  }
  if (steps.empty()) return;
  std::stable_sort(steps.begin(), steps.end(),
                   [](const trace_event* a, const trace_event* b) { return a->ts_us < b->ts_us; });
  int64_t lo = steps.front()->ts_us, hi = lo;
  std::vector<int64_t> next_step;  // [minis] the next step number of each mini-batch
  for (const trace_event* e : steps) {
    ScheduleStep s;
    const std::string prefix = "mini_batch-";
    s.mini = e->track.rfind(prefix, 0) == 0 ? std::atoi(e->track.c_str() + prefix.size()) : 0;
    if (next_step.size() <= size_t(s.mini)) next_step.resize(s.mini + 1, 0);
    s.step = next_step[s.mini]++;
    s.t0_ms = double(e->ts_us - lo) / 1e3;
    s.latency_ms = double(e->dur_us) / 1e3;
    s.s_ms = arg(*e, "s_ms");
    s.r_ms = arg(*e, "r_ms");
    s.load = int64_t(arg(*e, "kv_tokens"));
    s.seqs = int(arg(*e, "seqs"));
    s.rows = int(arg(*e, "rows"));
    hi = std::max(hi, e->ts_us + e->dur_us);
    run.steps.push_back(s);
  }
  run.window_ms = double(hi - lo) / 1e3;
  // Busy and idle over the middle half of the run: the pipeline fills during the first steps
  // and drains during the last ones, where one side waits whatever the schedule.
  const int64_t a = lo + (hi - lo) / 4, b = lo + 3 * (hi - lo) / 4;
  run.steady_from_ms = double(a - lo) / 1e3;
  run.steady_ms = double(b - a) / 1e3;
  if (device) {
    // The simulated device works N·T(rows) per step, within the S spans; a span also holds the
    // hand-overs and the wait for the other mini-batch's S-part, so its union overstates the
    // device's work whenever a stream thread wakes late (a loaded machine).
    run.s_busy_ms = 0;
    for (const ScheduleStep& st : run.steps) {
      const double end = st.t0_ms + st.latency_ms;
      if (end >= run.steady_from_ms && end < run.steady_from_ms + run.steady_ms)
        run.s_busy_ms += 1e3 * run.layers * device->layer_seconds(st.rows);
    }
    run.s_busy_ms = std::min(run.s_busy_ms, run.steady_ms);
  } else {
    run.s_busy_ms = union_length(std::move(s_iv), a, b) / 1e3;
  }
  // Each shard is a worker of the R side: its busy time is the mean over shards, so a shard
  // waiting for a slower one counts as idle. A shard serves one request at a time, so its busy
  // time is the sum of its compute spans; their union would lose the overlap that a late reply
  // gives two back-to-back spans (where a span lies is only estimated from the reply's arrival).
  run.r_busy_ms = 0;
  for (auto& [track, iv] : r_iv)
    for (auto [t0, t1] : iv) run.r_busy_ms += double(std::max<int64_t>(0, std::min(t1, b) - std::max(t0, a))) / 1e3;
  run.shards = int(r_iv.size());
  if (run.shards > 0) run.r_busy_ms /= run.shards;
}

}  // namespace

ScheduleRunResult run_schedule(std::shared_ptr<const Model> model, const LocalOptions& opt,
                               const std::vector<gen_request>& reqs, int threads) {
  ScheduleRunResult run;
  run.schedule = opt.scheduled ? schedule_name(opt.schedule.kind) : "continuous";
  auto got = std::make_shared<Collected>();
  {
    caf::actor_system_config cfg;
    configure_caf(cfg, threads);
    caf::actor_system sys{cfg};
    LocalOptions o = opt;
    o.log = false;
    LocalNode node = start_local_node(sys, model, o);
    auto sink = sys.spawn(collector, got);
    {
      // The stats round trip returns after the subscription was handled, so every step traces.
      caf::scoped_actor self{sys};
      self->send(node.scheduler, subscribe_atom::value, sink);
      self->request(node.scheduler, std::chrono::seconds(30), stats_atom::value)
          .receive([](sched_stats&) {},
                   [&](caf::error& e) { throw Error("the scheduler did not answer: " + sys.render(e)); });
    }
    const auto t0 = Clock::now();
    run.results = generate(sys, node.scheduler, reqs, std::chrono::minutes(30));
    run.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    // The last steps' spans leave their mini-batch up to kTraceFlush after the answers; wait
    // until nothing arrives.
    for (size_t n = event_count(*got);;) {
      std::this_thread::sleep_for(2 * kTraceFlush + std::chrono::milliseconds(50));
      const size_t m = event_count(*got);
      if (m == n) break;
      n = m;
    }
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
    stop_local_node(node);
  }
  for (const gen_result& r : run.results) run.generated += int64_t(r.tokens.size());
  run.layers = model->cfg.n_layers;
  if (opt.backend == "sim") {
    const SimProfile device = load_sim_profile(opt.sim_profile);
    collect_steps(got->events, run, &device);
  } else {
    collect_steps(got->events, run, nullptr);
  }
  run.events = std::move(got->events);
  return run;
}

ScheduleSummary summarize(const ScheduleRunResult& run) {
  ScheduleSummary s;
  double load_sum = 0;
  for (const ScheduleStep& st : run.steps) {
    s.peak_load = std::max(s.peak_load, st.load);
    load_sum += double(st.load);
    s.peak_step_ms = std::max(s.peak_step_ms, st.latency_ms);
  }
  if (!run.steps.empty()) s.mean_load = load_sum / double(run.steps.size());
  if (run.wall_s > 0) s.tokens_per_s = double(run.generated) / run.wall_s;
  if (run.steady_ms > 0) {
    s.s_idle_frac = std::max(0.0, 1 - run.s_busy_ms / run.steady_ms);
    s.r_idle_frac = std::max(0.0, 1 - run.r_busy_ms / run.steady_ms);
    // Each sequence of a step generates one token.
    const double a = run.steady_from_ms, b = a + run.steady_ms;
    double tokens = 0, s_ms = 0, r_ms = 0;
    int n = 0;
    for (const ScheduleStep& st : run.steps) {
      const double end = st.t0_ms + st.latency_ms;
      if (end < a || end >= b) continue;
      tokens += st.seqs;
      s_ms += st.s_ms;
      r_ms += st.r_ms;
      ++n;
    }
    s.steady_tokens_per_s = tokens / (run.steady_ms / 1e3);
    if (n > 0 && run.layers > 0) {
      s.s_layer_ms = s_ms / (double(n) * run.layers);
      s.r_layer_ms = r_ms / (double(n) * run.layers);
      s.r_compute_layer_ms = run.r_busy_ms / (double(n) * run.layers);
    }
  }
  return s;
}

std::vector<gen_request> make_schedule_requests(int n, int max_new, int vocab, int32_t bos,
                                               uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<gen_request> out(n);
  for (int i = 0; i < n; ++i) {
    const int len = 2 + int(rng() % (kMaxSchedulePrompt - 1));  // 2..8 tokens
    out[i].prompt.push_back(bos);
    while (int(out[i].prompt.size()) < len) out[i].prompt.push_back(3 + int32_t(rng() % (vocab - 3)));
    out[i].max_new = max_new;
    out[i].tag = uint64_t(i);
  }
  return out;
}

std::shared_ptr<Model> schedule_model(const ModelConfig& mc, const std::string& backend, uint64_t seed) {
  if (backend != "sim") {
    auto m = std::make_shared<Model>(make_random_model(mc, seed));
    m->vocab.eos = -1;  // every request runs its S steps, as in the paper's model
    return m;
  }
  ModelConfig tiny = mc;  // the vocabulary of the shape, with weights of a minimal model
  tiny.n_layers = 1;
  tiny.dim = tiny.ff = 16;
  tiny.n_heads = tiny.n_kv_heads = 1;
  tiny.head_dim = 16;
  auto m = std::make_shared<Model>(make_random_model(tiny, seed));
  m->cfg = mc;
  m->tok_embd.clear();
  m->layers.clear();
  m->out_norm.clear();
  m->output.clear();
  m->vocab.eos = -1;
  return m;
}

LocalOptions schedule_node_options(const ModelConfig& mc, const std::string& backend,
                                   const std::string& sim_profile, int shards, int pipeline,
                                   const ScheduleConfig& schedule) {
  LocalOptions base;
  base.backend = backend;
  base.sim_profile = sim_profile;
  base.shards = shards;
  base.pipeline = pipeline;
  base.scheduled = true;
  base.schedule = schedule;
  base.max_batch = std::max(base.max_batch, schedule.batch * pipeline);
  // Room for B sequences of the longest length per mini-batch, in 16-token pages, twice over.
  const size_t token_bytes = size_t(mc.n_layers) * 2 * mc.kv_width() * sizeof(uint16_t);
  const size_t seq_tokens =
      size_t((kMaxSchedulePrompt + schedule.seq_len) / base.block_tokens + 2) * base.block_tokens;
  base.kv_memory = std::max<size_t>(
      size_t(64) << 20, 2 * size_t(schedule.batch) * pipeline * seq_tokens * token_bytes / shards);
  return base;
}

namespace {

struct Options {
  bool json = false;
  std::string out_dir = ".";
  std::string sim_profile = "examples/profiles/a10-llama7b.txt";
  std::string backend = "sim";
  std::vector<std::string> schedules = {"large-batch", "sls", "load-control"};
  std::vector<ScheduleKind> kinds;  // [schedules] parsed
  int batch = 64, seq_len = 128, interval = 8, micro_batch = 0, pipeline = 1, shards = 2;
  int64_t load_limit = 0;
  int requests = 0;  // 0: 4·B per mini-batch
  // Sampling and the next step's set-up are paid once per step, not per layer: with 2 layers they
  // weighed 16 times what they do in the 32-layer model of the A10 profile, and cost sls 4 % of
  // its throughput against large-batch (1.13 of it instead of 1.22 with 4 layers).
  int dim = 4096, heads = 32, kv_heads = 32, ff = 11008, layers = 4, vocab = 512;
  int threads = 2;
  int attn_threads = 0;  // the node's attention threads, shared by its shards; 0: all cores
  std::string sim_scale = "1";  // factor on the profile's T(B), or "balance"
  bool balance = false;         // sim_scale is "balance"
  double sim_factor = 1;        // sim_scale as a number, when not balance
  int repeat = 1;               // rounds over the schedules
  bool trace = false;           // write each schedule's first-round spans as a Chrome trace
  uint64_t seed = 1;
};

bool parse_options(int argc, char** argv, Options& o) {
  std::string schedules = "large-batch,sls,load-control";
  po::options_description desc("fastdecode-bench schedule [options]");
  desc.add_options()("help,h", "this help")
      ("json", po::bool_switch(&o.json), "one JSON object per schedule per line")
      ("out-dir", po::value(&o.out_dir)->default_value(o.out_dir),
       "where schedule_steps.csv, schedule_latency.svg and schedule_load.svg go")
      ("schedules", po::value(&schedules)->default_value(schedules), "comma-separated schedules")
      ("trace", po::bool_switch(&o.trace),
       "also write trace_<schedule>.json to --out-dir: the first round's actor spans (Perfetto)")
      ("backend", po::value(&o.backend)->default_value(o.backend), "S-part: sim or cpu")
      ("sim-profile", po::value(&o.sim_profile)->default_value(o.sim_profile), "T(B) profile")
      ("batch", po::value(&o.batch)->default_value(o.batch), "B, sequences per mini-batch")
      ("max-len", po::value(&o.seq_len)->default_value(o.seq_len), "S, tokens generated per request")
      ("interval", po::value(&o.interval)->default_value(o.interval), "F, steps between micro-batches")
      ("micro-batch", po::value(&o.micro_batch)->default_value(0), "M (0: B*F/S)")
      ("load-limit", po::value(&o.load_limit)->default_value(0), "W_lim in tokens (0: B(S+F)/2 + B * mean prompt + 2 sd of B prompts' sum)")
      ("pipeline", po::value(&o.pipeline)->default_value(o.pipeline), "mini-batches in flight, 1 to 4")
      ("requests", po::value(&o.requests)->default_value(0), "requests (0: 4*B*pipeline)")
      ("shards", po::value(&o.shards)->default_value(o.shards), "R-worker shards")
      ("dim", po::value(&o.dim)->default_value(o.dim), "random model: embedding width")
      ("heads", po::value(&o.heads)->default_value(o.heads), "random model: query heads")
      ("kv-heads", po::value(&o.kv_heads)->default_value(o.kv_heads), "random model: K/V heads")
      ("ff", po::value(&o.ff)->default_value(o.ff), "random model: MLP width")
      ("layers", po::value(&o.layers)->default_value(o.layers), "random model: layers")
      ("vocab", po::value(&o.vocab)->default_value(o.vocab), "random model: vocabulary")
      ("threads", po::value(&o.threads)->default_value(o.threads), "actor scheduler threads")
      ("attn-threads", po::value(&o.attn_threads)->default_value(o.attn_threads),
       "attention threads shared by the shards (0: all cores; fewer leave cores to the S side's "
       "actors, as R-workers on other nodes would)")
      ("sim-scale", po::value(&o.sim_scale)->default_value(o.sim_scale),
       "factor on the profile's T(B), or 'balance': pilot sls runs measure the device's and the "
       "shards' work, and T is scaled to make them equal (corrected by a pilot before each round)")
      ("repeat", po::value(&o.repeat)->default_value(o.repeat),
       "rounds over the schedules, interleaved so that all see the same machine; medians reported")
      ("seed", po::value(&o.seed)->default_value(o.seed), "model and prompt seed");
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
  if (vm.count("help")) {
    std::cout << desc;
    return false;
  }
  po::notify(vm);
  o.schedules = split_list(schedules, "schedules");
  o.kinds.resize(o.schedules.size());
  for (size_t i = 0; i < o.schedules.size(); ++i)
    if (!parse_schedule(o.schedules[i], &o.kinds[i]))
      throw Error("--schedules takes large-batch, sls or load-control, not '" + o.schedules[i] + "'.");
  for (size_t i = 0; i < o.schedules.size(); ++i)  // results and ratios are kept by name
    if (std::count(o.schedules.begin(), o.schedules.begin() + i, o.schedules[i]) > 0)
      throw Error("--schedules names '" + o.schedules[i] + "' twice.");
  if (o.pipeline < 1 || o.pipeline > 4) throw Error("--pipeline must be 1 to 4.");
  if (o.batch < 1 || o.seq_len < 1 || o.interval < 1 || o.layers < 1 || o.shards < 1)
    throw Error("--batch, --max-len, --interval, --layers and --shards must be positive.");
  if (o.heads < 1 || o.kv_heads < 1 || o.dim % o.heads || o.heads % o.kv_heads)
    throw Error("--dim must be a multiple of --heads, and --heads a multiple of --kv-heads.");
  if (o.repeat < 1) throw Error("--repeat must be at least 1.");
  check_count(o.threads, "threads", 1, kMaxCafThreads);
  check_count(o.attn_threads, "attn-threads", 0, machine_cores());
  check_count(o.shards, "shards", 1, kMaxShards);
  o.balance = o.sim_scale == "balance";
  if (o.balance) {
    if (o.backend != "sim") throw Error("--sim-scale balance needs --backend sim.");
  } else {
    char* end = nullptr;
    o.sim_factor = std::strtod(o.sim_scale.c_str(), &end);
    if (end == o.sim_scale.c_str() || *end != '\0' || !(o.sim_factor > 0))
      throw Error("--sim-scale takes a positive factor or 'balance', not '" + o.sim_scale + "'.");
  }
  return true;
}

// Writes `p` with every T(B) multiplied by k, for the runs to read.
std::string write_scaled_profile(const SimProfile& p, double k, const std::string& dir) {
  const std::string path = dir + "/schedule_profile.txt";
  std::ofstream f(path);
  f << "# every T(B) multiplied by " << k << " by fastdecode-bench schedule\n"
    << format_sim_profile(p.scaled(k));
  if (!f) throw Error("cannot write " + path + ".");
  return path;
}

// The paper balances S- and R-part by choosing P ≈ B·S·R / (2·T(B)) (equ:cpucon); this
// machine's cores are fixed, so T is scaled instead. A pilot sls run at factor k measures, over
// its steady window, how long the device and the shards work, and k is corrected until they work
// equally long (sls keeps the R-load flat, so one factor holds for the whole steady state), in at
// most `pilots` runs. From k = 1 the shards alone are busy; in a balanced run they share the
// cores with the device's hand-overs and work more slowly, so the first correction falls short
// by a few percent, and a pilot at the corrected factor measures the shards as the runs see them.
double balance_scale(std::shared_ptr<const Model> model, const LocalOptions& base,
                     const std::vector<gen_request>& reqs, int threads, const SimProfile& profile,
                     const std::string& dir, double k, int pilots) {
  constexpr double kClose = 0.02;  // within the drift of this VM from run to run
  LocalOptions opt = base;
  opt.schedule.kind = ScheduleKind::sls;
  opt.schedule = resolve_schedule(opt.schedule);
  for (int i = 0; i < pilots; ++i) {
    opt.sim_profile = write_scaled_profile(profile, k, dir);
    const ScheduleRunResult pilot = run_schedule(model, opt, reqs, threads);
    for (const gen_result& r : pilot.results)
      if (!r.error.empty()) throw Error("a request of the pilot run failed: " + r.error);
    if (!(pilot.s_busy_ms > 0) || !(pilot.r_busy_ms > 0))
      throw Error("the pilot run measured no S or R work to balance.");
    const double correction = pilot.r_busy_ms / pilot.s_busy_ms;
    k *= correction;
    if (std::abs(correction - 1) < kClose) break;
  }
  return k;
}

const char* color_of(size_t i) {
  static constexpr const char* kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd"};
  return kColors[i % 4];
}

std::string fmt(double v, int prec = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

// Mini-batch 0's steps of each run: `value` against the step number, one polyline per schedule.
template <class F>
void write_svg(const std::string& path, const std::vector<ScheduleRunResult>& runs, F value,
               const std::string& title, const std::string& y_label) {
  const double W = 900, H = 440, ml = 70, mr = 150, mt = 40, mb = 50;
  double xmax = 1, ymax = 0;
  for (const auto& r : runs)
    for (const auto& s : r.steps)
      if (s.mini == 0) {
        xmax = std::max(xmax, double(s.step));
        ymax = std::max(ymax, value(s));
      }
  ymax = ymax > 0 ? ymax * 1.05 : 1;
  auto X = [&](double x) { return ml + x / xmax * (W - ml - mr); };
  auto Y = [&](double y) { return H - mb - y / ymax * (H - mt - mb); };
  std::ofstream f(path);
  if (!f) throw Error("cannot write " + path + ".");
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << title
    << "</text>\n";
  f << "<line x1=\"" << ml << "\" y1=\"" << H - mb << "\" x2=\"" << W - mr << "\" y2=\"" << H - mb
    << "\" stroke=\"black\"/>\n<line x1=\"" << ml << "\" y1=\"" << mt << "\" x2=\"" << ml
    << "\" y2=\"" << H - mb << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 5; ++i) {
    const double xv = xmax * i / 5, yv = ymax * i / 5;
    f << "<line x1=\"" << X(xv) << "\" y1=\"" << H - mb << "\" x2=\"" << X(xv) << "\" y2=\""
      << H - mb + 5 << "\" stroke=\"black\"/><text x=\"" << X(xv) << "\" y=\"" << H - mb + 18
      << "\" text-anchor=\"middle\">" << fmt(xv, 0) << "</text>\n";
    f << "<line x1=\"" << ml - 5 << "\" y1=\"" << Y(yv) << "\" x2=\"" << W - mr << "\" y2=\""
      << Y(yv) << "\" stroke=\"#ddd\"/><text x=\"" << ml - 8 << "\" y=\"" << Y(yv) + 4
      << "\" text-anchor=\"end\">" << fmt(yv, ymax < 10 ? 1 : 0) << "</text>\n";
  }
  f << "<text x=\"" << (ml + W - mr) / 2 << "\" y=\"" << H - 12
    << "\" text-anchor=\"middle\">step (mini-batch 0)</text>\n"
    << "<text transform=\"translate(18," << (mt + H - mb) / 2
    << ") rotate(-90)\" text-anchor=\"middle\">" << y_label << "</text>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    f << "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" << color_of(i) << "\" points=\"";
    for (const auto& s : runs[i].steps)
      if (s.mini == 0) f << fmt(X(double(s.step)), 1) << "," << fmt(Y(value(s)), 1) << " ";
    f << "\"/>\n";
    const double ly = mt + 10 + 20 * double(i);
    f << "<line x1=\"" << W - mr + 15 << "\" y1=\"" << ly << "\" x2=\"" << W - mr + 40 << "\" y2=\""
      << ly << "\" stroke=\"" << color_of(i) << "\" stroke-width=\"3\"/><text x=\"" << W - mr + 45
      << "\" y=\"" << ly + 4 << "\">" << runs[i].schedule << "</text>\n";
  }
  f << "</svg>\n";
}

void write_csv(const std::string& path, const std::vector<ScheduleRunResult>& runs) {
  std::ofstream f(path);
  if (!f) throw Error("cannot write " + path + ".");
  f << "step,schedule,mini,latency_ms,s_ms,r_ms,load,seqs,rows\n";
  for (const auto& r : runs)
    for (const auto& s : r.steps)
      f << s.step << "," << r.schedule << "," << s.mini << "," << fmt(s.latency_ms, 3) << ","
        << fmt(s.s_ms, 3) << "," << fmt(s.r_ms, 3) << "," << s.load << "," << s.seqs << ","
        << s.rows << "\n";
}

}  // namespace

int bench_schedule_main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) return 0;
  ModelConfig mc;
  mc.n_layers = o.layers;
  mc.dim = o.dim;
  mc.n_heads = o.heads;
  mc.n_kv_heads = o.kv_heads;
  mc.head_dim = o.dim / o.heads;
  mc.ff = o.ff;
  mc.vocab = o.vocab;
  mc.ctx = kMaxSchedulePrompt + o.seq_len + 1;
  // Every request runs its S steps, as in the paper's model: no token ends a sequence early.
  auto model = schedule_model(mc, o.backend, o.seed);

  ScheduleConfig sc;
  sc.batch = o.batch;
  sc.seq_len = o.seq_len;
  sc.interval = o.interval;
  sc.micro_batch = o.micro_batch;
  sc.load_limit = o.load_limit;
  LocalOptions base = schedule_node_options(mc, o.backend, o.sim_profile, o.shards, o.pipeline, sc);
  base.attn_threads = o.attn_threads;

  const int n = o.requests > 0 ? o.requests : 4 * o.batch * o.pipeline;
  const auto reqs = make_schedule_requests(n, o.seq_len, mc.vocab, model->vocab.bos, o.seed);

  double scale = 1;
  SimProfile profile;
  if (o.backend == "sim") {
    profile = load_sim_profile(o.sim_profile);
    if (!o.balance && o.sim_factor != 1) {
      scale = o.sim_factor;
      base.sim_profile = write_scaled_profile(profile, scale, o.out_dir);
    }
  }

  std::vector<ScheduleRunResult> runs;  // the first round's, for the CSV and plots
  std::map<std::string, std::vector<double>> tps, steady;  // by schedule, over the rounds
  for (int round = 0; round < o.repeat; ++round) {
    // The VM's memory speed drifts by 5-10 % within minutes, and an imbalance of 5 % costs sls
    // 2-3 % against large-batch: after the first round's pilots from factor 1, each later round
    // corrects the factor with one pilot of its own.
    if (o.balance) {
      const int pilots = round == 0 ? 3 : 1;
      scale = balance_scale(model, base, reqs, o.threads, profile, o.out_dir, scale, pilots);
      base.sim_profile = write_scaled_profile(profile, scale, o.out_dir);
      if (!o.json)
        std::printf("round %d balanced: T(B) of %s scaled by %.3f (written to %s)\n", round,
                    o.sim_profile.c_str(), scale, base.sim_profile.c_str());
    }
    for (size_t i = 0; i < o.schedules.size(); ++i) {
      const std::string& name = o.schedules[i];
      LocalOptions opt = base;
      opt.schedule.kind = o.kinds[i];
      opt.schedule = resolve_schedule(opt.schedule);
      ScheduleRunResult run = run_schedule(model, opt, reqs, o.threads);
      for (const gen_result& r : run.results)
        if (!r.error.empty()) throw Error("a request failed under " + name + ": " + r.error);
      if (o.trace && round == 0) {
        ChromeTraceWriter trace(o.out_dir + "/trace_" + run.schedule + ".json");
        for (const trace_event& e : run.events) trace.add(e);
        trace.close();
      }
      const ScheduleSummary s = summarize(run);
      tps[name].push_back(s.tokens_per_s);
      steady[name].push_back(s.steady_tokens_per_s);
      if (o.json) {
        JsonLine j;
        j.add("schedule", run.schedule)
            .add("round", int64_t(round))
            .add("batch", int64_t(o.batch))
            .add("seq_len", int64_t(o.seq_len))
            .add("interval", int64_t(o.interval))
            .add("pipeline", int64_t(o.pipeline))
            .add("requests", int64_t(n))
            .add("sim_scale", scale)
            .add("steps", int64_t(run.steps.size()))
            .add("peak_load", s.peak_load)
            .add("mean_load", s.mean_load)
            .add("peak_step_ms", s.peak_step_ms)
            .add("tokens_per_s", s.tokens_per_s)
            .add("steady_tokens_per_s", s.steady_tokens_per_s)
            .add("s_idle_frac", s.s_idle_frac)
            .add("r_idle_frac", s.r_idle_frac)
            .add("s_layer_ms", s.s_layer_ms)
            .add("r_layer_ms", s.r_layer_ms)
            .add("r_compute_layer_ms", s.r_compute_layer_ms)
            .add("wall_s", run.wall_s);
        std::cout << j.str() << std::endl;
      } else {
        std::printf("%-13s steps %5zu  peak W %7lld  mean W %9.1f  peak step %7.2f ms  %8.1f tok/s "
                    "(steady %8.1f)  S idle %5.1f%%  R idle %5.1f%%  S %.2f R %.2f ms/layer  wall %.1f s\n",
                    run.schedule.c_str(), run.steps.size(), static_cast<long long>(s.peak_load),
                    s.mean_load, s.peak_step_ms, s.tokens_per_s, s.steady_tokens_per_s,
                    100 * s.s_idle_frac, 100 * s.r_idle_frac, s.s_layer_ms, s.r_layer_ms, run.wall_s);
        std::fflush(stdout);
      }
      if (round == 0) runs.push_back(std::move(run));
    }
  }
  if (o.repeat > 1) {
    // Medians over the rounds. The ratios compare each schedule with large-batch of the same
    // round (with --sim-scale balance, each round has its own factor), median over the rounds.
    const bool has_lb = tps.count("large-batch") > 0;
    using ByName = std::map<std::string, std::vector<double>>;
    const auto vs_lb = [&](ByName& by, const std::string& name) {
      if (!has_lb) return 0.0;
      std::vector<double> r;
      for (size_t i = 0; i < by[name].size(); ++i) r.push_back(by[name][i] / by["large-batch"][i]);
      return median(r);
    };
    for (const std::string& name : o.schedules) {
      const double t = median(tps[name]), st = median(steady[name]);
      const double vs = vs_lb(tps, name), st_vs = vs_lb(steady, name);
      if (o.json) {
        std::cout << JsonLine()
                         .add("schedule", name)
                         .add("rounds", int64_t(o.repeat))
                         .add("median_tokens_per_s", t)
                         .add("median_steady_tokens_per_s", st)
                         .add("tokens_per_s_vs_large_batch", vs)
                         .add("steady_vs_large_batch", st_vs)
                         .str()
                  << std::endl;
      } else {
        std::printf("%-13s median of %d rounds: %8.1f tok/s (steady %8.1f); vs large-batch %.3f "
                    "(steady %.3f)\n",
                    name.c_str(), o.repeat, t, st, vs, st_vs);
      }
    }
  }
  write_csv(o.out_dir + "/schedule_steps.csv", runs);
  write_svg(o.out_dir + "/schedule_latency.svg", runs,
            [](const ScheduleStep& s) { return s.latency_ms; }, "Latency at each step", "ms");
  write_svg(o.out_dir + "/schedule_load.svg", runs,
            [](const ScheduleStep& s) { return double(s.load); }, "R-part load W at each step",
            "tokens");
  if (!o.json)
    std::printf("wrote %s/schedule_steps.csv, schedule_latency.svg, schedule_load.svg\n",
                o.out_dir.c_str());
  return 0;
}

}  // namespace fd
