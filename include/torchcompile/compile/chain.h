// Fallback chains of registered backends: PyTorch's composable backend as a function.
#pragma once

#include <torchcompile/backends/registry.h>

#include <string>
#include <vector>

namespace torchcompile {

/// A backend that tries each of `names` in order (a throwing or declining backend passes to the
/// next; a throw warns once per backend) and, if all decline or fail, returns the graph run by
/// the interpreter. Every answer is recorded in the graph's CompileReport (explain(),
/// TORCHCOMPILE_LOGS=passes).
Backend fallback_chain(std::vector<std::string> names);

}  // namespace torchcompile
