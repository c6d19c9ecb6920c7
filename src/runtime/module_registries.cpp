// Member pointers to torch::nn::Module's registries (runtime/module_registries.h).
//
//  - `parameters_` is protected: a derived class may form a pointer to it by naming it through
//    itself ([class.protected]: "if the access is to form a pointer to member, the
//    nested-name-specifier shall denote C or a class derived from C"). The type of
//    `&ParametersAccess::parameters_` is `OrderedDict Module::*` (the member belongs to Module).
//  - `buffers_` and `children_` are private: names used in an explicit instantiation are exempt
//    from access checking ([temp.explicit]/12 in C++17, [temp.spec.general]/6 in C++20), so
//    `template struct Grab<BuffersTag, &Module::buffers_>;` may name the member; the
//    instantiation defines the friend function `get(BuffersTag)` that returns the pointer. An
//    explicit instantiation may appear once in a program: here.
//
// Neither depends on the object layout or invokes undefined behaviour.
#include "runtime/module_registries.h"

namespace torchcompile::runtime {

namespace {

struct ParametersAccess : torch::nn::Module {
  static TensorDict torch::nn::Module::*member() { return &ParametersAccess::parameters_; }
};

template <typename Tag, typename Tag::type Member>
struct Grab {
  friend typename Tag::type get(Tag) { return Member; }
};
struct BuffersTag {
  using type = TensorDict torch::nn::Module::*;
  friend type get(BuffersTag);
};
struct ChildrenTag {
  using type = ModuleDict torch::nn::Module::*;
  friend type get(ChildrenTag);
};
template struct Grab<BuffersTag, &torch::nn::Module::buffers_>;
template struct Grab<ChildrenTag, &torch::nn::Module::children_>;

}  // namespace

namespace registries {
TensorDict torch::nn::Module::* const kParameters = ParametersAccess::member();
TensorDict torch::nn::Module::* const kBuffers = get(BuffersTag{});
ModuleDict torch::nn::Module::* const kChildren = get(ChildrenTag{});
}  // namespace registries

at::Tensor& registered_tensor(torch::nn::Module& m, const std::string& name, bool parameter) {
  TensorDict& dict = m.*(parameter ? registries::kParameters : registries::kBuffers);
  at::Tensor* t = dict.find(name);
  TORCH_CHECK(t != nullptr, "module '", m.name(), "' has no ", parameter ? "parameter" : "buffer", " '", name, "'");
  return *t;
}

}  // namespace torchcompile::runtime
