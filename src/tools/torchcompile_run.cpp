// torchcompile-run: load a TorchScript archive, compile one of its methods with a backend, run it
// on random inputs of given shapes, check the result against TorchScript's own and print the
// first-call time and the warm latency percentiles beside TorchScript's (as onnxruntime_perf_test
// or OpenVINO's benchmark_app do for their formats).
#include <torchcompile/torchcompile.h>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <fstream>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using torch::jit::IValue;

int usage(std::ostream& os, int status) {
  os << "usage: torchcompile-run [options] <model.pt | package.tcpkg>\n"
        "\n"
        "Loads a TorchScript archive (torch::jit::load), compiles a method with torch::compile, runs it on\n"
        "random inputs, checks the result against the TorchScript module's own, and prints the first-call\n"
        "time (trace + compile + one run) and warm latency percentiles, the compiled module's and\n"
        "TorchScript's, timed alternately in the same run.\n"
        "\n"
        "Given a package (torchcompile::save), loads it with the backend (torchcompile::load), runs it on\n"
        "the inputs given, or without --input on random inputs its first entry accepts, and checks and\n"
        "times it against the same package's graphs run by the interpreter (backend 'eager': LibTorch's\n"
        "operators one by one). --method, --dynamic and --train do not apply to a package.\n"
        "\n"
        "options:\n"
        "  --input SPEC     one per argument of the method, in order (without self):\n"
        "                     8x3x224x224             float32 tensor, standard normal values\n"
        "                     8x64:int64:0:1000       int64 tensor, uniform integers in [0, 1000)\n"
        "                     8x64:bool               bool tensor, true with probability 1/2\n"
        "                     8x16:float64            other dtypes: float32, float64, bfloat16, int32,\n"
        "                                             int64, uint8, bool (integers default to [0, 10))\n"
        "                     int=3  float=0.5  bool=true  none\n"
        "  --backend NAME   a registered backend (default: default)\n"
        "  --method NAME    the method to compile (default: forward)\n"
        "  --dynamic        compile with dynamic = true\n"
        "  --iters N        warm calls timed, each (default: 100)\n"
        "  --warmup N       untimed calls before timing (default: 5)\n"
        "  --threads N      intra-op threads (at::set_num_threads)\n"
        "  --train          keep the module in training mode and autograd on (default: eval() and\n"
        "                   inference mode)\n"
        "  --rtol X --atol Y  tolerances of the check (default: 1e-4 and 1e-5)\n"
        "  --no-check       do not compare with TorchScript\n"
        "  --plugin PATH    load a backend plugin (torchcompile::load_backend_library) first\n"
        "  --seed N         random seed of the inputs (default: 0)\n"
        "  --explain        print what torchcompile::explain reports (graphs, breaks, guards, and how\n"
        "                   the backend compiled each graph)\n"
        "\n"
        "exit status: 0 if the results agree, 1 if they differ, 2 for a usage or loading error.\n";
  return status;
}

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "torchcompile-run: " << message << "\n";
  std::exit(2);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

int64_t to_int(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  fail("expected an integer for " + what + ", got '" + s + "'");
}

double to_double(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  fail("expected a number for " + what + ", got '" + s + "'");
}

c10::ScalarType dtype_of(const std::string& s, const std::string& spec) {
  if (s == "float32" || s == "float" || s == "f32") return at::kFloat;
  if (s == "float64" || s == "double" || s == "f64") return at::kDouble;
  if (s == "bfloat16" || s == "bf16") return at::kBFloat16;
  if (s == "int64" || s == "long") return at::kLong;
  if (s == "int32" || s == "int") return at::kInt;
  if (s == "uint8") return at::kByte;
  if (s == "bool") return at::kBool;
  fail("unknown dtype '" + s + "' in --input " + spec +
       " (expected float32, float64, bfloat16, int32, int64, uint8 or bool)");
}

// One argument from its --input spec.
IValue make_input(const std::string& spec) {
  if (spec == "none") return IValue();
  if (spec.rfind("int=", 0) == 0) return to_int(spec.substr(4), "--input " + spec);
  if (spec.rfind("float=", 0) == 0) return to_double(spec.substr(6), "--input " + spec);
  if (spec.rfind("bool=", 0) == 0) {
    const std::string v = spec.substr(5);
    if (v != "true" && v != "false") fail("expected bool=true or bool=false, got --input " + spec);
    return v == "true";
  }
  const std::vector<std::string> parts = split(spec, ':');
  std::vector<int64_t> sizes;
  if (!parts[0].empty() && parts[0] != "scalar")
    for (const std::string& d : split(parts[0], 'x')) {
      const int64_t n = to_int(d, "a size in --input " + spec);
      if (n < 0) fail("negative size in --input " + spec);
      sizes.push_back(n);
    }
  const c10::ScalarType dtype = parts.size() > 1 ? dtype_of(parts[1], spec) : at::kFloat;
  if (parts.size() != 1 && parts.size() != 2 && parts.size() != 4)
    fail("expected SIZES[:DTYPE[:LOW:HIGH]] in --input " + spec);
  if (dtype == at::kBool) return at::rand(sizes) < 0.5;
  if (c10::isFloatingType(dtype)) {
    if (parts.size() == 4) {
      const double lo = to_double(parts[2], "LOW in --input " + spec), hi = to_double(parts[3], "HIGH in --input " + spec);
      return (at::rand(sizes, at::kDouble) * (hi - lo) + lo).to(dtype);
    }
    return at::randn(sizes).to(dtype);
  }
  int64_t lo = 0, hi = 10;
  if (parts.size() == 4) lo = to_int(parts[2], "LOW in --input " + spec), hi = to_int(parts[3], "HIGH in --input " + spec);
  if (hi <= lo) fail("empty range [" + std::to_string(lo) + ", " + std::to_string(hi) + ") in --input " + spec);
  return at::randint(lo, hi, sizes, at::TensorOptions().dtype(dtype));
}

std::string describe(const IValue& v) {
  if (!v.isTensor()) {
    std::ostringstream os;
    os << v;
    return os.str();
  }
  const at::Tensor& t = v.toTensor();
  std::ostringstream os;
  os << t.scalar_type() << t.sizes();
  return os.str();
}

// The first difference between two results beyond tolerance ("" if none); `max_diff` is the
// largest absolute difference of floating-point tensors.
std::string compare(const IValue& a, const IValue& e, double rtol, double atol, double& max_diff, const std::string& at) {
  if (a.tagKind() != e.tagKind()) return at + ": " + a.tagKind() + " instead of " + e.tagKind();
  if (e.isTensor()) {
    const at::Tensor &x = a.toTensor(), &y = e.toTensor();
    if (x.defined() != y.defined()) return at + ": undefined tensor on one side";
    if (!y.defined()) return "";
    if (x.sizes() != y.sizes()) return at + ": sizes differ";
    if (x.scalar_type() != y.scalar_type()) return at + ": dtypes differ";
    if (c10::isFloatingType(y.scalar_type())) {
      const at::Tensor d = (x.to(at::kDouble) - y.to(at::kDouble)).abs();
      const at::Tensor finite = d.isfinite();
      if (finite.any().item<bool>()) max_diff = std::max(max_diff, d.masked_select(finite).max().item<double>());
    }
    if (!at::allclose(x, y, rtol, atol, /*equal_nan=*/true)) return at + ": values differ beyond tolerance";
    return "";
  }
  if (e.isTuple() || e.isList()) {
    const std::vector<IValue> xs = a.isTuple() ? a.toTupleRef().elements().vec() : a.toList().vec();
    const std::vector<IValue> ys = e.isTuple() ? e.toTupleRef().elements().vec() : e.toList().vec();
    if (xs.size() != ys.size()) return at + ": lengths differ";
    for (size_t i = 0; i < ys.size(); ++i) {
      std::string m = compare(xs[i], ys[i], rtol, atol, max_diff, at + "[" + std::to_string(i) + "]");
      if (!m.empty()) return m;
    }
    return "";
  }
  if (e.isGenericDict()) {
    const auto x = a.toGenericDict(), y = e.toGenericDict();
    if (x.size() != y.size()) return at + ": dict sizes differ";
    for (auto i = y.begin(); i != y.end(); ++i) {
      if (!x.contains(i->key())) return at + ": a key is missing";
      std::string m = compare(x.at(i->key()), i->value(), rtol, atol, max_diff, at + "[key]");
      if (!m.empty()) return m;
    }
    return "";
  }
  return a == e ? "" : at + ": values differ";
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double pos = p * (v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

std::string fmt_ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, ms < 1 ? "%.4f" : ms < 100 ? "%.3f" : "%.1f", ms);
  return buf;
}

// Compares `got` with `expected` and prints the check line; returns the exit status.
int report_check(const IValue& got, const IValue& expected, double rtol, double atol, const std::string& against) {
  double max_diff = 0;
  const std::string mismatch = compare(got, expected, rtol, atol, max_diff, "result");
  char diff[32];
  std::snprintf(diff, sizeof diff, "%.3g", max_diff);
  if (mismatch.empty()) {
    std::cout << "check against " << against << ": ok (max abs difference " << diff << ", rtol " << rtol << ", atol "
              << atol << ")\n";
    return 0;
  }
  std::cout << "check against " << against << ": DIFFERS: " << mismatch << " (max abs difference " << diff << ")\n";
  return 1;
}

// Times `ours` and `theirs` alternately (so both see the same conditions), with a progress line
// when it takes a while, and prints their percentiles and the speedup at p50.
void time_alternately(const std::function<void()>& ours_fn, const std::function<void()>& theirs_fn, int64_t iters,
                      int64_t warmup, const char* ours_name, const char* theirs_name) {
  for (int64_t i = 0; i < warmup; ++i) ours_fn(), theirs_fn();
  std::vector<double> ours, theirs;
  const auto start = Clock::now();
  auto last_progress = start;
  bool progress_shown = false;
  for (int64_t i = 0; i < iters; ++i) {
    auto a = Clock::now();
    ours_fn();
    auto b = Clock::now();
    theirs_fn();
    auto c = Clock::now();
    ours.push_back(std::chrono::duration<double, std::milli>(b - a).count());
    theirs.push_back(std::chrono::duration<double, std::milli>(c - b).count());
    if (c - last_progress > std::chrono::milliseconds(500) && c - start > std::chrono::seconds(1)) {
      std::cerr << "\rtiming: " << i + 1 << "/" << iters << " calls" << std::flush;
      last_progress = c;
      progress_shown = true;
    }
  }
  if (progress_shown) std::cerr << "\r" << std::string(40, ' ') << "\r" << std::flush;
  auto line = [&](const char* who, const std::vector<double>& v) {
    std::cout << who << " p50 " << fmt_ms(percentile(v, 0.5)) << "  p90 " << fmt_ms(percentile(v, 0.9)) << "  p99 "
              << fmt_ms(percentile(v, 0.99)) << "  min " << fmt_ms(*std::min_element(v.begin(), v.end())) << "\n";
  };
  std::cout << "warm latency, ms over " << iters << " calls each (alternating):\n";
  line(ours_name, ours);
  line(theirs_name, theirs);
  char speedup[32];
  std::snprintf(speedup, sizeof speedup, "%.2fx", percentile(theirs, 0.5) / percentile(ours, 0.5));
  std::cout << "speedup at p50: " << speedup << "\n";
}

bool is_package(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char head[20] = {};
  f.read(head, sizeof head);
  return f.gcount() == sizeof head && std::string(head, sizeof head) == "TORCHCOMPILE-PACKAGE";
}

// A package: loaded with `backend`, checked and timed against its graphs run by the interpreter.
int run_package(const std::string& path, const std::string& backend, const std::vector<IValue>& given, bool check,
                bool explain, double rtol, double atol, int64_t iters, int64_t warmup) {
  auto load = [&](const std::string& b) {
    try {
      return torchcompile::load(path, b);
    } catch (const std::exception& e) {
      std::string what = e.what();
      fail(what.substr(0, what.find("\nException raised")));
    }
  };
  const auto t0 = Clock::now();
  torchcompile::LoadedModule m = load(backend);
  const double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::cout << "package: " << path << " (" << m.name() << "), " << m.num_entries() << " entr"
            << (m.num_entries() == 1 ? "y" : "ies") << "\n";
  std::vector<IValue> inputs = given;
  if (inputs.empty()) {
    try {
      inputs = m.example_inputs(0);
    } catch (const std::exception& e) {
      std::string what = e.what();
      fail(what.substr(0, what.find("\nException raised")));
    }
  }
  std::cout << "inputs" << (given.empty() ? " (the first entry's signature)" : "") << ":";
  for (size_t i = 0; i < inputs.size(); ++i) std::cout << (i ? ", " : " ") << describe(inputs[i]);
  std::cout << "\nbackend: " << backend << ", " << at::get_num_threads() << " threads, inference mode\n";
  c10::InferenceMode inference;
  IValue got;
  const auto t1 = Clock::now();
  try {
    got = m.forward(inputs);
  } catch (const std::exception& e) {
    std::string what = e.what();
    fail("the package throws: " + what.substr(0, what.find("\nException raised")));
  }
  const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
  std::cout << "load (parse + compile " << m.num_graphs() << " graph" << (m.num_graphs() == 1 ? "" : "s")
            << "): " << fmt_ms(load_ms) << " ms, first call: " << fmt_ms(first_ms) << " ms\n";
  if (explain)
    for (const std::string& line : m.describe()) std::cout << line << "\n";
  torchcompile::LoadedModule reference = load("eager");
  int status = 0;
  if (check) status = report_check(got, reference.forward(inputs), rtol, atol, "the package's graphs (interpreter)");
  time_alternately([&] { m.forward(inputs); }, [&] { reference.forward(inputs); }, iters, warmup, "  compiled   ",
                   "  interpreter");
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, backend = "default", method = "forward";
  std::vector<std::string> input_specs;
  bool dynamic = false, check = true, train = false, explain = false;
  int64_t iters = 100, warmup = 5, threads = 0, seed = 0;
  double rtol = 1e-4, atol = 1e-5;
  std::vector<std::string> plugins;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") return usage(std::cout, 0);
    if (a == "--input") {
      input_specs.push_back(value());
    } else if (a == "--backend") {
      backend = value();
    } else if (a == "--method") {
      method = value();
    } else if (a == "--dynamic") {
      dynamic = true;
    } else if (a == "--iters") {
      iters = to_int(value(), "--iters");
    } else if (a == "--warmup") {
      warmup = to_int(value(), "--warmup");
    } else if (a == "--threads") {
      threads = to_int(value(), "--threads");
    } else if (a == "--train") {
      train = true;
    } else if (a == "--rtol") {
      rtol = to_double(value(), "--rtol");
    } else if (a == "--atol") {
      atol = to_double(value(), "--atol");
    } else if (a == "--explain") {
      explain = true;
    } else if (a == "--no-check") {
      check = false;
    } else if (a == "--plugin") {
      plugins.push_back(value());
    } else if (a == "--seed") {
      seed = to_int(value(), "--seed");
    } else if (!a.empty() && a[0] == '-') {
      std::cerr << "torchcompile-run: unknown option " << a << "\n";
      return usage(std::cerr, 2);
    } else if (path.empty()) {
      path = a;
    } else {
      std::cerr << "torchcompile-run: more than one model given (" << path << ", " << a << ")\n";
      return usage(std::cerr, 2);
    }
  }
  if (path.empty()) return usage(std::cerr, 2);
  if (iters < 1) fail("--iters must be at least 1");
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));
  for (const std::string& p : plugins) {
    try {
      torchcompile::load_backend_library(p);
    } catch (const std::exception& e) {
      fail("cannot load plugin " + p + ": " + e.what());
    }
  }
  if (!torchcompile::has_backend(backend)) {
    std::string known;
    for (const std::string& b : torchcompile::list_backends({})) known += (known.empty() ? "" : ", ") + b;
    fail("no backend named '" + backend + "' (registered: " + known + ")");
  }

  if (is_package(path)) {
    if (method != "forward" || dynamic || train) fail("--method, --dynamic and --train do not apply to a package");
    torch::manual_seed(static_cast<uint64_t>(seed));
    std::vector<IValue> inputs;
    for (const std::string& s : input_specs) inputs.push_back(make_input(s));
    return run_package(path, backend, inputs, check, explain, rtol, atol, iters, warmup);
  }

  torch::jit::Module module;
  try {
    module = torch::jit::load(path);
  } catch (const std::exception& e) {
    std::string what = e.what();
    fail("cannot load " + path + " as a TorchScript archive: " + what.substr(0, what.find('\n')));
  }
  if (!module.find_method(method)) fail(path + " has no method '" + method + "'");
  const c10::FunctionSchema& schema = module.get_method(method).function().getSchema();
  std::vector<std::string> params;
  size_t required = 0;
  for (size_t i = 1; i < schema.arguments().size(); ++i) {
    const c10::Argument& arg = schema.arguments()[i];
    params.push_back(arg.name() + ": " + arg.type()->annotation_str() + (arg.default_value() ? " (has a default)" : ""));
    if (!arg.default_value()) required = i;
  }
  std::cout << "model: " << path << ", method " << method << "(";
  for (size_t i = 0; i < params.size(); ++i) std::cout << (i ? ", " : "") << params[i];
  std::cout << ")\n";
  if (input_specs.size() < required || input_specs.size() > params.size()) {
    std::cerr << "torchcompile-run: " << method << " takes " << required
              << (required == params.size() ? "" : " to " + std::to_string(params.size())) << " arguments; give one --input per argument, in order (got "
              << input_specs.size() << "). See --help for the forms of --input.\n";
    return 2;
  }

  torch::manual_seed(static_cast<uint64_t>(seed));
  std::vector<IValue> inputs;
  for (const std::string& s : input_specs) inputs.push_back(make_input(s));
  std::cout << "inputs:";
  for (size_t i = 0; i < inputs.size(); ++i) std::cout << (i ? ", " : " ") << describe(inputs[i]);
  std::cout << "\nbackend: " << backend << (dynamic ? " (dynamic)" : "") << ", " << at::get_num_threads() << " threads, "
            << (train ? "training mode, autograd on" : "eval(), inference mode") << "\n";

  if (!train) module.eval();
  std::optional<c10::InferenceMode> inference;
  if (!train) inference.emplace();
  auto compiled = torchcompile::compile_method(module, method, torchcompile::CompileOptions(backend).with_dynamic(dynamic));
  torch::jit::Method reference = module.get_method(method);

  // The reference first (eager, untraced), then the compiled module's first call.
  IValue expected;
  try {
    expected = reference(inputs);
  } catch (const std::exception& e) {
    std::string what = e.what();
    fail("TorchScript's own " + method + " throws on these inputs: " + what.substr(0, what.find('\n')));
  }
  IValue got;
  const auto t0 = Clock::now();
  try {
    got = compiled.forward(inputs);
  } catch (const std::exception& e) {
    std::string what = e.what();
    fail("the compiled " + method + " throws: " + what.substr(0, what.find('\n')));
  }
  const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::cout << "first call (trace + compile + run): " << fmt_ms(first_ms) << " ms\n";
  const auto entries = compiled.state().entries();
  size_t graphs = 0, breaks = 0;
  std::string eager_reason;
  for (const auto& e : entries) {
    if (e->runs_eagerly()) eager_reason = e->eager_reason();
    graphs += e->num_graphs();
    breaks += e->num_breaks();
  }
  if (!eager_reason.empty()) {
    std::cout << "compiled: no, runs eagerly: " << eager_reason << "\n";
  } else {
    std::cout << "compiled: " << graphs << " graph" << (graphs == 1 ? "" : "s") << ", " << breaks << " graph break"
              << (breaks == 1 ? "" : "s") << "\n";
  }

  if (explain && !entries.empty()) std::cout << torchcompile::runtime::explain_entry(*entries.front()).str() << "\n";

  int status = 0;
  if (check) {
    // The first call ran the method while tracing; the second runs the compiled graphs.
    status = report_check(compiled.forward(inputs), expected, rtol, atol, "TorchScript");
  }
  time_alternately([&] { compiled.forward(inputs); }, [&] { reference(inputs); }, iters, warmup, "  compiled   ",
                   "  TorchScript");
  return status;
}
