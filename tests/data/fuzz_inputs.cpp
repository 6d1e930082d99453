// libFuzzer targets for the readers of binary inputs: any bytes, as a file, opened and every string column and
// every column of token id lists read. Anything but a DataError (a crash, an overflow the sanitizers see, another exception) is a finding.
// One source, two targets: fuzz_parquet (ParquetFile) and fuzz_arrow (ArrowIpcFile), chosen by
// SHARDTRAIN_FUZZ_ARROW. Built with clang when SHARDTRAIN_FUZZ=ON (docs/data.md, "Parquet inputs"):
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DSHARDTRAIN_CUDA=OFF -DSHARDTRAIN_FUZZ=ON
//   cmake --build build-fuzz --target fuzz_parquet fuzz_arrow
//   build-fuzz/bin/fuzz_arrow -max_total_time=600 -max_len=8192 CORPUS_DIR   # seed it with small files
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "shardtrain/data/arrow_ipc.hpp"
#include "shardtrain/data/parquet.hpp"
#include "shardtrain/runtime/error.hpp"

#ifdef SHARDTRAIN_FUZZ_ARROW
using Reader = shardtrain::data::ArrowIpcFile;
#else
using Reader = shardtrain::data::ParquetFile;
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/shardtrain-fuzz-" + std::to_string(::getpid()) + ".input";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const auto file = Reader::open(path);
    for (const auto& c : file.columns()) {
      if (!c.is_string) continue;
      size_t bytes = 0;
      file.for_each_string(file.string_column(c.path),
                           [&](std::optional<std::string_view> v) { bytes += v ? v->size() : 0; });
    }
    for (const auto& c : file.columns()) {  // token id columns too
      if (!c.is_id_list) continue;
      int64_t sum = 0;
      file.for_each_id_list(file.id_list_column(c.path), [&](std::optional<std::span<const int64_t>> ids) {
        if (ids) sum += static_cast<int64_t>(ids->size());
      });
    }
  } catch (const shardtrain::DataError&) {
  }
  return 0;
}
