// torch::compile for the LibTorch C++ frontend.
//
//     #include <torchcompile/torchcompile.h>
//     auto fast = torch::compile(net, "debug");   // net: std::shared_ptr<Net> or a ModuleHolder
//     torch::Tensor y = fast(x);                   // same signature and result as net->forward(x)
//     auto f = torch::compile([](torch::Tensor a, torch::Tensor b) { return a.cos() + b.sin(); });
//
// The first call with a new input signature runs the forward once under the tracer (computing
// the real result while recording every ATen op), hands the graph to the backend and caches the
// result under guards; later calls that pass the guards run the compiled graph without executing
// the C++ forward at all. Host-side effects of the forward (printing, counters) therefore happen
// on tracing calls only, as with torch.jit.trace.
//
// Signatures: a forward takes tensors, std::vector<at::Tensor>, c10::optional<at::Tensor>,
// bool / integer / floating-point / enum values (specialized: a new value is a new cache entry),
// and std::tuple / std::pair of these, nested (an LSTM's (h, c) state); it returns at::Tensor or
// c10::optional / std::vector / std::tuple / std::pair of returnable types, nested. A user
// struct is passed and returned once its fields are registered (torchcompile::Fields,
// frontend/fields.h). Any other type is a compile error naming torch::compile and the
// type. Lambdas may be `mutable` or move-only: the compiled object owns the one callable and
// calls it in place, so its state persists across calls (it runs on tracing calls only).
#pragma once

#include <torchcompile/aot/aot_autograd.h>         // aot_autograd, decompositions
#include <torchcompile/backends/backend.h>         // Backend, CompiledFn, Claim, decline()
#include <torchcompile/backends/registry.h>        // register_backend, lookup_backend, plugins
#include <torchcompile/compile/chain.h>            // fallback_chain
#include <torchcompile/compile/compile_report.h>   // CompileReport
#include <torchcompile/compile/optimizer.h>        // compile_optimizer: a fused optimizer step
#include <torchcompile/compile/partitioner.h>      // partitioned_backend, partition_backend
#include <torchcompile/frontend/compiled.h>        // torch::compile, Compiled, torchcompile::call
#include <torchcompile/frontend/explain.h>         // explain
#include <torchcompile/frontend/fields.h>          // Fields, TORCHCOMPILE_FIELDS
#include <torchcompile/frontend/script_module.h>   // compiling TorchScript modules, compile_method
#include <torchcompile/hooks/hooks.h>              // module hooks and state_dict hooks
#include <torchcompile/ir/callable.h>              // user functions as node targets, register_callable
#include <torchcompile/ir/graph_module.h>          // GraphModule, what backends receive
#include <torchcompile/ir/interpreter.h>           // Interpreter (with overrides), interpreter_fn
#include <torchcompile/runtime/compile_options.h>  // CompileOptions
#include <torchcompile/runtime/mark_dynamic.h>     // mark_dynamic, mark_static
#include <torchcompile/frontend/package.h>          // save, load, LoadedModule: packages
#include <torchcompile/support/logging.h>          // TORCHCOMPILE_LOGS, logging::set_logs
