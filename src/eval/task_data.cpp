#include "eval/task_data.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/errors.h"
#include "core/text.h"

namespace megatron::eval {
namespace {

using json = nlohmann::json;

// Each record of a JSONL file (blank lines skipped), with "FILE line N" for messages.
template <typename Visit>
void for_each_record(const std::string& path, int64_t limit, Visit visit) {
  std::ifstream in(path);
  if (!in) throw UserError(path + ": cannot read the file");
  std::string line;
  int64_t number = 0, records = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (limit > 0 && records >= limit) break;
    const std::string where = path + " line " + std::to_string(number);
    json record;
    try {
      record = json::parse(line);
    } catch (const json::parse_error& e) {
      throw UserError(where + ": not a JSON record (" + e.what() + ")");
    }
    if (!record.is_object()) throw UserError(where + ": expected a JSON object");
    visit(record, where);
    ++records;
  }
  if (records == 0) throw UserError(path + ": no records (one JSON object a line)");
}

const json& field(const json& record, const std::string& name, const std::string& where) {
  if (!record.contains(name)) throw UserError(where + ": the record has no \"" + name + "\" field");
  return record[name];
}

std::string text_field(const json& record, const std::string& name, const std::string& where) {
  const json& value = field(record, name, where);
  if (!value.is_string()) throw UserError(where + ": \"" + name + "\" must be a text, got " + value.dump());
  return value.get<std::string>();
}

std::vector<std::string> text_list(const json& value, const std::string& name, const std::string& where) {
  if (!value.is_array() || value.empty()) throw UserError(where + ": \"" + name + "\" must be a non-empty list of texts");
  std::vector<std::string> out;
  for (const json& v : value) {
    if (!v.is_string()) throw UserError(where + ": \"" + name + "\" must hold texts, got " + v.dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

// An answer given as an index (a number or a digit string, as HellaSwag's "label").
int64_t index_field(const json& record, const std::string& name, int64_t choices, const std::string& where) {
  const json& value = field(record, name, where);
  int64_t index = -1;
  if (value.is_number_integer()) {
    index = value.get<int64_t>();
  } else if (value.is_string() && !value.get<std::string>().empty() &&
             value.get<std::string>().find_first_not_of("0123456789") == std::string::npos) {
    index = std::stoll(value.get<std::string>());
  } else {
    throw UserError(where + ": \"" + name + "\" must be the index of the right choice, got " + value.dump());
  }
  if (index < 0 || index >= choices) {
    throw UserError(where + ": \"" + name + "\" is " + std::to_string(index) + ", not one of the " + std::to_string(choices) +
                    " choices");
  }
  return index;
}

// Python's str.capitalize for ASCII letters: the first upper case, the rest lower.
std::string capitalize(std::string s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) s[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c));
  }
  return s;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

const std::vector<std::string> kLetters = {"A", "B", "C", "D"};

ChoiceDoc choice_doc(const json& r, TaskFormat format, const std::string& where) {
  ChoiceDoc doc;
  switch (format) {
    case TaskFormat::MultipleChoice: {
      doc.text = text_field(r, "question", where);
      doc.choices = text_list(field(r, "choices", where), "choices", where);
      doc.gold = index_field(r, "answer", int64_t(doc.choices.size()), where);
      break;
    }
    case TaskFormat::Mmlu: {
      const std::vector<std::string> options = text_list(field(r, "choices", where), "choices", where);
      if (options.size() != 4) throw UserError(where + ": MMLU's \"choices\" holds 4 answers, got " + std::to_string(options.size()));
      doc.text = strip_whitespace(text_field(r, "question", where));
      for (size_t i = 0; i < 4; ++i) doc.text += "\n" + kLetters[i] + ". " + options[i];
      doc.text += "\nAnswer:";
      doc.choices = kLetters;
      doc.gold = index_field(r, "answer", 4, where);
      if (r.contains("subject")) {
        doc.description = "The following are multiple choice questions (with answers) about " +
                          replace_all(text_field(r, "subject", where), "_", " ") + ".\n\n";
      }
      break;
    }
    case TaskFormat::Arc: {
      const json& choices = field(r, "choices", where);
      if (!choices.is_object()) throw UserError(where + ": ARC's \"choices\" is {\"text\": [...], \"label\": [...]}");
      doc.text = "Question: " + text_field(r, "question", where) + "\nAnswer:";
      doc.choices = text_list(field(choices, "text", where), "choices.text", where);
      const std::vector<std::string> labels = text_list(field(choices, "label", where), "choices.label", where);
      const std::string key = text_field(r, "answerKey", where);
      const auto at = std::find(labels.begin(), labels.end(), key);
      if (at == labels.end() || labels.size() != doc.choices.size()) {
        throw UserError(where + ": \"answerKey\" " + key + " is not one of \"choices.label\" (or the labels and texts differ in number)");
      }
      doc.gold = at - labels.begin();
      break;
    }
    case TaskFormat::Hellaswag: {
      const std::string context = text_field(r, "ctx_a", where) + " " + capitalize(text_field(r, "ctx_b", where));
      doc.text = hellaswag_preprocess(text_field(r, "activity_label", where) + ": " + context);
      for (const std::string& ending : text_list(field(r, "endings", where), "endings", where)) {
        doc.choices.push_back(hellaswag_preprocess(ending));
      }
      doc.gold = index_field(r, "label", int64_t(doc.choices.size()), where);
      break;
    }
    case TaskFormat::Ceval: {
      doc.text = strip_whitespace(text_field(r, "question", where));
      for (const std::string& letter : kLetters) doc.text += "\n" + letter + ". " + text_field(r, letter, where);
      doc.text += "\n答案：";
      doc.choices = kLetters;
      const std::string answer = text_field(r, "answer", where);
      const auto at = std::find(kLetters.begin(), kLetters.end(), answer);
      if (at == kLetters.end()) throw UserError(where + ": C-Eval's \"answer\" is one of A, B, C, D, got \"" + answer + "\"");
      doc.gold = at - kLetters.begin();
      break;
    }
    case TaskFormat::Gsm8k:
      throw UserError("--task-format gsm8k is scored by generation, not as multiple choice");
  }
  return doc;
}

}  // namespace

TaskFormat parse_task_format(const std::string& name) {
  for (TaskFormat f : {TaskFormat::MultipleChoice, TaskFormat::Mmlu, TaskFormat::Arc, TaskFormat::Hellaswag, TaskFormat::Ceval,
                       TaskFormat::Gsm8k}) {
    if (task_format_name(f) == name) return f;
  }
  throw UserError("--task-format: unknown format \"" + name + "\"; one of multiple_choice, mmlu, arc, hellaswag, ceval, gsm8k");
}

std::string task_format_name(TaskFormat format) {
  switch (format) {
    case TaskFormat::MultipleChoice: return "multiple_choice";
    case TaskFormat::Mmlu: return "mmlu";
    case TaskFormat::Arc: return "arc";
    case TaskFormat::Hellaswag: return "hellaswag";
    case TaskFormat::Ceval: return "ceval";
    case TaskFormat::Gsm8k: return "gsm8k";
  }
  return "?";
}

std::string hellaswag_preprocess(const std::string& text) {
  std::string out = replace_all(strip_whitespace(text), " [title]", ". ");
  static const std::regex bracketed("\\[.*?\\]");
  out = std::regex_replace(out, bracketed, "");
  // Python's str.replace("  ", " "): one pass, left to right, no overlaps.
  std::string single;
  for (size_t i = 0; i < out.size(); ++i) {
    single += out[i];
    if (out[i] == ' ' && i + 1 < out.size() && out[i + 1] == ' ') ++i;
  }
  return single;
}

std::vector<ChoiceDoc> read_choice_docs(const std::string& path, TaskFormat format, int64_t limit) {
  std::vector<ChoiceDoc> docs;
  for_each_record(path, limit, [&](const json& r, const std::string& where) { docs.push_back(choice_doc(r, format, where)); });
  return docs;
}

std::vector<GenerationDoc> read_generation_docs(const std::string& path, int64_t limit) {
  std::vector<GenerationDoc> docs;
  for_each_record(path, limit, [&](const json& r, const std::string& where) {
    docs.push_back({text_field(r, "question", where), text_field(r, "answer", where)});
  });
  return docs;
}

}  // namespace megatron::eval
