// `megatron train`'s flags and YAML recipe as the command reads them: the input is a recipe, a
// line "#### flags ####", then one argument per line. Parsed (Megatron's flag table, values,
// recipe keys and types), then finalized for one process (derived sizes, contradictions,
// ranges) -- the checks that must name the flag or recipe line for every bad value.
#include <fstream>

#include "core/errors.h"
#include "fuzz_target.h"
#include "train/arguments.h"

MEGATRON_FUZZ_TARGET(train_flags) {
  const auto [recipe, flags] = megatron::fuzz::split(megatron::fuzz::as_text(data, size), "\n#### flags ####\n");
  const std::string path = megatron::fuzz::scratch_file("recipe.yaml");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << recipe;
  std::vector<std::string> args = {"--config", path};
  std::string_view rest = flags;
  while (!rest.empty() && args.size() < 512) {
    const auto [arg, after] = megatron::fuzz::split(rest, "\n");
    args.emplace_back(arg);
    rest = after;
  }
  try {
    megatron::Config config = megatron::parse_train_arguments(args);
    megatron::finalize_config(config, 1);
  } catch (const megatron::UserError& e) {
    megatron::fuzz::rejected(e);
  }
}
