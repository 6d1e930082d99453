#!/usr/bin/env python3
"""`shardtrain train --accelerate-config FILE` and `--fsdp-config FILE` against Accelerate and Transformers
themselves: for the seed's two example files and variants covering every key, both FSDP versions and all
five sharding strategies, the FullyShardedDataParallelPlugin that `accelerate launch --config_file FILE`
or a Trainer with TrainingArguments(fsdp=True, fsdp_config=FILE) would build (tests/torch/torch_side.py
fsdp-config: their own argument handling, environment and plugin) against shardtrain's resolved
configuration (`--print-config`), key by key. Where shardtrain reads a file differently on purpose, the test
pins the difference (DIFFERENCE 1-6 below, docs/training.md), so that it is neither silent nor accidental."""
import json
import os
import re
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

# Transformers fsdp_config files (JSON), with and without the fsdp_ prefix Transformers strips.
JSON_CASES = {
    "json_v1": {"version": 1, "reshard_after_forward": "SHARD_GRAD_OP", "backward_prefetch": "BACKWARD_POST",
                "forward_prefetch": True, "sync_module_states": False, "cpu_ram_efficient_loading": False,
                "auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 1000000, "state_dict_type": "SHARDED_STATE_DICT",
                "activation_checkpointing": True, "cpu_offload": True, "use_orig_params": True},
    "json_v1_prefixed": {"fsdp_version": 1, "fsdp_reshard_after_forward": "hybrid_shard",
                         "fsdp_backward_prefetch": "backward_pre", "fsdp_sync_module_states": True,
                         "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "fsdp_state_dict_type": "FULL_STATE_DICT"},
    "json_v1_no_shard": {"version": 1, "reshard_after_forward": "NO_SHARD", "backward_prefetch": "NO_PREFETCH",
                         "forward_prefetch": False, "auto_wrap_policy": "NO_WRAP"},
    "json_v2_no_reshard": {"version": 2, "reshard_after_forward": False, "cpu_offload": False, "auto_wrap_policy": "NO_WRAP",
                           "state_dict_type": "SHARDED_STATE_DICT", "activation_checkpointing": False},
}
files["seed_fsdp_config_json"] = os.path.join(args.source, "configs", "examples", "fsdp_config.json")
for name, body in JSON_CASES.items():
    files[name] = os.path.join(work, f"{name}.json")
    with open(files[name], "w") as f:
        json.dump(body, f)

theirs = env.side("fsdp-config", *files.values())["configs"]
base = os.path.join(args.source, "configs", "tiny-cpu.toml")


def ours_for(path):
    """shardtrain's resolved configuration: tiny-cpu.toml, then the file (none: the TOML alone)."""
    flag = "--fsdp-config" if path and path.endswith(".json") else "--accelerate-config"
    p = subprocess.run([args.shardtrain, "train", "--config", base, *([flag, path] if path else []), "--print-config"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"{path}: shardtrain --print-config exit {p.returncode}: {p.stderr[-800:]}")
    return (tomllib.loads(p.stdout) if p.returncode == 0 else None), p.stderr


RESHARDS = {"FULL_SHARD": True, "HYBRID_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD_ZERO2": False, "NO_SHARD": False}
LLAMA_CLASSES = {"LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm", "Embedding", "Linear"}
compared = 0
for name, path in files.items():
    a = theirs[path]
    if "error" in a:
        check(False, f"{name}: Accelerate/Transformers refused the file: {a['error']}")
        continue
    o, log = ours_for(path)
    if o is None:
        continue
    fsdp, ckpt = o["fsdp"], o["checkpoint"]
    text = open(path).read()
    if path.endswith(".json"):
        named = {k[5:] if k.startswith("fsdp_") else k for k in json.loads(text)}
    else:
        named = set(re.findall(r"^\s+fsdp_(\w+):", text, re.M))

    def same(key, acc, shard, *names):
        """Their value and shardtrain's must agree when the file names the option (one of `names`, without
        the fsdp_ prefix; none given: always). An option the file leaves out keeps shardtrain's own value
        (DIFFERENCE 4, below)."""
        global compared
        if names and not named & set(names):
            return
        compared += 1
        check(acc == shard, f"{name}: {key}: Accelerate/Transformers {acc!r}, shardtrain {shard!r}")

    our_reshard = RESHARDS[fsdp["strategy"]] if fsdp["reshard_after_forward"] == "auto" else fsdp["reshard_after_forward"]
    if a["fsdp_version"] == 1:
        if path.endswith(".json"):
            # DIFFERENCE 6: Transformers 5 hands an FSDP1 file's strategy (its reshard_after_forward) to the
            # plugin as reshard_after_forward, but Accelerate's plugin fills sharding_strategy from the
            # environment first (FULL_SHARD unless `accelerate launch` set it) and wraps the model with that
            # (accelerator.py: `sharding_strategy or reshard_after_forward`): under torchrun every FSDP1
            # fsdp_config runs FULL_SHARD. shardtrain runs the strategy the file names.
            same("stated sharding strategy", a["stated_strategy"], fsdp["strategy"], "reshard_after_forward")
            check(a["strategy"] == "FULL_SHARD", f"{name}: Transformers' FSDP1 plugin wraps with {a['strategy']}")
        else:
            same("sharding strategy", a["strategy"], fsdp["strategy"], "sharding_strategy", "reshard_after_forward")
            same("reshard_after_forward", a["reshard_after_forward"], our_reshard, "sharding_strategy", "reshard_after_forward")
        same("sync_module_states", a["sync_module_states"], fsdp["sync_module_states"], "sync_module_states")
        same("forward_prefetch", a["forward_prefetch"], fsdp["forward_prefetch"] > 0, "forward_prefetch")
        same("backward_prefetch", a["backward_prefetch"] is not None, fsdp["backward_prefetch"] > 0, "backward_prefetch")
        if "backward_prefetch_policy" in named:
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
        same("reshard_after_forward", a["reshard_after_forward"], our_reshard, "reshard_after_forward")
        same("fsdp2 shards gradients and optimizer state", True, fsdp["strategy"] in ("FULL_SHARD", "SHARD_GRAD_OP"))
        same("fsdp2 implicit prefetch", (1, 1), (fsdp["backward_prefetch"], fsdp["forward_prefetch"]))
    same("offload_params", a["offload_params"], fsdp["offload_params"], "offload_params", "cpu_offload")
    same("auto_wrap_policy", a["auto_wrap_policy"], fsdp["auto_wrap_policy"], "auto_wrap_policy")
    if a["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP":
        classes = a["transformer_layer_cls_to_wrap"]
        if set(classes or []) <= LLAMA_CLASSES:
            same("transformer_layer_cls_to_wrap", classes, fsdp["transformer_layer_cls_to_wrap"], "transformer_layer_cls_to_wrap")
        else:
            # DIFFERENCE 2: a class the Llama model does not have (the seed example's BertLayer) would wrap
            # nothing in PyTorch; shardtrain wraps its decoder layer and says so.
            check(fsdp["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"] and "is not a Llama module class" in log,
                  f"{name}: {classes} -> {fsdp['transformer_layer_cls_to_wrap']} without a note")
    if a["auto_wrap_policy"] == "SIZE_BASED_WRAP":
        same("min_num_params", a["min_num_params"], fsdp["min_num_params"], "min_num_params")
    same("state_dict_type", a["state_dict_type"], ckpt["state_dict_type"], "state_dict_type")
    same("activation_checkpointing", a["activation_checkpointing"], fsdp["activation_checkpointing"],
         "activation_checkpointing")
    same("cpu_ram_efficient_loading", a["cpu_ram_efficient_loading"], ckpt["cpu_ram_efficient_loading"],
         "cpu_ram_efficient_loading")
    if path.endswith(".json"):  # Transformers takes precision and processes from TrainingArguments, not this file
        continue
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
a = env.side("fsdp-config", bare)["configs"][bare]
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
refused = env.side("fsdp-config", pair)["configs"][pair]
check("sync_module_states" in refused.get("error", ""), f"Accelerate took cpu_ram_efficient_loading without sync: {refused}")
o, _ = ours_for(pair)
check(o is not None and o["checkpoint"]["cpu_ram_efficient_loading"] and not o["fsdp"]["sync_module_states"],
      "shardtrain did not keep cpu_ram_efficient_loading without sync_module_states")

check.finish("PASS: shardtrain reads every key a file names as Accelerate and Transformers do, but for the pinned differences")
