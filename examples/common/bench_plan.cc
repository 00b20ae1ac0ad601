#include "examples/common/bench_plan.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "actors/gpu_stream.h"
#include "actors/rworker_shard.h"
#include "actors/system.h"
#include "caf/all.hpp"
#include "examples/common/json.h"
#include "examples/common/list_options.h"
#include "examples/common/stats.h"
#include "runtime/error.h"
#include "runtime/sim_backend.h"

namespace po = boost::program_options;

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Mean tokens a sequence holds over its life: the mean prompt (2..8 tokens) plus half of S.
double mean_seq_tokens(const PlanRunConfig& cfg) {
  return (2.0 + kMaxSchedulePrompt) / 2 + cfg.schedule.seq_len / 2.0;
}

// One S-part request's round trip outside the device: a GPU stream on a zero-time simulated
// device, B rows, layer by layer (the attention output built as the mini-batch builds it).
double measure_s_hop(caf::actor_system& sys, const PlanRunConfig& cfg) {
  const ModelConfig& m = cfg.shape;
  auto backend = std::shared_ptr<const SPartBackend>(
      make_sim_backend(m, parse_sim_profile("1 0\n", "zero-time device")));
  auto stream = spawn_gpu_stream(sys, backend);
  const size_t rows = static_cast<size_t>(cfg.schedule.batch);
  step_tokens in;
  in.tokens.assign(rows, 1);
  in.pos.assign(rows, 1);
  for (size_t r = 0; r < rows; ++r) in.logit_rows.push_back(static_cast<int32_t>(r));
  caf::scoped_actor self{sys};
  std::vector<double> rtt;
  const auto ask = [&](auto msg) {
    const auto t0 = Clock::now();
    self->request(stream, std::chrono::seconds(30), std::move(msg))
        .receive([&](s_output&) { rtt.push_back(since(t0)); },
                 [&](caf::error& e) { throw Error("the calibration GPU stream failed: " + sys.render(e)); });
  };
  const auto start = Clock::now();
  do {
    ask(in);
    for (int32_t l = 0; l < m.n_layers; ++l) {
      layer_o o;
      o.layer = l;
      o.o.assign(rows * m.q_width() * sizeof(float), 0);  // [rows][q_width] f32
      ask(std::move(o));
    }
  } while (since(start) < cfg.min_time || rtt.size() < 20);
  caf::anon_send_exit(stream, caf::exit_reason::user_shutdown);
  return mean(rtt);  // the run pays every hand-over, slow ones included: the mean, not the median
}

struct ShardCosts {
  double hop = 0;    // round trip outside the shard's compute
  double fixed = 0;  // the shard's compute for one-token sequences: append and dispatch
  double empty = 0;  // an empty request's round trip
};

// One shard request per layer for B one-token sequences. With several shards the mini-batch
// gathers each request's payloads from the step's Q/K/V and scatters the replies back, so those
// copies are timed; one shard gets the step's buffers whole and its reply moves back.
ShardCosts measure_shard(caf::actor_system& sys, const PlanRunConfig& cfg) {
  const ModelConfig& m = cfg.shape;
  const size_t rows = static_cast<size_t>(cfg.schedule.batch);
  const size_t qw = m.q_width(), kw = m.kv_width();
  ShardConfig sc{"calibration", KvStoreConfig{m.n_layers, m.n_kv_heads, m.head_dim, 16, size_t(64) << 20},
                 kernels::AttnDims{m.n_heads, m.n_kv_heads, m.head_dim}, 1, {}};
  auto shard = spawn_shard(sys, sc);
  std::vector<float> q(rows * qw, 0.1f), o(rows * qw);  // [rows][qw]
  std::vector<uint16_t> kv(rows * kw, 0x3c00);          // [rows][kw] f16 ones
  caf::scoped_actor self{sys};
  std::vector<double> hop, fixed, empty;
  const auto start = Clock::now();
  for (int i = 0; since(start) < cfg.min_time || hop.size() < 20; ++i) {
    attn_request req;
    req.layer = i % m.n_layers;
    // The first pass places the sequences (position 0 of a sequence starts it afresh: a drop and
    // a reserve); the timed ones rewrite position 1 as a decode step writes its token.
    const int32_t pos = i < m.n_layers ? 0 : 1;
    for (size_t r = 0; r < rows; ++r) req.seqs.push_back(seq_rows{r + 1, pos, 1});
    const bool gather = cfg.shards > 1;
    auto fill = [&] {
      req.q = to_bytes(q.data(), q.size());
      req.k = to_bytes(kv.data(), kv.size());
      req.v = to_bytes(kv.data(), kv.size());
    };
    if (!gather) fill();
    const auto t0 = Clock::now();
    if (gather) fill();
    self->request(shard, std::chrono::seconds(30), std::move(req))
        .receive(
            [&](attn_reply& r) {
              if (gather) std::copy_n(as<float>(r.o), o.size(), o.data());
              const double rtt = since(t0), compute = r.compute_us * 1e-6;
              if (i >= m.n_layers) {  // the first pass reserves the pages
                hop.push_back(std::max(0.0, rtt - compute));
                fixed.push_back(compute);
              }
            },
            [&](caf::error& e) { throw Error("the calibration shard failed: " + sys.render(e)); });
    const auto t1 = Clock::now();
    self->request(shard, std::chrono::seconds(30), stats_atom::value)
        .receive([&](shard_stats&) { empty.push_back(since(t1)); },
                 [&](caf::error& e) { throw Error("the calibration shard failed: " + sys.render(e)); });
  }
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
  return ShardCosts{mean(hop), mean(fixed), mean(empty)};
}

// R on this machine's shards: P shard actors of one thread, each holding the run's mean share of
// sequences (pipeline·B/P) at the run's mean length, all asked at once, layer after layer, for
// one more token of every sequence (append and attention, as in a decode step). Seconds per
// cached token per layer beyond the request's fixed cost `fixed`.
double measure_shard_r(caf::actor_system& sys, const PlanRunConfig& cfg, double fixed) {
  const ModelConfig& m = cfg.shape;
  const int len = static_cast<int>(mean_seq_tokens(cfg));
  const int seqs = std::max(1, cfg.pipeline * cfg.schedule.batch / cfg.shards);
  const size_t qw = m.q_width(), kw = m.kv_width();
  const size_t page = 2 * kw * 16 * sizeof(uint16_t);  // K and V of one 16-token page, one layer
  const size_t capacity = size_t(m.n_layers) * seqs * ((len + 1) / 16 + 2) * page + (size_t(16) << 20);
  std::vector<shard_actor> shards;
  for (int i = 0; i < cfg.shards; ++i)
    shards.push_back(spawn_shard(sys, ShardConfig{"calibration-" + std::to_string(i),
                                                  KvStoreConfig{m.n_layers, m.n_kv_heads, m.head_dim, 16, capacity},
                                                  kernels::AttnDims{m.n_heads, m.n_kv_heads, m.head_dim}, 1, {}}));
  std::vector<float> q(size_t(len) * seqs * qw, 0.1f);     // [rows][qw]
  std::vector<uint16_t> kv(size_t(len) * seqs * kw, 0x3c00);  // [rows][kw] f16 ones
  caf::scoped_actor self{sys};
  // All shards at once; returns each reply's compute seconds.
  const auto round = [&](int32_t layer, int32_t pos0, int32_t n) {
    for (size_t i = 0; i < shards.size(); ++i) {
      attn_request req;
      req.layer = layer;
      for (int s = 0; s < seqs; ++s) req.seqs.push_back(seq_rows{uint64_t(s + 1), pos0, n});
      const size_t rows = size_t(seqs) * n;
      req.q = to_bytes(q.data(), rows * qw);
      req.k = to_bytes(kv.data(), rows * kw);
      req.v = to_bytes(kv.data(), rows * kw);
      self->send(shards[i], std::move(req));
    }
    std::vector<double> out;
    for (size_t i = 0; i < shards.size(); ++i)
      self->receive([&](attn_reply& r) { out.push_back(r.compute_us * 1e-6); },
                    [&](caf::error& e) { throw Error("a calibration shard failed: " + sys.render(e)); });
    return out;
  };
  for (int32_t l = 0; l < m.n_layers; ++l) round(l, 0, len);  // prefill: len tokens per sequence
  std::vector<double> per_token;
  const auto start = Clock::now();
  for (int i = 0; since(start) < cfg.min_time || per_token.size() < 20; ++i)
    for (double t : round(i % m.n_layers, len, 1))  // rewrites token len: attends over len + 1
      per_token.push_back(std::max(0.0, t - fixed) / (double(seqs) * (len + 1)));
  for (auto& sh : shards) caf::anon_send_exit(sh, caf::exit_reason::user_shutdown);
  return mean(per_token);
}

void check(const PlanRunConfig& cfg) {
  const ModelConfig& m = cfg.shape;
  if (m.n_layers < 1 || m.n_heads < 1 || m.n_kv_heads < 1 || m.head_dim < 1 || m.vocab < 4 ||
      m.n_heads % m.n_kv_heads != 0)
    throw Error("The planned run needs a model shape with layers, heads (a multiple of the KV "
                "heads), a head size and a vocabulary.");
  if (cfg.pipeline < 1 || cfg.pipeline > 4 || cfg.shards < 1 || cfg.requests < 0 ||
      cfg.schedule.batch < 1 || cfg.schedule.seq_len < 1 || cfg.schedule.interval < 1)
    throw Error("The planned run needs B, S, F and shards of at least 1 and a pipeline of 1 to 4.");
}

}  // namespace

RunCosts calibrate_run(const PlanRunConfig& config) {
  check(config);
  PlanRunConfig cfg = config;
  cfg.shape.ctx = std::max(cfg.shape.ctx, kMaxSchedulePrompt + cfg.schedule.seq_len + 1);
  RunCosts c;
  c.spart = load_sim_profile(cfg.sim_profile);
  caf::actor_system_config sc;
  configure_caf(sc, cfg.threads);
  caf::actor_system sys{sc};
  c.s_hop_seconds = measure_s_hop(sys, cfg);
  const ShardCosts sh = measure_shard(sys, cfg);
  c.r_hop_seconds = sh.hop;
  c.r_fixed_seconds = sh.fixed;
  c.r_seconds = measure_shard_r(sys, cfg, sh.fixed);
  // A store as large as each shard of the run maps: fresh memory behaves as the run's does.
  const LocalOptions node = schedule_node_options(cfg.shape, "sim", cfg.sim_profile, cfg.shards,
                                                  cfg.pipeline, resolve_schedule(cfg.schedule));
  c.page_touch_seconds = measure_page_first_touch(cfg.shape, node.kv_memory);
  // A step boundary: logits to each micro-batch and its answer, then its rows request and
  // answer: two round trips.
  c.step_seconds = 2 * sh.empty;
  return c;
}

std::vector<gen_request> plan_requests(const PlanRunConfig& cfg, int32_t bos) {
  check(cfg);
  const int n = cfg.requests > 0 ? cfg.requests : 4 * cfg.schedule.batch * cfg.pipeline;
  return make_schedule_requests(n, cfg.schedule.seq_len, cfg.shape.vocab, bos, cfg.seed);
}

RunShape plan_run_shape(const PlanRunConfig& cfg, const std::vector<gen_request>& reqs) {
  check(cfg);
  RunShape r;
  r.n_layers = cfg.shape.n_layers;
  r.pipeline = cfg.pipeline;
  r.workers = cfg.shards;
  r.page_layers = cfg.shape.n_layers;
  r.schedule = resolve_schedule(cfg.schedule);
  for (const gen_request& q : reqs)
    r.requests.push_back(SeqShape{static_cast<int>(q.prompt.size()) - 1, q.max_new});
  return r;
}

PlanVsRun plan_vs_run(const PlanRunConfig& cfg) {
  check(cfg);
  ModelConfig mc = cfg.shape;
  mc.ctx = kMaxSchedulePrompt + cfg.schedule.seq_len + 1;
  auto model = schedule_model(mc, "sim", cfg.seed);
  const auto reqs = plan_requests(cfg, model->vocab.bos);
  PlanVsRun out;
  out.costs = calibrate_run(cfg);
  out.predicted = predict_run(plan_run_shape(cfg, reqs), out.costs);
  LocalOptions opt = schedule_node_options(mc, "sim", cfg.sim_profile, cfg.shards, cfg.pipeline,
                                           resolve_schedule(cfg.schedule));
  opt.attn_threads = cfg.shards;  // one thread per shard, as R was measured
  out.run = run_schedule(model, opt, reqs, cfg.threads);
  for (const gen_result& r : out.run.results)
    if (!r.error.empty()) throw Error("a request of the planned run failed: " + r.error);
  out.summary = summarize(out.run);
  if (out.run.wall_s > 0) out.measured_tokens_per_s = double(out.run.generated) / out.run.wall_s;
  if (out.measured_tokens_per_s > 0)
    out.ratio = out.predicted.tokens_per_s / out.measured_tokens_per_s;
  return out;
}

int bench_plan_main(int argc, char** argv) {
  PlanRunConfig cfg;
  cfg.sim_profile = "examples/profiles/a10-llama7b.txt";
  cfg.shape.n_layers = 4;
  cfg.shape.dim = 4096;
  cfg.shape.n_heads = 32;
  cfg.shape.n_kv_heads = 32;
  cfg.shape.vocab = 512;
  cfg.schedule.kind = ScheduleKind::sls;
  cfg.schedule.batch = 16;
  cfg.schedule.seq_len = 64;
  cfg.schedule.interval = 8;
  std::string schedule = "sls";
  bool json = false;
  po::options_description desc("fastdecode-bench plan [options]");
  desc.add_options()("help,h", "this help")
      ("json", po::bool_switch(&json), "one JSON object")
      ("sim-profile", po::value(&cfg.sim_profile)->default_value(cfg.sim_profile), "T(B) profile of the simulated S-part")
      ("schedule", po::value(&schedule)->default_value(schedule), "large-batch, sls or load-control")
      ("batch", po::value(&cfg.schedule.batch)->default_value(cfg.schedule.batch), "B, sequences per mini-batch")
      ("max-len", po::value(&cfg.schedule.seq_len)->default_value(cfg.schedule.seq_len), "S, tokens generated per request")
      ("interval", po::value(&cfg.schedule.interval)->default_value(cfg.schedule.interval), "F, steps between micro-batches")
      ("pipeline", po::value(&cfg.pipeline)->default_value(cfg.pipeline), "mini-batches in flight, 1 to 4")
      ("shards", po::value(&cfg.shards)->default_value(cfg.shards), "P, R-worker shards of one thread each")
      ("requests", po::value(&cfg.requests)->default_value(0), "requests (0: 4*B*pipeline)")
      ("layers", po::value(&cfg.shape.n_layers)->default_value(cfg.shape.n_layers), "model layers N")
      ("dim", po::value(&cfg.shape.dim)->default_value(cfg.shape.dim), "embedding width")
      ("heads", po::value(&cfg.shape.n_heads)->default_value(cfg.shape.n_heads), "query heads")
      ("kv-heads", po::value(&cfg.shape.n_kv_heads)->default_value(cfg.shape.n_kv_heads), "K/V heads")
      ("threads", po::value(&cfg.threads)->default_value(cfg.threads), "actor scheduler threads")
      ("min-time", po::value(&cfg.min_time)->default_value(cfg.min_time), "seconds per micro-benchmark")
      ("seed", po::value(&cfg.seed)->default_value(cfg.seed), "prompt seed");
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
  if (vm.count("help")) {
    std::cout << desc
              << "Measures T(B) (the profile), R (all shards' threads at once) and the hand-over\n"
                 "costs, predicts tokens/s with the performance model (runtime/perf_model.h,\n"
                 "predict_run), then runs the same configuration: simulated S-part, real shards.\n";
    return 0;
  }
  po::notify(vm);
  if (!parse_schedule(schedule, &cfg.schedule.kind))
    throw Error("--schedule takes large-batch, sls or load-control, not '" + schedule + "'.");
  if (cfg.shape.n_heads < 1 || cfg.shape.dim % cfg.shape.n_heads != 0)
    throw Error("--dim must be a multiple of --heads.");
  check_count(cfg.threads, "threads", 1, kMaxCafThreads);
  check_count(cfg.shards, "shards", 1, kMaxShards);
  cfg.shape.head_dim = cfg.shape.dim / cfg.shape.n_heads;
  cfg.shape.ff = cfg.shape.dim;  // the simulated S-part never reads the MLP

  const PlanVsRun r = plan_vs_run(cfg);
  // The model's R-workers have CPUs of their own, as on separate nodes; here the shards' threads
  // share this machine's cores with the S side's actors and the simulated device's spin.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const bool colocated = cfg.shards + 1 > cores;
  const RunCosts& c = r.costs;
  const RunPrediction& p = r.predicted;
  const ScheduleSummary& s = r.summary;
  if (json) {
    std::cout << JsonLine()
                     .add("schedule", std::string(schedule_name(cfg.schedule.kind)))
                     .add("batch", int64_t{cfg.schedule.batch})
                     .add("seq_len", int64_t{cfg.schedule.seq_len})
                     .add("pipeline", int64_t{cfg.pipeline})
                     .add("shards", int64_t{cfg.shards})
                     .add("layers", int64_t{cfg.shape.n_layers})
                     .add("r_ns_per_token", c.r_seconds * 1e9)
                     .add("s_hop_us", c.s_hop_seconds * 1e6)
                     .add("r_hop_us", c.r_hop_seconds * 1e6)
                     .add("r_fixed_us", c.r_fixed_seconds * 1e6)
                     .add("step_us", c.step_seconds * 1e6)
                     .add("page_touch_us", c.page_touch_seconds * 1e6)
                     .add("predicted_t_layer_ms", p.t_layer_s * 1e3)
                     .add("predicted_r_layer_ms", p.r_layer_s * 1e3)
                     .add("predicted_s_idle_frac", 1 - p.s_busy)
                     .add("predicted_r_idle_frac", 1 - p.r_busy)
                     .add("predicted_tokens_per_s", p.tokens_per_s)
                     .add("measured_tokens_per_s", r.measured_tokens_per_s)
                     .add("ratio", r.ratio)
                     .add("measured_s_layer_ms", s.s_layer_ms)
                     .add("measured_r_layer_ms", s.r_layer_ms)
                     .add("measured_r_compute_layer_ms", s.r_compute_layer_ms)
                     .add("s_idle_frac", s.s_idle_frac)
                     .add("r_idle_frac", s.r_idle_frac)
                     .add("wall_s", r.run.wall_s)
                     .add("colocated", int64_t{colocated})
                     .str()
              << std::endl;
    return 0;
  }
  std::printf("micro-benchmarks: R = %.3f ns/token/layer (%d workers at once); hand-over: S %.0f µs, "
              "R %.0f µs + %.0f µs in the shard; step %.0f µs; fresh KV page %.1f µs\n",
              c.r_seconds * 1e9, cfg.shards, c.s_hop_seconds * 1e6, c.r_hop_seconds * 1e6,
              c.r_fixed_seconds * 1e6, c.step_seconds * 1e6, c.page_touch_seconds * 1e6);
  std::printf("predicted: %8.1f tokens/s  T %.3f ms/layer  R %.3f ms/layer  S idle %4.1f%%  R idle %4.1f%%  (%.2f s)\n",
              p.tokens_per_s, p.t_layer_s * 1e3, p.r_layer_s * 1e3, 100 * (1 - p.s_busy),
              100 * (1 - p.r_busy), p.seconds);
  std::printf("measured:  %8.1f tokens/s  S %.3f ms/layer  R %.3f ms/layer (%.3f computing)  S idle %4.1f%%  R idle %4.1f%%  (%.2f s)\n",
              r.measured_tokens_per_s, s.s_layer_ms, s.r_layer_ms, s.r_compute_layer_ms, 100 * s.s_idle_frac,
              100 * s.r_idle_frac, r.run.wall_s);
  std::printf("predicted / measured = %.3f\n", r.ratio);
  if (colocated)
    std::printf("note: %d shard thread(s) and the S side share %d core(s); the model gives R-workers "
                "CPUs of their own, so the run's R is slower than predicted (leave a core to the S "
                "side: --shards %d)\n",
                cfg.shards, cores, std::max(1, cores - 1));
  return 0;
}

}  // namespace fd
