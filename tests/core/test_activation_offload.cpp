// --cpu-offloading moves saved activations, never changes what is computed: the saved tensors of
// an autograd graph come back as the same values, views and strides (q, k and v of one buffer
// copied once), parameters and small tensors stay; a model's training step with the first layers
// offloaded gives the loss and every gradient bit for bit (dense and MoE layers, with and without
// dropout); `megatron train` with the flags trains bit for bit, reports what moved, and refuses
// Megatron's conflicts naming the flags. On CUDA the device memory left after the forward drops by
// the offloaded layers' activations, with the same results.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>

#include "core/activation_offload.h"
#include "core/errors.h"
#include "core/memory.h"
#include "model/gpt_model.h"
#include "support/model_configs.h"
#include "support/test_support.h"
#include "train/arguments.h"

namespace megatron {
namespace {

// y = sum(q * k^T-ish products) over three views of one buffer, a transposed view and a parameter:
// the graph saves all of them.
at::Tensor small_graph(const at::Tensor& buffer, const at::Tensor& weight) {
  const at::Tensor q = buffer.narrow(1, 0, 8), k = buffer.narrow(1, 8, 8), v = buffer.narrow(1, 16, 8);  // [6, 8] views
  const at::Tensor scores = at::mm(q, k.t());                        // saves q and k^T
  const at::Tensor mixed = at::mm(at::sigmoid(scores), v);           // saves the sigmoid output and v
  return (at::mm(mixed, weight) * mixed).sum();                      // saves mixed and the parameter
}

TEST(ActivationOffload, SavedTensorsComeBackAsTheyWere) {
  at::manual_seed(0);
  const at::Tensor weight = at::randn({8, 8}).requires_grad_();
  const at::Tensor input = at::randn({6, 24}).requires_grad_();
  auto run = [&](ActivationOffloader* offloader) {
    if (weight.grad().defined()) weight.mutable_grad().zero_();
    if (input.grad().defined()) input.mutable_grad().zero_();
    const at::Tensor buffer = input * 2;  // a non-leaf whose views the graph saves
    at::Tensor loss;
    {
      ActivationOffloader::Scope scope = offloader ? offloader->scope(0) : ActivationOffloader::Scope();
      loss = small_graph(buffer, weight);
    }
    if (offloader) {
      offloader->after_layer(0, loss);
      offloader->finish_forward();
    }
    loss.backward();
    return std::make_tuple(loss.detach().clone(), weight.grad().clone(), input.grad().clone());
  };
  const auto [plain_loss, plain_w, plain_x] = run(nullptr);
  ActivationOffloader offloader(/*num_layers=*/1, at::kCPU, /*min_elements=*/0);
  const auto [loss, w, x] = run(&offloader);
  EXPECT_TRUE(at::equal(loss, plain_loss));
  EXPECT_TRUE(at::equal(w, plain_w));
  EXPECT_TRUE(at::equal(x, plain_x));
  const ActivationOffloader::Counts n = offloader.last_forward();
  // q, k (through k^T), v of one buffer; the sigmoid output; mixed, and the product saved by the
  // elementwise multiply: more tensors than storages, the buffer counted once.
  EXPECT_GE(n.tensors, 5);
  EXPECT_LT(n.storages, n.tensors);
  EXPECT_GE(n.bytes, 6 * 24 * 4);

  // A threshold above every tensor here: nothing moves, and the results are the same.
  ActivationOffloader none(1, at::kCPU, /*min_elements=*/1000);
  const auto [loss2, w2, x2] = run(&none);
  EXPECT_TRUE(at::equal(w2, plain_w));
  EXPECT_EQ(none.last_forward().tensors, 0);
}

// Outside a scope (or for a layer past the offloaded ones) autograd saves tensors as always.
TEST(ActivationOffload, LayersPastTheOffloadedOnesAreUntouched) {
  ActivationOffloader offloader(2, at::kCPU, 0);
  EXPECT_TRUE(offloader.offloads(1));
  EXPECT_FALSE(offloader.offloads(2));
  const at::Tensor w = at::randn({4, 4}).requires_grad_();
  at::Tensor loss;
  {
    ActivationOffloader::Scope scope = offloader.scope(2);
    loss = (at::mm(at::randn({3, 4}), w).tanh()).sum();
  }
  offloader.after_layer(2, loss);
  offloader.finish_forward();
  loss.backward();
  EXPECT_EQ(offloader.last_forward().tensors, 0);
}

struct Step {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  int64_t offloaded_tensors = 0, offloaded_bytes = 0;
  int64_t device_bytes_after_forward = 0;
};

Step train_step(ModelConfig c, int offloaded_layers, at::Device device, at::ScalarType dtype = at::kFloat) {
  c.cpu_offloading = offloaded_layers > 0;
  c.cpu_offloading_num_layers = offloaded_layers;
  c.min_offloaded_tensor_size = device.is_cuda() ? c.min_offloaded_tensor_size : 0;
  GPTModel model(c);
  model.initialize(5);
  model.to(device, dtype);
  model.train();
  at::manual_seed(11);
  const at::Tensor text = at::randint(0, c.vocab_size, {2, c.seq_length + 1}).to(device);
  const Batch batch{text.narrow(1, 0, c.seq_length), text.narrow(1, 1, c.seq_length),
                    at::ones({2, c.seq_length}, text.options().dtype(at::kFloat))};
  Step r;
  for (int repeat = 0; repeat < 2; ++repeat) {  // the second step: caches made, the same numbers again
    for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
    at::manual_seed(3);  // the dropout masks
    r.loss = model.loss(batch);
    r.device_bytes_after_forward = allocated_bytes(device);
    r.loss.backward();
  }
  for (const auto& p : model.named_parameters()) r.grads[p.key()] = p.value().grad();
  if (const ActivationOffloader* o = model.activation_offloader()) {
    r.offloaded_tensors = o->last_forward().tensors;
    r.offloaded_bytes = o->last_forward().bytes;
  }
  return r;
}

void expect_same(const Step& a, const Step& b) {
  EXPECT_TRUE(at::equal(a.loss, b.loss)) << a.loss.item<double>() << " vs " << b.loss.item<double>();
  for (const auto& [name, g] : b.grads) {
    ASSERT_TRUE(g.defined() && a.grads.at(name).defined()) << name;
    EXPECT_TRUE(at::equal(a.grads.at(name), g)) << name;
  }
}

ModelConfig four_layers() {
  ModelConfig c = test::small_llama({32, 4, 2, 48, 16, 50});
  c.num_layers = 4;
  return c;
}

TEST(ActivationOffload, ModelStepEqualsKeepingActivations) {
  for (double dropout : {0.0, 0.1}) {
    SCOPED_TRACE("dropout " + std::to_string(dropout));
    ModelConfig c = four_layers();
    c.hidden_dropout = c.attention_dropout = dropout;
    const Step plain = train_step(c, 0, at::kCPU);
    const Step one = train_step(c, 1, at::kCPU), three = train_step(c, 3, at::kCPU);
    expect_same(one, plain);
    expect_same(three, plain);
    EXPECT_GT(one.offloaded_tensors, 5);
    // Three layers move more than one (the first layer's input is the embedding's, later ones
    // take the residual add fused with their norm, so the counts differ a little).
    EXPECT_GT(three.offloaded_tensors, 2 * one.offloaded_tensors);
    EXPECT_GT(three.offloaded_bytes, 2 * one.offloaded_bytes);
  }
}

TEST(ActivationOffload, MoeLayersStepEqualsKeepingActivations) {
  ModelConfig c = four_layers();
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 24;
  c.moe_layers = {0, 1, 1, 1};
  c.moe_shared_expert_intermediate_size = 16;
  c.moe_aux_loss_coeff = {0.01};
  const Step plain = train_step(c, 0, at::kCPU);
  const Step offloaded = train_step(c, 3, at::kCPU);
  expect_same(offloaded, plain);
  EXPECT_GT(offloaded.offloaded_tensors, 0);
}

// On the GPU (bf16, a shape whose activations pass the default 1M-element threshold): the same
// numbers, and after the forward the device holds less by at least half of what moved (the last
// offloaded layer's storages are dropped only after the next layer's forward; the layer outputs
// the next layers hold stay).
TEST(ActivationOffloadCuda, DeviceMemoryDropsAndResultsStayTheSame) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  ModelConfig c = test::small_llama({512, 8, 4, 1536, 2048, 1000});
  c.num_layers = 6;
  const at::Device gpu(at::kCUDA, 0);
  const Step plain = train_step(c, 0, gpu, at::kBFloat16);
  const Step offloaded = train_step(c, 4, gpu, at::kBFloat16);
  EXPECT_TRUE(at::equal(offloaded.loss, plain.loss));
  for (const auto& [name, g] : plain.grads) {
    // Attention's backward may sum in another order from run to run, which in bf16 moves a
    // gradient by up to ~2e-5 of its largest value here; a wrongly restored activation would be
    // off by the order of the values themselves.
    const double scale = std::max(g.abs().max().item<double>(), 1e-12);
    EXPECT_LE((offloaded.grads.at(name) - g).abs().max().item<double>() / scale, 1e-4) << name;
  }
  ASSERT_GT(offloaded.offloaded_bytes, 0);
  EXPECT_LE(offloaded.device_bytes_after_forward, plain.device_bytes_after_forward - offloaded.offloaded_bytes / 2)
      << "moved " << offloaded.offloaded_bytes << " bytes; after the forward " << offloaded.device_bytes_after_forward
      << " vs " << plain.device_bytes_after_forward;
}

std::vector<std::string> tiny(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--eval-interval", "0", "--log-interval", "1", "--hidden-dropout", "0.1",
                               "--num-layers", "3", "--train-iters", "4", "--lr-warmup-iters", "1"});
  return test::tiny_cpu_train(extra);
}

TEST(ActivationOffloadTraining, TrainsBitForBitAndRefusesMegatronsConflicts) {
  test::TempDir dir;
  auto metrics = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--metrics-jsonl", dir / (name + ".jsonl")});
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_EQ(r.status, 0) << r.output;
    return std::make_pair(test::file_lines(dir / (name + ".jsonl")), r.output);
  };
  const auto [kept, kept_log] = metrics("kept", {});
  ASSERT_EQ(kept.size(), 4u);
  const auto [moved, moved_log] = metrics("moved", {"--cpu-offloading-num-layers", "2", "--min-offloaded-tensor-size", "0"});
  EXPECT_EQ(moved, kept);
  EXPECT_NE(moved_log.find("activation offload: the saved activations of layers 0-1"), std::string::npos) << moved_log;
  EXPECT_NE(moved_log.find("activations offloaded to host memory per micro-batch"), std::string::npos) << moved_log;

  auto error = [](std::vector<std::string> extra) {
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_NE(r.status, 0);
    return r.output;
  };
  EXPECT_NE(error({"--cpu-offloading"}).find("--cpu-offloading needs --cpu-offloading-num-layers between 1 and --num-layers - 1 = 2"),
            std::string::npos);
  EXPECT_NE(error({"--cpu-offloading-num-layers", "3"}).find("(got 3)"), std::string::npos);
  EXPECT_NE(error({"--cpu-offloading-num-layers", "1", "--recompute-activations"}).find("--cpu-offloading does not work with --recompute"),
            std::string::npos);
}

// Pipeline parallelism needs more than one process: the layout check on its own, for two ranks.
TEST(ActivationOffloadTraining, PipelineParallelismIsRefused) {
  Config c;
  c.model = four_layers();
  c.model.group_query_attention = true;
  c.model.cpu_offloading_num_layers = 1;
  c.parallel.pipeline_model_parallel_size = 2;
  c.train.micro_batch_size = 1;
  c.train.train_iters = 1;
  c.data.mock_data = true;
  try {
    finalize_config(c, /*world_size=*/2);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--cpu-offloading does not work with --pipeline-model-parallel-size"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace megatron
