#include "support/error_text.h"

#include <c10/util/Exception.h>

namespace torchcompile::support {

std::string error_message(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

std::string error_first_line(const std::exception& e) {
  const std::string msg = error_message(e);
  return msg.substr(0, msg.find('\n'));
}

}  // namespace torchcompile::support
