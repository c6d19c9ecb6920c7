// torchcompile-minify: replay a repro directory written under TORCHCOMPILE_REPRO_AFTER=backend,
// and shrink it to the smallest graph that still fails the same way.
#include <torchcompile/backends/registry.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/repro/repro.h>

#include <filesystem>
#include <iostream>
#include <string>

namespace {

int usage(std::ostream& os, int status) {
  os << "usage: torchcompile-minify [options] <repro-dir>\n"
        "\n"
        "Replays the repro (same error, or the same accuracy failure), then shrinks its graph to the\n"
        "smallest one that still fails the same way. Writes the minimized repro, with repro.cpp and a\n"
        "CMakeLists.txt that build a program failing the same way, to <repro-dir>/minified (or --out),\n"
        "and prints the minimized graph.\n"
        "\n"
        "options:\n"
        "  --replay         only replay: exit status 1 if it fails as recorded, 0 if it does not fail,\n"
        "                   2 if it fails otherwise\n"
        "  --out DIR        where to write the minimized repro\n"
        "  --plugin PATH    load this backend plugin first (else the recorded plugin, else\n"
        "                   TORCHCOMPILE_BACKEND_PATH)\n"
        "  --any-error      while shrinking, accept any error of the same kind, not only the same message\n"
        "  -q, --quiet      do not log each step\n";
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  namespace repro = torchcompile::repro;
  bool replay_only = false, quiet = false;
  repro::MinifyOptions options;
  std::string dir, out, plugin;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--replay") replay_only = true;
    else if (a == "--any-error") options.any_error = true;
    else if (a == "-q" || a == "--quiet") quiet = true;
    else if ((a == "--out" || a == "--plugin") && i + 1 < argc) (a == "--out" ? out : plugin) = argv[++i];
    else if (a == "-h" || a == "--help") return usage(std::cout, 0);
    else if (!a.empty() && a[0] == '-') return usage(std::cerr, 64);
    else if (dir.empty()) dir = a;
    else return usage(std::cerr, 64);
  }
  if (dir.empty()) return usage(std::cerr, 64);
  try {
    if (!plugin.empty()) torchcompile::load_backend_library(plugin);
    repro::Repro r = repro::load(dir);
    std::cout << "repro " << dir << ": backend '" << r.backend << "', " << repro::failure_name(r.failure) << ", "
              << repro::count_calls(r.gm->graph()) << " call_function nodes\n";
    if (replay_only) {
      repro::Outcome o = repro::replay(r);
      std::cout << "replayed: " << o.describe() << "\n";
      if (o.failure == repro::Failure::None) return 0;
      return repro::same_failure(r, o) ? 1 : 2;
    }
    if (!quiet) options.log = &std::cerr;
    repro::Repro small = repro::minify(r, options);
    if (out.empty()) out = (std::filesystem::path(dir) / "minified").string();
    repro::save(small, out);
    repro::write_program(small, out);
    std::cout << "minimized to " << repro::count_calls(small.gm->graph()) << " call_function nodes, written to " << out
              << "\n";
    torchcompile::ir::print_tabular(small.gm->graph(), std::cout);
    std::cout << "fails with: " << repro::replay(small).describe() << "\n"
              << "standalone program: " << out << "/repro.cpp (cmake -S " << out << " -B <build dir> "
              << "-DCMAKE_PREFIX_PATH=<torchcompile prefix>)\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "torchcompile-minify: " << e.what() << "\n";
    return 3;
  }
}
