#include "examples/common/node_options.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "examples/common/list_options.h"
#include "kernels/kv_format.h"
#include "runtime/error.h"

namespace po = boost::program_options;

namespace fd {

size_t parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) throw Error("'" + text + "' is not a size (examples: 8GiB, 512MiB, 1048576)");
  const double v = std::stod(text.substr(0, i));
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mul = 1;
  if (unit == "" || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mul = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") mul = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") mul = 1024.0 * 1024 * 1024 * 1024;
  else throw Error("'" + text + "' has an unknown size unit (use KiB, MiB, GiB or TiB)");
  return static_cast<size_t>(v * mul);
}

HostPort parse_host_port(const std::string& text, const char* flag) {
  const auto colon = text.rfind(':');
  HostPort hp;
  hp.host = colon == std::string::npos ? text : text.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : text.substr(colon + 1);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (hp.host.empty() || port.empty() || *end != '\0' || p < 1 || p > 65535)
    throw Error(std::string(flag) + " must be HOST:PORT with a port in 1..65535, not '" + text + "'");
  hp.port = static_cast<uint16_t>(p);
  return hp;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

namespace {

std::vector<std::string> read_prompt_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the prompts file");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

}  // namespace

bool parse_node_args(int argc, const char* const* argv, NodeArgs& a) {
  std::vector<std::string> prompts;
  std::string prompts_file, kv_memory = "1GiB";
  double timeout_s = 60, shard_wait_s = 30, admission_window_ms = 5;
  std::string kv_commit;
  std::string schedule = "continuous", kv_dtype = "f16";
  po::options_description desc("fastdecode-node options");
  desc.add_options()
      ("help,h", "show this help")
      ("role", po::value(&a.role)->default_value("all"), "all (one process), gpu or cpu")
      ("model,m", po::value(&a.model_path), "GGUF model; without it a small synthetic model runs")
      ("prompt,p", po::value(&prompts)->composing(), "prompt text (repeatable)")
      ("prompts", po::value(&prompts_file), "file with one prompt per line")
      ("n-predict,n", po::value(&a.n_predict)->default_value(32), "tokens to generate per prompt")
      ("temperature", po::value(&a.sampling.temperature)->default_value(0.8f), "0 = greedy")
      ("top-k", po::value(&a.sampling.top_k)->default_value(40), "0 = no limit")
      ("top-p", po::value(&a.sampling.top_p)->default_value(0.95f), "1 = no limit")
      ("seed", po::value(&a.sampling.seed)->default_value(42), "sampling seed")
      ("shards", po::value(&a.local.shards)->default_value(2), "R-worker shards")
      ("kv-memory", po::value(&kv_memory)->default_value("1GiB"),
       "KV-cache capacity per shard (a cpu node without it: what the gpu node's run can place on "
       "each shard, up to 1GiB)")
      ("kv-commit", po::value(&kv_commit),
       "start: take each shard's --kv-memory from the OS when it starts (the default of cpu nodes); "
       "lazy: page by page as rows are first written (the default of --role all)")
      ("max-batch", po::value(&a.local.max_batch)->default_value(256), "sequences per step")
      ("backend", po::value(&a.local.backend)->default_value("auto"),
       "S-part backend: auto (CUDA when a GPU is usable, else CPU), cpu, cuda, sim")
      ("sim-profile", po::value(&a.local.sim_profile), "--backend sim: T(B) profile file")
      ("tensor-parallel", po::value(&a.local.tensor_parallel)->default_value(1),
       "S-workers splitting heads and MLP, each with its own R-group of shards")
      ("pipeline-parallel", po::value(&a.local.pipeline_parallel)->default_value(1),
       "S-workers holding consecutive layers, each with its own R-group of shards")
      ("schedule", po::value(&schedule)->default_value("continuous"),
       "continuous (start requests at once), large-batch, sls or load-control")
      ("batch", po::value(&a.local.schedule.batch)->default_value(256),
       "schedules: B, sequences in flight per mini-batch")
      ("interval", po::value(&a.local.schedule.interval)->default_value(16),
       "sls/load-control: F, steps between micro-batch starts")
      ("max-len", po::value(&a.local.schedule.seq_len)->default_value(0),
       "sls/load-control: S, steps a sequence runs (0: -n)")
      ("micro-batch", po::value(&a.local.schedule.micro_batch)->default_value(0),
       "sls/load-control: M, sequences per micro-batch (0: B*F/S)")
      ("load-limit", po::value(&a.local.schedule.load_limit)->default_value(0),
       "load-control: W_lim in tokens (0: B(S+F)/2 + B * mean prompt + 2 sd of B prompts' sum; "
       "fastdecode-plan prints one)")
      ("admission-window", po::value(&admission_window_ms)->default_value(5),
       "schedules: milliseconds an idle mini-batch waits for its batch to fill")
      ("pipeline", po::value(&a.local.pipeline)->default_value(2),
       "mini-batches in flight (1 to 4): 2 overlaps the S-part of one with the R-part of the "
       "other; 3 or 4 absorb variation in the R-part's time")
      ("timeout", po::value(&timeout_s)->default_value(60), "seconds per S-part or R-part request")
      ("threads", po::value(&a.local.attn_threads)->default_value(0),
       "attention threads of this node, shared by its shards (0: all cores; at most the cores)")
      ("kv-dtype", po::value(&kv_dtype)->default_value("f16"), "KV-cache format: f16, int8 (q8) or int4 (q4)")
      ("block-tokens", po::value(&a.local.block_tokens)->default_value(64),
       "gpu/all: tokens per KV-cache page (cpu nodes take the gpu node's)")
      ("caf-threads", po::value(&a.threads)->default_value(2), "actor scheduler threads")
      ("gemm-threads", po::value(&a.gemm_threads)->default_value(0),
       "BLAS threads of each CPU S-part call (0: cores / --pipeline; concurrent callers that "
       "oversubscribe the cores stall each other)")
      ("json", po::bool_switch(&a.json), "one JSON object per prompt per line")
      ("listen", po::value(&a.listen)->default_value("127.0.0.1:4242"), "gpu: HOST:PORT to serve")
      ("lane-port", po::value(&a.lane_port)->default_value(0),
       "gpu: port of the data lane (attention tensors) on the listen host; 0: any free port, told "
       "to cpu nodes when they join")
      ("join", po::value(&a.join), "cpu: HOST:PORT of the gpu node")
      ("token", po::value(&a.token), "cluster secret (default: $FASTDECODE_TOKEN)")
      ("min-shards", po::value(&a.min_shards)->default_value(1), "gpu: shards to wait for")
      ("min-shards-wait", po::value(&a.min_shards_wait_s)->default_value(60), "gpu: seconds")
      ("shard-wait", po::value(&shard_wait_s)->default_value(30),
       "seconds work waits for a shard when none can take it")
      ("name", po::value(&a.node_name), "cpu: node name in logs, traces and the trace console (default host:pid)")
      ("group", po::value(&a.group)->default_value(0),
       "cpu: R-group to serve (with --tensor-parallel/--pipeline-parallel on the gpu node)");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(std::string(e.what()) + " (see --help)");
  }
  if (vm.count("help")) {
    std::cout << "usage: fastdecode-node --role all [--model PATH] --prompt TEXT [...]\n" << desc;
    return false;
  }
  if (a.role != "all" && a.role != "gpu" && a.role != "cpu")
    throw Error("--role must be all, gpu or cpu, not '" + a.role + "'");
  if (a.n_predict < 1) throw Error("-n must be at least 1");
  check_count(a.local.shards, "shards", 1, kMaxShards);
  if (a.local.max_batch < 1) throw Error("--max-batch must be at least 1");
  if (a.local.pipeline < 1 || a.local.pipeline > 4) throw Error("--pipeline must be 1 to 4");
  if (schedule != "continuous") {
    if (!parse_schedule(schedule, &a.local.schedule.kind))
      throw Error("--schedule must be continuous, large-batch, sls or load-control, not '" +
                  schedule + "'");
    a.local.scheduled = true;
    if (a.local.schedule.seq_len == 0) a.local.schedule.seq_len = a.n_predict;
    a.local.schedule = resolve_schedule(a.local.schedule);
    a.local.max_batch = std::max(a.local.max_batch, a.local.schedule.batch * a.local.pipeline);
  }
  if (a.local.tensor_parallel < 1 || a.local.pipeline_parallel < 1)
    throw Error("--tensor-parallel and --pipeline-parallel must be at least 1");
  if (a.local.backend != "auto" && a.local.backend != "cpu" && a.local.backend != "cuda" &&
      a.local.backend != "sim")
    throw Error("--backend must be auto, cpu, cuda or sim, not '" + a.local.backend + "'");
  if (a.local.tensor_parallel > 1 || a.local.pipeline_parallel > 1) {
    if (a.local.backend == "auto") a.local.backend = "cpu";
  }
  check_count(a.threads, "caf-threads", 1, kMaxCafThreads);
  const int cores = machine_cores();
  if (a.local.attn_threads < 0 || a.local.attn_threads > cores)
    throw Error("--threads must be 0 (all cores) to " + std::to_string(cores) + ", the cores of this machine, not " +
                std::to_string(a.local.attn_threads) + ": attention is bound by memory bandwidth, and threads "
                "beyond the cores only take turns");
  check_count(a.local.block_tokens, "block-tokens", 1, 4096);
  if (a.role == "cpu" && !vm["block-tokens"].defaulted())
    throw Error("--block-tokens is set on the gpu node; a cpu node takes its page size when it joins");
  if (!kernels::parse_kv_dtype(kv_dtype, &a.local.kv_dtype))
    throw Error("--kv-dtype must be f16, int8 (q8) or int4 (q4), not '" + kv_dtype + "'");
  if (a.gemm_threads < 0) throw Error("--gemm-threads must be >= 0");
  if (a.gemm_threads == 0)
    a.gemm_threads = std::max(1, cores / a.local.pipeline);
  if (!(timeout_s > 0)) throw Error("--timeout must be positive");
  validate(a.sampling);
  a.local.kv_memory = parse_size(kv_memory);
  a.kv_memory_given = !vm["kv-memory"].defaulted();
  if (!kv_commit.empty() && kv_commit != "start" && kv_commit != "lazy")
    throw Error("--kv-commit must be start or lazy, not '" + kv_commit + "'");
  a.local.kv_commit = kv_commit.empty() ? a.role == "cpu" : kv_commit == "start";
  a.local.timeout = caf::timespan{std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(timeout_s))};
  if (!(admission_window_ms >= 0 && admission_window_ms <= 60000))
    throw Error("--admission-window must be between 0 and 60000 milliseconds");
  a.local.admission_window = caf::timespan{std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double, std::milli>(admission_window_ms))};
  if (!(shard_wait_s > 0)) throw Error("--shard-wait must be positive");
  a.local.shard_wait = caf::timespan{std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(shard_wait_s))};
  if (a.token.empty())
    if (const char* env = std::getenv("FASTDECODE_TOKEN")) a.token = env;
  if (a.role == "cpu" && a.join.empty()) throw Error("--role cpu needs --join HOST:PORT");
  if (a.lane_port < 0 || a.lane_port > 65535) throw Error("--lane-port must be in 0..65535");
  if (a.role != "cpu" && !a.join.empty()) throw Error("--join is only for --role cpu");
  if (a.min_shards < 1) throw Error("--min-shards must be at least 1");
  a.prompts = prompts;
  if (!prompts_file.empty())
    for (auto& p : read_prompt_file(prompts_file)) a.prompts.push_back(p);
  return true;
}

int report_node_error(const std::exception& e) {
  std::cerr << "fastdecode-node: error: " << e.what() << "\n";
  return 2;
}

}  // namespace fd
