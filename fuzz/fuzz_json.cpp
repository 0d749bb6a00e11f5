// JSON text as every reader parses it (config.json, tokenizer.json, state.json, safetensors
// headers, JSONL lines): the nesting bound first, then nlohmann's parser.
#include "core/errors.h"
#include "core/json_text.h"
#include "fuzz_target.h"

MEGATRON_FUZZ_TARGET(json) {
  try {
    const nlohmann::json j = megatron::parse_json_text(megatron::fuzz::as_text(data, size), "fuzz.json");
    (void)j.dump();
  } catch (const megatron::UserError&) {
  }
}
