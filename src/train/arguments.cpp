// One table binds each Megatron flag to a Config field; the command line and YAML recipes are
// both read through it, so a key means the same thing in either place.
#include "train/arguments.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <cerrno>
#include <limits>
#include <type_traits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

#include "core/errors.h"
#include "model/families.h"
#include "train/megatron_flags.h"
#include "train/train_flags.h"

namespace megatron {
namespace {

const TrainFlag* find_flag(const std::vector<TrainFlag>& flags, std::string name) {
  for (const auto& f : flags) {
    if (f.name == name) return &f;  // Megatron's own underscored spellings (--override-opt_param-scheduler)
  }
  for (auto& ch : name) {
    if (ch == '_') ch = '-';  // recipes may spell keys with underscores
  }
  for (const auto& f : flags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// Levenshtein distance of a and b, or limit + 1 once it must exceed limit (a row's minimum never
// falls in later rows): most flags are far from a typo and are dismissed after a few rows.
size_t edit_distance(const std::string& a, const std::string& b, size_t limit) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    size_t row_min = row[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
      row_min = std::min(row_min, row[j]);
    }
    if (row_min > limit) return limit + 1;
  }
  return std::min(row[b.size()], limit + 1);
}

// The nearest flag Megatron or megatron.cpp knows, by edit distance: catches typos such as
// --num-layer or --micro-batchsize, and says nothing when no flag is close.
std::string suggest(const std::vector<TrainFlag>& flags, const std::string& name) {
  const size_t close_enough = std::max<size_t>(2, name.size() / 5);
  size_t best = std::string::npos;
  std::string best_name;
  auto consider = [&](const std::string& candidate) {
    // The distance is at least the difference in length: a name of garbage (a fuzzer's, a
    // pasted paragraph) is compared with no flag of another length.
    const size_t longer = std::max(name.size(), candidate.size()), shorter = std::min(name.size(), candidate.size());
    if (longer - shorter > close_enough) return;
    const size_t d = edit_distance(name, candidate, std::min(best, close_enough + 1));
    if (d < best) best = d, best_name = candidate;
  };
  for (const auto& f : flags) consider(f.name);
  for (const auto& f : megatron_flags()) consider(f.name);
  return best <= close_enough ? " (did you mean --" + best_name + "?)" : "";
}

template <typename T>
T parse_number(const std::string& where, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  T value{};
  if constexpr (std::is_floating_point_v<T>) {
    value = std::strtod(text.c_str(), &end);
  } else {
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) errno = ERANGE;
    value = static_cast<T>(v);
  }
  if (text.empty() || end == nullptr || *end != '\0' || errno == ERANGE) {
    throw UserError(where + ": expected " + (std::is_floating_point_v<T> ? "a number" : "an integer") +
                    ", got '" + text + "'");
  }
  if constexpr (std::is_floating_point_v<T>) {
    // No flag takes NaN or infinity: a NaN passes every range check after it (comparisons are false).
    if (!std::isfinite(value)) throw UserError(where + ": expected a finite number, got '" + text + "'");
  }
  return value;
}

// A list flag's values, at least one.
template <typename T>
std::vector<T> parse_numbers(const std::string& where, const std::vector<std::string>& values) {
  if (values.empty()) throw UserError(where + ": expects at least one value");
  std::vector<T> numbers;
  for (const std::string& v : values) numbers.push_back(parse_number<T>(where, v));
  return numbers;
}

bool parse_bool(const std::string& where, const std::string& text) {
  if (text == "true" || text == "True" || text == "1" || text == "yes") return true;
  if (text == "false" || text == "False" || text == "0" || text == "no") return false;
  throw UserError(where + ": expected true or false, got '" + text + "'");
}

// Stores one value into the field; `where` names the flag or recipe key for errors.
void assign(const TrainFlag& f, const std::string& where, const std::vector<std::string>& values) {
  auto single = [&]() -> const std::string& {
    if (values.size() != 1) throw UserError(where + ": expects exactly one value");
    return values[0];
  };
  switch (f.kind) {
    case FlagKind::Int: *static_cast<int*>(f.target) = parse_number<int>(where, single()); break;
    case FlagKind::Int64: *static_cast<int64_t*>(f.target) = parse_number<int64_t>(where, single()); break;
    case FlagKind::Double: *static_cast<double*>(f.target) = parse_number<double>(where, single()); break;
    case FlagKind::String: *static_cast<std::string*>(f.target) = single(); break;
    case FlagKind::Bool: *static_cast<bool*>(f.target) = parse_bool(where, single()); break;
    case FlagKind::NegatedBool: *static_cast<bool*>(f.target) = !parse_bool(where, single()); break;
    case FlagKind::Preset:
      if (parse_bool(where, single())) *static_cast<std::string*>(f.target) = f.preset;
      break;
    case FlagKind::StringList:
      if (values.empty()) throw UserError(where + ": expects at least one value");
      *static_cast<std::vector<std::string>*>(f.target) = values;
      break;
    case FlagKind::IntList: *static_cast<std::vector<int>*>(f.target) = parse_numbers<int>(where, values); break;
    case FlagKind::DoubleList: *static_cast<std::vector<double>*>(f.target) = parse_numbers<double>(where, values); break;
  }
}

std::vector<std::string> yaml_values(const YAML::Node& node, const std::string& where) {
  std::vector<std::string> out;
  if (node.IsScalar()) {
    out.push_back(node.Scalar());
  } else if (node.IsSequence()) {
    for (const auto& item : node) {
      if (!item.IsScalar()) throw UserError(where + ": list items must be plain values");
      out.push_back(item.Scalar());
    }
  } else {
    throw UserError(where + ": expected a value or a list of values");
  }
  return out;
}

struct SplitArgs {
  std::string config_path;
  std::string family;
  std::vector<std::pair<std::string, std::vector<std::string>>> flags;  // name -> values, in order
};

// Groups argv into (flag, values) pairs: a flag's values are the following non-flag words.
SplitArgs split_args(const std::vector<std::string>& args) {
  SplitArgs out;
  for (size_t i = 0; i < args.size();) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      throw UserError("unexpected argument '" + a + "': flags start with -- (see megatron train --help)");
    }
    std::string name = a.substr(2);
    std::vector<std::string> values;
    auto eq = name.find('=');
    if (eq != std::string::npos) {
      values.push_back(name.substr(eq + 1));
      name = name.substr(0, eq);
    }
    ++i;
    // A negative number is a value, not a flag.
    while (eq == std::string::npos && i < args.size() &&
           (args[i].rfind("--", 0) != 0 || args[i].size() == 2)) {
      values.push_back(args[i++]);
    }
    if (name == "config" || name == "model-family") {
      if (values.size() != 1) throw UserError("--" + name + ": expects exactly one value");
      (name == "config" ? out.config_path : out.family) = values[0];
    } else {
      out.flags.emplace_back(name, values);
    }
  }
  return out;
}

}  // namespace

Config parse_train_arguments(const std::vector<std::string>& args) {
  Config config;
  auto flags = train_flags(config);
  SplitArgs split = split_args(args);

  YAML::Node recipe;
  if (!split.config_path.empty()) {
    try {
      recipe = YAML::LoadFile(split.config_path);
    } catch (const YAML::BadFile&) {
      throw UserError("--config: cannot read '" + split.config_path + "': check the path");
    } catch (const YAML::Exception& e) {
      throw UserError(split.config_path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
    }
    if (!recipe.IsMap() && !recipe.IsNull()) {
      throw UserError(split.config_path + ": a recipe is a mapping of flag names to values");
    }
    if (recipe.IsMap() && recipe["model-family"] && split.family.empty()) {
      split.family = recipe["model-family"].Scalar();
    }
  }
  if (!split.family.empty()) apply_model_family(split.family, config.model);

  // Every problem of the recipe and the command line is reported at once: porting a launch
  // script should not take one run per flag.
  std::vector<std::string> problems;
  auto take = [&](const std::string& name, const std::string& where, std::vector<std::string> values, bool from_recipe) {
    const TrainFlag* f = find_flag(flags, name);
    if (f != nullptr && (from_recipe || name.find('_') == std::string::npos || f->name == name)) {
      if ((f->kind == FlagKind::Bool || f->kind == FlagKind::NegatedBool || f->kind == FlagKind::Preset) && values.empty()) values = {"true"};
      assign(*f, where, values);
      config.explicit_flags.insert(f->name);
      return;
    }
    // A recipe may spell a key with underscores; the table holds Megatron's dashed names.
    std::string dashed = name;
    if (from_recipe) std::replace(dashed.begin(), dashed.end(), '_', '-');
    if (const MegatronFlag* megatron = find_megatron_flag(dashed)) {
      std::string notice;
      const std::string problem = judge_megatron_flag(*megatron, values, &notice);
      if (!problem.empty()) throw UserError((from_recipe ? where + ": " : std::string()) + problem);
      config.flag_notices.push_back(notice);
      return;
    }
    throw UserError(from_recipe ? where + " is not a known setting" + suggest(flags, dashed)
                                : "unknown flag --" + name + suggest(flags, name) + "; see megatron train --help");
  };
  if (recipe.IsMap()) {
    for (const auto& kv : recipe) {
      const std::string key = kv.first.Scalar();
      const std::string where = split.config_path + ":" + std::to_string(kv.first.Mark().line + 1) + ": key '" + key + "'";
      if (key == "model-family") continue;
      try {
        take(key, where, yaml_values(kv.second, where), true);
      } catch (const UserError& e) {
        problems.push_back(e.what());
      }
    }
  }
  for (const auto& [name, values] : split.flags) {
    try {
      take(name, "--" + name, values, false);
    } catch (const UserError& e) {
      problems.push_back(e.what());
    }
  }
  if (problems.size() == 1) throw UserError(problems[0]);
  if (!problems.empty()) {
    std::string all = std::to_string(problems.size()) + " problems with the flags:";
    for (const auto& p : problems) all += "\n  " + p;
    throw UserError(all);
  }
  if (!config.train.load_hf.empty() && !split.family.empty()) {
    throw UserError("--model-family and --load-hf contradict each other: the architecture comes from the HF config.json");
  }
  return config;
}

}  // namespace megatron
