// The backend registry: registration rules, claims, listing with tags, lookup errors. Tests share one process-wide registry, so each registers its own names.
#include "support/test_util.h"

#include <torchcompile/backends/registry.h>
#include <torchcompile/ir/graph.h>
#include <torchcompile/ir/graph_module.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using tc_test::error_of;
using tc_test::ScopedEnv;
using tc_test::cos_graph;

using ::testing::HasSubstr;
using torchcompile::Backend;
using torchcompile::CompiledFn;
using torchcompile::GraphModule;

using tc_test::counting_backend;

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

TEST(Registry, BuiltinsAreRegistered) {
  EXPECT_TRUE(torchcompile::has_backend("eager"));
  EXPECT_TRUE(contains(torchcompile::list_backends(), "eager"));
  EXPECT_TRUE(contains(torchcompile::list_backends(/*exclude_tags=*/{}), "debug"));
}

TEST(Registry, RegisterAndHasBackend) {
  auto count = std::make_shared<std::atomic<int>>(0);
  EXPECT_FALSE(torchcompile::has_backend("reg_test_simple"));
  torchcompile::register_backend("reg_test_simple", counting_backend(count));
  EXPECT_TRUE(torchcompile::has_backend("reg_test_simple"));
  EXPECT_FALSE(torchcompile::has_backend("reg_test_simple_not_registered"));

  auto x = torch::randn({4});
  auto gm = cos_graph(x);
  CompiledFn fn = torchcompile::lookup_backend("reg_test_simple")(*gm, {x});
  ASSERT_TRUE(fn);
  EXPECT_EQ(count->load(), 1);
  auto out = fn({x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(tc_test::tensors_close(x.cos(), out[0]));
}

TEST(Registry, DuplicateNameIsRejected) {
  auto count = std::make_shared<std::atomic<int>>(0);
  torchcompile::register_backend("reg_test_dup", counting_backend(count));
  std::string msg = error_of([&] { torchcompile::register_backend("reg_test_dup", counting_backend(count)); });
  EXPECT_THAT(msg, HasSubstr("backend 'reg_test_dup' is already registered"));

  msg = error_of([&] { torchcompile::register_backend("eager", counting_backend(count)); });
  EXPECT_THAT(msg, HasSubstr("backend 'eager' is already registered (built-in)"));
}

TEST(Registry, EmptyNameOrFunctionIsRejected) {
  auto count = std::make_shared<std::atomic<int>>(0);
  EXPECT_THAT(error_of([&] { torchcompile::register_backend("", counting_backend(count)); }),
              HasSubstr("backend name must not be empty"));
  EXPECT_THAT(error_of([&] { torchcompile::register_backend("reg_test_empty_fn", Backend()); }),
              HasSubstr("backend function for 'reg_test_empty_fn' is empty"));
  EXPECT_FALSE(torchcompile::has_backend("reg_test_empty_fn"));
}

TEST(Registry, ListIsSortedAndFiltersTags) {
  auto count = std::make_shared<std::atomic<int>>(0);
  torchcompile::register_backend("reg_test_list_zz", counting_backend(count));
  torchcompile::register_backend("reg_test_list_aa", counting_backend(count));
  torchcompile::register_backend("reg_test_list_dbg", counting_backend(count), {"debug"});
  torchcompile::register_backend("reg_test_list_exp", counting_backend(count), {"slow", "experimental"});
  torchcompile::register_backend("reg_test_list_custom", counting_backend(count), {"custom"});

  auto names = torchcompile::list_backends();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_TRUE(contains(names, "reg_test_list_aa"));
  EXPECT_TRUE(contains(names, "reg_test_list_zz"));
  EXPECT_TRUE(contains(names, "reg_test_list_custom"));
  EXPECT_FALSE(contains(names, "reg_test_list_dbg"));  // default excludes debug and experimental
  EXPECT_FALSE(contains(names, "reg_test_list_exp"));

  auto all = torchcompile::list_backends(/*exclude_tags=*/{});
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
  for (const char* n : {"reg_test_list_aa", "reg_test_list_zz", "reg_test_list_dbg", "reg_test_list_exp",
                        "reg_test_list_custom"})
    EXPECT_TRUE(contains(all, n)) << n;

  auto no_custom = torchcompile::list_backends(/*exclude_tags=*/{"custom"});
  EXPECT_FALSE(contains(no_custom, "reg_test_list_custom"));
  EXPECT_TRUE(contains(no_custom, "reg_test_list_dbg"));
  EXPECT_TRUE(contains(no_custom, "reg_test_list_aa"));
}

TEST(Registry, LookupUnknownListsKnownBackends) {
  auto count = std::make_shared<std::atomic<int>>(0);
  torchcompile::register_backend("reg_test_known", counting_backend(count));
  {
    ScopedEnv env("TORCHCOMPILE_BACKEND_PATH", nullptr);
    std::string msg = error_of([] { torchcompile::lookup_backend("reg_test_no_such_backend"); });
    EXPECT_THAT(msg, HasSubstr("unknown backend 'reg_test_no_such_backend'; known backends: "));
    EXPECT_THAT(msg, HasSubstr("eager"));
    EXPECT_THAT(msg, HasSubstr("reg_test_known"));
    EXPECT_THAT(msg, HasSubstr("TORCHCOMPILE_BACKEND_PATH is not set"));
  }
  {
    ScopedEnv env("TORCHCOMPILE_BACKEND_PATH", "/nonexistent/a:/nonexistent/b");
    std::string msg = error_of([] { torchcompile::lookup_backend("reg_test_no_such_backend"); });
    EXPECT_THAT(msg, HasSubstr("unknown backend 'reg_test_no_such_backend'"));
    EXPECT_THAT(msg, HasSubstr("(searched TORCHCOMPILE_BACKEND_PATH: /nonexistent/a:/nonexistent/b)"));
  }
  EXPECT_FALSE(torchcompile::has_backend("reg_test_no_such_backend"));
}

// A claim is part of a backend's entry: attached when the backend is registered or later, once,
// and only to a registered backend.
TEST(Registry, ClaimsBelongToRegisteredBackends) {
  auto count = std::make_shared<std::atomic<int>>(0);
  auto cos_only = torchcompile::claim_if([](const torchcompile::ir::Node& n) { return n.target() == "aten::cos"; });
  EXPECT_THAT(error_of([&] { torchcompile::register_claim("reg_test_claim_unknown", cos_only); }),
              HasSubstr("expected a registered backend, got 'reg_test_claim_unknown'"));
  EXPECT_FALSE(torchcompile::has_backend("reg_test_claim_unknown"));

  torchcompile::register_backend("reg_test_claimed", counting_backend(count), cos_only);
  EXPECT_TRUE(torchcompile::has_claim("reg_test_claimed"));
  auto x = torch::randn({4});
  auto gm = cos_graph(x);
  torchcompile::Claim claim = torchcompile::lookup_claim("reg_test_claimed");
  ASSERT_TRUE(claim);
  EXPECT_EQ(claim(*gm, {x}).size(), 1u);
  EXPECT_THAT(error_of([&] { torchcompile::register_claim("reg_test_claimed", cos_only); }),
              HasSubstr("backend 'reg_test_claimed' already has a claim"));
  EXPECT_THAT(error_of([&] { torchcompile::register_backend("reg_test_claimed_empty", counting_backend(count),
                                                            torchcompile::Claim()); }),
              HasSubstr("expected a claim function"));

  torchcompile::register_backend("reg_test_claimed_later", counting_backend(count));
  EXPECT_FALSE(torchcompile::has_claim("reg_test_claimed_later"));
  EXPECT_FALSE(torchcompile::lookup_claim("reg_test_claimed_later"));
  EXPECT_FALSE(torchcompile::lookup_claim("reg_test_no_such_backend"));
  torchcompile::register_claim("reg_test_claimed_later", cos_only);
  EXPECT_TRUE(torchcompile::has_claim("reg_test_claimed_later"));
  // Built-ins that compositions use carry their claims.
  for (const char* name : {"onednn", "fused"})
    if (torchcompile::has_backend(name)) EXPECT_TRUE(torchcompile::has_claim(name)) << name;
}

TEST(Registry, ConcurrentRegistrationAndLookup) {
  constexpr int kThreads = 4, kPerThread = 25;
  auto count = std::make_shared<std::atomic<int>>(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, count] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string name = "reg_test_mt_" + std::to_string(t) + "_" + std::to_string(i);
        torchcompile::register_backend(name, counting_backend(count));
        EXPECT_TRUE(torchcompile::has_backend(name));
        EXPECT_TRUE(torchcompile::lookup_backend(name));
        EXPECT_TRUE(contains(torchcompile::list_backends(), name));
      }
    });
  }
  for (auto& th : threads) th.join();
  auto names = torchcompile::list_backends();
  int registered = 0;
  for (const auto& n : names) registered += n.rfind("reg_test_mt_", 0) == 0;
  EXPECT_EQ(registered, kThreads * kPerThread);
}
