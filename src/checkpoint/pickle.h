// A reader of Python pickles (protocols 2 to 5) that executes nothing: classes and functions stay
// names (module, qualname), and building an object records the call and its state. Enough for
// what Megatron checkpoints hold: torch.save's data.pkl (dicts, OrderedDicts, argparse.Namespace,
// tensors as torch._utils._rebuild_tensor_v2 over persistent storages) and PyTorch distributed
// checkpointing's .metadata (dataclasses, torch.Size, dtypes).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megatron::pickle {

struct Value;
using ValuePtr = std::shared_ptr<const Value>;

struct Value {
  enum class Kind {
    None,
    Bool,
    Int,
    Float,
    String,      // str, utf-8
    Bytes,       // bytes and bytearray
    List,        // list, set and frozenset (items)
    Tuple,       // items
    Dict,        // entries, in insertion order
    Global,      // a class or function by name: module, name
    Object,      // callable(args...) then built with state (REDUCE / NEWOBJ / BUILD)
    Persistent,  // a persistent id (torch.save's storages): items[0] is the id
  };
  Kind kind = Kind::None;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string text;                                // String, Bytes; Global: module
  std::string name;                                // Global: qualified name
  std::vector<ValuePtr> items;                     // List, Tuple, Persistent; Object: the call's arguments
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;  // Dict; Object: the dict items set on it (OrderedDict)
  ValuePtr callable;                               // Object: the Global called
  ValuePtr state;                                  // Object: what BUILD set (usually a Dict)
  std::vector<ValuePtr> appended;                  // Object: items appended to it (list subclasses)

  bool is_global(std::string_view module, std::string_view qualname) const {
    return kind == Kind::Global && text == module && name == qualname;
  }
  // An Object made by calling Global module.qualname.
  bool is_object_of(std::string_view module, std::string_view qualname) const {
    return kind == Kind::Object && callable && callable->is_global(module, qualname);
  }
  // Dict (or Object state / dict items) lookup by string key; nullptr when absent.
  const Value* get(std::string_view key) const;
  // get() that throws std::runtime_error naming `key` when absent.
  const Value& at(std::string_view key) const;
  // The Int, or a Bool as 0/1; throws std::runtime_error otherwise.
  int64_t as_int() const;
  // Int or Float as a double.
  double as_number() const;
  // One line describing the value's kind (for error messages).
  std::string describe() const;
};

// How a persistent id becomes a value (torch.save: the storage it names). Without one, the id is
// kept as a Persistent value.
using PersistentLoad = std::function<ValuePtr(const ValuePtr& id)>;

// Parses one pickle. Throws std::runtime_error naming the opcode and offset on anything it does
// not understand (an opcode outside protocols 2-5's, a truncated stream).
ValuePtr parse(std::string_view bytes, const PersistentLoad& persistent_load = {});

}  // namespace megatron::pickle
