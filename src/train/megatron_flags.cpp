// Looking up and judging the Megatron flags megatron.cpp does not implement (megatron_flags.h);
// the rows are in megatron_flag_table.cpp.
#include "train/megatron_flags.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace megatron {

namespace reason {
const char* const kKernel = "it picks a kernel, fusion or backend; megatron.cpp runs its own kernels for the same math";
const char* const kCommunication = "it tunes how communication is launched or overlapped; megatron.cpp schedules its own";
const char* const kService = "it configures a cluster or monitoring service that megatron.cpp does not use";
const char* const kLogging = "megatron.cpp does not log this (yet); training is unaffected";
const char* const kProfiler = "megatron.cpp's --profile always records with the PyTorch profiler into a Chrome trace";
const char* const kMemory = "it manages PyTorch's caching allocator or Python's garbage collector, which megatron.cpp does not need";
const char* const kDataLoader = "it tunes Python data-loader workers or file mapping; megatron.cpp reads .bin/.idx through its own memory map";
const char* const kCheckpointFormat =
    "it selects or tunes Megatron's checkpoint formats; megatron.cpp writes its own resharding format (docs/checkpoints.md)";
const char* const kLegacy = "it chooses between Megatron's legacy and Core models; megatron.cpp has one (RoPE comes from --position-embedding-type)";
const char* const kAlways = "it is what megatron.cpp always does";
const char* const kInference = "it configures Megatron's inference engine, which training does not run";
const char* const kOtherScript = "it is read by BERT, vision, generation or evaluation scripts, not by GPT training";
const char* const kPaiDefaults = "Pai's SFT padding length; megatron.cpp pads or packs SFT data when preprocessing (megatron preprocess --sft)";
const char* const kLauncher = "each rank's place comes from the launcher's environment (megatron launch or torchrun)";
}  // namespace reason

namespace {

bool parses_as_number(const std::string& text, double* value) {
  if (text.empty()) return false;
  char* end = nullptr;
  *value = std::strtod(text.c_str(), &end);
  return end != nullptr && *end == '\0';
}

// Megatron's default spelled as the script spelled it? Numbers compare by value (1e-5 = 0.00001),
// anything else by text; a list compares word by word.
bool equals_default(const char* megatron_default, const std::vector<std::string>& values) {
  if (megatron_default == nullptr) return false;
  std::vector<std::string> words;
  std::istringstream in(megatron_default);
  for (std::string word; in >> word;) words.push_back(word);
  if (words.empty()) return values.empty() || (values.size() == 1 && values[0].empty());
  if (words.size() != values.size()) return false;
  for (size_t i = 0; i < words.size(); ++i) {
    double a = 0, b = 0;
    const bool same = parses_as_number(words[i], &a) && parses_as_number(values[i], &b) ? a == b : words[i] == values[i];
    if (!same) return false;
  }
  return true;
}

std::string arity_problem(const MegatronFlag& f, const std::vector<std::string>& values) {
  const std::string flag = std::string("--") + f.name;
  switch (f.arity) {
    case MegatronFlag::Arity::None: return "";  // switches are handled by the caller
    case MegatronFlag::Arity::One: return values.size() == 1 ? "" : flag + " expects one value";
    case MegatronFlag::Arity::OneOrMore: return values.empty() ? flag + " expects at least one value" : "";
    case MegatronFlag::Arity::ZeroOrMore: return "";
    case MegatronFlag::Arity::Three: return values.size() == 3 ? "" : flag + " expects three values";
  }
  return "";
}

}  // namespace

const MegatronFlag* find_megatron_flag(const std::string& name) {
  const auto& table = megatron_flags();
  auto it = std::lower_bound(table.begin(), table.end(), name,
                             [](const MegatronFlag& f, const std::string& n) { return std::strcmp(f.name, n.c_str()) < 0; });
  return it != table.end() && name == it->name ? &*it : nullptr;
}

std::string judge_megatron_flag(const MegatronFlag& f, const std::vector<std::string>& values, std::string* notice) {
  const std::string flag = std::string("--") + f.name;
  const std::string origin = f.origin == MegatronFlag::Origin::Pai ? " (a Pai-Megatron-Patch flag)" : "";
  bool unchanged = false;
  if (f.arity == MegatronFlag::Arity::None) {
    // On a command line a switch takes no value; a recipe writes `key: true` or `key: false`.
    if (values.size() > 1 || (values.size() == 1 && values[0] != "true" && values[0] != "false")) {
      return flag + " is a switch and takes no value (got '" + values[0] + "')";
    }
    const bool given = values.empty() || values[0] == "true";
    unchanged = !given || std::strcmp(f.value_when_given, f.megatron_default) == 0;
  } else {
    const std::string problem = arity_problem(f, values);
    if (!problem.empty()) return problem;
    unchanged = equals_default(f.megatron_default, values);
  }
  if (f.fate == MegatronFlag::Fate::Ignored) {
    *notice = flag + origin + " has no effect here: " + f.note;
    return "";
  }
  if (unchanged) {
    *notice = flag + origin + " changes nothing: the value given is Megatron's default and what megatron.cpp does";
    return "";
  }
  return flag + origin + " is not implemented yet" + (f.note != nullptr ? std::string(": ") + f.note : std::string());
}

}  // namespace megatron
