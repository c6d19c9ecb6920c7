// Using a backend plugin (examples/plugin/, libtorchcompile_backend_example.so).
//
//     example_plugin_usage path/to/libtorchcompile_backend_example.so   # load it explicitly
//     TORCHCOMPILE_BACKEND_PATH=dir example_plugin_usage                # found by name
//
// With neither, the directory the plugin was built into is used as TORCHCOMPILE_BACKEND_PATH.
#include <torch/torch.h>
#include <torchcompile/torchcompile.h>

#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  torch::manual_seed(0);
  try {
    if (argc > 1) {
      std::cout << "loading plugin " << argv[1] << "\n";
      for (const std::string& name : torchcompile::load_backend_library(argv[1]))
        std::cout << "  it registered backend '" << name << "'\n";
    } else {
      const char* path = std::getenv("TORCHCOMPILE_BACKEND_PATH");
#ifdef TORCHCOMPILE_EXAMPLE_PLUGIN_DIR
      if (!path || !*path) {
        setenv("TORCHCOMPILE_BACKEND_PATH", TORCHCOMPILE_EXAMPLE_PLUGIN_DIR, 1);
        path = TORCHCOMPILE_EXAMPLE_PLUGIN_DIR;
      }
#endif
      std::cout << "no plugin given: backend 'example' will be searched on TORCHCOMPILE_BACKEND_PATH="
                << (path ? path : "") << "\n";
    }

    auto fn = [](torch::Tensor x, torch::Tensor y) { return torch::cos(x) + torch::sin(y); };
    auto fast = torch::compile(fn, "example");
    torch::Tensor x = torch::randn({10}), y = torch::randn({10});
    torch::Tensor out = fast(x, y);   // compiles with the plugin's backend
    torch::Tensor again = fast(x, y); // cache hit
    const bool ok = torch::allclose(out, fn(x, y)) && torch::allclose(again, fn(x, y));
    std::cout << "compiled with backend 'example': " << (ok ? "matches eager" : "MISMATCH") << "\n";
    return ok ? 0 : 1;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 1;
}
