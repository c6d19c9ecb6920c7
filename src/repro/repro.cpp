// Repro directories: writing, reading, replaying, and the accuracy comparison.
#include <torchcompile/repro/repro.h>

#include "repro/repro_internal.h"
#include "support/error_text.h"

#include "backends/registry_internal.h"

#include <torchcompile/backends/registry.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/op_properties.h>
#include <torchcompile/ir/parser.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/split.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/isnan.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/version.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace torchcompile::repro {

namespace fs = std::filesystem;

namespace {

const char* kind_name(ir::AttributeKind k) {
  switch (k) {
    case ir::AttributeKind::Parameter: return "parameter";
    case ir::AttributeKind::Buffer: return "buffer";
    case ir::AttributeKind::Constant: return "constant";
  }
  return "constant";
}

ir::AttributeKind parse_kind(const std::string& s, const std::string& file) {
  if (s == "parameter") return ir::AttributeKind::Parameter;
  if (s == "buffer") return ir::AttributeKind::Buffer;
  TORCH_CHECK(s == "constant", "repro: ", file, ": unknown attribute kind '", s,
              "' (expected parameter, buffer or constant)");
  return ir::AttributeKind::Constant;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  TORCH_CHECK(in, "repro: cannot read ", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out, "repro: cannot write ", p.string());
  out << text;
  TORCH_CHECK(out.good(), "repro: writing ", p.string(), " failed");
}

std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  // c10::Error messages of some builds end with the C++ source location; not part of "the same error".
  auto at = line.find(" (Exception raised from ");
  if (at != std::string::npos) line.resize(at);
  return line;
}

void set_rng(const at::Tensor& state) {
  if (!state.defined()) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::vector<at::Tensor> run_reference(const ir::GraphModule& gm, const std::vector<at::Tensor>& inputs,
                                      const at::Tensor& rng_state, bool to_double) {
  auto copy = detail::copy_with_attributes(gm, to_double);
  set_rng(rng_state);
  return copy->forward(detail::copy_tensors(inputs, to_double));
}

double rmse(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor d = a.to(at::kDouble).sub(b.to(at::kDouble));
  at::Tensor keep = at::isnan(a).logical_or(at::isnan(b)).logical_not();
  d = d.masked_select(keep);
  return d.numel() == 0 ? 0.0 : d.pow(2).mean().sqrt().item<double>();
}

std::string format_double(double v) {
  std::ostringstream os;
  os.precision(4);
  os << v;
  return os.str();
}

}  // namespace

namespace detail {

at::Tensor copy_tensor(const at::Tensor& t, bool to_double) {
  if (!t.defined()) return t;
  at::NoGradGuard no_grad;
  at::Tensor c = t.detach().clone(at::MemoryFormat::Preserve);
  if (to_double && c10::isFloatingType(c.scalar_type())) c = c.to(at::kDouble);
  if (t.requires_grad() && c10::isFloatingType(c.scalar_type())) c.requires_grad_(true);
  return c;
}

std::vector<at::Tensor> copy_tensors(const std::vector<at::Tensor>& ts, bool to_double) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(copy_tensor(t, to_double));
  return out;
}

std::unique_ptr<ir::GraphModule> copy_with_attributes(const ir::GraphModule& gm, bool to_double) {
  auto out = ir::copy_module(gm);
  for (const auto& [name, attr] : gm.attributes()) out->set_attribute(name, copy_tensor(attr.first, to_double), attr.second);
  return out;
}

RngScope::RngScope(const at::Tensor& state) {
  if (!state.defined()) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  saved_ = gen.get_state();
  gen.set_state(state);
}

RngScope::~RngScope() {
  if (!saved_.defined()) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(saved_);
}

at::Tensor rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

}  // namespace detail

using detail::copy_tensors;
using detail::copy_with_attributes;
using support::error_message;
using detail::RngScope;

const char* failure_name(Failure f) {
  switch (f) {
    case Failure::None: return "none";
    case Failure::CompileError: return "compile_error";
    case Failure::RunError: return "run_error";
    case Failure::Accuracy: return "accuracy";
  }
  return "none";
}

Failure parse_failure(const std::string& name) {
  for (Failure f : {Failure::None, Failure::CompileError, Failure::RunError, Failure::Accuracy})
    if (name == failure_name(f)) return f;
  TORCH_CHECK(false, "repro: unknown failure '", name, "' (expected none, compile_error, run_error or accuracy)");
}

std::string Outcome::describe() const {
  if (failure == Failure::None) return "ok";
  return std::string(failure_name(failure)) + ": " + message;
}

size_t count_calls(const ir::Graph& g) {
  size_t n = 0;
  for (const auto& node : g.nodes()) n += node->kind() == ir::NodeKind::CallFunction;
  return n;
}

std::shared_ptr<ir::GraphModule> module_from_text(const std::string& graph_text, const ir::GraphModule& attributes_of) {
  auto gm = std::make_shared<ir::GraphModule>(std::shared_ptr<ir::Graph>(ir::parse_graph(graph_text)));
  for (const auto& n : gm->graph().nodes()) {
    if (n->kind() != ir::NodeKind::GetAttr) continue;
    TORCH_CHECK(attributes_of.has_attribute(n->target()), "repro: the graph reads the attribute '", n->target(),
                "', which the repro's tensors do not hold");
    gm->set_attribute(n->target(), attributes_of.attribute(n->target()), attributes_of.attribute_kind(n->target()));
  }
  return gm;
}

// ---- writing and reading -----------------------------------------------------------------------

void save(const Repro& r, const std::string& dir) {
  TORCH_CHECK(r.gm, "repro::save: the repro has no graph");
  for (const auto& n : r.gm->graph().nodes()) {
    TORCH_CHECK(n->kind() != ir::NodeKind::CallModule, "repro::save: the graph calls the opaque module '",
                n->target(), "', which a repro cannot hold");
  }
  fs::create_directories(dir);
  const fs::path d(dir);
  write_file(d / "graph.txt", ir::to_text(r.gm->graph()));

  std::ostringstream meta;
  meta << "# torchcompile repro: a graph that fails in a backend. Read by torchcompile::repro::load.\n";
  meta << "backend: " << r.backend << "\n";
  meta << "plugin: " << r.plugin << "\n";
  meta << "failure: " << failure_name(r.failure) << "\n";
  meta << "tolerance: " << std::to_string(r.tolerance) << "\n";
  meta << "libtorch: " << (r.libtorch_version.empty() ? TORCH_VERSION : r.libtorch_version) << "\n";
  meta << "inputs: " << r.inputs.size() << "\n";
  // input: index, requires_grad (0/1), metadata (for the reader of the file)
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    meta << "input: " << i << " " << (r.inputs[i].defined() && r.inputs[i].requires_grad()) << " "
         << ir::TensorMeta::of(r.inputs[i]).str() << "\n";
  }
  for (const auto& [name, attr] : r.gm->attributes()) meta << "attribute: " << kind_name(attr.second) << " " << name << "\n";
  write_file(d / "repro.txt", meta.str());
  write_file(d / "error.txt", r.error + "\n");

  // Tensors: LibTorch's pickle format (torch.load reads it). Undefined inputs are None.
  c10::impl::GenericList inputs(c10::AnyType::get());
  for (const auto& t : r.inputs) inputs.push_back(t.defined() ? c10::IValue(t.detach()) : c10::IValue());
  c10::impl::GenericDict attrs(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, attr] : r.gm->attributes()) attrs.insert(name, attr.first.detach());
  c10::impl::GenericDict all(c10::StringType::get(), c10::AnyType::get());
  all.insert("inputs", inputs);
  all.insert("attributes", attrs);
  all.insert("rng_state", r.rng_state.defined() ? c10::IValue(r.rng_state) : c10::IValue());
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(all));
  write_file(d / "tensors.pt", std::string(bytes.begin(), bytes.end()));

  std::ostringstream readme;
  readme << "A graph that fails in backend '" << r.backend << "' (" << failure_name(r.failure) << ").\n"
         << "Replay it:  torchcompile-minify --replay " << dir << "\n"
         << "Minify it:  torchcompile-minify " << dir << "\n"
         << "Files: graph.txt (the graph), tensors.pt (inputs, attributes, generator state), repro.txt,\n"
         << "error.txt; repro.cpp and CMakeLists.txt build a program that replays it.\n";
  write_file(d / "README", readme.str());
}

Repro load(const std::string& dir) {
  const fs::path d(dir);
  TORCH_CHECK(fs::is_directory(d), "repro: '", dir, "' is not a directory");
  Repro r;
  std::vector<std::pair<std::string, ir::AttributeKind>> attr_kinds;
  std::vector<bool> requires_grad;
  {
    const std::string file = (d / "repro.txt").string();
    std::istringstream in(read_file(file));
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      auto colon = line.find(": ");
      std::string key = line.substr(0, colon == std::string::npos ? line.size() : colon);
      std::string value = colon == std::string::npos ? "" : line.substr(colon + 2);
      if (colon == std::string::npos && !line.empty() && line.back() == ':') key = line.substr(0, line.size() - 1);
      if (key == "backend") r.backend = value;
      else if (key == "plugin") r.plugin = value;
      else if (key == "failure") r.failure = parse_failure(value);
      else if (key == "tolerance") r.tolerance = std::stod(value);
      else if (key == "libtorch") r.libtorch_version = value;
      else if (key == "input") {
        std::istringstream fields(value);
        size_t index = 0;
        int grad = 0;
        TORCH_CHECK(fields >> index >> grad, "repro: ", file, ": malformed line '", line, "'");
        requires_grad.push_back(grad != 0);
      }
      else if (key == "attribute") {
        auto space = value.find(' ');
        TORCH_CHECK(space != std::string::npos, "repro: ", file, ": malformed line '", line, "'");
        attr_kinds.emplace_back(value.substr(space + 1), parse_kind(value.substr(0, space), file));
      }
    }
    TORCH_CHECK(!r.backend.empty(), "repro: ", file, " names no backend");
  }
  if (fs::exists(d / "error.txt")) {
    r.error = read_file(d / "error.txt");
    while (!r.error.empty() && r.error.back() == '\n') r.error.pop_back();
  }
  std::string bytes = read_file(d / "tensors.pt");
  c10::IValue all = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  TORCH_CHECK(all.isGenericDict(), "repro: ", (d / "tensors.pt").string(), " does not hold a dict");
  auto dict = all.toGenericDict();
  ir::GraphModule holder;
  auto attrs = dict.at("attributes").toGenericDict();
  for (const auto& [name, kind] : attr_kinds) {
    at::Tensor t = attrs.at(name).toTensor();
    if (kind == ir::AttributeKind::Parameter && c10::isFloatingType(t.scalar_type())) t.requires_grad_(true);
    holder.set_attribute(name, t, kind);
  }
  for (const c10::IValue& v : dict.at("inputs").toList().vec()) {
    at::Tensor t = v.isNone() ? at::Tensor() : v.toTensor();
    r.inputs.push_back(t);
  }
  for (size_t i = 0; i < r.inputs.size() && i < requires_grad.size(); ++i)
    if (requires_grad[i] && r.inputs[i].defined() && c10::isFloatingType(r.inputs[i].scalar_type())) r.inputs[i].requires_grad_(true);
  c10::IValue rng = dict.at("rng_state");
  if (rng.isTensor()) r.rng_state = rng.toTensor();
  r.gm = module_from_text(read_file(d / "graph.txt"), holder);
  return r;
}

// ---- replaying -------------------------------------------------------------------------------

void ensure_backend(const Repro& r) {
  if (has_backend(r.backend)) return;
  if (!r.plugin.empty() && fs::exists(r.plugin)) {
    load_backend_library(r.plugin);
    if (has_backend(r.backend)) return;
  }
  lookup_backend(r.backend);  // searches TORCHCOMPILE_BACKEND_PATH; throws listing the known backends
}

Outcome check(const Repro& r, bool accuracy) {
  ensure_backend(r);
  Backend backend = lookup_backend(r.backend);
  std::unique_ptr<ir::GraphModule> gm = copy_with_attributes(*r.gm);
  CompiledFn fn;
  try {
    fn = backend(*gm, copy_tensors(r.inputs));
  } catch (const std::exception& e) {
    return {Failure::CompileError, error_message(e)};
  }
  torchcompile::detail::take_decline_reason();
  if (!fn) fn = ir::interpreter_fn(*gm);  // declined: the pipeline would run the interpreter
  std::vector<at::Tensor> outputs;
  {
    RngScope rng(r.rng_state);
    try {
      outputs = fn(copy_tensors(r.inputs));
    } catch (const std::exception& e) {
      return {Failure::RunError, error_message(e)};
    }
  }
  if (accuracy) {
    std::string mismatch = accuracy_mismatch(*r.gm, r.inputs, outputs, r.tolerance, r.rng_state);
    if (!mismatch.empty()) return {Failure::Accuracy, mismatch};
  }
  return {};
}

Outcome replay(const Repro& r) { return check(r, r.failure == Failure::Accuracy); }

bool same_failure(const Repro& r, const Outcome& o, bool any_error) {
  if (o.failure != r.failure || o.failure == Failure::None) return false;
  if (o.failure == Failure::Accuracy || any_error) return true;
  return first_line(o.message) == first_line(r.error);
}

// ---- accuracy -------------------------------------------------------------------------------

std::string accuracy_mismatch(const ir::GraphModule& gm, const std::vector<at::Tensor>& inputs,
                              const std::vector<at::Tensor>& actual, double tolerance, const at::Tensor& rng_state) {
  at::NoGradGuard no_grad;
  RngScope keep(rng_state.defined() ? rng_state : detail::rng_state());
  std::vector<at::Tensor> ref = run_reference(gm, inputs, rng_state, /*to_double=*/false);
  // The float64 reference: not for graphs drawing random numbers (double draws differ), and not
  // when an op refuses double (then the float32 interpreter is the reference).
  bool random = false;
  for (const auto& n : gm.graph().nodes())
    random |= n->kind() == ir::NodeKind::CallFunction && n->has_op() && ir::node_is_random(*n);
  std::vector<at::Tensor> ref64;
  if (!random) {
    try {
      ref64 = run_reference(gm, inputs, rng_state, /*to_double=*/true);
      if (ref64.size() != ref.size()) ref64.clear();
    } catch (const std::exception&) {
      ref64.clear();
    }
  }
  if (actual.size() != ref.size()) {
    return "the compiled graph returned " + std::to_string(actual.size()) + " outputs, the interpreter " +
           std::to_string(ref.size());
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    const at::Tensor &e = ref[i], &a = actual[i];
    const std::string out = "output " + std::to_string(i) + ": ";
    if (e.defined() != a.defined()) {
      return out + (e.defined() ? "undefined" : "defined") + " in the compiled graph, " +
             (e.defined() ? "defined" : "undefined") + " in the interpreter";
    }
    if (!e.defined()) continue;
    if (e.sizes() != a.sizes() || e.scalar_type() != a.scalar_type()) {
      std::ostringstream os;
      os << out << "the compiled graph gives " << a.scalar_type() << a.sizes() << ", the interpreter "
         << e.scalar_type() << e.sizes();
      return os.str();
    }
    if (!c10::isFloatingType(e.scalar_type())) {
      if (!at::equal(e, a)) return out + "differs from the interpreter (" + std::string(c10::toString(e.scalar_type())) + ")";
      continue;
    }
    if (at::allclose(a, e, tolerance, tolerance, /*equal_nan=*/true)) continue;
    const double max_diff = a.to(at::kDouble).sub(e.to(at::kDouble)).abs().nan_to_num(0.0).max().item<double>();
    if (!at::equal(at::isnan(a), at::isnan(e))) return out + "NaN where the interpreter has none, or the other way";
    if (i < ref64.size() && ref64[i].defined() && ref64[i].sizes() == e.sizes()) {
      const double res_err = rmse(ref64[i], a), ref_err = rmse(ref64[i], e);
      const double allowed = 2.0 * ref_err + tolerance / 10.0;
      if (res_err <= allowed) continue;
      return out + "RMSE " + format_double(res_err) + " against the float64 interpreter (the float32 interpreter's: " +
             format_double(ref_err) + "; allowed " + format_double(allowed) + "), max abs difference " +
             format_double(max_diff);
    }
    return out + "differs from the interpreter beyond rtol = atol = " + format_double(tolerance) +
           ": max abs difference " + format_double(max_diff);
  }
  return "";
}

}  // namespace torchcompile::repro
