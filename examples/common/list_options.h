// Comma-separated values of command-line options ("1,16,64").
#pragma once
#include <string>
#include <vector>

namespace fd {

// The items of text split at commas; throws fd::Error naming --flag when there is none.
std::vector<std::string> split_list(const std::string& text, const char* flag);

// Integers in [lo, hi]; throws fd::Error naming --flag and the text for anything else.
std::vector<int> parse_int_list(const std::string& text, const char* flag, int lo = 1,
                                int hi = 1 << 30);

}  // namespace fd
