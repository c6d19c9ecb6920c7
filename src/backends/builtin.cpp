// Registration of the built-in backends: one explicit function, called once by the registry
// (no static constructors in the core library).
#include "backends/builtin.h"

#include <torchcompile/aot.h>
#include <torchcompile/backends/registry.h>

#include <string>
#include <vector>

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
  // `default` is this chain of the built-ins compiled in: each graph goes to the first that
  // compiles it (oneDNN for graphs with GEMMs or convolutions, which runs their other operators
  // with ATen), and a graph every backend declines runs with the interpreter.
  std::vector<std::string> default_chain;
#ifdef TORCHCOMPILE_HAVE_BACKEND_ONEDNN
  register_backend("onednn", &backends::onednn_backend);
  default_chain.push_back("onednn");
#endif
#ifdef TORCHCOMPILE_HAVE_BACKEND_EAGER
  register_backend("eager", &backends::eager_backend);
  default_chain.push_back("eager");
  // AOT forward and backward graphs, both run by the interpreter (PyTorch's aot_eager).
  register_backend("aot_eager", aot_autograd(&backends::eager_backend));
#endif
#ifdef TORCHCOMPILE_HAVE_BACKEND_DEBUG
  register_backend("debug", &backends::debug_backend, {"debug"});
#endif
#ifdef TORCHCOMPILE_HAVE_BACKEND_TORCHSCRIPT
  register_backend("torchscript", &backends::torchscript_backend);
#endif
  register_backend("default", fallback_chain(std::move(default_chain)));
}

}  // namespace torchcompile::detail
