// The KV-cache of one R-worker shard: fixed-size pages, each holding block_tokens tokens of
// every layer, so a sequence grows or is dropped without fragmentation.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kv_format.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"

namespace fd::kernels {
class ThreadPool;
}

namespace fd {

struct KvStoreConfig {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  // Tokens per page. Each kv head's K (and V) of a layer's page is one run of memory, and runs of
  // 64 tokens or more let the hardware prefetcher help: int8/int4 attention read 9-16 % faster
  // than with 16 (kernels see runs of 4.6-9 KiB there), fp16 the same.
  int block_tokens = 64;
  size_t capacity_bytes = size_t(1) << 30;
  kernels::KvDtype dtype = kernels::KvDtype::f16;  // q8/q4 quantize rows on append
  // Where a page's kv heads lie (kernels/attention.h); unset: the format's choice for this CPU
  // (KvFormat::layout).
  std::optional<kernels::KvLayout> layout = std::nullopt;
};

// One sequence's rows for KvStore::append_batch: positions [pos0, pos0 + n) of one layer.
struct KvAppend {
  uint64_t seq = 0;
  int pos0 = 0;
  int n = 0;
  const uint16_t* k = nullptr;  // [n][n_kv_heads * head_dim] fp16
  const uint16_t* v = nullptr;  // [n][n_kv_heads * head_dim] fp16
};

// Throws fd::Error when `shards` KV-caches of `per_shard` bytes each exceed `available` bytes
// (available_memory() when 0; no check when that is unknown). A store reserves its capacity as
// address space and the OS commits pages as they are written, so an overcommitted capacity would
// end with the kernel's OOM killer in mid-run instead of a "KV-cache full" answer.
void check_kv_memory(size_t per_shard, int shards, size_t available = 0);

// Bytes of one page (block_tokens tokens of every layer's K and V) in a store of cfg's shape, what
// capacity_bytes buys pages of; cfg.capacity_bytes is not read. The dtype must hold head_dim.
size_t kv_page_bytes(const KvStoreConfig& cfg);

// Capacity (bytes) of a store of cfg's shape that holds `seqs` sequences of up to `seq_tokens`
// tokens each, but no more than `cap`: what one shard needs when every sequence lands on it (the
// other shards, of this node or others, may be full, leaving or gone). cfg.capacity_bytes is
// not read.
size_t kv_memory_for(const KvStoreConfig& cfg, int seqs, int seq_tokens, size_t cap);

class KvStore {
 public:
  explicit KvStore(const KvStoreConfig& cfg);

  // Makes room for seq to hold new_len tokens in every layer (a new sequence starts at 0).
  // Throws fd::Error naming the shortage and changes nothing when the pages are not available.
  void reserve(uint64_t seq, int new_len);
  // Writes n tokens at positions [pos0, pos0+n) of one layer; k, v: [n][n_kv_heads*head_dim] fp16.
  // pos0 may not exceed the layer's current length (pos0 < length rewinds the layer to pos0
  // first, for retried steps); the range must be reserved.
  void append(uint64_t seq, int layer, int pos0, const uint16_t* k, const uint16_t* v, int n);
  // append() of items [0, n) to one layer, spread over the pool's threads (distinct sequences
  // write distinct pages). Every item is checked before any is written, so a batch that throws
  // changes nothing. A sequence listed twice makes the whole batch run in list order on the
  // calling thread, each item checked as it comes (its items before the failing one stay written).
  void append_batch(int layer, const KvAppend* items, size_t n, kernels::ThreadPool& pool);
  int length(uint64_t seq, int layer) const;  // 0 for an unknown sequence
  bool contains(uint64_t seq) const { return seqs_.count(seq) != 0; }
  kernels::KvBlocksF16 view(uint64_t seq, int layer) const;  // f16 stores only
  kernels::KvBlocks view_blocks(uint64_t seq, int layer) const;  // any dtype
  // Both views stay valid until the next reserve() or drop() of seq.
  void drop(uint64_t seq);  // frees every page of seq; unknown seq is a no-op
  // Backs the whole capacity with memory now, over the pool's threads, instead of page by page as
  // rows are first written; only while the store is empty. The capacity is then the process's own:
  // memory taken by others later cannot stop a write mid-run (with the OOM killer), and the first
  // steps pay no page faults. Throws fd::Error when the memory is not there. Returns the bytes.
  size_t commit(kernels::ThreadPool& pool);

  size_t page_bytes() const { return page_bytes_; }
  kernels::KvLayout layout() const { return layout_; }
  size_t total_pages() const { return total_pages_; }
  size_t used_pages() const { return total_pages_ - free_count_; }
  size_t free_pages() const { return free_count_; }
  size_t sequences() const { return seqs_.size(); }
  size_t tokens() const;  // sum over sequences of layer-0 length
  const KvStoreConfig& config() const { return cfg_; }

 private:
  struct Seq {
    std::vector<uint32_t> pages;
    std::vector<int> len;                           // [n_layers]
    std::vector<std::vector<const uint16_t*>> k, v; // [n_layers][pages] block pointers (f16)
    std::vector<std::vector<const uint8_t*>> kb, vb; // [n_layers][pages] the same, as bytes
    uint64_t batch = 0;  // the last append_batch that listed it (batches_), to find repeats
  };
  void check_layer(int layer) const;  // throws fd::Error for a layer the store lacks
  // The sequence, or null when it holds nothing; throws fd::Error for a layer the store lacks.
  const Seq* find_for_view(uint64_t seq, int layer) const;
  const Seq* find_seq(uint64_t seq) const;  // null for an unknown sequence
  Seq* find_seq(uint64_t seq);
  // found (find_seq(seq)), when an append() of rows [pos0, pos0 + n) of a layer may write it;
  // throws fd::Error naming what is wrong with the append.
  Seq& checked_append(Seq* found, uint64_t seq, int layer, int pos0, int n);
  // Writes a checked append, with the given seal scratch [head_bytes_], so that appends with their
  // own may run at once.
  void write_rows(Seq& s, int layer, int pos0, const uint16_t* k, const uint16_t* v, int n, uint8_t* scratch);
  // The page a sequence whose pages are `pages` takes next (one must be free): the one after its
  // last when that is free, so that its pages stay one run of memory per layer; else the middle of
  // the longest run of free pages, which leaves the run's second half for it to grow into and the
  // first for another. Sequences that grow together (decoding) then each grow into their own run.
  uint32_t next_page(const std::vector<uint32_t>& pages) const;
  // Seals or unseals every kv head of one block's K and V (kernels::KvFormat::seal).
  void set_sealed(const uint8_t* k, const uint8_t* v, bool sealed, uint8_t* scratch) const;
  KvStoreConfig cfg_;
  const kernels::KvFormat* format_ = nullptr;
  kernels::KvLayout layout_ = kernels::KvLayout::kApart;
  size_t head_bytes_ = 0;   // one kv head's rows of one block (KvFormat::head_block_bytes)
  size_t head_stride_ = 0;  // bytes from a kv head's K (or V) block to the next head's
  size_t part_bytes_ = 0;  // a page's K (or V) of one layer: [n_kv_heads][head_bytes_], to a cache line
  size_t page_bytes_ = 0;  // one page's share of the arena: n_layers * 2 * part_bytes_
  size_t total_pages_ = 0;
  struct Unmap {
    size_t bytes;
    void operator()(uint8_t* p) const;
  };
  // kApart: [n_layers][K, V][total_pages_][part_bytes_]; kSideBySide: [n_layers][total_pages_]
  // [2 * part_bytes_], each kv head's K block followed by its V block. Reserved as virtual memory
  // (the OS commits a page, 2 MiB where it can, on first write), so pages never move and block
  // pointers stay valid. A sequence's consecutive pages are then one run of K and one of V per
  // layer (kApart), or one run of both (kSideBySide). Layer-major: with pages of all
  // layers side by side, attention jumped a page's other layers every 128 KiB (hd64, 8 kv heads)
  // and read slower from memory on one core: fp16 hd64 by 6-12 %, int8 by 4-34 % (AMD EPYC Zen 5).
  // K apart from V: AMD Zen 5's hardware prefetchers follow each load instruction's addresses, and
  // the kernels read K and V with different instructions; with each page's K and V side by side,
  // each one's addresses jumped every page. One core reading memory in 4 KiB pieces in address
  // order read 29-30 GB/s with one loop, 20 with two loops taking turns. fastdecode-bench
  // attention --threads 2 --ctx 4096 --batch 16,64, with kMaxGroupQ 32, 3 alternating runs: int8
  // 26.5-42.3 -> 30.4-51.5 GB/s (hd64 GQA 1 batch 64 40.7 -> 51.5), fp16 35.5-43.0 -> 37.0-45.2,
  // int4 within noise. Intel Xeon (Emerald Rapids), batch 64: 16 threads, 2 runs, fp16 hd64 8-29 %
  // faster, the rest within the runs' spread; 8 threads, one run, -13 to +10 %. Side by side, the
  // fp16 kernel fetches each head's V while it scores its K, one run with it, and reads 1.0-1.2x as
  // fast on AMD with AVX-512 (kernels/attention.cc, SideBySideReadsFaster), where f16 stores take
  // it, and q8 stores of head blocks of 8 KiB or more (kernels/attention_quant.cc, Q8LayoutImpl).
  std::unique_ptr<uint8_t, Unmap> arena_;
  std::vector<uint8_t> page_free_;  // [total_pages_] 1 where the page is free
  size_t free_count_ = 0;
  // KvFormat::seal's scratch [head_bytes_]: [0] for append(), one per chunk of append_batch().
  std::vector<std::vector<uint8_t>> scratch_;
  std::unordered_map<uint64_t, Seq> seqs_;
  uint64_t batches_ = 0;          // append_batch calls so far
  std::vector<Seq*> batch_seqs_;  // [items] of the current append_batch, kept to reuse
};

}  // namespace fd
