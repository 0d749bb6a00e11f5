#include "tensor_parallel/parameters.h"

#include <c10/util/Exception.h>

namespace megatron::tp {

void ParamTable::add(const std::string& name, const ParamInfo& info) {
  if (info_.emplace(name, info).second) names_.push_back(name);
}

const ParamInfo& ParamTable::at(const std::string& name) const {
  auto it = info_.find(name);
  TORCH_CHECK(it != info_.end(), "parameter '", name, "' has no description (registered without DescribedModule::add_parameter?)");
  return it->second;
}

void ParamTable::merge(const ParamTable& other) {
  for (const auto& name : other.names()) add(name, other.at(name));
}

at::Tensor DescribedModule::add_parameter(const std::string& name, const at::Tensor& tensor, const ParamInfo& info) {
  info_[name] = info;
  return register_parameter(name, tensor, /*requires_grad=*/info.trainable);
}

namespace {

void describe_into(const torch::nn::Module& module, const std::string& prefix, ParamTable& table) {
  const auto* described = dynamic_cast<const DescribedModule*>(&module);
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    const std::string name = prefix + item.key();
    TORCH_CHECK(described != nullptr && described->own_parameter_info().count(item.key()),
                "parameter '", name, "' was registered without its description (DescribedModule::add_parameter)");
    table.add(name, described->own_parameter_info().at(item.key()));
  }
  for (const auto& child : module.named_children()) describe_into(*child.value(), prefix + child.key() + ".", table);
}

}  // namespace

ParamTable describe_parameters(const torch::nn::Module& root) {
  ParamTable table;
  describe_into(root, "", table);
  return table;
}

}  // namespace megatron::tp
