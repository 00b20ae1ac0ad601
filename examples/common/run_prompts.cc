#include "examples/common/run_prompts.h"

#include <chrono>
#include <cstdio>
#include <iostream>

#include "caf/all.hpp"
#include "examples/common/json.h"
#include "kernels/ops.h"
#include "runtime/tokenizer.h"

namespace fd {

std::shared_ptr<const Model> load_or_synthesize(const std::string& path) {
  if (!path.empty()) return std::make_shared<const Model>(load_model(path));
  ModelConfig c;
  c.n_layers = 2;
  c.dim = 128;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.ff = 256;
  c.vocab = 512;
  c.ctx = 512;
  std::cerr << "note: no --model given; running the built-in synthetic model (random weights, "
               "so the text is gibberish). Pass --model PATH.gguf for a real model.\n";
  return std::make_shared<const Model>(make_random_model(c, 1234));
}

namespace {

// The text of the generated ids as a continuation of the prompt (keeps a leading space that
// decoding the ids alone would strip).
std::string continuation(const Tokenizer& tok, const gen_request& req, const gen_result& r) {
  std::string out;
  int32_t prev = req.prompt.empty() ? -1 : req.prompt.back();
  for (int32_t id : r.tokens) {
    out += tok.piece(prev, id);
    prev = id;
  }
  return out;
}

void print_result(const NodeArgs& args, const Tokenizer& tok, const std::string& prompt,
                  const gen_request& req, const gen_result& r) {
  if (args.json) {
    JsonLine j;
    j.add("prompt", prompt);
    if (r.error.empty()) {
      j.add("text", continuation(tok, req, r))
          .add("tokens", r.tokens)
          .add("n_prompt", int64_t(r.n_prompt))
          .add("n_gen", int64_t(r.tokens.size()))
          .add("ms", r.ms);
    } else {
      j.add("error", r.error);
    }
    std::cout << j.str() << "\n";
  } else if (r.error.empty()) {
    std::cout << prompt << continuation(tok, req, r) << "\n";
  } else {
    const std::string shown = prompt.size() > 40 ? prompt.substr(0, 40) + "..." : prompt;
    std::cerr << "error: prompt \"" << shown << "\": " << r.error << "\n";
  }
}

}  // namespace

int generate_and_print(caf::actor_system& sys, const scheduler_actor& scheduler,
                       const Model& model, const NodeArgs& args) {
  Tokenizer tok(model.vocab);
  std::vector<gen_request> reqs;
  for (const auto& p : args.prompts) {
    gen_request r;
    r.prompt = tok.encode(p, model.vocab.add_bos);
    r.max_new = args.n_predict;
    r.temperature = args.sampling.temperature;
    r.top_k = args.sampling.top_k;
    r.top_p = args.sampling.top_p;
    r.seed = args.sampling.seed;
    reqs.push_back(std::move(r));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto results = generate(sys, scheduler, reqs, std::chrono::hours(24));
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int failed = 0;
  size_t n_gen = 0, n_decode = 0;
  double max_ttft_ms = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    print_result(args, tok, args.prompts[i], reqs[i], results[i]);
    if (!results[i].error.empty()) {
      ++failed;
      continue;
    }
    n_gen += results[i].tokens.size();
    n_decode += results[i].tokens.empty() ? 0 : results[i].tokens.size() - 1;
    max_ttft_ms = std::max(max_ttft_ms, results[i].ttft_ms);
  }
  std::cout.flush();
  const double decode_s = wall_s - max_ttft_ms / 1000;
  std::fprintf(stderr,
               "%zu prompts, %d failed; %zu tokens in %.3f s; decode %.1f tokens/s after prefill "
               "%.1f ms\n",
               results.size(), failed, n_gen, wall_s, decode_s > 0 ? n_decode / decode_s : 0.0,
               max_ttft_ms);
  return failed ? 1 : 0;
}

int run_prompts_all(const NodeArgs& args) {
  auto model = load_or_synthesize(args.model_path);
  if (args.prompts.empty()) throw Error("no prompt given (use --prompt TEXT or --prompts FILE)");
  kernels::set_gemm_threads(args.gemm_threads);
  caf::actor_system_config cfg;
  configure_caf(cfg, args.threads);
  caf::actor_system sys{cfg};
  LocalOptions local = args.local;
  local.log = false;  // one process: shard joins are not news
  LocalNode node = start_local_node(sys, model, local);
  if (!node.gpu.backend_note.empty()) std::cerr << node.gpu.backend_note << "\n";
  return generate_and_print(sys, node.scheduler, *model, args);
}

}  // namespace fd
