// SFT data: chat templates against transformers' apply_chat_template on the real Qwen3 and Llama 3
// tokenizers (ids and return_assistant_tokens_mask, tests/data/sft_reference.py); the loss mask
// on every assistant turn; OpenAI and ShareGPT lines and every kind of bad line; first-fit-
// decreasing packing; `megatron preprocess --sft` end to end through the real binary; and the
// packed-dataset reader (labels within a sample, positions, cu_seqlens, validation).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "data/chat_template.h"
#include "data/indexed_dataset.h"
#include "data/sft_dataset.h"
#include "data/sft_packing.h"
#include "data/sft_preprocess.h"
#include "support/test_support.h"
#include "support/user_error.h"
#include "tokenizer/tokenizer_test_util.h"

namespace megatron {
namespace {

using Conversation = std::vector<ChatMessage>;

std::string qwen3_dir() { return tok_test::npm_dir() + "/tokenizer-qwen3/models"; }
std::string llama3_dir() { return tok_test::npm_dir() + "/tokenizer-llama3/models"; }

const Tokenizer& qwen3() {
  static const auto tok = make_tokenizer("HuggingFaceTokenizer", qwen3_dir(), "", "", 0);
  return *tok;
}
const Tokenizer& llama3() {
  static const auto tok = make_tokenizer("HuggingFaceTokenizer", llama3_dir(), "", "", 0);
  return *tok;
}

// Conversations that exercise the templates' corners: multi-turn, a system prompt, content
// starting with newlines (tokenized together with the header by HF), surrounding whitespace
// (Llama 3 trims it), non-ASCII text, an empty assistant turn, Qwen3 reasoning in the content,
// two assistant turns in a row after the last user message.
std::vector<Conversation> test_conversations() {
  return {
      {{"user", "Hi"}, {"assistant", "Hello! How can I help?"}},
      {{"system", "You are terse."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "And 3*3?"}, {"assistant", "9."}},
      {{"user", "Write a haiku"}, {"assistant", "\n\nLeaves fall\n  quietly\n"}},
      {{"user", "  spaced  "}, {"assistant", " \t answer with spaces \n"}},
      {{"user", "Übersetze: 東京は大きい 🚀"}, {"assistant", "Tokyo ist groß. 🚀"}},
      {{"user", "Say nothing"}, {"assistant", ""}},
      {{"user", "Think first"}, {"assistant", "<think>\nLet me see.\n</think>\n\nThe answer is 42."}},
      {{"user", "q1"}, {"assistant", "<think>r1</think>a1"}, {"user", "q2"}, {"assistant", "a2"}, {"assistant", "a3"}},
      {{"system", "sys"}, {"user", "code?"}, {"assistant", "```python\nprint('hi')\n```"}},
  };
}

struct Reference {
  std::vector<int64_t> ids;
  std::vector<int> mask;  // empty when the template has no generation marks
};

std::vector<Reference> run_reference(const std::string& tok_dir, const std::string& mode,
                                     const std::vector<Conversation>& convs) {
  test::TempDir dir;
  nlohmann::json in = nlohmann::json::array();
  for (const Conversation& c : convs) {
    nlohmann::json j = nlohmann::json::array();
    for (const ChatMessage& m : c) j.push_back({{"role", m.role}, {"content", m.content}});
    in.push_back(j);
  }
  std::ofstream(dir / "in.json") << in.dump();
  const std::string python = test::venv_python();
  EXPECT_FALSE(python.empty()) << "no project venv (transformers) for the reference";
  const test::CommandResult r = test::run_command(
      test::shell_quote(python) + " " + test::shell_quote(test::source_dir() + "/tests/data/sft_reference.py") + " " +
      test::shell_quote(tok_dir) + " " + mode + " " + test::shell_quote(dir / "in.json") + " " +
      test::shell_quote(dir / "out.json"));
  EXPECT_EQ(r.status, 0) << r.output;
  std::vector<Reference> refs;
  std::ifstream out(dir / "out.json");
  if (!out) return refs;
  for (const nlohmann::json& j : nlohmann::json::parse(out)) {
    Reference ref;
    ref.ids = j["ids"].get<std::vector<int64_t>>();
    if (!j["mask"].is_null()) ref.mask = j["mask"].get<std::vector<int>>();
    refs.push_back(std::move(ref));
  }
  return refs;
}

void expect_matches_reference(const ChatTemplate& chat, const std::vector<Conversation>& convs,
                              const std::vector<Reference>& refs) {
  ASSERT_EQ(refs.size(), convs.size());
  for (size_t c = 0; c < convs.size(); ++c) {
    const RenderedChat r = chat.render(convs[c]);
    EXPECT_EQ(r.ids, refs[c].ids) << chat_template_name(chat.kind()) << " conversation " << c;
    if (!refs[c].mask.empty()) {
      EXPECT_EQ(std::vector<int>(r.loss_mask.begin(), r.loss_mask.end()), refs[c].mask)
          << chat_template_name(chat.kind()) << " conversation " << c;
    }
  }
}

TEST(SftChatTemplate, ChatMLMatchesTransformersIdsAndAssistantMask) {
  const auto convs = test_conversations();
  expect_matches_reference(ChatTemplate(ChatTemplateKind::kChatML, qwen3()), convs,
                           run_reference(qwen3_dir(), "chatml", convs));
}

TEST(SftChatTemplate, Qwen3MatchesItsOwnTemplate) {
  const auto convs = test_conversations();
  const ChatTemplate chat(ChatTemplateKind::kQwen3, qwen3());
  expect_matches_reference(chat, convs, run_reference(qwen3_dir(), "qwen3", convs));
  // The mask: after each `<|im_start|>assistant\n`, everything through <|im_end|>.
  const int64_t start = *qwen3().token_to_id("<|im_start|>"), end = *qwen3().token_to_id("<|im_end|>");
  const std::vector<int64_t> head = qwen3().encode("assistant\n", false);
  for (const Conversation& conv : convs) {
    const RenderedChat r = chat.render(conv);
    std::vector<uint8_t> expected(r.ids.size(), 0);
    for (size_t i = 0; i + head.size() < r.ids.size(); ++i) {
      if (r.ids[i] != start || !std::equal(head.begin(), head.end(), r.ids.begin() + i + 1)) continue;
      for (size_t j = i + 1 + head.size(); j < r.ids.size(); ++j) {
        expected[j] = 1;
        if (r.ids[j] == end) break;
      }
    }
    EXPECT_EQ(r.loss_mask, expected);
  }
}

TEST(SftChatTemplate, Llama3MatchesTransformersIdsAndAssistantMask) {
  const auto convs = test_conversations();
  expect_matches_reference(ChatTemplate(ChatTemplateKind::kLlama3, llama3()), convs,
                           run_reference(llama3_dir(), "llama3", convs));
}

TEST(SftChatTemplate, AutoPicksFromSpecialTokensAndMissingTokensAreUserErrors) {
  EXPECT_EQ(resolve_chat_template("auto", qwen3()), ChatTemplateKind::kChatML);
  EXPECT_EQ(resolve_chat_template("auto", llama3()), ChatTemplateKind::kLlama3);
  EXPECT_EQ(resolve_chat_template("qwen3", qwen3()), ChatTemplateKind::kQwen3);
  EXPECT_THROW(resolve_chat_template("vicuna", qwen3()), UserError);
  EXPECT_THROW(ChatTemplate(ChatTemplateKind::kLlama3, qwen3()), UserError);
  EXPECT_THROW(ChatTemplate(ChatTemplateKind::kChatML, llama3()), UserError);
  const auto null_tok = make_tokenizer("NullTokenizer", "", "", "", 100);
  EXPECT_THROW(resolve_chat_template("auto", *null_tok), UserError);
}

// The trained tokens decode to exactly the assistant turns, each with its end token.
TEST(SftChatTemplate, LossMaskCoversEveryAssistantTurnAndNothingElse) {
  const Conversation conv = {{"system", "S"}, {"user", "first question"}, {"assistant", "first answer"},
                             {"user", "second question"}, {"assistant", "second answer"}};
  for (const auto& [kind, tok, end] :
       {std::make_tuple(ChatTemplateKind::kChatML, &qwen3(), std::string("<|im_end|>")),
        std::make_tuple(ChatTemplateKind::kLlama3, &llama3(), std::string("<|eot_id|>"))}) {
    const RenderedChat r = ChatTemplate(kind, *tok).render(conv);
    ASSERT_EQ(r.ids.size(), r.loss_mask.size());
    std::vector<std::string> spans;
    std::vector<int64_t> span;
    for (size_t i = 0; i <= r.ids.size(); ++i) {
      if (i < r.ids.size() && r.loss_mask[i]) {
        span.push_back(r.ids[i]);
      } else if (!span.empty()) {
        spans.push_back(tok->decode(span));
        span.clear();
      }
    }
    EXPECT_EQ(spans, (std::vector<std::string>{"first answer" + end, "second answer" + end}))
        << chat_template_name(kind);
  }
}

TEST(SftFormats, OpenAIAndShareGPTGiveTheSameConversation) {
  std::vector<ChatMessage> a, b, c;
  EXPECT_EQ(parse_sft_line(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                               {"role": "assistant", "content": "A"}], "id": 7})", &a), "");
  EXPECT_EQ(parse_sft_line(R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "U"},
                               {"from": "gpt", "value": "A"}]})", &b), "");
  EXPECT_EQ(parse_sft_line(R"({"system": "S", "conversations": [{"from": "human", "value": "U"},
                               {"from": "gpt", "value": "A"}]})", &c), "");
  ASSERT_EQ(a.size(), 3u);
  for (const auto* other : {&b, &c}) {
    ASSERT_EQ(other->size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ((*other)[i].role, a[i].role);
      EXPECT_EQ((*other)[i].content, a[i].content);
    }
  }
}

// Each bad line and a piece of the reason reported for it.
const std::vector<std::pair<std::string, std::string>>& bad_lines() {
  static const std::vector<std::pair<std::string, std::string>> lines = {
      {R"({"text": "plain pretraining text"})", "no \"messages\""},
      {R"({"messages": []})", "empty conversation"},
      {R"({"messages": [{"role": "user", "content": "only a question"}]})", "no assistant turn"},
      {R"({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]})", "role \"robot\""},
      {R"({"messages": [{"role": "user", "content": ["a", "list"]}, {"role": "assistant", "content": "y"}]})",
       "\"content\" is a list"},
      {R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": null}]})",
       "\"content\" is null"},
      {R"({"messages": [{"content": "q"}]})", "\"role\" is missing"},
      {R"({"conversations": [{"from": "bot", "value": "q"}]})", "expected human, gpt or system"},
      {R"({"messages": "hello"})", "expected a list"},
      {R"({"messages": [)", "invalid JSON"},
      {R"(["not", "an", "object"])", "not a JSON object"},
  };
  return lines;
}

TEST(SftFormats, BadLinesAreRejectedWithAReason) {
  for (const auto& [line, reason] : bad_lines()) {
    std::vector<ChatMessage> messages;
    const std::string why = parse_sft_line(line, &messages);
    EXPECT_NE(why.find(reason), std::string::npos) << line << " -> '" << why << "'";
  }
}

TEST(SftPacking, FirstFitDecreasingSmallExample) {
  const auto bins = pack_first_fit_decreasing({6, 5, 4, 3, 2}, 10);
  EXPECT_EQ(bins, (std::vector<std::vector<uint32_t>>{{0, 2}, {1, 3, 4}}));
  EXPECT_THROW(pack_first_fit_decreasing({11}, 10), std::invalid_argument);
  EXPECT_TRUE(pack_first_fit_decreasing({}, 10).empty());
}

TEST(SftPacking, EverySampleOnceBinsWithinCapacityAndTight) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t capacity = 64 + static_cast<int64_t>(rng() % 1000);
    std::vector<int64_t> lengths(1 + rng() % 3000);
    int64_t total = 0;
    for (int64_t& l : lengths) total += l = 1 + static_cast<int64_t>(rng() % capacity);
    const auto bins = pack_first_fit_decreasing(lengths, capacity);
    std::vector<int> seen(lengths.size(), 0);
    for (const auto& bin : bins) {
      ASSERT_FALSE(bin.empty());
      int64_t used = 0;
      for (uint32_t s : bin) used += lengths[s], ++seen[s];
      EXPECT_LE(used, capacity);
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    const int64_t lower = (total + capacity - 1) / capacity;  // FFD <= 11/9 OPT + 6/9
    EXPECT_LE(static_cast<int64_t>(bins.size()) * 9, lower * 11 + 6) << "trial " << trial;
  }
}

// Writes a pack dataset by hand: each pack a list of samples of (token, mask) pairs.
void write_packs(const std::string& prefix, const std::vector<std::vector<std::vector<std::pair<int, int>>>>& packs) {
  IndexedDatasetBuilder ids(sft_input_ids_prefix(prefix), TokenDType::kUInt16);
  IndexedDatasetBuilder mask(sft_loss_mask_prefix(prefix), TokenDType::kUInt8);
  for (const auto& pack : packs) {
    for (const auto& sample : pack) {
      std::vector<int64_t> t, m;
      for (auto [tok, on] : sample) t.push_back(tok), m.push_back(on);
      ids.add_sequence(t.data(), t.size());
      mask.add_sequence(m.data(), m.size());
    }
    ids.end_document();
    mask.end_document();
  }
  ids.finalize();
  mask.finalize();
}

TEST(SftDataset, LabelsStayInsideSamplesPositionsRestartBoundariesIncludePadding) {
  test::TempDir dir;
  const std::string prefix = dir / "sft";
  write_packs(prefix, {{{{10, 0}, {11, 1}, {12, 1}}, {{20, 0}, {21, 0}, {22, 1}, {23, 1}}},
                       {{{30, 0}, {31, 1}, {32, 1}, {33, 1}, {34, 1}}, {{40, 0}, {41, 1}, {42, 1}, {43, 1}}}});
  const SftDataset data(prefix, 8, 99);
  ASSERT_EQ(data.size(), 2u);
  const LtorSample a = data.get(0);  // 7 tokens: one pad
  EXPECT_EQ(a.tokens, (std::vector<int64_t>{10, 11, 12, 20, 21, 22, 23, 99}));
  EXPECT_EQ(a.labels, (std::vector<int64_t>{11, 12, 99, 21, 22, 23, 99, 99}));
  EXPECT_EQ(a.loss_mask, (std::vector<float>{1, 1, 0, 0, 1, 1, 0, 0}));
  EXPECT_EQ(a.position_ids, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(a.cu_seqlens, (std::vector<int32_t>{0, 3, 7, 8}));
  const LtorSample b = data.get(1);  // 9 tokens = seq_length + 1: the last one is only a label
  EXPECT_EQ(b.tokens, (std::vector<int64_t>{30, 31, 32, 33, 34, 40, 41, 42}));
  EXPECT_EQ(b.labels, (std::vector<int64_t>{31, 32, 33, 34, 99, 41, 42, 43}));
  EXPECT_EQ(b.loss_mask, (std::vector<float>{1, 1, 1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(b.position_ids, (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 5, 8}));
  EXPECT_TRUE(ltor_attention_masked(b.cu_seqlens, 5, 4));
  EXPECT_FALSE(ltor_attention_masked(b.cu_seqlens, 7, 5));
  EXPECT_THROW(data.get(2), std::out_of_range);
  // Packs longer than seq_length + 1, and a missing loss mask, fail at open.
  EXPECT_THROW(SftDataset(prefix, 7, 99), UserError);
  EXPECT_THROW(SftDataset(dir / "nothing", 8, 99), UserError);
}

// The two datasets of a packed SFT pair checked against each other when opened (issue #26:
// crafted files for each check), each an error naming both prefixes: a loss mask stored as
// anything but uint8, a mask with a sample more, a sample whose lengths differ, a pack that
// ends elsewhere in the mask, token ids stored as floats.
TEST(SftDataset, MismatchedPairsAreErrorsNamingTheFiles) {
  test::TempDir dir;
  const auto write = [&](const std::string& prefix, TokenDType ids_dtype, TokenDType mask_dtype,
                         const std::vector<std::vector<int64_t>>& id_packs, const std::vector<std::vector<int64_t>>& mask_packs,
                         bool mask_splits_first_pack = false) {
    IndexedDatasetBuilder ids(sft_input_ids_prefix(prefix), ids_dtype), mask(sft_loss_mask_prefix(prefix), mask_dtype);
    for (const auto& pack : id_packs) {
      ids.add_sequence(pack.data(), pack.size());
      ids.end_document();
    }
    for (size_t p = 0; p < mask_packs.size(); ++p) {
      mask.add_sequence(mask_packs[p].data(), mask_packs[p].size());
      if (!(mask_splits_first_pack && p == 0)) mask.end_document();
    }
    ids.finalize();
    mask.finalize();
    return prefix;
  };
  const auto error = [&](const std::string& prefix) { return test::user_error_of([&] { SftDataset(prefix, 8, 0); }); };
  const std::string good = write(dir / "good", TokenDType::kUInt16, TokenDType::kUInt8, {{1, 2, 3}, {4, 5}}, {{0, 1, 1}, {1, 1}});
  EXPECT_EQ(error(good), "");
  std::vector<std::pair<std::string, std::string>> cases = {
      {write(dir / "mask_int32", TokenDType::kUInt16, TokenDType::kInt32, {{1, 2, 3}}, {{0, 1, 1}}), "loss mask is not uint8"},
      {write(dir / "extra", TokenDType::kUInt16, TokenDType::kUInt8, {{1, 2, 3}}, {{0, 1, 1}, {1}}), "disagree on the number of samples"},
      {write(dir / "lengths", TokenDType::kUInt16, TokenDType::kUInt8, {{1, 2, 3}, {4, 5}}, {{0, 1}, {1, 1, 1}}), "sample 0 has different lengths"},
      {write(dir / "packs", TokenDType::kUInt16, TokenDType::kUInt8, {{1, 2}, {3, 4}}, {{0, 1}, {1, 1}}, true), "disagree on the number"},
  };
  // Token ids stored as float32: int32 ids with the .idx dtype code (byte 17) edited to float32's
  // (same item size, so every offset stays valid).
  const std::string floats = write(dir / "float", TokenDType::kInt32, TokenDType::kUInt8, {{1, 2, 3}}, {{0, 1, 1}});
  {
    std::fstream idx(sft_input_ids_prefix(floats) + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    idx.seekp(17);
    idx.put(char(TokenDType::kFloat32));
  }
  cases.emplace_back(floats, "dtype is float32, but token datasets must hold integers");
  for (const auto& [prefix, message] : cases) {
    const std::string got = error(prefix);
    EXPECT_NE(got.find(message), std::string::npos) << prefix << ": " << got;
    EXPECT_NE(got.find(prefix), std::string::npos) << got;
  }
}

std::string chat_line(const Conversation& conv, bool sharegpt) {
  nlohmann::json list = nlohmann::json::array();
  for (const ChatMessage& m : conv) {
    if (sharegpt) {
      const std::string from = m.role == "user" ? "human" : m.role == "assistant" ? "gpt" : m.role;
      list.push_back({{"from", from}, {"value", m.content}});
    } else {
      list.push_back({{"role", m.role}, {"content", m.content}});
    }
  }
  return nlohmann::json{{sharegpt ? "conversations" : "messages", list}}.dump();
}

std::vector<std::string> qwen3_flags() {
  return {"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", qwen3_dir()};
}

test::CommandResult preprocess_sft_cli(std::vector<std::string> args) {
  std::vector<std::string> all = {"preprocess", "--sft", "--workers", "2", "--log-interval", "0"};
  all.insert(all.end(), args.begin(), args.end());
  for (const std::string& f : qwen3_flags()) all.push_back(f);
  return test::run_megatron(all);
}

// The binary's packs hold exactly the rendered conversations (whole, or cut to seq_length + 1),
// each once, and the reader turns them into consistent training samples.
TEST(SftPreprocess, EndToEndPacksEveryConversationIntact) {
  test::TempDir dir;
  std::vector<Conversation> convs;
  const auto base = test_conversations();
  for (int rep = 0; rep < 6; ++rep) convs.insert(convs.end(), base.begin(), base.end());
  std::string long_answer;
  for (int i = 0; i < 60; ++i) long_answer += "word" + std::to_string(i) + " ";
  convs.push_back({{"user", "long please"}, {"assistant", long_answer}});
  {
    std::ofstream out(dir / "chat.jsonl");
    for (size_t i = 0; i < convs.size(); ++i) out << chat_line(convs[i], i % 2 == 1) << "\n";
  }
  const int64_t seq = 64;
  const test::CommandResult r = preprocess_sft_cli({"--input", dir / "chat.jsonl", "--output-prefix", dir / "out/sft",
                                                    "--seq-length", std::to_string(seq), "--chat-template", "chatml"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("1 truncated"), std::string::npos) << r.output;

  // Expected samples, as a multiset of (ids, mask).
  const ChatTemplate chat(ChatTemplateKind::kChatML, qwen3());
  std::map<std::pair<std::vector<int64_t>, std::vector<uint8_t>>, int> expected;
  for (const Conversation& c : convs) {
    RenderedChat rc = chat.render(c);
    if (static_cast<int64_t>(rc.ids.size()) > seq + 1) rc.ids.resize(seq + 1), rc.loss_mask.resize(seq + 1);
    ++expected[{rc.ids, rc.loss_mask}];
  }
  const SftDataset data(dir / "out/sft", seq, 151643);
  size_t samples = 0;
  for (size_t p = 0; p < data.size(); ++p) {
    std::vector<int64_t> text, lengths;
    std::vector<uint8_t> mask;
    data.read_pack(p, &text, &mask, &lengths);
    const LtorSample s = data.get(p);
    ASSERT_EQ(s.tokens.size(), static_cast<size_t>(seq));
    int64_t at = 0;
    for (int64_t len : lengths) {
      const std::vector<int64_t> ids(text.begin() + at, text.begin() + at + len);
      const std::vector<uint8_t> m(mask.begin() + at, mask.begin() + at + len);
      EXPECT_GE(--expected[std::make_pair(ids, m)], 0) << "pack " << p << " holds a sample not rendered (or twice)";
      for (int64_t j = at; j < std::min(at + len, seq); ++j) {
        EXPECT_EQ(s.position_ids[j], j - at);
        const bool last = j + 1 == at + len;
        EXPECT_EQ(s.loss_mask[j], last ? 0.0f : static_cast<float>(mask[j + 1])) << "pack " << p << " pos " << j;
        EXPECT_EQ(s.labels[j], last ? 151643 : text[j + 1]);
      }
      at += len;
      ++samples;
    }
    EXPECT_EQ(s.cu_seqlens.back(), seq);
  }
  EXPECT_EQ(samples, convs.size());
  for (const auto& [key, n] : expected) EXPECT_EQ(n, 0);
  const nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir / "out/sft_sft.json"));
  EXPECT_EQ(meta["samples"], convs.size());
  EXPECT_EQ(meta["packs"], data.size());
  EXPECT_EQ(meta["chat_template"], "chatml");
  // Nothing but the outputs is left in the directory (the scratch datasets are gone).
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "out")) ++files, (void)e;
  EXPECT_EQ(files, 5u);

  const test::CommandResult dropped = preprocess_sft_cli({"--input", dir / "chat.jsonl", "--output-prefix",
                                                          dir / "drop/sft", "--seq-length", std::to_string(seq),
                                                          "--drop-long-samples"});
  ASSERT_EQ(dropped.status, 0) << dropped.output;
  EXPECT_NE(dropped.output.find("1 dropped (--drop-long-samples)"), std::string::npos) << dropped.output;
  EXPECT_EQ(SftDataset(dir / "drop/sft", seq, 0).size() > 0, true);
}

TEST(SftPreprocess, BadLinesNameFileAndLineOrAreSkipped) {
  test::TempDir dir;
  const std::string good = chat_line({{"user", "q"}, {"assistant", "a"}}, false);
  for (size_t b = 0; b < bad_lines().size(); ++b) {
    const std::string input = dir / ("bad" + std::to_string(b) + ".jsonl");
    std::ofstream(input) << good << "\n\n" << bad_lines()[b].first << "\n" << good << "\n";
    const test::CommandResult r =
        preprocess_sft_cli({"--input", input, "--output-prefix", dir / ("out/" + std::to_string(b)), "--seq-length", "32"});
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(input + ":3: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(bad_lines()[b].second), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / ("out/" + std::to_string(b) + "_sft.json")));
  }
  const std::string all = dir / "all.jsonl";
  {
    std::ofstream out(all);
    for (const auto& [line, reason] : bad_lines()) out << good << "\n" << line << "\n";
  }
  const test::CommandResult r =
      preprocess_sft_cli({"--input", all, "--output-prefix", dir / "skip", "--seq-length", "32", "--skip-bad-lines"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("skipped " + std::to_string(bad_lines().size()) + " bad lines"), std::string::npos)
      << r.output;
  size_t samples = 0;
  const SftDataset data(dir / "skip", 32, 0);
  for (size_t p = 0; p < data.size(); ++p) {
    std::vector<int64_t> t, lengths;
    std::vector<uint8_t> m;
    data.read_pack(p, &t, &m, &lengths);
    samples += lengths.size();
  }
  EXPECT_EQ(samples, bad_lines().size());
}

TEST(SftPreprocess, FlagErrors) {
  test::TempDir dir;
  std::ofstream(dir / "c.jsonl") << chat_line({{"user", "q"}, {"assistant", "a"}}, false) << "\n";
  const auto expect_error = [&](std::vector<std::string> args, const std::string& what) {
    const test::CommandResult r = preprocess_sft_cli(args);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << r.output;
  };
  expect_error({"--input", dir / "c.jsonl", "--output-prefix", dir / "o"}, "--seq-length is required");
  expect_error({"--input", dir / "c.jsonl", "--output-prefix", dir / "o", "--seq-length", "8", "--chat-template",
                "llama3"}, "<|start_header_id|>");
  expect_error({"--input", dir / "c.jsonl", "--output-prefix", dir / "o", "--seq-length", "8", "--append-eod"},
               "do not apply");
  const test::CommandResult help = test::run_megatron({"preprocess", "--help"});
  EXPECT_NE(help.output.find("--sft"), std::string::npos);
}

}  // namespace
}  // namespace megatron
