// Checksums of an HDF5 file's metadata: everything that says what its numbers mean. Each object (the root,
// every group and dataset) carries an attribute `metadata_checksums`, a JSON object with one FNV-1a 64 checksum
// per entry: "attr:NAME" for each of its attributes (type, shape, value), "layout" for a dataset (type, shape,
// layout, filters, chunks) and "link:NAME" for each member of a group (its kind). The data themselves have their
// own checksums (Fletcher32 chunks, the token blocks of docs/data.md). Written last, before the file is closed;
// checked when a file is opened, so one flipped bit of an attribute is found and named, not trained on.
#pragma once

#include <cstdint>

#include "shardtrain/runtime/hdf5.hpp"

namespace shardtrain::hdf5 {

inline constexpr const char* kMetadataChecksums = "metadata_checksums";

struct MetadataCheck {
  bool recorded = false;  // false: the file has no record (written before the checksums existed); nothing was checked
  int64_t objects = 0;    // objects checked
  int64_t entries = 0;    // attributes, layouts and links checked
};

// Records every object's checksums in a file open for writing. Call it once everything else is written (it
// flushes the file first, so each dataset's chunks are allocated and counted).
void record_metadata_checksums(const Handle& file);

// Compares every object with its record. Throws DataError naming the file, the object and the entry that does
// not match ("units/0000: attribute 'params' does not match its checksum ..."), an object or a record missing,
// or metadata HDF5 cannot read. A file without a record at its root returns recorded = false.
MetadataCheck verify_metadata_checksums(const Handle& file);

}  // namespace shardtrain::hdf5
