#pragma once
#include <stdexcept>
#include <string>

namespace fd {

// The one exception type of the project: its message is a complete, user-facing sentence.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace fd
