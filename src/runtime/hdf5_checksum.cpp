// Checksums of an HDF5 file's metadata (hdf5_checksum.hpp). Every description is built from HDF5's query
// functions field by field (never from H5Tencode, whose bytes may change between HDF5 versions), so a file
// recorded by one HDF5 release verifies under another.
#include "shardtrain/runtime/hdf5_checksum.hpp"
#include "shardtrain/runtime/hdf5.hpp"

#include <hdf5.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::hdf5 {
namespace {

using Entries = std::map<std::string, std::string>;  // "attr:NAME" / "layout" / "link:NAME" -> checksum or kind

// FNV-1a 64: every change of a single byte changes the result (each step is a bijection of the state).
uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string checksum_hex(std::string_view bytes) { return fmt::format("{:016x}", fnv1a64(bytes)); }

// What went wrong reading one object's metadata: HDF5 itself could not decode it (a damaged header, or one that
// fails HDF5's own checksum: the newer structures, such as the heap of a group's many attributes, carry one).
struct Unreadable {
  std::string what;
};

// The innermost description on HDF5's error stack ("incorrect metadata checksum after all read attempts").
std::string hdf5_reason() {
  std::string reason;
  const auto first = [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
    auto* r = static_cast<std::string*>(out);
    if (r->empty() && e->desc && *e->desc) *r = e->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first, &reason);
  return reason;
}

template <typename T>
T checked(T v, const char* what) {
  if (v < 0) {
    const std::string reason = hdf5_reason();
    throw Unreadable{reason.empty() ? std::string(what) : fmt::format("{} (HDF5: {})", what, reason)};
  }
  return v;
}

struct Id {  // closes any hid_t through a Handle
  explicit Id(hid_t id, const char* what) : h(static_cast<hid>(checked(id, what))) {}
  hid_t get() const { return static_cast<hid_t>(h.get()); }
  Handle h;
};

std::string describe_type(hid_t t) {
  const H5T_class_t cls = checked(H5Tget_class(t), "the datatype's class");
  std::string d = fmt::format("class {} size {}", static_cast<int>(cls), H5Tget_size(t));
  switch (cls) {
    case H5T_INTEGER:
      d += fmt::format(" order {} sign {} precision {} offset {}", static_cast<int>(H5Tget_order(t)),
                       static_cast<int>(H5Tget_sign(t)), H5Tget_precision(t), H5Tget_offset(t));
      break;
    case H5T_FLOAT: {
      size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
      checked(H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize), "the float type's fields");
      d += fmt::format(" order {} precision {} offset {} fields {} {} {} {} {} ebias {} norm {}",
                       static_cast<int>(H5Tget_order(t)), H5Tget_precision(t), H5Tget_offset(t), spos, epos, esize, mpos,
                       msize, H5Tget_ebias(t), static_cast<int>(H5Tget_norm(t)));
      break;
    }
    case H5T_STRING:
      d += fmt::format(" cset {} pad {} variable {}", static_cast<int>(H5Tget_cset(t)), static_cast<int>(H5Tget_strpad(t)),
                       H5Tis_variable_str(t) > 0);
      break;
    case H5T_COMPOUND:
    case H5T_ENUM: {
      const int n = checked(H5Tget_nmembers(t), "the type's members");
      if (cls == H5T_ENUM) d += " of " + describe_type(Id(H5Tget_super(t), "the enum's base type").get());
      for (int i = 0; i < n; ++i) {
        char* name = H5Tget_member_name(t, static_cast<unsigned>(i));
        d += fmt::format(" [{}", name ? name : "");
        H5free_memory(name);
        if (cls == H5T_COMPOUND) {
          d += fmt::format(" at {}: {}]", H5Tget_member_offset(t, static_cast<unsigned>(i)),
                           describe_type(Id(H5Tget_member_type(t, static_cast<unsigned>(i)), "a member's type").get()));
        } else {
          std::string value(H5Tget_size(t), '\0');
          checked(H5Tget_member_value(t, static_cast<unsigned>(i), value.data()), "an enum value");
          d += " = " + checksum_hex(value) + "]";
        }
      }
      break;
    }
    case H5T_ARRAY: {
      const int n = checked(H5Tget_array_ndims(t), "the array type's rank");
      std::vector<hsize_t> dims(static_cast<size_t>(n));
      checked(H5Tget_array_dims2(t, dims.data()), "the array type's dims");
      d += " dims";
      for (const hsize_t x : dims) d += fmt::format(" {}", x);
      d += " of " + describe_type(Id(H5Tget_super(t), "the array's base type").get());
      break;
    }
    case H5T_VLEN: d += " of " + describe_type(Id(H5Tget_super(t), "the sequence's base type").get()); break;
    default: break;
  }
  return d;
}

std::string describe_space(hid_t space) {
  const H5S_class_t cls = H5Sget_simple_extent_type(space);
  std::string d = fmt::format("space {}", static_cast<int>(cls));
  if (cls != H5S_SIMPLE) return d;
  const int rank = checked(H5Sget_simple_extent_ndims(space), "the dataspace's rank");
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), max(static_cast<size_t>(rank));
  checked(H5Sget_simple_extent_dims(space, dims.data(), max.data()), "the dataspace's dims");
  for (int i = 0; i < rank; ++i) d += fmt::format(" {}/{}", dims[static_cast<size_t>(i)], max[static_cast<size_t>(i)]);
  return d;
}

// An attribute's type, shape and value, as bytes to checksum.
std::string attribute_bytes(hid_t object, const std::string& name) {
  const Id attr(H5Aopen(object, name.c_str(), H5P_DEFAULT), "the attribute");
  const Id type(H5Aget_type(attr.get()), "the attribute's type");
  const Id space(H5Aget_space(attr.get()), "the attribute's dataspace");
  std::string bytes = describe_type(type.get()) + "; " + describe_space(space.get()) + "; ";
  const hssize_t n = checked(H5Sget_simple_extent_npoints(space.get()), "the attribute's size");
  if (n == 0) return bytes;
  if (H5Tis_variable_str(type.get()) > 0) {
    std::vector<char*> strings(static_cast<size_t>(n), nullptr);
    const Id mem(H5Tcopy(H5T_C_S1), "a string type");
    checked(H5Tset_size(mem.get(), H5T_VARIABLE), "a string type");
    checked(H5Aread(attr.get(), mem.get(), strings.data()), "the attribute's value");
    for (char* s : strings) {
      bytes += s ? std::string(s) : std::string();
      bytes.push_back('\0');
      H5free_memory(s);
    }
    return bytes;
  }
  if (H5Tdetect_class(type.get(), H5T_VLEN) > 0 || H5Tdetect_class(type.get(), H5T_REFERENCE) > 0)
    return bytes + "(values in memory form only)";  // pointers and addresses: the type and shape are what can be compared
  std::string value(static_cast<size_t>(n) * H5Tget_size(type.get()), '\0');
  checked(H5Aread(attr.get(), type.get(), value.data()),
          "the attribute's value");  // the file's own type: the bytes as stored
  return bytes + value;
}

// A dataset's type, shape, layout, filters and chunks: what decides how its bytes are read as numbers.
std::string layout_bytes(hid_t dataset) {
  const Id type(H5Dget_type(dataset), "the dataset's type");
  const Id space(H5Dget_space(dataset), "the dataset's dataspace");
  const Id dcpl(H5Dget_create_plist(dataset), "the dataset's creation properties");
  std::string d = describe_type(type.get()) + "; " + describe_space(space.get());
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  d += fmt::format("; layout {}", static_cast<int>(layout));
  if (layout == H5D_CHUNKED) {
    const int rank = checked(H5Pget_chunk(dcpl.get(), 0, nullptr), "the chunk rank");
    std::vector<hsize_t> chunk(static_cast<size_t>(rank));
    checked(H5Pget_chunk(dcpl.get(), rank, chunk.data()), "the chunk dims");
    d += " chunk";
    for (const hsize_t c : chunk) d += fmt::format(" {}", c);
  }
  const int filters = checked(H5Pget_nfilters(dcpl.get()), "the filters");
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t nvalues = 16;
    unsigned values[16] = {};
    char name[64] = {};
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nvalues, values, sizeof name, name, &config);
    checked(id, "a filter");
    d += fmt::format("; filter {} flags {} values", static_cast<int>(id), flags);
    for (size_t k = 0; k < std::min<size_t>(nvalues, 16); ++k) d += fmt::format(" {}", values[k]);
  }
  d += fmt::format("; stored {}", H5Dget_storage_size(dataset));
#if H5_VERSION_GE(1, 10, 5)
  if (layout == H5D_CHUNKED) {  // which chunks exist, where each sits in the dataset, and whether its filters ran
    hsize_t chunks = 0;
    checked(H5Dget_num_chunks(dataset, space.get(), &chunks), "the chunk count");
    d += fmt::format("; chunks {}", chunks);
    const int rank = checked(H5Sget_simple_extent_ndims(space.get()), "the dataspace's rank");
    std::vector<hsize_t> offset(static_cast<size_t>(rank));
    for (hsize_t c = 0; c < chunks; ++c) {
      unsigned mask = 0;
      haddr_t addr = 0;
      hsize_t size = 0;
      checked(H5Dget_chunk_info(dataset, space.get(), c, offset.data(), &mask, &addr, &size), "a chunk's record");
      d += " [";
      for (const hsize_t o : offset) d += fmt::format(" {}", o);
      d += fmt::format(" mask {} bytes {}]", mask, size);
    }
  }
#endif
  return d;
}

std::vector<std::string> attribute_names(hid_t object) {
  std::vector<std::string> names;
  hsize_t at = 0;
  const auto collect = [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  };
  checked(H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, &at, collect, &names), "the attribute list");
  return names;
}

std::vector<std::string> link_names(hid_t group) {
  H5G_info_t info{};
  checked(H5Gget_info(group, &info), "the group's links");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n =
        checked(H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT), "a link name");
    std::string name(static_cast<size_t>(n) + 1, '\0');
    checked(H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT),
            "a link name");
    name.resize(static_cast<size_t>(n));
    names.push_back(std::move(name));
  }
  return names;
}

const char* kind_name(H5I_type_t kind) {
  switch (kind) {
    case H5I_GROUP: return "group";
    case H5I_DATASET: return "dataset";
    case H5I_DATATYPE: return "datatype";
    default: return "other";
  }
}

std::string object_name(const std::string& path) { return path == "." ? "the root group" : path; }

// Visits every object under `path` (itself first), with what it holds now: fn(path, object, entries).
void walk(hid_t file, const std::string& fname, const std::string& path,
          const std::function<void(const std::string&, hid_t, const Entries&)>& fn) {
  std::optional<Id> object;
  Entries entries;
  std::vector<std::pair<std::string, H5I_type_t>> children;
  try {
    object.emplace(H5Oopen(file, path.c_str(), H5P_DEFAULT), "the object");
    const hid_t o = object->get();
    const H5I_type_t kind = H5Iget_type(o);
    for (const std::string& name : attribute_names(o))
      if (name != kMetadataChecksums) entries["attr:" + name] = checksum_hex(attribute_bytes(o, name));
    if (kind == H5I_DATASET) entries["layout"] = checksum_hex(layout_bytes(o));
    if (kind == H5I_GROUP) {
      for (const std::string& name : link_names(o)) {
        const std::string child = path == "." ? name : path + "/" + name;
        const Id c(H5Oopen(file, child.c_str(), H5P_DEFAULT), "a member of the group");
        const H5I_type_t child_kind = H5Iget_type(c.get());
        entries["link:" + name] = kind_name(child_kind);
        children.emplace_back(child, child_kind);
      }
    }
  } catch (const Unreadable& u) {
    throw DataError(
        fmt::format("{}: {}: HDF5 cannot read {} (the file's metadata is damaged)", fname, object_name(path), u.what));
  }
  fn(path, object->get(), entries);
  for (const auto& [child, kind] : children)
    if (kind == H5I_GROUP || kind == H5I_DATASET) walk(file, fname, child, fn);
}

}  // namespace

void record_metadata_checksums(const Handle& file) {
  quiet_errors();
  const hid_t f = static_cast<hid_t>(file.get());
  errno = 0;
  if (H5Fflush(f, H5F_SCOPE_LOCAL) < 0) {
    const int err = errno;  // the file system's answer, when a write was refused (ENOSPC, EFBIG, EDQUOT...)
    throw IoError(fmt::format("{}: writing failed, the data was not all written{}", file_name(file),
                              err != 0 ? fmt::format(" ({})", std::strerror(err)) : std::string()));
  }
  std::vector<std::pair<std::string, std::string>> records;
  walk(f, file_name(file), ".",
       [&](const std::string& path, hid_t, const Entries& e) { records.emplace_back(path, nlohmann::json(e).dump()); });
  for (const auto& [path, record] : records) set_attr(file, kMetadataChecksums, record, path);
}

MetadataCheck verify_metadata_checksums(const Handle& file) {
  quiet_errors();
  MetadataCheck check;
  const std::string fname = file_name(file);
  const htri_t has_record = H5Aexists(static_cast<hid_t>(file.get()), kMetadataChecksums);
  if (has_record < 0) {  // not "absent": the root's attributes cannot be read at all
    const std::string reason = hdf5_reason();
    throw DataError(fmt::format("{}: the root group: HDF5 cannot read its attributes{} (the file's metadata is damaged)",
                                fname, reason.empty() ? std::string() : fmt::format(" ({})", reason)));
  }
  if (has_record == 0) return check;
  check.recorded = true;
  const hid_t f = static_cast<hid_t>(file.get());
  walk(f, fname, ".", [&](const std::string& path, hid_t, const Entries& now) {
    const std::string where = fmt::format("{}: {}", fname, object_name(path));
    const std::optional<std::string> text = get_attr_string(file, kMetadataChecksums, path);
    if (!text)
      throw DataError(fmt::format("{}: has no '{}' record, though the file has one (the object or its record is damaged)",
                                  where, kMetadataChecksums));
    Entries recorded;
    try {
      recorded = nlohmann::json::parse(*text).get<Entries>();
    } catch (const nlohmann::json::exception&) {
      throw DataError(fmt::format("{}: its '{}' record is not a JSON object of checksums (the record is damaged)", where,
                                  kMetadataChecksums));
    }
    auto what = [](const std::string& key) {
      if (key == "layout") return std::string("the dataset's type, shape or layout");
      if (key.rfind("attr:", 0) == 0) return fmt::format("attribute '{}'", key.substr(5));
      return fmt::format("member '{}'", key.substr(5));
    };
    for (const auto& [key, value] : recorded) {
      const auto it = now.find(key);
      if (it == now.end())
        throw DataError(fmt::format("{}: {} is missing (its checksum record lists it): the file's metadata is damaged",
                                    where, what(key)));
      if (it->second != value)
        throw DataError(fmt::format(
            "{}: {} does not match the checksum recorded with it{}: the file's metadata is damaged", where, what(key),
            key.rfind("link:", 0) == 0 ? fmt::format(" (a {}, recorded as a {})", it->second, value) : std::string()));
    }
    for (const auto& [key, value] : now)
      if (!recorded.count(key))
        throw DataError(fmt::format(
            "{}: {} is not in its checksum record (added after the file was written, or a damaged name)", where, what(key)));
    ++check.objects;
    check.entries += static_cast<int64_t>(now.size());
  });
  return check;
}

}  // namespace shardtrain::hdf5
