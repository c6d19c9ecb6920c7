#include "support/error_text.h"

#include <c10/util/Exception.h>

namespace torchcompile::support {

std::string error_message(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace torchcompile::support
