// fallback_chain (compile/chain.h): registered backends tried in order, each answer recorded.
#include <torchcompile/compile/chain.h>

#include "compile/pipeline.h"

#include <torchcompile/ir/interpreter.h>

#include <c10/util/Exception.h>

#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchcompile {

Backend fallback_chain(std::vector<std::string> names) {
  // Which failing backends this chain has already warned about: once per backend per chain,
  // not once per compiled graph.
  struct WarnedOnce {
    std::mutex mutex;
    std::set<std::string> names;
  };
  auto warned = std::make_shared<WarnedOnce>();
  return [names = std::move(names), warned](GraphModule& gm, const std::vector<at::Tensor>& example_inputs) -> CompiledFn {
    for (const std::string& name : names) {
      std::string failure;
      try {
        if (CompiledFn fn = compile_stage::call_backend(lookup_backend(name), name, gm, example_inputs)) return fn;
        continue;  // declined (recorded with its reason): try the next one
      } catch (const c10::Error& e) {
        failure = e.what_without_backtrace();
      } catch (const std::exception& e) {
        failure = e.what();
      } catch (...) {
        failure = "unknown exception";
      }
      bool first;
      {
        std::lock_guard<std::mutex> lock(warned->mutex);
        first = warned->names.insert(name).second;
      }
      if (first) TORCH_WARN("fallback_chain: backend '", name, "' failed, trying the next one: ", failure);
    }
    // Every backend declined or failed: run the graph with the interpreter.
    if (CompileReport* report = detail::current_report()) report->backend = "interpreter";
    return ir::interpreter_fn(gm);
  };
}

}  // namespace torchcompile
