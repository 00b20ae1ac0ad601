#include "examples/common/bench_sworker.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "examples/common/json.h"
#include "examples/common/list_options.h"
#include "kernels/ops.h"
#include "runtime/backend_loader.h"
#include "runtime/error.h"
#include "runtime/model.h"
#include "runtime/spart.h"

namespace po = boost::program_options;

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int dim, n_heads, ff;
};
constexpr Shape kShapes[] = {{"7b", 4096, 32, 11008}, {"13b", 5120, 40, 13824}};

// Dense fp16 tensor-core peaks (fp32 accumulation, no sparsity) from NVIDIA's datasheets, in
// TFLOP/s, matched as substrings of the device name, first match wins.
struct Peak {
  const char* name_part;
  double tflops;
};
constexpr Peak kPeaks[] = {
    {"H100 PCIe", 756}, {"H100 NVL", 835}, {"H100", 989}, {"H200", 989}, {"H800", 989},
    {"A100", 312},      {"A800", 312},     {"A10G", 70},  {"A10", 125},  {"A30", 165},
    {"L40S", 362},      {"L40", 181},      {"L4", 121},   {"A6000", 155}, {"A40", 150},
};

double peak_tflops(const std::string& device) {
  for (const Peak& p : kPeaks)
    if (device.find(p.name_part) != std::string::npos) return p.tflops;
  return 0.0;
}

struct Options {
  std::string backend = "auto";
  bool json = false;
  std::vector<std::string> shapes;
  std::vector<int> batches;
  int layers = 1;
  int device = 0;
  int threads = 0;
  double min_time = 0.5;
};

// Returns false when --help was printed.
bool parse_options(int argc, char** argv, Options& o) {
  po::options_description desc("fastdecode-bench sworker [options]");
  desc.add_options()
      ("help,h", "show this help")
      ("backend", po::value<std::string>(&o.backend)->default_value("auto"), "cpu, cuda or auto")
      ("json", po::bool_switch(&o.json), "print one JSON object per case instead of a table")
      ("shape", po::value<std::string>()->default_value("7b,13b"), "model shapes: 7b, 13b")
      ("batch", po::value<std::string>(),
       "batch sizes (tokens per step); default 1,2,4,...,4096 on a GPU, 1,4,16,64 on the CPU")
      ("layers", po::value<int>(&o.layers)->default_value(1), "layers generated (timings are per layer)")
      ("device", po::value<int>(&o.device)->default_value(0), "CUDA device")
      ("threads", po::value<int>(&o.threads)->default_value(0), "CPU GEMM threads (0: BLAS default)")
      ("min-time", po::value<double>(&o.min_time)->default_value(0.5), "seconds measured per case");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc << "\n"
              << "Times the S-part of a decoder layer for a step of B tokens: attn_in (RMSNorm, QKV,\n"
                 "RoPE, Q/K/V to the host) and attn_out (O from the host, Wo, residual, MLP). TFLOP/s\n"
                 "counts 2 * layer parameters * B; peak is the device's dense fp16 tensor peak.\n";
    return false;
  }
  std::stringstream ss(vm["shape"].as<std::string>());
  for (std::string s; std::getline(ss, s, ',');) {
    if (std::none_of(std::begin(kShapes), std::end(kShapes), [&](const Shape& k) { return s == k.name; }))
      throw Error("--shape must list 7b or 13b, not '" + s + "'.");
    o.shapes.push_back(s);
  }
  if (vm.count("batch")) o.batches = parse_int_list(vm["batch"].as<std::string>(), "batch");
  if (o.layers < 1 || o.min_time < 0) throw Error("--layers must be positive and --min-time not negative.");
  return true;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds per layer of the S-part for a step of `batch` tokens, one per sequence.
double time_batch(const SPartBackend& b, SPartState& s, int batch, double min_time) {
  const ModelConfig& c = b.config();
  std::mt19937 rng(static_cast<uint32_t>(batch));
  std::uniform_int_distribution<int32_t> tok(3, c.vocab - 1);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  StepInput in;
  for (int r = 0; r < batch; ++r) {
    in.tokens.push_back(tok(rng));
    in.pos.push_back(r % c.ctx);
  }
  std::vector<float> o(static_cast<size_t>(batch) * c.q_width());
  for (float& v : o) v = unit(rng);
  AttnIn a;
  std::vector<float> logits;
  b.embed(s, in);
  // One pass: the backend's scratch is allocated and any lazy initialisation is done.
  // logits() with no logit rows only waits for the step's queued work.
  const auto pass = [&] {
    for (int l = 0; l < c.n_layers; ++l) {
      b.attn_in(s, l, a);
      // Each layer's Q/K/V leave in a message (fill_output), so the node's next attn_in
      // allocates K and V again, and writes Q into the returning O's buffer
      // (actors/gpu_stream.cc): so does each layer here.
      a.k = {};
      a.v = {};
      b.attn_out(s, l, o.data());
    }
    b.logits(s, logits);
  };
  pass();
  int reps = 0;
  const auto t0 = Clock::now();
  do {
    pass();
    ++reps;
  } while (seconds_since(t0) < min_time);
  return seconds_since(t0) / (static_cast<double>(reps) * c.n_layers);
}

}  // namespace

int bench_sworker_main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) return 0;
  if (o.threads > 0) kernels::set_gemm_threads(o.threads);
  bool header = false;
  for (const std::string& shape_name : o.shapes) {
    const Shape& sh = *std::find_if(std::begin(kShapes), std::end(kShapes),
                                    [&](const Shape& k) { return shape_name == k.name; });
    ModelConfig cfg;
    cfg.n_layers = o.layers;
    cfg.dim = sh.dim;
    cfg.n_heads = sh.n_heads;
    cfg.n_kv_heads = sh.n_heads;
    cfg.head_dim = sh.dim / sh.n_heads;
    cfg.ff = sh.ff;
    cfg.vocab = 512;
    cfg.ctx = 4096;
    const Model model = make_random_model(cfg, 42);
    const double params = static_cast<double>(cfg.dim) * (cfg.q_width() + 2 * cfg.kv_width()) +
                          static_cast<double>(cfg.q_width()) * cfg.dim + 3.0 * cfg.dim * cfg.ff;

    std::string note;
    BackendOptions bo;
    bo.device = o.device;
    bo.max_rows = o.batches.empty() ? 4096 : *std::max_element(o.batches.begin(), o.batches.end());
    auto backend = make_backend(o.backend, model, &note, bo);
    const bool cuda = std::string(backend->name()) == "cuda";
    std::vector<int> batches = o.batches;
    if (batches.empty() && cuda)
      for (int b = 1; b <= 4096; b *= 2) batches.push_back(b);
    if (batches.empty()) batches = {1, 4, 16, 64};
    const std::string device = cuda ? cuda_device_name(o.device) : "cpu";
    const double peak = cuda ? peak_tflops(device) : 0.0;
    if (!header) {
      std::cerr << note << "\n";
      if (!o.json) {
        char peak_text[32] = "n/a";
        if (peak > 0) std::snprintf(peak_text, sizeof peak_text, "%.0f", peak);
        std::printf("backend %s, device %s, dense fp16 peak %s TFLOP/s\n", backend->name(), device.c_str(),
                    peak_text);
        std::printf("%-5s %6s %12s %10s %8s\n", "shape", "B", "ms/layer", "TFLOP/s", "of peak");
      }
      header = true;
    }
    auto state = backend->make_state();
    for (int b : batches) {
      const double t = time_batch(*backend, *state, b, o.min_time);
      const double tflops = 2.0 * params * b / t / 1e12;
      if (o.json) {
        JsonLine line;
        line.add("bench", std::string("sworker"))
            .add("backend", std::string(backend->name()))
            .add("device", device)
            .add("shape", shape_name)
            .add("dim", int64_t{cfg.dim})
            .add("heads", int64_t{cfg.n_heads})
            .add("ff", int64_t{cfg.ff})
            .add("batch", int64_t{b})
            .add("ms_per_layer", t * 1e3)
            .add("tflops", tflops);
        if (peak > 0)
          line.add("peak_tflops", peak).add("peak_fraction", tflops / peak);
        else
          line.add("peak_tflops", std::string("n/a")).add("peak_fraction", std::string("n/a"));
        std::cout << line.str() << std::endl;
      } else {
        char frac[32] = "n/a";
        if (peak > 0) std::snprintf(frac, sizeof frac, "%.1f%%", 100.0 * tflops / peak);
        std::printf("%-5s %6d %12.3f %10.3f %8s\n", shape_name.c_str(), b, t * 1e3, tflops, frac);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace fd
