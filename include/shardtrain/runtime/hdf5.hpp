// Move-only owners of HDF5 handles and the few helpers every HDF5 user in shardtrain needs
// (datasets, checkpoints): open/create a file with errors that name it, 1-D datasets of
// u32/i64/f32 (optionally chunked with Fletcher32 checksums), and string/integer attributes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::hdf5 {

using hid = int64_t;  // hid_t, without pulling <hdf5.h> into every includer

// Owns one hid_t and closes it with the H5*close that matches its type (file, group, dataset,
// dataspace, datatype, attribute, property list).
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid id) : id_(id) {}
  ~Handle();
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void close();  // closes now; errors are reported as IoError

 private:
  hid id_ = -1;
};

enum class FileMode { ReadOnly, ReadWrite };
enum class Checksum { None, Fletcher32 };

struct DatasetOptions {
  size_t chunk_elements = 0;  // 0 = contiguous layout; otherwise chunked (required for Fletcher32)
  Checksum checksum = Checksum::None;
};

// Opening a missing, truncated or non-HDF5 file throws DataError naming the path and what is wrong; one that the file
// system refuses or another process holds (why_unopened) throws FileRefused.
Handle open_file(const std::string& path, FileMode mode);
// Why `path` cannot be opened for reading where the file system, not the file's contents, is the reason (`why` ""
// when it can). HDF5 says "no HDF5 signature" of a file it may not read, "no such file" of a folder or a pipe, and
// "truncated or corrupt" of one it cannot lock (HDF5 1.10 takes a shared flock: a writer holds it exclusively, or the
// file system has no locks, as some NFS and Lustre mounts): words that send a user after damage that is not there.
struct Unopened {
  std::string why;
  bool may_be_intact = false;  // refused (permissions, a lock, a link loop), not missing nor the wrong kind of file
};
Unopened why_unopened(const std::string& path);
// An intact file that cannot be read now (why_unopened): no damage, so nothing is set aside for it.
class FileRefused : public DataError {
 public:
  using DataError::DataError;
};
// Where a file's objects keep their attributes. Compact (HDF5's default, in the object header) holds at most 64 KiB
// per attribute: a dataset's `sources` list of 1000+ long paths passed it. Dense (a heap beside the header, the 1.8
// file format, which HDF5 1.8 and later, h5py included, read) holds attributes of any size.
enum class AttributeStorage { Compact, Dense };
// Creates (truncating) a file; throws IoError naming the path.
Handle create_file(const std::string& path, AttributeStorage attributes = AttributeStorage::Compact);
// A file in memory only (HDF5's core driver, nothing written to disk), laid out as create_file's: to find out
// before hours of work whether what will be stored fits.
Handle create_memory_file(const std::string& name, AttributeStorage attributes = AttributeStorage::Compact);
Handle create_group(const Handle& parent, const std::string& name);
Handle open_group(const Handle& parent, const std::string& name);
bool exists(const Handle& parent, const std::string& path);  // a link (dataset or group) under parent

void write_u32(const Handle& parent, const std::string& name, std::span<const uint32_t> data, DatasetOptions opt = {});
void write_i64(const Handle& parent, const std::string& name, std::span<const int64_t> data, DatasetOptions opt = {});
void write_f32(const Handle& parent, const std::string& name, std::span<const float> data, DatasetOptions opt = {});
void write_u16(const Handle& parent, const std::string& name, std::span<const uint16_t> data,
               DatasetOptions opt = {});  // bf16 bits

// Reading checks that the dataset exists, is 1-D and has an integer/float class compatible with the
// requested type; errors (DataError) name the file and dataset. HDF5 converts between widths.
// A 1-D uint32 dataset of n elements, contiguous and unfiltered, for write_u32_range to fill piece by piece.
void create_u32(const Handle& parent, const std::string& name, size_t n);
void write_u32_range(const Handle& parent, const std::string& name, size_t offset, std::span<const uint32_t> data);

std::vector<uint32_t> read_u32(const Handle& parent, const std::string& name);
std::vector<int64_t> read_i64(const Handle& parent, const std::string& name);
std::vector<float> read_f32(const Handle& parent, const std::string& name);
std::vector<uint16_t> read_u16(const Handle& parent, const std::string& name);  // bf16 bits
size_t dataset_length(const Handle& parent, const std::string& name);
// The byte offset in the file of a 1-D dataset's elements when a reader may map them directly: stored as
// little-endian uint32, contiguous, unfiltered, with its storage allocated (the file's user block counted).
// nullopt otherwise (chunked, filtered, compact, another type, or empty): read it through HDF5 then.
std::optional<uint64_t> raw_u32le_offset(const Handle& parent, const std::string& name);
// Reads elements [offset, offset + out.size()) of a 1-D u32 dataset (a hyperslab).
void read_u32_range(const Handle& parent, const std::string& name, size_t offset, std::span<uint32_t> out);
void read_f32_range(const Handle& parent, const std::string& name, size_t offset, std::span<float> out);

// Attributes on a file, group or dataset (`object` is a path relative to parent, "." for itself).
void set_attr(const Handle& parent, const std::string& name, const std::string& value, const std::string& object = ".");
void set_attr(const Handle& parent, const std::string& name, int64_t value, const std::string& object = ".");
std::optional<std::string> get_attr_string(const Handle& parent, const std::string& name, const std::string& object = ".");
std::optional<int64_t> get_attr_int(const Handle& parent, const std::string& name, const std::string& object = ".");

std::string file_name(const Handle& h);  // the file a handle belongs to, for error messages

// HDF5's own dump of its error stack to stderr, off for good: in the calling thread (in every thread where HDF5 is
// built without thread safety, whose setting is global). Every call here is checked and its failure becomes one
// error naming the file; a guard that turned the dump back on after each call let another thread's failure (a full
// disk under the asynchronous save) print a page of HDF5-DIAG lines in between. Each entry point calls it.
void quiet_errors();

}  // namespace shardtrain::hdf5
