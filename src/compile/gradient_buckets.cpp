#include "compile/gradient_buckets.h"

#include <torchcompile/ir/split.h>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile::compile_stage {

struct GradientBucketsRegistration {
  std::unordered_map<const c10::TensorImpl*, size_t> bytes;  // parameter -> its size in bytes
  std::vector<at::Tensor> keep;                              // the parameters, kept alive
  size_t bucket_bytes = 0;
  size_t first_bucket_bytes = 0;
  ~GradientBucketsRegistration();
};

namespace {

std::mutex registry_mu;
std::vector<GradientBucketsRegistration*>& registry() {
  static std::vector<GradientBucketsRegistration*> r;
  return r;
}
std::atomic<size_t> registered{0};

}  // namespace

GradientBucketsRegistration::~GradientBucketsRegistration() {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& r = registry();
  r.erase(std::remove(r.begin(), r.end(), this), r.end());
  registered.store(r.size());
}

std::shared_ptr<GradientBucketsRegistration> register_gradient_buckets(const std::vector<at::Tensor>& params,
                                                                      size_t bucket_bytes, size_t first_bucket_bytes) {
  auto reg = std::make_shared<GradientBucketsRegistration>();
  for (const at::Tensor& p : params) reg->bytes[p.unsafeGetTensorImpl()] = p.numel() * p.element_size();
  reg->keep = params;
  reg->bucket_bytes = std::max<size_t>(bucket_bytes, 1);
  reg->first_bucket_bytes = std::max<size_t>(std::min(first_bucket_bytes, bucket_bytes), 1);
  std::lock_guard<std::mutex> lock(registry_mu);
  registry().push_back(reg.get());
  registered.store(registry().size());
  return reg;
}

std::vector<std::vector<const ir::Node*>> gradient_bucket_groups(const ir::GraphModule& gm) {
  if (registered.load() == 0 || !at::GradMode::is_enabled()) return {};
  std::lock_guard<std::mutex> lock(registry_mu);
  const GradientBucketsRegistration* reg = nullptr;
  for (const auto& [name, attr] : gm.attributes()) {
    for (const GradientBucketsRegistration* r : registry())
      if (r->bytes.count(attr.first.unsafeGetTensorImpl())) reg = r;
    if (reg) break;
  }
  if (!reg) return {};

  std::vector<const ir::Node*> calls;
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == ir::NodeKind::CallFunction) calls.push_back(n.get());
  std::vector<std::vector<const ir::Node*>> buckets(1);
  std::unordered_set<const c10::TensorImpl*> counted;
  size_t bytes = 0, limit = reg->first_bucket_bytes;
  for (auto it = calls.rbegin(); it != calls.rend(); ++it) {
    if (bytes >= limit && !buckets.back().empty()) {
      buckets.emplace_back();
      bytes = 0;
      limit = reg->bucket_bytes;
    }
    buckets.back().push_back(*it);
    for (const ir::Value& v : ir::input_values(**it)) {
      if (v.node->kind() != ir::NodeKind::GetAttr || !gm.has_attribute(v.node->target())) continue;
      const c10::TensorImpl* impl = gm.attribute(v.node->target()).unsafeGetTensorImpl();
      auto found = reg->bytes.find(impl);
      if (found != reg->bytes.end() && counted.insert(impl).second) bytes += found->second;
    }
  }
  // Nodes before the first parameter read (work on the inputs) join the bucket after them.
  if (buckets.size() > 1 && bytes == 0) {
    auto tail = std::move(buckets.back());
    buckets.pop_back();
    buckets.back().insert(buckets.back().end(), tail.begin(), tail.end());
  }
  if (buckets.size() < 2) return {};
  std::reverse(buckets.begin(), buckets.end());
  for (auto& b : buckets) std::reverse(b.begin(), b.end());
  return buckets;
}

}  // namespace torchcompile::compile_stage
