#include "checkpoint/torch_save.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <map>
#include <stdexcept>

#include "core/errors.h"

namespace megatron {
namespace {

// torch.save names a storage by its legacy typed class (torch.FloatStorage, ...).
at::ScalarType storage_dtype(const std::string& name, const std::string& what) {
  static const std::map<std::string, at::ScalarType> types = {
      {"FloatStorage", at::kFloat},   {"DoubleStorage", at::kDouble}, {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16}, {"LongStorage", at::kLong}, {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort},   {"CharStorage", at::kChar},     {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool},     {"Float8_e4m3fnStorage", at::kFloat8_e4m3fn}, {"Float8_e5m2Storage", at::kFloat8_e5m2}};
  auto it = types.find(name);
  if (it == types.end()) throw UserError(what + ": a storage of type torch." + name + ", which this reader does not know");
  return it->second;
}

std::vector<int64_t> int_tuple(const pickle::Value& v) {
  std::vector<int64_t> out;
  for (const auto& item : v.items) out.push_back(item->as_int());
  return out;
}

}  // namespace

TorchSaveFile::TorchSaveFile(const std::string& path) : what_(path) {
  std::shared_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_shared<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    throw UserError(path + ": not a file torch.save wrote (a zip archive with data.pkl): " + std::string(e.what()).substr(0, 200));
  }
  open(std::move(reader));
}

TorchSaveFile::TorchSaveFile(std::string bytes, std::string what) : what_(std::move(what)), bytes_(std::move(bytes)) {
  std::shared_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    auto adapter = std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes_.data(), static_cast<off_t>(bytes_.size()));
    reader = std::make_shared<caffe2::serialize::PyTorchStreamReader>(adapter);
  } catch (const std::exception& e) {
    throw UserError(what_ + ": not torch.save bytes: " + std::string(e.what()).substr(0, 200));
  }
  open(std::move(reader));
}

TorchSaveFile::~TorchSaveFile() = default;

void TorchSaveFile::open(std::shared_ptr<caffe2::serialize::PyTorchStreamReader> reader) {
  reader_ = std::move(reader);
  if (!reader_->hasRecord("data.pkl")) throw UserError(what_ + ": no data.pkl in the archive: not a file torch.save wrote");
  const auto [data, size] = reader_->getRecord("data.pkl");
  try {
    // Storages stay unread ids until a tensor is asked for.
    root_ = pickle::parse(std::string_view(static_cast<const char*>(data.get()), size));
  } catch (const std::exception& e) {
    throw UserError(what_ + ": data.pkl: " + e.what());
  }
}

bool TorchSaveFile::is_tensor(const pickle::Value& v) {
  return v.is_object_of("torch._utils", "_rebuild_tensor_v2") && v.items.size() >= 4 &&
         v.items[0]->kind == pickle::Value::Kind::Persistent;
}

at::Tensor TorchSaveFile::storage(const pickle::Value& persistent_id) const {
  // ('storage', torch.<Type>Storage, key, location, numel)
  const pickle::Value& id = *persistent_id.items.at(0);
  if (id.kind != pickle::Value::Kind::Tuple || id.items.size() < 5 || id.items[0]->text != "storage") {
    throw UserError(what_ + ": a persistent id that is not a storage (" + id.describe() + ")");
  }
  const std::string key = id.items[2]->text;
  const at::ScalarType dtype = storage_dtype(id.items[1]->name, what_);
  const int64_t numel = id.items[4]->as_int();
  const std::string record = "data/" + key;
  if (!reader_->hasRecord(record)) throw UserError(what_ + ": the archive lacks the storage " + record);
  const auto [data, size] = reader_->getRecord(record);
  if (int64_t(size) != numel * int64_t(c10::elementSize(dtype))) {
    throw UserError(what_ + ": storage " + record + " holds " + std::to_string(size) + " bytes, its id says " + std::to_string(numel) +
                    " elements of " + std::string(c10::toString(dtype)));
  }
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), data.get(), size);
  return t;
}

at::Tensor TorchSaveFile::tensor(const pickle::Value& v) const {
  if (!is_tensor(v)) throw UserError(what_ + ": expected a tensor, found " + v.describe());
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, ...)
  const at::Tensor flat = storage(*v.items[0]);
  const int64_t offset = v.items[1]->as_int();
  const std::vector<int64_t> size = int_tuple(*v.items[2]), stride = int_tuple(*v.items[3]);
  int64_t last = offset;
  for (size_t d = 0; d < size.size(); ++d) last += size[d] > 0 ? (size[d] - 1) * stride[d] : 0;
  if (last >= flat.numel() && flat.numel() > 0) throw UserError(what_ + ": a tensor reaches past its storage");
  const at::Tensor view = flat.as_strided(size, stride, offset);
  // The whole storage in order (a state dict's usual tensor) is returned as read; a view of part
  // of it is copied out, so the rest is not kept alive.
  return view.numel() == flat.numel() && view.is_contiguous() ? view : view.clone();
}

}  // namespace megatron
