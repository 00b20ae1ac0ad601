// Shard loss inside one process: the sequences of a killed shard move, re-prefill from their
// token history and finish with exactly the tokens of a fault-free run.
#include <catch2/catch.hpp>
#include <thread>

#include "actors/scheduler.h"
#include "actors/system.h"
#include "pipeline_fixture.h"
#include "kernels/ops.h"
#include "caf/all.hpp"
#include "tests/test_models.h"

namespace {

std::shared_ptr<const fd::Model> slow_enough_model() {
  const fd::ModelConfig c =
      test_models::config(4, 256, 8, 2, 512, 400, 256);
  return std::make_shared<const fd::Model>(fd::make_random_model(c, 21));
}

std::vector<fd::gen_request> requests(int n) {
  std::vector<fd::gen_request> out;
  for (int i = 0; i < n; ++i) {
    fd::gen_request r;
    r.prompt.push_back(1);  // BOS
    for (int t = 0; t <= i; ++t) r.prompt.push_back(10 + 7 * t + i);
    r.max_new = 160;
    out.push_back(r);
  }
  return out;
}

// kills: (shard index, delay after the start) pairs, in order of their delays.
using Kills = std::vector<std::pair<int, std::chrono::microseconds>>;

std::vector<fd::gen_result> run(std::shared_ptr<const fd::Model> model, int shards, const Kills& kills) {
  fd::kernels::set_gemm_threads(1);  // two mini-batches call BLAS at once
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt = test_node_options(shards);
  opt.timeout = std::chrono::seconds(5);
  fd::LocalNode node = fd::start_local_node(sys, model, opt);
  std::thread killer([&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& [shard, after] : kills) {
      std::this_thread::sleep_until(t0 + after);
      caf::anon_send_exit(node.shards[shard], caf::exit_reason::kill);
    }
  });
  auto out = fd::generate(sys, node.scheduler, requests(8), std::chrono::minutes(2));
  if (killer.joinable()) killer.join();
  fd::stop_local_node(node);
  return out;
}

}  // namespace

TEST_CASE("better_place ranks shards by their mini-batch's pages, then the KV in use, then the free",
          "[scheduler]") {
  using fd::ShardLoad;
  CHECK(fd::better_place(ShardLoad{0, 90, 10}, ShardLoad{1, 0, 1000}));  // its mini-batch first
  // Equal for the mini-batch: less in use wins over more free, as between a full-sized shard and a
  // small one that holds nothing yet.
  CHECK(fd::better_place(ShardLoad{0, 0, 20}, ShardLoad{0, 8, 2000}));
  CHECK_FALSE(fd::better_place(ShardLoad{0, 8, 2000}, ShardLoad{0, 0, 20}));
  CHECK(fd::better_place(ShardLoad{0, 8, 300}, ShardLoad{0, 8, 200}));  // then more free
  CHECK_FALSE(fd::better_place(ShardLoad{0, 8, 200}, ShardLoad{0, 8, 200}));
}

TEST_CASE("a killed shard's sequences finish elsewhere with identical tokens", "[faults]") {
  auto model = slow_enough_model();
  const auto clean = run(model, 3, {});
  for (auto after : {std::chrono::milliseconds(30), std::chrono::milliseconds(150)}) {
    INFO("kill after " << after.count() << " ms");
    const auto faulty = run(model, 3, {{1, after}});
    REQUIRE(faulty.size() == clean.size());
    for (size_t i = 0; i < clean.size(); ++i) {
      INFO("request " << i);
      REQUIRE(clean[i].error == "");
      CHECK(faulty[i].error == "");
      CHECK(faulty[i].tokens == clean[i].tokens);
    }
  }
}

TEST_CASE("a second shard lost during the first one's recovery loses nothing", "[faults]") {
  auto model = slow_enough_model();
  const auto clean = run(model, 3, {});
  // The second loss lands within a few hundred microseconds of the first, while the first
  // loss's sequences are still asking the scheduler for new shards.
  for (auto gap : {std::chrono::microseconds(0), std::chrono::microseconds(300), std::chrono::microseconds(2000)}) {
    INFO("second kill " << gap.count() << " us after the first");
    const auto faulty = run(model, 3, {{1, std::chrono::milliseconds(100)}, {2, std::chrono::milliseconds(100) + gap}});
    REQUIRE(faulty.size() == clean.size());
    for (size_t i = 0; i < clean.size(); ++i) {
      INFO("request " << i);
      CHECK(faulty[i].error == "");
      CHECK(faulty[i].tokens == clean[i].tokens);
    }
  }
}

TEST_CASE("with every shard gone, work waits and then fails with a clear error", "[faults]") {
  auto model = slow_enough_model();
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt;
  opt.shards = 1;
  opt.shard_wait = std::chrono::seconds(2);
  fd::LocalNode node = fd::start_local_node(sys, model, opt);
  caf::anon_send_exit(node.shards[0], caf::exit_reason::kill);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto res = fd::generate(sys, node.scheduler, requests(2), std::chrono::seconds(30));
  for (auto& r : res) CHECK(r.error.find("no R-worker shard") != std::string::npos);
  fd::stop_local_node(node);
}

TEST_CASE("waiting for room in the batch does not count against --shard-wait", "[faults]") {
  auto model = slow_enough_model();
  fd::kernels::set_gemm_threads(1);
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt;
  opt.shards = 1;
  opt.log = false;
  opt.max_batch = 1;  // one sequence at a time: the others queue for room, a shard serving
  opt.shard_wait = std::chrono::milliseconds(1);
  // The scheduler checks waits once a second: the run must see such a check with requests queued,
  // so the queue grows until the run outlasts 1.5 s on this machine.
  for (int rounds = 1;; rounds *= 2) {
    std::vector<fd::gen_request> reqs;
    for (int r = 0; r < rounds; ++r) {
      const auto more = requests(12);
      reqs.insert(reqs.end(), more.begin(), more.end());
    }
    fd::LocalNode node = fd::start_local_node(sys, model, opt);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<fd::gen_result> res =
        fd::generate(sys, node.scheduler, reqs, std::chrono::minutes(2));
    const auto wall = std::chrono::steady_clock::now() - t0;
    fd::stop_local_node(node);
    for (size_t i = 0; i < res.size(); ++i) {
      INFO(reqs.size() << " requests, request " << i);
      CHECK(res[i].error == "");
      CHECK(res[i].tokens.size() == 160);
    }
    if (wall > std::chrono::milliseconds(1500)) break;
    REQUIRE(rounds < 16);
  }
}
