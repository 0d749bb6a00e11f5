// The pickle reader (checkpoint/pickle.h) and torch.save reader (checkpoint/torch_save.h) on
// files Python itself writes: the values Megatron checkpoints hold, in protocols 2 and 5, and
// tensors of several dtypes, views among them.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>

#include "checkpoint/pickle.h"
#include "checkpoint/torch_save.h"
#include "core/errors.h"
#include "core/files.h"
#include "support/test_support.h"

namespace megatron {
namespace {

using pickle::Value;

void run_python(const std::string& script) {
  auto r = test::run_command(test::shell_quote(test::venv_python()) + " -c " + test::shell_quote(script));
  ASSERT_EQ(r.status, 0) << r.output;
}

TEST(Pickle, ReadsWhatPythonWrites) {
  test::TempDir dir;
  for (int protocol : {2, 5}) {
    const std::string path = dir / ("values" + std::to_string(protocol) + ".pkl");
    run_python("import argparse, collections, pickle\n"
               "ns = argparse.Namespace(num_layers=2, normalization='RMSNorm', swiglu=True, num_experts=None, lr=3e-4)\n"
               "shared = [1, 2]\n"
               "v = {'n': -5, 'big': 2**40, 'neg_big': -2**40, 'byte': 200, 'f': 1.5, 's': 'héllo', 'b': b'\\x00\\xff',\n"
               "     'none': None, 't': (1, 2, 3), 'l': [True, False], 'od': collections.OrderedDict([('x', 1), ('y', 2)]),\n"
               "     'ns': ns, 'shared1': shared, 'shared2': shared, 'set': {7}}\n"
               "open('" + path + "', 'wb').write(pickle.dumps(v, protocol=" + std::to_string(protocol) + "))\n");
    const pickle::ValuePtr v = pickle::parse(read_file(path));
    SCOPED_TRACE("protocol " + std::to_string(protocol));
    ASSERT_EQ(v->kind, Value::Kind::Dict);
    EXPECT_EQ(v->at("n").as_int(), -5);
    EXPECT_EQ(v->at("big").as_int(), int64_t(1) << 40);
    EXPECT_EQ(v->at("neg_big").as_int(), -(int64_t(1) << 40));
    EXPECT_EQ(v->at("byte").as_int(), 200);
    EXPECT_EQ(v->at("f").as_number(), 1.5);
    EXPECT_EQ(v->at("s").text, "h\xc3\xa9llo");
    EXPECT_EQ(v->at("b").kind, Value::Kind::Bytes);
    EXPECT_EQ(v->at("b").text, std::string("\x00\xff", 2));
    EXPECT_EQ(v->at("none").kind, Value::Kind::None);
    ASSERT_EQ(v->at("t").items.size(), 3u);
    EXPECT_EQ(v->at("t").items[2]->as_int(), 3);
    EXPECT_EQ(v->at("l").items[0]->as_int(), 1);
    EXPECT_EQ(v->at("od").at("y").as_int(), 2);
    const Value& ns = v->at("ns");
    EXPECT_TRUE(ns.is_object_of("argparse", "Namespace")) << ns.describe();
    EXPECT_EQ(ns.at("num_layers").as_int(), 2);
    EXPECT_EQ(ns.at("normalization").text, "RMSNorm");
    EXPECT_EQ(ns.at("swiglu").as_int(), 1);
    EXPECT_EQ(ns.at("num_experts").kind, Value::Kind::None);
    EXPECT_EQ(ns.at("lr").as_number(), 3e-4);
    EXPECT_EQ(v->at("shared2").items.size(), 2u) << "a memoised object recalled";
    EXPECT_EQ(v->at("set").items.at(0)->as_int(), 7);
    EXPECT_EQ(v->get("absent"), nullptr);
  }
  EXPECT_THROW(pickle::parse(std::string("\x80\x02}q\x00", 5)), std::runtime_error) << "truncated";
  try {
    pickle::parse("\x80\x02\xff.");
    ADD_FAILURE() << "an unknown opcode was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("opcode 0xff at byte 2"), std::string::npos) << e.what();
  }
}

TEST(TorchSave, TensorsComeBackWithTheirDtypesAndViews) {
  test::TempDir dir;
  const std::string path = dir / "saved.pt";
  run_python("import torch, argparse\n"
             "base = torch.arange(12, dtype=torch.float32).reshape(3, 4)\n"
             "torch.save({'w': base, 'col': base[:, 1], 'bf16': torch.tensor([1.5, -2.0], dtype=torch.bfloat16),\n"
             "            'ids': torch.tensor([[1, 2], [3, 4]]), 'args': argparse.Namespace(hidden_size=64),\n"
             "            'extra': None, 'iteration': 7}, '" + path + "')\n");
  TorchSaveFile f(path);
  EXPECT_EQ(f.root().at("iteration").as_int(), 7);
  EXPECT_EQ(f.root().at("args").at("hidden_size").as_int(), 64);
  const at::Tensor w = f.tensor(f.root().at("w"));
  EXPECT_TRUE(at::equal(w, at::arange(12, at::kFloat).reshape({3, 4})));
  EXPECT_TRUE(at::equal(f.tensor(f.root().at("col")), at::tensor({1.0f, 5.0f, 9.0f}))) << "a strided view of a shared storage";
  const at::Tensor bf16 = f.tensor(f.root().at("bf16"));
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(bf16, at::tensor({1.5, -2.0}).to(at::kBFloat16)));
  const at::Tensor ids = f.tensor(f.root().at("ids"));
  EXPECT_EQ(ids.scalar_type(), at::kLong);
  EXPECT_EQ(ids[1][0].item<int64_t>(), 3);
  EXPECT_FALSE(TorchSaveFile::is_tensor(f.root().at("extra")));
  EXPECT_THROW(f.tensor(f.root().at("extra")), UserError);

  std::ofstream(dir / "not_a_zip.pt") << "hello";
  try {
    TorchSaveFile bad(dir / "not_a_zip.pt");
    ADD_FAILURE() << "read a file that is no zip";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(dir / "not_a_zip.pt"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron
