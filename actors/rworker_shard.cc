#include "actors/rworker_shard.h"

#include <chrono>
#include <memory>
#include <system_error>
#include <unordered_set>

#include "caf/all.hpp"
#include "kernels/thread_pool.h"

namespace fd {
namespace {

struct ShardState {
  ShardConfig cfg;
  std::shared_ptr<KvStore> store;
  std::shared_ptr<kernels::ThreadPool> pool;
  std::vector<KvAppend> appends;
  std::vector<kernels::AttnItem> items;
  shard_stats stats;
  std::unordered_set<uint64_t> seen;  // sequences ever served, for stats.served
  static inline const char* name = "rworker_shard";
};

// Validates the payload sizes against the rows, so a malformed peer cannot make us read past a buffer.
caf::error check_request(const ShardConfig& cfg, const attn_request& r, size_t& rows) {
  rows = 0;
  for (const auto& s : r.seqs) {
    if (s.n <= 0 || s.pos0 < 0) return caf::make_error(caf::sec::invalid_argument, "bad rows");
    rows += static_cast<size_t>(s.n);
  }
  const size_t qw = size_t(cfg.dims.n_heads) * cfg.dims.head_dim;
  const size_t kw = size_t(cfg.dims.n_kv_heads) * cfg.dims.head_dim;
  if (r.layer < 0 || r.layer >= cfg.kv.n_layers || r.q.size() != rows * qw * sizeof(float) ||
      r.k.size() != rows * kw * sizeof(uint16_t) || r.v.size() != rows * kw * sizeof(uint16_t))
    return caf::make_error(caf::sec::invalid_argument,
                           cfg.name + ": attention request for layer " + std::to_string(r.layer) + " with " +
                               std::to_string(rows) + " rows does not match the model shape (" +
                               std::to_string(r.q.size()) + "/" + std::to_string(r.k.size()) +
                               "/" + std::to_string(r.v.size()) + " bytes of Q/K/V)");
  return caf::none;
}

caf::result<attn_reply> attend(ShardState& st, const attn_request& r) {
  size_t rows = 0;
  if (auto err = check_request(st.cfg, r, rows)) return err;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t qw = size_t(st.cfg.dims.n_heads) * st.cfg.dims.head_dim;
  const size_t kw = size_t(st.cfg.dims.n_kv_heads) * st.cfg.dims.head_dim;
  if (r.layer == 0) {
    // Reserve every layer's pages up front, so a full cache fails the step before anything is written.
    try {
      for (const auto& s : r.seqs) {
        if (s.pos0 == 0) st.store->drop(s.seq);  // a re-prefill starts the sequence afresh
        st.seen.insert(s.seq);
        st.store->reserve(s.seq, s.pos0 + s.n);
      }
    } catch (const Error& e) {
      return caf::make_error(caf::sec::runtime_error, st.cfg.name + ": " + e.what());
    }
  }
  attn_reply out;
  out.step = r.step;
  out.layer = r.layer;
  out.o.resize(rows * qw * sizeof(float));
  try {
    st.appends.clear();
    size_t row = 0;
    for (const auto& s : r.seqs) {
      st.appends.push_back(KvAppend{s.seq, s.pos0, s.n, as<uint16_t>(r.k) + row * kw, as<uint16_t>(r.v) + row * kw});
      row += static_cast<size_t>(s.n);
    }
    // The new rows first (quantized for q8/q4), over the shard's threads.
    st.store->append_batch(r.layer, st.appends.data(), st.appends.size(), *st.pool);
    st.items.clear();
    row = 0;
    for (const auto& s : r.seqs) {
      st.items.push_back(kernels::AttnItem{as<float>(r.q) + row * qw, as<float>(out.o) + row * qw,
                                           s.n, s.pos0, st.store->view_blocks(s.seq, r.layer)});
      row += static_cast<size_t>(s.n);
    }
    // All sequences of the request at once, in units of kv heads and, for a long prefill, of rows
    // (kernels/attention_units.h) over the shard's threads.
    kernels::attention_batch(st.items.data(), st.items.size(), st.cfg.dims, *st.pool);
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::runtime_error, st.cfg.name + ": " + e.what());
  }
  const auto spent = std::chrono::steady_clock::now() - t0;
  st.stats.requests++;
  st.stats.busy_ms += std::chrono::duration<double, std::milli>(spent).count();
  out.compute_us = std::chrono::duration_cast<std::chrono::microseconds>(spent).count();
  return out;
}

shard_stats snapshot(const ShardState& st) {
  shard_stats s = st.stats;
  s.served = st.seen.size();
  s.name = st.cfg.name;
  s.sequences = st.store->sequences();
  s.tokens = st.store->tokens();
  s.used_pages = st.store->used_pages();
  s.free_pages = st.store->free_pages();
  s.page_bytes = st.store->page_bytes();
  return s;
}

shard_actor::behavior_type shard_behavior(shard_actor::stateful_pointer<ShardState> self,
                                          ShardConfig cfg, std::shared_ptr<KvStore> store,
                                          std::shared_ptr<kernels::ThreadPool> pool) {
  self->state.cfg = cfg;
  self->state.store = std::move(store);
  self->state.pool = std::move(pool);
  // A shard can be stopped by its link to the gpu node's side before its node asks what it served
  // (the gpu node ending, or dropping it): its last figures go to report_to as it stops.
  self->set_exit_handler([self](caf::exit_msg& m) {
    if (!m.reason) return;  // a normal exit of a linked actor does not end a shard
    if (self->state.cfg.report_to) caf::anon_send(self->state.cfg.report_to, snapshot(self->state));
    self->quit(m.reason);
  });
  return {
      [self](const attn_request& r) { return attend(self->state, r); },
      [self](drop_atom, uint64_t seq) { self->state.store->drop(seq); },
      [self](stats_atom) { return snapshot(self->state); },
  };
}

}  // namespace

shard_actor spawn_shard(caf::actor_system& sys, const ShardConfig& cfg) {
  // Built here, so that a capacity the store cannot take, or threads the system will not start,
  // throw to the caller: thrown inside the actor, they would only kill the actor.
  auto store = std::make_shared<KvStore>(cfg.kv);
  std::shared_ptr<kernels::ThreadPool> pool;
  try {
    pool = std::make_shared<kernels::ThreadPool>(std::max(1, cfg.threads));
  } catch (const std::system_error& e) {
    throw Error(cfg.name + ": cannot start " + std::to_string(cfg.threads) + " attention threads: " + e.what());
  }
  if (cfg.commit_kv) {
    try {
      store->commit(*pool);
    } catch (const Error& e) {
      throw Error(cfg.name + ": " + e.what());
    }
  }
  return sys.spawn<caf::detached>(shard_behavior, cfg, std::move(store), std::move(pool));
}

}  // namespace fd
