// Move-only, 64-byte aligned host memory: the CPU backend's scratch, the model's activation arena and
// DenseParams' flat buffers. Contents are uninitialized after allocation.
#pragma once

#include <cstddef>

namespace shardtrain::ops {

class HostBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // Grows (never shrinks) to at least `bytes`; the old contents are lost when it grows.
  void reserve(size_t bytes);

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace shardtrain::ops
