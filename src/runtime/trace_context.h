// What a module call boundary needs to know about the trace running on this thread: the
// compile options (for the graphs of opaque submodules), the module paths of the enclosing
// calls, and the modules whose hooks the new entry depends on.
#pragma once

#include <torchcompile/runtime/compile_options.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace torchcompile::runtime {

class TraceContext {
 public:
  TraceContext(const CompileOptions& options, std::string name, torch::nn::Module* root)
      : options_(options), name_(std::move(name)), root_(root) {}

  /// The context of the trace running on this thread, or nullptr.
  static TraceContext* current();

  /// Makes `ctx` current on this thread while alive.
  class Scope {
   public:
    explicit Scope(TraceContext& ctx);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    TraceContext* previous_;
  };

  const CompileOptions& options() const { return options_; }
  const std::string& name() const { return name_; }

  /// The qualified path of `m` called from the innermost enclosing module call: its name as
  /// a registered child there, else its path under the root, else its type name.
  std::string path_of(const torch::nn::Module& m) const;
  void push(const torch::nn::Module& m, std::string path) { stack_.emplace_back(&m, std::move(path)); }
  void pop() { stack_.pop_back(); }

  /// Record that the trace crossed a call boundary of `m` while its hooks were at `version`.
  struct Noted {
    std::shared_ptr<torch::nn::Module> module;
    uint64_t version;
    std::string path;
  };
  void note(const std::shared_ptr<torch::nn::Module>& m, uint64_t version, const std::string& path);
  const std::vector<Noted>& modules() const { return modules_; }

 private:
  const CompileOptions& options_;
  std::string name_;
  torch::nn::Module* root_;
  std::vector<std::pair<const torch::nn::Module*, std::string>> stack_;
  std::vector<Noted> modules_;
};

/// The type name of `m` without its namespace and `Impl` suffix (`Linear`), for messages and
/// for the path of a module called from outside the root's tree.
std::string module_type_name(const torch::nn::Module& m);

}  // namespace torchcompile::runtime
