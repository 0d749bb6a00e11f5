// Flags and recipes: Megatron names parse into the config, recipes and flags combine with flags
// winning, and every kind of bad input is a UserError that names the flag or file:line.
#include <gtest/gtest.h>

#include <fstream>

#include "train/arguments.h"
#include "core/errors.h"
#include "pipeline/layout.h"
#include "support/test_support.h"

namespace megatron {
namespace {

std::vector<std::string> base_flags() {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3", "--mock-data", "--vocab-size", "100"};
}

Config parse(std::vector<std::string> extra, int world = 1) {
  auto args = base_flags();
  args.insert(args.end(), extra.begin(), extra.end());
  Config c = parse_train_arguments(args);
  finalize_config(c, world);
  return c;
}

// The error message of parsing `extra`, which must fail.
std::string error_of(std::vector<std::string> extra, int world = 1) {
  try {
    parse(extra, world);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

TEST(Arguments, MegatronFlagsAndDerivedValues) {
  Config c = parse({"--swiglu", "--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear",
                    "--normalization", "RMSNorm", "--global-batch-size", "8", "--lr-decay-style", "cosine"});
  EXPECT_EQ(c.model.kv_channels, 16);
  EXPECT_EQ(c.model.ffn_hidden_size, 192);  // 4h * 2/3 = 170.7 -> rounded up to 64s
  EXPECT_EQ(c.model.num_query_groups, 2);
  EXPECT_FALSE(c.model.add_bias_linear);
  EXPECT_EQ(c.model.padded_vocab_size, 128);  // 100 + EOD, padded to 128
  EXPECT_EQ(c.model.max_position_embeddings, 32);
  EXPECT_EQ(c.train.lr_decay_iters, 10);
  EXPECT_EQ(c.train.global_batch_size, 8);
  Config d = parse({});
  EXPECT_EQ(d.model.num_query_groups, 4);
  EXPECT_EQ(d.train.global_batch_size, 2);
  EXPECT_DOUBLE_EQ(d.model.hidden_dropout, 0.1);  // Megatron's default
}

TEST(Arguments, RecipeThenFlagsOverride) {
  test::TempDir dir;
  std::ofstream(dir / "r.yaml") << "model-family: qwen3\nnum_layers: 7\nhidden-size: 64\nlr: 2.0e-4\ndata-path: [a, b]\n";
  Config c = parse_train_arguments({"--config", dir / "r.yaml", "--num-layers", "3"});
  EXPECT_EQ(c.model.num_layers, 3);  // the flag wins
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_DOUBLE_EQ(c.train.lr, 2e-4);
  EXPECT_TRUE(c.model.qk_layernorm);  // from the family preset
  EXPECT_EQ(c.data.data_path, (std::vector<std::string>{"a", "b"}));
}

TEST(Arguments, UnknownFlagIsNamedWithSuggestion) {
  const std::string e = error_of({"--num-layer", "2"});
  EXPECT_NE(e.find("unknown flag --num-layer"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean --num-layers"), std::string::npos) << e;
}

TEST(Arguments, WrongTypesAreNamed) {
  EXPECT_NE(error_of({"--hidden-size", "big"}).find("--hidden-size: expected an integer, got 'big'"), std::string::npos);
  EXPECT_NE(error_of({"--lr", "fast"}).find("--lr: expected a number"), std::string::npos);
  EXPECT_NE(error_of({"--num-layers", "1", "2"}).find("--num-layers: expects exactly one value"), std::string::npos);
}

TEST(Arguments, ContradictionsAreNamed) {
  EXPECT_NE(error_of({"--hidden-size", "66"}).find("--hidden-size 66 is not divisible by --num-attention-heads 4"),
            std::string::npos);
  EXPECT_NE(error_of({"--global-batch-size", "5"}).find("--global-batch-size 5 is not divisible by --micro-batch-size 2"),
            std::string::npos);
  EXPECT_NE(error_of({"--group-query-attention", "--num-query-groups", "3"}).find("not divisible by --num-query-groups 3"),
            std::string::npos);
  EXPECT_NE(error_of({"--data-path", "x"}).find("three sources of data: pass one of them (given: --mock-data, --data-path)"),
            std::string::npos);
  EXPECT_NE(error_of({"--min-lr", "1"}).find("--min-lr"), std::string::npos);
  EXPECT_NE(error_of({"--tensor-model-parallel-size", "2"}).find("world size 1 is not divisible"), std::string::npos);
  EXPECT_NE(error_of({"--lr-decay-style", "step"}).find("--lr-decay-style must be"), std::string::npos);
  EXPECT_NE(error_of({"--position-embedding-type", "learned_absolute", "--max-position-embeddings", "16"})
                .find("--seq-length 32 exceeds --max-position-embeddings 16"),
            std::string::npos);
}

// The fusions that compute what the unfused path does up to rounding are on by default (off in
// Megatron for these three); Megatron's flags that ask for them are accepted, the --no- forms
// turn them off, and a recipe may say either.
TEST(Arguments, FastFusionsAreOnByDefaultWithNoForms) {
  const Config defaults = parse({});
  EXPECT_TRUE(defaults.model.cross_entropy_loss_fusion);
  EXPECT_TRUE(defaults.model.moe_grouped_gemm);
  EXPECT_TRUE(defaults.model.moe_permute_fusion);
  const Config asked = parse({"--cross-entropy-loss-fusion", "--moe-grouped-gemm", "--moe-permute-fusion"});
  EXPECT_TRUE(asked.model.cross_entropy_loss_fusion && asked.model.moe_grouped_gemm && asked.model.moe_permute_fusion);
  const Config off = parse({"--no-cross-entropy-loss-fusion", "--no-moe-grouped-gemm", "--no-moe-permute-fusion"});
  EXPECT_FALSE(off.model.cross_entropy_loss_fusion);
  EXPECT_FALSE(off.model.moe_grouped_gemm);
  EXPECT_FALSE(off.model.moe_permute_fusion);
}

// --cuda-graph-impl local (or Megatron's older --enable-cuda-graph) with the one scope that is
// implemented; every other choice is named in the error.
TEST(Arguments, CudaGraphFlags) {
  EXPECT_EQ(parse({}).train.cuda_graph_impl, "none");
  EXPECT_EQ(parse({"--enable-cuda-graph"}).train.cuda_graph_impl, "local");
  const Config c = parse({"--cuda-graph-impl", "local", "--cuda-graph-warmup-steps", "2"});
  EXPECT_EQ(c.train.cuda_graph_scope, "full_iteration");
  EXPECT_EQ(c.train.cuda_graph_warmup_steps, 2);
  EXPECT_NE(error_of({"--cuda-graph-impl", "transformer_engine"}).find("no Transformer Engine"), std::string::npos);
  EXPECT_NE(error_of({"--cuda-graph-impl", "graphs"}).find("--cuda-graph-impl must be none or local"), std::string::npos);
  EXPECT_NE(error_of({"--enable-cuda-graph", "--cuda-graph-scope", "attn"}).find("only full_iteration"), std::string::npos);
  EXPECT_NE(error_of({"--enable-cuda-graph", "--cuda-graph-warmup-steps", "0"}).find("at least 1"), std::string::npos);
  EXPECT_NE(error_of({"--enable-cuda-graph", "--device", "cpu"}).find("needs a CUDA device"), std::string::npos);
}

// An MoE step is captured where one process routes with static shapes (dropless or padded to
// capacity, the grouped GEMM); each path that reads token counts on the host is named.
TEST(Arguments, CudaGraphWithExpertsNeedsTheHostFreeRoute) {
  const std::vector<std::string> moe = {"--enable-cuda-graph", "--swiglu", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = moe;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  EXPECT_EQ(parse(with({"--bf16", "--moe-grouped-gemm"})).train.cuda_graph_impl, "local");
  EXPECT_TRUE(parse(with({"--bf16", "--moe-grouped-gemm", "--moe-expert-capacity-factor", "1.5", "--moe-pad-expert-input-to-capacity"}))
                  .model.moe_pad_expert_input_to_capacity);
  EXPECT_EQ(parse(with({"--bf16"})).train.cuda_graph_impl, "local");  // the grouped GEMM by default
  EXPECT_NE(error_of(with({"--bf16", "--no-moe-grouped-gemm"})).find("drop --no-moe-grouped-gemm"), std::string::npos);
  EXPECT_NE(error_of(with({"--moe-grouped-gemm"})).find("add --bf16"), std::string::npos);
  EXPECT_NE(error_of(with({"--bf16", "--moe-grouped-gemm", "--moe-expert-capacity-factor", "1.5"}))
                .find("add --moe-pad-expert-input-to-capacity"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--moe-grouped-gemm", "--bf16", "--fp8-format", "hybrid"})).find("FP8 grouped GEMMs read the group sizes"), std::string::npos);
}

TEST(Arguments, GradReduceInBf16NeedsBf16) {
  EXPECT_TRUE(parse({"--bf16", "--grad-reduce-in-bf16"}).parallel.grad_reduce_in_bf16);
  EXPECT_NE(error_of({"--grad-reduce-in-bf16"}).find("--grad-reduce-in-bf16 needs --bf16"), std::string::npos);
}

// --recompute-*: Megatron's spellings and combinations; --recompute-activations is selective.
TEST(Arguments, RecomputeFlags) {
  const ModelConfig full = parse({"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}).model;
  EXPECT_EQ(full.recompute_granularity, "full");
  EXPECT_EQ(full.recompute_method, "uniform");
  EXPECT_EQ(full.recompute_num_layers, 1);
  EXPECT_EQ(parse({"--recompute-activations"}).model.recompute_granularity, "selective");
  EXPECT_EQ(parse({"--recompute-granularity", "selective"}).model.recompute_granularity, "selective");
  EXPECT_NE(error_of({"--recompute-granularity", "full"}).find("needs --recompute-method uniform or block"), std::string::npos);
  EXPECT_NE(error_of({"--recompute-granularity", "full", "--recompute-method", "blocks", "--recompute-num-layers", "1"})
                .find("(got 'blocks')"), std::string::npos);
  EXPECT_NE(error_of({"--recompute-granularity", "full", "--recompute-method", "block"}).find("--recompute-num-layers between 1"),
            std::string::npos);
  EXPECT_NE(error_of({"--recompute-granularity", "layer"}).find("must be full or selective"), std::string::npos);
  EXPECT_NE(error_of({"--recompute-method", "uniform"}).find("apply to --recompute-granularity full only"), std::string::npos);
  EXPECT_NE(error_of({"--recompute-activations", "--recompute-granularity", "full"}).find("keep one"), std::string::npos);
  EXPECT_NE(error_of({"--recompute-activations", "--enable-cuda-graph", "--attention-dropout", "0.1"}).find("cannot"),
            std::string::npos);
}

// Pipeline layouts: stages split the layers evenly unless told otherwise, virtual stages divide
// each stage's layers, and the interleaved schedule needs whole groups of micro-batches.
TEST(Arguments, PipelineLayouts) {
  const std::vector<std::string> four = {"--num-layers", "4"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), four.begin(), four.end());
    return extra;
  };
  Config c = parse(with({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                         "--global-batch-size", "8"}), 4);
  EXPECT_EQ(c.parallel.num_virtual_stages_per_pipeline_rank, 2);
  EXPECT_EQ(c.parallel.data_parallel_size, 2);
  // Chunk v of rank r is virtual stage v * pp + r.
  EXPECT_EQ(pipeline::chunk_layers(c.parallel, 4, 1, 0).first_layer, 1);
  EXPECT_EQ(pipeline::chunk_layers(c.parallel, 4, 0, 1).first_layer, 2);
  EXPECT_TRUE(pipeline::chunk_layers(c.parallel, 4, 1, 1).post_process);
  EXPECT_FALSE(pipeline::chunk_layers(c.parallel, 4, 1, 0).post_process);

  Config uneven = parse(with({"--pipeline-model-parallel-size", "3", "--decoder-first-pipeline-num-layers", "2"}), 3);
  EXPECT_EQ(pipeline::chunk_layers(uneven.parallel, 4, 0, 0).num_layers, 2);
  EXPECT_EQ(pipeline::chunk_layers(uneven.parallel, 4, 1, 0).first_layer, 2);
  EXPECT_EQ(pipeline::chunk_layers(uneven.parallel, 4, 2, 0).first_layer, 3);
  EXPECT_TRUE(pipeline::stage_holds("decoder.layers.3.mlp.linear_fc2.weight", uneven.parallel, uneven.model, 2));
  EXPECT_TRUE(pipeline::stage_holds("embedding.word_embeddings.weight", uneven.parallel, uneven.model, 2));  // tied copy

  // Uneven and interleaved: 6 layers, first stage 2, 2 chunks per rank -> virtual stages of
  // 1 (rank 0), 2 (rank 1), 1 (rank 0), 2 (rank 1) layers.
  const std::vector<std::string> six = {"--num-layers", "6", "--pipeline-model-parallel-size", "2",
                                        "--decoder-first-pipeline-num-layers", "2", "--global-batch-size", "4"};
  std::vector<std::string> interleaved = six;
  interleaved.insert(interleaved.end(), {"--num-virtual-stages-per-pipeline-rank", "2"});
  Config both = parse(interleaved, 2);
  const int expected[2][2][2] = {{{0, 1}, {3, 1}}, {{1, 2}, {4, 2}}};  // [rank][chunk] = {first layer, layers}
  for (int r = 0; r < 2; ++r) {
    for (int v = 0; v < 2; ++v) {
      const pipeline::ChunkLayers chunk = pipeline::chunk_layers(both.parallel, 6, r, v);
      EXPECT_EQ(chunk.first_layer, expected[r][v][0]) << "rank " << r << " chunk " << v;
      EXPECT_EQ(chunk.num_layers, expected[r][v][1]) << "rank " << r << " chunk " << v;
    }
  }
  EXPECT_TRUE(pipeline::stage_holds("decoder.layers.4.mlp.linear_fc2.weight", both.parallel, both.model, 1));
  EXPECT_FALSE(pipeline::stage_holds("decoder.layers.3.mlp.linear_fc2.weight", both.parallel, both.model, 1));
  std::vector<std::string> three_chunks = six;
  three_chunks.insert(three_chunks.end(), {"--num-virtual-stages-per-pipeline-rank", "4"});
  EXPECT_NE(error_of(three_chunks, 2).find("--decoder-first-pipeline-num-layers (2 layers) is not divisible by "
                                           "--num-virtual-stages-per-pipeline-rank 4"),
            std::string::npos);
  std::vector<std::string> per_stage = six;
  per_stage.insert(per_stage.end(), {"--num-layers-per-virtual-pipeline-stage", "1"});
  EXPECT_NE(error_of(per_stage, 2).find("stages differ in size"), std::string::npos);

  EXPECT_NE(error_of(with({"--pipeline-model-parallel-size", "3"}), 3).find("--num-layers 4 is not divisible by --pipeline-model-parallel-size 3"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "3"}), 2)
                .find("does not divide the 2 layers of each pipeline stage"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2",
                           "--global-batch-size", "6"}), 2)
                .find("needs the number of micro-batches (3"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--pipeline-model-parallel-size", "3", "--decoder-first-pipeline-num-layers", "3"}), 3)
                .find("leaves 1 layers, which do not split evenly"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--decoder-last-pipeline-num-layers", "1"})).find("need --pipeline-model-parallel-size > 1"),
            std::string::npos);
}

TEST(Arguments, MissingRequiredFlag) {
  try {
    Config c = parse_train_arguments({"--num-layers", "2"});
    finalize_config(c, 1);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--hidden-size is required"), std::string::npos) << e.what();
  }
}

TEST(Arguments, BadRecipesNameFileAndLine) {
  test::TempDir dir;
  std::ofstream(dir / "unknown.yaml") << "num-layers: 2\nhiden-size: 64\n";
  std::ofstream(dir / "type.yaml") << "num-layers: two\n";
  std::ofstream(dir / "broken.yaml") << "num-layers: [2\n";
  auto message = [](const std::string& path) {
    try {
      parse_train_arguments({"--config", path});
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string unknown = message(dir / "unknown.yaml");
  EXPECT_NE(unknown.find("unknown.yaml:2: key 'hiden-size' is not a known setting"), std::string::npos) << unknown;
  EXPECT_NE(message(dir / "type.yaml").find("type.yaml:1: key 'num-layers': expected an integer"), std::string::npos);
  EXPECT_NE(message(dir / "broken.yaml").find("invalid YAML"), std::string::npos);
  EXPECT_NE(message(dir / "missing.yaml").find("cannot read"), std::string::npos);
  EXPECT_THROW(parse_train_arguments({"--model-family", "gpt5"}), UserError);
}

TEST(Arguments, CommandLineReportsErrorsWithStatus2) {
  auto r = test::run_megatron({"train", "--bogus-flag", "1"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("error: unknown flag --bogus-flag"), std::string::npos) << r.output;
  auto help = test::run_megatron({"train", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("--tensor-model-parallel-size"), std::string::npos);
  // Grouped as Megatron's argument groups, with defaults, examples and the refused flags.
  for (const char* part : {"\nnetwork size:\n  --num-layers", "\ndistributed:\n  --tensor-model-parallel-size",
                           "\nlearning rate:\n  --lr ", "[default: LayerNorm]", "[default: 969, 30, 1]",
                           "megatron pretrain_gpt.py ARGS", "Megatron flags not implemented yet:"}) {
    EXPECT_NE(help.output.find(part), std::string::npos) << part << " not in\n" << help.output;
  }
  EXPECT_EQ(test::run_megatron({"nonsense"}).status, 2);
}

}  // namespace
}  // namespace megatron
