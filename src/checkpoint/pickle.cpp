#include "checkpoint/pickle.h"

#include <cstring>
#include <stdexcept>

namespace megatron::pickle {
namespace {

using Mutable = std::shared_ptr<Value>;

Mutable make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

class Parser {
 public:
  Parser(std::string_view bytes, const PersistentLoad& persistent_load) : in_(bytes), persistent_load_(persistent_load) {}

  ValuePtr run() {
    while (true) {
      const size_t at = pos_;
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;          // PROTO
        case 0x95: take(8); break;         // FRAME: framing only
        case '.': return pop(at, op);      // STOP
        case '(': marks_.push_back(stack_.size()); break;
        case '}': push(make(Value::Kind::Dict)); break;
        case ']': push(make(Value::Kind::List)); break;
        case ')': push(make(Value::Kind::Tuple)); break;
        case 0x8f: push(make(Value::Kind::List)); break;  // EMPTY_SET: a set is kept as its items
        case 0x85: case 0x86: case 0x87: {                 // TUPLE1..3
          auto t = make(Value::Kind::Tuple);
          const size_t n = op - 0x84;
          need(n, at, op);
          t->items.assign(stack_.end() - long(n), stack_.end());
          stack_.resize(stack_.size() - n);
          push(t);
          break;
        }
        case 't': {  // TUPLE
          auto t = make(Value::Kind::Tuple);
          t->items = pop_to_mark(at, op);
          push(t);
          break;
        }
        case 0x91: {  // FROZENSET
          auto t = make(Value::Kind::List);
          t->items = pop_to_mark(at, op);
          push(t);
          break;
        }
        case 'q': memoize(byte()); break;          // BINPUT
        case 'r': memoize(uint32()); break;        // LONG_BINPUT
        case 0x94: memoize(memo_.size()); break;   // MEMOIZE
        case 'h': push(recall(byte(), at, op)); break;    // BINGET
        case 'j': push(recall(uint32(), at, op)); break;  // LONG_BINGET
        case 0x8c: push(string(Value::Kind::String, byte())); break;     // SHORT_BINUNICODE
        case 'X': push(string(Value::Kind::String, uint32())); break;    // BINUNICODE
        case 0x8d: push(string(Value::Kind::String, uint64())); break;   // BINUNICODE8
        case 'C': push(string(Value::Kind::Bytes, byte())); break;       // SHORT_BINBYTES
        case 'B': push(string(Value::Kind::Bytes, uint32())); break;     // BINBYTES
        case 0x8e: case 0x96: push(string(Value::Kind::Bytes, uint64())); break;  // BINBYTES8, BYTEARRAY8
        case 'J': { int32_t v; std::memcpy(&v, take(4), 4); push(integer(v)); break; }  // BININT
        case 'K': push(integer(byte())); break;                                         // BININT1
        case 'M': { uint16_t v; std::memcpy(&v, take(2), 2); push(integer(v)); break; } // BININT2
        case 0x8a: push(long_integer(byte(), at, op)); break;   // LONG1
        case 0x8b: push(long_integer(uint32(), at, op)); break; // LONG4
        case 'G': {  // BINFLOAT, big-endian
          const char* p = take(8);
          uint64_t bits = 0;
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | uint8_t(p[i]);
          auto v = make(Value::Kind::Float);
          std::memcpy(&v->number, &bits, 8);
          push(v);
          break;
        }
        case 0x88: case 0x89: {  // NEWTRUE, NEWFALSE
          auto v = make(Value::Kind::Bool);
          v->boolean = op == 0x88;
          push(v);
          break;
        }
        case 'N': push(make(Value::Kind::None)); break;
        case 'c': {  // GLOBAL module\nname\n
          const std::string module = line(), name = line();
          push(global(module, name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const Mutable name = pop(at, op), module = pop(at, op);
          push(global(module->text, name->text));
          break;
        }
        case 'R': {  // REDUCE
          const Mutable args = pop(at, op), callable = pop(at, op);
          push(call(callable, args));
          break;
        }
        case 0x81: {  // NEWOBJ
          const Mutable args = pop(at, op), cls = pop(at, op);
          push(call(cls, args));
          break;
        }
        case 0x92: {  // NEWOBJ_EX: the keyword arguments are dropped
          pop(at, op);
          const Mutable args = pop(at, op), cls = pop(at, op);
          push(call(cls, args));
          break;
        }
        case 'b': {  // BUILD
          const Mutable state = pop(at, op);
          need(1, at, op);
          stack_.back()->state = state;
          break;
        }
        case 's': {  // SETITEM
          const Mutable value = pop(at, op), key = pop(at, op);
          need(1, at, op);
          stack_.back()->entries.emplace_back(key, value);
          break;
        }
        case 'u': {  // SETITEMS
          const std::vector<ValuePtr> kv = pop_to_mark(at, op);
          need(1, at, op);
          for (size_t i = 0; i + 1 < kv.size(); i += 2) stack_.back()->entries.emplace_back(kv[i], kv[i + 1]);
          break;
        }
        case 'a': {  // APPEND
          const Mutable item = pop(at, op);
          need(1, at, op);
          append(*stack_.back(), {item});
          break;
        }
        case 'e': case 0x90: {  // APPENDS, ADDITEMS
          const std::vector<ValuePtr> items = pop_to_mark(at, op);
          need(1, at, op);
          append(*stack_.back(), items);
          break;
        }
        case 'Q': {  // BINPERSID
          const Mutable id = pop(at, op);
          if (persistent_load_) {
            auto loaded = std::const_pointer_cast<Value>(persistent_load_(id));
            push(loaded);
          } else {
            auto p = make(Value::Kind::Persistent);
            p->items = {id};
            push(p);
          }
          break;
        }
        default:
          fail(at, op, "an opcode this reader does not know (pickle protocols 2 to 5 are read)");
      }
    }
  }

 private:
  [[noreturn]] void fail(size_t at, uint8_t op, const std::string& what) const {
    char where[64];
    std::snprintf(where, sizeof(where), "pickle: opcode 0x%02x at byte %zu: ", op, at);
    throw std::runtime_error(where + what);
  }
  const char* take(size_t n) {
    if (pos_ + n > in_.size()) throw std::runtime_error("pickle: truncated (needs " + std::to_string(n) + " bytes at byte " + std::to_string(pos_) + ")");
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint8_t byte() { return uint8_t(*take(1)); }
  uint32_t uint32() { uint32_t v; std::memcpy(&v, take(4), 4); return v; }
  uint64_t uint64() { uint64_t v; std::memcpy(&v, take(8), 8); return v; }
  std::string line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) throw std::runtime_error("pickle: truncated GLOBAL at byte " + std::to_string(pos_));
    std::string s(in_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  Mutable string(Value::Kind kind, uint64_t n) {
    auto v = make(kind);
    v->text.assign(take(n), n);
    return v;
  }
  static Mutable integer(int64_t i) {
    auto v = make(Value::Kind::Int);
    v->integer = i;
    return v;
  }
  Mutable long_integer(uint64_t n, size_t at, uint8_t op) {
    if (n > 8) fail(at, op, "an integer wider than 64 bits");
    const char* p = take(n);
    uint64_t bits = 0;
    for (size_t i = 0; i < n; ++i) bits |= uint64_t(uint8_t(p[i])) << (8 * i);
    if (n > 0 && n < 8 && (uint8_t(p[n - 1]) & 0x80)) bits |= ~uint64_t(0) << (8 * n);  // sign-extend
    return integer(int64_t(bits));
  }
  static Mutable global(const std::string& module, const std::string& name) {
    auto g = make(Value::Kind::Global);
    g->text = module;
    g->name = name;
    return g;
  }
  // What calling `callable` with `args` makes. A few builtins become the plain values they stand
  // for; anything else stays a record of the call.
  static Mutable call(const Mutable& callable, const Mutable& args) {
    if (callable->is_global("collections", "OrderedDict") && args->items.empty()) return make(Value::Kind::Dict);
    if (callable->is_global("torch", "Size") && args->items.size() == 1) {
      auto t = make(Value::Kind::Tuple);
      t->items = args->items[0]->items;
      return t;
    }
    // Protocol 2's sets: set([items]), kept as their items as EMPTY_SET's are.
    for (const char* module : {"builtins", "__builtin__"}) {
      if ((callable->is_global(module, "set") || callable->is_global(module, "frozenset")) && args->items.size() == 1) {
        auto l = make(Value::Kind::List);
        l->items = args->items[0]->items;
        return l;
      }
    }
    if (callable->is_global("_codecs", "encode") && !args->items.empty()) {
      // Protocol 2's bytes: the text of latin-1 code points, one byte each.
      auto b = make(Value::Kind::Bytes);
      const std::string& s = args->items[0]->text;
      for (size_t i = 0; i < s.size(); ++i) {
        const uint8_t c = uint8_t(s[i]);
        if (c < 0x80) {
          b->text += char(c);
        } else if (i + 1 < s.size()) {
          b->text += char(((c & 0x1f) << 6) | (uint8_t(s[++i]) & 0x3f));
        }
      }
      return b;
    }
    auto o = make(Value::Kind::Object);
    o->callable = callable;
    o->items = args->items;
    return o;
  }
  static void append(Value& target, const std::vector<ValuePtr>& items) {
    auto& into = target.kind == Value::Kind::Object ? target.appended : target.items;
    into.insert(into.end(), items.begin(), items.end());
  }
  void push(Mutable v) { stack_.push_back(std::move(v)); }
  void need(size_t n, size_t at, uint8_t op) const {
    if (stack_.size() < n) fail(at, op, "the stack is shorter than the opcode needs");
  }
  Mutable pop(size_t at, uint8_t op) {
    need(1, at, op);
    Mutable v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::vector<ValuePtr> pop_to_mark(size_t at, uint8_t op) {
    if (marks_.empty()) fail(at, op, "no MARK before it");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> items(stack_.begin() + long(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  void memoize(size_t index) {
    if (stack_.empty()) throw std::runtime_error("pickle: memoizing an empty stack at byte " + std::to_string(pos_));
    if (memo_.size() <= index) memo_.resize(index + 1);
    memo_[index] = stack_.back();
  }
  Mutable recall(size_t index, size_t at, uint8_t op) {
    if (index >= memo_.size() || !memo_[index]) fail(at, op, "a memo entry never stored (" + std::to_string(index) + ")");
    return memo_[index];
  }

  std::string_view in_;
  size_t pos_ = 0;
  const PersistentLoad& persistent_load_;
  std::vector<Mutable> stack_;
  std::vector<size_t> marks_;
  std::vector<Mutable> memo_;
};

}  // namespace

const Value* Value::get(std::string_view key) const {
  const auto* source = &entries;
  if (kind == Kind::Object && state) {
    if (state->kind == Kind::Dict) source = &state->entries;
    // Objects with __slots__ pickle their state as (dict or None, slots dict).
    if (state->kind == Kind::Tuple && state->items.size() == 2) {
      for (const auto& part : state->items) {
        if (part->kind != Kind::Dict) continue;
        for (const auto& [k, v] : part->entries) {
          if (k->kind == Kind::String && k->text == key) return v.get();
        }
      }
    }
  }
  for (const auto& [k, v] : *source) {
    if (k->kind == Kind::String && k->text == key) return v.get();
  }
  if (kind == Kind::Object) {  // dict items set on the object itself
    for (const auto& [k, v] : entries) {
      if (k->kind == Kind::String && k->text == key) return v.get();
    }
  }
  return nullptr;
}

const Value& Value::at(std::string_view key) const {
  const Value* v = get(key);
  if (v == nullptr) throw std::runtime_error("pickle: no '" + std::string(key) + "' in " + describe());
  return *v;
}

int64_t Value::as_int() const {
  if (kind == Kind::Int) return integer;
  if (kind == Kind::Bool) return boolean ? 1 : 0;
  throw std::runtime_error("pickle: expected an integer, found " + describe());
}

double Value::as_number() const {
  if (kind == Kind::Float) return number;
  return double(as_int());
}

std::string Value::describe() const {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return boolean ? "True" : "False";
    case Kind::Int: return "int " + std::to_string(integer);
    case Kind::Float: return "float " + std::to_string(number);
    case Kind::String: return "str '" + text.substr(0, 40) + "'";
    case Kind::Bytes: return "bytes (" + std::to_string(text.size()) + ")";
    case Kind::List: return "list of " + std::to_string(items.size());
    case Kind::Tuple: return "tuple of " + std::to_string(items.size());
    case Kind::Dict: return "dict of " + std::to_string(entries.size());
    case Kind::Global: return "global " + text + "." + name;
    case Kind::Object: return "object " + (callable ? callable->text + "." + callable->name : std::string("?"));
    case Kind::Persistent: return "persistent id";
  }
  return "?";
}

ValuePtr parse(std::string_view bytes, const PersistentLoad& persistent_load) { return Parser(bytes, persistent_load).run(); }

}  // namespace megatron::pickle
