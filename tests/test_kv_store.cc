#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.h"
#include "kernels/thread_pool.h"
#include "runtime/kv_store.h"
#include "runtime/tensor_memory.h"
#include "tests/f16_block_layout.h"

namespace {

using fd::kernels::KvLayout;
constexpr KvLayout kLayouts[] = {KvLayout::kApart, KvLayout::kSideBySide};
const char* layout_name(KvLayout l) { return l == KvLayout::kApart ? "apart" : "side by side"; }

fd::KvStoreConfig config(int layers, int kv_heads, int head_dim, int block_tokens, size_t capacity, KvLayout layout,
                         fd::kernels::KvDtype dtype = fd::kernels::KvDtype::f16) {
  return fd::KvStoreConfig{layers, kv_heads, head_dim, block_tokens, capacity, dtype, layout};
}

fd::KvStoreConfig small_config(size_t pages, KvLayout layout = KvLayout::kApart) {
  // layers * K,V * heads * tokens * dim
  return config(2, 2, 8, 4, pages * 2 * 2 * 2 * 4 * 8 * sizeof(uint16_t), layout);
}

// Distinct value for every (seq, layer, K/V, token, head, dim) so misplaced data is caught.
uint16_t tag(uint64_t seq, int layer, int kv, int t, int h, int i) {
  return static_cast<uint16_t>((seq * 7919 + layer * 4099 + kv * 2053 + t * 37 + h * 11 + i) & 0x7BFF);
}

std::vector<uint16_t> rows(const fd::KvStoreConfig& c, uint64_t seq, int layer, int kv, int pos0, int n) {
  std::vector<uint16_t> r;
  for (int t = pos0; t < pos0 + n; ++t)
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int i = 0; i < c.head_dim; ++i) r.push_back(tag(seq, layer, kv, t, h, i));
  return r;
}

void append(fd::KvStore& s, uint64_t seq, int layer, int pos0, int n) {
  const auto k = rows(s.config(), seq, layer, 0, pos0, n);
  const auto v = rows(s.config(), seq, layer, 1, pos0, n);
  s.append(seq, layer, pos0, k.data(), v.data(), n);
}

// Every cached value read back through view() sits where the attention kernel expects it.
void check_contents(const fd::KvStore& s, uint64_t seq, int layer) {
  const auto& c = s.config();
  const auto kv = s.view(seq, layer);
  REQUIRE(kv.len == s.length(seq, layer));
  REQUIRE(kv.block_tokens == c.block_tokens);
  REQUIRE(kv.layout == s.layout());
  const size_t bt = size_t(c.block_tokens), hd = size_t(c.head_dim);
  const size_t stride = kv.layout == KvLayout::kSideBySide ? 2 * bt * hd : bt * hd;  // elements
  size_t bad = 0;
  for (int t = 0; t < kv.len; ++t)
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int i = 0; i < c.head_dim; ++i) {
        const size_t b = size_t(t) / bt, len = size_t(kv.len);
        bad += kv.k[b][f16_block_layout::key_index(size_t(t), size_t(h), size_t(i), hd, bt, len, stride)] !=
               tag(seq, layer, 0, t, h, i);
        bad += kv.v[b][f16_block_layout::value_index(size_t(t), size_t(h), size_t(i), hd, bt, len, stride)] !=
               tag(seq, layer, 1, t, h, i);
      }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("KvStore reserves, appends and reads back per layer", "[kv]") {
  for (KvLayout layout : kLayouts) {
    INFO(layout_name(layout));
    fd::KvStore s(small_config(10, layout));
    CHECK(s.layout() == layout);
    CHECK(s.page_bytes() == 512);
    CHECK(s.total_pages() == 10);
    CHECK(s.free_pages() == 10);
    CHECK_FALSE(s.contains(1));
    CHECK(s.length(1, 0) == 0);
    CHECK(s.view(1, 0).len == 0);

    s.reserve(1, 10);  // 3 pages of 4 tokens
    CHECK(s.contains(1));
    CHECK(s.used_pages() == 3);
    append(s, 1, 0, 0, 3);
    append(s, 1, 0, 3, 4);  // crosses a block boundary
    append(s, 1, 1, 0, 10);
    CHECK(s.length(1, 0) == 7);
    CHECK(s.length(1, 1) == 10);
    CHECK(s.tokens() == 7);
    check_contents(s, 1, 0);
    check_contents(s, 1, 1);

    s.reserve(1, 12);  // still 3 pages
    CHECK(s.used_pages() == 3);
    s.reserve(1, 13);
    CHECK(s.used_pages() == 4);
    append(s, 1, 1, 10, 3);
    check_contents(s, 1, 1);
    check_contents(s, 1, 0);
  }
}

TEST_CASE("KvStore append rejects gaps and unreserved positions, rewinds on overlap", "[kv]") {
  for (KvLayout layout : kLayouts) {
    INFO(layout_name(layout));
    fd::KvStore s(small_config(10, layout));
    const auto k = rows(s.config(), 5, 0, 0, 0, 9), v = rows(s.config(), 5, 0, 1, 0, 9);
    CHECK_THROWS_AS(s.append(5, 0, 0, k.data(), v.data(), 1), fd::Error);  // unknown sequence
    s.reserve(5, 8);
    CHECK_THROWS_AS(s.append(5, 0, 0, k.data(), v.data(), 9), fd::Error);  // beyond the 8 reserved
    CHECK_THROWS_AS(s.append(5, 0, 1, k.data(), v.data(), 1), fd::Error);  // gap
    // No such layer (the config holds 2): appends and both views name it.
    CHECK_THROWS_WITH(s.append(5, 2, 0, k.data(), v.data(), 1), Catch::Contains("no layer 2 (it holds 2)"));
    CHECK_THROWS_WITH(s.view(5, -1), Catch::Contains("no layer -1 (it holds 2)"));
    CHECK_THROWS_WITH(s.view_blocks(5, 2), Catch::Contains("no layer 2 (it holds 2)"));
    append(s, 5, 0, 0, 4);
    CHECK(s.length(5, 0) == 4);
    check_contents(s, 5, 0);
    append(s, 5, 0, 2, 1);  // a retried step rewinds the layer to position 2 first
    CHECK(s.length(5, 0) == 3);
    check_contents(s, 5, 0);
    // Rewinds into full (sealed) blocks, then refills them.
    append(s, 5, 0, 3, 5);
    CHECK(s.length(5, 0) == 8);
    check_contents(s, 5, 0);
    append(s, 5, 0, 3, 3);  // into block 0 (full again after it) and block 1 (left partial)
    CHECK(s.length(5, 0) == 6);
    check_contents(s, 5, 0);
    append(s, 5, 0, 6, 2);
    CHECK(s.length(5, 0) == 8);
    check_contents(s, 5, 0);
    append(s, 5, 0, 5, 0);  // a rewind that writes nothing leaves block 1 partial
    CHECK(s.length(5, 0) == 5);
    check_contents(s, 5, 0);
    append(s, 5, 0, 5, 3);
    check_contents(s, 5, 0);
  }
}

TEST_CASE("KvStore capacity error names the shortage and changes nothing", "[kv]") {
  fd::KvStoreConfig c;
  c.n_layers = 8;
  c.n_kv_heads = 4;
  c.head_dim = 128;
  c.block_tokens = 16;
  c.capacity_bytes = size_t(64) << 20;
  fd::KvStore s(c);
  REQUIRE(s.page_bytes() == size_t(256) << 10);
  REQUIRE(s.total_pages() == 256);
  s.reserve(1, 255 * 16);
  s.reserve(7, 16);
  s.drop(1);
  s.reserve(2, 254 * 16);  // one page left
  try {
    s.reserve(7, 16 * 4);
    FAIL("reserve beyond capacity did not throw");
  } catch (const fd::Error& e) {
    CHECK(std::string(e.what()) ==
          "KV-cache full: sequence 7 needs 3 more pages of 256 KiB, 1 free (capacity 64 MiB).");
  }
  CHECK(s.used_pages() == 255);
  CHECK_THROWS_AS(s.reserve(9, 17), fd::Error);
  CHECK_FALSE(s.contains(9));
  CHECK(s.sequences() == 2);
  s.reserve(7, 16 * 2);  // the last page is still there
  CHECK(s.free_pages() == 0);
}

TEST_CASE("a node's KV-cache capacity must fit the memory the machine has available", "[kv]") {
  const size_t gib = size_t(1) << 30;
  CHECK_NOTHROW(fd::check_kv_memory(gib, 2, 2 * gib));
  try {
    fd::check_kv_memory(100 * gib, 2, 22 * gib + gib / 2);
    FAIL("a capacity beyond the available memory was accepted");
  } catch (const fd::Error& e) {
    CHECK(std::string(e.what()) ==
          "KV-cache capacity of 2 shard(s) x 100 GiB = 200 GiB exceeds the 22.5 GiB of memory this machine "
          "has available; give each shard less (--kv-memory) or run fewer shards.");
  }
  CHECK_THROWS_AS(fd::check_kv_memory(gib + 1, 1, gib), fd::Error);
  CHECK_THROWS_AS(fd::check_kv_memory(SIZE_MAX / 2 + 1, 4, gib), fd::Error);  // the product would wrap
  // This machine's own figure: Linux reports it, and no store can be larger.
  const size_t here = fd::available_memory();
  CHECK(here > 0);
  CHECK_THROWS_AS(fd::check_kv_memory(here + 1, 1), fd::Error);
}

TEST_CASE("kv_memory_for sizes one store for every sequence at its longest, up to the cap", "[kv]") {
  using fd::kernels::KvDtype;
  for (KvDtype dt : {KvDtype::f16, KvDtype::q8}) {
    fd::KvStoreConfig c{5, 4, 8, 64, 0, dt};  // stories260K's shape
    const size_t gib = size_t(1) << 30;
    c.capacity_bytes = fd::kv_memory_for(c, 6, 100, gib);  // 2 pages each
    fd::KvStore s(c);
    CHECK(s.total_pages() == 12);
    for (uint64_t seq = 0; seq < 6; ++seq) s.reserve(seq, 100);
    CHECK_THROWS_AS(s.reserve(6, 1), fd::Error);
    CHECK(fd::kv_memory_for(c, 6, 100, 5 * s.page_bytes()) == 5 * s.page_bytes());  // the cap
    CHECK(fd::kv_memory_for(c, 0, 100, gib) == gib);
  }
}

TEST_CASE("KvStore drop frees pages for reuse without fragmentation", "[kv]") {
  for (KvLayout layout : kLayouts) {
    INFO(layout_name(layout));
    fd::KvStore s(small_config(10, layout));
    for (uint64_t seq = 1; seq <= 5; ++seq) {
      s.reserve(seq, 8);
      append(s, seq, 0, 0, 8);
      append(s, seq, 1, 0, 5);
    }
    CHECK(s.free_pages() == 0);
    s.drop(2);
    s.drop(4);
    s.drop(42);  // unknown: no-op
    CHECK(s.free_pages() == 4);
    CHECK(s.sequences() == 3);
    CHECK_FALSE(s.contains(2));
    s.reserve(6, 16);  // takes the four scattered pages
    CHECK(s.free_pages() == 0);
    append(s, 6, 0, 0, 16);
    append(s, 6, 1, 0, 16);
    for (uint64_t seq : {1, 3, 5}) {
      check_contents(s, seq, 0);
      check_contents(s, seq, 1);
    }
    check_contents(s, 6, 0);
    check_contents(s, 6, 1);
    std::set<const uint16_t*> blocks;  // every block of every layer is distinct memory
    for (uint64_t seq : {1, 3, 5, 6})
      for (int layer = 0; layer < 2; ++layer) {
        const auto kv = s.view(seq, layer);
        for (int b = 0; b * 4 < kv.len; ++b) {
          blocks.insert(kv.k[b]);
          blocks.insert(kv.v[b]);
        }
      }
    CHECK(blocks.size() == (2 + 2 + 2 + 4) * 2 * 2);
    CHECK(s.tokens() == 8 * 3 + 16);
  }
}

TEST_CASE("KvStore blocks keep their address while the sequence grows", "[kv]") {
  fd::KvStore s(small_config(64));
  s.reserve(1, 4);
  append(s, 1, 0, 0, 4);
  const uint16_t* first = s.view(1, 0).k[0];
  for (int n = 8; n <= 64 * 4; n += 4) {
    s.reserve(1, n);
    append(s, 1, 0, n - 4, 4);
  }
  CHECK(s.view(1, 0).k[0] == first);
  check_contents(s, 1, 0);
}

// What follows `field` (e.g. "VmFlags:", "Rss:") in /proc/self/smaps for the mapping that holds
// p ("" when none does).
static std::string smaps_field(const void* p, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') inside = lo <= at && at < hi;
    else if (inside && line.rfind(field, 0) == 0) return line.substr(field.size());
  }
  return "";
}

static std::string vm_flags_of(const void* p) { return smaps_field(p, "VmFlags:") + " "; }

// Bytes of the mapping that holds p that are in memory.
static size_t resident_bytes(const void* p) {
  const std::string rss = smaps_field(p, "Rss:");  // "   1234 kB"
  REQUIRE(!rss.empty());
  return size_t(std::stoull(rss)) * 1024;
}

// Whether this kernel has transparent huge pages, whose hint the checks below look for.
static bool kernel_has_thp() {
  if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) return true;
  WARN("this kernel has no transparent huge pages: the hint is not checked");
  return false;
}

TEST_CASE("map_huge gives 2 MiB-aligned memory with the huge-page hint", "[kv]") {
  const size_t bytes = 3 * fd::kHugePage + 4096;
  uint8_t* p = fd::map_huge(bytes);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p) % fd::kHugePage == 0);
  p[0] = 1;
  p[bytes - 1] = 2;  // all of it is writable
  CHECK(p[0] + p[bytes - 1] == 3);
  if (kernel_has_thp()) {
    CHECK(vm_flags_of(p).find(" hg ") != std::string::npos);
    CHECK(vm_flags_of(p + bytes - 1).find(" hg ") != std::string::npos);
  }
  munmap(p, bytes);
}

// The arena is read in long runs from memory; in 2 MiB pages it reads faster (kv_store.cc).
TEST_CASE("KvStore's arena asks for huge pages", "[kv]") {
  for (const KvLayout layout : kLayouts) {
    INFO(layout_name(layout));
    fd::KvStore s(config(2, 2, 8, 4, size_t(8) << 20, layout));
    s.reserve(1, 4);
    const auto kv = s.view_blocks(1, 1);
    if (kernel_has_thp()) {
      CHECK(vm_flags_of(kv.k[0]).find(" hg ") != std::string::npos);
      CHECK(vm_flags_of(kv.v[0]).find(" hg ") != std::string::npos);
    }
  }
}

// A committed store's whole capacity is in memory before anything is written; a lazy one's only
// where rows were written. One store at a time: two arenas side by side may share one mapping.
TEST_CASE("KvStore commit backs the whole capacity with memory, only while the store is empty", "[kv]") {
  const size_t capacity = size_t(64) << 20;
  fd::kernels::ThreadPool pool(2);
  for (const bool commit : {false, true}) {
    INFO((commit ? "committed" : "lazy"));
    fd::KvStore s(config(2, 2, 64, 64, capacity, KvLayout::kApart));
    const size_t bytes = s.total_pages() * s.page_bytes();
    REQUIRE(bytes > capacity / 2);
    if (commit) CHECK(s.commit(pool) == bytes);
    s.reserve(1, 64);
    append(s, 1, 0, 0, 64);
    append(s, 1, 1, 0, 64);
    const size_t resident = resident_bytes(s.view(1, 0).k[0]);
    if (commit) {
      CHECK(resident >= bytes);
    } else {
      // Four 2 MiB pages at most (K and V of two layers) of the 64 MiB.
      CHECK(resident <= 4 * fd::kHugePage);
    }
    check_contents(s, 1, 0);
    check_contents(s, 1, 1);
    try {
      s.commit(pool);
      FAIL("commit of a store that holds a sequence did not throw");
    } catch (const fd::Error& e) {
      CHECK(std::string(e.what()) == "KV-cache can commit its memory only while it holds nothing.");
    }
    check_contents(s, 1, 0);
  }
}

// Each format picks the layout its kernel reads fastest: f16 side by side where this CPU reads it
// faster so, q8 too for head blocks of 8 KiB or more, q4 never (kernels/attention_quant.cc).
TEST_CASE("KvStore takes each format's layout for its head blocks unless told otherwise", "[kv]") {
  using fd::kernels::KvDtype;
  const KvLayout f16 = fd::kernels::f16_layout();
  const auto& q8 = fd::kernels::kv_format(KvDtype::q8);
  CHECK(q8.head_block_bytes(64, 128) >= 8192);
  CHECK(q8.layout(64, 128) == f16);
  CHECK(q8.head_block_bytes(64, 64) < 8192);
  CHECK(q8.layout(64, 64) == KvLayout::kApart);
  CHECK(q8.layout(16, 128) == KvLayout::kApart);
  CHECK(fd::kernels::kv_format(KvDtype::q4).layout(64, 128) == KvLayout::kApart);
  CHECK(fd::kernels::kv_format(KvDtype::f16).layout(16, 64) == f16);
  for (const auto& [dt, hd, want] : {std::tuple{KvDtype::f16, 64, f16}, std::tuple{KvDtype::q8, 128, f16},
                                     std::tuple{KvDtype::q8, 64, KvLayout::kApart},
                                     std::tuple{KvDtype::q4, 128, KvLayout::kApart}}) {
    INFO(fd::kernels::kv_dtype_name(dt) << " hd" << hd);
    fd::KvStoreConfig c{1, 2, hd, 64, size_t(4) << 20, dt};
    CHECK(fd::KvStore(c).layout() == want);
    c.layout = KvLayout::kSideBySide;
    CHECK(fd::KvStore(c).layout() == KvLayout::kSideBySide);
  }
}

// Attention reads a layer's blocks in order, K and V with different instructions; pages reserved
// together must follow each other in memory within each layer, K by K and V by V, not be spread
// apart by the other layers' pages or by each other.
TEST_CASE("KvStore lays a layer's consecutive pages out as one run of K and one of V", "[kv]") {
  fd::KvStore s(small_config(16));
  s.reserve(1, 5 * 4);
  const size_t part = s.page_bytes() / 4;  // small_config: 2 layers, each K and V
  CHECK(part == 2 * 4 * 8 * sizeof(uint16_t));  // one page's K of both kv heads
  for (int l = 0; l < 2; ++l) {
    const auto kv = s.view_blocks(1, l);
    for (size_t b = 0; b < 5; ++b) {
      CHECK(kv.v[b] - kv.k[b] == ptrdiff_t(16 * part));  // the K of all 16 pages lie between
      if (b > 0) {
        CHECK(kv.k[b] - kv.k[b - 1] == ptrdiff_t(part));
        CHECK(kv.v[b] - kv.v[b - 1] == ptrdiff_t(part));
      }
    }
  }
  CHECK(s.view_blocks(1, 1).k[0] - s.view_blocks(1, 0).k[0] == ptrdiff_t(2 * 16 * part));
}

// Side by side, each kv head's V block follows its K block, and a layer's consecutive pages are one
// run of both.
TEST_CASE("KvStore side by side lays each kv head's K and V and a layer's consecutive pages out as one run",
          "[kv]") {
  fd::KvStore s(small_config(16, KvLayout::kSideBySide));
  s.reserve(1, 5 * 4);
  const size_t part = s.page_bytes() / 4, head = 4 * 8 * sizeof(uint16_t);  // a page's K of a layer; a head block
  for (int l = 0; l < 2; ++l) {
    const auto kv = s.view_blocks(1, l);
    CHECK(kv.layout == KvLayout::kSideBySide);
    for (size_t b = 0; b < 5; ++b) {
      CHECK(kv.v[b] - kv.k[b] == ptrdiff_t(head));
      if (b > 0) CHECK(kv.k[b] - kv.k[b - 1] == ptrdiff_t(2 * part));
    }
  }
  CHECK(s.view_blocks(1, 1).k[0] - s.view_blocks(1, 0).k[0] == ptrdiff_t(2 * 16 * part));
  // Each head's K then its V: kv head 1's key rows start two head blocks in.
  const auto k = rows(s.config(), 1, 0, 0, 0, 1), v = rows(s.config(), 1, 0, 1, 0, 1);
  s.append(1, 0, 0, k.data(), v.data(), 1);
  const auto* page = reinterpret_cast<const uint16_t*>(s.view_blocks(1, 0).k[0]);
  CHECK(page[0] == tag(1, 0, 0, 0, 0, 0));
  CHECK(page[head / 2] == tag(1, 0, 1, 0, 0, 0));
  CHECK(page[head] == tag(1, 0, 0, 0, 1, 0));
  CHECK(page[3 * head / 2] == tag(1, 0, 1, 0, 1, 0));
}

// Decoding grows a batch of sequences a page each in turn; each must still grow into a run of its
// own, and take what is left once the runs meet.
TEST_CASE("KvStore sequences that grow in turn each keep their pages in one run", "[kv]") {
  fd::KvStore s(small_config(64));
  const size_t part = s.page_bytes() / 4;  // one page's K of one layer
  for (int len = 4; len <= 8 * 4; len += 4)
    for (uint64_t seq = 1; seq <= 4; ++seq) s.reserve(seq, len);
  std::set<const uint8_t*> starts;
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    INFO("sequence " << seq);
    const auto kv = s.view_blocks(seq, 0);
    starts.insert(kv.k[0]);
    for (size_t b = 1; b < 8; ++b) CHECK(kv.k[b] - kv.k[b - 1] == ptrdiff_t(part));
  }
  CHECK(starts.size() == 4);
  for (int len = 9 * 4; len <= 16 * 4; len += 4)  // all 64 pages: the runs meet
    for (uint64_t seq = 1; seq <= 4; ++seq) s.reserve(seq, len);
  CHECK(s.free_pages() == 0);
  std::set<const uint8_t*> blocks;
  for (uint64_t seq = 1; seq <= 4; ++seq)
    for (size_t b = 0; b < 16; ++b) blocks.insert(s.view_blocks(seq, 0).k[b]);
  CHECK(blocks.size() == 64);
  CHECK_THROWS_AS(s.reserve(1, 16 * 4 + 1), fd::Error);
}

TEST_CASE("attention over a KvStore view matches attention over the same blocks", "[kv]") {
  for (KvLayout layout : kLayouts) {
    INFO(layout_name(layout));
    fd::KvStore s(config(1, 2, 64, 16, size_t(1) << 20, layout));
    const int len = 50;
    s.reserve(3, len);
    std::vector<uint16_t> k(size_t(len) * 2 * 64), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<uint16_t>(0x3000 + (i * 37) % 0x0800);  // values in [0.125, 0.5)
      v[i] = static_cast<uint16_t>(0xB000 + (i * 53) % 0x0C00);
    }
    s.append(3, 0, 0, k.data(), v.data(), 20);
    s.append(3, 0, 20, k.data() + 20 * 128, v.data() + 20 * 128, len - 20);
    // The same data laid out by hand (tests/f16_block_layout.h).
    std::vector<std::vector<uint16_t>> kb(4, std::vector<uint16_t>(2 * 16 * 64)), vb = kb;
    for (int t = 0; t < len; ++t)
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 64; ++i) {
          kb[t / 16][f16_block_layout::key_index(size_t(t), size_t(h), size_t(i), 64, 16, size_t(len))] =
              k[(size_t(t) * 2 + h) * 64 + i];
          vb[t / 16][f16_block_layout::value_index(size_t(t), size_t(h), size_t(i), 64, 16, size_t(len))] = v[(size_t(t) * 2 + h) * 64 + i];
        }
    std::vector<const uint16_t*> kp, vp;
    for (int b = 0; b < 4; ++b) {
      kp.push_back(kb[b].data());
      vp.push_back(vb[b].data());
    }
    std::vector<float> q(8 * 64), a(q.size()), b(q.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = float(int(i % 13) - 6) * 0.25f;
    const fd::kernels::AttnDims d{8, 2, 64};
    fd::kernels::attention_f16(q.data(), 1, len - 1, s.view(3, 0), d, a.data());
    fd::kernels::attention_f16(q.data(), 1, len - 1, {kp.data(), vp.data(), 16, len}, d, b.data());
    CHECK(a == b);
  }
}

TEST_CASE("KvStore with a quantized dtype encodes rows through its KvFormat", "[kv]") {
  using fd::kernels::KvDtype;
  for (KvDtype dt : {KvDtype::q8, KvDtype::q4})
    for (KvLayout layout : kLayouts) {
      const auto& f = fd::kernels::kv_format(dt);
      INFO(f.name() << " " << layout_name(layout));
      fd::KvStore s(config(2, 2, 64, 16, size_t(1) << 20, layout, dt));
      CHECK(s.layout() == layout);
      const size_t hb = f.head_block_bytes(16, 64), stride = fd::kernels::kv_head_stride(layout, hb);
      CHECK(s.page_bytes() == (2 * 2 * 2 * hb + 63) / 64 * 64);
      CHECK(s.page_bytes() < 2 * 2 * 2 * 16 * 64 * sizeof(uint16_t) / (dt == KvDtype::q8 ? 1.8 : 3.0));
      s.reserve(4, 40);
      const int n = 37;
      std::vector<uint16_t> k(size_t(n) * 2 * 64), v(k.size());
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = static_cast<uint16_t>(0x3400 + (i * 7919) % 0x0400 + ((i & 1) << 15));  // +-[0.25, 0.5)
        v[i] = static_cast<uint16_t>(0x2C00 + (i * 104729) % 0x0C00 + ((i & 2) << 14));
      }
      s.append(4, 1, 0, k.data(), v.data(), 10);
      s.append(4, 1, 10, k.data() + 10 * 128, v.data() + 10 * 128, n - 10);
      CHECK_THROWS_AS(s.view(4, 1), fd::Error);  // no fp16 view of quantized data
      const auto kv = s.view_blocks(4, 1);
      CHECK(kv.dtype == dt);
      CHECK(kv.len == n);
      size_t bad = 0;
      std::vector<uint8_t> expect(hb), block(hb), scratch(hb);
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < 2; ++h)
          for (int which = 0; which < 2; ++which) {
            std::memcpy(block.data(), (which == 0 ? kv.k : kv.v)[t / 16] + size_t(h) * stride, hb);
            const uint16_t* src = (which == 0 ? k : v).data() + (size_t(t) * 2 + h) * 64;
            const auto part = which == 0 ? fd::kernels::KvPart::key : fd::kernels::KvPart::value;
            // The store seals full blocks (q8 transposes their keys): rows are read unsealed.
            if ((t / 16 + 1) * 16 <= n) f.unseal(part, block.data(), 64, 16, scratch.data());
            f.encode_row(part, src, 64, 16, t % 16, expect.data());
            std::vector<float> got(64), want(64);
            f.decode_row(part, block.data(), 64, 16, t % 16, got.data());
            f.decode_row(part, expect.data(), 64, 16, t % 16, want.data());
            bad += got != want;
          }
      CHECK(bad == 0);
    }
  fd::KvStoreConfig c;
  c.n_layers = 1;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.dtype = KvDtype::q4;
  CHECK_THROWS_WITH(fd::KvStore(c), "KV-cache format int4 (q4) cannot hold head_dim 8: it takes head_dim in "
                                    "multiples of 32 up to 256; f16 or int8 (q8) can.");
  c.head_dim = 300;
  CHECK_THROWS_WITH(fd::KvStore(c), Catch::Contains("head_dim 300") && Catch::Contains("no KV-cache format can"));
}

TEST_CASE("KvStore append_batch writes what append writes, over threads and with repeated sequences, "
          "and nothing when an item fails",
          "[kv]") {
  using fd::kernels::KvDtype;
  for (KvDtype dt : {KvDtype::f16, KvDtype::q8, KvDtype::q4})
    for (int threads : {1, 2})
      for (KvLayout layout : kLayouts) {
        INFO(fd::kernels::kv_dtype_name(dt) << " threads " << threads << " " << layout_name(layout));
        fd::KvStoreConfig c = small_config(64, layout);
        c.head_dim = 32;
        c.dtype = dt;
        c.capacity_bytes = size_t(1) << 20;
        fd::KvStore serial(c), batched(c);
        fd::kernels::ThreadPool pool(threads);
        // Prefill lengths that end inside, at and past block ends (blocks of 4 are sealed when full),
        // then a decode step; sequence 5 comes twice in the second batch, so it runs in order.
        const std::vector<int> prefill = {1, 3, 4, 5, 9, 17};
        std::vector<std::vector<fd::KvAppend>> batches(2);
        std::vector<std::vector<uint16_t>> data;
        data.reserve(64);
        for (int layer = 0; layer < 2; ++layer) {
          for (auto& b : batches) b.clear();
          for (uint64_t seq = 0; seq < prefill.size(); ++seq) {
            const int n = prefill[seq];
            for (auto* st : {&serial, &batched}) st->reserve(seq, n + 2);
            const auto add = [&](size_t batch, int pos0, int rows_n) {
              data.push_back(rows(c, seq, layer, 0, pos0, rows_n));
              data.push_back(rows(c, seq, layer, 1, pos0, rows_n));
              batches[batch].push_back({seq, pos0, rows_n, data[data.size() - 2].data(), data.back().data()});
            };
            add(0, 0, n);
            add(1, n, 1);
            if (seq == 5) add(1, n + 1, 1);
          }
          for (const auto& b : batches) {
            for (const auto& a : b) serial.append(a.seq, layer, a.pos0, a.k, a.v, a.n);
            batched.append_batch(layer, b.data(), b.size(), pool);
          }
          data.clear();
        }
        const size_t hb = fd::kernels::kv_format(dt).head_block_bytes(c.block_tokens, c.head_dim) * size_t(c.n_kv_heads);
        size_t bad = 0;
        for (uint64_t seq = 0; seq < prefill.size(); ++seq)
          for (int layer = 0; layer < 2; ++layer) {
            const auto a = serial.view_blocks(seq, layer), b = batched.view_blocks(seq, layer);
            REQUIRE(a.len == b.len);
            CHECK(a.len == prefill[seq] + 1 + (seq == 5));
            for (int blk = 0; blk * c.block_tokens < a.len; ++blk) {
              if (layout == KvLayout::kSideBySide) {  // one run: every head's K and V
                bad += std::memcmp(a.k[blk], b.k[blk], 2 * hb) != 0;
                continue;
              }
              bad += std::memcmp(a.k[blk], b.k[blk], hb) != 0;
              bad += std::memcmp(a.v[blk], b.v[blk], hb) != 0;
            }
          }
        CHECK(bad == 0);
        // An item past its reservation: the batch throws the store's error before it writes the
        // valid item listed first, and an unknown sequence likewise.
        const auto k = rows(c, 0, 0, 0, 0, 8), v = rows(c, 0, 0, 1, 0, 8);
        const fd::KvAppend bad_items[] = {{1, 4, 1, k.data(), v.data()}, {0, 2, 8, k.data(), v.data()}};
        CHECK_THROWS_WITH(batched.append_batch(0, bad_items, 2, pool), Catch::Contains("exceeds the"));
        CHECK(batched.length(1, 0) == prefill[1] + 1);
        const fd::KvAppend unknown[] = {{1, 4, 1, k.data(), v.data()}, {99, 0, 1, k.data(), v.data()}};
        CHECK_THROWS_WITH(batched.append_batch(0, unknown, 2, pool), Catch::Contains("no sequence 99"));
        CHECK(batched.length(1, 0) == prefill[1] + 1);
      }
}
