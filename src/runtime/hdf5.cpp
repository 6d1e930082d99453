// RAII HDF5 handles and 1-D dataset / attribute helpers (see hdf5.hpp). HDF5's automatic error
// printing is silenced while a helper runs: failures become exceptions that name the file and object.
#include "shardtrain/runtime/hdf5.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <utility>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/files.hpp"

namespace shardtrain::hdf5 {
void quiet_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {

// HDF5 closes whatever is still open when the process exits. After a write that the file system refused (full,
// over a size limit), a file's close fails and leaves HDF5's record of it half torn down, and that exit-time close
// then crashes (seen with 1.10). Every file shardtrain writes is closed explicitly and checked, so the exit-time
// pass has nothing to do: it is turned off before HDF5 starts (this runs before main).
[[maybe_unused]] const bool kNoExitTimeClose = [] {
  H5dont_atexit();
  quiet_errors();
  return true;
}();

herr_t close_any(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE: return H5Fclose(id);
    case H5I_GROUP: return H5Gclose(id);
    case H5I_DATASET: return H5Dclose(id);
    case H5I_DATASPACE: return H5Sclose(id);
    case H5I_DATATYPE: return H5Tclose(id);
    case H5I_ATTR: return H5Aclose(id);
    case H5I_GENPROP_LST: return H5Pclose(id);
    default: return H5Idec_ref(id);
  }
}

Handle owned(hid_t id) { return Handle(static_cast<hid>(id)); }

template <typename T>
hid_t native_type();
template <>
hid_t native_type<uint32_t>() {
  return H5T_NATIVE_UINT32;
}
template <>
hid_t native_type<int64_t>() {
  return H5T_NATIVE_INT64;
}
template <>
hid_t native_type<float>() {
  return H5T_NATIVE_FLOAT;
}
template <>
hid_t native_type<uint16_t>() {
  return H5T_NATIVE_UINT16;
}

template <typename T>
void write_1d(const Handle& parent, const std::string& name, std::span<const T> data, DatasetOptions opt) {
  quiet_errors();
  const hsize_t n = data.size();
  Handle space = owned(ST_CHECK_HDF5(H5Screate_simple(1, &n, nullptr)));
  Handle dcpl = owned(ST_CHECK_HDF5(H5Pcreate(H5P_DATASET_CREATE)));
  if (opt.checksum == Checksum::Fletcher32 && opt.chunk_elements == 0) opt.chunk_elements = 1 << 20;
  if (opt.chunk_elements > 0 && n > 0) {
    const hsize_t chunk = std::min<hsize_t>(opt.chunk_elements, n);
    ST_CHECK_HDF5(H5Pset_chunk(dcpl.get(), 1, &chunk));
    if (opt.checksum == Checksum::Fletcher32) ST_CHECK_HDF5(H5Pset_fletcher32(dcpl.get()));
  }
  errno = 0;
  const hid_t dset =
      H5Dcreate2(parent.get(), name.c_str(), native_type<T>(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT);
  if (dset < 0) throw IoError(fmt::format("{}: cannot create dataset '{}'{}", file_name(parent), name, os_reason()));
  Handle ds = owned(dset);
  errno = 0;
  if (n > 0 && H5Dwrite(ds.get(), native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0)
    throw IoError(fmt::format("{}: cannot write dataset '{}' ({} elements){}", file_name(parent), name, n, os_reason()));
}

Handle open_1d(const Handle& parent, const std::string& name, size_t* length, H5T_class_t want) {
  if (!exists(parent, name)) throw DataError(fmt::format("{}: dataset '{}' is missing", file_name(parent), name));
  const hid_t d = H5Dopen2(parent.get(), name.c_str(), H5P_DEFAULT);
  if (d < 0) throw DataError(fmt::format("{}: '{}' is not a readable dataset", file_name(parent), name));
  Handle ds = owned(d);
  Handle space = owned(ST_CHECK_HDF5(H5Dget_space(ds.get())));
  if (H5Sget_simple_extent_ndims(space.get()) != 1)
    throw DataError(fmt::format("{}: dataset '{}' should be 1-D", file_name(parent), name));
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  Handle type = owned(ST_CHECK_HDF5(H5Dget_type(ds.get())));
  if (H5Tget_class(type.get()) != want)
    throw DataError(fmt::format("{}: dataset '{}' has the wrong type class (expected {})", file_name(parent), name,
                                want == H5T_INTEGER ? "integer" : "float"));
  *length = n;
  return ds;
}

template <typename T>
std::vector<T> read_1d(const Handle& parent, const std::string& name, H5T_class_t cls) {
  quiet_errors();
  size_t n = 0;
  Handle ds = open_1d(parent, name, &n, cls);
  std::vector<T> out(n);
  if (n > 0 && H5Dread(ds.get(), native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw DataError(fmt::format("{}: cannot read dataset '{}' (truncated or corrupt file? checksum mismatch?)",
                                file_name(parent), name));
  return out;
}

// The file and memory dataspaces of elements [offset, offset + count) of a 1-D dataset.
std::pair<Handle, Handle> range_spaces(const Handle& ds, size_t offset, size_t count) {
  Handle fspace = owned(ST_CHECK_HDF5(H5Dget_space(ds.get())));
  const hsize_t start = offset, n = count;
  ST_CHECK_HDF5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr));
  return {std::move(fspace), owned(ST_CHECK_HDF5(H5Screate_simple(1, &n, nullptr)))};
}

Handle open_attr_target(const Handle& parent, const std::string& object) {
  const hid_t o = H5Oopen(parent.get(), object.c_str(), H5P_DEFAULT);
  if (o < 0) throw DataError(fmt::format("{}: object '{}' not found", file_name(parent), object));
  return Handle(static_cast<hid>(o));
}

}  // namespace

Handle::~Handle() {
  quiet_errors();  // a close that fails here (after a refused write) is already reported by the write
  if (id_ >= 0) close_any(static_cast<hid_t>(id_));
}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    if (id_ >= 0) close_any(static_cast<hid_t>(id_));
    id_ = o.id_;
    o.id_ = -1;
  }
  return *this;
}

void Handle::close() {
  if (id_ < 0) return;
  const hid_t id = static_cast<hid_t>(id_);
  quiet_errors();
  const std::string name = file_name(*this);  // before the handle goes
  id_ = -1;
  errno = 0;
  if (close_any(id) < 0) {
    const int err = errno;  // the file system's answer, when the failure was a write (ENOSPC, EFBIG, EDQUOT...)
    throw IoError(fmt::format("{}: closing failed, the data was not all written{}", name,
                              err != 0 ? fmt::format(" ({})", std::strerror(err)) : std::string()));
  }
}

Unopened why_unopened(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return {"no such file"};
  if (ec == std::errc::too_many_symbolic_link_levels) return {"is a symbolic link that leads back to itself"};
  if (ec) return {fmt::format("cannot open: {}", ec.message()), true};  // a folder it may not enter
  if (st.type() == fs::file_type::directory) return {"is a folder, not a file"};
  if (st.type() != fs::file_type::regular) return {"is not a regular file (a pipe, socket or device)"};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {fmt::format("cannot open: {}", std::strerror(errno)), true};
  const char* locking = std::getenv("HDF5_USE_FILE_LOCKING");  // FALSE: HDF5 takes no lock, so none is to blame
  const int locked = locking && std::string_view(locking) == "FALSE" ? 0 : ::flock(fd, LOCK_SH | LOCK_NB), err = errno;
  ::close(fd);
  if (locked == 0) return {};
  if (err == EWOULDBLOCK)
    return {
        "another process holds it open for writing (its HDF5 file lock): close that writer (an h5py session in 'a' "
        "or 'w' mode?), then start again",
        true};
  return {fmt::format("cannot take the shared lock HDF5 reads under: {} (a file system without locks, as some NFS and "
                      "Lustre mounts: set HDF5_USE_FILE_LOCKING=FALSE for every rank)",
                      std::strerror(err)),
          true};
}

Handle open_file(const std::string& path, FileMode mode) {
  quiet_errors();
  // Asked after HDF5 failed, not before: a lock taken here would stand between a writer and its own file.
  const auto refused = [&] {
    const Unopened u = why_unopened(path);
    if (u.may_be_intact) throw FileRefused(fmt::format("{}: {}", path, u.why));
    if (!u.why.empty()) throw DataError(fmt::format("{}: {}", path, u.why));
  };
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) refused();
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 <= 0) {
    refused();
    throw DataError(fmt::format("{}: not an HDF5 file (no HDF5 signature)", path));
  }
  const hid_t f = H5Fopen(path.c_str(), mode == FileMode::ReadOnly ? H5F_ACC_RDONLY : H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) {
    refused();
    throw DataError(fmt::format("{}: cannot open as HDF5 (truncated or corrupt file?)", path));
  }
  return owned(f);
}

namespace {

// The file creation and access property lists of a new file with `attributes` storage.
std::pair<Handle, Handle> creation_lists(AttributeStorage attributes) {
  Handle fcpl = owned(ST_CHECK_HDF5(H5Pcreate(H5P_FILE_CREATE)));
  Handle fapl = owned(ST_CHECK_HDF5(H5Pcreate(H5P_FILE_ACCESS)));
  if (attributes == AttributeStorage::Dense) {
    // Every attribute of every object in the heap (0 compact ones at most), which needs the 1.8 format; capped
    // there too, so that no newer structure keeps 1.8 and 1.10 readers out.
    ST_CHECK_HDF5(H5Pset_attr_phase_change(fcpl.get(), 0, 0));
    ST_CHECK_HDF5(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18));
  }
  return {std::move(fcpl), std::move(fapl)};
}

}  // namespace

Handle create_file(const std::string& path, AttributeStorage attributes) {
  quiet_errors();
  const auto [fcpl, fapl] = creation_lists(attributes);
  errno = 0;
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
  if (f < 0) {
    // The file system's answer when it gave one (ENOSPC for no room or no inode left, EDQUOT, EACCES, ENOENT...).
    const int err = errno;
    throw IoError(err != 0 ? fmt::format("{}: cannot create HDF5 file: {}", path, std::strerror(err))
                           : fmt::format("{}: cannot create HDF5 file (does the folder exist and is it writable?)", path));
  }
  return owned(f);
}

Handle create_memory_file(const std::string& name, AttributeStorage attributes) {
  quiet_errors();
  const auto [fcpl, fapl] = creation_lists(attributes);
  ST_CHECK_HDF5(H5Pset_fapl_core(fapl.get(), 1 << 20, /*backing_store=*/0));
  return owned(ST_CHECK_HDF5(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get())));
}

Handle create_group(const Handle& parent, const std::string& name) {
  quiet_errors();
  const hid_t g = H5Gcreate2(parent.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) throw IoError(fmt::format("{}: cannot create group '{}'", file_name(parent), name));
  return owned(g);
}

Handle open_group(const Handle& parent, const std::string& name) {
  quiet_errors();
  const hid_t g = exists(parent, name) ? H5Gopen2(parent.get(), name.c_str(), H5P_DEFAULT) : -1;
  if (g < 0) throw DataError(fmt::format("{}: group '{}' is missing", file_name(parent), name));
  return owned(g);
}

bool exists(const Handle& parent, const std::string& path) {
  quiet_errors();
  // Check each component, since H5Lexists fails (rather than returning 0) on a missing intermediate.
  size_t pos = 0;
  while (true) {
    const size_t slash = path.find('/', pos);
    const std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && H5Lexists(parent.get(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

void write_u32(const Handle& p, const std::string& n, std::span<const uint32_t> d, DatasetOptions o) {
  write_1d(p, n, d, o);
}
void write_i64(const Handle& p, const std::string& n, std::span<const int64_t> d, DatasetOptions o) { write_1d(p, n, d, o); }
void write_f32(const Handle& p, const std::string& n, std::span<const float> d, DatasetOptions o) { write_1d(p, n, d, o); }
void write_u16(const Handle& p, const std::string& n, std::span<const uint16_t> d, DatasetOptions o) {
  write_1d(p, n, d, o);
}
std::vector<uint32_t> read_u32(const Handle& p, const std::string& n) { return read_1d<uint32_t>(p, n, H5T_INTEGER); }
std::vector<int64_t> read_i64(const Handle& p, const std::string& n) { return read_1d<int64_t>(p, n, H5T_INTEGER); }
std::vector<float> read_f32(const Handle& p, const std::string& n) { return read_1d<float>(p, n, H5T_FLOAT); }
std::vector<uint16_t> read_u16(const Handle& p, const std::string& n) { return read_1d<uint16_t>(p, n, H5T_INTEGER); }

size_t dataset_length(const Handle& parent, const std::string& name) {
  quiet_errors();
  size_t n = 0;
  open_1d(parent, name, &n, H5T_INTEGER);
  return n;
}

std::optional<uint64_t> raw_u32le_offset(const Handle& parent, const std::string& name) {
  quiet_errors();
  size_t n = 0;
  Handle ds = open_1d(parent, name, &n, H5T_INTEGER);
  Handle type = owned(ST_CHECK_HDF5(H5Dget_type(ds.get())));
  if (n == 0 || H5Tequal(type.get(), H5T_STD_U32LE) <= 0) return std::nullopt;
  Handle dcpl = owned(ST_CHECK_HDF5(H5Dget_create_plist(ds.get())));
  if (H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS || H5Pget_nfilters(dcpl.get()) != 0) return std::nullopt;
  // The address in the file, its user block (h5jam) already counted: HDF5 adds its base address (h5dump -p shows the
  // same offset). Counting the user block a second time mapped other bytes, refused as damaged tokens.
  const haddr_t at = H5Dget_offset(ds.get());
  if (at == HADDR_UNDEF) return std::nullopt;
  return static_cast<uint64_t>(at);
}

namespace {
template <typename T>
void read_range(const Handle& parent, const std::string& name, size_t offset, std::span<T> out, H5T_class_t cls) {
  quiet_errors();
  size_t n = 0;
  Handle ds = open_1d(parent, name, &n, cls);
  if (offset + out.size() > n)
    throw DataError(fmt::format("{}: range [{}, {}) is past the end of '{}' ({} elements)", file_name(parent), offset,
                                offset + out.size(), name, n));
  if (out.empty()) return;
  const auto [fspace, mspace] = range_spaces(ds, offset, out.size());
  // A failed read here is most often a Fletcher32 mismatch: the data on disk was corrupted.
  if (H5Dread(ds.get(), native_type<T>(), mspace.get(), fspace.get(), H5P_DEFAULT, out.data()) < 0)
    throw DataError(fmt::format("{}: cannot read '{}' [{}, {}) (corrupted data fails its checksum)", file_name(parent), name,
                                offset, offset + out.size()));
}
}  // namespace

void create_u32(const Handle& parent, const std::string& name, size_t n) {
  quiet_errors();
  const hsize_t dims = n;
  Handle space = owned(ST_CHECK_HDF5(H5Screate_simple(1, &dims, nullptr)));
  const hid_t dset =
      H5Dcreate2(parent.get(), name.c_str(), H5T_NATIVE_UINT32, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (dset < 0) throw IoError(fmt::format("{}: cannot create dataset '{}' ({} elements)", file_name(parent), name, n));
  Handle ds = owned(dset);
}

void write_u32_range(const Handle& parent, const std::string& name, size_t offset, std::span<const uint32_t> data) {
  quiet_errors();
  size_t n = 0;
  Handle ds = open_1d(parent, name, &n, H5T_INTEGER);
  if (offset + data.size() > n)
    throw InternalError(fmt::format("{}: range [{}, {}) is past the end of '{}' ({} elements)", file_name(parent), offset,
                                    offset + data.size(), name, n));
  if (data.empty()) return;
  const auto [fspace, mspace] = range_spaces(ds, offset, data.size());
  errno = 0;
  if (H5Dwrite(ds.get(), H5T_NATIVE_UINT32, mspace.get(), fspace.get(), H5P_DEFAULT, data.data()) < 0) {
    const std::string reason = os_reason();
    throw IoError(fmt::format("{}: cannot write '{}' [{}, {}){}", file_name(parent), name, offset, offset + data.size(),
                              reason.empty() ? std::string(" (disk full?)") : reason));
  }
}

void read_u32_range(const Handle& parent, const std::string& name, size_t offset, std::span<uint32_t> out) {
  read_range(parent, name, offset, out, H5T_INTEGER);
}

void read_f32_range(const Handle& parent, const std::string& name, size_t offset, std::span<float> out) {
  read_range(parent, name, offset, out, H5T_FLOAT);
}

void set_attr(const Handle& parent, const std::string& name, const std::string& value, const std::string& object) {
  quiet_errors();
  Handle target = open_attr_target(parent, object);
  if (H5Aexists(target.get(), name.c_str()) > 0) ST_CHECK_HDF5(H5Adelete(target.get(), name.c_str()));
  Handle type = owned(ST_CHECK_HDF5(H5Tcopy(H5T_C_S1)));
  ST_CHECK_HDF5(H5Tset_size(type.get(), std::max<size_t>(value.size(), 1)));
  ST_CHECK_HDF5(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  Handle space = owned(ST_CHECK_HDF5(H5Screate(H5S_SCALAR)));
  // A failure names the file, the attribute and its size (HDF5's "object header message is too large" of a
  // compact attribute over 64 KiB said neither).
  const auto refused = [&](const char* what) {
    std::string reason = "no description on the HDF5 error stack";
    H5Ewalk2(
        H5E_DEFAULT, H5E_WALK_UPWARD,
        [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
          if (n == 0 && e->desc && *e->desc) *static_cast<std::string*>(out) = e->desc;
          return 0;
        },
        &reason);
    H5Eclear2(H5E_DEFAULT);
    return IoError(fmt::format("{}: cannot {} the attribute '{}' of '{}' ({} bytes): HDF5: {}", file_name(parent), what,
                               name, object, value.size(), reason));
  };
  const hid_t a = H5Acreate2(target.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0) throw refused("create");
  Handle attr = owned(a);
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  if (H5Awrite(attr.get(), type.get(), padded.data()) < 0) throw refused("write");
}

void set_attr(const Handle& parent, const std::string& name, int64_t value, const std::string& object) {
  quiet_errors();
  Handle target = open_attr_target(parent, object);
  if (H5Aexists(target.get(), name.c_str()) > 0) ST_CHECK_HDF5(H5Adelete(target.get(), name.c_str()));
  Handle space = owned(ST_CHECK_HDF5(H5Screate(H5S_SCALAR)));
  Handle attr =
      owned(ST_CHECK_HDF5(H5Acreate2(target.get(), name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  ST_CHECK_HDF5(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value));
}

std::optional<std::string> get_attr_string(const Handle& parent, const std::string& name, const std::string& object) {
  quiet_errors();
  Handle target = open_attr_target(parent, object);
  if (H5Aexists(target.get(), name.c_str()) <= 0) return std::nullopt;
  Handle attr = owned(ST_CHECK_HDF5(H5Aopen(target.get(), name.c_str(), H5P_DEFAULT)));
  Handle type = owned(ST_CHECK_HDF5(H5Aget_type(attr.get())));
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw DataError(fmt::format("{}: attribute '{}' should be a string", file_name(parent), name));
  if (H5Tis_variable_str(type.get()) > 0) {
    char* s = nullptr;
    Handle mem = owned(ST_CHECK_HDF5(H5Tcopy(H5T_C_S1)));
    ST_CHECK_HDF5(H5Tset_size(mem.get(), H5T_VARIABLE));
    ST_CHECK_HDF5(H5Aread(attr.get(), mem.get(), &s));
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t size = H5Tget_size(type.get());
  std::string out(size, '\0');
  ST_CHECK_HDF5(H5Aread(attr.get(), type.get(), out.data()));
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

std::optional<int64_t> get_attr_int(const Handle& parent, const std::string& name, const std::string& object) {
  quiet_errors();
  Handle target = open_attr_target(parent, object);
  if (H5Aexists(target.get(), name.c_str()) <= 0) return std::nullopt;
  Handle attr = owned(ST_CHECK_HDF5(H5Aopen(target.get(), name.c_str(), H5P_DEFAULT)));
  Handle type = owned(ST_CHECK_HDF5(H5Aget_type(attr.get())));
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    throw DataError(fmt::format("{}: attribute '{}' should be an integer", file_name(parent), name));
  int64_t v = 0;
  ST_CHECK_HDF5(H5Aread(attr.get(), H5T_NATIVE_INT64, &v));
  return v;
}

std::string file_name(const Handle& h) {
  if (!h.valid()) return "<closed HDF5 handle>";
  const ssize_t n = H5Fget_name(h.get(), nullptr, 0);
  if (n <= 0) return "<HDF5>";
  std::string s(static_cast<size_t>(n) + 1, '\0');
  H5Fget_name(h.get(), s.data(), s.size());
  s.resize(static_cast<size_t>(n));
  return s;
}

}  // namespace shardtrain::hdf5
