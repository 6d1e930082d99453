#!/usr/bin/env python3
"""The PyTorch / transformers side of the reference tests (tests/torch): runs inside scripts/torch-env.sh,
prints one JSON object on its last line. Verbs:

  save DIR --layers L --hidden D --intermediate F --heads H --kv-heads K --vocab V [--tied] [--dtype f32|bf16]
           [--rope-theta T] [--rope-type default|linear|llama3 --rope-factor F --rope-low-freq-factor L
           --rope-high-freq-factor H --rope-original-max-position P] [--max-shard-size S] [--seed N]
      a randomly initialized LlamaForCausalLM written by transformers' own save_pretrained (safetensors; a
      small --max-shard-size splits it into several files with an index), as a user's model would arrive
  same-weights A B
      whether two Hugging Face directories hold the same tensors (names, shapes, values after widening both;
      a tied lm_head absent from both): {"equal": bool, "tensors": n, "differences": [...], "scaled": {name:
      largest |A - B| over B's largest magnitude}}
  seed-loop INIT_DIR OUT_DIR --data H5 --seq S --batch G --steps N --warmup W --total T [optimizer options]
           [--decay all|trainer]
      the seed's training loop (shared/seeds 002): LlamaForCausalLM from INIT_DIR, fully_shard per decoder
      layer and at the root (one process, gloo), AdamW, LinearLR(start_factor) then CosineAnnealingLR(T - W)
      in a SequentialLR, clip_grad_norm_, mean cross-entropy over the counted targets (AdamW decays every
      parameter, or with --decay trainer those transformers' Trainer.get_decay_parameter_names names); the data set's padded
      samples in order (no shuffle), one global batch per step. Writes the final weights to OUT_DIR
      (save_pretrained): {"steps": [{"step", "loss", "lr", "grad_norm"}...]}
  evaluate DIR --data H5 --seq S --samples N
      LlamaForCausalLM from DIR, in f32, over the first N padded samples of the data set's validation split:
      {"loss": the mean cross-entropy over the counted targets (summed in float64), "tokens": their count}
  tokenize DIR TEXT...
      AutoTokenizer from DIR: {"class": ..., "ids": [[...] per text], "bos"/"eos"/"pad": [text, id] or null}
  generate DIR --prompt TEXT --max-new-tokens N
      AutoTokenizer and LlamaForCausalLM from DIR, greedy decoding (no sampling) stopping at the
      tokenizer's end-of-text token: {"prompt_ids": [...], "new_ids": [...], "text": prompt + new text}
  fsdp-config FILE...
      what Accelerate and Transformers make of each FSDP configuration file. A .yaml file is an `accelerate
      config` file: `accelerate launch --config_file FILE`'s own argument handling and environment (the FSDP_*
      variables it hands the training processes), then the FullyShardedDataParallelPlugin those build and the
      mixed precision AcceleratorState applies to it. A .json file is a Transformers fsdp_config:
      TrainingArguments(fsdp=True, fsdp_config=FILE) and the plugin its Trainer builds from
      `fsdp_plugin_args`. {"configs": {FILE: {"fsdp_version", "strategy" (FSDP1's ShardingStrategy name, the
      one a model is wrapped with, or null), "stated_strategy" (FSDP1: the plugin's reshard_after_forward, where
      Transformers puts the file's strategy), "reshard_after_forward", "offload_params", "auto_wrap_policy",
      "transformer_layer_cls_to_wrap", "min_num_params", "backward_prefetch", "forward_prefetch", "state_dict_type", "activation_checkpointing",
      "sync_module_states", "cpu_ram_efficient_loading", "param_dtype", "reduce_dtype", "num_processes",
      "num_machines"} (the last four null for .json: TrainingArguments takes them elsewhere) or {"error": ...}}}
  hf-schedules --lr LR --warmup W --total T CASES_JSON
      transformers' get_scheduler (what Trainer's lr_scheduler_type selects) for each case of CASES_JSON,
      {NAME: [scheduler name, scheduler_specific_kwargs]}, over T optimizer steps: {NAME: [lr at step 0..T-1]}
  serve
      one process for all of a test's calls (importing torch and transformers takes seconds of CPU each time,
      the most of most calls): first a line {"versions": ...}, then one answer per request line on stdin,
      {"argv": [VERB, ...]} (a verb above), {"argv": ["-c", CODE, ARG...]} or {"argv": [SCRIPT.py, ARG...]}
      (as python3 would run them), each answered by one line {"rc": exit code, "out": stdout, "err": stderr}
      on the descriptor stdout was at start (stdout itself goes to stderr, so what a library writes there at C
      level cannot mix into the answers); ends at the end of stdin.
"""
import argparse
import contextlib
import io
import json
import os
import runpy
import sys
import traceback
from pathlib import Path

import torch


def safetensors_of(directory: Path) -> dict:
    from safetensors.torch import load_file
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{directory}: no .safetensors file")
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def save(a):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(a.seed)
    rope = {"rope_type": a.rope_type, "rope_theta": a.rope_theta}
    if a.rope_type != "default":
        rope["factor"] = a.rope_factor
    if a.rope_type == "llama3":
        rope.update(low_freq_factor=a.rope_low_freq_factor, high_freq_factor=a.rope_high_freq_factor,
                    original_max_position_embeddings=a.rope_original_max_position)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=a.tied,
                      rope_parameters=rope)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # transformers' init leaves the norms at 1: make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model = model.to(torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    model.save_pretrained(a.dir, max_shard_size=a.max_shard_size)
    files = sorted(p.name for p in Path(a.dir).iterdir())
    return {"files": files, "parameters": sum(p.numel() for p in model.parameters())}


def same_weights(a):
    x, y = safetensors_of(Path(a.a)), safetensors_of(Path(a.b))
    differences, scaled = [], {}
    for name in sorted(set(x) | set(y)):
        if name not in x or name not in y:
            differences.append(f"{name}: only in {a.a if name in x else a.b}")
        elif x[name].shape != y[name].shape:
            differences.append(f"{name}: shape {tuple(x[name].shape)} vs {tuple(y[name].shape)}")
        else:
            diff = (x[name].double() - y[name].double()).abs().max().item()
            scaled[name] = diff / max(y[name].double().abs().max().item(), 1e-30)
            if diff > 0:
                differences.append(f"{name}: values differ (largest {diff:.3e})")
    return {"equal": not differences, "tensors": len(x), "differences": differences, "scaled": scaled,
            "dtypes": sorted({str(t.dtype) for t in x.values()} | {str(t.dtype) for t in y.values()})}


def seed_loop(a):
    import importlib.util
    import os
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.optim import lr_scheduler
    from transformers import LlamaForCausalLM
    # The batches exactly as scripts/bench-vs-pytorch.py reads the data set (padded: [BOT] doc [EOT] [PAD]...).
    bench_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench-vs-pytorch.py")
    spec = importlib.util.spec_from_file_location("bench_vs_pytorch", bench_path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = LlamaForCausalLM.from_pretrained(a.init_dir, dtype=torch.float32, attn_implementation="eager")
    cfg = {"data": {"seq_len": a.seq, "layout": "padded", "path": a.data}, "model": {"vocab_size": model.config.vocab_size}}
    batches, source = bench.load_batches(cfg, torch, a.batch, a.steps, "cpu")
    if not source.startswith(a.data):
        raise SystemExit(f"{a.data}: not read ({source})")

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    if a.decay == "trainer":  # the two groups transformers' Trainer.create_optimizer makes
        from transformers import Trainer
        names = set(Trainer.get_decay_parameter_names(None, model))  # it reads only the model
        groups = [{"params": [p for n, p in model.named_parameters() if n in names], "weight_decay": a.weight_decay},
                  {"params": [p for n, p in model.named_parameters() if n not in names], "weight_decay": 0.0}]
    else:
        groups = [{"params": list(model.parameters()), "weight_decay": a.weight_decay}]
    optimizer = torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    warmup = lr_scheduler.LinearLR(optimizer, start_factor=a.start_factor, end_factor=1.0, total_iters=a.warmup)
    cosine = lr_scheduler.CosineAnnealingLR(optimizer, T_max=a.total - a.warmup, eta_min=0)
    scheduler = lr_scheduler.SequentialLR(optimizer, schedulers=[warmup, cosine], milestones=[a.warmup])
    whole = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # noqa: E731 - a sharded DTensor gathered
    steps = []
    for k, (inp, tgt) in enumerate(batches):
        lr = optimizer.param_groups[0]["lr"]
        logits = model(input_ids=inp, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_norm)
        optimizer.step()
        scheduler.step()
        steps.append({"step": k + 1, "loss": loss.item(), "lr": lr, "grad_norm": float(whole(norm)),
                      "counted": int((tgt != -100).sum())})
    full = {name: whole(p).detach().clone() for name, p in model.named_parameters()}
    dist.destroy_process_group()
    plain = LlamaForCausalLM.from_pretrained(a.init_dir, dtype=torch.float32)
    plain.load_state_dict(full, strict=True)
    plain.save_pretrained(a.out_dir)
    return {"steps": steps, "data": source}


def evaluate(a):
    """The mean loss of LlamaForCausalLM from a.dir over the first a.samples padded samples of the data set's
    validation split, as `shardtrain evaluate` reads them (bench-vs-pytorch.py's reader: [BOT] doc [EOT] [PAD]...)."""
    import importlib.util
    import os
    from transformers import LlamaForCausalLM
    bench_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench-vs-pytorch.py")
    spec = importlib.util.spec_from_file_location("bench_vs_pytorch", bench_path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = LlamaForCausalLM.from_pretrained(a.dir, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = {"data": {"seq_len": a.seq, "layout": "padded", "path": a.data}, "model": {"vocab_size": model.config.vocab_size}}
    batches, source = bench.load_batches(cfg, torch, 1, a.samples, "cpu", split="validation")
    if not source.startswith(a.data):
        raise SystemExit(f"{a.data}: not read ({source})")
    total, counted = 0.0, 0
    with torch.no_grad():
        for inp, tgt in batches:
            logits = model(input_ids=inp, use_cache=False).logits
            total += float(torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).double(), tgt.view(-1),
                                                             ignore_index=-100, reduction="sum"))
            counted += int((tgt != -100).sum())
    return {"loss": total / counted, "tokens": counted, "data": source}


def tokenize(a):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(a.dir)
    role = lambda text, id_: None if text is None else [text, id_]  # noqa: E731
    return {"class": type(tokenizer).__name__, "ids": [tokenizer(t, add_special_tokens=False).input_ids for t in a.texts],
            "bos": role(tokenizer.bos_token, tokenizer.bos_token_id), "eos": role(tokenizer.eos_token, tokenizer.eos_token_id),
            "pad": role(tokenizer.pad_token, tokenizer.pad_token_id),
            "decoded": [tokenizer.decode(tokenizer(t, add_special_tokens=False).input_ids) for t in a.texts]}


def resave_tokenizer(a):
    """The tokenizer.json a user gets from transformers after loading one and saving it again."""
    from transformers import PreTrainedTokenizerFast
    PreTrainedTokenizerFast(tokenizer_file=a.file).save_pretrained(a.out)
    return {"bytes": os.path.getsize(os.path.join(a.out, "tokenizer.json"))}


def generate(a):
    from transformers import AutoTokenizer, LlamaForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(a.dir)
    model = LlamaForCausalLM.from_pretrained(a.dir, dtype=torch.float32)
    model.eval()
    ids = tokenizer(a.prompt, add_special_tokens=False, return_tensors="pt").input_ids
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.max_new_tokens,
                             do_sample=False, eos_token_id=eos, pad_token_id=eos if eos is not None else 0)
    new = out[0, ids.shape[1]:].tolist()
    if eos is not None and eos in new:
        new = new[:new.index(eos)]
    return {"prompt_ids": ids[0].tolist(), "new_ids": new, "eos_id": eos,
            "text": a.prompt + tokenizer.decode(new, skip_special_tokens=False),
            "tokenizer_class": type(tokenizer).__name__}


def fsdp_config(a):
    import os
    import tempfile
    import accelerate.utils.dataclasses as acc_dataclasses
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from transformers import TrainingArguments

    # The plugin ends by building a param_init_fn for sync_module_states on "the current device" and refuses a
    # machine without an accelerator. That function is only called when a model is wrapped, and the device
    # is no part of how the file is read, so the check is told there is a CUDA device 0.
    acc_dataclasses.is_cuda_available = lambda: True
    torch.cuda.current_device = lambda: 0
    dtype_names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    clean_env = dict(os.environ)
    results = {}
    for path in a.files:
        os.environ.clear()
        os.environ.update(clean_env)
        launch = None
        try:
            if path.endswith(".json"):
                with tempfile.TemporaryDirectory() as out:
                    targs = TrainingArguments(output_dir=out, fsdp=True, fsdp_config=path, report_to=[])
                plugin = FullyShardedDataParallelPlugin(**targs.fsdp_plugin_args)  # as Trainer builds it
            else:
                launch = launch_command_parser().parse_args(["--config_file", path, "train.py"])
                launch = _validate_launch_command(launch)[0]
                os.environ.update(prepare_multi_gpu_env(launch))
                plugin = FullyShardedDataParallelPlugin()
                mixed = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
                if mixed != "no":  # what AcceleratorState does with the plugin (accelerate/state.py)
                    plugin.set_mixed_precision(mixed)
        except Exception as e:  # a file Accelerate or Transformers refuses: its message
            results[path] = {"error": f"{type(e).__name__}: {e}"}
            continue
        v1 = plugin.fsdp_version == 1
        policy = plugin.auto_wrap_policy
        policy_name = {None: "NO_WRAP"}.get(policy) or {"transformer_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                                          "size_based_auto_wrap_policy": "SIZE_BASED_WRAP"}[policy.__name__]
        # FSDP1: sharding_strategy (reshard_after_forward only when that is unset), a ShardingStrategy
        strategy = (plugin.sharding_strategy or plugin.reshard_after_forward).name.lstrip("_") if v1 else None
        # What the file said, where the plugin also holds it as reshard_after_forward (Transformers, FSDP1)
        stated = getattr(plugin.reshard_after_forward, "name", None) if v1 else None
        mp = plugin.mixed_precision_policy
        results[path] = {
            "fsdp_version": plugin.fsdp_version,
            "strategy": strategy,
            "stated_strategy": stated.lstrip("_") if stated else None,
            "reshard_after_forward": strategy in ("FULL_SHARD", "HYBRID_SHARD") if v1 else plugin.reshard_after_forward,
            "offload_params": bool(plugin.cpu_offload.offload_params) if v1 else type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy",
            "auto_wrap_policy": policy_name,
            "transformer_layer_cls_to_wrap": plugin.transformer_cls_names_to_wrap,
            "min_num_params": plugin.min_num_params,
            "backward_prefetch": plugin.backward_prefetch.name if plugin.backward_prefetch is not None else None,
            "forward_prefetch": plugin.forward_prefetch,
            "state_dict_type": plugin.state_dict_type.name,
            "activation_checkpointing": plugin.activation_checkpointing,
            "sync_module_states": plugin.sync_module_states,
            "cpu_ram_efficient_loading": plugin.cpu_ram_efficient_loading,
            "param_dtype": None if launch is None else dtype_names[mp.param_dtype] if mp is not None else "fp32",
            "reduce_dtype": None if launch is None else dtype_names[mp.reduce_dtype] if mp is not None else "fp32",
            "num_processes": launch.num_processes if launch else None,
            "num_machines": launch.num_machines if launch else None,
        }
    os.environ.clear()
    os.environ.update(clean_env)
    return {"configs": results}


def hf_schedules(a):
    from transformers import get_scheduler
    out = {}
    for name, (kind, kwargs) in json.loads(a.cases).items():
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=a.lr)
        sched = get_scheduler(kind, opt, num_warmup_steps=a.warmup, num_training_steps=a.total,
                              scheduler_specific_kwargs=kwargs)
        lrs = []
        for _ in range(a.total):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        out[name] = lrs
    return out


def parser():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("save")
    s.add_argument("dir")
    for name, default in (("layers", 2), ("hidden", 64), ("intermediate", 96), ("heads", 4), ("kv-heads", 2),
                          ("vocab", 301), ("seed", 0)):
        s.add_argument(f"--{name}", type=int, default=default)
    s.add_argument("--tied", action="store_true")
    s.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    s.add_argument("--rope-theta", type=float, default=10000.0)
    s.add_argument("--rope-type", choices=["default", "linear", "llama3"], default="default")
    s.add_argument("--rope-factor", type=float, default=8.0)
    s.add_argument("--rope-low-freq-factor", type=float, default=1.0)
    s.add_argument("--rope-high-freq-factor", type=float, default=4.0)
    s.add_argument("--rope-original-max-position", type=int, default=8192)
    s.add_argument("--max-shard-size", default="5GB")
    w = sub.add_parser("same-weights")
    w.add_argument("a")
    w.add_argument("b")
    r = sub.add_parser("seed-loop")
    r.add_argument("init_dir")
    r.add_argument("out_dir")
    r.add_argument("--data", required=True)
    for name in ("seq", "batch", "steps", "warmup", "total"):
        r.add_argument(f"--{name}", type=int, required=True)
    for name, default in (("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.99), ("eps", 1e-8), ("weight-decay", 0.1),
                          ("start-factor", 0.1), ("max-norm", 1.0)):
        r.add_argument(f"--{name}", type=float, default=default)
    r.add_argument("--decay", choices=["all", "trainer"], default="all")
    t = sub.add_parser("tokenize")
    t.add_argument("dir")
    t.add_argument("texts", nargs="+")
    v = sub.add_parser("resave-tokenizer")
    v.add_argument("file")
    v.add_argument("out")
    g = sub.add_parser("generate")
    g.add_argument("dir")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, default=40)
    e = sub.add_parser("evaluate")
    e.add_argument("dir")
    e.add_argument("--data", required=True)
    e.add_argument("--seq", type=int, required=True)
    e.add_argument("--samples", type=int, required=True)
    c = sub.add_parser("fsdp-config")
    c.add_argument("files", nargs="+")
    h = sub.add_parser("hf-schedules")
    h.add_argument("cases")
    h.add_argument("--lr", type=float, required=True)
    h.add_argument("--warmup", type=int, required=True)
    h.add_argument("--total", type=int, required=True)
    sub.add_parser("serve")
    return p


VERBS = {"save": save, "same-weights": same_weights, "seed-loop": seed_loop, "tokenize": tokenize, "generate": generate,
         "resave-tokenizer": resave_tokenizer,
         "fsdp-config": fsdp_config, "hf-schedules": hf_schedules, "evaluate": evaluate}


def run_request(argv):
    """One request of serve: (exit code, stdout, stderr), as a python3 process running it would give them."""
    out, err = io.StringIO(), io.StringIO()
    rc = 0
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if argv and argv[0] == "-c":
                sys.argv = ["-c", *argv[2:]]
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            elif argv and argv[0].endswith(".py"):
                sys.argv = list(argv)
                runpy.run_path(argv[0], run_name="__main__")
            else:
                a = parser().parse_args(argv)
                torch.set_float32_matmul_precision("highest")
                print(json.dumps(VERBS[a.verb](a)))
        except SystemExit as e:  # sys.exit(N) or SystemExit("message"), as the interpreter reports them
            if isinstance(e.code, int) or e.code is None:
                rc = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                rc = 1
        except BaseException:  # noqa: B036 - the interpreter's own report of an uncaught exception
            traceback.print_exc()
            rc = 1
        finally:
            sys.argv = saved_argv
            os.chdir(saved_cwd)
    return rc, out.getvalue(), err.getvalue()


def serve():
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    import transformers
    try:
        import accelerate
        accelerate_version = accelerate.__version__
    except ImportError:
        accelerate_version = None
    answers.write(json.dumps({"versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                                           "transformers": transformers.__version__, "accelerate": accelerate_version}}) + "\n")
    answers.flush()
    for line in sys.stdin:
        if line.strip():
            rc, out, err = run_request(json.loads(line)["argv"])
            answers.write(json.dumps({"rc": rc, "out": out, "err": err}) + "\n")
            answers.flush()


def main():
    a = parser().parse_args()
    if a.verb == "serve":
        serve()
        return
    torch.set_float32_matmul_precision("highest")
    result = VERBS[a.verb](a)
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
