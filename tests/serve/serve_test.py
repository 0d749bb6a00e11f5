"""`megatron serve` against real clients: the `openai` package, raw HTTP for what a client library
never sends, and transformers for the numbers.

  python serve_test.py MEGATRON_BINARY MODEL_DIR

MODEL_DIR: a random HF Qwen3 model with the real Qwen3 tokenizer (make_hf_model.py qwen3
tokenizer=...). Checks, each printed as it passes: the models list and health; completions
(greedy repeatable, seeds, n, echo + logprobs equal to transformers' log-softmax, stop strings);
streaming equal to the whole answer; chat rendered as transformers' apply_chat_template renders it,
streamed too; 4xx answers that say why; a client leaving mid-stream; 64 concurrent clients sending
320 requests, each answered or refused with a status; 128 connections opened while the server
cannot accept, each answered; SIGTERM answering the stream in flight and exiting 0; and the model
split over two tensor-parallel ranks (`megatron launch`) answering as one rank does, also after an
idle spell, both ranks stopping on SIGTERM. Exits 1 listing the failures.
"""
import concurrent.futures
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import openai
import torch
import transformers

binary, model_dir = sys.argv[1], sys.argv[2]
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)


def start(*extra, launch=()):
    proc = subprocess.Popen([binary, *launch, "serve", "--load-hf", model_dir, "--port", "0", "--cpu-threads", "1",
                             "--served-model-name", "tiny", *extra], stderr=subprocess.PIPE, text=True)
    lines = []
    while True:
        line = proc.stderr.readline()
        if not line:
            sys.exit("the server did not start:\n" + "".join(lines))
        lines.append(line)
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            break
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    return proc, int(m.group(1)), lines


def post(port, path, body, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=body if isinstance(body, (str, bytes)) else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


proc, port, log = start("--inference-max-batch-size", "4", "--max-queue", "16")
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
tok = transformers.AutoTokenizer.from_pretrained(model_dir)
hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

# --- models, health
models = client.models.list()
check([m.id for m in models.data] == ["tiny"], "GET /v1/models lists the served model")
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
conn.request("GET", "/health")
check(conn.getresponse().status == 200, "GET /health is 200")

# --- completions
prompt = "The quick brown fox"
a = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
b = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
check(a.choices[0].text == b.choices[0].text and a.choices[0].finish_reason == "length", "greedy completions repeat")
check(a.usage.completion_tokens == 8 and a.usage.prompt_tokens == len(tok(prompt)["input_ids"]), "usage counts tokens")
ids = tok(prompt)["input_ids"]
with torch.no_grad():
    greedy = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
eos_ids = hf.generation_config.eos_token_id
eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])


def without_eos(ids):  # the text leaves out the id that ended the sequence, as OpenAI / vLLM do
    return ids[:-1] if ids and ids[-1] in eos_ids else ids


check(a.choices[0].text == tok.decode(without_eos(greedy)), "greedy text equals transformers' generate")
s1 = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=1.0, seed=5)
s2 = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=1.0, seed=5)
check(s1.choices[0].text == s2.choices[0].text, "sampled completions repeat with the same seed")
two = client.completions.create(model="tiny", prompt=[prompt, "Hello"], max_tokens=3, n=2, temperature=1.0, seed=1)
check(len(two.choices) == 4 and [c.index for c in two.choices] == [0, 1, 2, 3], "two prompts x n=2: four choices")

# lm-evaluation-harness's log-likelihood request: token ids, echo, logprobs, one new token.
echo = client.completions.create(model="tiny", prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=2)
lp = echo.choices[0].logprobs
with torch.no_grad():
    want = hf(torch.tensor([ids])).logits[0].log_softmax(-1)
got = lp.token_logprobs
check(len(got) == len(ids) + 1 and got[0] is None, "echo: a log-probability per prompt token (the first none) and the new one")
gap = max(abs(got[i] - want[i - 1, ids[i]].item()) for i in range(1, len(ids)))
check(gap < 1e-4, f"echo: prompt log-probabilities equal transformers' log-softmax (max diff {gap:.2e})")
check(all(len(t) == 2 for t in lp.top_logprobs[1:]), "echo: two top log-probabilities per token")
check(echo.choices[0].text.startswith(prompt), "echo: the text starts with the prompt")

long = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0).choices[0].text
stop = long[len(long) // 2: len(long) // 2 + 3]
cut = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0, stop=[stop]).choices[0]
check(cut.text == long[:long.find(stop)] and cut.finish_reason == "stop", f"stop {stop!r}: the text ends before it")

# --- streaming
pieces = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0, stream=True))
check("".join(p.choices[0].text for p in pieces) == long, "a streamed completion adds up to the whole one")
check(pieces[-1].choices[0].finish_reason == "length", "the stream ends with its finish reason")
pieces = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0, stream=True, stop=stop))
check("".join(p.choices[0].text for p in pieces) == long[:long.find(stop)], "a streamed completion stops before the stop string")

# --- chat
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
rendered = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
check(chat.usage.prompt_tokens == len(rendered), "chat: the prompt is apply_chat_template's (token count)")
with torch.no_grad():
    greedy = hf.generate(torch.tensor([rendered]), max_new_tokens=6, do_sample=False)[0, len(rendered):].tolist()
check(chat.choices[0].message.content == tok.decode(without_eos(greedy), skip_special_tokens=False) and chat.choices[0].message.role == "assistant",
      "chat: the reply is transformers' greedy continuation of the rendered prompt")
stream = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True))
check(stream[0].choices[0].delta.role == "assistant", "chat stream: the first chunk carries the role")
check("".join(c.choices[0].delta.content or "" for c in stream) == chat.choices[0].message.content, "chat stream adds up to the reply")

# --- bad requests: 4xx that say why
status, body = post(port, "/v1/completions", "{not json")
check(status == 400 and b"JSON" in body, "malformed JSON: 400 naming it")
status, body = post(port, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2, "bogus": 1})
check(status == 400 and b"bogus" in body, "an unknown field: 400 naming it")
status, body = post(port, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 10 ** 9})
check(status == 400 and b"maximum length" in body, "huge max_tokens: 400 naming the model's maximum length")
status, body = post(port, "/v1/completions", {"model": "other", "prompt": "x"})
check(status == 404 and b"does not exist" in body, "another model's name: 404")
status, body = post(port, "/v1/completions", {"prompt": [10 ** 7], "max_tokens": 1})
check(status == 400 and b"token id" in body, "a token id outside the vocabulary: 400")
status, body = post(port, "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]})
check(status == 400 and b"robot" in body, "an unknown chat role: 400 naming it")
status, body = post(port, "/v1/nothing", {})
check(status == 404, "an unknown route: 404")
try:
    client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=5)
    check(False, "temperature 5: refused")
except openai.BadRequestError as e:
    check("temperature" in str(e), "temperature 5: the openai client sees a 400 naming the field")

# --- a client leaving mid-stream: its request is dropped, the server goes on
sock = socket.create_connection(("127.0.0.1", port))
body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 100, "stream": True}).encode()
sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
             + str(len(body)).encode() + b"\r\n\r\n" + body)
received, deadline = b"", time.time() + 60
while b"data:" not in received and time.time() < deadline:
    received += sock.recv(4096)
check(b"data:" in received, "a raw streaming client gets events")
sock.close()
after = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
check(after.choices[0].text == a.choices[0].text, "after a client left mid-stream the server answers as before")


# --- load: 64 clients, 320 requests; each answered (200) or refused (503), none lost
def one(i):
    try:
        return post(port, "/v1/completions", {"model": "tiny", "prompt": f"request {i}", "max_tokens": 4,
                                              "temperature": 0.7, "seed": i}, timeout=300)[0]
    except Exception as e:  # a lost request
        return repr(e)


with concurrent.futures.ThreadPoolExecutor(64) as pool:
    statuses = list(pool.map(one, range(320)))
answered, refused = statuses.count(200), statuses.count(503)
check(answered + refused == 320 and answered > 0,
      f"load: 320 requests from 64 clients, {answered} answered, {refused} refused with 503, others: "
      f"{[s for s in statuses if s not in (200, 503)][:5]}")
check(proc.poll() is None, "the server is still up after the load")


# --- a connection burst while the server cannot accept (stopped): 128 connections wait in its
# listen queue and each is answered once it runs again (with cpp-httplib's backlog of 5 the
# seventh connect stalls until it times out; under load, connections past it were reset)
def burst(count):
    socks = [socket.socket() for _ in range(count)]
    proc.send_signal(signal.SIGSTOP)
    try:
        for sock in socks:
            sock.settimeout(20)
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    except Exception as e:
        proc.send_signal(signal.SIGCONT)
        return [repr(e)]
    proc.send_signal(signal.SIGCONT)
    statuses = []
    for sock in socks:
        try:
            reply = b""
            while b"\r\n" not in reply:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
            statuses.append(int(reply.split()[1]) if reply.startswith(b"HTTP/1.1 ") else repr(reply[:40]))
        except Exception as e:
            statuses.append(repr(e))
        finally:
            sock.close()
    return statuses


statuses = burst(128)
check(statuses.count(200) == 128, f"a connection burst while the server was stopped: {statuses.count(200)} of 128 answered, "
      f"others: {[s for s in statuses if s != 200][:5]}")

# --- SIGTERM: the stream in flight is answered to its end, then the process exits 0
events = []


def stream_long():
    for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=60, temperature=0, stream=True):
        events.append(chunk)


t = threading.Thread(target=stream_long)
t.start()
while not events and t.is_alive():
    time.sleep(0.01)
proc.send_signal(signal.SIGTERM)
t.join(timeout=300)
check(bool(events) and events[-1].choices[0].finish_reason == "length", "SIGTERM: the stream in flight ends normally")
try:
    code = proc.wait(timeout=120)
except subprocess.TimeoutExpired:
    proc.kill()
    code = "hung"
check(code == 0 and any("stopped" in line for line in log), f"SIGTERM: the server exits 0 (got {code})")

# --- the model split over two ranks (`megatron launch`; the first rank serves, the other's engine
# follows it): two tensor-parallel ranks, then two pipeline stages (the first rank leads the other
# stage over the model-parallel group). The text of one rank, greedy and sampled, also for requests
# at once and (TP) after an idle spell longer than the followers' keep-alive; SIGTERM stops both
# ranks (--kill-timeout: the launcher's grace after forwarding SIGTERM must cover the drain, which
# waits for the client's idle keep-alive connections too)
for what, flag, banner, at_once, idle in (("two ranks", "--tensor-model-parallel-size", "split over 2 tensor-parallel ranks", 4, True),
                                          ("two stages", "--pipeline-model-parallel-size", "split over 2 pipeline stages", 2, False)):
    proc, port, log = start(flag, "2", launch=["launch", "--nproc-per-node", "2", "--master-port", "0", "--kill-timeout", "120"])
    split = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    check(any(banner in line for line in log), f"{what}: the banner says the model is split")
    greedy_split = split.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
    check(greedy_split.choices[0].text == a.choices[0].text, f"{what}: the greedy text of one rank")
    with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
        sampled = list(pool.map(lambda _: split.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=1.0,
                                                                   seed=5).choices[0].text, range(at_once)))
    check(sampled == [s1.choices[0].text] * at_once, f"{what}: {at_once} sampled requests at once, each the text of one rank")
    if idle:
        time.sleep(11)  # idle past the keep-alive the leader sends every 10 s
        again = split.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
        check(again.choices[0].text == a.choices[0].text, f"{what}: answers after an idle spell")
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = "hung"
    time.sleep(0.5)  # the reader thread takes the last lines
    stopped = any("[rank 0] > stopped" in line for line in log) and not any("SIGKILL" in line or "launch: rank" in line for line in log)
    check(code == 128 + signal.SIGTERM and stopped,  # the launcher's status after a signal, as a shell's
          f"{what}: SIGTERM stops both, the first after answering, the other after it (status {code})")

if failures:
    print("\n".join(["", "server log:"] + log[-20:]))
    sys.exit(f"{len(failures)} check(s) failed")
print("all checks passed")
