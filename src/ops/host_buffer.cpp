// Aligned host allocations (see host_buffer.hpp).
#include "shardtrain/ops/host_buffer.hpp"

#include <cstdlib>
#include <new>
#include <utility>

namespace shardtrain::ops {

HostBuffer::HostBuffer(size_t bytes) { reserve(bytes); }

HostBuffer::~HostBuffer() { release(); }

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void HostBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  release();
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  data_ = std::aligned_alloc(kAlignment, rounded);
  if (!data_) throw std::bad_alloc();
  bytes_ = rounded;
}

void HostBuffer::release() {
  std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace shardtrain::ops
