#include "serve/server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>

#include "core/errors.h"

namespace megatron::serve {

using json = nlohmann::json;

// One HTTP request's choices on their way through the engine. The engine thread writes tokens
// and results; the HTTP thread reads them; `m` guards everything below it.
struct Ticket {
  explicit Ticket(ParsedRequest r) : request(std::move(r)), tokens(request.choices.size()), results(request.choices.size()) {}
  ParsedRequest request;
  std::vector<int64_t> engine_ids;  // engine thread only
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::vector<int64_t>> tokens;  // per choice, streamed so far
  std::vector<std::optional<GenerationResult>> results;
  size_t finished = 0;
  std::optional<ApiError> error;
  bool cancelled = false;  // the client went away
  bool done() const { return error.has_value() || finished == results.size(); }
};

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void reply_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(e.body()), "application/json");
}

// The longest prefix of `text` ending on a whole UTF-8 character.
size_t utf8_boundary(const std::string& text, size_t end) {
  while (end > 0 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return end;
}

bool ends_incomplete(const std::string& text) {  // a decoded partial character (U+FFFD)
  return text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

InferenceServer::InferenceServer(LeadingEngine& engine, ServedModel model, ServerOptions options)
    : lead_(engine), engine_(engine.engine()), model_(std::move(model)), options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  const int threads = options_.threads > 0 ? options_.threads : int(engine_.max_batch() + options_.max_queue + 4);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_->set_payload_max_length(16u << 20);
  http_->set_read_timeout(std::chrono::seconds(30));
  // Remember the listening socket: bind() widens its backlog.
  http_->set_socket_options([this](int fd) {
    httplib::default_socket_options(fd);
    listen_fd_ = fd;
  });
  routes();
}

InferenceServer::~InferenceServer() { stop_engine(); }

void InferenceServer::stop_engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (engine_thread_.joinable()) engine_thread_.join();
}

int InferenceServer::bind() {
  const int port = options_.port == 0 ? http_->bind_to_any_port(options_.host) : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port < 0) {
    throw UserError("serve: cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                    " (in use, or not an address of this machine); choose another --port or --host");
  }
  // cpp-httplib 0.11 listens with a backlog of 5: when more clients connect at once than its
  // accept loop takes in (a busy machine), Linux drops their SYNs, so connects stall for seconds,
  // or resets them (CI saw a request of 64 concurrent clients reset). listen() again on a
  // listening socket only changes its backlog.
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  engine_thread_ = std::thread([this] { engine_loop(); });
  return port;
}

void InferenceServer::serve() { http_->listen_after_bind(); }

void InferenceServer::drain() {
  draining_ = true;
  if (in_flight_ == 0) http_->stop();
}

void InferenceServer::finish_request() {
  if (--in_flight_ == 0 && draining_) http_->stop();
}

std::shared_ptr<Ticket> InferenceServer::enqueue(ParsedRequest request) {
  if (draining_) throw ApiError(503, "the server is shutting down", "", "service_unavailable");
  const int64_t n = int64_t(request.choices.size());
  const int64_t limit = engine_.max_batch() + options_.max_queue;
  if (queued_choices_.fetch_add(n) + n > limit) {
    queued_choices_ -= n;
    throw ApiError(503, "the server is busy: " + std::to_string(limit) + " sequences are generating or waiting; retry later", "",
                   "service_unavailable");
  }
  auto ticket = std::make_shared<Ticket>(std::move(request));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inbox_.push_back(ticket);
  }
  wake_.notify_all();
  return ticket;
}

void InferenceServer::engine_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    std::vector<std::shared_ptr<Ticket>> arrived;
    arrived.swap(inbox_);
    if (arrived.empty() && active_.empty()) {
      if (stopping_) {
        lock.unlock();
        lead_.finish();  // the other TP ranks' engines stop too
        return;
      }
      // Idle: the other TP ranks wait in a collective for this engine's next step; tell them
      // before the collective's timeout ends their wait.
      if (wake_.wait_for(lock, std::chrono::seconds(10)) == std::cv_status::timeout && inbox_.empty()) {
        lock.unlock();
        lead_.keep_alive();
        lock.lock();
      }
      continue;
    }
    lock.unlock();
    auto fail = [this](Ticket& t, const ApiError& e) {
      for (size_t i = 0; i < t.engine_ids.size(); ++i) {
        if (!t.results[i]) lead_.cancel(t.engine_ids[i]);
      }
      std::lock_guard<std::mutex> g(t.m);
      queued_choices_ -= int64_t(t.results.size() - t.finished);
      t.error = e;
      t.cv.notify_all();
    };
    for (auto& t : arrived) {
      try {
        for (size_t i = 0; i < t->request.choices.size(); ++i) {
          GenerationRequest r = t->request.choices[i];
          r.on_token = [ticket = t.get(), i](int64_t id) {
            std::lock_guard<std::mutex> g(ticket->m);
            ticket->tokens[i].push_back(id);
            ticket->cv.notify_all();
          };
          t->engine_ids.push_back(lead_.submit(std::move(r)));
        }
        active_.push_back(t);
      } catch (const UserError& e) {
        fail(*t, ApiError(400, e.what()));
      }
    }
    // Requests whose clients went away leave the engine before the next step.
    std::vector<std::shared_ptr<Ticket>> keep;
    for (auto& t : active_) {
      bool cancelled;
      {
        std::lock_guard<std::mutex> g(t->m);
        cancelled = t->cancelled;
      }
      if (cancelled) fail(*t, ApiError(499, "the client closed the connection"));
      else keep.push_back(t);
    }
    active_.swap(keep);
    try {
      if (!engine_.idle()) lead_.step();
    } catch (const std::exception& e) {
      // A failed step (e.g. out of memory) fails the requests in it, not the server.
      for (auto& t : active_) fail(*t, ApiError(500, std::string("generation failed: ") + e.what(), "", "internal_error"));
      active_.clear();
    }
    keep.clear();
    for (auto& t : active_) {
      for (size_t i = 0; i < t->engine_ids.size(); ++i) {
        if (t->results[i]) continue;
        if (std::optional<GenerationResult> r = engine_.take_result(t->engine_ids[i])) {
          std::lock_guard<std::mutex> g(t->m);
          t->results[i] = std::move(r);
          ++t->finished;
          --queued_choices_;
          t->cv.notify_all();
        }
      }
      std::lock_guard<std::mutex> g(t->m);
      if (!t->done()) keep.push_back(t);
    }
    active_.swap(keep);
    lock.lock();
  }
}

void InferenceServer::routes() {
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(res, ApiError(500, what, "", "internal_error"));
  });
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) return reply_error(res, ApiError(503, "the server is shutting down", "", "service_unavailable"));
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json model = {{"id", model_.name}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                        {"owned_by", "megatron.cpp"}, {"max_model_len", model_.max_length}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  auto generation = [this](bool chat) {
    return [this, chat](const httplib::Request& req, httplib::Response& res) {
      ++in_flight_;
      bool streaming = false;
      try {
        ParsedRequest parsed = chat ? parse_chat_request(req.body, model_) : parse_completion_request(req.body, model_);
        const std::string id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
        const int64_t created = int64_t(std::time(nullptr));
        const bool stream = parsed.stream;
        std::shared_ptr<Ticket> ticket = enqueue(std::move(parsed));
        if (stream) {
          streaming = true;
          stream_response(res, ticket, id, created);
        } else {
          std::unique_lock<std::mutex> l(ticket->m);
          ticket->cv.wait(l, [&] { return ticket->done(); });
          if (ticket->error) throw *ticket->error;
          std::vector<GenerationResult> results;
          for (auto& r : ticket->results) results.push_back(std::move(*r));
          res.set_content(dump(completion_response(ticket->request, results, model_, id, created)), "application/json");
        }
      } catch (const ApiError& e) {
        reply_error(res, e);
      }
      if (!streaming) finish_request();
    };
  };
  http_->Post("/v1/completions", generation(false));
  http_->Post("/v1/chat/completions", generation(true));
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string what = res.status == 404 ? "no route " + req.method + " " + req.path +
                                                     " (POST /v1/completions, /v1/chat/completions; GET /v1/models, /health)"
                                               : "HTTP " + std::to_string(res.status);
    reply_error(res, ApiError(res.status, what));
  });
}

void InferenceServer::stream_response(httplib::Response& res, const std::shared_ptr<Ticket>& ticket, const std::string& id,
                                      int64_t created) {
  struct Progress {
    bool started = false;
    std::vector<std::string> sent;  // per choice, the text sent so far
    std::vector<bool> closed;
  };
  const size_t n = ticket->request.choices.size();
  auto progress = std::make_shared<Progress>();
  progress->sent.resize(n);
  progress->closed.resize(n, false);
  size_t hold = 0;  // bytes held back while they may begin a stop string
  for (const std::string& stop : ticket->request.choices[0].stop_strings) hold = std::max(hold, stop.size() - 1);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, ticket, progress, id, created, hold](size_t, httplib::DataSink& sink) {
        const ParsedRequest& request = ticket->request;
        auto send = [&](const json& j) {
          const std::string event = "data: " + dump(j) + "\n\n";
          return sink.write(event.data(), event.size());
        };
        auto cancel = [&] {
          {
            std::lock_guard<std::mutex> g(ticket->m);
            ticket->cancelled = true;
          }
          wake_.notify_all();
          return false;
        };
        if (!progress->started) {
          progress->started = true;
          for (size_t i = 0; i < progress->sent.size(); ++i) {
            const bool ok = request.chat ? send(role_chunk(i, model_.name, id, created))
                            : request.echo ? send(stream_chunk(request, i, request.prompt_texts[i], "", model_.name, id, created))
                                           : true;
            if (!ok) return cancel();
          }
        }
        std::vector<std::vector<int64_t>> tokens;
        std::vector<std::optional<GenerationResult>> results;
        std::optional<ApiError> error;
        {
          std::unique_lock<std::mutex> l(ticket->m);
          ticket->cv.wait_for(l, std::chrono::milliseconds(200), [&] {
            if (ticket->done()) return true;
            for (size_t i = 0; i < ticket->tokens.size(); ++i) {
              if (!progress->closed[i] && !ticket->tokens[i].empty()) return true;
            }
            return false;
          });
          tokens = ticket->tokens;
          results = ticket->results;
          error = ticket->error;
        }
        if (!sink.is_writable()) return cancel();
        if (error) {
          send(error->body());
          const std::string end = "data: [DONE]\n\n";
          sink.write(end.data(), end.size());
          sink.done();
          return true;
        }
        bool all_closed = true;
        for (size_t i = 0; i < tokens.size(); ++i) {
          if (progress->closed[i]) continue;
          std::string& sent = progress->sent[i];
          if (results[i]) {
            // The end: what is left of the final text (cut before a stop string), then the reason.
            const std::string& text = results[i]->text;
            if (text.size() > sent.size() && text.compare(0, sent.size(), sent) == 0) {
              if (!send(stream_chunk(request, i, text.substr(sent.size()), "", model_.name, id, created))) return cancel();
            }
            if (!send(stream_chunk(request, i, "", results[i]->finish_reason, model_.name, id, created))) return cancel();
            progress->closed[i] = true;
            continue;
          }
          all_closed = false;
          // A stop id ends the sequence but is not text (the final text leaves it out too).
          std::vector<int64_t> shown = tokens[i];
          const std::vector<int64_t>& stop_ids = request.choices[i].stop_ids;
          if (!shown.empty() && std::find(stop_ids.begin(), stop_ids.end(), shown.back()) != stop_ids.end()) shown.pop_back();
          const std::string text = model_.tokenizer->decode(shown);
          if (ends_incomplete(text) || text.compare(0, sent.size(), sent) != 0) continue;
          // Not past a stop string already in the text (the engine has not reported it yet),
          // nor into what could begin one.
          size_t end = text.size() > hold ? text.size() - hold : 0;
          for (const std::string& stop : request.choices[i].stop_strings) end = std::min(end, text.find(stop));
          const size_t visible = utf8_boundary(text, end);
          if (visible > sent.size()) {
            if (!send(stream_chunk(request, i, text.substr(sent.size(), visible - sent.size()), "", model_.name, id, created))) return cancel();
            sent = text.substr(0, visible);
          }
        }
        if (all_closed) {
          const std::string end = "data: [DONE]\n\n";
          sink.write(end.data(), end.size());
          sink.done();
        }
        return true;
      },
      [this, ticket](bool) {
        {
          std::lock_guard<std::mutex> g(ticket->m);
          if (!ticket->done()) ticket->cancelled = true;
        }
        wake_.notify_all();
        finish_request();
      });
}

}  // namespace megatron::serve
