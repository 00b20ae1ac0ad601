#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "temp_files.h"
#include "runtime/gguf.h"
#include "runtime/gguf_writer.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using fd::GgmlType;
using fd::GgufArray;
using fd::GgufFile;
using fd::GgufType;
using fd::GgufValue;
using fd::GgufWriter;

namespace {

// Each TempDir of this file is named after it.
struct TempDir : testing_files::TempDir {
  TempDir() : testing_files::TempDir("gguf") {}
};
using testing_files::Bytes;
using testing_files::find_bytes;
using testing_files::read_bytes;
using testing_files::write_bytes;

template <class T>
void poke(Bytes& b, size_t offset, T v) {
  REQUIRE(offset + sizeof(T) <= b.size());
  std::memcpy(b.data() + offset, &v, sizeof(T));
}

// The message of the fd::Error thrown while opening path.
std::string open_error(const std::string& path) {
  try {
    GgufFile f(path);
  } catch (const fd::Error& e) {
    return e.what();
  }
  FAIL("opening " << path << " did not throw");
  return {};
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i) - static_cast<float>(n) / 3.0f);
  return v;
}

// Two tensors whose data sizes (128 bytes each) are multiples of the alignment, so the file ends
// exactly where the last tensor's data ends.
const char* const kAlpha = "tensor.alpha";
const char* const kBeta = "tensor.beta";

Bytes write_small(const std::string& path) {
  GgufWriter w;
  w.add_string("general.name", "small");
  w.add_strings("list.of.strings", {"a", "bc", "def"});
  w.add_u32("some.count", 7);
  w.add_bool("some.flag", true);
  w.add_tensor(kAlpha, {8, 4}, GgmlType::f32, ramp(32, 0.5f));
  w.add_tensor(kBeta, {32, 2}, GgmlType::f16, ramp(64, 0.25f));
  w.write(path);
  return read_bytes(path);
}

// Field offsets inside the tensor info of `name` (written with 2 dimensions).
struct InfoFields {
  size_t n_dims, ne, type, offset;
};
InfoFields info_fields(const Bytes& b, const std::string& name) {
  const size_t at = find_bytes(b, name) + name.size();
  return {at, at + 4, at + 4 + 16, at + 4 + 16 + 4};
}

double uniform(std::mt19937_64& g, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(g() >> 11) * 0x1.0p-53;
}

}  // namespace

TEST_CASE("GGUF metadata of every type round-trips through the writer", "[gguf]") {
  TempDir dir;
  const std::string path = dir.file("meta.gguf");
  GgufWriter w;
  w.add_u8("u8", 255);
  w.add_i8("i8", -128);
  w.add_u16("u16", 65535);
  w.add_i16("i16", -32768);
  w.add_u32("u32", 4294967295u);
  w.add_i32("i32", std::numeric_limits<int32_t>::min());
  w.add_u64("u64", std::numeric_limits<uint64_t>::max());
  w.add_i64("i64", std::numeric_limits<int64_t>::min());
  w.add_f32("f32", -0.1f);
  w.add_f64("f64", 3.141592653589793);
  w.add_bool("yes", true);
  w.add_bool("no", false);
  w.add_string("str", "h\xc3\xa9llo \xe2\x96\x81 world");
  w.add_string("empty", "");
  w.add_strings("strs", {"x", "", "yz"});
  w.add_f32s("f32s", {1.5f, -2.25f});
  w.add_i32s("i32s", {-7, 0, 2147483647});
  w.add_array("u16s", GgufType::u16, GgufArray{{uint64_t{1}, uint64_t{65535}}});
  w.add_array("i64s", GgufType::i64, GgufArray{{int64_t{-5}, int64_t{1} << 40}});
  w.add_array("f64s", GgufType::f64, GgufArray{{0.125, -1e300}});
  w.add_array("bools", GgufType::boolean, GgufArray{{true, false, true}});
  w.add_array("none", GgufType::u8, GgufArray{});
  w.add_array_of_arrays("nested", {{GgufType::i8, GgufArray{{int64_t{-1}, int64_t{2}}}},
                                   {GgufType::string, GgufArray{{std::string("deep")}}}});
  w.write(path);

  GgufFile f(path);
  CHECK(f.version() == 3);
  CHECK(f.tensors().empty());
  CHECK(std::get<uint64_t>(*f.find("u8")) == 255);
  CHECK(std::get<int64_t>(*f.find("i8")) == -128);
  CHECK(std::get<uint64_t>(*f.find("u16")) == 65535);
  CHECK(std::get<int64_t>(*f.find("i16")) == -32768);
  CHECK(f.get_int("u32") == 4294967295LL);
  CHECK(f.get_int("i32") == std::numeric_limits<int32_t>::min());
  CHECK(std::get<uint64_t>(*f.find("u64")) == std::numeric_limits<uint64_t>::max());
  CHECK(f.get_int("i64") == std::numeric_limits<int64_t>::min());
  CHECK(f.get_float("f32") == static_cast<double>(-0.1f));
  CHECK(f.get_float("f64") == 3.141592653589793);
  CHECK(f.get_float("u8") == 255.0);
  CHECK(f.get_bool("yes", false));
  CHECK_FALSE(f.get_bool("no", true));
  CHECK(f.get_bool("absent", true));
  CHECK(f.get_string("str") == "h\xc3\xa9llo \xe2\x96\x81 world");
  CHECK(f.get_string("empty").empty());
  CHECK(f.get_strings("strs") == std::vector<std::string>{"x", "", "yz"});
  CHECK(f.get_floats("f32s") == std::vector<double>{1.5, -2.25});
  CHECK(f.get_ints("i32s") == std::vector<int64_t>{-7, 0, 2147483647});
  CHECK(f.get_ints("u16s") == std::vector<int64_t>{1, 65535});
  CHECK(f.get_ints("i64s") == std::vector<int64_t>{-5, int64_t{1} << 40});
  CHECK(f.get_floats("f64s") == std::vector<double>{0.125, -1e300});
  const auto& bools = std::get<GgufArray>(*f.find("bools")).items;
  REQUIRE(bools.size() == 3);
  CHECK((std::get<bool>(bools[0]) && !std::get<bool>(bools[1]) && std::get<bool>(bools[2])));
  CHECK(f.get_ints("none").empty());
  const auto& nested = std::get<GgufArray>(*f.find("nested")).items;
  REQUIRE(nested.size() == 2);
  const auto& inner0 = std::get<GgufArray>(nested[0]).items;
  REQUIRE(inner0.size() == 2);
  CHECK(std::get<int64_t>(inner0[0]) == -1);
  CHECK(std::get<int64_t>(inner0[1]) == 2);
  CHECK(std::get<std::string>(std::get<GgufArray>(nested[1]).items.at(0)) == "deep");
  CHECK(f.get_int("absent", 42) == 42);
  CHECK(f.get_float("absent", 0.5) == 0.5);

  CHECK_THROWS_WITH(f.get_int("missing.key"),
                    StartsWith(path + ": ") && Contains("missing metadata key 'missing.key'"));
  CHECK_THROWS_WITH(f.get_int("str"), Contains("metadata 'str'") && Contains("not an integer"));
  CHECK_THROWS_WITH(f.get_int("u64"), Contains("metadata 'u64'"));
  CHECK_THROWS_WITH(f.get_string("u8"), Contains("not a string"));
  CHECK_THROWS_WITH(f.get_strings("i32s"), Contains("not an array of strings"));
  CHECK_THROWS_WITH(f.get_bool("u8", true), Contains("not a bool"));
  CHECK_THROWS_WITH(f.get_float("strs"), Contains("not a number"));
}

TEST_CASE("GGUF writer rejects inconsistent input", "[gguf]") {
  GgufWriter w;
  w.add_u32("k", 1);
  CHECK_THROWS_WITH(w.add_u8("k", 2), Contains("duplicate metadata key 'k'"));
  CHECK_THROWS_WITH(w.add_array("a", GgufType::u8, GgufArray{{uint64_t{256}}}), Contains("metadata 'a'"));
  CHECK_THROWS_WITH(w.add_array("b", GgufType::i32, GgufArray{{std::string("x")}}), Contains("metadata 'b'"));
  CHECK_THROWS_WITH(w.add_tensor("t", {4, 2}, GgmlType::f32, std::vector<float>(7)), Contains("tensor 't'"));
  CHECK_THROWS_WITH(w.add_tensor("q", {16}, GgmlType::q8_0, std::vector<float>(16)), Contains("multiple of 32"));
  w.add_tensor("t", {4, 2}, GgmlType::f32, std::vector<float>(8));
  CHECK_THROWS_WITH(w.add_tensor("t", {8}, GgmlType::f32, std::vector<float>(8)),
                    Contains("duplicate tensor name 't'"));
  CHECK_THROWS_WITH(w.set_alignment(48), Contains("power of two"));
}

TEST_CASE("GGUF tensors of every type round-trip through the writer", "[gguf]") {
  TempDir dir;
  const std::string path = dir.file("tensors.gguf");
  std::mt19937_64 g(7);

  std::vector<float> f32(5 * 3);
  for (float& x : f32) x = static_cast<float>(uniform(g, -3, 3));

  // fp16: values exactly representable (incl. max normal 65504, min normal 2^-14, min subnormal
  // 2^-24, signed zero), 1/3 (rounds to 0x3555 = 0.333251953125), then random values.
  std::vector<float> f16 = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 0x1.0p-14f, 0x1.0p-24f, -0x1.8p-20f, 1.0f / 3.0f};
  while (f16.size() < 7 * 2 * 3) f16.push_back(static_cast<float>(uniform(g, -4, 4)));

  // bf16: exact values, then ties that round to even (1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6), then random.
  std::vector<float> bf16 = {1.5f, -3.0f, 0x1.0p-100f, 1.0f + 0x1.0p-8f, 1.0f + 3 * 0x1.0p-8f};
  while (bf16.size() < 16) bf16.push_back(static_cast<float>(uniform(g, -100, 100)));

  // q8_0: block 0 holds multiples of d = 0.5 with max 127 * 0.5, so it quantizes exactly; the rest is random.
  std::vector<float> q8(64 * 2);
  for (size_t i = 0; i < 32; ++i) q8[i] = 0.5f * static_cast<float>(static_cast<int>(i * 9 % 255) - 127);
  q8[5] = 63.5f;
  for (size_t i = 32; i < q8.size(); ++i) q8[i] = static_cast<float>(uniform(g, -0.02, 0.02));

  std::vector<float> cube(4 * 3 * 2);
  for (float& x : cube) x = static_cast<float>(uniform(g, -1, 1));

  GgufWriter w;
  w.set_alignment(64);
  w.add_tensor("f32", {5, 3}, GgmlType::f32, f32.data());
  w.add_tensor("f16", {7, 2, 3}, GgmlType::f16, f16.data());
  w.add_tensor("bf16", {16}, GgmlType::bf16, bf16.data());
  w.add_tensor("q8", {64, 2}, GgmlType::q8_0, q8.data());
  w.add_tensor("cube", {4, 3, 2, 1}, GgmlType::f32, std::vector<float>(cube));
  w.write(path);

  GgufFile f(path);
  REQUIRE(f.tensors().size() == 5);
  for (const auto& t : f.tensors()) CHECK(t.offset % 64 == 0);
  const fd::GgufTensorInfo* info = f.find_tensor("f16");
  REQUIRE(info);
  CHECK(info->type == GgmlType::f16);
  CHECK(info->ne == std::vector<uint64_t>{7, 2, 3});
  CHECK(info->n_bytes == 7 * 2 * 3 * 2);
  CHECK(f.find_tensor("q8")->n_bytes == 4 * 34);
  CHECK(f.find_tensor("absent") == nullptr);

  CHECK(f.read_f32("f32", {5, 3}) == f32);

  const std::vector<float> h = f.read_f32("f16", {7, 2, 3});
  REQUIRE(h.size() == f16.size());
  for (size_t i = 0; i < 8; ++i) CHECK(h[i] == f16[i]);
  CHECK(std::signbit(h[1]));
  CHECK(h[8] == 0.333251953125f);
  // Round to nearest with an 11-bit significand: relative error at most 2^-11 for normal values.
  for (size_t i = 9; i < h.size(); ++i) CHECK(std::fabs(h[i] - f16[i]) <= std::fabs(f16[i]) * 0x1.0p-11f);

  const std::vector<float> b = f.read_f32("bf16", {16});
  CHECK(b[0] == 1.5f);
  CHECK(b[1] == -3.0f);
  CHECK(b[2] == 0x1.0p-100f);
  CHECK(b[3] == 1.0f);
  CHECK(b[4] == 1.0f + 0x1.0p-6f);
  // 8-bit significand: relative error at most 2^-8.
  for (size_t i = 5; i < b.size(); ++i) CHECK(std::fabs(b[i] - bf16[i]) <= std::fabs(bf16[i]) * 0x1.0p-8f);

  const std::vector<float> q = f.read_f32("q8", {64, 2});
  for (size_t i = 0; i < 32; ++i) CHECK(q[i] == q8[i]);
  // Per block d = amax/127 is stored as fp16 (relative error 2^-11); |x - q*d16| <= d/2 + 127*d*2^-11 < 0.57*d.
  for (size_t blk = 1; blk < 4; ++blk) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(q8[blk * 32 + j]));
    for (size_t j = 0; j < 32; ++j) CHECK(std::fabs(q[blk * 32 + j] - q8[blk * 32 + j]) <= 0.57f * amax / 127.0f);
  }

  CHECK(f.read_f32("cube", {4, 3, 2}) == cube);
  CHECK(f.read_f32("cube", {4, 3, 2, 1}) == cube);
  CHECK_THROWS_WITH(f.read_f32("cube", {4, 6}), StartsWith(path + ": ") && Contains("tensor 'cube'") &&
                                                    Contains("[4, 3, 2, 1]") && Contains("[4, 6]"));
  CHECK_THROWS_WITH(f.read_f32("blk.3.attn_k.weight", {4}),
                    StartsWith(path + ": ") && Contains("missing tensor 'blk.3.attn_k.weight'"));
}

TEST_CASE("GGUF version 2 files are read", "[gguf]") {
  TempDir dir;
  const std::string path = dir.file("v2.gguf");
  Bytes b = write_small(path);
  poke<uint32_t>(b, 4, 2);
  write_bytes(path, b);
  GgufFile f(path);
  CHECK(f.version() == 2);
  CHECK(f.get_int("some.count") == 7);
  CHECK(f.read_f32(kAlpha, {8, 4}) == ramp(32, 0.5f));
}

TEST_CASE("GGUF reader reports truncated files", "[gguf]") {
  TempDir dir;
  const std::string path = dir.file("small.gguf");
  const Bytes good = write_small(path);
  const std::string cut = dir.file("cut.gguf");

  SECTION("at selected offsets with the place named") {
    const InfoFields beta = info_fields(good, kBeta);
    struct Case {
      size_t at;
      const char* phrase;
    };
    const Case cases[] = {
        {0, "truncated file (header needs 4 bytes at offset 0, file has 0)"},
        {2, "truncated file (header needs 4 bytes"},
        {6, "truncated file (header needs 4 bytes at offset 4"},
        {12, "truncated file (header needs 8 bytes at offset 8"},
        {20, "truncated file (header needs 8 bytes at offset 16"},
        {find_bytes(good, "def") + 1, "metadata 'list.of.strings' has a string length of 3 bytes"},
        {find_bytes(good, "bc") + 1, "metadata 'list.of.strings' claims an array of 3 elements"},
        {beta.type + 2, "truncated file (tensor info 1 ('tensor.beta') needs 4 bytes at offset"},
        {beta.offset + 5, "truncated file (tensor info 1 ('tensor.beta') needs 8 bytes"},
        {good.size() - 1, "extends past the end of the file"},
        {good.size() - 128, "extends past the end of the file"},
    };
    for (const Case& c : cases) {
      INFO("cut at " << c.at);
      write_bytes(cut, Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(c.at)));
      const std::string msg = open_error(cut);
      CHECK_THAT(msg, StartsWith(cut + ": ") && Contains(c.phrase) && Contains("truncated"));
    }
  }

  SECTION("at every offset, always as one fd::Error naming the file") {
    for (size_t at = 0; at < good.size(); ++at) {
      INFO("cut at " << at);
      write_bytes(cut, Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(at)));
      CHECK_THAT(open_error(cut), StartsWith(cut + ": "));
    }
  }
}

TEST_CASE("GGUF reader rejects malformed headers and tensor infos", "[gguf]") {
  TempDir dir;
  const std::string path = dir.file("bad.gguf");
  const Bytes good = write_small(path);
  Bytes b = good;
  std::string phrase;

  SECTION("bad magic") {
    std::memcpy(b.data(), "GGML", 4);
    phrase = "not a GGUF file (bad magic bytes 47 47 4d 4c)";
  }
  SECTION("version 1") {
    poke<uint32_t>(b, 4, 1);
    phrase = "unsupported GGUF version 1";
  }
  SECTION("version 99") {
    poke<uint32_t>(b, 4, 99);
    phrase = "unsupported GGUF version 99";
  }
  SECTION("huge n_tensors") {
    poke<uint64_t>(b, 8, uint64_t{1} << 60);
    phrase = "header claims 1152921504606846976 tensors";
  }
  SECTION("huge n_kv") {
    poke<uint64_t>(b, 16, uint64_t{1} << 58);
    phrase = "header claims 288230376151711744 metadata entries";
  }
  SECTION("huge string length of a key") {
    poke<uint64_t>(b, find_bytes(b, "general.name") - 8, uint64_t{1} << 62);
    phrase = "metadata entry 0 has a string length of 4611686018427387904 bytes at offset 24";
  }
  SECTION("huge string length of a value") {
    poke<uint64_t>(b, find_bytes(b, "small") - 8, ~uint64_t{0});
    phrase = "metadata 'general.name' has a string length of 18446744073709551615 bytes";
  }
  SECTION("huge array count") {
    const size_t key = find_bytes(b, "list.of.strings") + std::strlen("list.of.strings");
    poke<uint64_t>(b, key + 8, uint64_t{1} << 40);  // after the value type and the element type
    phrase = "metadata 'list.of.strings' claims an array of 1099511627776 elements";
  }
  SECTION("unknown metadata value type") {
    poke<uint32_t>(b, find_bytes(b, "some.count") + std::strlen("some.count"), 13);
    phrase = "metadata 'some.count' has unknown metadata value type 13";
  }
  SECTION("invalid bool") {
    poke<uint8_t>(b, find_bytes(b, "some.flag") + std::strlen("some.flag") + 4, 7);
    phrase = "metadata 'some.flag' has an invalid bool value 7";
  }
  SECTION("duplicate key") {
    GgufWriter w;
    w.add_u8("dup.aaaa", 1);
    w.add_u8("dup.bbbb", 2);
    w.write(path);
    b = read_bytes(path);
    std::memcpy(b.data() + find_bytes(b, "dup.bbbb"), "dup.aaaa", 8);
    phrase = "duplicate metadata 'dup.aaaa'";
  }
  SECTION("too many dimensions") {
    poke<uint32_t>(b, info_fields(b, kAlpha).n_dims, 5);
    phrase = "tensor 'tensor.alpha' has 5 dimensions (at most 4 are supported)";
  }
  SECTION("unsupported tensor type q4_0") {
    poke<uint32_t>(b, info_fields(b, kAlpha).type, 2);
    phrase = "tensor 'tensor.alpha' has unsupported type 2";
  }
  SECTION("unknown tensor type") {
    poke<uint32_t>(b, info_fields(b, kBeta).type, 200);
    phrase = "tensor 'tensor.beta' has unsupported type 200";
  }
  SECTION("data offset beyond the file") {
    poke<uint64_t>(b, info_fields(b, kBeta).offset, uint64_t{1} << 40);
    phrase = "tensor 'tensor.beta' data (128 bytes at offset 1099511627776 of the data section";
  }
  SECTION("data offset at the end of the file") {
    poke<uint64_t>(b, info_fields(b, kBeta).offset, 256);
    phrase = "extends past the end of the file";
  }
  SECTION("misaligned data offset") {
    poke<uint64_t>(b, info_fields(b, kBeta).offset, 100);
    phrase = "tensor 'tensor.beta' data offset 100 is not a multiple of the alignment 32";
  }
  SECTION("overflowing element count") {
    const InfoFields a = info_fields(b, kAlpha);
    poke<uint64_t>(b, a.ne, uint64_t{1} << 40);
    poke<uint64_t>(b, a.ne + 8, uint64_t{1} << 40);
    phrase = "tensor 'tensor.alpha' has an impossible shape [1099511627776, 1099511627776]";
  }
  SECTION("duplicate tensor name") {
    GgufWriter w;
    w.add_tensor("t.one", {8}, GgmlType::f32, std::vector<float>(8));
    w.add_tensor("t.two", {8}, GgmlType::f32, std::vector<float>(8));
    w.write(path);
    b = read_bytes(path);
    std::memcpy(b.data() + find_bytes(b, "t.two"), "t.one", 5);
    phrase = "duplicate tensor name 't.one'";
  }
  REQUIRE_FALSE(phrase.empty());
  write_bytes(path, b);
  CHECK_THAT(open_error(path), StartsWith(path + ": ") && Contains(phrase));
}

TEST_CASE("GGUF reader checks general.alignment", "[gguf]") {
  TempDir dir;
  const std::string path = dir.file("align.gguf");
  GgufWriter w;
  w.set_alignment(64);
  w.add_tensor("t", {16}, GgmlType::f32, std::vector<float>(16, 1.0f));
  w.write(path);
  Bytes b = read_bytes(path);
  poke<uint32_t>(b, find_bytes(b, "general.alignment") + std::strlen("general.alignment") + 4, 48);
  write_bytes(path, b);
  CHECK_THAT(open_error(path),
             StartsWith(path + ": ") && Contains("metadata 'general.alignment' must be an unsigned power of two"));
}

TEST_CASE("GGUF reader reports unreadable paths", "[gguf]") {
  TempDir dir;
  const std::string missing = dir.file("nope.gguf");
  CHECK_THAT(open_error(missing), StartsWith(missing + ": cannot open"));
  const std::string folder = dir.file("folder");
  fs::create_directories(folder);
  CHECK_THAT(open_error(folder), StartsWith(folder + ": not a regular file"));
}

TEST_CASE("GGUF reader survives random byte corruption", "[gguf]") {
  TempDir dir;
  const std::string path = dir.file("fuzz.gguf");
  const Bytes good = write_small(path);
  const size_t header_end = find_bytes(good, kBeta) + 40;  // corrupt metadata and tensor infos
  std::mt19937_64 g(1234);
  int rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Bytes b = good;
    for (int k = 0; k < 3; ++k) b[g() % header_end] = static_cast<uint8_t>(g());
    write_bytes(path, b);
    try {
      GgufFile f(path);
      for (const auto& t : f.tensors()) {
        std::vector<uint64_t> ne = t.ne;
        (void)f.read_f32(t.name, ne);
      }
    } catch (const fd::Error& e) {
      ++rejected;
      CHECK_THAT(std::string(e.what()), StartsWith(path + ": "));
    }
  }
  CHECK(rejected > 0);
}

TEST_CASE("GGUF reader bounds array nesting", "[gguf]") {
  TempDir dir;
  const std::string path = dir.file("deep.gguf");
  // Built by hand: header, one key "deep" holding `levels` nested one-element arrays around an empty u8 array.
  const auto build = [&](int levels) {
    Bytes b = {'G', 'G', 'U', 'F'};
    const auto u32 = [&b](uint32_t v) {
      b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4);
    };
    const auto u64 = [&b](uint64_t v) {
      b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 8);
    };
    u32(3);
    u64(0);
    u64(1);
    u64(4);
    b.insert(b.end(), {'d', 'e', 'e', 'p'});
    u32(static_cast<uint32_t>(GgufType::array));
    for (int i = 0; i < levels; ++i) {
      u32(static_cast<uint32_t>(GgufType::array));
      u64(1);
    }
    u32(static_cast<uint32_t>(GgufType::u8));
    u64(0);
    write_bytes(path, b);
  };
  build(7);
  {
    GgufFile f(path);
    const GgufValue* v = f.find("deep");
    for (int i = 0; i < 7; ++i) {
      REQUIRE(v);
      const auto& items = std::get<GgufArray>(*v).items;
      REQUIRE(items.size() == 1);
      v = &items[0];
    }
    CHECK(std::get<GgufArray>(*v).items.empty());
  }
  build(8);
  CHECK_THAT(open_error(path),
             StartsWith(path + ": ") && Contains("metadata 'deep' has arrays nested deeper than 8 levels"));
}
