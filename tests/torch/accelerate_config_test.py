#!/usr/bin/env python3
"""`shardtrain train --accelerate-config FILE` against Accelerate itself: for the seed's example file and
variants covering every fsdp_config key, both FSDP versions and all five sharding strategies, what
`accelerate launch --config_file FILE` would hand its FullyShardedDataParallelPlugin (tests/torch/torch_side.py
accelerate-config: Accelerate's own argument handling, environment and plugin) against shardtrain's resolved
configuration (`--print-config`), key by key. Where shardtrain reads a file differently on purpose, the test
pins the difference (DIFFERENCE 1-5 below, docs/training.md), so that it is neither silent nor accidental."""
import os
import subprocess
import tomllib

from torch_env import Test

t = Test()
args, check, work, env = t.args, t.check, t.work, t.env

# Every file starts like the ones `accelerate config` writes.
HEAD = ("compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: FSDP\ndowncast_bf16: 'no'\n"
        "machine_rank: 0\nmain_training_function: main\nrdzv_backend: static\nsame_network: true\n"
        "tpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n")
CASES = {
    # FSDP1, a strategy by number, prefetch after, a size policy, a full state dict, no mixed precision
    "v1_shard_grad_op": ("mixed_precision: 'no'\nnum_machines: 1\nnum_processes: 2\nfsdp_config:\n"
                         "  fsdp_sharding_strategy: 2\n  fsdp_backward_prefetch: BACKWARD_POST\n"
                         "  fsdp_forward_prefetch: true\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"
                         "  fsdp_min_num_params: 1000000\n  fsdp_state_dict_type: FULL_STATE_DICT\n"
                         "  fsdp_offload_params: false\n  fsdp_sync_module_states: false\n"
                         "  fsdp_cpu_ram_efficient_loading: false\n"
                         "  fsdp_activation_checkpointing: true\n"),
    # a strategy by name, no prefetch, no wrapping
    "v1_no_shard": ("mixed_precision: bf16\nnum_machines: 1\nnum_processes: 4\nfsdp_config:\n"
                    "  fsdp_sharding_strategy: NO_SHARD\n  fsdp_backward_prefetch: NO_PREFETCH\n"
                    "  fsdp_auto_wrap_policy: NO_WRAP\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n"),
    # the hybrid strategies over two machines, prefetch before
    "v1_hybrid": ("mixed_precision: bf16\nnum_machines: 2\nnum_processes: 8\nfsdp_config:\n"
                  "  fsdp_sharding_strategy: 4\n  fsdp_backward_prefetch: BACKWARD_PRE\n"
                  "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
                  "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_cpu_ram_efficient_loading: true\n"
                  "  fsdp_sync_module_states: true\n"),
    "v1_hybrid_zero2": ("mixed_precision: bf16\nnum_machines: 2\nnum_processes: 4\nfsdp_config:\n"
                        "  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\n  fsdp_backward_prefetch: BACKWARD_PRE\n"
                        "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                        "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n  fsdp_state_dict_type: FULL_STATE_DICT\n"),
    # FSDP2: reshard_after_forward as a boolean, offload, Accelerate's default prefetch
    "v2_reshard": ("mixed_precision: bf16\nnum_machines: 1\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"
                   "  fsdp_reshard_after_forward: true\n  fsdp_offload_params: true\n"
                   "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
                   "  fsdp_state_dict_type: FULL_STATE_DICT\n  fsdp_cpu_ram_efficient_loading: true\n"),
    "v2_no_reshard": ("mixed_precision: 'no'\nnum_machines: 1\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"
                      "  fsdp_reshard_after_forward: false\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                      "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                      "  fsdp_activation_checkpointing: true\n"),
}
files = {"seed_example": os.path.join(args.source, "configs", "examples", "accelerate_fsdp.yaml")}
for name, body in CASES.items():
    files[name] = os.path.join(work, f"{name}.yaml")
    with open(files[name], "w") as f:
        f.write(HEAD + body)

theirs = env.side("accelerate-config", *files.values())["configs"]
base = os.path.join(args.source, "configs", "tiny-cpu.toml")


def ours_for(path):
    """shardtrain's resolved configuration: tiny-cpu.toml, then the file (none: the TOML alone)."""
    p = subprocess.run([args.shardtrain, "train", "--config", base, *(["--accelerate-config", path] if path else []),
                        "--print-config"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"{path}: shardtrain --print-config exit {p.returncode}: {p.stderr[-800:]}")
    return (tomllib.loads(p.stdout) if p.returncode == 0 else None), p.stderr


RESHARDS = {"FULL_SHARD": True, "HYBRID_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD_ZERO2": False, "NO_SHARD": False}
LLAMA_CLASSES = {"LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm", "Embedding", "Linear"}
compared = 0
for name, path in files.items():
    a = theirs[path]
    if "error" in a:
        check(False, f"{name}: Accelerate refused the file: {a['error']}")
        continue
    o, log = ours_for(path)
    if o is None:
        continue
    fsdp, ckpt = o["fsdp"], o["checkpoint"]
    text = open(path).read()

    def same(key, acc, shard, named=None):
        """Accelerate's value and shardtrain's must agree when the file names the key (`named`, a fsdp_config
        key; None: always). A key the file leaves out keeps shardtrain's own value (DIFFERENCE 4, below)."""
        global compared
        if named and f"  {named}:" not in text:
            return
        compared += 1
        check(acc == shard, f"{name}: {key}: Accelerate {acc!r}, shardtrain {shard!r}")

    our_reshard = RESHARDS[fsdp["strategy"]] if fsdp["reshard_after_forward"] == "auto" else fsdp["reshard_after_forward"]
    if a["fsdp_version"] == 1:
        same("sharding strategy", a["strategy"], fsdp["strategy"], "fsdp_sharding_strategy")
        same("reshard_after_forward", a["reshard_after_forward"], our_reshard, "fsdp_sharding_strategy")
        same("sync_module_states", a["sync_module_states"], fsdp["sync_module_states"], "fsdp_sync_module_states")
        same("forward_prefetch", a["forward_prefetch"], fsdp["forward_prefetch"] > 0, "fsdp_forward_prefetch")
        same("backward_prefetch", a["backward_prefetch"] is not None, fsdp["backward_prefetch"] > 0, "fsdp_backward_prefetch")
        if "fsdp_backward_prefetch_policy" in text:
            # DIFFERENCE 1: the seed's example (and Accelerate's own older docs) spell the key
            # fsdp_backward_prefetch_policy; Accelerate 1.x reads only fsdp_backward_prefetch and drops it
            # without a word (no prefetch). shardtrain takes either spelling: the file asks for BACKWARD_PRE.
            check(a["backward_prefetch"] is None and fsdp["backward_prefetch"] == 1,
                  f"{name}: backward_prefetch_policy: Accelerate {a['backward_prefetch']!r}, shardtrain {fsdp['backward_prefetch']!r}")
    else:
        # FSDP2 has no strategy and no prefetch options: it prefetches one unit ahead in both passes by itself
        # (Accelerate sets backward_prefetch to None and warns), and reshard_after_forward alone says whether
        # parameters are freed after forward. shardtrain: a sharding strategy, that reshard_after_forward, and its
        # default of one unit of prefetch, FSDP2's own.
        same("reshard_after_forward", a["reshard_after_forward"], our_reshard, "fsdp_reshard_after_forward")
        same("fsdp2 shards gradients and optimizer state", True, fsdp["strategy"] in ("FULL_SHARD", "SHARD_GRAD_OP"))
        same("fsdp2 implicit prefetch", (1, 0), (fsdp["backward_prefetch"], fsdp["forward_prefetch"]))
    same("offload_params", a["offload_params"], fsdp["offload_params"], "fsdp_offload_params")
    same("auto_wrap_policy", a["auto_wrap_policy"], fsdp["auto_wrap_policy"], "fsdp_auto_wrap_policy")
    if a["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP":
        classes = a["transformer_layer_cls_to_wrap"]
        if set(classes) <= LLAMA_CLASSES:
            same("transformer_layer_cls_to_wrap", classes, fsdp["transformer_layer_cls_to_wrap"])
        else:
            # DIFFERENCE 2: a class the Llama model does not have (the seed example's BertLayer) would wrap
            # nothing in PyTorch; shardtrain wraps its decoder layer and says so.
            check(fsdp["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"] and "is not a Llama module class" in log,
                  f"{name}: {classes} -> {fsdp['transformer_layer_cls_to_wrap']} without a note")
    if a["auto_wrap_policy"] == "SIZE_BASED_WRAP":
        same("min_num_params", a["min_num_params"], fsdp["min_num_params"], "fsdp_min_num_params")
    same("state_dict_type", a["state_dict_type"], ckpt["state_dict_type"], "fsdp_state_dict_type")
    same("activation_checkpointing", a["activation_checkpointing"], fsdp["activation_checkpointing"],
         "fsdp_activation_checkpointing")
    same("cpu_ram_efficient_loading", a["cpu_ram_efficient_loading"], ckpt["cpu_ram_efficient_loading"],
         "fsdp_cpu_ram_efficient_loading")
    same("param_dtype", a["param_dtype"], fsdp["param_dtype"])
    # DIFFERENCE 3: mixed_precision bf16 makes Accelerate reduce gradients in bf16 as well; shardtrain keeps
    # reduce_dtype (fp32 unless set: the seed article's MixedPrecisionPolicy, and sums of many ranks' bf16
    # gradients lose bits). fsdp.reduce_dtype = "bf16" gives Accelerate's behaviour.
    check(fsdp["reduce_dtype"] == "fp32" and a["reduce_dtype"] == a["param_dtype"],
          f"{name}: reduce_dtype: Accelerate {a['reduce_dtype']!r}, shardtrain {fsdp['reduce_dtype']!r}")
    same("num_processes", a["num_processes"], fsdp["num_processes"])
    same("num_machines", a["num_machines"], fsdp["num_machines"])

print(f"{len(files)} files, {compared} values compared")
check(compared >= 60, f"only {compared} values compared")

# DIFFERENCE 4: keys a file leaves out. `accelerate launch` fills in its own defaults: sync_module_states and
# cpu_ram_efficient_loading on, and then the plugin's: no wrapping, a full state dict, no backward prefetch
# (FSDP1). shardtrain leaves such keys as the TOML (or its defaults) has them: the file changes only what it
# names (precedence in docs/training.md). Pinned on a file that names the strategy alone.
bare = os.path.join(work, "bare.yaml")
with open(bare, "w") as f:
    f.write(HEAD + "mixed_precision: bf16\nnum_machines: 1\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: 1\n")
a = env.side("accelerate-config", bare)["configs"][bare]
o, _ = ours_for(bare)
if o is not None:
    got = (a["sync_module_states"], a["cpu_ram_efficient_loading"], a["auto_wrap_policy"], a["state_dict_type"],
           a["backward_prefetch"])
    check(got == (True, True, "NO_WRAP", "FULL_STATE_DICT", None), f"bare file, Accelerate: {got}")
    ours = (o["fsdp"]["sync_module_states"], o["checkpoint"]["cpu_ram_efficient_loading"], o["fsdp"]["auto_wrap_policy"],
            o["checkpoint"]["state_dict_type"], o["fsdp"]["backward_prefetch"])
    t, _ = ours_for(None)
    toml_alone = (t["fsdp"]["sync_module_states"], t["checkpoint"]["cpu_ram_efficient_loading"], t["fsdp"]["auto_wrap_policy"],
                  t["checkpoint"]["state_dict_type"], t["fsdp"]["backward_prefetch"])
    check(ours == toml_alone, f"bare file, shardtrain: {ours}, the TOML alone: {toml_alone}")

# DIFFERENCE 5: Accelerate's launcher refuses fsdp_cpu_ram_efficient_loading without fsdp_sync_module_states,
# because its other ranks would start from empty weights that only the broadcast fills. shardtrain's
# ram-efficient load hands every rank its shards itself, so the pair needs no broadcast and is accepted.
pair = os.path.join(work, "ram_without_sync.yaml")
with open(pair, "w") as f:
    f.write(HEAD + "mixed_precision: bf16\nnum_machines: 1\nnum_processes: 2\nfsdp_config:\n"
                   "  fsdp_sharding_strategy: 1\n  fsdp_cpu_ram_efficient_loading: true\n  fsdp_sync_module_states: false\n")
refused = env.side("accelerate-config", pair)["configs"][pair]
check("sync_module_states" in refused.get("error", ""), f"Accelerate took cpu_ram_efficient_loading without sync: {refused}")
o, _ = ours_for(pair)
check(o is not None and o["checkpoint"]["cpu_ram_efficient_loading"] and not o["fsdp"]["sync_module_states"],
      "shardtrain did not keep cpu_ram_efficient_loading without sync_module_states")

check.finish("PASS: shardtrain reads every fsdp_config key a file names as Accelerate does, but for the pinned differences")
