// The CUDA emulator's devices (SHARDTRAIN_CUDA=EMULATED): how many the machine has, which of them a process
// sees, and what identifies each; the runtime calls that ask (cuda_runtime.cpp keeps memory and streams).
//
// SHARDTRAIN_CUDA_EMULATOR_DEVICES=N (default 1) gives the machine N physical devices, so that ranks
// on one machine each take one of their own and talk over the emulated NCCL (nccl.cpp); each process is its
// own device. Physical device p has an identity as a GPU does: a UUID (cudaDeviceProp::uuid, derived from p
// and the host name) and a PCI bus id (0000:<0x10 + p>:00.0, cudaDeviceGetPCIBusId and the pci* properties).
// CUDA_VISIBLE_DEVICES is honored as the CUDA runtime does: a comma-separated list of physical indices or
// UUIDs (GPU-..., a unique prefix is enough) makes those devices, in that order, ordinals 0, 1, ...; the list
// ends at the first entry that names no device (or one already listed), and a list naming none leaves no
// device (cudaGetDeviceCount fails with cudaErrorNoDevice). So a rank that sees "2" has one device, ordinal
// 0, with physical device 2's identity.
//
// SHARDTRAIN_CUDA_EMULATOR_HUNG=1 makes this process's GPU one that stopped answering (fallen off the bus): its
// first call, cudaGetDeviceCount, never returns, as the driver's first call hangs on such a node.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/emulator/cuda_emulator.hpp"

namespace shardtrain::cuda_emulator {
namespace {

// Physical device p's UUID: 16 bytes from p and the host name, so that devices of different machines differ.
cudaUUID_t device_uuid(int p) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  uint32_t h = 2166136261u;  // FNV-1a of the host name
  for (const char* c = host; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
  const unsigned char bytes[16] = {0x5e,
                                   0x7d,
                                   0xa1,
                                   0x00,
                                   static_cast<unsigned char>(h >> 24),
                                   static_cast<unsigned char>(h >> 16),
                                   0x40,
                                   static_cast<unsigned char>(h >> 8),
                                   0x80,
                                   static_cast<unsigned char>(h),
                                   0,
                                   0,
                                   0,
                                   0,
                                   0,
                                   static_cast<unsigned char>(p)};
  cudaUUID_t u{};
  std::memcpy(u.bytes, bytes, sizeof bytes);
  return u;
}

// As nvidia-smi and CUDA_VISIBLE_DEVICES write it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
std::string uuid_text(const cudaUUID_t& u) {
  std::string out = "GPU-";
  char hex2[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(hex2, sizeof hex2, "%02x", static_cast<unsigned char>(u.bytes[i]));
    out += hex2;
  }
  return out;
}

// CUDA_VISIBLE_DEVICES as the runtime reads it (see the header comment); unset: every physical device.
std::vector<int> visible_devices(const char* list, int physical) {
  std::vector<int> out;
  if (list == nullptr) {
    for (int p = 0; p < physical; ++p) out.push_back(p);
    return out;
  }
  std::string v = list;
  size_t start = 0;
  while (start <= v.size()) {
    const size_t comma = v.find(',', start);
    std::string entry = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    int found = -1;
    if (entry.rfind("GPU-", 0) == 0) {
      for (int p = 0; p < physical; ++p) {
        if (uuid_text(device_uuid(p)).rfind(entry, 0) != 0) continue;
        if (found >= 0) {  // a prefix that names two devices names none
          found = -1;
          break;
        }
        found = p;
      }
    } else if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string::npos && entry.size() < 4) {
      found = std::atoi(entry.c_str());
      if (found >= physical) found = -1;
    }
    if (found < 0 || std::find(out.begin(), out.end(), found) != out.end()) break;
    out.push_back(found);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

struct Devices {
  int physical = 1;             // SHARDTRAIN_CUDA_EMULATOR_DEVICES: the machine's devices
  std::vector<int> visible;     // the physical device of each ordinal (CUDA_VISIBLE_DEVICES); its size is the count
  std::atomic<int> current{0};  // cudaSetDevice's ordinal

  Devices() {
    if (const char* s = std::getenv("SHARDTRAIN_CUDA_EMULATOR_DEVICES"); s && *s) {
      physical = std::atoi(s);
      if (physical < 1 || physical > 64) fatal(std::string("SHARDTRAIN_CUDA_EMULATOR_DEVICES=") + s + ": expected 1 to 64");
    }
    visible = visible_devices(std::getenv("CUDA_VISIBLE_DEVICES"), physical);
  }
};

Devices& devices() {
  static Devices* d = new Devices;  // never destroyed, as the runtime's state
  return *d;
}

}  // namespace
}  // namespace shardtrain::cuda_emulator

using namespace shardtrain::cuda_emulator;  // NOLINT: the C API below is this file's whole purpose

extern "C" {

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  if (const char* s = std::getenv("SHARDTRAIN_CUDA_EMULATOR_HUNG"); s && std::string(s) == "1")
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  *count = static_cast<int>(devices().visible.size());
  if (*count > 0) return cudaSuccess;
  // The runtime's answer (silent) when CUDA_VISIBLE_DEVICES hides every device.
  return record_error(cudaErrorNoDevice, "");
}

// Each process emulates one device at a time: every device number it may set shares its memory and streams
// (ranks with GPUs of their own are processes of their own).
cudaError_t CUDARTAPI cudaSetDevice(int device) {
  Devices& d = devices();
  if (device < 0 || device >= static_cast<int>(d.visible.size()))
    return record_error(cudaErrorInvalidDevice,
                        "cudaSetDevice(" + std::to_string(device) + "): " + std::to_string(d.visible.size()) +
                            " visible device(s) (SHARDTRAIN_CUDA_EMULATOR_DEVICES, CUDA_VISIBLE_DEVICES)");
  d.current = device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = devices().current;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  const Devices& d = devices();
  if (device < 0 || device >= static_cast<int>(d.visible.size()))
    return record_error(cudaErrorInvalidDevice, "cudaGetDeviceProperties(" + std::to_string(device) + ")");
  const int p = d.visible[static_cast<size_t>(device)];
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "shardtrain CUDA emulator (host)");
  prop->uuid = device_uuid(p);
  prop->pciDomainID = 0;
  prop->pciBusID = 0x10 + p;
  prop->pciDeviceID = 0;
  prop->totalGlobalMem = kDeviceMemory;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->multiProcessorCount = 4;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetPCIBusId(char* pci_bus_id, int len, int device) {
  const Devices& d = devices();
  if (device < 0 || device >= static_cast<int>(d.visible.size()))
    return record_error(cudaErrorInvalidDevice, "cudaDeviceGetPCIBusId(" + std::to_string(device) + ")");
  if (pci_bus_id == nullptr || len < 13) return record_error(cudaErrorInvalidValue, "cudaDeviceGetPCIBusId: len < 13");
  std::snprintf(pci_bus_id, static_cast<size_t>(len), "0000:%02x:00.0", 0x10 + d.visible[static_cast<size_t>(device)]);
  return cudaSuccess;
}

}  // extern "C"
