// Flat buffers and the unshard pool.
#include "shardtrain/fsdp/flat_storage.hpp"

#include <utility>

namespace shardtrain::fsdp {

FlatBuffer::FlatBuffer(DeviceKind device, Placement placement, size_t bytes, MemoryLedger* ledger, MemoryCategory category)
    : device_(device), placement_(placement), bytes_(bytes), ledger_(ledger), category_(category) {
  if (placement == Placement::PinnedHost) {
    pinned_ = PinnedBuffer(bytes);
    data_ = pinned_.data();
  } else if (device == DeviceKind::Cuda) {
    device_buffer_ = DeviceBuffer(bytes);
    data_ = device_buffer_.data();
  } else {
    host_ = ops::HostBuffer(bytes);
    data_ = host_.data();
  }
  if (ledger_) ledger_->add(category_, static_cast<int64_t>(bytes_));
}

void FlatBuffer::release() {
  if (data_ && ledger_) ledger_->release(category_, static_cast<int64_t>(bytes_));
  host_ = {};
  pinned_ = {};
  device_buffer_ = {};
  data_ = nullptr;
  bytes_ = 0;
}

FlatBuffer::~FlatBuffer() { release(); }

FlatBuffer::FlatBuffer(FlatBuffer&& o) noexcept
    : device_(o.device_),
      placement_(o.placement_),
      data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      ledger_(o.ledger_),
      category_(o.category_),
      host_(std::move(o.host_)),
      pinned_(std::move(o.pinned_)),
      device_buffer_(std::move(o.device_buffer_)),
      fence(std::move(o.fence)) {}

FlatBuffer& FlatBuffer::operator=(FlatBuffer&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    placement_ = o.placement_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    ledger_ = o.ledger_;
    category_ = o.category_;
    host_ = std::move(o.host_);
    pinned_ = std::move(o.pinned_);
    device_buffer_ = std::move(o.device_buffer_);
    fence = std::move(o.fence);
  }
  return *this;
}

ops::Tensor FlatBuffer::view(DType dtype, int64_t offset_elements, ops::Shape shape) const {
  return ops::make_tensor(static_cast<char*>(data_) + offset_elements * static_cast<int64_t>(dtype_size(dtype)), dtype,
                          shape, device());
}

FlatBuffer FlatPool::acquire(size_t bytes) {
  ++outstanding_;
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i].size() >= bytes && (best == free_.size() || free_[i].size() < free_[best].size())) best = i;
  }
  if (best < free_.size()) {
    FlatBuffer b = std::move(free_[best]);
    free_.erase(free_.begin() + static_cast<long>(best));
    return b;
  }
  // Nothing fits: give back the largest free buffer first, so resident buffers never outnumber the
  // most that were outstanding at once.
  if (!free_.empty()) {
    size_t largest = 0;
    for (size_t i = 1; i < free_.size(); ++i)
      if (free_[i].size() > free_[largest].size()) largest = i;
    free_.erase(free_.begin() + static_cast<long>(largest));
  }
  return FlatBuffer(device_, Placement::Compute, bytes, ledger_, category_);
}

void FlatPool::release(FlatBuffer buffer) {
  --outstanding_;
  free_.push_back(std::move(buffer));
}

}  // namespace shardtrain::fsdp
