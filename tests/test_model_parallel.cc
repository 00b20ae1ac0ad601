// Tensor and pipeline parallelism through the whole actor pipeline: G S-workers, each with its own
// R-group of shards, give the greedy tokens of G = 1.
#include <catch2/catch.hpp>

#include "actors/system.h"
#include "pipeline_fixture.h"
#include "caf/all.hpp"
#include "kernels/ops.h"
#include "tests/test_models.h"

namespace {

std::shared_ptr<const fd::Model> eight_head_model() {
  const fd::ModelConfig c =
      test_models::config(4, 256, 8, 4, 384, 320, 96);
  return std::make_shared<const fd::Model>(fd::make_random_model(c, 99));
}

std::vector<fd::gen_result> generate(std::shared_ptr<const fd::Model> model, int tp, int pp) {
  fd::kernels::set_gemm_threads(1);
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt;
  opt.log = false;
  opt.shards = 2;  // per R-group
  opt.kv_memory = size_t(32) << 20;
  opt.tensor_parallel = tp;
  opt.pipeline_parallel = pp;
  fd::LocalNode node = fd::start_local_node(sys, model, opt);
  std::vector<fd::gen_request> reqs;
  for (int i = 0; i < 5; ++i) {
    fd::gen_request r;
    r.prompt = {model->vocab.bos};
    for (int t = 0; t < 3 + 7 * i; ++t) r.prompt.push_back(3 + (t * 31 + i * 17) % 300);
    r.max_new = 24;
    reqs.push_back(r);
  }
  auto out = fd::generate(sys, node.scheduler, reqs, std::chrono::minutes(2));
  fd::stop_local_node(node);
  return out;
}

}  // namespace

TEST_CASE("tensor and pipeline parallelism give the tokens of one S-worker", "[parallel]") {
  auto model = eight_head_model();
  const auto base = generate(model, 1, 1);
  for (auto& r : base) REQUIRE(r.error == "");
  for (int g : {2, 4}) {
    for (bool tensor : {true, false}) {
      INFO((tensor ? "tensor" : "pipeline") << " parallel, G = " << g);
      const auto got = tensor ? generate(model, g, 1) : generate(model, 1, g);
      REQUIRE(got.size() == base.size());
      for (size_t i = 0; i < base.size(); ++i) {
        INFO("request " << i);
        CHECK(got[i].error == "");
        CHECK(got[i].tokens == base[i].tokens);
      }
    }
  }
}

TEST_CASE("impossible parallelism is refused with a clear error", "[parallel]") {
  auto model = eight_head_model();
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt;
  opt.log = false;
  opt.tensor_parallel = 3;  // 8 heads do not split 3 ways
  CHECK_THROWS_AS(fd::start_local_node(sys, model, opt), fd::Error);
  opt.tensor_parallel = 2;
  opt.pipeline_parallel = 2;
  CHECK_THROWS_WITH(fd::start_local_node(sys, model, opt), Catch::Contains("cannot be combined"));
}
