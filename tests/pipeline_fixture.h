// Runs requests through a complete single-process actor deployment (scheduler, micro-batch,
// GPU stream on the CPU backend, R-worker shards).
#pragma once
#include <memory>
#include <vector>

#include "actors/system.h"
#include "kernels/ops.h"
#include "caf/all.hpp"

struct PipelineRun {
  std::vector<fd::gen_result> results;
};

// An actor system set up as a node's, with 2 scheduler threads. CAF 0.17's system keeps a
// reference to its config, which therefore lives beside it.
struct TestSystem {
  caf::actor_system_config cfg;
  caf::actor_system sys{configured(cfg)};

  static caf::actor_system_config& configured(caf::actor_system_config& c) {
    fd::configure_caf(c, 2);
    return c;
  }
};

// A single-process node that logs nothing, with `shards` shards of `kv_memory` bytes each.
inline fd::LocalOptions test_node_options(int shards, size_t kv_memory = size_t(64) << 20) {
  fd::LocalOptions opt;
  opt.shards = shards;
  opt.log = false;
  opt.kv_memory = kv_memory;
  return opt;
}

inline std::vector<fd::gen_result> run_pipeline(std::shared_ptr<const fd::Model> model,
                                                const std::vector<fd::gen_request>& reqs,
                                                int shards,
                                                fd::kernels::KvDtype kv = fd::kernels::KvDtype::f16,
                                                int pipeline = 2, int block_tokens = 0) {
  fd::kernels::set_gemm_threads(1);  // the mini-batches call BLAS at once
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::LocalOptions opt = test_node_options(shards, size_t(256) << 20);
  opt.kv_dtype = kv;
  opt.pipeline = pipeline;
  if (block_tokens > 0) opt.block_tokens = block_tokens;  // else the default page size
  fd::LocalNode node = fd::start_local_node(sys, model, opt);
  auto out = fd::generate(sys, node.scheduler, reqs, std::chrono::minutes(10));
  fd::stop_local_node(node);
  return out;
}
