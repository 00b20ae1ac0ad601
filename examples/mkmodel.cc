// fastdecode-mkmodel: writes a llama GGUF with deterministic random weights and a synthetic
// vocabulary, for tests and benchmarks of model shapes no checkpoint is at hand for.
#include <boost/program_options.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include "runtime/error.h"
#include "runtime/gguf_writer.h"
#include "runtime/model.h"

namespace po = boost::program_options;

namespace {

fd::GgmlType parse_dtype(const std::string& s) {
  if (s == "f32") return fd::GgmlType::f32;
  if (s == "f16") return fd::GgmlType::f16;
  if (s == "bf16") return fd::GgmlType::bf16;
  if (s == "q8_0") return fd::GgmlType::q8_0;
  throw po::error("--dtype must be one of f32, f16, bf16, q8_0 (got '" + s + "')");
}

}  // namespace

int main(int argc, char** argv) {
  fd::ModelConfig cfg;
  std::string out, dtype_name;
  uint64_t seed = 0;
  po::options_description opts("fastdecode-mkmodel: write a random-weight llama GGUF model\nOptions");
  // clang-format off
  opts.add_options()
      ("help,h", "show this help")
      ("out", po::value(&out)->required(), "output GGUF path")
      ("layers", po::value(&cfg.n_layers)->default_value(2), "transformer blocks")
      ("dim", po::value(&cfg.dim)->default_value(64), "embedding width")
      ("heads", po::value(&cfg.n_heads)->default_value(4), "query heads")
      ("kv-heads", po::value(&cfg.n_kv_heads)->default_value(2), "key/value heads")
      ("ff", po::value(&cfg.ff)->default_value(192), "MLP hidden width")
      ("vocab", po::value(&cfg.vocab)->default_value(512), "vocabulary size (at least 259)")
      ("ctx", po::value(&cfg.ctx)->default_value(256), "context length")
      ("dtype", po::value(&dtype_name)->default_value("f32"), "matrix type: f32, f16, bf16 or q8_0")
      ("seed", po::value(&seed)->default_value(1), "random seed");
  // clang-format on

  fd::GgmlType dtype;
  fd::Model model;
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("help")) {
      std::cout << opts << "\n";
      return 0;
    }
    po::notify(vm);
    dtype = parse_dtype(dtype_name);
    if (dtype == fd::GgmlType::q8_0 && (cfg.dim % 32 != 0 || cfg.ff % 32 != 0)) {
      throw po::error("--dtype q8_0 needs --dim and --ff to be multiples of 32");
    }
    model = fd::make_random_model(cfg, seed);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fastdecode-mkmodel: %s (see --help)\n", e.what());
    return 2;
  }

  try {
    fd::write_model_gguf(model, out, dtype);
    const fd::ModelConfig& c = model.cfg;
    std::printf(
        "wrote %s: llama, %d layers, dim %d, %d heads (%d kv, head_dim %d), ff %d, vocab %d, ctx %d, %s, seed %llu, "
        "%.1f MiB\n",
        out.c_str(), c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ff, c.vocab, c.ctx,
        fd::ggml_type_name(dtype), static_cast<unsigned long long>(seed),
        static_cast<double>(std::filesystem::file_size(out)) / (1024.0 * 1024.0));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fastdecode-mkmodel: %s\n", e.what());
    return 1;
  }
  return 0;
}
