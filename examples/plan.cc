// fastdecode-plan: recommends the batch size B and the number of R-workers P for a model shape,
// sequence length and latency target (the paper's workload-balanced hardware selection), from
// T(B) (measured on the CPU backend, or read from an S-part profile) and R (measured here).
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include "examples/common/bench_plan.h"
#include "examples/common/json.h"
#include "examples/common/node_options.h"
#include "examples/common/list_options.h"
#include "runtime/error.h"
#include "runtime/gguf.h"
#include "runtime/load_control.h"
#include "runtime/perf_model.h"

namespace po = boost::program_options;

namespace fd {
namespace {

std::vector<int> parse_batches(const std::string& text) {
  std::vector<int> out = parse_int_list(text, "batches");
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i] <= out[i - 1]) throw Error("--batches must be increasing, not '" + text + "'.");
  return out;
}

// The shape of a GGUF llama model from its metadata (the weights are not read).
ModelConfig gguf_shape(const std::string& path) {
  GgufFile f(path);
  ModelConfig c;
  c.n_layers = static_cast<int>(f.get_int("llama.block_count"));
  c.dim = static_cast<int>(f.get_int("llama.embedding_length"));
  c.n_heads = static_cast<int>(f.get_int("llama.attention.head_count"));
  c.n_kv_heads = static_cast<int>(f.get_int("llama.attention.head_count_kv", c.n_heads));
  c.ff = static_cast<int>(f.get_int("llama.feed_forward_length"));
  c.ctx = static_cast<int>(f.get_int("llama.context_length", 0));
  return c;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

struct Args {
  ModelConfig shape;
  std::string profile;
  std::vector<int> batches;
  double r_seconds = 0, min_time = 0.2;
  size_t kv_mem = 0, r_kv_bytes = 0;
  int r_seq_tokens = 0;
  int interval = 16;
  bool json = false;
};

struct ScheduleRun {
  ScheduleKind kind;
  int64_t peak = 0;
  double mean_load = 0;      // tokens, over steps [S, 5S)
  double worst_step = 0;     // seconds
  double tokens_per_s = 0;   // over steps [S, 5S), S-part and R-part in turn
  double overlapped = 0;     // the same with each layer's S-part and R-part overlapped
};

// Serves full-length sequences with each schedule at the plan's B, S and P. A step costs
// N·(T(running) + W(t)·R/P): the S-part of the running sequences, then the R-part of the load;
// or N·max(T, W·R/P) when a second mini-batch hides one behind the other (the paper's
// two-stage pipeline), where the stable load of sls pays off in throughput.
std::vector<ScheduleRun> compare_schedules(const PlanInput& in, const PlanRow& best, int interval) {
  const int s = in.seq_len;
  std::vector<SimRequest> reqs(static_cast<size_t>(best.batch) * 6 + 64);
  for (auto& r : reqs) {
    r.shape = SeqShape{0, s};
    r.actual_steps = s;
  }
  std::vector<ScheduleRun> out;
  for (ScheduleKind k : {ScheduleKind::large_batch, ScheduleKind::sls, ScheduleKind::load_control}) {
    ScheduleConfig cfg;
    cfg.kind = k;
    cfg.batch = best.batch;
    cfg.seq_len = s;
    cfg.interval = interval;
    const LoadTrace tr = simulate_schedule(cfg, reqs, int64_t{5} * s);
    ScheduleRun run{k};
    run.peak = tr.peak;
    double seconds = 0, seconds_overlapped = 0, tokens = 0, load = 0;
    for (size_t t = 0; t < tr.load.size(); ++t) {
      const double ts = tr.running[t] > 0 ? in.spart.layer_seconds(tr.running[t]) : 0;
      const double tr_ = tr.load[t] * in.r_seconds / best.workers;
      const double step = in.n_layers * (ts + tr_);
      run.worst_step = std::max(run.worst_step, step);
      if (t < static_cast<size_t>(s)) continue;  // the cold start
      seconds += step;
      seconds_overlapped += in.n_layers * std::max(ts, tr_);
      tokens += tr.running[t];
      load += static_cast<double>(tr.load[t]);
    }
    run.mean_load = load / (tr.load.size() - s);
    run.tokens_per_s = seconds > 0 ? tokens / seconds : 0;
    run.overlapped = seconds_overlapped > 0 ? tokens / seconds_overlapped : 0;
    out.push_back(run);
  }
  return out;
}

// --run-batch: the model's tokens/s for one configuration this machine can run (simulated S-part
// from --profile, real shards), from micro-benchmarks taken now; `fastdecode-bench plan` with the
// same options runs it and prints both.
int predict_concrete(const ModelConfig& shape, const std::string& profile, const ScheduleConfig& sc,
                     int pipeline, int shards, int requests, double min_time, bool json) {
  PlanRunConfig cfg;
  cfg.shape = shape;
  cfg.sim_profile = profile;
  cfg.schedule = sc;
  cfg.pipeline = pipeline;
  cfg.shards = shards;
  cfg.requests = requests;
  cfg.min_time = min_time;
  const RunCosts c = calibrate_run(cfg);
  const RunPrediction p = predict_run(plan_run_shape(cfg, plan_requests(cfg, 1)), c);
  if (json) {
    std::cout << JsonLine()
                     .add("type", std::string("run"))
                     .add("schedule", std::string(schedule_name(sc.kind)))
                     .add("batch", int64_t{sc.batch})
                     .add("seq_len", int64_t{sc.seq_len})
                     .add("pipeline", int64_t{pipeline})
                     .add("shards", int64_t{shards})
                     .add("r_s_per_token", c.r_seconds)
                     .add("t_layer_s", p.t_layer_s)
                     .add("r_layer_s", p.r_layer_s)
                     .add("s_idle_frac", 1 - p.s_busy)
                     .add("r_idle_frac", 1 - p.r_busy)
                     .add("predicted_tokens_per_s", p.tokens_per_s)
                     .add("seconds", p.seconds)
                     .str()
              << "\n";
    return 0;
  }
  std::cout << "R = " << fixed(c.r_seconds * 1e9, 1) << " ns per cached token per layer (" << shards
            << " workers at once); hand-over: S " << fixed(c.s_hop_seconds * 1e6, 0) << " µs, R "
            << fixed(c.r_hop_seconds * 1e6, 0) << " µs + " << fixed(c.r_fixed_seconds * 1e6, 0)
            << " µs in the shard; step " << fixed(c.step_seconds * 1e6, 0) << " µs\n"
            << "predicted for " << schedule_name(sc.kind) << ", B = " << sc.batch << " per mini-batch, "
            << pipeline << " mini-batch(es), S = " << sc.seq_len << ", P = " << shards << ": "
            << fixed(p.tokens_per_s, 1) << " tokens/s (T " << fixed(p.t_layer_s * 1e3, 3)
            << " ms, R " << fixed(p.r_layer_s * 1e3, 3) << " ms per layer; S idle "
            << fixed(100 * (1 - p.s_busy), 1) << " %, R idle " << fixed(100 * (1 - p.r_busy), 1)
            << " %)\nmeasure it: fastdecode-bench plan with the same --profile (as --sim-profile), "
               "--batch, --max-len, --interval, --pipeline, --shards and model shape\n";
  return 0;
}

int run(int argc, char** argv) {
  Args a;
  PlanInput in;
  std::string model, kv_mem, r_kv, run_schedule;
  int run_batch = 0, run_shards = 2, run_pipeline = 2, run_requests = 0;
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  po::options_description desc("fastdecode-plan [options]");
  desc.add_options()
      ("help,h", "show this help")
      ("model", po::value<std::string>(&model), "GGUF model whose shape to plan for")
      ("layers", po::value<int>(&a.shape.n_layers), "layers N (instead of --model)")
      ("dim", po::value<int>(&a.shape.dim), "embedding width")
      ("heads", po::value<int>(&a.shape.n_heads), "query heads")
      ("kv-heads", po::value<int>(&a.shape.n_kv_heads)->default_value(0), "key/value heads (0 = heads)")
      ("ff", po::value<int>(&a.shape.ff)->default_value(0), "MLP width (needed to measure the CPU backend)")
      ("seq-len", po::value<int>(&in.seq_len)->default_value(1024), "S: tokens of a whole sequence")
      ("latency", po::value<double>(&in.latency_limit)->default_value(0), "L: seconds to generate a sequence (0 = no limit)")
      ("kv-mem", po::value<std::string>(&kv_mem)->default_value("64GiB"), "KV-cache memory per node")
      ("workers-per-node", po::value<int>(&in.workers_per_node)->default_value(hw), "R-worker threads per node")
      ("profile", po::value<std::string>(&a.profile), "T(B) from an S-part profile (examples/profiles/)")
      ("batches", po::value<std::string>()->default_value("1,4,16,64,256"), "batch sizes to measure T(B) at")
      ("max-batch", po::value<int>(&in.max_batch)->default_value(0), "largest B considered (0 = largest T(B) point)")
      ("gain", po::value<double>(&in.gain)->default_value(0.1), "no --latency: accept B/T(B) this fraction below the best")
      ("r-seconds", po::value<double>(&a.r_seconds)->default_value(0), "R: seconds per cached token per layer (0 = measure)")
      ("r-seq-tokens", po::value<int>(&a.r_seq_tokens)->default_value(0), "sequence length R is measured at (0 = S/2)")
      ("r-kv", po::value<std::string>(&r_kv)->default_value("256MiB"), "KV-cache size R is measured over")
      ("interval", po::value<int>(&a.interval)->default_value(16), "F: steps between micro-batch starts, for the schedule comparison")
      ("min-time", po::value<double>(&a.min_time)->default_value(0.2), "seconds measured per point")
      ("json", po::bool_switch(&a.json), "print JSON lines (one per batch size, then the plan)")
      ("run-batch", po::value<int>(&run_batch)->default_value(0), "predict one runnable configuration: B per mini-batch (needs --profile)")
      ("run-shards", po::value<int>(&run_shards)->default_value(2), "with --run-batch: P shards of one thread each")
      ("run-pipeline", po::value<int>(&run_pipeline)->default_value(2), "with --run-batch: mini-batches in flight")
      ("run-schedule", po::value<std::string>(&run_schedule)->default_value("sls"), "with --run-batch: large-batch, sls or load-control")
      ("run-requests", po::value<int>(&run_requests)->default_value(0), "with --run-batch: requests (0: 4*B*pipeline)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc << "\n"
              << "Chooses B as the largest batch with 2·N·S·T(B) <= L (or, without L, the smallest\n"
                 "within --gain of the best B/T(B)), then P = B·S·R/(2·T(B)) R-workers, at least\n"
                 "enough to hold B·S/2 tokens. T(B) is one layer's S-part latency, R the R-part\n"
                 "seconds per cached token per layer on one thread, measured here.\n";
    return 0;
  }
  if (!model.empty()) {
    const int ff = a.shape.ff;
    a.shape = gguf_shape(model);
    if (ff > 0) a.shape.ff = ff;
  }
  ModelConfig& s = a.shape;
  if (s.n_kv_heads == 0) s.n_kv_heads = s.n_heads;
  if (s.n_layers < 1 || s.dim < 1 || s.n_heads < 1 || s.dim % s.n_heads != 0)
    throw Error("Give the model shape: --model GGUF, or --layers, --dim and --heads (dim divisible by heads).");
  s.head_dim = s.dim / s.n_heads;
  in.n_layers = s.n_layers;
  if (run_batch > 0) {
    if (a.profile.empty()) throw Error("--run-batch needs --profile: the run's S-part is simulated from it.");
    ScheduleConfig sc;
    if (!parse_schedule(run_schedule, &sc.kind))
      throw Error("--run-schedule takes large-batch, sls or load-control, not '" + run_schedule + "'.");
    sc.batch = run_batch;
    sc.seq_len = in.seq_len;
    sc.interval = a.interval;
    ModelConfig shape = s;
    if (shape.vocab < 4) shape.vocab = 512;
    return predict_concrete(shape, a.profile, sc, run_pipeline, run_shards, run_requests, a.min_time,
                            a.json);
  }
  a.batches = parse_batches(vm["batches"].as<std::string>());
  a.kv_mem = parse_size(kv_mem);
  a.r_kv_bytes = parse_size(r_kv);
  if (in.seq_len < 1) throw Error("--seq-len must be positive.");
  in.kv_tokens_per_node = static_cast<double>(a.kv_mem) / kv_bytes_per_token(s);

  if (!a.profile.empty()) {
    in.spart = load_sim_profile(a.profile);
  } else {
    if (s.ff < 1) throw Error("Measuring the CPU backend needs --ff (or --model); or give --profile.");
    if (!a.json) std::cerr << "measuring T(B) of the CPU backend...\n";
    in.spart = measure_cpu_spart(s, a.batches, a.min_time);
  }
  if (a.r_seconds > 0) {
    in.r_seconds = a.r_seconds;
  } else {
    if (!a.json) std::cerr << "measuring R on one thread...\n";
    const int len = a.r_seq_tokens > 0 ? a.r_seq_tokens : std::max(16, in.seq_len / 2);
    in.r_seconds = measure_r_seconds(s, len, a.r_kv_bytes, a.min_time);
  }

  if (a.interval < 1) throw Error("--interval must be positive.");
  const Plan plan = recommend_plan(in);
  const std::vector<ScheduleRun> schedules = compare_schedules(in, plan.best, a.interval);
  std::vector<int> shown = in.spart.batch;
  for (int b : a.batches) shown.push_back(b);
  shown.push_back(plan.best.batch);
  const int top = in.max_batch > 0 ? in.max_batch : in.spart.batch.back();
  shown.erase(std::remove_if(shown.begin(), shown.end(), [&](int b) { return b > top; }), shown.end());
  std::sort(shown.begin(), shown.end());
  shown.erase(std::unique(shown.begin(), shown.end()), shown.end());

  if (a.json) {
    for (int b : shown) {
      const PlanRow r = evaluate_plan(in, b);
      std::cout << JsonLine()
                       .add("type", std::string("row"))
                       .add("batch", int64_t{r.batch})
                       .add("t_spart_s", r.t_spart)
                       .add("p_balance", r.p_balance)
                       .add("workers", int64_t{r.workers})
                       .add("nodes", int64_t{r.nodes})
                       .add("step_s", r.step_seconds)
                       .add("tokens_per_s", r.tokens_per_second)
                       .add("seq_s", r.seq_seconds)
                       .add("meets_latency", std::string(r.meets_latency ? "yes" : "no"))
                       .str()
                << "\n";
    }
    for (const ScheduleRun& sr : schedules) {
      std::cout << JsonLine()
                       .add("type", std::string("schedule"))
                       .add("schedule", std::string(schedule_name(sr.kind)))
                       .add("interval", int64_t{a.interval})
                       .add("peak_load", sr.peak)
                       .add("mean_load", sr.mean_load)
                       .add("worst_step_s", sr.worst_step)
                       .add("tokens_per_s", sr.tokens_per_s)
                       .add("tokens_per_s_overlapped", sr.overlapped)
                       .str()
                << "\n";
    }
    const PlanRow& r = plan.best;
    std::cout << JsonLine()
                     .add("type", std::string("plan"))
                     .add("feasible", std::string(plan.feasible ? "yes" : "no"))
                     .add("reason", plan.reason)
                     .add("t_source", in.spart.source)
                     .add("r_s_per_token", in.r_seconds)
                     .add("batch", int64_t{r.batch})
                     .add("workers", int64_t{r.workers})
                     .add("nodes", int64_t{r.nodes})
                     .add("t_spart_s", r.t_spart)
                     .add("t_rpart_s", r.t_rpart)
                     .add("tokens_per_s", r.tokens_per_second)
                     .add("step_s", r.step_seconds)
                     .add("seq_s", r.seq_seconds)
                     .add("kv_tokens_per_node", in.kv_tokens_per_node)
                     .add("load_limit_tokens", r.load_limit)
                     .str()
              << "\n";
    return plan.feasible ? 0 : 1;
  }

  std::cout << "model: " << s.n_layers << " layers, dim " << s.dim << ", " << s.n_heads << " heads ("
            << s.n_kv_heads << " kv), S = " << in.seq_len << ", L = "
            << (in.latency_limit > 0 ? fixed(in.latency_limit, 3) + " s" : std::string("none")) << "\n"
            << "T(B): " << in.spart.source << (in.spart.model.empty() ? "" : " (" + in.spart.model + ")")
            << "; R = " << fixed(in.r_seconds * 1e9, 3) << " ns per cached token per layer per worker\n"
            << "KV-cache: " << fixed(kv_bytes_per_token(s) / 1024, 1) << " KiB per token, "
            << fixed(in.kv_tokens_per_node, 0) << " tokens per node\n\n";
  std::printf("%8s %10s %12s %9s %7s %6s %10s %11s %10s %4s\n", "B", "T(B) ms", "B/T(B)", "P_bal",
              "P", "nodes", "step ms", "tokens/s", "seq s", "L ok");
  for (int b : shown) {
    const PlanRow r = evaluate_plan(in, b);
    std::printf("%8d %10.3f %12.0f %9.2f %7d %6d %10.2f %11.1f %10.2f %4s%s\n", r.batch, r.t_spart * 1e3,
                r.efficiency, r.p_balance, r.workers, r.nodes, r.step_seconds * 1e3, r.tokens_per_second,
                r.seq_seconds, r.meets_latency ? "yes" : "no", b == plan.best.batch ? "  <- plan" : "");
  }
  const PlanRow& r = plan.best;
  std::cout << "\n" << (plan.feasible ? "plan" : "no feasible plan") << ": B = " << r.batch << ", P = "
            << r.workers << " R-workers on " << r.nodes << " node(s); " << plan.reason << ".\n"
            << "predicted: " << fixed(r.tokens_per_second, 1) << " tokens/s, "
            << fixed(r.step_seconds * 1e3, 2) << " ms per token, " << fixed(r.seq_seconds, 2)
            << " s per sequence of " << in.seq_len << " tokens\n"
            << "load-control limit for these workers: W_lim = P·T(B)/R = " << r.load_limit << " tokens\n\n"
            << "schedules at this B and P, full-length sequences, F = " << a.interval
            << " (steady state: steps S..5S):\n";
  std::printf("%14s %12s %12s %14s %11s %19s\n", "schedule", "peak W", "mean W", "worst step ms", "tokens/s",
              "tokens/s overlapped");
  for (const ScheduleRun& sr : schedules) {
    std::printf("%14s %12lld %12.0f %14.2f %11.1f %19.1f\n", schedule_name(sr.kind),
                static_cast<long long>(sr.peak), sr.mean_load, sr.worst_step * 1e3, sr.tokens_per_s,
                sr.overlapped);
  }
  return plan.feasible ? 0 : 1;
}

}  // namespace
}  // namespace fd

int main(int argc, char** argv) {
  try {
    return fd::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "fastdecode-plan: error: " << e.what() << "\n";
    return 2;
  }
}
