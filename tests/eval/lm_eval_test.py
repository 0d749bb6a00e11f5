"""`megatron eval --task` against lm-evaluation-harness itself on the same model and local data:

  python lm_eval_test.py MEGATRON_BINARY HF_MODEL_DIR WORK_DIR

  1. a multiple-choice task (4 choices and fewer, one few-shot example per document drawn from a
     dev file by lm-eval's default sampler, seeded random.Random(1234), and by ours) scored by
     `megatron eval`, by `lm_eval` with `--model local-completions` talking to `megatron serve`
     (the engine behind an HTTP server, lm-eval's own client and tokenizer), and by `lm_eval
     --model hf` (transformers' forward: an independent reference). acc and acc_norm must be
     equal; the per-choice log-likelihoods equal the server's to 1e-5 (eval prefills prompts of one
     length together, the server one by one) and HF's to 1e-4;
  2. the datasets' own record formats (MMLU, ARC, HellaSwag, C-Eval) read with lm-eval's own task
     definitions (their data files swapped for local ones): our prompts equal lm-eval's, character
     for character, and acc / acc_norm are equal;
  3. GSM8K-style generate-until (lm-eval's gsm8k prompt, stop strings and filters, 2-shot drawn
     as lm-eval's gsm8k task draws them, 12 new tokens): our prompts, responses and extracted answers equal `lm_eval --model hf`'s for every
     document, and the exact-match scores too;
  4. the multiple-choice task again with the model split over two tensor-parallel ranks
     (`megatron launch`): the same scores, log-likelihoods within 1e-5.
Prints "all checks passed" at the end; any mismatch raises.
"""
import json
import math
import os
import re
import subprocess
import sys

binary, model_dir, work = sys.argv[1:4]
os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

MC_TEST = [
    ("The capital of France is", ["Paris", "London", "a small town in Spain", "Berlin"], 0),
    ("Water freezes at", ["zero degrees", "one hundred degrees"], 0),
    ("Two plus two equals", ["four", "five", "twenty-two"], 0),
    ("The sun rises in the", ["east", "west", "north", "south"], 2),
    ("A cat is a kind of", ["animal", "vegetable", "mineral"], 0),
    ("Ice is", ["cold", "hot"], 1),
]
# Several examples each: lm-eval's default sampler draws a document's few-shot examples from them
# with its seeded random.Random (1234), and ours must draw the same ones (eval/fewshot.h).
MC_DEV = [
    ("The sky is", ["blue", "green"], 0),
    ("Grass is", ["purple", "green"], 1),
    ("Snow is", ["white", "black", "red"], 0),
    ("Fire is", ["cold", "hot"], 1),
]
GSM_TEST = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "He has 3 + 4 = 7 apples.\n#### 7"),
    ("A box holds 12 eggs. How many eggs are in 2 boxes?", "2 * 12 = 24\n#### 24"),
    ("Sara reads 5 pages a day. How many pages in 6 days?", "5 * 6 = 30\n#### 30"),
]
GSM_DEV = [
    ("What is 2 + 3?", "2 + 3 = 5\n#### 5"),
    ("What is 10 - 4?", "10 - 4 = 6\n#### 6"),
    ("What is 3 * 3?", "3 * 3 = 9\n#### 9"),
    ("What is 8 / 2?", "8 / 2 = 4\n#### 4"),
]


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


os.makedirs(f"{work}/tasks", exist_ok=True)
write_jsonl(f"{work}/mc_test.jsonl", [{"question": q, "choices": c, "answer": a} for q, c, a in MC_TEST])
write_jsonl(f"{work}/mc_dev.jsonl", [{"question": q, "choices": c, "answer": a} for q, c, a in MC_DEV])
write_jsonl(f"{work}/gsm_test.jsonl", [{"question": q, "answer": a} for q, a in GSM_TEST])
write_jsonl(f"{work}/gsm_dev.jsonl", [{"question": q, "answer": a} for q, a in GSM_DEV])
with open(f"{work}/tasks/tiny_mc.yaml", "w") as f:
    f.write(f"""task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {work}/mc_test.jsonl
    validation: {work}/mc_dev.jsonl
test_split: test
fewshot_split: validation
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
""")
# lm-eval's own gsm8k task (its default, seeded random few-shot sampler), its data files swapped for the local ones.
with open(f"{work}/tasks/tiny_gsm8k.yaml", "w") as f:
    f.write(f"""include: {os.path.dirname(lm_eval.__file__)}/tasks/gsm8k/gsm8k.yaml
task: tiny_gsm8k
tag: []
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {work}/gsm_test.jsonl
    train: {work}/gsm_dev.jsonl
generation_kwargs:
  until: ["Question:", "</s>", "<|im_end|>"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: 12
""")
tasks = TaskManager(include_path=f"{work}/tasks")


def ours(task, fmt, dev, shots, extra=(), launch=(), out=None):
    out = out or f"{work}/{task}.json"
    subprocess.run([binary, *launch, "eval", "--task", f"{work}/{task}.jsonl", "--task-format", fmt, "--task-name", task,
                    "--num-fewshot", str(shots), "--fewshot-file", f"{work}/{dev}.jsonl", "--load-hf", model_dir,
                    "--device", "cpu", "--results-json", out, *extra], check=True)
    return json.load(open(out))


def harness(task, model, model_args, shots):
    r = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task], num_fewshot=shots, task_manager=tasks,
                                log_samples=True, batch_size=1)
    return r["results"][task], sorted(r["samples"][task], key=lambda s: s["doc_id"])


hf_args = f"pretrained={model_dir},dtype=float32,device=cpu"

# 1. Multiple choice.
mc = ours("mc_test", "multiple_choice", "mc_dev", 1)
mc_results, mc_samples = mc["results"]["mc_test"], mc["samples"]["mc_test"]
server = subprocess.Popen([binary, "serve", "--load-hf", model_dir, "--device", "cpu", "--port", "0",
                           "--served-model-name", "m"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
try:
    port = None
    for line in server.stdout:
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if found:
            port = found.group(1)
            break
    assert port, "the server printed no address"
    local, local_samples = harness("tiny_mc", "local-completions",
                                   f"model=m,base_url=http://127.0.0.1:{port}/v1/completions,tokenizer={model_dir},"
                                   "tokenized_requests=True,num_concurrent=1,max_retries=1", 1)
finally:
    server.terminate()
    server.wait(timeout=60)
hf, hf_samples = harness("tiny_mc", "hf", hf_args, 1)

for name, results in (("local-completions", local), ("hf", hf)):
    for metric in ("acc,none", "acc_norm,none"):
        assert results[metric] == mc_results[metric], f"{metric}: lm-eval {name} {results[metric]}, megatron eval {mc_results[metric]}"
shots_seen = set()
for ours_doc, local_doc, hf_doc in zip(mc_samples, local_samples, hf_samples, strict=True):
    # The few-shot example lm-eval's seeded sampler drew for this document is the one we drew.
    assert {a[0] for a in hf_doc["arguments"]} == {ours_doc["context"]}, (ours_doc["context"], hf_doc["arguments"])
    shots_seen.add(ours_doc["context"].split("\n\n")[0])
    lls = ours_doc["loglikelihoods"]
    local_lls = [float(r[0]) for r in local_doc["filtered_resps"]]
    hf_lls = [float(r[0]) for r in hf_doc["filtered_resps"]]
    # The same engine, but `megatron eval` prefills requests of one length together and the server
    # gets them one by one: other GEMM shapes, fp32 rounding apart.
    assert max(abs(a - b) for a, b in zip(lls, local_lls, strict=True)) < 1e-5, (lls, local_lls)
    assert max(abs(a - b) for a, b in zip(lls, hf_lls, strict=True)) < 1e-4, (lls, hf_lls)
    gaps = sorted(lls)
    assert len(lls) < 2 or gaps[-1] - gaps[-2] > 1e-3, f"a near tie makes the comparison fragile: {lls}"
assert len(shots_seen) > 1, f"every document drew the same example: the sampler's randomness is untested ({shots_seen})"
print(f"multiple choice: acc {mc_results['acc,none']:.4f} acc_norm {mc_results['acc_norm,none']:.4f}, equal across "
      "megatron eval, lm_eval local-completions (megatron serve) and lm_eval hf", flush=True)

# lm-eval's --limit below 1: that fraction of the documents, rounded up; their few-shot draws are
# the full run's first ones (the generator runs on from document to document in order).
half = ours("mc_test", "multiple_choice", "mc_dev", 1, ["--limit", "0.4"], out=f"{work}/mc_test_limit.json")["samples"]["mc_test"]
assert len(half) == math.ceil(len(MC_TEST) * 0.4), len(half)
assert [d["context"] for d in half] == [d["context"] for d in mc_samples[:len(half)]], (half, mc_samples)
print(f"--limit 0.4: the first {len(half)} documents, with the full run's few-shot draws", flush=True)

# 2. The datasets' own formats through lm-eval's own task files.
CEVAL_DESCRIPTION = "以下是中国关于高中生物的单项选择题，请选出其中的正确答案。\n\n"  # ceval-valid_high_school_biology's
TASKS = os.path.dirname(lm_eval.__file__) + "/tasks"
FORMATS = {
    "mmlu": (f"{TASKS}/mmlu/default/_default_template_yaml",
             'description: "The following are multiple choice questions (with answers) about high school biology.\\n\\n"',
             [{"question": " What carries oxygen in blood? ", "subject": "high_school_biology",
               "choices": ["Red cells", "White cells", "Platelets", "Plasma"], "answer": 0},
              {"question": "Which organ pumps blood?", "subject": "high_school_biology",
               "choices": ["Liver", "Heart", "Lung", "Kidney"], "answer": 1}]),
    "arc": (f"{TASKS}/arc/arc_easy.yaml", "",
            [{"id": "1", "question": "Which is a liquid at room temperature?",
              "choices": {"text": ["water", "iron", "salt"], "label": ["A", "B", "C"]}, "answerKey": "A"},
             {"id": "2", "question": "What do plants need to grow?",
              "choices": {"text": ["sunlight", "darkness", "plastic", "sand"], "label": ["1", "2", "3", "4"]}, "answerKey": "1"}]),
    "hellaswag": (f"{TASKS}/hellaswag/hellaswag.yaml", "",
                  [{"ind": 1, "activity_label": "Making tea", "ctx_a": "A man boils water [title] in a kettle.",
                    "ctx_b": "he THEN", "endings": ["pours it  into a cup.", "throws the kettle [step] away.", "sleeps."],
                    "label": "0", "split": "val", "split_type": "indomain", "source_id": "x", "ctx": ""},
                   {"ind": 2, "activity_label": "Running", "ctx_a": "A woman ties her shoes.", "ctx_b": "she",
                    "endings": ["starts to run down the road.", "eats the shoes.", "flies."], "label": "0",
                    "split": "val", "split_type": "indomain", "source_id": "y", "ctx": ""}]),
    # lm-eval's ceval-valid_* tasks carry the subject's line as their description; ours takes it by flag.
    "ceval": (f"{TASKS}/ceval/_default_ceval_yaml", f"description: {json.dumps(CEVAL_DESCRIPTION, ensure_ascii=False)}",
              [{"id": 0, "question": "中国的首都是哪里？", "A": "北京", "B": "上海", "C": "广州", "D": "深圳", "answer": "A",
                "explanation": ""},
               {"id": 1, "question": "一年有几个月？", "A": "十个", "B": "十一个", "C": "十二个", "D": "十三个", "answer": "C",
                "explanation": ""}]),
}
for fmt, (source, extra, rows) in FORMATS.items():
    write_jsonl(f"{work}/{fmt}_test.jsonl", rows)
    write_jsonl(f"{work}/{fmt}_dev.jsonl", rows[:1])
    with open(f"{work}/tasks/tiny_{fmt}.yaml", "w") as f:
        f.write(f"""include: {source}
task: tiny_{fmt}
tag: []
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {work}/{fmt}_test.jsonl
    dev: {work}/{fmt}_dev.jsonl
training_split: null
validation_split: null
test_split: test
fewshot_split: dev
fewshot_config:
  sampler: first_n
metric_list:
  - metric: acc
  - metric: acc_norm
{extra}
""")
tasks = TaskManager(include_path=f"{work}/tasks")
for fmt in FORMATS:
    got = ours(f"{fmt}_test", fmt, f"{fmt}_dev", 1, ["--task-description", CEVAL_DESCRIPTION] if fmt == "ceval" else [])
    got_results, got_samples = got["results"][f"{fmt}_test"], got["samples"][f"{fmt}_test"]
    ref, ref_samples = harness(f"tiny_{fmt}", "hf", hf_args, 1)
    for ours_doc, ref_doc in zip(got_samples, ref_samples, strict=True):
        contexts = {a[0] for a in ref_doc["arguments"]}
        assert contexts == {ours_doc["context"]}, (fmt, ours_doc["context"], contexts)
        continuations = [a[1] for a in ref_doc["arguments"]]
        assert continuations == [" " + c for c in ours_doc["choices"]], (fmt, ours_doc["choices"], continuations)
        hf_lls = [float(r[0]) for r in ref_doc["filtered_resps"]]
        assert max(abs(a - b) for a, b in zip(ours_doc["loglikelihoods"], hf_lls, strict=True)) < 1e-4, (fmt, hf_lls)
    for metric in ("acc,none", "acc_norm,none"):
        assert ref[metric] == got_results[metric], f"{fmt} {metric}: lm-eval {ref[metric]}, megatron eval {got_results[metric]}"
    print(f"{fmt}: prompts and acc / acc_norm equal lm-eval's own task's", flush=True)

# 3. GSM8K generate-until.
gsm = ours("gsm_test", "gsm8k", "gsm_dev", 2, ["--max-new-tokens", "12"])
gsm_results, gsm_samples = gsm["results"]["gsm_test"], gsm["samples"]["gsm_test"]
hf_gsm, hf_gsm_samples = harness("tiny_gsm8k", "hf", hf_args, 2)
for name in ("strict-match", "flexible-extract"):  # lm-eval logs each document once per filter
    by_filter = [d for d in hf_gsm_samples if d["filter"] == name]
    for ours_doc, hf_doc in zip(gsm_samples, by_filter, strict=True):
        assert ours_doc["response"] == hf_doc["resps"][0][0], (ours_doc["response"], hf_doc["resps"][0][0])
        assert ours_doc["prompt"] == hf_doc["arguments"][0][0], (ours_doc["prompt"], hf_doc["arguments"][0][0])
        assert ours_doc[name] == hf_doc["filtered_resps"][0], (name, ours_doc[name], hf_doc["filtered_resps"][0])
for metric in ("exact_match,strict-match", "exact_match,flexible-extract"):
    assert hf_gsm[metric] == gsm_results[metric], f"{metric}: lm-eval {hf_gsm[metric]}, megatron eval {gsm_results[metric]}"
print(f"gsm8k: responses equal lm_eval hf's for {len(gsm_samples)} documents; exact match strict "
      f"{gsm_results['exact_match,strict-match']:.4f} flexible {gsm_results['exact_match,flexible-extract']:.4f}", flush=True)
# 4. The model split over two tensor-parallel ranks, or two pipeline stages (one layer each, the
# logits broadcast from the last), scores what one rank scores.
for flag, what in (("--tensor-model-parallel-size", "two tensor-parallel ranks"), ("--pipeline-model-parallel-size", "two pipeline stages")):
    split = ours("mc_test", "multiple_choice", "mc_dev", 1, [flag, "2"], launch=["launch", "--nproc-per-node", "2", "--master-port", "0"],
                 out=f"{work}/mc_test_split.json")
    for metric in ("acc,none", "acc_norm,none"):
        assert split["results"]["mc_test"][metric] == mc["results"]["mc_test"][metric], (what, metric, split["results"], mc["results"])
    for one, two in zip(mc["samples"]["mc_test"], split["samples"]["mc_test"], strict=True):
        assert max(abs(a - b) for a, b in zip(one["loglikelihoods"], two["loglikelihoods"], strict=True)) < 1e-5, (what, one, two)
    print(f"multiple choice over {what}: the scores and log-likelihoods of one rank", flush=True)
print("all checks passed")
