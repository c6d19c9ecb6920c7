// state_dict / load_state_dict and their hooks; a compiled module after load_state_dict.
#include "support/test_util.h"

#include <gmock/gmock.h>

namespace tc = torchcompile;
using tc_test::error_of;
using tc_test::tensors_close;
using tc_test::tensors_equal;
using ::testing::HasSubstr;

namespace {

struct ModelImpl : torch::nn::Module {
  ModelImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(4));
    fc = register_module("fc", torch::nn::Linear(4 * 6 * 6, 5));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = tc::call(bn, tc::call(conv, x)).relu();
    return tc::call(fc, x.flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Model);

std::vector<std::string> keys_of(const tc::StateDict& d) { return d.keys(); }

TEST(StateDict, KeysFollowPyTorchOrderAndTensorsAreDetachedUnlessKeepVars) {
  Model m;
  auto sd = tc::state_dict(m);
  EXPECT_EQ(keys_of(sd), (std::vector<std::string>{"conv.weight", "conv.bias", "bn.weight", "bn.bias",
                                                   "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
                                                   "fc.weight", "fc.bias"}));
  EXPECT_FALSE(sd["fc.weight"].requires_grad());
  EXPECT_EQ(sd["fc.weight"].data_ptr(), m->fc->weight.data_ptr());  // shares memory, as PyTorch
  auto kept = tc::state_dict(m, /*keep_vars=*/true);
  EXPECT_TRUE(kept["fc.weight"].is_same(m->fc->weight));
}

TEST(StateDict, RoundTripsAModelAndACompiledModuleSeesTheLoadedValues) {
  torch::manual_seed(1);
  Model a;
  Model b;
  a->eval();
  b->eval();
  {
    // Give BatchNorm non-trivial statistics so buffers matter.
    torch::NoGradGuard g;
    a->bn->running_mean.uniform_(-1, 1);
    a->bn->running_var.uniform_(0.5, 2);
  }
  tc_test::CompileCounter cc;
  auto fast_b = tc::compile(b, cc.backend());
  auto x = torch::randn({2, 3, 6, 6});
  auto before = fast_b(x);
  EXPECT_FALSE(torch::allclose(before, a->forward(x)));
  const at::TensorImpl* weight_impl = b->fc->weight.unsafeGetTensorImpl();

  auto keys = tc::load_state_dict(b, tc::state_dict(a));
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_TRUE(keys.unexpected_keys.empty());
  for (const auto& item : tc::state_dict(a)) EXPECT_TRUE(tensors_equal(item.value(), tc::state_dict(b)[item.key()]));
  EXPECT_EQ(b->fc->weight.unsafeGetTensorImpl(), weight_impl);  // copied in place
  EXPECT_TRUE(tensors_close(a->forward(x), fast_b(x)));
  EXPECT_EQ(cc.frames(), 1);  // no recompile
  EXPECT_EQ(fast_b.state().num_entries(), 1u);
}

TEST(StateDict, SaveHooksFirePerModuleAndMayEditTheDict) {
  Model m;
  std::vector<std::string> calls;
  tc::register_state_dict_pre_hook(m, [&](torch::nn::Module&, const std::string& prefix) {
    calls.push_back("pre:" + prefix);
  });
  tc::register_state_dict_pre_hook(m->fc, [&](torch::nn::Module&, const std::string& prefix) {
    calls.push_back("pre:" + prefix);
  });
  auto h = tc::register_state_dict_post_hook(m->fc, [&](torch::nn::Module&, tc::StateDict& sd, const std::string& prefix) {
    calls.push_back("post:" + prefix);
    sd.insert(prefix + "version", torch::tensor(2));
  });
  auto sd = tc::state_dict(m);
  EXPECT_EQ(calls, (std::vector<std::string>{"pre:", "pre:fc.", "post:fc."}));
  ASSERT_NE(sd.find("fc.version"), nullptr);
  EXPECT_EQ(sd["fc.version"].item<int64_t>(), 2);
  h.remove();
  EXPECT_EQ(tc::state_dict(m).find("fc.version"), nullptr);
}

TEST(StateDict, LoadPreHookRenamesOldKeysAndPostHookMayForgiveMissingKeys) {
  Model a, b;
  // An "old checkpoint": fc was called "classifier".
  tc::StateDict old;
  for (const auto& item : tc::state_dict(a)) {
    std::string k = item.key();
    if (k.rfind("fc.", 0) == 0) k = "classifier." + k.substr(3);
    old.insert(k, item.value());
  }
  EXPECT_THAT(error_of([&] { tc::load_state_dict(b, old); }),
              HasSubstr("Missing key(s) in state_dict: \"fc.weight\", \"fc.bias\"."));
  EXPECT_THAT(error_of([&] { tc::load_state_dict(b, old); }),
              HasSubstr("Unexpected key(s) in state_dict: \"classifier.weight\", \"classifier.bias\"."));

  std::vector<std::string> prefixes;
  auto rename = tc::register_load_state_dict_pre_hook(
      b, [&](torch::nn::Module&, tc::StateDict& sd, const std::string& prefix) {
        prefixes.push_back(prefix);
        tc::StateDict renamed;
        for (const auto& item : sd) {
          std::string k = item.key();
          if (k.rfind(prefix + "classifier.", 0) == 0) k = prefix + "fc." + k.substr(prefix.size() + 11);
          renamed.insert(k, item.value());
        }
        sd = renamed;
      });
  auto keys = tc::load_state_dict(b, old);
  EXPECT_EQ(prefixes, std::vector<std::string>{""});
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_TRUE(tensors_equal(a->fc->weight, b->fc->weight));
  rename.remove();

  // Without the renaming, a post hook that forgives the missing head makes strict loading pass.
  Model c;
  int post_calls = 0;
  tc::register_load_state_dict_post_hook(c->fc, [&](torch::nn::Module&, tc::IncompatibleKeys& k) {
    ++post_calls;
    k.missing_keys.clear();
    k.unexpected_keys.clear();
  });
  EXPECT_NO_THROW(tc::load_state_dict(c, old));
  EXPECT_EQ(post_calls, 1);
  EXPECT_TRUE(tensors_equal(a->conv->weight, c->conv->weight));
}

TEST(StateDict, ShapeMismatchAlwaysThrowsAndNonStrictReportsKeys) {
  Model m;
  auto sd = tc::state_dict(m);
  tc::StateDict bad;
  for (const auto& item : sd)
    bad.insert(item.key(), item.key() == "fc.bias" ? torch::zeros({7}) : item.value().clone());
  bad.insert("extra", torch::zeros({1}));
  EXPECT_THAT(error_of([&] { tc::load_state_dict(m, bad, /*strict=*/false); }),
              HasSubstr("size mismatch for fc.bias: copying a param with shape [7] from checkpoint, the shape in "
                        "current model is [5]."));
  tc::StateDict partial;
  partial.insert("fc.weight", sd["fc.weight"].clone());
  partial.insert("extra", torch::zeros({1}));
  auto keys = tc::load_state_dict(m, partial, /*strict=*/false);
  EXPECT_EQ(keys.unexpected_keys, std::vector<std::string>{"extra"});
  EXPECT_EQ(keys.missing_keys.size(), sd.size() - 1);
}

}  // namespace
