// What is on disk: the safetensors export parsed by its specification, and every bad-input case
// (a missing, truncated or corrupted rank file, no DONE, a model that does not match, a failed or
// repeated save) giving one clear error that names the file, with older checkpoints untouched.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "harness.hpp"
#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/checkpoint/export.hpp"
#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/runtime/hdf5_checksum.hpp"
#include "src/checkpoint/broadcast.hpp"

namespace fs = std::filesystem;
using namespace shardtrain;
using namespace shardtrain::testing_fsdp;

namespace {

const auto* const cleanup = ::testing::AddGlobalTestEnvironment(new testing_ckpt::CleanupEnvironment);

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Trains two steps on the world and saves after each: returns the checkpoint directory's parent.
std::string saved_run(const std::string& tag, bool tied = false) {
  const std::string dir = testing_ckpt::fresh_dir(tag);
  RunOptions o;
  o.steps = 2;
  o.model.tie_word_embeddings = tied;
  o.after_step = [&](int step, fsdp::FsdpEngine& e, optim::AdamW& a) {
    checkpoint::SaveMeta m;
    m.step = step + 1;
    m.tokenizer = R"({"name": "test", "eot_id": 3})";
    checkpoint::save_sharded(e, a, dir, m, 0);
  };
  run_training(MPI_COMM_WORLD, ranks_per_node_from_env(), o);
  return dir;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return {};
}

std::string copy_of(const std::string& ckpt, const std::string& name) {
  const std::string out = fs::path(ckpt).parent_path().string() + "/" + name;
  fs::remove_all(out);
  fs::copy(ckpt, out, fs::copy_options::recursive);
  return out;
}

uint64_t le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}

}  // namespace

TEST(CheckpointFiles, SafetensorsFollowTheFormat) {
  const std::string dir = saved_run("safetensors", /*tied=*/true);
  if (world_rank() == 0) {
    const std::string ckpt = checkpoint::find_latest(dir);
    checkpoint::CheckpointReader reader(ckpt);
    for (DType dt : {DType::F32, DType::BF16}) {
      for (uint64_t limit : {uint64_t{1} << 30, uint64_t{4096}}) {
        SCOPED_TRACE(fmt::format("{} limit {}", dtype_name(dt), limit));
        const std::string out = fmt::format("{}/hf_{}_{}", dir, dtype_name(dt), limit);
        checkpoint::ExportOptions eo;
        eo.format = checkpoint::ExportFormat::Safetensors;
        eo.dtype = dt;
        eo.max_shard_bytes = limit;
        const checkpoint::ExportSummary s = checkpoint::consolidate(ckpt, out, eo);
        std::map<std::string, std::string> file_of;
        if (s.files > 1) {
          const auto index = nlohmann::json::parse(std::ifstream(out + "/model.safetensors.index.json"));
          for (auto& [k, v] : index.at("weight_map").items()) file_of[k] = v.get<std::string>();
          EXPECT_GT(index.at("metadata").at("total_size").get<uint64_t>(), 0u);
        }
        int64_t seen = 0;
        std::set<std::string> files;
        if (s.files == 1) {
          for (const auto& t : reader.tensors()) file_of[t.name] = "model.safetensors";
        }
        for (auto& [k, v] : file_of) files.insert(v);
        EXPECT_EQ(static_cast<int>(files.size()), s.files);
        for (const std::string& file : files) {
          std::ifstream in(out + "/" + file, std::ios::binary);
          const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          ASSERT_GE(bytes.size(), 8u);
          const uint64_t n = le64(bytes.data());
          ASSERT_LE(8 + n, bytes.size());
          EXPECT_EQ((8 + n) % 8, 0u);  // data 8-byte aligned
          const auto header =
              nlohmann::json::parse(std::string(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n)));
          uint64_t expect_begin = 0;
          std::vector<std::pair<uint64_t, std::string>> spans;
          for (auto& [name, info] : header.items()) {
            if (name == "__metadata__") continue;
            spans.emplace_back(info.at("data_offsets")[0].get<uint64_t>(), name);
          }
          std::sort(spans.begin(), spans.end());
          for (const auto& [begin, name] : spans) {
            const auto& info = header.at(name);
            const checkpoint::TensorInfo& t = reader.tensor(name);
            EXPECT_EQ(info.at("dtype").get<std::string>(), dt == DType::BF16 ? "BF16" : "F32");
            EXPECT_EQ(info.at("shape").get<std::vector<int64_t>>(), t.shape);
            const uint64_t end = info.at("data_offsets")[1].get<uint64_t>();
            EXPECT_EQ(begin, expect_begin) << name;  // contiguous, no gaps
            EXPECT_EQ(end - begin, static_cast<uint64_t>(t.numel) * dtype_size(dt));
            expect_begin = end;
            std::vector<float> want(static_cast<size_t>(t.numel));
            reader.read(name, "param", 0, want);
            const unsigned char* data = bytes.data() + 8 + n + begin;
            for (size_t i = 0; i < want.size(); ++i) {
              float got = 0;
              if (dt == DType::BF16) {
                uint16_t b = static_cast<uint16_t>(data[2 * i] | (data[2 * i + 1] << 8));
                ASSERT_EQ(b, bf16(want[i]).bits) << name << "[" << i << "]";
                continue;
              }
              std::memcpy(&got, data + 4 * i, 4);
              ASSERT_EQ(got, want[i]) << name << "[" << i << "]";
            }
            ++seen;
          }
          EXPECT_EQ(8 + n + expect_begin, bytes.size());  // nothing after the last tensor
        }
        EXPECT_EQ(seen, static_cast<int64_t>(reader.tensors().size()));
        EXPECT_EQ(reader.tensors().size(), 3u * 9 + 2);  // tied: no lm_head.weight
        const auto config = nlohmann::json::parse(std::ifstream(out + "/config.json"));
        EXPECT_EQ(config.at("architectures")[0], "LlamaForCausalLM");
        EXPECT_EQ(config.at("num_key_value_heads"), 1);
        EXPECT_EQ(config.at("tie_word_embeddings"), true);
        EXPECT_EQ(config.at("eos_token_id"), 3);
        if (limit == 4096) {
          EXPECT_GT(s.files, 1);
        }
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CheckpointFiles, BadInputGivesOneClearErrorNamingTheFile) {
  const std::string dir = saved_run("bad");
  if (world_rank() == 0) {
    const std::string good = checkpoint::find_latest(dir);
    ASSERT_NE(good.find("step_00000002"), std::string::npos);

    const std::string missing = copy_of(good, "missing_rank");
    fs::remove(missing + "/rank_00001.h5");
    EXPECT_NE(error_of([&] { checkpoint::CheckpointReader r(missing); }).find("rank_00001.h5"), std::string::npos);

    const std::string truncated = copy_of(good, "truncated_rank");
    fs::resize_file(truncated + "/rank_00001.h5", fs::file_size(truncated + "/rank_00001.h5") / 2);
    EXPECT_NE(error_of([&] { checkpoint::CheckpointReader r(truncated); }).find("rank_00001.h5"), std::string::npos);

    const std::string no_done = copy_of(good, "no_done");
    fs::remove(no_done + "/DONE");
    EXPECT_NE(error_of([&] { checkpoint::CheckpointReader r(no_done); }).find("no DONE marker"), std::string::npos);

    // Flip bytes inside the first chunk of a dataset: its Fletcher32 checksum no longer matches.
    const std::string corrupt = copy_of(good, "corrupt");
    haddr_t addr = 0;
    {
      const hid_t f = H5Fopen((corrupt + "/rank_00000.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      const hid_t d = H5Dopen2(f, "units/0001/exp_avg", H5P_DEFAULT);
      const hid_t space = H5Dget_space(d);
      hsize_t offset[1], size = 0;
      unsigned mask = 0;
      ASSERT_GE(H5Dget_chunk_info(d, space, 0, offset, &mask, &addr, &size), 0);
      H5Sclose(space), H5Dclose(d), H5Fclose(f);
    }
    {
      std::fstream io(corrupt + "/rank_00000.h5", std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(static_cast<std::streamoff>(addr + 8));
      const char junk[4] = {'\x5a', '\x5a', '\x5a', '\x5a'};
      io.write(junk, 4);
    }
    checkpoint::CheckpointReader opened(corrupt);  // the metadata is intact
    const std::string e = error_of([&] { opened.verify_checksums(); });
    EXPECT_NE(e.find("rank_00000.h5"), std::string::npos) << e;
    EXPECT_NE(e.find("checksum"), std::string::npos) << e;

    // The good checkpoint is untouched by all of the above, and still verifies.
    checkpoint::CheckpointReader ok(good);
    EXPECT_GT(ok.verify_checksums(), 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Every attribute, layout and link of every file is checked against its metadata checksum when the checkpoint is
// opened: a trainer state rewritten with one digit changed (as an HDF5 tool would) is refused, naming the file, the
// object and the attribute. A checkpoint saved before the records existed opens, reported as unchecked.
TEST(CheckpointFiles, MetadataIsCheckedOnOpening) {
  const std::string dir = saved_run("metadata");
  if (world_rank() == 0) {
    const std::string good = checkpoint::find_latest(dir);
    {
      checkpoint::CheckpointReader r(good);
      EXPECT_EQ(r.metadata().files_checked, 3);  // index.h5 and both rank files
      EXPECT_EQ(r.metadata().files_unrecorded, 0);
      EXPECT_GT(r.metadata().entries, 40);
    }

    const std::string changed = copy_of(good, "tokenizer_changed");
    {
      auto f = hdf5::open_file(changed + "/index.h5", hdf5::FileMode::ReadWrite);
      std::string record = hdf5::get_attr_string(f, "tokenizer").value();  // {"name": "test", "eot_id": 3}
      const size_t at = record.find('3');
      EXPECT_NE(at, std::string::npos) << record;
      if (at != std::string::npos) record[at] = '2';
      hdf5::set_attr(f, "tokenizer", record);
    }
    try {
      checkpoint::CheckpointReader r(changed);
      ADD_FAILURE() << "no CheckpointDamaged";
    } catch (const checkpoint::CheckpointDamaged& e) {
      EXPECT_NE(std::string(e.what()).find(changed +
                                           "/index.h5: the root group: attribute 'tokenizer' does not match the checksum"),
                std::string::npos)
          << e.what();
    }

    // Intact but of a newer format (its checksums recorded anew, as a newer build writes them): a plain checkpoint
    // error, not damage, which --resume auto would set aside as step_N.damaged and train past.
    const std::string newer = copy_of(good, "newer_format");
    {
      auto f = hdf5::open_file(newer + "/index.h5", hdf5::FileMode::ReadWrite);
      hdf5::set_attr(f, "format_version", int64_t{2});
      hdf5::record_metadata_checksums(f);
    }
    try {
      checkpoint::CheckpointReader r(newer);
      ADD_FAILURE() << "a newer format opened";
    } catch (const checkpoint::CheckpointDamaged& e) {
      ADD_FAILURE() << "a newer format is not damage: " << e.what();
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(newer + "/index.h5: format version 2, and this build reads version 1: the "
                                                   "checkpoint was saved by a newer shardtrain"),
                std::string::npos)
          << e.what();
    }

    const std::string unrecorded = copy_of(good, "unrecorded");
    for (const char* name : {"index.h5", "rank_00000.h5", "rank_00001.h5"}) {
      auto f = hdf5::open_file(unrecorded + "/" + name, hdf5::FileMode::ReadWrite);
      std::vector<std::string> objects{"."};
      if (hdf5::exists(f, "units")) {
        objects.push_back("units");
        for (int u = 0; hdf5::exists(f, fmt::format("units/{:04}", u)); ++u)
          for (const char* o : {"", "/param", "/exp_avg", "/exp_avg_sq"})
            objects.push_back(fmt::format("units/{:04}{}", u, o));
      }
      for (const std::string& o : objects)
        EXPECT_GE(H5Adelete_by_name(static_cast<hid_t>(f.get()), o.c_str(), hdf5::kMetadataChecksums, H5P_DEFAULT), 0)
            << name << " " << o;
    }
    checkpoint::CheckpointReader old(unrecorded);
    EXPECT_EQ(old.metadata().files_unrecorded, 3);
    EXPECT_EQ(old.metadata().files_checked, 0);
    EXPECT_GT(old.verify_checksums(), 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CheckpointFiles, ModelMismatchIsRefused) {
  const std::string dir = saved_run("mismatch");
  if (world_rank() == 0) {
    RunOptions o;
    o.steps = 0;
    o.model.hidden_size = 24;
    o.model.num_attention_heads = 4;
    o.model.intermediate_size = 40;
    const std::string ckpt = checkpoint::find_latest(dir);
    o.before_first_step = [&](fsdp::FsdpEngine& e, optim::AdamW& a) {
      const std::string msg = error_of([&] { checkpoint::load(e, &a, ckpt); });
      EXPECT_NE(msg.find("hidden_size"), std::string::npos) << msg;
      EXPECT_NE(msg.find(ckpt), std::string::npos) << msg;
    };
    run_training(MPI_COMM_SELF, 0, o);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CheckpointFiles, FailedAndRepeatedSavesLoseNothing) {
  const std::string dir = saved_run("failed_save");
  if (world_rank() == 0) {
    const std::string good = checkpoint::find_latest(dir);
    const auto done_time = fs::last_write_time(good + "/DONE");
    const auto rank_time = fs::last_write_time(good + "/rank_00000.h5");
    RunOptions o;
    o.steps = 0;
    o.before_first_step = [&](fsdp::FsdpEngine& e, optim::AdamW& a) {
      checkpoint::SaveMeta m;
      m.step = 2;  // the same step again: left as it is
      checkpoint::save_sharded(e, a, dir, m, 0);
      m.step = 7;
      ::setenv("SHARDTRAIN_CHECKPOINT_FAULT", "fail_write", 1);
      EXPECT_THROW(checkpoint::save_sharded(e, a, dir, m, 1), IoError);
      ::unsetenv("SHARDTRAIN_CHECKPOINT_FAULT");
    };
    run_training(MPI_COMM_SELF, 0, o);
    EXPECT_EQ(fs::last_write_time(good + "/DONE"), done_time);
    EXPECT_EQ(fs::last_write_time(good + "/rank_00000.h5"), rank_time);
    EXPECT_EQ(checkpoint::find_latest(dir), good);         // the failed save is not a checkpoint
    for (const auto& entry : fs::directory_iterator(dir))  // removed: a failed save gives its space back
      EXPECT_NE(entry.path().filename().string().rfind("step_00000007.tmp", 0), 0u) << entry.path();
    EXPECT_FALSE(fs::exists(dir + "/step_00000007"));
    checkpoint::CheckpointReader still(good);
    EXPECT_EQ(still.step(), 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CheckpointFiles, ImportFromEverySourceInBothModes) {
  const std::string dir = saved_run("import");
  const std::string ckpt = checkpoint::find_latest(dir);
  const std::string h5 = dir + "/consolidated.h5", hf = dir + "/hf";
  // A FULL_STATE_DICT checkpoint of the same weights, its model.h5 named as a file: what --resume's refusal of a file
  // advises to give init_from (it was refused: "not a consolidated shardtrain file").
  const std::string full_dir = testing_ckpt::fresh_dir("import_full");
  {
    RunOptions o;
    o.steps = 0;
    o.before_first_step = [&](fsdp::FsdpEngine& e, optim::AdamW& a) {
      checkpoint::load(e, nullptr, ckpt);
      checkpoint::SaveMeta m;
      m.step = 2;
      checkpoint::save_full(e, a, full_dir, m, 0);
    };
    run_training(MPI_COMM_WORLD, ranks_per_node_from_env(), o);
  }
  const std::string full_model = checkpoint::find_latest(full_dir) + "/model.h5";
  if (world_rank() == 0) {
    checkpoint::ExportOptions eo;
    checkpoint::consolidate(ckpt, h5, eo);
    eo.format = checkpoint::ExportFormat::Safetensors;
    eo.max_shard_bytes = 8192;  // several files
    checkpoint::consolidate(ckpt, hf, eo);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  checkpoint::CheckpointReader reader(ckpt);
  for (const std::string& path : {ckpt, h5, hf, full_model}) {
    for (checkpoint::ImportMode mode :
         {checkpoint::ImportMode::EveryRankReadsItsSlices, checkpoint::ImportMode::NodeLeaderReads}) {
      SCOPED_TRACE(path + (mode == checkpoint::ImportMode::NodeLeaderReads ? " node leader" : " every rank"));
      RunOptions o;
      o.steps = 0;
      o.fsdp.strategy = ShardingStrategy::ShardGradOp;
      o.fsdp.wrap.policy = fsdp::WrapPolicy::SizeBased;
      o.fsdp.wrap.min_num_params = 200;
      o.before_first_step = [&](fsdp::FsdpEngine& e, optim::AdamW&) {
        auto source = checkpoint::open_tensor_source(path);
        checkpoint::import_weights(e, *source, mode);
      };
      const RunResult r = run_training(MPI_COMM_WORLD, ranks_per_node_from_env(), o);
      const model::ModelSpec spec(tiny_config());
      for (const auto& [p, values] : r.params) {
        std::vector<float> want(values.size());
        reader.read(spec.param(p).name, "param", 0, want);
        EXPECT_EQ(std::memcmp(want.data(), values.data(), values.size() * 4), 0) << spec.param(p).name;
      }
    }
  }
  if (world_rank() == 0) {
    const std::string e = error_of([&] { checkpoint::open_tensor_source(dir + "/nothing-here"); });
    EXPECT_NE(e.find("nothing-here"), std::string::npos);
    EXPECT_EQ(checkpoint::open_tensor_source(full_model)->step(), 2);
    // A model.h5 copied out of its checkpoint has no model config beside it: refused, saying what is expected.
    const std::string alone = dir + "/model.h5";
    fs::copy_file(full_model, alone);
    const std::string e_alone = error_of([&] { checkpoint::open_tensor_source(alone); });
    EXPECT_NE(e_alone.find(alone + ": not a consolidated shardtrain file"), std::string::npos) << e_alone;
    EXPECT_NE(e_alone.find("a checkpoint folder (step_N"), std::string::npos) << e_alone;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// cpu_ram_efficient_loading's node leader hands each unit to its node in pieces: one MPI_Bcast of a unit of 2^32 + k
// elements once sent k (the other ranks kept zeros for the rest, silently). Pieces of 3 here stand for MPI's limit.
TEST(CheckpointFiles, NodeLeaderBroadcastsInPieces) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int root = world - 1;
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{10}}) {
    std::vector<float> v(n, -1.0f);
    if (world_rank() == root)
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) + 0.5f;
    checkpoint::broadcast_floats(MPI_COMM_WORLD, v, root, 3);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(v[i], static_cast<float>(i) + 0.5f) << "element " << i << " of " << n;
  }
  std::vector<float> v(4);
  EXPECT_THROW(checkpoint::broadcast_floats(MPI_COMM_WORLD, v, 0, 0), InternalError);
  EXPECT_THROW(checkpoint::broadcast_floats(MPI_COMM_WORLD, v, 0, size_t{1} << 31), InternalError);
}

// config.json as either transformers major version writes it: 4.x's top-level rope_theta and rope_scaling,
// 5.x's rope_parameters (the export writes both). RoPE scaling of the types shardtrain computes (linear, llama3)
// is read; what its Llama does not compute (other RoPE types, partial rotation, biases, another activation) is
// refused with the file named, never silently dropped.
TEST(CheckpointFiles, HfConfigOfEitherTransformersVersion) {
  const std::string dir = saved_run("hf_config");
  if (world_rank() == 0) {
    const std::string hf = dir + "/hf";
    checkpoint::ExportOptions eo;
    eo.format = checkpoint::ExportFormat::Safetensors;
    checkpoint::consolidate(checkpoint::find_latest(dir), hf, eo);
    const fs::path cfg = fs::path(hf) / "config.json";
    const nlohmann::json exported = nlohmann::json::parse(std::ifstream(cfg));
    EXPECT_EQ(exported["rope_theta"], exported["rope_parameters"]["rope_theta"]);
    EXPECT_EQ(exported["rope_parameters"]["rope_type"], "default");
    EXPECT_TRUE(exported["rope_scaling"].is_null());
    const auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
      nlohmann::json j = exported;
      edit(j);
      std::ofstream(cfg) << j.dump(2);
    };
    const auto read = [&] { return checkpoint::open_tensor_source(hf)->model_config(); };
    with([](nlohmann::json& j) {  // transformers 5
      j.erase("rope_theta");
      j.erase("rope_scaling");
      j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500.0}};
    });
    EXPECT_EQ(read().rope_theta, 500.0);
    EXPECT_EQ(read().rope_scaling, ops::RopeScaling::None);
    with([](nlohmann::json& j) {  // transformers 4
      j.erase("rope_parameters");
      j["rope_theta"] = 250.0;
    });
    EXPECT_EQ(read().rope_theta, 250.0);
    with([](nlohmann::json& j) {  // Llama 3.1's config.json, 5.x form
      j.erase("rope_theta");
      j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 5e5},
                              {"factor", 32.0},          {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    });
    model::LlamaConfig c = read();
    EXPECT_EQ(c.rope_scaling, ops::RopeScaling::Llama3);
    EXPECT_EQ(c.rope_theta, 5e5);
    EXPECT_EQ(c.rope_factor, 32.0);
    EXPECT_EQ(c.rope_low_freq_factor, 1.0);
    EXPECT_EQ(c.rope_high_freq_factor, 4.0);
    EXPECT_EQ(c.rope_original_max_position_embeddings, 8192);
    with([](nlohmann::json& j) {  // the same in 4.x's form
      j.erase("rope_parameters");
      j["rope_theta"] = 5e5;
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", 8.0},
                           {"low_freq_factor", 2.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 4096}};
    });
    c = read();
    EXPECT_EQ(c.rope_scaling, ops::RopeScaling::Llama3);
    EXPECT_EQ(c.rope_theta, 5e5);
    EXPECT_EQ(c.rope_factor, 8.0);
    EXPECT_EQ(c.rope_low_freq_factor, 2.0);
    EXPECT_EQ(c.rope_original_max_position_embeddings, 4096);
    with([](nlohmann::json& j) {
      j.erase("rope_parameters");
      j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    });
    EXPECT_EQ(read().rope_scaling, ops::RopeScaling::Linear);
    EXPECT_EQ(read().rope_factor, 2.0);

    // What the export writes for a scaled model reads back the same, in both forms.
    const std::string scaled_dir = dir + "/hf-llama3";
    // One tensor, of the shape the config describes (a reader checks every tensor's shape against it).
    std::vector<float> zeros(static_cast<size_t>(c.hidden_size), 0.0f);
    const std::vector<checkpoint::FullTensor> tensors = {{"model.norm.weight", {c.hidden_size}, zeros}};
    checkpoint::export_hf_directory(c, tensors, scaled_dir, eo);
    const nlohmann::json written = nlohmann::json::parse(std::ifstream(fs::path(scaled_dir) / "config.json"));
    EXPECT_EQ(written["rope_parameters"]["rope_type"], "llama3");
    EXPECT_EQ(written["rope_scaling"]["rope_type"], "llama3");
    EXPECT_EQ(written["rope_scaling"]["original_max_position_embeddings"], 4096);
    EXPECT_FALSE(written["rope_scaling"].contains("rope_theta"));
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      nlohmann::json one = written;
      one.erase(key);
      std::ofstream(fs::path(scaled_dir) / "config.json") << one.dump(2);
      EXPECT_EQ(checkpoint::open_tensor_source(scaled_dir)->model_config().rope_frequencies(), c.rope_frequencies()) << key;
    }

    const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> refused = {
        {[](nlohmann::json& j) {
           j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}, {"factor", 4.0}};
         },
         "rope_parameters.rope_type is \"yarn\""},
        {[](nlohmann::json& j) {
           j.erase("rope_parameters");
           j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
         },
         "rope_scaling.rope_type is \"dynamic\""},
        {[](nlohmann::json& j) {
           j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
         },
         "disagree"},
        {[](nlohmann::json& j) { j["rope_theta"] = 123.0; }, "rope_theta 123.0 and rope_parameters.rope_theta"},
        {[](nlohmann::json& j) {
           j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 1e4}, {"factor", 8.0}};
         },
         "has no number low_freq_factor"},
        {[](nlohmann::json& j) {
           j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 1e4}, {"factor", 0.5}};
         },
         "model.rope_factor"},
        {[](nlohmann::json& j) {
           j["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
         },
         "partial_rotary_factor"},
        {[](nlohmann::json& j) { j["partial_rotary_factor"] = 0.25; }, "partial_rotary_factor is 0.25"},
        {[](nlohmann::json& j) { j["attention_bias"] = true; }, "attention_bias"},
        {[](nlohmann::json& j) { j["mlp_bias"] = true; }, "mlp_bias"},
        {[](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, "hidden_act is \"gelu\""},
    };
    for (const auto& [edit, what] : refused) {
      with(edit);
      const std::string e = error_of([&] { checkpoint::open_tensor_source(hf); });
      EXPECT_NE(e.find(cfg.string()), std::string::npos) << e;
      EXPECT_NE(e.find(what), std::string::npos) << e;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// What a killed save leaves (a temporary of the old name, or of a save's own name since 2026-11-28) is removed
// at start; a temporary holding a user's file, and a name that is no save's, are left.
TEST(CheckpointFiles, IncompleteSavesAreRemovedAndForeignFilesLeft) {
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_incomplete_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto make = [&](const std::string& name, const std::string& file) {
    fs::create_directories(dir / name);
    std::ofstream(dir / name / file) << "x";
  };
  make("step_00000003.tmp", "index.h5");
  make("step_00000004.tmp-123-0000abcd", "rank_00000.h5");
  make("step_00000005.tmp-1-00000002", "notes.txt");
  make("step_00000006.tmpfoo", "index.h5");
  const std::vector<std::string> removed = checkpoint::remove_incomplete(dir.string());
  std::set<std::string> names;
  for (const std::string& p : removed) names.insert(fs::path(p).filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"step_00000003.tmp", "step_00000004.tmp-123-0000abcd"}));
  EXPECT_FALSE(fs::exists(dir / "step_00000004.tmp-123-0000abcd"));
  EXPECT_TRUE(fs::exists(dir / "step_00000005.tmp-1-00000002" / "notes.txt"));
  EXPECT_TRUE(fs::exists(dir / "step_00000006.tmpfoo" / "index.h5"));
  fs::remove_all(dir);
}
