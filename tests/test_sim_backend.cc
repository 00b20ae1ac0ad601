#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "runtime/error.h"
#include "runtime/sim_backend.h"
#include "tests/test_models.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string source_dir() {  // CMake compiles tests by absolute path: <src>/tests/this file
  const std::string f = __FILE__;
  return f.substr(0, f.rfind("/tests/"));
}

fd::ModelConfig small_model() {
  const fd::ModelConfig c =
      test_models::config(3, 64, 4, 2, 128, 300, 512);
  return c;
}

fd::SimProfile constant(double seconds) { return fd::parse_sim_profile("1 " + std::to_string(seconds), "t"); }

std::string error_of(const std::string& text) {
  try {
    fd::parse_sim_profile(text, "p.txt");
  } catch (const fd::Error& e) {
    return e.what();
  }
  return "";
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct StepOut {
  std::vector<fd::AttnIn> layers;
  std::vector<float> logits;
};

StepOut run(const fd::SPartBackend& be, const fd::StepInput& in) {
  auto st = be.make_state();
  be.embed(*st, in);
  StepOut out;
  const auto& c = be.config();
  std::vector<float> o(in.tokens.size() * static_cast<size_t>(c.q_width()), 0.5f);
  for (int l = 0; l < c.n_layers; ++l) {
    out.layers.emplace_back();
    be.attn_in(*st, l, out.layers.back());
    be.attn_out(*st, l, o.data());
  }
  be.logits(*st, out.logits);
  return out;
}

}  // namespace

TEST_CASE("sim profile: parsing, comments, model line and the shipped A10 and H200 profiles", "[sim]") {
  const auto p = fd::parse_sim_profile(
      "# header\n\nmodel  llama-7b (A10)  \n1 0.00146   # batch 1\n  1024\t7.08e-3\r\n", "x");
  CHECK(p.model == "llama-7b (A10)");
  CHECK(p.batch == std::vector<int>{1, 1024});
  CHECK(p.seconds == std::vector<double>{0.00146, 0.00708});
  const auto a10 = fd::load_sim_profile(source_dir() + "/examples/profiles/a10-llama7b.txt");
  CHECK(a10.layer_seconds(1) == Approx(1.46e-3));
  CHECK(a10.layer_seconds(1024) == Approx(7.08e-3));
  CHECK_FALSE(a10.model.empty());
  // Measured points are taken as they are; between them T(B) is interpolated.
  const auto h200 = fd::load_sim_profile(source_dir() + "/examples/profiles/h200-llama7b.txt");
  CHECK(h200.batch.front() == 1);
  CHECK(h200.batch.back() == 4096);
  CHECK(h200.layer_seconds(512) == Approx(1.616e-3));
  CHECK(h200.layer_seconds(384) > h200.layer_seconds(256));
  CHECK(h200.layer_seconds(384) < h200.layer_seconds(512));
}

TEST_CASE("sim profile: scaling and writing it back", "[sim]") {
  const auto p = fd::parse_sim_profile("model m (A10)\n1 0.00146\n1024 0.00708\n", "a.txt");
  const auto k = p.scaled(3.7);
  CHECK(k.layer_seconds(32) == Approx(3.7 * p.layer_seconds(32)));
  CHECK(k.layer_seconds(4096) == Approx(3.7 * p.layer_seconds(4096)));
  const std::string text = fd::format_sim_profile(k);
  CHECK(text.find("a.txt") != std::string::npos);
  const auto back = fd::parse_sim_profile(text, "b.txt");
  CHECK(back.model == "m (A10)");
  CHECK(back.batch == k.batch);
  CHECK(back.seconds == k.seconds);
  CHECK_THROWS_AS(p.scaled(0), fd::Error);
  CHECK_THROWS_AS(p.scaled(-2), fd::Error);
}

TEST_CASE("sim profile: errors name the file and line", "[sim]") {
  CHECK(error_of("1 0.001\n1 0.002\n").find("p.txt:2:") == 0);
  CHECK(error_of("1 0.001\n2 -0.5\n").find("p.txt:2:") == 0);
  CHECK(error_of("# x\n1 fast\n").find("p.txt:2:") == 0);
  CHECK(error_of("1 0.001 7\n").find("p.txt:1:") == 0);
  CHECK(error_of("0 0.001\n").find("p.txt:1:") == 0);
  CHECK(error_of("-4 0.001\n").find("p.txt:1:") == 0);
  CHECK(error_of("1 0.001\nmodel late\n").find("p.txt:2:") == 0);
  CHECK(error_of("model a\nmodel b\n1 1\n").find("p.txt:2:") == 0);
  CHECK(error_of("model\n").find("p.txt:1:") == 0);
  CHECK(error_of("# nothing\n").find("p.txt:") == 0);
  CHECK(error_of("1 nan\n").find("p.txt:1:") == 0);
  try {
    fd::load_sim_profile("/nonexistent/prof.txt");
    FAIL("no error");
  } catch (const fd::Error& e) {
    CHECK(std::string(e.what()).find("/nonexistent/prof.txt") != std::string::npos);
  }
}

TEST_CASE("sim profile: linear interpolation and extrapolation", "[sim]") {
  const auto p = fd::parse_sim_profile("1 0.001\n1025 0.007\n2049 0.009\n", "x");
  CHECK(p.layer_seconds(513) == Approx(0.004));           // midway on [1, 1025]
  CHECK(p.layer_seconds(1537) == Approx(0.008));          // midway on [1025, 2049]
  CHECK(p.layer_seconds(1025) == Approx(0.007));
  CHECK(p.layer_seconds(4097) == Approx(0.009 + 0.002 * 2));  // slope of the last segment
  CHECK(p.layer_seconds(0) == Approx(0.001 - 0.006 / 1024));  // slope of the first segment
  const auto steep = fd::parse_sim_profile("10 0.001\n20 0.011\n", "x");
  CHECK(steep.layer_seconds(1) == 0.0);  // clamped at 0
  CHECK(constant(0.003).layer_seconds(5000) == Approx(0.003));
}

TEST_CASE("sim backend: each layer takes T(B) split between attn_in and attn_out", "[sim]") {
  // T(B) = 2 ms + 2 µs·B: 2.5 ms at 250 rows, 6 ms at 2000 rows, half of it in each call.
  const auto prof = fd::parse_sim_profile("1 0.002002\n1001 0.004002\n", "t");
  const auto be = fd::make_sim_backend(small_model(), prof);
  for (int rows : {250, 2000}) {
    const double half = 0.5 * prof.layer_seconds(rows);
    fd::StepInput in;
    for (int r = 0; r < rows; ++r) {
      in.tokens.push_back(r % 300);
      in.pos.push_back(r % 512);
    }
    in.logit_rows = {0};
    auto st = be->make_state();
    be->embed(*st, in);
    fd::AttnIn a;
    std::vector<float> o(in.tokens.size() * 64), logits;
    // The first attn_in of a step returns after its half. attn_out is queued on the device like
    // a kernel launch; the next call waits for it, so attn_out + attn_in (one hand-over of the
    // mini-batch) last a whole T(B), and logits the last attn_out's half. The fastest of 20
    // (a shared machine preempts some) ends within 2 ms of it.
    auto t0 = Clock::now();
    be->attn_in(*st, 0, a);
    CHECK(seconds_since(t0) >= half);
    double best_layer = 1;
    for (int rep = 0; rep < 20; ++rep) {
      t0 = Clock::now();
      be->attn_out(*st, rep % 3, o.data());
      be->attn_in(*st, (rep + 1) % 3, a);
      const double t_layer = seconds_since(t0);
      CHECK(t_layer >= 2 * half);
      best_layer = std::min(best_layer, t_layer);
    }
    t0 = Clock::now();
    be->attn_out(*st, 0, o.data());
    be->logits(*st, logits);
    CHECK(seconds_since(t0) >= half);
    INFO(rows << " rows: T/2 = " << half);
    CHECK(best_layer < 2 * half + 0.002);
  }
}

TEST_CASE("sim backend: two streams share one simulated device", "[sim]") {
  // Two threads (the GPU streams of two mini-batches) each run 4 layers of 10 ms on one backend:
  // one device runs them one after the other, so together they take at least 8 layers' time
  // (two devices would finish in 4). Only a lower bound: a loaded machine can only add time.
  const auto be = fd::make_sim_backend(small_model(), constant(0.010));
  fd::StepInput in;
  in.tokens = {5, 6};
  in.pos = {0, 1};
  in.logit_rows = {1};
  const auto stream = [&] {
    auto st = be->make_state();
    be->embed(*st, in);
    fd::AttnIn a;
    std::vector<float> o(2 * 64, 0.5f);
    for (int rep = 0; rep < 4; ++rep) {
      be->attn_in(*st, rep % 3, a);
      be->attn_out(*st, rep % 3, o.data());
    }
    std::vector<float> logits;
    be->logits(*st, logits);  // waits for the last attn_out
  };
  const auto t0 = Clock::now();
  std::thread other(stream);
  stream();
  other.join();
  CHECK(seconds_since(t0) >= 8 * 0.010);
}

TEST_CASE("sim backend: outputs have the model's shape and depend only on token, position, layer",
          "[sim]") {
  const auto cfg = small_model();
  const auto be1 = fd::make_sim_backend(cfg, constant(0));
  const auto be2 = fd::make_sim_backend(cfg, constant(0));
  fd::StepInput in;
  in.tokens = {5, 17, 5, 299};
  in.pos = {0, 3, 7, 3};
  in.logit_rows = {1, 3};
  const StepOut a = run(*be1, in);
  const StepOut b = run(*be2, in);
  REQUIRE(a.layers.size() == 3);
  CHECK(a.layers[0].q.size() == 4 * 64);
  CHECK(a.layers[0].k.size() == 4 * 32);
  CHECK(a.layers[0].v.size() == 4 * 32);
  CHECK(a.logits.size() == 2 * 300);
  for (int l = 0; l < 3; ++l) {
    CHECK(a.layers[l].q == b.layers[l].q);
    CHECK(a.layers[l].k == b.layers[l].k);
    CHECK(a.layers[l].v == b.layers[l].v);
  }
  CHECK(a.logits == b.logits);
  // Values in range: q uniform in [-1, 1); rows differ between layers and tokens.
  CHECK(std::all_of(a.layers[0].q.begin(), a.layers[0].q.end(), [](float x) { return x >= -1 && x < 1; }));
  CHECK(a.layers[0].q != a.layers[1].q);
  const auto row = [](const auto& v, int r, int w) {  // a float array's row r of width w
    return std::vector<float>(v.begin() + r * w, v.begin() + (r + 1) * w);
  };
  CHECK(row(a.layers[0].q, 0, 64) != row(a.layers[0].q, 2, 64));  // same token, other position

  // One row alone gives the same values as inside the batch.
  fd::StepInput one;
  one.tokens = {299};
  one.pos = {3};
  one.logit_rows = {0};
  const StepOut c = run(*be1, one);
  for (int l = 0; l < 3; ++l) {
    CHECK(c.layers[l].q.to_vector() == row(a.layers[l].q, 3, 64));
    CHECK(c.layers[l].k.to_vector() == std::vector<uint16_t>(a.layers[l].k.begin() + 96, a.layers[l].k.end()));
  }
  CHECK(c.logits == row(a.logits, 1, 300));
}

TEST_CASE("sim backend: greedy tokens spread over the vocabulary, bad input throws", "[sim]") {
  const auto be = fd::make_sim_backend(small_model(), constant(0));
  fd::StepInput in;
  for (int r = 0; r < 100; ++r) {
    in.tokens.push_back(r);
    in.pos.push_back(r);
    in.logit_rows.push_back(r);
  }
  const StepOut out = run(*be, in);
  std::set<long> picks;
  for (int r = 0; r < 100; ++r) {
    const auto first = out.logits.begin() + r * 300;
    picks.insert(std::max_element(first, first + 300) - first);
  }
  CHECK(picks.size() > 50);  // 100 hashed picks among 300 ids: ~85 distinct expected

  auto st = be->make_state();
  fd::StepInput bad;
  bad.tokens = {300};
  bad.pos = {0};
  CHECK_THROWS_AS(be->embed(*st, bad), fd::Error);
  bad.tokens = {1};
  bad.pos = {512};
  CHECK_THROWS_AS(be->embed(*st, bad), fd::Error);
  bad.pos = {0};
  be->embed(*st, bad);
  fd::AttnIn a;
  CHECK_THROWS_AS(be->attn_in(*st, 3, a), fd::Error);
  fd::ModelConfig broken = small_model();
  broken.n_kv_heads = 3;
  CHECK_THROWS_AS(fd::make_sim_backend(broken, constant(0)), fd::Error);
}
