#include <catch2/catch.hpp>

#include "examples/common/list_options.h"
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
}
