// A program that holds no model code and links only the library: it loads the packages a test
// wrote (Package.SecondProcessLoadsWithoutTheModelsCode), runs the calls recorded next to each
// one and compares the results with those eager LibTorch gave in the writing process.
//
//     package_loader [--across-versions] <directory> [backend...]   (backends: default and eager if none given)
//
// --across-versions: the packages were written by another LibTorch. A call whose graph break read
// a floating-point value that this LibTorch computes in other last bits then gives the documented
// error "a value never seen before the package was saved" (docs/deploying.md); such calls are
// counted and printed, not failures. Every other call must agree as without the flag.
//
// For each `<name>.tcpkg` in the directory, `<name>.cases` (torch::pickle_save) holds a list of
// calls: (arguments, keyword arguments, expected result, expected error). A call with an
// expected error must throw a c10::Error containing it. Exit status 0 if every call of every
// package agrees with every backend, 1 otherwise (each disagreement printed), 2 for bad usage.
#include <torchcompile/torchcompile.h>

#include <torch/csrc/jit/serialization/pickle.h>

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

int failures = 0;

void fail(const std::string& where, const std::string& what) {
  ++failures;
  std::cerr << "package_loader: " << where << ": " << what << "\n";
}

void compare(const c10::IValue& got, const c10::IValue& expected, const std::string& where) {
  if (got.tagKind() != expected.tagKind()) return fail(where, "got a " + got.tagKind() + ", expected a " + expected.tagKind());
  if (expected.isTensor()) {
    const at::Tensor &g = got.toTensor(), &e = expected.toTensor();
    if (g.defined() != e.defined()) return fail(where, "definedness differs");
    if (!e.defined()) return;
    if (g.sizes() != e.sizes() || g.scalar_type() != e.scalar_type())
      return fail(where, "got " + c10::str(g.scalar_type(), g.sizes()) + ", expected " + c10::str(e.scalar_type(), e.sizes()));
    if (!at::allclose(g, e, 1e-4, 1e-5, /*equal_nan=*/true))
      fail(where, "values differ: max difference " +
                      std::to_string((g.to(at::kDouble) - e.to(at::kDouble)).abs().max().item<double>()));
    return;
  }
  if (expected.isTuple() || expected.isList()) {
    std::vector<c10::IValue> g = got.isTuple() ? got.toTupleRef().elements().vec() : got.toList().vec();
    std::vector<c10::IValue> e = expected.isTuple() ? expected.toTupleRef().elements().vec() : expected.toList().vec();
    if (g.size() != e.size()) return fail(where, "length " + std::to_string(g.size()) + ", expected " + std::to_string(e.size()));
    for (size_t i = 0; i < e.size(); ++i) compare(g[i], e[i], where + "[" + std::to_string(i) + "]");
    return;
  }
  if (expected.isGenericDict()) {
    const auto gd = got.toGenericDict(), ed = expected.toGenericDict();
    if (gd.size() != ed.size()) return fail(where, "dict sizes differ");
    for (auto i = ed.begin(); i != ed.end(); ++i) {
      if (!gd.contains(i->key())) return fail(where, "a key is missing");
      compare(gd.at(i->key()), i->value(), where + "[key]");
    }
    return;
  }
  if (!(got == expected)) fail(where, "values differ");
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  int first = 1;
  const bool across_versions = argc > 1 && std::string(argv[1]) == "--across-versions";
  if (across_versions) ++first;
  if (argc < first + 1) {
    std::cerr << "usage: package_loader [--across-versions] <directory> [backend...]\n";
    return 2;
  }
  const std::string dir = argv[first];
  std::vector<std::string> backends(argv + first + 1, argv + argc);
  size_t other_bits = 0;  // --across-versions: calls given the documented error (above)
  if (backends.empty()) backends = {"default", "eager"};
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string f = e->d_name;
      if (f.size() > 6 && f.compare(f.size() - 6, 6, ".tcpkg") == 0) names.push_back(f.substr(0, f.size() - 6));
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) {
    std::cerr << "package_loader: no package in " << dir << "\n";
    return 2;
  }
  size_t calls = 0;
  for (const std::string& name : names) {
    const std::string cases_path = dir + "/" + name + ".cases";
    const std::vector<char> bytes = read_bytes(cases_path);
    if (bytes.empty()) {
      fail(name, "no " + cases_path);
      continue;
    }
    const c10::List<c10::IValue> cases = torch::jit::pickle_load(bytes).toList();
    for (const std::string& backend : backends) {
      const std::string where = name + " (" + backend + ")";
      try {
        torchcompile::LoadedModule m = torchcompile::load(dir + "/" + name + ".tcpkg", backend);
        for (size_t k = 0; k < cases.size(); ++k) {
          const auto& c = cases.get(k).toTupleRef().elements();
          std::vector<c10::IValue> args = c.at(0).toList().vec();
          std::unordered_map<std::string, c10::IValue> kwargs;
          const auto kw = c.at(1).toGenericDict();
          for (auto i = kw.begin(); i != kw.end(); ++i) kwargs.emplace(i->key().toStringRef(), i->value());
          const std::string expected_error = c.at(3).toStringRef();
          const std::string call = where + " call " + std::to_string(k);
          ++calls;
          if (!expected_error.empty()) {
            try {
              m.forward(args, kwargs);
              fail(call, "did not throw; expected an error containing: " + expected_error);
            } catch (const c10::Error& e) {
              if (std::string(e.what_without_backtrace()).find(expected_error) == std::string::npos)
                fail(call, std::string("threw: ") + e.what_without_backtrace() + "\nexpected it to contain: " + expected_error);
            }
            continue;
          }
          c10::IValue got;
          try {
            got = m.forward(args, kwargs);
          } catch (const c10::Error& e) {
            const std::string what = e.what_without_backtrace();
            if (!across_versions || what.find("a value never seen before the package was saved") == std::string::npos)
              throw;
            ++other_bits;
            std::cout << "package_loader: " << call << ": a value read at a graph break has other last bits in this "
                      << "LibTorch: " << what.substr(0, what.find(';')) << "\n";
            continue;
          }
          compare(got, c.at(2), call);
        }
      } catch (const std::exception& e) {
        fail(where, std::string("threw: ") + e.what());
      }
    }
  }
  std::cout << "package_loader: " << names.size() << " packages, " << calls << " calls with " << backends.size()
            << " backend(s): " << (failures ? std::to_string(failures) + " failure(s)" : std::string("ok"))
            << (other_bits ? ", " + std::to_string(other_bits) + " call(s) met a value in other last bits (documented)" : "")
            << std::endl;
  return failures ? 1 : 0;
}
