// A reader of Thrift's compact protocol, the encoding of Parquet's footer and page headers: structs of
// numbered fields, zigzag varints, length-prefixed binaries, lists. Bounds-checked everywhere; a value that
// runs past its buffer, nests too deep or has an unknown type throws ThriftError, which callers turn into a
// DataError naming the file. Unknown fields are skipped, so newer writers' additions read fine.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace shardtrain::data::thrift {

class ThriftError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Compact protocol type ids (the low nibble of a field header).
enum class Type : uint8_t {
  Stop = 0,
  BoolTrue = 1,
  BoolFalse = 2,
  Byte = 3,
  I16 = 4,
  I32 = 5,
  I64 = 6,
  Double = 7,
  Binary = 8,
  List = 9,
  Set = 10,
  Map = 11,
  Struct = 12,
};

class CompactReader {
 public:
  CompactReader(const uint8_t* data, size_t size) : p_(data), begin_(data), end_(data + size) {}

  size_t position() const { return static_cast<size_t>(p_ - begin_); }

  // Reads one struct: on_field(id, type) is called for each field and must consume its value with one of
  // the read_* calls below, or skip(type).
  template <typename OnField>
  void read_struct(OnField&& on_field) {
    Depth guard(*this);
    int16_t last_id = 0;
    for (;;) {
      const uint8_t header = byte();
      const auto type = static_cast<Type>(header & 0x0f);
      if (type == Type::Stop) return;
      const int delta = header >> 4;
      const int16_t id = delta != 0 ? static_cast<int16_t>(last_id + delta) : static_cast<int16_t>(zigzag(varint()));
      last_id = id;
      check_type(type);
      on_field(id, type);
    }
  }

  // Integers of any width (Byte, I16, I32, I64).
  int64_t read_int(Type type) {
    if (type == Type::Byte) return static_cast<int8_t>(byte());
    if (type == Type::I16 || type == Type::I32 || type == Type::I64) return zigzag(varint());
    throw ThriftError("an integer was expected");
  }
  // A struct field's bool lives in its type.
  bool read_bool(Type type) {
    if (type == Type::BoolTrue) return true;
    if (type == Type::BoolFalse) return false;
    throw ThriftError("a bool was expected");
  }
  std::string_view read_binary(Type type) {
    if (type != Type::Binary) throw ThriftError("a string was expected");
    const uint64_t n = varint();
    if (n > static_cast<uint64_t>(end_ - p_)) throw ThriftError("a string runs past the end of its buffer");
    std::string_view s(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
    p_ += n;
    return s;
  }
  // on_element(element_type) is called once per element and consumes it, as on_field does.
  template <typename OnElement>
  void read_list(Type type, OnElement&& on_element) {
    if (type != Type::List && type != Type::Set) throw ThriftError("a list was expected");
    Depth guard(*this);
    const auto [count, elem] = list_header();
    for (uint64_t i = 0; i < count; ++i) on_element(elem);
  }
  template <typename OnField>
  void read_struct(Type type, OnField&& on_field) {
    if (type != Type::Struct) throw ThriftError("a struct was expected");
    read_struct(std::forward<OnField>(on_field));
  }

  void skip(Type type) {
    switch (type) {
      case Type::BoolTrue:
      case Type::BoolFalse: return;  // a field's value is its type (list elements are skipped as Byte)
      case Type::Byte: byte(); return;
      case Type::I16:
      case Type::I32:
      case Type::I64: varint(); return;
      case Type::Double: advance(8); return;
      case Type::Binary: read_binary(type); return;
      case Type::List:
      case Type::Set: {
        Depth guard(*this);
        const auto [count, elem] = list_header();
        for (uint64_t i = 0; i < count; ++i) skip(elem == Type::BoolTrue || elem == Type::BoolFalse ? Type::Byte : elem);
        return;
      }
      case Type::Map: {
        Depth guard(*this);
        const uint64_t count = varint();
        if (count == 0) return;
        const uint8_t kv = byte();
        const auto key = static_cast<Type>(kv >> 4), value = static_cast<Type>(kv & 0x0f);
        check_type(key);
        check_type(value);
        for (uint64_t i = 0; i < count; ++i) {
          skip(key == Type::BoolTrue || key == Type::BoolFalse ? Type::Byte : key);
          skip(value == Type::BoolTrue || value == Type::BoolFalse ? Type::Byte : value);
        }
        return;
      }
      case Type::Struct: read_struct([&](int16_t, Type t) { skip(t); }); return;
      case Type::Stop: break;
    }
    throw ThriftError("a value of unknown type");
  }

 private:
  static constexpr int kMaxDepth = 64;

  struct Depth {  // bounds the recursion a crafted footer could ask for
    CompactReader& r;
    explicit Depth(CompactReader& reader) : r(reader) {
      if (++r.depth_ > kMaxDepth) throw ThriftError("values nest deeper than 64 levels");
    }
    ~Depth() { --r.depth_; }
  };

  uint8_t byte() {
    if (p_ >= end_) throw ThriftError("the metadata ends in the middle of a value");
    return *p_++;
  }
  void advance(size_t n) {
    if (n > static_cast<size_t>(end_ - p_)) throw ThriftError("the metadata ends in the middle of a value");
    p_ += n;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    throw ThriftError("a varint longer than 10 bytes");
  }
  static int64_t zigzag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }
  static void check_type(Type t) {
    if (static_cast<uint8_t>(t) > static_cast<uint8_t>(Type::Struct)) throw ThriftError("a field of unknown type");
  }
  std::pair<uint64_t, Type> list_header() {
    const uint8_t h = byte();
    uint64_t count = h >> 4;
    if (count == 15) count = varint();
    const auto elem = static_cast<Type>(h & 0x0f);
    check_type(elem);
    // Every element takes at least one byte, so a count beyond the bytes left is corrupt (and would spin).
    if (count > static_cast<uint64_t>(end_ - p_)) throw ThriftError("a list longer than its buffer");
    return {count, elem};
  }

  const uint8_t* p_;
  const uint8_t* begin_;
  const uint8_t* end_;
  int depth_ = 0;
};

}  // namespace shardtrain::data::thrift
