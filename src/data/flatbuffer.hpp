// Reading FlatBuffers, the encoding of Arrow IPC's metadata (the Schema, RecordBatch and DictionaryBatch
// messages, the file footer), from the published binary layout: a table starts with a signed offset back to
// its vtable; the vtable holds its own size, the table's size and one 16-bit offset per field (0: absent,
// the default applies); offsets to tables, vectors and strings are unsigned and relative to where they are
// stored; a vector is a 32-bit length and its elements. Every offset and length is checked against the
// buffer, so a corrupt message throws FlatError (which the caller turns into a DataError naming the file)
// and never reads outside it.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace shardtrain::data::flat {

class FlatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Buffer {
 public:
  Buffer(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  T load(size_t pos) const {
    if (pos > size_ || sizeof(T) > size_ - pos) throw FlatError("an offset points past the end of the message");
    T v;
    std::memcpy(&v, data_ + pos, sizeof(T));  // little-endian, as this host
    return v;
  }
  // The position an unsigned offset stored at `pos` points to.
  size_t follow(size_t pos) const {
    const size_t target = pos + load<uint32_t>(pos);
    if (target >= size_) throw FlatError("an offset points past the end of the message");
    return target;
  }
  size_t size() const { return size_; }
  const uint8_t* data() const { return data_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

class Table;

// A vector's elements: tables (through their offsets), structs of a fixed size (inline), or scalars.
class Vector {
 public:
  Vector() = default;
  Vector(const Buffer* buf, size_t pos) : buf_(buf) {
    length_ = buf->load<uint32_t>(pos);
    begin_ = pos + 4;
  }
  size_t size() const { return length_; }
  // Checks that `length` elements of `element_size` bytes fit in the buffer.
  void check(size_t element_size) const {
    if (buf_ != nullptr && length_ > (buf_->size() - begin_) / element_size)
      throw FlatError("a vector runs past the end of the message");
  }
  Table table(size_t i) const;
  // Element i of a vector of structs of `struct_size` bytes: the position of its first byte.
  size_t struct_at(size_t i, size_t struct_size) const {
    check(struct_size);
    return begin_ + i * struct_size;
  }
  template <typename T>
  T scalar(size_t i) const {
    check(sizeof(T));
    return buf_->load<T>(begin_ + i * sizeof(T));
  }
  const Buffer& buffer() const { return *buf_; }

 private:
  const Buffer* buf_ = nullptr;
  size_t begin_ = 0;
  size_t length_ = 0;
};

class Table {
 public:
  Table() = default;
  Table(const Buffer* buf, size_t pos) : buf_(buf), pos_(pos) {
    const int64_t vt = static_cast<int64_t>(pos) - buf->load<int32_t>(pos);
    if (vt < 0 || static_cast<uint64_t>(vt) >= buf->size()) throw FlatError("a table's vtable is outside the message");
    vtable_ = static_cast<size_t>(vt);
    vtable_size_ = buf->load<uint16_t>(vtable_);
    if (vtable_size_ < 4 || vtable_size_ % 2 != 0) throw FlatError("a vtable has an impossible size");
    buf->load<uint16_t>(vtable_ + vtable_size_ - 2);  // the whole vtable is inside
  }
  // The root table of a message.
  static Table root(const Buffer* buf) { return Table(buf, buf->follow(0)); }

  bool valid() const { return buf_ != nullptr; }
  bool has(int field) const { return field_offset(field) != 0; }

  template <typename T>
  T scalar(int field, T fallback) const {
    const size_t off = field_offset(field);
    return off == 0 ? fallback : buf_->load<T>(pos_ + off);
  }
  // A table, vector or string field; an absent one is an empty value (valid() false, size 0, "").
  Table table(int field) const {
    const size_t off = field_offset(field);
    return off == 0 ? Table() : Table(buf_, buf_->follow(pos_ + off));
  }
  Vector vector(int field) const {
    const size_t off = field_offset(field);
    return off == 0 ? Vector() : Vector(buf_, buf_->follow(pos_ + off));
  }
  std::string_view string(int field) const {
    const Vector v = vector(field);
    v.check(1);
    if (v.size() == 0) return {};
    return {reinterpret_cast<const char*>(buf_->data()) + v.struct_at(0, 1), v.size()};
  }
  // A struct field stored inline: the position of its first byte.
  size_t inline_struct(int field, size_t struct_size) const {
    const size_t off = field_offset(field);
    if (off == 0) throw FlatError("a required struct field is missing");
    buf_->load<uint8_t>(pos_ + off + struct_size - 1);
    return pos_ + off;
  }
  const Buffer& buffer() const { return *buf_; }

 private:
  size_t field_offset(int field) const {
    if (buf_ == nullptr) return 0;
    const size_t slot = 4 + 2 * static_cast<size_t>(field);
    if (slot + 2 > vtable_size_) return 0;  // written by an older schema: the default
    return buf_->load<uint16_t>(vtable_ + slot);
  }

  const Buffer* buf_ = nullptr;
  size_t pos_ = 0, vtable_ = 0;
  uint16_t vtable_size_ = 0;
};

inline Table Vector::table(size_t i) const {
  check(4);
  const size_t at = begin_ + i * 4;
  return Table(buf_, buf_->follow(at));
}

}  // namespace shardtrain::data::flat
