// Registration of the built-in backends: one explicit function, called once by the registry
// (no static constructors in the core library).
#include "backends/builtin.h"

#include <torchcompile/aot.h>
#include <torchcompile/backends/registry.h>

#ifdef TORCHCOMPILE_HAVE_BACKEND_EAGER
#include "../../backends/eager/eager_backend.h"
#endif
#ifdef TORCHCOMPILE_HAVE_BACKEND_DEBUG
#include "../../backends/debug/debug_backend.h"
#endif
#ifdef TORCHCOMPILE_HAVE_BACKEND_TORCHSCRIPT
#include "../../backends/torchscript/torchscript_backend.h"
#endif
#ifdef TORCHCOMPILE_HAVE_BACKEND_ONEDNN
#include "../../backends/onednn/onednn_backend.h"
#endif

namespace torchcompile::detail {

void register_builtin_backends() {
#ifdef TORCHCOMPILE_HAVE_BACKEND_EAGER
  register_backend("eager", &backends::eager_backend);
  // The best built-in available: oneDNN when compiled in (below); the C++ code generation
  // backend takes over here later.
#ifndef TORCHCOMPILE_HAVE_BACKEND_ONEDNN
  register_backend("default", &backends::eager_backend);
#endif
  // AOT forward and backward graphs, both run by the interpreter (PyTorch's aot_eager).
  register_backend("aot_eager", aot_autograd(&backends::eager_backend));
#endif
#ifdef TORCHCOMPILE_HAVE_BACKEND_DEBUG
  register_backend("debug", &backends::debug_backend, {"debug"});
#endif
#ifdef TORCHCOMPILE_HAVE_BACKEND_TORCHSCRIPT
  register_backend("torchscript", &backends::torchscript_backend);
#endif
#ifdef TORCHCOMPILE_HAVE_BACKEND_ONEDNN
  register_backend("onednn", &backends::onednn_backend);
  register_backend("default", &backends::onednn_backend);
#endif
}

}  // namespace torchcompile::detail
