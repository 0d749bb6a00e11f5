// Benchmark data from local JSONL files, read the way lm-evaluation-harness's tasks read the same
// datasets: each format turns a record into the prompt text (lm-eval's doc_to_text), the answer
// choices (doc_to_choice) and the gold one (doc_to_target), or, for GSM8K, a question and its
// worked answer. `megatron eval --task FILE --task-format F` scores them (eval/multiple_choice.h,
// eval/gsm8k.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::eval {

enum class TaskFormat {
  MultipleChoice,  // {"question", "choices": [...], "answer": index}: the question as the prompt, as is
  Mmlu,            // MMLU's {"question", "choices", "answer": index, "subject"?}: lm-eval's mmlu prompt, choices A-D
  Arc,             // ARC's {"question", "choices": {"text", "label"}, "answerKey"}: "Question: ...\nAnswer:"
  Hellaswag,       // HellaSwag's {"activity_label", "ctx_a", "ctx_b", "endings", "label"}: lm-eval's preprocessing
  Ceval,           // C-Eval's {"question", "A", "B", "C", "D", "answer": letter}: lm-eval's ceval-valid prompt
  Gsm8k,           // GSM8K's {"question", "answer": "... #### 72"}: generate-until, exact match
};

// "multiple_choice", "mmlu", "arc", "hellaswag", "ceval", "gsm8k"; UserError naming --task-format.
TaskFormat parse_task_format(const std::string& name);
std::string task_format_name(TaskFormat format);

// One multiple-choice question as lm-eval asks it: `text` is followed by " " + a choice.
struct ChoiceDoc {
  std::string text;
  std::vector<std::string> choices;
  int64_t gold = 0;
  std::string description;  // put before the few-shot examples (MMLU's and C-Eval's subject line), or ""
};

struct GenerationDoc {
  std::string question;
  std::string answer;  // the reference solution (GSM8K: its last line is "#### <number>")
};

// The records of a JSONL file; `limit` > 0 keeps the first `limit`. UserError naming the file, the
// line and the field on a malformed record (nothing is skipped silently).
std::vector<ChoiceDoc> read_choice_docs(const std::string& path, TaskFormat format, int64_t limit = 0);
std::vector<GenerationDoc> read_generation_docs(const std::string& path, int64_t limit = 0);

// lm-eval's hellaswag preprocess: trimmed, " [title]" as ". ", bracketed tags dropped, double spaces single.
std::string hellaswag_preprocess(const std::string& text);

}  // namespace megatron::eval
