// `megatron serve (--load DIR | --load-hf DIR) [--host H] [--port P]`: the OpenAI API over HTTP
// (serve/server.h) for a checkpoint, as `vllm serve MODEL`. SIGTERM / SIGINT drain it: requests
// in flight are answered, new ones refused, then it exits 0.
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/inference_flags.h"
#include "core/errors.h"
#include "data/chat_template.h"
#include "distributed/world.h"
#include "inference/engine.h"
#include "inference/leading_engine.h"
#include "model/gpt_model.h"
#include "serve/server.h"
#include "tokenizer/tokenizer.h"

namespace megatron::cli {
namespace {

std::string help() {
  return std::string(
             "usage: megatron serve (--load DIR | --load-hf DIR) [flags]\n\n"
             "Serves the model of a checkpoint over HTTP with the OpenAI API: POST /v1/completions,\n"
             "/v1/chat/completions (stream: server-sent events), GET /v1/models, /health. SIGTERM or\n"
             "Ctrl-C answers the requests in flight, refuses new ones, and exits.\n\n") +
         kInferenceModelFlagsHelp +
         "  --host H                     address to listen on (default 127.0.0.1)\n"
         "  --port P                     port (default 8000; 0: any free one, printed)\n"
         "  --served-model-name NAME     the model's name in the API (default: the directory's name)\n"
         "  --chat-template auto|chatml|qwen3|llama3|none\n"
         "                               how /v1/chat/completions renders messages (default auto: from the\n"
         "                               tokenizer's special tokens; none, or auto finding none: no chat)\n"
         "  --inference-max-batch-size N sequences decoded together (default 8)\n"
         "  --max-queue N                sequences waiting for a slot before requests get 503 (default 64)\n";
}

}  // namespace

int serve(const Args& args) {
  InferenceModelFlags model_flags;
  std::string host = "127.0.0.1", name, chat = "auto";
  double port = 8000, batch = 8, queue = 64;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return 0;
    }
    if (take_inference_model_flag(args, i, model_flags)) continue;
    if (a != "--host" && a != "--port" && a != "--served-model-name" && a != "--chat-template" &&
        a != "--inference-max-batch-size" && a != "--max-queue") {
      throw UserError("unknown flag " + a + " for serve; see megatron serve --help");
    }
    if (i + 1 >= args.size()) throw UserError(a + ": expects a value");
    const std::string& v = args[++i];
    if (a == "--host") host = v;
    if (a == "--served-model-name") name = v;
    if (a == "--chat-template") chat = v;
    if (a == "--port") port = number_flag(a, v);
    if (a == "--inference-max-batch-size") batch = number_flag(a, v);
    if (a == "--max-queue") queue = number_flag(a, v);
  }
  if (!(port >= 0 && port <= 65535 && port == int(port))) throw UserError("--port must be from 0 to 65535");
  if (!(batch >= 1 && batch <= 4096)) throw UserError("--inference-max-batch-size must be from 1 to 4096");
  if (!(queue >= 0 && queue <= 1e6)) throw UserError("--max-queue must be from 0 to 1000000");
  if (chat != "auto" && chat != "none" && chat != "chatml" && chat != "qwen3" && chat != "llama3") {
    throw UserError("--chat-template: expected auto, chatml, qwen3, llama3 or none, got " + chat);
  }

  // SIGTERM and SIGINT go to one thread (blocked in all others, which inherit the mask).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const GenerationModel g = load_inference_model(model_flags, "serve");
  std::unique_ptr<ChatTemplate> chat_template;
  if (chat != "none") {
    try {
      chat_template = std::make_unique<ChatTemplate>(resolve_chat_template(chat, *g.tokenizer), *g.tokenizer);
    } catch (const UserError& e) {
      if (chat != "auto") throw;
      std::fprintf(stderr, "> no chat template (%s): /v1/chat/completions is off\n", e.what());
    }
  }
  EngineOptions engine_options = engine_options_for(model_flags, g);
  engine_options.max_batch = int64_t(batch);
  Engine engine(*g.model, engine_options);
  if (g.device.is_cuda()) {
    // The first forward on a GPU is cold (CUDA loads each kernel at its first launch: ~0.1 s on
    // the 1.1B shape): taken here, before the first client waits for it. Every rank runs it, in step.
    const double seconds = engine.warm_up(g.tokenizer->encode("The server warms up before it listens."));
    if (g.parallel.rank == 0) std::fprintf(stderr, "> warm-up: %.1f ms\n", 1e3 * seconds);
  }
  if (g.parallel.rank != 0) {
    // The other tensor-parallel ranks and pipeline stages (the model-parallel group: every rank of
    // the job): their engines do what the first rank's server asks of its own (leading_engine.h);
    // stop signals are the first rank's to act on (they stay blocked here).
    follow_leading_engine(engine, g.parallel.model_parallel, g.device);
    if (g.world) g.world->shutdown();
    return 0;
  }
  LeadingEngine lead(engine, g.parallel.model_parallel, g.device);

  serve::ServedModel served{name.empty() ? std::filesystem::path(g.source).filename().string() : name,
                            g.tokenizer.get(), chat_template.get(), g.stop_ids, engine.max_length(), g.vocab_size};
  if (served.name.empty() || served.name == ".") served.name = "model";
  serve::ServerOptions options;
  options.host = host;
  options.port = int(port);
  options.max_queue = int64_t(queue);
  // Shared with the signal thread, which may outlive this function (it waits for a signal that
  // need never come).
  auto server = std::make_shared<serve::InferenceServer>(lead, served, options);
  const int bound = server->bind();
  std::thread([server, stop_signals] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    std::fprintf(stderr, "> signal %d: answering the requests in flight, then stopping\n", signal);
    server->drain();
  }).detach();
  std::fprintf(stderr, "> serving %s (%s) on http://%s:%d (max length %lld tokens, %lld sequences at once; decode steps: %s%s)\n",
               served.name.c_str(), g.source.c_str(), host.c_str(), bound, (long long)served.max_length, (long long)batch,
               engine.decode_mode().c_str(),
               tensor_parallel_note(g, "; ").c_str());
  server->serve();
  server->stop_engine();
  if (g.world) g.world->shutdown();
  std::fprintf(stderr, "> stopped\n");
  return 0;
}

}  // namespace megatron::cli
