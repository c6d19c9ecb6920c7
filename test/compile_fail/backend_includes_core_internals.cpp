// Compiled like a built-in backend (public headers only): this include must not be found.
#include <torchcompile/backends/registry.h>

#include "runtime/guards.h"
