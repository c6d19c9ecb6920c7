// Signatures torch::compile must reject at compile time, each with a static_assert whose message
// names torch::compile and whose instantiation names the offending type. Built only by the
// compile_fail CTest tests (test/compile_fail/CMakeLists.txt), one object target per CASE; they
// pass when the build fails with the expected message.
#include <torchcompile/torchcompile.h>

#include <string>
#include <tuple>

struct RunConfig {  // a user struct not registered with TORCHCOMPILE_FIELDS
  int steps = 1;
};

struct Unregistered {
  torch::Tensor recon, mu;
};

struct WithCount {  // registered, but an int field cannot be returned
  torch::Tensor y;
  int count = 0;
};
TORCHCOMPILE_FIELDS(WithCount, y, count);

#ifndef CASE
#define CASE 0
#endif

torch::Tensor compile_fail_case(torch::Tensor x) {
#if CASE == 1
  // A forward argument of an unsupported type.
  auto f = torch::compile([](torch::Tensor t, RunConfig c) { return t * c.steps; });
  return f(x, RunConfig{});
#elif CASE == 2
  // A result of a struct that was not made returnable.
  auto f = torch::compile([](torch::Tensor t) { return Unregistered{t, t}; });
  Unregistered r = f(x);
  return r.recon;
#elif CASE == 3
  // An unsupported type nested in a tuple argument: the error names the element, not the tuple.
  auto f = torch::compile([](std::tuple<torch::Tensor, std::string> a) { return std::get<0>(a); });
  return f(std::make_tuple(x, std::string("relu")));
#elif CASE == 4
  // A registered struct whose field is not returnable.
  auto f = torch::compile([](torch::Tensor t) { return WithCount{t, 1}; });
  WithCount r = f(x);
  return r.y;
#else
  return x;
#endif
}
