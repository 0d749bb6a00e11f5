// The table of `megatron train`'s flags: each Megatron flag bound to a Config field
// (train_flags.cpp). The command line and YAML recipes are both read through it (arguments.cpp),
// and help prints it (train_help.cpp), so a key means the same thing everywhere.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"

namespace megatron {

// How a flag reads its values. Preset: a switch that sets a string setting to `preset` (a
// deprecated spelling of one value).
enum class FlagKind { Int, Int64, Double, Bool, NegatedBool, String, StringList, IntList, DoubleList, Preset };

struct TrainFlag {
  std::string name;  // without leading dashes
  FlagKind kind;
  void* target;
  std::string help;
  std::string preset = "";  // FlagKind::Preset: the value the switch sets
};

// The flags of `megatron train`, bound to one Config. `--config` and `--model-family` are
// handled before the table because they change what the defaults are.
std::vector<TrainFlag> train_flags(Config& c);

}  // namespace megatron
