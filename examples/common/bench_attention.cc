#include "examples/common/bench_attention.h"

#include <algorithm>
#include <sys/mman.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "examples/common/bench_kv.h"
#include "examples/common/json.h"
#include "examples/common/stats.h"
#include "examples/common/list_options.h"
#include "examples/common/machine_caches.h"
#include "examples/common/node_options.h"
#include "kernels/attention.h"
#include "kernels/kv_format.h"
#include "kernels/ops.h"
#include "kernels/stream.h"
#include "kernels/thread_pool.h"
#include "runtime/error.h"
#include "runtime/kv_store.h"
#include "runtime/tensor_memory.h"

namespace po = boost::program_options;

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  bool json = false;
  std::vector<int> head_dims, gqas, ctxs, batches;
  std::vector<kernels::KvDtype> dtypes;
  int threads = 1;
  int kv_heads = 8;
  int block_tokens = 64;
  double min_time = 0.2;  // seconds per case
  size_t max_kv_bytes = 0;
  size_t stream_bytes = 0;
  size_t cold_bytes = 0;  // KV of all layers together at least this: a layer is read from memory
  std::string pages = "whole";  // or "grown": reserve the sequences' pages in turn, as decoding grows them
  std::optional<kernels::KvLayout> layout;  // unset: each format's choice for this CPU
};

// Eight times the last-level cache (256 MiB when the machine does not say). Layers read in turn
// still hit a cache a quarter their size: AMD EPYC (Zen 5, 32 MiB L3), 2 threads, f16 hd64 ctx
// 4096 batch 16 (128 MiB a layer), ratio to the stream: GQA 1 with one layer (twice the cache
// was one layer) 0.915-0.974, two 0.891-0.912, four 0.869-0.911, eight 0.889-0.901; GQA 4 with
// one 0.935-0.969, four 0.837-0.870.
size_t default_cold_bytes() {
  const size_t llc = last_level_cache_bytes();
  return 8 * (llc > 0 ? llc : size_t(32) << 20);
}

// Returns false when --help was printed.
bool parse_options(int argc, char** argv, BenchOptions& o) {
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  po::options_description desc("fastdecode-bench attention [options]");
  desc.add_options()
      ("help,h", "show this help")
      ("json", po::bool_switch(&o.json), "print one JSON object per case instead of a table")
      ("quick", po::bool_switch(), "small grid (head-dim 128, gqa 1,4, ctx 512,2048, batch 1,16,64)")
      ("head-dim", po::value<std::string>()->default_value("64,128"), "head sizes")
      ("gqa", po::value<std::string>()->default_value("1,4"), "query heads per kv head")
      ("ctx", po::value<std::string>()->default_value("128,512,2048,8192"), "context lengths (tokens)")
      ("batch", po::value<std::string>()->default_value("1,16,64,256,1024"), "sequences per call")
      ("kv-dtype", po::value<std::string>()->default_value("f16"),
       "KV formats: f16,int8,int4 (or q8,q4)")
      ("threads", po::value<int>(&o.threads)->default_value(hw), "attention and stream threads")
      ("kv-heads", po::value<int>(&o.kv_heads)->default_value(8), "kv heads per sequence")
      ("block-tokens", po::value<int>(&o.block_tokens)->default_value(64), "tokens per KV page")
      ("min-time", po::value<double>(&o.min_time)->default_value(0.2, "0.2"), "seconds measured per case")
      ("max-kv", po::value<std::string>()->default_value("1GiB"), "skip cases whose KV exceeds this")
      ("stream-size", po::value<std::string>()->default_value("1GiB"), "bandwidth probe array size")
      ("pages", po::value<std::string>()->default_value("whole"),
       "whole: each sequence reserves its context at once (as a prompt does), so its pages follow "
       "each other; grown: the sequences reserve a page in turn, as decoding grows them together")
      ("kv-layout", po::value<std::string>()->default_value("auto"), kKvLayoutHelp)
      ("cold-size", po::value<std::string>()->default_value("auto"),
       "layers are added until their KV reaches this and read in turn, so each is read from "
       "memory as in decoding (auto: 8 times the last-level cache; 0: one layer, hot in cache)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc << "\n"
              << "Decode attention (one query row per sequence) over one layer's KV-cache; GB/s counts\n"
                 "the KV bytes read, tokens/s the sequences served per second for that layer, ratio\n"
                 "is GB/s over the streaming read bandwidth of the same threads. The listed kv dtypes\n"
                 "of a shape are measured together, in rounds of one pass over each one's layers,\n"
                 "with a full read of --stream-size after every eighth of --min-time (3 if it is 0),\n"
                 "so that their tokens/s and the bandwidth (the median of those reads, stream_reads\n"
                 "in --json) span the same time; their stores are all held meanwhile.\n"
                 "Layers of the same shape are read in turn (--cold-size), so that, as in decoding,\n"
                 "a layer's KV is not still in cache.\n"
                 "append us is the store's time to append one decode token's K and V (all kv heads) to\n"
                 "one sequence and layer, block seals included (per dtype and head_dim), with 64\n"
                 "sequences per step over the same threads, as a shard appends, to layers in turn\n"
                 "(--cold-size) as in decoding.\n";
    return false;
  }
  const bool quick = vm["quick"].as<bool>();
  auto pick = [&](const char* name, const char* quick_value) {
    return quick && vm[name].defaulted() ? std::string(quick_value) : vm[name].as<std::string>();
  };
  o.head_dims = parse_int_list(pick("head-dim", "128"), "head-dim");
  o.gqas = parse_int_list(pick("gqa", "1,4"), "gqa");
  o.ctxs = parse_int_list(pick("ctx", "512,2048"), "ctx");
  o.batches = parse_int_list(pick("batch", "1,16,64"), "batch");
  o.dtypes = parse_kv_dtype_list(vm["kv-dtype"].as<std::string>());
  o.max_kv_bytes = parse_size(vm["max-kv"].as<std::string>());
  o.stream_bytes = parse_size(pick("stream-size", "256MiB"));
  o.pages = vm["pages"].as<std::string>();
  if (o.pages != "whole" && o.pages != "grown") throw Error("--pages must be whole or grown, not '" + o.pages + "'.");
  o.layout = parse_kv_layout_option(vm["kv-layout"].as<std::string>());
  const std::string cold = vm["cold-size"].as<std::string>();
  o.cold_bytes = cold == "auto" ? default_cold_bytes() : parse_size(cold);
  if (quick && vm["min-time"].defaulted()) o.min_time = 0.1;
  if (o.threads < 1 || o.kv_heads < 1 || o.block_tokens < 1 || o.min_time < 0)
    throw Error("--threads, --kv-heads and --block-tokens must be positive and --min-time not negative.");
  check_count(o.threads, "threads", 1, 4 * machine_cores());  // beyond the cores only to see them compete
  return true;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Read bandwidth of a sum over an array far larger than the caches, split over the pool. The
// array gets the KV store's memory treatment (2 MiB pages where the kernel has them, map_huge;
// see runtime/kv_store.cc), so the two compare fairly.
class StreamProbe {
 public:
  explicit StreamProbe(size_t bytes)
      : n_(std::max<size_t>(bytes / sizeof(float), 1 << 20)), a_(reinterpret_cast<float*>(map_huge(n_ * sizeof(float)))) {
    if (a_ == nullptr) throw Error("The bandwidth probe could not allocate its array.");
    std::fill(a_, a_ + n_, 1.0f);
  }
  ~StreamProbe() { munmap(a_, n_ * sizeof(float)); }
  StreamProbe(const StreamProbe&) = delete;
  StreamProbe& operator=(const StreamProbe&) = delete;

  // GB/s of the median of `passes` full reads.
  double gbps(kernels::ThreadPool& pool, int passes) {
    constexpr size_t kChunks = 256;
    std::vector<double> part(kChunks), times;
    for (int rep = 0; rep < passes; ++rep) {
      const auto t0 = Clock::now();
      pool.run(kChunks, [&](size_t i) {
        const size_t lo = n_ * i / kChunks, hi = n_ * (i + 1) / kChunks;
        part[i] = kernels::sum_f32(a_ + lo, hi - lo);
      });
      times.push_back(seconds_since(t0));
      double total = 0;
      for (double p : part) total += p;
      if (total != static_cast<double>(n_)) throw Error("The bandwidth probe summed the wrong value.");
    }
    return static_cast<double>(n_ * sizeof(float)) / median(times) / 1e9;
  }

 private:
  size_t n_;  // floats
  float* a_ = nullptr;
};

struct CaseResult {
  int layers = 1;  // read in turn
  double kv_bytes = 0, seconds = 0;  // per layer
};

// A store of `layers` layers of the options' shape, with room for `pages` pages.
KvStoreConfig store_config(const BenchOptions& o, kernels::KvDtype dtype, int head_dim, int layers, size_t pages) {
  return bench_store_config(dtype, layers, o.kv_heads, head_dim, o.block_tokens, pages, o.layout);
}

// Pages of a sequence of ctx tokens.
size_t pages_of(const BenchOptions& o, int ctx) {
  return (static_cast<size_t>(ctx) + o.block_tokens - 1) / o.block_tokens;
}

// Bytes of one layer's K and V of `batch` sequences of ctx tokens.
size_t layer_kv_bytes(const BenchOptions& o, kernels::KvDtype dtype, int head_dim, int ctx, int batch) {
  return pages_of(o, ctx) * o.kv_heads * 2 * kernels::kv_format(dtype).head_block_bytes(o.block_tokens, head_dim) *
         batch;
}

// Layers of layer_bytes each that --cold-size asks for (1 to 64), read or written in turn so that,
// as in decoding, a layer's KV has left the cache by its next turn.
int cold_layers(const BenchOptions& o, size_t layer_bytes) {
  return static_cast<int>(std::clamp<size_t>((o.cold_bytes + layer_bytes - 1) / layer_bytes, 1, 64));
}

// Whether a case runs: its dtype holds head_dim and its KV fits --max-kv.
bool case_fits(const BenchOptions& o, kernels::KvDtype dtype, int head_dim, int ctx, int batch) {
  return kernels::kv_format(dtype).supports(head_dim) &&
         layer_kv_bytes(o, dtype, head_dim, ctx, batch) <= o.max_kv_bytes;
}

// One case: a store of its dtype filled with `batch` sequences of `ctx` tokens in as many layers as
// --cold-size asks, and one decode query per sequence and layer.
class AttentionCase {
 public:
  AttentionCase(const BenchOptions& o, kernels::KvDtype dtype, int head_dim, int gqa, int ctx, int batch,
                kernels::ThreadPool& pool)
      : dims_{o.kv_heads * gqa, o.kv_heads, head_dim}, kv_bytes_(layer_kv_bytes(o, dtype, head_dim, ctx, batch)) {
    const size_t blocks = pages_of(o, ctx);
    // Decoding reads every layer's KV once per step: with more KV than the last-level cache holds,
    // each layer comes from memory. One layer read over and over would stay in a large cache
    // (480 MiB of L3 on the machine this was written on) and beat the stream bandwidth.
    const int layers = cold_layers(o, kv_bytes_);
    store_ = std::make_unique<KvStore>(store_config(o, dtype, head_dim, layers, blocks * batch));

    std::mt19937 rng(static_cast<uint32_t>(ctx * 131 + head_dim));  // the same rows for every dtype
    const size_t row = static_cast<size_t>(o.kv_heads) * head_dim;
    std::vector<uint16_t> k, v;
    random_f16_rows(rng, static_cast<size_t>(ctx) * row, k, v);
    for (size_t b = o.pages == "grown" ? 1 : blocks; b <= blocks; ++b)
      for (int s = 0; s < batch; ++s)
        store_->reserve(static_cast<uint64_t>(s), static_cast<int>(std::min<size_t>(ctx, b * o.block_tokens)));
    // Written as a shard appends, layer by layer over the pool's threads: whole pages take each
    // sequence's ctx tokens at once (a batch of prompts' prefill), grown pages a page of tokens of
    // every sequence in turn (decoding). One thread writing sequence after sequence took about 18 s
    // per shape to fill --cold-size's 8 times the 300 MiB L3 of a 16-core Xeon.
    const int step = o.pages == "grown" ? o.block_tokens : ctx;
    std::vector<KvAppend> fill(static_cast<size_t>(batch));
    for (int pos0 = 0; pos0 < ctx; pos0 += step) {
      const int n = std::min(step, ctx - pos0);
      for (int s = 0; s < batch; ++s)
        fill[static_cast<size_t>(s)] = {static_cast<uint64_t>(s), pos0, n, k.data() + pos0 * row, v.data() + pos0 * row};
      for (int l = 0; l < layers; ++l) store_->append_batch(l, fill.data(), fill.size(), pool);
    }

    const size_t qw = static_cast<size_t>(dims_.n_heads) * head_dim;
    q_.resize(qw * batch);
    out_.resize(qw * batch);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : q_) x = dist(rng);
    items_.resize(static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l)
      for (int s = 0; s < batch; ++s) {
        kernels::AttnItem it;
        it.q = q_.data() + qw * s;
        it.out = out_.data() + qw * s;
        it.n_q = 1;
        it.q_pos0 = ctx - 1;
        it.kv = store_->view_blocks(static_cast<uint64_t>(s), l);
        items_[static_cast<size_t>(l)].push_back(it);
      }
  }

  // Where the case's store put its kv heads (its own choice, or --kv-layout's).
  kernels::KvLayout layout() const { return store_->layout(); }
  // One call per layer, untimed.
  void warm(kernels::ThreadPool& pool) {
    for (const auto& layer : items_) kernels::attention_batch(layer.data(), layer.size(), dims_, pool);
  }
  // One timed call per layer.
  void pass(kernels::ThreadPool& pool) {
    for (const auto& layer : items_) {
      const auto t0 = Clock::now();
      kernels::attention_batch(layer.data(), layer.size(), dims_, pool);
      times_.push_back(seconds_since(t0));
      seconds_ += times_.back();
    }
  }
  // Seconds of all timed calls so far. Kept as a running sum: the rounds ask after every pass, and
  // summing times_ each time took 45 % of a run of 50 us calls (--min-time 4).
  double seconds() const { return seconds_; }

  CaseResult result() const {
    CaseResult r;
    r.layers = static_cast<int>(items_.size());
    r.kv_bytes = static_cast<double>(kv_bytes_);
    r.seconds = median(times_);
    return r;
  }

 private:
  kernels::AttnDims dims_;
  size_t kv_bytes_;  // of one layer
  std::unique_ptr<KvStore> store_;
  std::vector<float> q_, out_;                          // [batch][n_heads * head_dim]
  std::vector<std::vector<kernels::AttnItem>> items_;  // [layers][batch]
  std::vector<double> times_;                          // seconds per call
  double seconds_ = 0;                                 // their sum
};

// The stream bandwidth of a shape: the median of its reads, and how many there were.
struct StreamResult {
  double gbps = 0;
  int reads = 0;
};

// Stream reads per --min-time of timed calls of every case.
constexpr int kStreamReadsPerMinTime = 8;

// Measures the cases of one shape (one per listed dtype) together, in rounds of one timed pass over
// every layer of each case in turn, until each case has --min-time of calls; a full read of the
// stream probe follows the round in which every case passed each eighth of --min-time (8 reads;
// with --min-time 0, one after each of 3 rounds). So the cases, and the bandwidth they are compared
// with, span the same stretch of time: measured one after the other, they drifted with the host
// (on the AMD EPYC guest the stream read 13-24 GB/s within one grid). With a read after every
// round, calls of microseconds made tens of thousands of reads: --threads 1 --cold-size 0 --ctx
// 128,512 --batch 1,2 --min-time 0.5 --stream-size 256MiB had not finished after 11 minutes; it
// takes 10 s now. The eighths are k/8 of --min-time, not an eighth after the last read: a pass
// stretched by a preempted thread then ran one eighth into the next, and a read was lost.
StreamResult measure_together(const BenchOptions& o, kernels::ThreadPool& pool, StreamProbe& probe,
                              std::vector<std::unique_ptr<AttentionCase>>& cases) {
  for (auto& c : cases) c->warm(pool);
  std::vector<double> streams;
  const auto passed = [&](double seconds) {
    for (const auto& c : cases)
      if (c->seconds() < seconds) return false;
    return true;
  };
  // A read at each eighth (the last at --min-time itself), or 3 when --min-time is 0.
  const size_t reads = o.min_time > 0 ? kStreamReadsPerMinTime : 3;
  while (streams.size() < reads) {
    for (auto& c : cases) {
      if (o.cold_bytes == 0) c->warm(pool);  // meant hot in cache: back in after the others
      c->pass(pool);
    }
    // The reads owed to the eighths every case has passed: after a pass that ran long (a thread
    // preempted), several in a row; with --min-time 0, one per round.
    while (streams.size() < reads && passed(o.min_time * double(streams.size() + 1) / kStreamReadsPerMinTime)) {
      streams.push_back(probe.gbps(pool, 1));
      if (o.min_time == 0) break;
    }
  }
  return {median(streams), static_cast<int>(streams.size())};
}

// Microseconds the store takes to append one decode token (the K and V rows of every kv head) to
// one sequence's layer: the R-worker's work per sequence and layer besides attention (q8/q4
// quantize the rows). As a shard does, a step appends to kSeqs sequences at once over the pool's
// threads (KvStore::append_batch), and to every layer in turn, in as many layers as --cold-size
// asks: in decoding, a block's lines have left the cache by the step that appends to it again,
// and one layer stayed in cache, without the misses that dominate there (AMD EPYC Zen 3, one core,
// hd128, before 8c4a13b: 1024 sequences took 1.7-2.4x the time of 64). Averaged over block_tokens
// such steps, so that every block is sealed once (f16 transposes its keys then); the median of 3
// rounds after a first that also faults the pages in.
double append_us(const BenchOptions& o, kernels::KvDtype dtype, int head_dim, kernels::ThreadPool& pool) {
  constexpr int kSeqs = 64;
  if (!kernels::kv_format(dtype).supports(head_dim)) return 0.0;
  const int layers = cold_layers(o, layer_kv_bytes(o, dtype, head_dim, o.block_tokens, kSeqs));
  KvStore store(store_config(o, dtype, head_dim, layers, kSeqs));
  std::mt19937 rng(static_cast<uint32_t>(head_dim));
  const size_t row = static_cast<size_t>(o.kv_heads) * head_dim;
  std::vector<uint16_t> k, v;
  random_f16_rows(rng, static_cast<size_t>(o.block_tokens) * row, k, v);
  std::vector<double> rounds;
  for (int round = 0; round < 4; ++round) {
    for (int s = 0; s < kSeqs; ++s) {
      store.drop(static_cast<uint64_t>(s));
      store.reserve(static_cast<uint64_t>(s), o.block_tokens);
    }
    const auto t0 = Clock::now();
    for (int t = 0; t < o.block_tokens; ++t) {
      KvAppend step[kSeqs];
      for (int s = 0; s < kSeqs; ++s) step[s] = {static_cast<uint64_t>(s), t, 1, k.data() + t * row, v.data() + t * row};
      for (int l = 0; l < layers; ++l) store.append_batch(l, step, kSeqs, pool);
    }
    if (round > 0) rounds.push_back(seconds_since(t0) * 1e6 / (double(kSeqs) * o.block_tokens * layers));
  }
  return median(rounds);
}

}  // namespace

int bench_attention_main(int argc, char** argv) {
  BenchOptions o;
  if (!parse_options(argc, argv, o)) return 0;
  kernels::ThreadPool pool(o.threads);
  StreamProbe probe(o.stream_bytes);
  if (!o.json) {
    const std::string layout = o.layout ? kernels::kv_layout_name(*o.layout) : "auto (each format's; column layout)";
    std::printf("threads %d, kv heads %d, block %d tokens, %s pages, kv layout %s; layers read in turn up to "
                "%.0f MiB of KV; stream read bandwidth %.1f GB/s (re-measured with each shape)\n",
                o.threads, o.kv_heads, o.block_tokens, o.pages.c_str(), layout.c_str(),
                double(o.cold_bytes) / (1 << 20), probe.gbps(pool, 7));
    std::printf("%-5s %4s %4s %6s %6s %6s %9s %8s %7s %6s %12s %10s\n", "kv", "hd", "gqa", "ctx", "batch",
                "layout", "KV MiB", "GB/s", "stream", "ratio", "tokens/s", "append us");
  }
  int skipped = 0;
  for (int hd : o.head_dims) {
    std::vector<double> append;
    for (auto dtype : o.dtypes) append.push_back(append_us(o, dtype, hd, pool));
    for (int gqa : o.gqas)
      for (int ctx : o.ctxs)
        for (int batch : o.batches) {
          std::vector<std::unique_ptr<AttentionCase>> cases;
          std::vector<size_t> which;  // index into o.dtypes of each case
          for (size_t i = 0; i < o.dtypes.size(); ++i) {
            if (!case_fits(o, o.dtypes[i], hd, ctx, batch)) {
              ++skipped;
              continue;
            }
            cases.push_back(std::make_unique<AttentionCase>(o, o.dtypes[i], hd, gqa, ctx, batch, pool));
            which.push_back(i);
          }
          if (cases.empty()) continue;
          const StreamResult stream_read = measure_together(o, pool, probe, cases);
          const double stream = stream_read.gbps;
          for (size_t c = 0; c < cases.size(); ++c) {
            const kernels::KvDtype dtype = o.dtypes[which[c]];
            const CaseResult r = cases[c]->result();
            const double gbps = r.kv_bytes / r.seconds / 1e9;
            const double tps = batch / r.seconds;
            if (o.json) {
              JsonLine line;
              line.add("kv_dtype", std::string(kernels::kv_dtype_name(dtype)))
                  .add("head_dim", int64_t{hd})
                  .add("gqa", int64_t{gqa})
                  .add("ctx", int64_t{ctx})
                  .add("batch", int64_t{batch})
                  .add("threads", int64_t{o.threads})
                  .add("kv_heads", int64_t{o.kv_heads})
                  .add("kv_mib", r.kv_bytes / (1 << 20))
                  .add("pages", o.pages)
                  .add("kv_layout", std::string(kernels::kv_layout_name(cases[c]->layout())))
                  .add("layers", int64_t{r.layers})
                  .add("gbps", gbps)
                  .add("stream_gbps", stream)
                  .add("stream_reads", int64_t{stream_read.reads})
                  .add("ratio", gbps / stream)
                  .add("tokens_per_s", tps)
                  .add("append_us", append[which[c]]);
              std::cout << line.str() << std::endl;
            } else {
              std::printf("%-5s %4d %4d %6d %6d %6s %9.1f %8.2f %7.2f %6.3f %12.0f %10.2f\n",
                          kernels::kv_dtype_name(dtype), hd, gqa, ctx, batch,
                          kernels::kv_layout_name(cases[c]->layout()), r.kv_bytes / (1 << 20), gbps, stream,
                          gbps / stream, tps, append[which[c]]);
              std::fflush(stdout);
            }
          }
        }
  }
  if (skipped > 0)
    std::fprintf(stderr, "%d case(s) skipped: KV larger than --max-kv, or head_dim unsupported by the dtype\n",
                 skipped);
  return 0;
}

}  // namespace fd
