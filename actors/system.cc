#include "actors/system.h"

#include "actors/gpu_stream.h"
#include "actors/rworker_shard.h"
#include "caf/all.hpp"

namespace fd {

void configure_caf(caf::actor_system_config& cfg, int scheduler_threads) {
  cfg.add_message_types<caf::id_block::fastdecode>();
  cfg.set("scheduler.max-threads", std::max(2, scheduler_threads));
  // CAF's default sleeps 50 µs on each idle poll, which adds up over the hops of every layer.
  cfg.set("work-stealing.moderate-sleep-duration", caf::timespan{std::chrono::microseconds(2)});
  cfg.set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::milliseconds(1)});
  cfg.set("logger.verbosity", caf::atom("quiet"));
}

LocalNode start_local_node(caf::actor_system& sys, std::shared_ptr<const Model> model,
                           const LocalOptions& opt) {
  LocalNode node;
  node.model = model;
  node.backend = make_cpu_backend(*model);
  const ModelConfig& mc = model->cfg;
  for (int i = 0; i < opt.shards; ++i) {
    ShardConfig sc;
    sc.name = "shard-" + std::to_string(i);
    sc.kv = KvStoreConfig{mc.n_layers, mc.n_kv_heads, mc.head_dim, opt.block_tokens, opt.kv_memory};
    sc.dims = kernels::AttnDims{mc.n_heads, mc.n_kv_heads, mc.head_dim};
    node.shards.push_back(spawn_shard(sys, sc));
  }
  node.stream = spawn_gpu_stream(sys, node.backend);
  SchedulerConfig sc;
  sc.batch.model = mc;
  sc.batch.eos = model->vocab.eos;
  sc.batch.timeout = opt.timeout;
  sc.max_batch = opt.max_batch;
  node.scheduler = spawn_scheduler(sys, sc, node.stream, node.shards);
  return node;
}

void stop_local_node(LocalNode& node) {
  auto kill = [](const auto& hdl) { caf::anon_send_exit(hdl, caf::exit_reason::user_shutdown); };
  kill(node.scheduler);
  kill(node.stream);
  for (auto& s : node.shards) kill(s);
}

std::vector<gen_result> generate(caf::actor_system& sys, const scheduler_actor& scheduler,
                                 const std::vector<gen_request>& reqs, caf::timespan timeout) {
  std::vector<gen_result> out(reqs.size());
  caf::scoped_actor self{sys};
  using handle = decltype(self->request(scheduler, timeout, gen_request{}));
  std::vector<handle> pending;  // all requests are sent before any answer is awaited
  for (const auto& r : reqs) pending.push_back(self->request(scheduler, timeout, r));
  for (size_t i = 0; i < pending.size(); ++i)
    pending[i].receive([&](gen_result& r) { out[i] = std::move(r); },
                       [&](caf::error& e) { out[i].error = sys.render(e); });
  return out;
}

}  // namespace fd
