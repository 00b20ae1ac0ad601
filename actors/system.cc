#include "actors/system.h"

#include "actors/gpu_stream.h"
#include "actors/parallel_stream.h"
#include "runtime/backend_loader.h"
#include "runtime/kv_store.h"
#include "runtime/parallel.h"
#include "runtime/sim_backend.h"
#include <exception>
#include <future>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "runtime/error.h"

namespace fd {

void configure_caf(caf::actor_system_config& cfg, int scheduler_threads) {
  cfg.add_message_types<caf::id_block::fastdecode>();
  cfg.set("scheduler.max-threads", std::max(2, scheduler_threads));
  // Work sharing: idle workers block on a condition variable and are woken by the next message.
  // CAF's default work stealing polls instead, and for low hop latency it must poll often; on
  // two cores its polling took the CPU from the attention kernel of a shard's detached thread:
  // a shard's compute per request (sls, 32 sequences, 7B-shaped layer) had deciles 4.3-10.9 ms
  // against 3.9-5.8 ms with work sharing, which matches the kernel alone.
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("logger.verbosity", caf::atom("quiet"));
}

r_group whole_model_group(const ModelConfig& m) {
  return r_group{0, m.n_layers, 0, m.n_heads, 0, m.n_kv_heads};
}

int threads_per_shard(int node_threads, int n) {
  if (node_threads <= 0) node_threads = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, node_threads / std::max(1, n));
}

std::vector<shard_info> spawn_shards(caf::actor_system& sys, const std::string& prefix, int n,
                                     const KvStoreConfig& kv, const kernels::AttnDims& dims,
                                     int32_t group, int threads_per_shard, caf::actor report_to,
                                     bool commit_kv) {
  // Spawned at once: each commits its KV memory (commit_kv) over its own threads, so that the
  // node's threads fault it in together.
  std::vector<std::future<shard_actor>> spawning;
  std::exception_ptr failed;
  try {
    for (int i = 0; i < n; ++i) {
      ShardConfig sc{prefix + std::to_string(i), kv, dims, threads_per_shard, report_to, commit_kv};
      spawning.push_back(std::async(std::launch::async, [&sys, sc] { return spawn_shard(sys, sc); }));
    }
  } catch (...) {  // no thread for the next shard: those spawned are stopped below
    failed = std::current_exception();
  }
  std::vector<shard_info> out;
  for (size_t i = 0; i < spawning.size(); ++i) {
    try {
      shard_info info;
      info.hdl = spawning[i].get();
      info.name = prefix + std::to_string(i);
      info.page_tokens = kv.block_tokens;
      info.group = group;
      out.push_back(info);
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  caf::scoped_actor self{sys};
  try {
    if (failed) std::rethrow_exception(failed);
    for (auto& info : out)
      self->request(info.hdl, std::chrono::seconds(30), stats_atom::value)
          .receive([&](shard_stats& s) { info.pages = s.free_pages + s.used_pages; },
                   [&](caf::error& e) { throw Error("shard " + info.name + ": " + sys.render(e)); });
  } catch (...) {
    for (auto& s : out) caf::anon_send_exit(s.hdl, caf::exit_reason::user_shutdown);
    throw;
  }
  return out;
}

namespace {

std::shared_ptr<const SPartBackend> make_s_backend(const LocalOptions& opt, const Model& model,
                                                   std::string* note) {
  if (opt.backend == "sim") {
    if (opt.sim_profile.empty()) throw Error("--backend sim needs --sim-profile FILE");
    *note = "S-part: simulated from " + opt.sim_profile;
    return make_sim_backend(model.cfg, load_sim_profile(opt.sim_profile));
  }
  return make_backend(opt.backend, model, note);
}

// One stream per mini-batch: a plain GPU stream, or a coordinator of model-parallel S-workers.
void spawn_streams(caf::actor_system& sys, const LocalOptions& opt, GpuNode& node) {
  const Model& model = *node.model;
  const int n = std::max(1, opt.pipeline);
  if (opt.tensor_parallel > 1 && opt.pipeline_parallel > 1)
    throw Error("--tensor-parallel and --pipeline-parallel cannot be combined yet");
  if ((opt.tensor_parallel > 1 || opt.pipeline_parallel > 1) && opt.backend != "cpu")
    throw Error("model parallelism runs on the CPU backend only for now (--backend cpu)");
  if (opt.tensor_parallel > 1) {
    node.groups = tensor_parallel_groups(model.cfg, opt.tensor_parallel);
    std::vector<std::shared_ptr<const TpRankBackend>> ranks;
    for (int r = 0; r < opt.tensor_parallel; ++r)
      ranks.push_back(std::make_shared<const TpRankBackend>(
          model, tp_slice(model.cfg, r, opt.tensor_parallel)));
    for (int i = 0; i < n; ++i)
      node.streams.push_back(spawn_tensor_parallel(sys, model.cfg, ranks));
    node.backend_note = "S-part: CPU, " + std::to_string(opt.tensor_parallel) + "-way tensor parallel";
    return;
  }
  if (opt.pipeline_parallel > 1) {
    node.groups = pipeline_parallel_groups(model.cfg, opt.pipeline_parallel);
    std::vector<std::shared_ptr<const SPartBackend>> stages;
    for (int s = 0; s < opt.pipeline_parallel; ++s) {
      auto m = std::make_shared<const Model>(pp_model(model, pp_stage(model.cfg, s, opt.pipeline_parallel)));
      stages.push_back(std::shared_ptr<const SPartBackend>(make_cpu_backend(*m)));
      node.keep_alive.push_back(m);
    }
    for (int i = 0; i < n; ++i)
      node.streams.push_back(spawn_pipeline_parallel(sys, model.cfg, stages, node.groups));
    node.backend_note = "S-part: CPU, " + std::to_string(opt.pipeline_parallel) + "-stage pipeline parallel";
    return;
  }
  node.groups = {whole_model_group(model.cfg)};
  auto backend = make_s_backend(opt, model, &node.backend_note);
  for (int i = 0; i < n; ++i) node.streams.push_back(spawn_gpu_stream(sys, backend));
}

}  // namespace

GpuNode start_gpu_node(caf::actor_system& sys, std::shared_ptr<const Model> model,
                       const LocalOptions& opt) {
  GpuNode node;
  node.model = model;
  spawn_streams(sys, opt, node);
  SchedulerConfig sc;
  sc.batch.model = model->cfg;
  sc.batch.eos = model->vocab.eos;
  sc.mini.model = model->cfg;
  sc.mini.groups = node.groups;
  sc.mini.timeout = opt.timeout;
  sc.groups = static_cast<int32_t>(node.groups.size());
  sc.max_batch = opt.max_batch;
  sc.shard_wait = opt.shard_wait;
  sc.admission_window = opt.admission_window;
  sc.log = opt.log;
  sc.scheduled = opt.scheduled;
  sc.schedule = opt.schedule;
  node.scheduler = spawn_scheduler(sys, sc, node.streams);
  return node;
}

void stop_gpu_node(GpuNode& node) {
  if (node.scheduler) caf::anon_send_exit(node.scheduler, caf::exit_reason::user_shutdown);
  for (auto& s : node.streams) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  node.scheduler = nullptr;
  node.streams.clear();
}

GpuNode& GpuNode::operator=(GpuNode&& o) noexcept {
  if (this != &o) {
    stop_gpu_node(*this);
    model = std::move(o.model);
    groups = std::move(o.groups);
    backend_note = std::move(o.backend_note);
    keep_alive = std::move(o.keep_alive);
    streams = std::move(o.streams);
    scheduler = std::move(o.scheduler);
    o.streams.clear();
    o.scheduler = nullptr;
  }
  return *this;
}

GpuNode::~GpuNode() { stop_gpu_node(*this); }

void configure_network(caf::actor_system_config& cfg, caf::timespan connection_timeout) {
  cfg.load<caf::io::middleman>();
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(500)});
  cfg.set("middleman.connection-timeout", connection_timeout);
  // Deserialize on the I/O thread: a BASP worker first copies every payload, and the hand-over
  // cost about 100 us per small round trip (fastdecode-bench transport --mm-workers).
  cfg.set("middleman.workers", size_t{0});
}

namespace {

// The shards of every R-group, registered with the scheduler.
void start_local_shards(caf::actor_system& sys, int hd, const LocalOptions& opt, LocalNode& node) {
  add_shards reg;
  for (size_t g = 0; g < node.gpu.groups.size(); ++g) {
    const r_group& rg = node.gpu.groups[g];
    const std::string prefix = node.gpu.groups.size() > 1 ? "g" + std::to_string(g) + "/shard-" : "shard-";
    for (auto& s : spawn_shards(sys, prefix, opt.shards,
                                KvStoreConfig{rg.layers, rg.kv_heads, hd, opt.block_tokens,
                                              opt.kv_memory, opt.kv_dtype},
                                kernels::AttnDims{rg.heads, rg.kv_heads, hd},
                                static_cast<int32_t>(g),
                                threads_per_shard(opt.attn_threads,
                                                  opt.shards * static_cast<int>(node.gpu.groups.size())),
                                {}, opt.kv_commit)) {
      node.shards.push_back(s.hdl);
      reg.shards.push_back(std::move(s));
    }
  }
  caf::scoped_actor self{sys};
  self->request(node.scheduler, std::chrono::seconds(30), std::move(reg))
      .receive([](shard_ids&) {},
               [&](caf::error& e) { throw Error("registering shards: " + sys.render(e)); });
}

}  // namespace

LocalNode start_local_node(caf::actor_system& sys, std::shared_ptr<const Model> model,
                           const LocalOptions& opt) {
  LocalNode node;
  // Before any actor starts; each S-worker of a model-parallel node has its own R-group.
  check_kv_memory(opt.kv_memory, opt.shards * std::max(1, opt.tensor_parallel) * std::max(1, opt.pipeline_parallel));
  node.gpu = start_gpu_node(sys, model, opt);
  node.scheduler = node.gpu.scheduler;
  start_local_shards(sys, model->cfg.head_dim, opt, node);  // on an error, ~LocalNode stops the rest
  return node;
}

void stop_local_node(LocalNode& node) {
  stop_gpu_node(node.gpu);
  for (auto& s : node.shards) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  node.shards.clear();
  node.scheduler = nullptr;
}

LocalNode& LocalNode::operator=(LocalNode&& o) noexcept {
  if (this != &o) {
    stop_local_node(*this);
    gpu = std::move(o.gpu);
    shards = std::move(o.shards);
    scheduler = std::move(o.scheduler);
    o.shards.clear();
    o.scheduler = nullptr;
  }
  return *this;
}

LocalNode::~LocalNode() { stop_local_node(*this); }

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
