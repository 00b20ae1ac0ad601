#include "runtime/kv_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/stream.h"
#include "kernels/thread_pool.h"
#include "runtime/tensor_memory.h"

namespace fd {
namespace {

constexpr size_t kPageAlign = 64;  // bytes; keeps every block on its own cache lines

// One layer's K (or V) of a page: its kv heads' blocks, rounded up to kPageAlign.
size_t part_bytes_of(const KvStoreConfig& cfg) {
  const size_t layer = static_cast<size_t>(cfg.n_kv_heads) *
                       kernels::kv_format(cfg.dtype).head_block_bytes(cfg.block_tokens, cfg.head_dim);
  return (layer + kPageAlign - 1) / kPageAlign * kPageAlign;
}

}  // namespace

size_t kv_page_bytes(const KvStoreConfig& cfg) {
  return static_cast<size_t>(cfg.n_layers) * 2 * part_bytes_of(cfg);
}

size_t kv_memory_for(const KvStoreConfig& cfg, int seqs, int seq_tokens, size_t cap) {
  if (seqs < 1 || seq_tokens < 1 || cfg.block_tokens < 1) return cap;
  const size_t per_seq = (static_cast<size_t>(seq_tokens) + cfg.block_tokens - 1) / cfg.block_tokens;
  const size_t page = kv_page_bytes(cfg);
  const size_t pages = static_cast<size_t>(seqs) * per_seq;
  return page == 0 || pages > cap / page ? cap : pages * page;
}

void check_kv_memory(size_t per_shard, int shards, size_t available) {
  if (available == 0) available = available_memory();
  if (available == 0 || shards < 1) return;
  const size_t n = static_cast<size_t>(shards);
  if (per_shard <= available / n) return;
  const size_t total = per_shard > SIZE_MAX / n ? SIZE_MAX : per_shard * n;  // saturates
  throw Error("KV-cache capacity of " + std::to_string(shards) + " shard(s) x " + format_bytes(per_shard) +
              " = " + format_bytes(total) + " exceeds the " + format_bytes(available) +
              " of memory this machine has available; give each shard less (--kv-memory) or run "
              "fewer shards.");
}

void KvStore::Unmap::operator()(uint8_t* p) const { munmap(p, bytes); }

KvStore::KvStore(const KvStoreConfig& cfg) : cfg_(cfg), arena_(nullptr, Unmap{0}) {
  if (cfg.n_layers <= 0 || cfg.n_kv_heads <= 0 || cfg.head_dim <= 0 || cfg.block_tokens <= 0)
    throw Error("KV-cache configuration is invalid: " + std::to_string(cfg.n_layers) + " layers, " +
                std::to_string(cfg.n_kv_heads) + " kv heads, head_dim " +
                std::to_string(cfg.head_dim) + ", " + std::to_string(cfg.block_tokens) +
                " tokens per block must all be positive.");
  format_ = &kernels::kv_format(cfg.dtype);
  if (!format_->supports(cfg.head_dim)) {
    std::string others;  // the formats that can
    for (const auto d : kernels::kKvDtypes)
      if (kernels::kv_format(d).supports(cfg.head_dim))
        others += (others.empty() ? "" : " or ") + kernels::kv_dtype_label(d);
    throw Error("KV-cache format " + kernels::kv_dtype_label(cfg.dtype) + " cannot hold head_dim " +
                std::to_string(cfg.head_dim) + ": it takes " + format_->head_dims() +
                (others.empty() ? "; no KV-cache format can." : "; " + others + " can."));
  }
  layout_ = cfg.layout.value_or(format_->layout(cfg.block_tokens, cfg.head_dim));
  head_bytes_ = format_->head_block_bytes(cfg.block_tokens, cfg.head_dim);
  head_stride_ = kernels::kv_head_stride(layout_, head_bytes_);
  scratch_.assign(1, std::vector<uint8_t>(head_bytes_));
  part_bytes_ = part_bytes_of(cfg);
  page_bytes_ = kv_page_bytes(cfg);
  total_pages_ = cfg.capacity_bytes / page_bytes_;
  if (total_pages_ == 0)
    throw Error("KV-cache capacity of " + format_bytes(cfg.capacity_bytes) + " is smaller than one page of " +
                format_bytes(page_bytes_) + " (" + std::to_string(cfg.block_tokens) + " tokens of " +
                std::to_string(cfg.n_layers) + " layers): give each shard more (--kv-memory) or use " +
                "smaller pages (--block-tokens).");
  if (total_pages_ > UINT32_MAX) total_pages_ = UINT32_MAX;
  const size_t bytes = total_pages_ * page_bytes_;
  uint8_t* p = map_huge(bytes);
  if (p == nullptr)
    throw Error("KV-cache could not reserve " + format_bytes(bytes) + " of address space.");
  // In 2 MiB pages (map_huge). AMD EPYC (Zen 5), fastdecode-bench attention --threads 2 --ctx
  // 512,4096 --batch 16,64 with the store and the bandwidth probe both in 4 KiB or both in 2 MiB
  // pages, 10 alternating runs, medians per cell: fp16 read 1.03-1.12x as fast beside the slow
  // stream (39-52 GB/s) and 1.05-1.25x beside the fast one (62-83 GB/s), int8 and int4
  // 0.98-1.10x, the probe 1.01-1.10x. The price is the first write of each 2 MiB: 0.09-0.14 ms
  // where the kernel has a free huge page, against 0.69 ms for 512 pages of 4 KiB, but 4.6 ms
  // where it compacts memory first (THP defrag "madvise", Debian's default); once per 2 MiB of the
  // arena, as the store first fills, or all at once where the shard commits it (commit()). A
  // store's sequences start in the middle of its longest free run (next_page), so a store a third
  // full had touched every 2 MiB of its arena.
  arena_ = std::unique_ptr<uint8_t, Unmap>(p, Unmap{bytes});
  page_free_.assign(total_pages_, 1);
  free_count_ = total_pages_;
}

size_t KvStore::commit(kernels::ThreadPool& pool) {
  if (used_pages() != 0) throw Error("KV-cache can commit its memory only while it holds nothing.");
  const size_t bytes = arena_.get_deleter().bytes;
  constexpr size_t kChunk = 16 * kHugePage;  // one task; the arena starts on a kHugePage boundary
  std::atomic<int> failed{0};
  pool.run((bytes + kChunk - 1) / kChunk, [&](size_t c) {
    uint8_t* p = arena_.get() + c * kChunk;
    const size_t n = std::min(kChunk, bytes - c * kChunk);
    // The kernel faults the range in (2 MiB pages where map_huge got them) without writing it.
    if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
    if (errno != EINVAL) {
      failed = errno;
      return;
    }
    // Linux before 5.14: write the zeros an empty store holds anyway, one byte per 4 KiB page.
    for (size_t o = 0; o < n; o += 4096) p[o] = 0;
  });
  if (const int e = failed.load())
    throw Error("KV-cache could not commit its " + format_bytes(bytes) + ": " + std::strerror(e) +
                "; give each shard less (--kv-memory) or free memory on this machine.");
  return bytes;
}

void KvStore::reserve(uint64_t seq, int new_len) {
  if (new_len < 0)
    throw Error("KV-cache cannot reserve a negative length (" + std::to_string(new_len) +
                ") for sequence " + std::to_string(seq) + ".");
  const auto it = seqs_.find(seq);
  const size_t have = it == seqs_.end() ? 0 : it->second.pages.size();
  const size_t want = (static_cast<size_t>(new_len) + cfg_.block_tokens - 1) / cfg_.block_tokens;
  const size_t more = want > have ? want - have : 0;
  if (more > free_count_)
    throw Error("KV-cache full: sequence " + std::to_string(seq) + " needs " + std::to_string(more) +
                " more pages of " + format_bytes(page_bytes_) + ", " + std::to_string(free_count_) +
                " free (capacity " + format_bytes(total_pages_ * page_bytes_) + ").");
  Seq& s = it == seqs_.end() ? seqs_[seq] : it->second;
  if (s.len.empty()) {
    s.len.assign(static_cast<size_t>(cfg_.n_layers), 0);
    s.k.resize(static_cast<size_t>(cfg_.n_layers));
    s.v.resize(static_cast<size_t>(cfg_.n_layers));
    s.kb.resize(static_cast<size_t>(cfg_.n_layers));
    s.vb.resize(static_cast<size_t>(cfg_.n_layers));
  }
  for (size_t i = 0; i < more; ++i) {
    const uint32_t page = next_page(s.pages);
    page_free_[page] = 0;
    --free_count_;
    s.pages.push_back(page);
    // kApart: a layer's K of all pages lies in one region and its V in another, so a sequence's K
    // (and V) is one run per reserved stretch of pages; kSideBySide: one run of both.
    for (size_t l = 0; l < s.len.size(); ++l) {
      if (layout_ == kernels::KvLayout::kSideBySide) {
        s.kb[l].push_back(arena_.get() + (l * total_pages_ + page) * 2 * part_bytes_);
        s.vb[l].push_back(s.kb[l].back() + head_bytes_);
      } else {
        s.kb[l].push_back(arena_.get() + ((2 * l) * total_pages_ + page) * part_bytes_);
        s.vb[l].push_back(arena_.get() + ((2 * l + 1) * total_pages_ + page) * part_bytes_);
      }
      s.k[l].push_back(reinterpret_cast<const uint16_t*>(s.kb[l].back()));
      s.v[l].push_back(reinterpret_cast<const uint16_t*>(s.vb[l].back()));
    }
  }
}

uint32_t KvStore::next_page(const std::vector<uint32_t>& pages) const {
  if (!pages.empty() && pages.back() + size_t(1) < total_pages_ && page_free_[pages.back() + 1]) return pages.back() + 1;
  size_t best = 0, best_len = 0;
  for (size_t a = 0; a < total_pages_;) {
    if (!page_free_[a]) {
      ++a;
      continue;
    }
    size_t b = a;
    while (b < total_pages_ && page_free_[b]) ++b;
    if (b - a > best_len) {
      best = a;
      best_len = b - a;
    }
    a = b;
  }
  return static_cast<uint32_t>(best + best_len / 2);
}

void KvStore::append(uint64_t seq, int layer, int pos0, const uint16_t* k, const uint16_t* v, int n) {
  write_rows(checked_append(find_seq(seq), seq, layer, pos0, n), layer, pos0, k, v, n, scratch_[0].data());
}

void KvStore::append_batch(int layer, const KvAppend* items, size_t n, kernels::ThreadPool& pool) {
  // A repeated sequence's later items depend on its earlier ones (their lengths), so such a batch
  // is checked and written item by item, in order.
  ++batches_;
  batch_seqs_.resize(n);
  bool repeated = false;
  for (size_t i = 0; i < n && !repeated; ++i) {
    Seq* s = batch_seqs_[i] = find_seq(items[i].seq);
    if (s == nullptr) continue;  // checked_append names it below
    repeated = s->batch == batches_;
    s->batch = batches_;
  }
  if (n < 2 || repeated) {
    for (size_t i = 0; i < n; ++i) append(items[i].seq, layer, items[i].pos0, items[i].k, items[i].v, items[i].n);
    return;
  }
  for (size_t i = 0; i < n; ++i) checked_append(batch_seqs_[i], items[i].seq, layer, items[i].pos0, items[i].n);
  // A few chunks per thread, handed out as threads free up (prefill items differ in size), each
  // with its own seal scratch.
  const size_t chunks = std::min(n, static_cast<size_t>(4 * pool.threads()));
  if (scratch_.size() < chunks) scratch_.resize(chunks, std::vector<uint8_t>(head_bytes_));
  pool.run(chunks, [&](size_t c) {
    for (size_t i = c * n / chunks; i < (c + 1) * n / chunks; ++i)
      write_rows(*batch_seqs_[i], layer, items[i].pos0, items[i].k, items[i].v, items[i].n, scratch_[c].data());
  });
}

const KvStore::Seq* KvStore::find_seq(uint64_t seq) const {
  const auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

KvStore::Seq* KvStore::find_seq(uint64_t seq) {
  return const_cast<Seq*>(std::as_const(*this).find_seq(seq));
}

void KvStore::check_layer(int layer) const {
  if (layer < 0 || layer >= cfg_.n_layers)
    throw Error("KV-cache has no layer " + std::to_string(layer) + " (it holds " +
                std::to_string(cfg_.n_layers) + ").");
}

KvStore::Seq& KvStore::checked_append(Seq* found, uint64_t seq, int layer, int pos0, int n) {
  if (found == nullptr)
    throw Error("KV-cache has no sequence " + std::to_string(seq) + " to append to.");
  check_layer(layer);
  Seq& s = *found;
  const int cur = s.len[static_cast<size_t>(layer)];
  // pos0 < cur rewinds: a step retried after a shard failure rewrites the rows it already gave.
  if (pos0 < 0 || pos0 > cur)
    throw Error("KV-cache append to sequence " + std::to_string(seq) + " layer " +
                std::to_string(layer) + " starts at position " + std::to_string(pos0) +
                " but the layer holds " + std::to_string(cur) + " tokens.");
  const size_t reserved = s.pages.size() * static_cast<size_t>(cfg_.block_tokens);
  if (n < 0 || static_cast<size_t>(pos0) + static_cast<size_t>(n) > reserved)
    throw Error("KV-cache append of " + std::to_string(n) + " tokens at position " +
                std::to_string(pos0) + " exceeds the " + std::to_string(reserved) +
                " tokens reserved for sequence " + std::to_string(seq) + ".");
  return s;
}

void KvStore::write_rows(Seq& s, int layer, int pos0, const uint16_t* k, const uint16_t* v, int n,
                         uint8_t* scratch) {
  const size_t bt = static_cast<size_t>(cfg_.block_tokens);
  const int cur = s.len[static_cast<size_t>(layer)];
  const size_t row = static_cast<size_t>(cfg_.n_kv_heads) * cfg_.head_dim;  // fp16 values
  auto& kb = s.kb[static_cast<size_t>(layer)];
  auto& vb = s.vb[static_cast<size_t>(layer)];
  // Full blocks are sealed (kernels/kv_format.h): a rewind into one unseals it first.
  const size_t first = static_cast<size_t>(pos0) / bt;
  if ((first + 1) * bt <= static_cast<size_t>(cur)) set_sealed(kb[first], vb[first], false, scratch);
  for (int t = 0; t < n; ++t) {
    const size_t pos = static_cast<size_t>(pos0 + t);
    const size_t b = pos / bt;
    const int tb = static_cast<int>(pos % bt);
    // Blocks are written only through the store, which owns the arena.
    auto* kd = const_cast<uint8_t*>(kb[b]);
    auto* vd = const_cast<uint8_t*>(vb[b]);
    // The next head's lines are fetched while this one's rows are encoded (KvFormat::prefetch_row).
    const auto prefetch = [&](int h) {
      format_->prefetch_row(kernels::KvPart::key, cfg_.head_dim, cfg_.block_tokens, tb, kd + h * head_stride_);
      format_->prefetch_row(kernels::KvPart::value, cfg_.head_dim, cfg_.block_tokens, tb, vd + h * head_stride_);
    };
    prefetch(0);
    for (int h = 0; h < cfg_.n_kv_heads; ++h) {
      if (h + 1 < cfg_.n_kv_heads) prefetch(h + 1);
      const size_t src = static_cast<size_t>(t) * row + static_cast<size_t>(h) * cfg_.head_dim;
      format_->encode_row(kernels::KvPart::key, k + src, cfg_.head_dim, cfg_.block_tokens, tb, kd + h * head_stride_);
      format_->encode_row(kernels::KvPart::value, v + src, cfg_.head_dim, cfg_.block_tokens, tb, vd + h * head_stride_);
    }
  }
  const size_t end = static_cast<size_t>(pos0 + n);
  for (size_t b = first; (b + 1) * bt <= end; ++b) set_sealed(kb[b], vb[b], true, scratch);
  kernels::streaming_fence();  // the rows are read next by attention, maybe on another thread
  s.len[static_cast<size_t>(layer)] = pos0 + n;
}

void KvStore::set_sealed(const uint8_t* k, const uint8_t* v, bool sealed, uint8_t* scratch) const {
  // Blocks are written only through the store, which owns the arena.
  auto* kd = const_cast<uint8_t*>(k);
  auto* vd = const_cast<uint8_t*>(v);
  for (int h = 0; h < cfg_.n_kv_heads; ++h)
    for (auto [part, d] : {std::pair{kernels::KvPart::key, kd}, {kernels::KvPart::value, vd}}) {
      uint8_t* hb = d + h * head_stride_;
      if (sealed)
        format_->seal(part, hb, cfg_.head_dim, cfg_.block_tokens, scratch);
      else
        format_->unseal(part, hb, cfg_.head_dim, cfg_.block_tokens, scratch);
    }
}

int KvStore::length(uint64_t seq, int layer) const {
  const Seq* s = find_seq(seq);
  if (s == nullptr || layer < 0 || layer >= cfg_.n_layers) return 0;
  return s->len[static_cast<size_t>(layer)];
}

const KvStore::Seq* KvStore::find_for_view(uint64_t seq, int layer) const {
  const Seq* s = find_seq(seq);
  if (s != nullptr) check_layer(layer);
  return s;
}

kernels::KvBlocksF16 KvStore::view(uint64_t seq, int layer) const {
  if (cfg_.dtype != kernels::KvDtype::f16)
    throw Error(std::string("KV-cache holds ") + format_->name() +
                " values, which have no fp16 view; use view_blocks().");
  kernels::KvBlocksF16 kv;
  kv.block_tokens = cfg_.block_tokens;
  kv.layout = layout_;
  if (const Seq* s = find_for_view(seq, layer)) {
    const size_t l = static_cast<size_t>(layer);
    kv.k = s->k[l].data();
    kv.v = s->v[l].data();
    kv.len = s->len[l];
  }
  return kv;
}

kernels::KvBlocks KvStore::view_blocks(uint64_t seq, int layer) const {
  kernels::KvBlocks kv;
  kv.dtype = cfg_.dtype;
  kv.block_tokens = cfg_.block_tokens;
  kv.layout = layout_;
  if (const Seq* s = find_for_view(seq, layer)) {
    const size_t l = static_cast<size_t>(layer);
    kv.k = s->kb[l].data();
    kv.v = s->vb[l].data();
    kv.len = s->len[l];
  }
  return kv;
}

void KvStore::drop(uint64_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const auto& pages = it->second.pages;
  for (uint32_t p : pages) page_free_[p] = 1;
  free_count_ += pages.size();
  seqs_.erase(it);
}

size_t KvStore::tokens() const {
  size_t n = 0;
  for (const auto& [id, s] : seqs_) n += static_cast<size_t>(s.len[0]);
  return n;
}

}  // namespace fd
