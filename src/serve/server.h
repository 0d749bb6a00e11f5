// `megatron serve`: the OpenAI API over HTTP (cpp-httplib) in front of the generation engine.
//
//   POST /v1/completions, /v1/chat/completions (stream: server-sent events), GET /v1/models, /health
//
// HTTP requests are handled on a pool of threads; one engine thread owns the engine and runs it:
// it takes the requests handed to it, steps the engine (every running request decodes a token
// per step, new ones join between steps), and hands tokens and results back. Beyond the engine's
// slots at most `max_queue` choices wait; more are refused at once with 503 and Retry-After, so
// a burst of clients gets answers, not timeouts. drain() (SIGTERM) refuses new requests with 503,
// lets those in flight finish, then stops. A client that disconnects mid-stream has its request
// cancelled (its slot freed at the next step).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inference/engine.h"
#include "inference/leading_engine.h"
#include "serve/openai_protocol.h"

namespace httplib {
class Server;
struct Response;
}

namespace megatron::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;          // 0: any free port (bind() says which)
  int64_t max_queue = 64;   // choices waiting for a slot before new requests are refused
  int threads = 0;          // HTTP worker threads; 0: the engine's slots + max_queue + 4
};

struct Ticket;

class InferenceServer {
 public:
  // Under tensor parallelism `engine` leads the other TP ranks' engines (leading_engine.h).
  InferenceServer(LeadingEngine& engine, ServedModel model, ServerOptions options);
  ~InferenceServer();

  // Binds the socket and starts the engine thread; the port bound. UserError naming host:port
  // when it cannot bind.
  int bind();
  // Serves until drain() has let the requests in flight finish. Blocks.
  void serve();
  // Refuses new requests from now on and stops once those in flight are answered. Thread-safe,
  // returns at once; safe to call more than once.
  void drain();
  // After serve() has returned: the engine thread ends (and tells the other TP ranks to stop).
  // The destructor does it too; calling it twice is harmless.
  void stop_engine();

 private:
  void routes();
  void engine_loop();
  // Hands a parsed request to the engine thread; ApiError 503 when the queue is full or draining.
  std::shared_ptr<Ticket> enqueue(ParsedRequest request);
  void finish_request();  // an HTTP request is answered (in_flight_ down; stop when draining)
  // Server-sent events: each choice's text as it grows, its end, then [DONE].
  void stream_response(httplib::Response& res, const std::shared_ptr<Ticket>& ticket, const std::string& id, int64_t created);

  LeadingEngine& lead_;  // submit, cancel and step go through it
  Engine& engine_;
  ServedModel model_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  int listen_fd_ = -1;  // the socket httplib binds (its backlog widened in bind())
  std::thread engine_thread_;

  std::mutex mutex_;  // guards inbox_, active_, stopping_
  std::condition_variable wake_;
  std::vector<std::shared_ptr<Ticket>> inbox_;
  std::vector<std::shared_ptr<Ticket>> active_;  // submitted to the engine (engine thread only)
  bool stopping_ = false;

  std::atomic<bool> draining_{false};
  std::atomic<int64_t> queued_choices_{0};  // submitted and not finished
  std::atomic<int64_t> in_flight_{0};       // generation requests not yet answered
  std::atomic<int64_t> next_id_{0};
};

}  // namespace megatron::serve
