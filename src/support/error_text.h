// Error text shared by every stage.
#pragma once

#include <exception>
#include <string>

namespace torchcompile::support {

/// The message of an exception: a c10::Error's without its backtrace, any other's what().
std::string error_message(const std::exception& e);
/// Its first line.
std::string error_first_line(const std::exception& e);

}  // namespace torchcompile::support
