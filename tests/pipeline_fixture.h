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

inline std::vector<fd::gen_result> run_pipeline(std::shared_ptr<const fd::Model> model,
                                                const std::vector<fd::gen_request>& reqs,
                                                int shards,
                                                fd::kernels::KvDtype kv = fd::kernels::KvDtype::f16,
                                                int pipeline = 2, int block_tokens = 0) {
  fd::kernels::set_gemm_threads(1);  // the mini-batches call BLAS at once
  caf::actor_system_config cfg;
  fd::configure_caf(cfg, 2);
  caf::actor_system sys{cfg};
  fd::LocalOptions opt;
  opt.shards = shards;
  opt.log = false;
  opt.kv_memory = size_t(256) << 20;
  opt.kv_dtype = kv;
  opt.pipeline = pipeline;
  if (block_tokens > 0) opt.block_tokens = block_tokens;  // else the default page size
  fd::LocalNode node = fd::start_local_node(sys, model, opt);
  auto out = fd::generate(sys, node.scheduler, reqs, std::chrono::minutes(10));
  fd::stop_local_node(node);
  return out;
}
