// The one error type reshard's libraries throw at their boundaries. The CLI
// turns it into a message on stderr and a non-zero exit code.
#pragma once

#include <stdexcept>
#include <string>

namespace reshard {

/// An error with a message meant for a person: what is wrong, where, and what
/// was expected. Messages are lower case, name things in quotes.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace reshard
