// Reading tokenizer.json (+ tokenizer_config.json) into an HfTokenizer. Every problem with the
// files is a UserError naming the file and saying what to do.
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "core/files.h"
#include "core/json_text.h"
#include "tokenizer/hf_tokenizer.h"

namespace megatron::tok {

namespace {

using nlohmann::json;

json parse_json(const std::string& path, const std::string& what) {
  try {
    const std::string text = read_file(path);
    check_json_depth(text, path);
    return json::parse(text);
  } catch (const json::exception& e) {  // a syntax error, or a number past double's range
    throw UserError(path + ": not valid JSON (" + e.what() + "); expected " + what +
                    ". Re-download or re-save the tokenizer (e.g. AutoTokenizer.save_pretrained)");
  }
}

// bos_token / eos_token in tokenizer_config.json: a string, an AddedToken dict, or null.
std::optional<std::string> special_token_name(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) {
    return v.at("content").get<std::string>();
  }
  return std::nullopt;
}

std::vector<int64_t> ids_of_special(const json& special_tokens, const std::string& name) {
  if (!special_tokens.contains(name)) {
    throw std::invalid_argument("TemplateProcessing uses special token '" + name +
                                "' missing from its special_tokens");
  }
  std::vector<int64_t> ids;
  for (const json& id : special_tokens.at(name).at("ids")) ids.push_back(json_to_int64(id, "special token '" + name + "''s id"));
  return ids;
}

// Reduces a post-processor to the ids it puts before and after a single sequence. Sequences of
// processors wrap in order: a later processor's prefix comes first.
void read_post_processor(const json& j, std::vector<int64_t>* prefix, std::vector<int64_t>* suffix) {
  if (j.is_null()) return;
  const std::string type = j.at("type").get<std::string>();
  std::vector<int64_t> pre, post;
  if (type == "ByteLevel") {
    return;  // only adjusts offsets
  } else if (type == "Sequence") {
    for (const json& p : j.at("processors")) read_post_processor(p, prefix, suffix);
    return;
  } else if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        auto ids = ids_of_special(j.at("special_tokens"),
                                  item.at("SpecialToken").at("id").get<std::string>());
        (seen_sequence ? post : pre).insert((seen_sequence ? post : pre).end(), ids.begin(), ids.end());
      }
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    pre.push_back(json_to_int64(j.at("cls").at(1), "post_processor.cls's id"));
    post.push_back(json_to_int64(j.at("sep").at(1), "post_processor.sep's id"));
  } else {
    throw std::invalid_argument("post_processor type '" + type +
                                "' is not supported (supported: TemplateProcessing, ByteLevel, "
                                "BertProcessing, RobertaProcessing, Sequence)");
  }
  prefix->insert(prefix->begin(), pre.begin(), pre.end());
  suffix->insert(suffix->end(), post.begin(), post.end());
}

std::unique_ptr<BpeModel> read_bpe(const json& model, bool byte_level) {
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") {
    throw UserError("model type '" + type +
                    "' is not supported; megatron.cpp reads byte-level and SentencePiece-style "
                    "BPE tokenizer.json files (GPT-2, Llama 2/3, Qwen). For a SentencePiece "
                    "Unigram model use --tokenizer-type SentencePieceTokenizer with its .model file");
  }
  auto non_empty = [&](const char* key) {
    return model.contains(key) && model.at(key).is_string() && !model.at(key).get<std::string>().empty();
  };
  if (non_empty("continuing_subword_prefix") || non_empty("end_of_word_suffix")) {
    throw std::invalid_argument("BPE continuing_subword_prefix / end_of_word_suffix are not supported");
  }
  if (model.contains("dropout") && model.at("dropout").is_number() &&
      model.at("dropout").get<double>() > 0) {
    throw std::invalid_argument("BPE dropout is a training-time option and is not supported");
  }
  BpeOptions options;
  options.byte_level = byte_level;
  options.ignore_merges = model.value("ignore_merges", false);
  options.byte_fallback = model.value("byte_fallback", false);
  options.fuse_unk = model.value("fuse_unk", false);
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    options.unk_token = model.at("unk_token").get<std::string>();
  }
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(model.at("vocab").size());
  for (const auto& [token, id] : model.at("vocab").items()) vocab.emplace_back(token, json_to_int64(id, "the id of vocabulary entry '" + token + "'"));
  std::vector<std::pair<std::string, std::string>> merges;
  const json& merges_json = model.at("merges");
  merges.reserve(merges_json.size());
  for (const json& m : merges_json) {
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        throw std::invalid_argument("merge \"" + s + "\" is not two tokens separated by one space");
      }
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else {
      merges.emplace_back(m.at(0).get<std::string>(), m.at(1).get<std::string>());
    }
  }
  return std::make_unique<BpeModel>(vocab, merges, options);
}

}  // namespace

std::unique_ptr<HfTokenizer> load_tokenizer_json(const std::string& path) {
  std::string file = path;
  if (is_directory(path)) {
    file = path + "/tokenizer.json";
    if (!is_file(file)) {
      throw UserError("--tokenizer-model " + path +
                      ": the directory has no tokenizer.json; pass a directory saved by "
                      "HF save_pretrained (with tokenizer.json) or the tokenizer.json file itself");
    }
  } else if (!is_file(path)) {
    throw UserError("--tokenizer-model " + path +
                    ": no such file or directory; pass a directory holding tokenizer.json or the "
                    "tokenizer.json file itself");
  }
  // tokenizer_config.json sits next to tokenizer.json, whichever of the two paths was given.
  const size_t slash = file.find_last_of('/');
  const std::string config_file =
      (slash == std::string::npos ? std::string() : file.substr(0, slash + 1)) + "tokenizer_config.json";

  json j = parse_json(file, "a HF tokenizers tokenizer.json");
  HfParts parts;
  try {
    if (!j.is_object() || !j.contains("model")) {
      throw UserError("has no \"model\" entry; it is not a HF tokenizers tokenizer.json");
    }
    parts.normalizer = Normalizer::from_json(j.value("normalizer", json()));
    parts.pre_tokenizer = PreTokenizer::from_json(j.value("pre_tokenizer", json()));
    bool byte_level = parts.pre_tokenizer && parts.pre_tokenizer->byte_level();
    parts.model = read_bpe(j.at("model"), byte_level);
    parts.decoder = Decoder::from_json(j.value("decoder", json()));
    read_post_processor(j.value("post_processor", json()), &parts.prefix_ids, &parts.suffix_ids);
    for (const json& t : j.value("added_tokens", json::array())) {
      AddedToken a;
      a.id = json_to_int64(t.at("id"), "an added token's id");
      a.content = t.at("content").get<std::string>();
      a.single_word = t.value("single_word", false);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.normalized = t.value("normalized", false);
      a.special = t.value("special", false);
      parts.added_tokens.push_back(std::move(a));
    }
  } catch (const UserError& e) {
    throw UserError(file + ": " + e.what());
  } catch (const std::exception& e) {
    // json type/key errors and unsupported components.
    throw UserError(file + ": " + e.what() +
                    ". megatron.cpp supports BPE tokenizer.json files as written by HF tokenizers "
                    "(GPT-2, Llama 2/3, Qwen2/3); convert others with HF or use another --tokenizer-type");
  }

  // Ids of named tokens: added tokens first, then the model's vocabulary, as HF.
  auto lookup = [&parts](const std::string& name) -> std::optional<int64_t> {
    for (const AddedToken& a : parts.added_tokens) {
      if (a.content == name) return a.id;
    }
    int64_t id = parts.model->token_to_id(name);
    return id >= 0 ? std::optional<int64_t>(id) : std::nullopt;
  };
  if (is_file(config_file)) {
    try {
      json config = parse_json(config_file, "a HF tokenizer_config.json");
      if (auto name = special_token_name(config, "bos_token")) parts.bos = lookup(*name);
      if (auto name = special_token_name(config, "eos_token")) parts.eos = lookup(*name);
      // transformers rebuilds the post-processor as [BOS] $A [EOS] when the config sets either flag.
      if (config.contains("add_bos_token") || config.contains("add_eos_token")) {
        parts.prefix_ids.clear();
        parts.suffix_ids.clear();
        if (config.value("add_bos_token", false) && parts.bos) parts.prefix_ids.push_back(*parts.bos);
        if (config.value("add_eos_token", false) && parts.eos) parts.suffix_ids.push_back(*parts.eos);
      }
    } catch (const json::exception& e) {  // a field of the wrong type
      throw UserError(config_file + ": " + e.what() + " (bos_token / eos_token: a string, an AddedToken object or null; "
                      "add_bos_token / add_eos_token: true or false)");
    }
  } else {
    // Without tokenizer_config.json: BOS is what the post-processor prepends; EOS the first
    // well-known end-of-text token the vocabulary has.
    if (parts.prefix_ids.size() == 1) parts.bos = parts.prefix_ids[0];
    for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>"}) {
      if ((parts.eos = lookup(name))) break;
    }
  }
  return std::make_unique<HfTokenizer>(std::move(parts));
}

}  // namespace megatron::tok
