// The flags of Megatron-LM's `arguments.py` and Pai-Megatron-Patch's `arguments.py` that
// `megatron train` does not implement, each with what happens when a launch script gives it:
//  - Ignored: accepted with a one-line notice, because it has no meaning here (a kernel choice,
//    a logging service, a checkpoint-format knob, ...);
//  - NotYet: refused with "not implemented yet" and what to use instead, unless the script gives
//    Megatron's own default value, which changes nothing (then a notice).
// The flags megatron.cpp implements are in train/train_flags.cpp's table; together the two cover
// every flag of both parsers (scripts/megatron_flags_check.py lists any a newer Megatron adds).
#pragma once

#include <string>
#include <vector>

namespace megatron {

struct MegatronFlag {
  enum class Arity { None, One, OneOrMore, ZeroOrMore, Three };  // None: a switch
  enum class Fate { Ignored, NotYet };
  enum class Origin { MegatronLm, Pai };
  const char* name;              // without the leading dashes
  Arity arity;
  const char* megatron_default;  // as text; nullptr for Python's None (any value is a change)
  const char* value_when_given;  // switches: what giving the flag sets, "true" or "false"
  Fate fate;
  const char* note;              // Ignored: why; NotYet: what to use instead (may be nullptr)
  Origin origin;
};

// Every flag of the table, sorted by name.
const std::vector<MegatronFlag>& megatron_flags();
const MegatronFlag* find_megatron_flag(const std::string& name);

// Why an Ignored flag has no effect here: the notes the table's rows share.
namespace reason {
extern const char* const kKernel;
extern const char* const kCommunication;
extern const char* const kService;
extern const char* const kLogging;
extern const char* const kProfiler;
extern const char* const kMemory;
extern const char* const kDataLoader;
extern const char* const kCheckpointFormat;
extern const char* const kLegacy;
extern const char* const kAlways;
extern const char* const kInference;
extern const char* const kOtherScript;
extern const char* const kPaiDefaults;
extern const char* const kLauncher;
}  // namespace reason

// What giving `flag` with `values` means here: "" when it leaves Megatron's default unchanged (or
// is ignored), else the problem to report. `notice` receives the line to print when accepted.
// `values` are the words after the flag on the command line (or a recipe key's values).
std::string judge_megatron_flag(const MegatronFlag& flag, const std::vector<std::string>& values, std::string* notice);

}  // namespace megatron
