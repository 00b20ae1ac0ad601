#include "examples/common/bench_prefill.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "examples/common/bench_kv.h"
#include "examples/common/json.h"
#include "examples/common/list_options.h"
#include "examples/common/stats.h"
#include "kernels/attention.h"
#include "kernels/kv_format.h"
#include "kernels/thread_pool.h"
#include "runtime/error.h"
#include "runtime/kv_store.h"

namespace po = boost::program_options;

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;

struct PrefillOptions {
  bool json = false;
  std::vector<int> prompts, decodes, head_dims, gqas;
  std::vector<kernels::KvDtype> dtypes;
  int ctx = 2048;
  int threads = 1;
  int kv_heads = 8;
  int block_tokens = 64;
  double min_time = 0.2;  // seconds per case and thread count
  std::optional<kernels::KvLayout> layout;  // unset: each format's choice for this CPU
};

// Returns false when --help was printed.
bool parse_options(int argc, char** argv, PrefillOptions& o) {
  const int hw = machine_cores();
  po::options_description desc("fastdecode-bench prefill [options]");
  desc.add_options()
      ("help,h", "show this help")
      ("json", po::bool_switch(&o.json), "print one JSON object per case instead of a table")
      ("prompt", po::value<std::string>()->default_value("512,2048"), "prompt lengths (tokens)")
      ("decode", po::value<std::string>()->default_value("0,63"), "decoding sequences in the same call")
      ("ctx", po::value<int>(&o.ctx)->default_value(2048), "tokens each decoding sequence holds")
      ("head-dim", po::value<std::string>()->default_value("128"), "head sizes")
      ("gqa", po::value<std::string>()->default_value("4"), "query heads per kv head")
      ("kv-dtype", po::value<std::string>()->default_value("f16"),
       "KV formats: f16,int8,int4 (or q8,q4)")
      ("threads", po::value<int>(&o.threads)->default_value(hw), "attention threads")
      ("kv-heads", po::value<int>(&o.kv_heads)->default_value(8), "kv heads per sequence")
      ("block-tokens", po::value<int>(&o.block_tokens)->default_value(64), "tokens per KV page")
      ("kv-layout", po::value<std::string>()->default_value("auto"), kKvLayoutHelp)
      ("min-time", po::value<double>(&o.min_time)->default_value(0.2, "0.2"),
       "seconds measured per case and thread count");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc << "\n"
              << "One attention call as a shard makes it when a prompt joins running sequences: the\n"
                 "prompt's rows, each over its causal prefix of its own KV-cache, and one decode row\n"
                 "for each of --decode sequences of --ctx tokens. ms is the median call on --threads\n"
                 "threads, ms_1 on one thread, speedup their ratio; GFLOP/s counts the prompt's\n"
                 "attention only (4 * head_dim flops per query head and visible key), so it falls\n"
                 "as the decode rows take their share of the call. The KV is one layer, written\n"
                 "once, so a small case is read from cache.\n";
    return false;
  }
  o.prompts = parse_int_list(vm["prompt"].as<std::string>(), "prompt");
  o.decodes = parse_int_list(vm["decode"].as<std::string>(), "decode", 0);
  o.head_dims = parse_int_list(vm["head-dim"].as<std::string>(), "head-dim");
  o.gqas = parse_int_list(vm["gqa"].as<std::string>(), "gqa");
  o.dtypes = parse_kv_dtype_list(vm["kv-dtype"].as<std::string>());
  o.layout = parse_kv_layout_option(vm["kv-layout"].as<std::string>());
  check_count(o.ctx, "ctx", 1, 1 << 20);
  check_count(o.threads, "threads", 1, 4 * machine_cores());
  check_count(o.kv_heads, "kv-heads", 1, 1024);
  check_count(o.block_tokens, "block-tokens", 1, 1 << 16);
  if (o.min_time < 0) throw Error("--min-time must not be negative.");
  return true;
}

// A store holding one prompt of `prompt` tokens (sequence 0) and `decode` sequences of ctx tokens,
// and the call's items: the prompt's rows, then one decode row per sequence.
class PrefillCase {
 public:
  PrefillCase(const PrefillOptions& o, kernels::KvDtype dtype, int head_dim, int gqa, int prompt, int decode)
      : dims_{o.kv_heads * gqa, o.kv_heads, head_dim} {
    const auto pages = [&](int tokens) { return static_cast<size_t>((tokens + o.block_tokens - 1) / o.block_tokens); };
    store_ = std::make_unique<KvStore>(bench_store_config(dtype, 1, o.kv_heads, head_dim, o.block_tokens,
                                                          pages(prompt) + static_cast<size_t>(decode) * pages(o.ctx),
                                                          o.layout));
    std::mt19937 rng(static_cast<uint32_t>(prompt * 7 + head_dim));
    const size_t row = static_cast<size_t>(o.kv_heads) * head_dim;
    std::vector<uint16_t> k, v;
    random_f16_rows(rng, static_cast<size_t>(std::max(prompt, decode > 0 ? o.ctx : 0)) * row, k, v);

    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const size_t qw = static_cast<size_t>(dims_.n_heads) * head_dim;
    q_.resize(qw * static_cast<size_t>(prompt + decode));
    out_.resize(q_.size());
    for (auto& x : q_) x = dist(rng);
    for (int s = 0; s <= decode; ++s) {
      const int len = s == 0 ? prompt : o.ctx;
      store_->reserve(static_cast<uint64_t>(s), len);
      store_->append(static_cast<uint64_t>(s), 0, 0, k.data(), v.data(), len);
      kernels::AttnItem it;
      const size_t first_row = s == 0 ? 0 : static_cast<size_t>(prompt + s - 1);
      it.q = q_.data() + qw * first_row;
      it.out = out_.data() + qw * first_row;
      it.n_q = s == 0 ? prompt : 1;
      it.q_pos0 = len - it.n_q;
      it.kv = store_->view_blocks(static_cast<uint64_t>(s), 0);
      items_.push_back(it);
    }
  }

  // Median seconds of a call on the pool's threads, after one untimed call; --min-time of calls,
  // 3 at least.
  double median_seconds(kernels::ThreadPool& pool, double min_time) {
    kernels::attention_batch(items_.data(), items_.size(), dims_, pool);
    std::vector<double> times;
    double spent = 0;
    while (times.size() < 3 || spent < min_time) {
      const auto t0 = Clock::now();
      kernels::attention_batch(items_.data(), items_.size(), dims_, pool);
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      spent += times.back();
    }
    return median(times);
  }

 private:
  kernels::AttnDims dims_;
  std::unique_ptr<KvStore> store_;
  std::vector<float> q_, out_;             // [prompt + decode][n_heads * head_dim]
  std::vector<kernels::AttnItem> items_;  // the prompt, then the decoding sequences
};

}  // namespace

int bench_prefill_main(int argc, char** argv) {
  PrefillOptions o;
  if (!parse_options(argc, argv, o)) return 0;
  kernels::ThreadPool pool(o.threads), one(1);
  if (!o.json)
    std::printf("%-5s %4s %4s %4s %7s %7s %6s %8s %10s %9s %8s %9s\n", "kv", "hd", "gqa", "kvh", "prompt", "decode",
                "ctx", "threads", "ms", "GFLOP/s", "ms_1", "speedup");
  for (int hd : o.head_dims)
    for (int gqa : o.gqas)
      for (auto dtype : o.dtypes) {
        if (!kernels::kv_format(dtype).supports(hd)) {
          std::fprintf(stderr, "%s cannot hold head_dim %d: skipped\n", kernels::kv_dtype_name(dtype), hd);
          continue;
        }
        for (int prompt : o.prompts)
          for (int decode : o.decodes) {
            PrefillCase c(o, dtype, hd, gqa, prompt, decode);
            const double s = c.median_seconds(pool, o.min_time), s1 = c.median_seconds(one, o.min_time);
            const double flops = 4.0 * hd * o.kv_heads * gqa * (double(prompt) * (prompt + 1) / 2);
            const double gflops = flops / s / 1e9;
            if (o.json) {
              JsonLine line;
              line.add("kv_dtype", std::string(kernels::kv_dtype_name(dtype)))
                  .add("head_dim", int64_t{hd})
                  .add("gqa", int64_t{gqa})
                  .add("kv_heads", int64_t{o.kv_heads})
                  .add("prompt", int64_t{prompt})
                  .add("decode", int64_t{decode})
                  .add("ctx", int64_t{o.ctx})
                  .add("threads", int64_t{o.threads})
                  .add("ms", s * 1e3)
                  .add("gflops", gflops)
                  .add("ms_1thread", s1 * 1e3)
                  .add("speedup", s1 / s);
              std::cout << line.str() << std::endl;
            } else {
              std::printf("%-5s %4d %4d %4d %7d %7d %6d %8d %10.2f %9.1f %8.2f %9.2f\n", kernels::kv_dtype_name(dtype), hd,
                          gqa, o.kv_heads, prompt, decode, o.ctx, o.threads, s * 1e3, gflops, s1 * 1e3, s1 / s);
              std::fflush(stdout);
            }
          }
      }
  return 0;
}

}  // namespace fd
