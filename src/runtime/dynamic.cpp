// Dynamic shapes (runtime/dynamic_entry.h) and the dimension marks of torchcompile/runtime/mark_dynamic.h.
#include "runtime/dynamic_entry.h"

#include <torchcompile/capture/tracer.h>
#include <torchcompile/runtime/mark_dynamic.h>
#include <torchcompile/support/logging.h>

#include "compile/pipeline.h"

#include <c10/core/WrapDimMinimal.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <sstream>
#include <unordered_map>

namespace torchcompile {

// ---- marks ------------------------------------------------------------------------------------

namespace {

struct Marks {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor{c10::intrusive_ptr<c10::TensorImpl>()};
  std::vector<detail::DimMark> dims;
};

std::mutex& marks_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const c10::TensorImpl*, Marks>& marks_table() {
  static auto* table = new std::unordered_map<const c10::TensorImpl*, Marks>();
  return *table;
}

void set_mark(const at::Tensor& t, int64_t dim, detail::DimMark mark, const char* fn) {
  TORCH_CHECK(t.defined(), "torchcompile::", fn, ": expected a defined tensor");
  dim = c10::maybe_wrap_dim(dim, t.dim(), /*wrap_scalar=*/false);
  std::lock_guard<std::mutex> lock(marks_mutex());
  auto& table = marks_table();
  // Forget tensors that are gone (their address may be reused).
  for (auto it = table.begin(); it != table.end();) it = it->second.tensor.expired() ? table.erase(it) : std::next(it);
  Marks& m = table[t.unsafeGetTensorImpl()];
  m.tensor = c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr());
  m.dims.resize(std::max<size_t>(m.dims.size(), static_cast<size_t>(t.dim())));
  m.dims[dim] = mark;
}

}  // namespace

void mark_dynamic(const at::Tensor& t, int64_t dim, std::optional<int64_t> min, std::optional<int64_t> max) {
  detail::DimMark mark;
  mark.kind = detail::DimMark::Dynamic;
  if (min) mark.min = std::max<int64_t>(*min, 2);
  if (max) mark.max = *max;
  TORCH_CHECK(mark.min <= mark.max, "torchcompile::mark_dynamic: expected min <= max (sizes 0 and 1 are never ",
              "symbolic, so min is at least 2), got min ", min.value_or(2), ", max ", mark.max);
  set_mark(t, dim, mark, "mark_dynamic");
}

void mark_static(const at::Tensor& t, int64_t dim) {
  detail::DimMark mark;
  mark.kind = detail::DimMark::Static;
  set_mark(t, dim, mark, "mark_static");
}

detail::DimMark detail::dim_mark(const at::Tensor& t, int64_t dim) {
  if (!t.defined()) return {};
  std::lock_guard<std::mutex> lock(marks_mutex());
  auto& table = marks_table();
  if (table.empty()) return {};
  auto it = table.find(t.unsafeGetTensorImpl());
  if (it == table.end() || it->second.tensor.lock().get() != t.unsafeGetTensorImpl()) return {};
  if (dim < 0 || static_cast<size_t>(dim) >= it->second.dims.size()) return {};
  return it->second.dims[dim];
}

namespace runtime {

namespace {

std::string dim_name(const std::vector<std::string>& names, uint32_t input, uint32_t dim) {
  return "size " + std::to_string(dim) + " of '" + names.at(input) + "'";
}

}  // namespace

std::string size_range(int64_t min, int64_t max) {
  return "[" + std::to_string(min) + ", " +
         (max == std::numeric_limits<int64_t>::max() ? std::string("inf)") : std::to_string(max) + "]");
}

// ---- the plan ---------------------------------------------------------------------------------

int DynamicPlan::symbol_of(uint32_t input, uint32_t dim) const {
  for (const SymbolicDim& d : dims)
    if (d.input == input && d.dim == dim) return static_cast<int>(d.symbol);
  return -1;
}

std::vector<std::string> DynamicPlan::describe() const {
  std::vector<std::string> out;
  for (size_t k = 0; k < symbols.size(); ++k) {
    const SizeSymbol& s = symbols[k];
    std::string line = s.name + " = " + dim_name(input_names, s.input, s.dim) + " (traced " +
                       std::to_string(s.traced) + "), range " + size_range(s.min, s.max);
    for (const SymbolicDim& d : dims)
      if (d.symbol == k && !(d.input == s.input && d.dim == s.dim)) line += ", equal to " + dim_name(input_names, d.input, d.dim);
    out.push_back(std::move(line));
  }
  if (replays_forward()) out.push_back("each new size runs the forward again: " + replay_reason);
  return out;
}

SizeKey DynamicPlan::key_of(const std::vector<at::Tensor>& inputs) const {
  SizeKey key;
  for (const SizeSymbol& s : symbols) key.push_back(inputs[s.input].sizes()[s.dim]);
  return key;
}

std::optional<SizeKey> first_trace_key(const SizeHistory& history, const DynamicPlan& plan,
                                       const std::vector<at::Tensor>& inputs) {
  if (history.first_trace.empty() || !plan.expression_dims.empty() || history.first_inputs.size() != inputs.size())
    return std::nullopt;
  SizeKey key(plan.symbols.size(), -1);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor &t = inputs[i], &first = history.first_inputs[i];
    if (t.defined() && t.layout() != c10::kStrided) return std::nullopt;
    if (t.defined() != first.defined()) return std::nullopt;
    if (!t.defined()) continue;
    if (t.scalar_type() != first.scalar_type() || t.dim() != first.dim()) return std::nullopt;
    // Strides as traced: both contiguous (strides then follow the sizes), or the same.
    if (!(first.is_contiguous() && t.is_contiguous()) && t.strides() != first.strides()) return std::nullopt;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int k = plan.symbol_of(static_cast<uint32_t>(i), static_cast<uint32_t>(d));
      const int64_t size = first.size(d);
      if (k < 0) {
        if (size != t.size(d)) return std::nullopt;
        continue;
      }
      const SizeSymbol& s = plan.symbols[static_cast<size_t>(k)];
      int64_t& value = key[static_cast<size_t>(k)];
      if (size < s.min || size > s.max || (value >= 0 && value != size)) return std::nullopt;
      value = size;
    }
  }
  for (int64_t v : key)
    if (v < 0) return std::nullopt;
  if (key == plan.traced_key()) return std::nullopt;
  return key;
}

SizeKey DynamicPlan::traced_key() const {
  SizeKey key;
  for (const SizeSymbol& s : symbols) key.push_back(s.traced);
  return key;
}

std::string DynamicPlan::key_str(const SizeKey& key) const {
  std::string out;
  for (size_t k = 0; k < key.size() && k < symbols.size(); ++k)
    out += (k ? ", " : "") + symbols[k].name + "=" + std::to_string(key[k]);
  return out;
}

// ---- candidates -------------------------------------------------------------------------------

std::vector<Candidate> dynamic_candidates(const std::optional<bool>& dynamic, const CallArgs& args,
                                          const std::vector<std::string>& names, SizeHistory& history,
                                          const std::string& owner) {
  const bool log_dynamic = logging::log_enabled(logging::LogKind::Dynamic);
  auto say = [&](const std::string& msg) {
    if (log_dynamic) logging::log(logging::LogKind::Dynamic, "torch::compile(" + owner + "): " + msg);
  };
  std::vector<Candidate> out;
  const size_t n = args.tensors.size();
  if (history.first.size() != n) {
    history.first.assign(n, {});
    history.changed.assign(n, {});
  }
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& t = args.tensors[i];
    if (!t.defined() || t.layout() != c10::kStrided) continue;
    const c10::IntArrayRef sizes = t.sizes();
    std::vector<int64_t>& first = history.first[i];
    std::vector<bool>& changed = history.changed[i];
    if (first.size() != sizes.size()) {  // the first trace, or another rank: start over
      first.assign(sizes.begin(), sizes.end());
      changed.assign(sizes.size(), false);
    }
    for (size_t d = 0; d < sizes.size(); ++d) {
      const std::string what = dim_name(names, static_cast<uint32_t>(i), static_cast<uint32_t>(d));
      const bool newly_changed = !changed[d] && sizes[d] != first[d];
      if (newly_changed) changed[d] = true;
      const torchcompile::detail::DimMark mark = torchcompile::detail::dim_mark(t, static_cast<int64_t>(d));
      if (mark.kind == torchcompile::detail::DimMark::Static) {
        say(what + " is static: mark_static");
        continue;
      }
      bool want = false;
      std::string why;
      if (dynamic == false) {
        if (mark.kind == torchcompile::detail::DimMark::Dynamic) say(what + " is static: dynamic=false overrides mark_dynamic");
      } else if (mark.kind == torchcompile::detail::DimMark::Dynamic) {
        want = true, why = "mark_dynamic";
      } else if (dynamic == true) {
        want = true, why = "dynamic=true";
      } else if (changed[d]) {
        want = true, why = "automatic: it changed since the first trace (" + std::to_string(first[d]) + " then " +
                           std::to_string(sizes[d]) + ")";
      }
      if (!want) continue;
      if (sizes[d] < 2) {
        say(what + " is static: size " + std::to_string(sizes[d]) + " is specialized (0 and 1 are never symbolic)");
        continue;
      }
      if (sizes[d] < mark.min || sizes[d] > mark.max) {
        say(what + " is static: " + std::to_string(sizes[d]) + " is outside mark_dynamic's range " +
            size_range(mark.min, mark.max));
        continue;
      }
      if (out.size() == 64) {
        say(what + " is static: more than 64 candidate dimensions");
        continue;
      }
      say(what + " may be a symbol (" + why + ")");
      const bool marked = mark.kind == torchcompile::detail::DimMark::Dynamic;
      out.push_back(Candidate{static_cast<uint32_t>(i), static_cast<uint32_t>(d), mark.min, mark.max, marked,
                              /*blanket=*/!marked && !changed[d]});
    }
  }
  return out;
}

DynamicPlan plan_symbols(const std::vector<Candidate>& candidates, uint64_t read,
                         const std::vector<std::string>& first_reads, const std::string& static_reason,
                         const std::string& replay_reason, const CallArgs& args,
                         const std::vector<std::string>& names, const std::string& owner,
                         bool specialize_blanket_reads) {
  DynamicPlan plan;
  std::string reads;  // what host code read, for the replay reason
  plan.input_names = names;
  auto stays_static = [&](const Candidate& c, const std::string& why) {
    const std::string what = dim_name(names, c.input, c.dim);
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", owner, "): ", what, " stays static: ", why);
    if (c.marked)
      TORCH_WARN("torch::compile(", owner, "): mark_dynamic: ", what, " stays static: ", why);
  };
  std::map<int64_t, uint32_t> symbol_of_size;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const Candidate& c = candidates[k];
    if (!static_reason.empty()) {
      stays_static(c, static_reason);
      continue;
    }
    const at::Tensor& t = args.tensors[c.input];
    if (!t.is_contiguous()) {
      stays_static(c, "the input is not contiguous (a symbolic input must be)");
      continue;
    }
    const std::string what = dim_name(names, c.input, c.dim);
    if ((read >> k & 1) && c.blanket && specialize_blanket_reads) {
      // dynamic = true asked for every dimension; one host code reads (nn::LSTM reads its batch
      // and feature sizes) stays static, so that the others keep one graph with symbols. If it
      // changes later, automatic dynamic makes it a candidate of the new entry.
      stays_static(c, "host code read it" +
                          (k < first_reads.size() && !first_reads[k].empty() ? " (" + first_reads[k] + ")" : std::string()) +
                          "; with dynamic=true a size host code reads stays static until it changes");
      continue;
    }
    if (read >> k & 1) {
      const std::string& where = k < first_reads.size() ? first_reads[k] : std::string();
      reads += (reads.empty() ? "" : ", ") + (where.empty() ? what : where);
      TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", owner, "): ", what, ": host code read it",
                       where.empty() ? std::string() : " (" + where + ")",
                       "; a symbol whose new sizes run the forward again");
    }
    const int64_t size = t.size(c.dim);
    auto it = symbol_of_size.find(size);
    uint32_t sym;
    if (it == symbol_of_size.end()) {
      sym = static_cast<uint32_t>(plan.symbols.size());
      symbol_of_size.emplace(size, sym);
      SizeSymbol s;
      s.name = "s" + std::to_string(sym);
      s.input = c.input, s.dim = c.dim, s.traced = size, s.min = c.min, s.max = c.max;
      plan.symbols.push_back(s);
    } else {
      sym = it->second;
      SizeSymbol& s = plan.symbols[sym];
      s.min = std::max(s.min, c.min), s.max = std::min(s.max, c.max);
    }
    plan.dims.push_back(SymbolicDim{c.input, c.dim, sym});
  }
  if (!plan.empty()) {
    if (!replay_reason.empty())
      plan.replay_reason = replay_reason;
    else if (!reads.empty())
      plan.replay_reason = "host code read " + reads + " (integers or branches of the trace may depend on it)";
  }
  if (logging::log_enabled(logging::LogKind::Dynamic)) {
    const std::vector<std::string> lines = plan.describe();
    for (size_t i = 0; i < lines.size(); ++i)
      logging::log(logging::LogKind::Dynamic,
                   "torch::compile(" + owner + "): " + (i < plan.symbols.size() ? "symbol " : "") + lines[i]);
  }
  return plan;
}

// ---- specializations --------------------------------------------------------------------------

namespace {
// The symbols' values packed into one word, `bits` bits each (at most 63 / n, so the word's top
// bit stays 0 and kNoCheckedKey is no key), or false if some value does not fit (or bits is 0).
bool pack_key(const int64_t* key, size_t n, unsigned bits, uint64_t* packed) {
  if (n > 0 && bits == 0) return false;
  uint64_t word = 0;
  for (size_t k = 0; k < n; ++k) {
    if (key[k] < 0 || (bits < 63 && (static_cast<uint64_t>(key[k]) >> bits) != 0)) return false;
    word = (word << bits) | static_cast<uint64_t>(key[k]);
  }
  *packed = word;
  return true;
}
}  // namespace

ShapeSpecializations::ShapeSpecializations(DynamicPlan plan, std::shared_ptr<GraphModule> generic, Backend backend,
                                           std::string backend_name, std::string owner, CompiledFn first,
                                           bool symbolic, std::string static_reason)
    : plan_(std::move(plan)),
      generic_(std::move(generic)),
      backend_(std::move(backend)),
      backend_name_(std::move(backend_name)),
      owner_(std::move(owner)),
      symbolic_(symbolic),
      static_reason_(std::move(static_reason)) {
  if (!symbolic_) {
    compiled_.insert(plan_.traced_key(), std::make_shared<const CompiledFn>(std::move(first)));
    return;
  }
  all_sizes_ = std::make_shared<const CompiledFn>(std::move(first));
  for (const SizeSymbol& sym : plan_.symbols) symbol_dims_.emplace_back(sym.input, sym.dim);
  key_bits_ = symbol_dims_.empty() ? 63 : static_cast<unsigned>(63 / symbol_dims_.size());
  for (const auto& n : generic_->graph().nodes()) {
    if (n->kind() != ir::NodeKind::Output) continue;
    for (const ir::Argument& a : n->args())
      a.for_each_value([&](const ir::Value& v) {
        const ir::TensorMeta& m = v.node->output_meta().at(v.index);
        std::vector<ir::SymExpr> sizes = m.sym_sizes;
        if (sizes.empty())
          for (int64_t s : m.sizes) sizes.emplace_back(s);
        if (!m.defined) sizes.clear();
        std::vector<ResultDim> dims;
        for (const ir::SymExpr& e : sizes) {
          ResultDim d;
          if (auto c = e.constant()) {
            d.kind = ResultDim::Constant;
            d.value = *c;
          } else if (auto name = e.as_symbol()) {
            for (size_t k = 0; k < plan_.symbols.size(); ++k)
              if (plan_.symbols[k].name == *name) {
                d.kind = ResultDim::Symbol;
                d.value = static_cast<int64_t>(k);
              }
          }
          dims.push_back(d);
        }
        result_sizes_.push_back(std::move(sizes));
        result_dims_.push_back(std::move(dims));
      });
  }
}

size_t ShapeSpecializations::num_specializations() const { return symbolic_ ? 1 : compiled_.size(); }

bool ShapeSpecializations::result_sizes_match(const int64_t* key, const std::vector<at::Tensor>& outputs) const {
  if (outputs.size() != result_sizes_.size()) return true;  // the output spec checks the count
  for (size_t i = 0; i < outputs.size(); ++i) {
    const size_t rank = result_dims_[i].size();
    if (rank == 0 || !outputs[i].defined()) continue;
    const c10::IntArrayRef sizes = outputs[i].unsafeGetTensorImpl()->sizes();
    if (sizes.size() != rank) return false;
    const ResultDim* dims = result_dims_[i].data();
    for (size_t d = 0; d < rank; ++d) {
      int64_t want;
      switch (dims[d].kind) {
        case ResultDim::Symbol: want = key[dims[d].value]; break;
        case ResultDim::Constant: want = dims[d].value; break;
        default: want = result_sizes_[i][d].evaluate([&](const std::string& name) { return key[symbol_index(name)]; });
      }
      if (sizes[d] != want) return false;
    }
  }
  return true;
}

size_t ShapeSpecializations::symbol_index(const std::string& name) const {
  for (size_t k = 0; k < plan_.symbols.size(); ++k)
    if (plan_.symbols[k].name == name) return k;
  TORCH_INTERNAL_ASSERT(false, "unknown size symbol ", name);
}

void ShapeSpecializations::result_sizes_error(const int64_t* key, const std::vector<at::Tensor>& outputs) const {
  auto value = [&](const std::string& name) { return key[symbol_index(name)]; };
  const SizeKey values(key, key + plan_.symbols.size());
  for (size_t i = 0; i < outputs.size() && i < result_sizes_.size(); ++i) {
    const std::vector<ir::SymExpr>& expected = result_sizes_[i];
    if (!outputs[i].defined() || expected.empty()) continue;
    bool same = static_cast<size_t>(outputs[i].dim()) == expected.size();
    for (size_t d = 0; same && d < expected.size(); ++d) same = expected[d].evaluate(value) == outputs[i].size(d);
    if (same) continue;
    std::string want;
    for (size_t d = 0; d < expected.size(); ++d)
      want += (d ? ", " : "") + expected[d].str() + "=" + std::to_string(expected[d].evaluate(value));
    TORCH_CHECK(false, "torch::compile(", owner_, "): backend '", backend_name_, "' compiled a graph with size symbols, ",
                "but with ", plan_.key_str(values), " its result ", i, " has sizes ", outputs[i].sizes(),
                " where the graph says [", want, "]. A backend that compiles for the example sizes must return ",
                "torchcompile::compile_per_shape(...) or decline graphs with symbols (backends/backend.h)");
  }
  TORCH_INTERNAL_ASSERT(false, "result_sizes_error: every result has the sizes of the graph's expressions");
}

std::vector<at::Tensor> ShapeSpecializations::run_symbolic(const CompiledFn& fn, std::vector<at::Tensor> inputs) const {
  // The symbols' values, read before the inputs move into the compiled function.
  constexpr size_t kOnStack = 8;
  int64_t on_stack[kOnStack];
  SizeKey more;
  int64_t* key = on_stack;
  if (C10_UNLIKELY(symbol_dims_.size() > kOnStack)) {
    more.resize(symbol_dims_.size());
    key = more.data();
  }
  for (size_t k = 0; k < symbol_dims_.size(); ++k)
    key[k] = inputs[symbol_dims_[k].first].unsafeGetTensorImpl()->sizes()[symbol_dims_[k].second];
  std::vector<at::Tensor> outputs = fn(std::move(inputs));
  uint64_t packed = kNoCheckedKey;
  const bool packs = pack_key(key, symbol_dims_.size(), key_bits_, &packed);
  if (packs && checked_key_.load(std::memory_order_relaxed) == packed) return outputs;
  if (C10_UNLIKELY(!result_sizes_match(key, outputs))) result_sizes_error(key, outputs);
  if (packs) checked_key_.store(packed, std::memory_order_relaxed);
  return outputs;
}

CompiledFn ShapeSpecializations::entry_function(const std::shared_ptr<ShapeSpecializations>& self) {
  if (!self->symbolic_) return [self](std::vector<at::Tensor> inputs) { return (*self)(std::move(inputs)); };
  // Every call runs the one compiled function: no lookup, no lock, one std::function less.
  return [self, fn = self->all_sizes_](std::vector<at::Tensor> inputs) {
    return self->run_symbolic(*fn, std::move(inputs));
  };
}

std::vector<at::Tensor> ShapeSpecializations::operator()(std::vector<at::Tensor> inputs) {
  if (symbolic_) return run_symbolic(*all_sizes_, std::move(inputs));
  const SizeKey key = plan_.key_of(inputs);
  if (auto fn = compiled_.find(key)) return (*fn)(std::move(inputs));
  // One specialization at a time; a thread that waited may find its sizes compiled.
  std::lock_guard<std::mutex> one_at_a_time(specialize_mutex_);
  if (auto fn = compiled_.find(key)) return (*fn)(inputs);
  return specialize(key, inputs);
}

std::vector<at::Tensor> ShapeSpecializations::specialize(const SizeKey& key, const std::vector<at::Tensor>& inputs) {
  // The graph recorded again at these sizes: the same ops with the same constants (the trace
  // recorded none computed from the symbols), with metadata of these sizes.
  capture::Tracer tracer;
  const std::vector<ir::Node*> placeholders = generic_->graph().placeholders();
  TORCH_INTERNAL_ASSERT(placeholders.size() == inputs.size(), "dynamic entry: ", placeholders.size(),
                        " placeholders for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) tracer.add_input(inputs[i], placeholders[i]->target());
  for (const auto& [name, attr] : generic_->attributes()) tracer.add_attribute(name, attr.first, attr.second);
  std::vector<at::Tensor> outputs;
  {
    capture::Tracer::Activation active(tracer);
    outputs = generic_->forward(inputs);
  }
  // Backends keep references into the graph module they compiled: it lives as long as fn.
  std::shared_ptr<GraphModule> gm;
  if (!tracer.failed()) gm = tracer.finish(outputs);
  CompiledFn fn;
  std::string how;
  if (gm) {
    try {
      compile_stage::CompiledGraph compiled = compile_stage::compile_graph(*gm, inputs, backend_, backend_name_, owner_);
      fn = [gm, compiled = std::move(compiled.fn)](const std::vector<at::Tensor>& in) { return compiled(in); };
      how = "compiled by '" + backend_name_ + "'";
    } catch (const std::exception& e) {
      how = std::string("backend failed (") + e.what() + "); these sizes run the captured graph with the interpreter";
    }
  } else {
    how = "could not record the graph again (" + (tracer.failed() ? tracer.failure()->reason : std::string("outputs")) +
          "); these sizes run the captured graph with the interpreter";
  }
  if (!fn) {
    std::shared_ptr<GraphModule> generic = generic_;
    fn = [generic](const std::vector<at::Tensor>& in) { return generic->forward(in); };
  }
  const size_t count = compiled_.insert(key, std::make_shared<const CompiledFn>(std::move(fn)));
  TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", owner_, "): new sizes ", plan_.key_str(key), ": ", how, " (",
                   count, " sizes compiled)");
  return outputs;
}

NewSizeCosts::Forced NewSizeCosts::forced_from_env() {
  const char* env = std::getenv("TORCHCOMPILE_NEW_SIZES");
  const std::string value = env ? env : "";
  if (value.empty()) return Forced::No;
  if (value == "shapes") return Forced::Shapes;
  if (value == "trace") return Forced::Trace;
  TORCH_CHECK(false, "TORCHCOMPILE_NEW_SIZES: expected 'shapes' (a trace of shapes, then the compiled call), 'trace' ",
              "(a real trace computes the call) or nothing (the cheaper so far), got '", value, "'");
}

bool NewSizeCosts::use_shapes() const {
  if (forced != Forced::No) return forced == Forced::Shapes;
  return shapes_us < 0 || traced_us < 0 || shapes_us <= traced_us;
}

bool NewSizeCosts::next_by_shapes() {
  const bool cheaper = use_shapes();
  retrying = false;
  if (forced != Forced::No || shapes_us < 0 || traced_us < 0) return cheaper;
  const bool scheduled = ++decided == next_retry;
  if (scheduled) next_retry *= 8;
  const double cheap_us = cheaper ? shapes_us : traced_us, dear_us = cheaper ? traced_us : shapes_us;
  retrying = (scheduled && dear_us <= kRetryWithin * cheap_us) || (decided == 1 && !cheaper);
  return retrying ? !cheaper : cheaper;
}

std::string NewSizeCosts::str() const {
  auto us = [](double v) { return v < 0 ? std::string("?") : std::to_string(static_cast<int64_t>(v)) + " us"; };
  return "trace of shapes + compiled call " + us(shapes_us) + ", real trace " + us(traced_us) +
         (retrying ? "; measuring the dearer way again" : "") +
         (forced == Forced::No ? "" : forced == Forced::Shapes ? "; TORCHCOMPILE_NEW_SIZES=shapes"
                                                               : "; TORCHCOMPILE_NEW_SIZES=trace");
}

}  // namespace runtime
}  // namespace torchcompile
