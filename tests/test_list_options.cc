#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "examples/common/list_options.h"
#include "examples/common/node_options.h"
#include "runtime/error.h"

TEST_CASE("comma-separated integer options", "[options]") {
  CHECK(fd::parse_int_list("1,16,64", "batch") == std::vector<int>{1, 16, 64});
  CHECK(fd::parse_int_list("7", "ctx") == std::vector<int>{7});
  CHECK(fd::parse_int_list("0,3", "sizes", 0, 3) == std::vector<int>{0, 3});
  for (const char* bad : {"", "1,,2", "1,x", "4k", "0", "-3", "99999999999"}) {
    INFO(bad);
    REQUIRE_THROWS_AS(fd::parse_int_list(bad, "batch"), fd::Error);
  }
  try {
    fd::parse_int_list("1,x", "batch");
  } catch (const fd::Error& e) {
    CHECK(std::string(e.what()) == "--batch must be a comma-separated list of integers from 1 to 1073741824, not '1,x'.");
  }
  REQUIRE_THROWS_AS(fd::parse_int_list("5", "sizes", 1, 4), fd::Error);
  CHECK(fd::split_list("f16,q8", "kv-dtype") == std::vector<std::string>{"f16", "q8"});
  using fd::kernels::KvDtype;
  CHECK(fd::parse_kv_dtype_list("f16,int8,q4") ==
        std::vector<KvDtype>{KvDtype::f16, KvDtype::q8, KvDtype::q4});
  CHECK_THROWS_WITH(fd::parse_kv_dtype_list("f16,fp8"),
                    "--kv-dtype must list f16, int8 (q8) or int4 (q4), not 'fp8'.");
}

static fd::NodeArgs parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"fastdecode-node"};
  for (const auto& a : args) argv.push_back(a.c_str());
  fd::NodeArgs out;
  fd::parse_node_args(static_cast<int>(argv.size()), argv.data(), out);
  return out;
}

TEST_CASE("fastdecode-node refuses thread and shard counts that would only exhaust the machine", "[options]") {
  const int cores = fd::machine_cores();
  CHECK(parse({"--threads", std::to_string(cores)}).local.attn_threads == cores);
  CHECK(parse({"--threads", "0"}).local.attn_threads == 0);
  CHECK_THROWS_WITH(parse({"--threads", std::to_string(cores + 1)}),
                    Catch::Contains("--threads must be 0 (all cores) to " + std::to_string(cores)));
  CHECK(parse({"--shards", "256"}).local.shards == 256);
  CHECK_THROWS_WITH(parse({"--shards", "100000"}), Catch::Contains("--shards must be 1 to 256, not 100000"));
  CHECK_THROWS_WITH(parse({"--caf-threads", "100000"}), Catch::Contains("--caf-threads must be 1 to 64"));
}

TEST_CASE("fastdecode-node takes the KV formats by either name", "[options]") {
  using fd::kernels::KvDtype;
  CHECK(parse({"--kv-dtype", "int8"}).local.kv_dtype == KvDtype::q8);
  CHECK(parse({"--kv-dtype", "q4"}).local.kv_dtype == KvDtype::q4);
  CHECK_THROWS_WITH(parse({"--kv-dtype", "int2"}), "--kv-dtype must be f16, int8 (q8) or int4 (q4), not 'int2'");
}

TEST_CASE("cpu nodes take their KV memory at start, --role all as rows are written, unless told", "[options]") {
  CHECK_FALSE(parse({}).local.kv_commit);
  CHECK(parse({"--kv-commit", "start"}).local.kv_commit);
  CHECK(parse({"--role", "cpu", "--join", "127.0.0.1:4242"}).local.kv_commit);
  CHECK_FALSE(parse({"--role", "cpu", "--join", "127.0.0.1:4242", "--kv-commit", "lazy"}).local.kv_commit);
  CHECK_THROWS_WITH(parse({"--kv-commit", "now"}), "--kv-commit must be start or lazy, not 'now'");
}

TEST_CASE("a cpu node without --kv-memory sizes its KV-cache up to 1 GiB, and with it takes what it is given", "[options]") {
  const auto cpu = parse({"--role", "cpu", "--join", "127.0.0.1:4242"});
  CHECK_FALSE(cpu.kv_memory_given);
  CHECK(cpu.local.kv_memory == size_t(1) << 30);
  const auto given = parse({"--role", "cpu", "--join", "127.0.0.1:4242", "--kv-memory", "1GiB"});
  CHECK(given.kv_memory_given);  // the default's value, but given
  CHECK(given.local.kv_memory == size_t(1) << 30);
}
