#!/usr/bin/env python3
"""shardtrain against PyTorch FSDP2 on the same GPU, the same model and the same batch shape, in one table.

Parts, each in its own process (a crash or a hang in one still leaves the others' rows, with its error shown):
  shardtrain          `shardtrain bench step --config CONFIG` (optionally under a launcher, e.g. "mpirun -np 1")
  shardtrain+offload  the same with --fsdp.offload_params true
  PyTorch eager       transformers LlamaForCausalLM (attn_implementation="sdpa") from the config's [model],
                      torch.distributed on one process (nccl), fully_shard on each decoder layer and at the root with
                      MixedPrecisionPolicy(param_dtype, reduce_dtype) from [fsdp], AdamW with [optim]'s values,
                      clip_grad_norm_ to optim.max_grad_norm, micro-batches of the config's shape accumulated to the
                      global batch; cross-entropy in fp32 over the logits, summed and divided by the global batch's
                      counted targets (as shardtrain normalizes); a constant learning rate
  PyTorch compile     the same with torch.compile (default mode) on each decoder layer, the compiled wrapper put in
                      the layer's place before fully_shard, and on the loss function (torchtitan's components);
                      embedding, final norm and lm_head stay eager
On a GPU both PyTorch parts run attention through SDPA with its flash backend forced
(torch.nn.attention.sdpa_kernel(FLASH_ATTENTION)); where flash refuses the shapes, the default choice runs and the
row says why. The compiled part logs its graph breaks (torch._dynamo's counters).
Batches: the config's data.path read with h5py in its layout (packed or padded, first documents of the train split,
in order) when the file exists, else uniformly random token ids of the same shape; the table says which.
Timing: CUDA events around each whole step (all micro-batches, clipping, optimizer step, zero_grad) after --warmup
steps; median of --steps. MFU uses shardtrain's FLOPs per token (src/train/metrics.cpp: 6 * (parameters minus the
input embedding, tied or not) + 12 * layers * hidden * seq) over the device's dense bf16 datasheet peak (the one
shardtrain's bench step reports, src/ops/peak_spec.cpp: H100 SXM / H200 989 TFLOP/s), the same denominator for
every row; beside it, labelled, MFU over the peak each side measured in its own process (PyTorch: the median of 20
bf16 8192^3 torch.matmul after 5 warm-ups). Where shardtrain has no datasheet figure for the device (the CPU, an
unknown GPU) the first MFU column is each side's measured peak, and the table says so. Memory:
torch.cuda.max_memory_allocated (and reserved) since the model was built (after the peak measurement);
shardtrain's device_memory_stats().peak on a GPU.

--torch-device cpu runs the PyTorch parts on the CPU (gloo, wall-clock step times, a 2048^3 matmul peak in the
model's param_dtype, the process's peak RSS as memory, compared with shardtrain's peak RSS): the check of this
script on a machine without a GPU (tests/torch), not a benchmark.
--torch-python names the Python that has torch and transformers when it is not this one, e.g.
"scripts/torch-env.sh run python3" (docs/reference-checks.md).

  scripts/bench-vs-pytorch.py --config configs/llama-seed.toml --shardtrain build/bin/shardtrain \\
      --launcher "mpirun -np 1" --override data.path=data/sotu-bpe4k.h5 --out bench-out
  scripts/bench-vs-pytorch.py --config configs/tiny-cpu.toml --shardtrain build/bin/shardtrain --skip-torch   # smoke test
"""
import argparse
import contextlib
import json
import math
import os
import shlex
import resource
import statistics
import subprocess
import sys
import time
import tomllib

PARTS = ["shardtrain", "shardtrain+offload", "PyTorch eager", "PyTorch compile"]
FILE_STEM = {"shardtrain": "shardtrain", "shardtrain+offload": "shardtrain-offload", "PyTorch eager": "torch-eager",
             "PyTorch compile": "torch-compile"}
# Issue 35's targets (the MFU one per shape: --mfu-target); the offload one is issue 8's.
TARGETS = {"vs_eager": 1.3, "vs_compile": 1.3, "mfu": 0.5, "memory": 1.0, "offload": 0.5}
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="shardtrain TOML config (model, fsdp, optim, data)")
    p.add_argument("--shardtrain", default="build/bin/shardtrain", help="the shardtrain binary")
    p.add_argument("--launcher", default="", help='prefix for the shardtrain runs, e.g. "mpirun -np 1"')
    p.add_argument("--override", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="applied to both sides (shardtrain gets --SECTION.KEY VALUE); repeatable")
    p.add_argument("--steps", type=int, default=10, help="timed steps per part (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (torch.compile compiles in these)")
    p.add_argument("--timeout", type=float, default=240, help="seconds each part may take")
    p.add_argument("--mfu-target", type=float, default=TARGETS["mfu"], help="the MFU target of this shape (a fraction)")
    p.add_argument("--title", default="", help="the shape's name in the table's heading (default: the config's file name)")
    p.add_argument("--out", default="bench-out", help="folder for the table (markdown, JSON) and each part's log")
    p.add_argument("--skip-torch", action="store_true", help="only the shardtrain rows (no torch needed)")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of: " + ", ".join(PARTS))
    p.add_argument("--reuse", action="store_true", help="parts not run this time take their JSON from --out, if there")
    p.add_argument("--torch-device", choices=["cuda", "cpu"], default="cuda",
                   help="where the PyTorch parts run (cpu: a check of this script without a GPU, not a benchmark)")
    p.add_argument("--torch-python", default=sys.executable,
                   help='the command that runs Python with torch and transformers (default: this Python), '
                        'e.g. "scripts/torch-env.sh run python3"')
    # internal: one PyTorch part in its own process
    p.add_argument("--torch-worker", choices=["eager", "compile"], help=argparse.SUPPRESS)
    p.add_argument("--worker-config", help=argparse.SUPPRESS)
    p.add_argument("--worker-json", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        p.error(f"--steps {a.steps} / --warmup {a.warmup}: expected at least 1 timed step and 0 or more warm-up steps")
    return a


def child_env():
    env = dict(os.environ)
    for k, v in MPI_ENV.items():
        env.setdefault(k, v)
    return env


def toml_value(text):
    """An override's value as TOML reads it (numbers, booleans, lists), else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def split_override(o):
    if "=" not in o or "." not in o.split("=", 1)[0]:
        raise SystemExit(f"--override {o!r}: expected SECTION.KEY=VALUE, e.g. data.path=data/sotu-bpe4k.h5")
    key, value = o.split("=", 1)
    return key, value


def resolve_config(args):
    """The config as shardtrain resolves it (`train --print-config` with the overrides), or, when that fails, the
    TOML file with the overrides applied here (defaults the file leaves out are then shardtrain's documented ones)."""
    flags = [x for o in args.override for x in (f"--{split_override(o)[0]}", split_override(o)[1])]
    cmd = [*shlex.split(args.launcher), args.shardtrain, "train", "--config", args.config, "--print-config", *flags]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=child_env())
        if p.returncode == 0:
            return tomllib.loads(p.stdout), "shardtrain train --print-config"
        note = f"`{shlex.join(cmd)}` exited {p.returncode}: {p.stderr.strip()[-400:]}"
    except (OSError, subprocess.TimeoutExpired, tomllib.TOMLDecodeError) as e:
        note = f"`{shlex.join(cmd)}`: {e}"
    print(f"note: {note}; reading {args.config} with tomllib instead", file=sys.stderr)
    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    for o in args.override:
        key, value = split_override(o)
        section, name = key.split(".", 1)
        cfg.setdefault(section, {})[name] = toml_value(value)
    return cfg, f"{args.config} (tomllib)"


def error_line(text):
    """The line that says what went wrong: shardtrain's error log line, else a Python exception, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if " E] " in line:  # shardtrain's log format: [r0@host hh:mm:ss.mmm E] <kind>: <message>
            return line.split(" E] ", 1)[1]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line
    return lines[-1] if lines else "no output"


def run_part(name, cmd, args, json_path):
    """Runs one part with a timeout; returns (result dict or None, error text or None). Its output goes to a log."""
    log_path = os.path.join(args.out, FILE_STEM[name] + ".log")
    print(f"==> {name}: {shlex.join(cmd)}", flush=True)
    if os.path.exists(json_path):
        os.remove(json_path)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=child_env())
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc = f"timeout after {args.timeout:.0f} s"
    except OSError as e:
        out, err, rc = "", str(e), "could not start"
    with open(log_path, "w") as f:
        f.write(f"$ {shlex.join(cmd)}\n# exit: {rc}, {time.time() - t0:.1f} s\n--- stdout\n{out}\n--- stderr\n{err}\n")
    summary = out[out.find("bench step:"):] if "bench step:" in out else "\n".join(out.splitlines()[-15:])
    print(summary.rstrip())
    if rc != 0:
        tail = "\n".join((err or out).strip().splitlines()[-12:])
        print(f"{name}: FAILED ({rc}); last lines (full log {log_path}):\n{tail}", flush=True)
        return None, f"exit {rc}: {error_line(err + chr(10) + out)}"
    try:
        with open(json_path) as f:
            return json.load(f), None
    except (OSError, json.JSONDecodeError) as e:
        return None, f"no result JSON ({e})"


# ---------------------------------------------------------------- PyTorch part (runs in its own process)

def load_batches(cfg, torch, micro, count, device, split="train"):
    """`count` micro-batches (inputs, targets), (micro, S) int64 on `device`, and a description of the source;
    the samples of the data set's `split` (train or validation) in order."""
    data, vocab = cfg["data"], cfg["model"]["vocab_size"]
    S, layout, path = data["seq_len"], data.get("layout", "packed"), data.get("path", "")
    need = micro * count
    samples = []
    source = None
    if path and os.path.exists(path):
        try:
            import h5py
            with h5py.File(path, "r") as h:
                tokens, offsets, docs = h["tokens"], h["doc_offsets"][...], h[f"split/{split}"][...]
                eot, bot, pad = int(h.attrs["eot_id"]), int(h.attrs.get("bot_id", -1)), int(h.attrs.get("pad_id", -1))
                if layout == "packed":
                    stream, d = [], 0
                    while len(stream) < need * S + 1 and d < len(docs):
                        stream.extend(tokens[offsets[docs[d]]:offsets[docs[d] + 1]].tolist())
                        stream.append(eot)
                        d += 1
                    n = (len(stream) - 1) // S
                    for i in range(n):
                        w = stream[i * S:i * S + S + 1]
                        samples.append((w[:S], w[1:]))
                else:  # padded: [BOT] doc [EOT] [PAD]... cut to S + 1, targets past the real end ignored
                    fill = pad if pad >= 0 else eot
                    for d in docs[:need]:
                        seq = ([bot] if bot >= 0 else []) + tokens[offsets[d]:offsets[d + 1]].tolist() + [eot]
                        real = min(len(seq), S + 1)
                        seq = (seq + [fill] * (S + 1))[:S + 1]
                        tgt = [t if i < real - 1 else -100 for i, t in enumerate(seq[1:])]
                        samples.append((seq[:S], tgt))
            if samples:
                source = f"{path} ({layout}, first {min(len(samples), need)} samples of the {split} split, in order)"
        except Exception as e:  # noqa: BLE001 - any unreadable file falls back to random ids, said in the table
            print(f"note: reading {path} failed ({e}); using random token ids", file=sys.stderr)
            samples = []
    if not samples:
        g = torch.Generator().manual_seed(1234)
        ids = torch.randint(0, vocab, (need, S + 1), generator=g)
        samples = [(ids[i, :S].tolist(), ids[i, 1:].tolist()) for i in range(need)]
        source = f"random token ids (uniform in [0, {vocab}))"
    batches = []
    for b in range(count):
        rows = [samples[(b * micro + r) % len(samples)] for r in range(micro)]
        inp = torch.tensor([r[0] for r in rows], dtype=torch.int64, device=device)
        tgt = torch.tensor([r[1] for r in rows], dtype=torch.int64, device=device)
        batches.append((inp, tgt))
    return batches, source


class StepClock:
    """Step times: CUDA events on the GPU (queued with the step, read once at the end), a wall clock on the CPU."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device == "cuda"

    def start(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def seconds(self, start, end):
        return start.elapsed_time(end) * 1e-3 if self.cuda else end - start

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def matmul_rate(torch, device, dtype, n=None):
    """FLOP/s of torch.matmul at n^3 (None: on a CPU, 2048 where one takes under a quarter of a second, else the largest
    of 1024, 512, 256 that does). Median of up to 20 after up to 5; on a CPU the timed ones stop after 5 s (at least 3)
    and the warm-up after 2 s."""
    if n is None:
        for n in (256, 512, 1024, 2048):
            a = torch.randn(n, n, dtype=dtype)
            t0 = time.perf_counter()
            torch.matmul(a, a)
            if time.perf_counter() - t0 > 0.25 / 8 or n == 2048:  # the next size takes 8x as long
                break
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    clock = StepClock(torch, device)
    bounded = device != "cuda"
    began = time.perf_counter()
    for _ in range(5):
        torch.matmul(a, b)
        if bounded and time.perf_counter() - began > 2:
            break
    spans = []
    began = time.perf_counter()
    for i in range(20):
        s = clock.start()
        torch.matmul(a, b)
        spans.append((s, clock.start()))
        if bounded and i >= 2 and time.perf_counter() - began > 5:
            break
    clock.sync()
    seconds = statistics.median(clock.seconds(s, e) for s, e in spans)
    del a, b
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2.0 * n ** 3 / seconds


def measure_peak(torch, device, cpu_dtype):
    """The matmul rate PyTorch reaches here: bf16 8192^3 on a GPU. On a CPU the better of the dtype the model computes
    in and fp32: a CPU without bf16 instructions (AVX2 only) runs PyTorch's bf16 matmul at under 1 GFLOP/s (25 of
    2048^3 took 12 minutes), while a compiled step's bf16 GEMMs run at fp32's rate, over 100 % of a bf16-only peak;
    a peak is what the process can reach, whatever the dtype."""
    if device == "cuda":
        return matmul_rate(torch, device, torch.bfloat16, 8192)
    rates = [matmul_rate(torch, device, cpu_dtype)]
    if cpu_dtype != torch.float32:
        rates.append(matmul_rate(torch, device, torch.float32))
    return max(rates)


def torch_worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    with open(args.worker_config) as f:
        cfg = json.load(f)
    m, fs, opt_cfg, data = cfg["model"], cfg.get("fsdp", {}), cfg.get("optim", {}), cfg["data"]
    device = args.torch_device
    # One process: an in-memory store, no TCP rendezvous.
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--torch-device cuda: torch sees no GPU (--torch-device cpu runs these parts on the CPU)")
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32, "f32": torch.float32}
    peak = measure_peak(torch, device, dtypes[fs.get("param_dtype", "bf16")])
    S, G = data["seq_len"], data["global_batch_size"]
    micro = data.get("micro_batch_size", 0) or G  # world size 1
    if G % micro:
        raise SystemExit(f"data.global_batch_size {G} is not a multiple of data.micro_batch_size {micro}")
    accumulation = G // micro
    tied = bool(m.get("tie_word_embeddings", False))
    theta = float(m.get("rope_theta", 10000.0))
    # transformers 5 keeps the rotary settings in rope_parameters; 4.x took rope_theta directly
    rope = ({"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
            if int(transformers.__version__.split(".")[0]) >= 5 else {"rope_theta": theta})
    hf = LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["intermediate_size"],
                     num_hidden_layers=m["num_hidden_layers"], num_attention_heads=m["num_attention_heads"],
                     num_key_value_heads=m.get("num_key_value_heads", m["num_attention_heads"]),
                     max_position_embeddings=m.get("max_position_embeddings", 2048), rms_norm_eps=m.get("rms_norm_eps", 1e-5),
                     tie_word_embeddings=tied, attention_bias=False, mlp_bias=False, hidden_act="silu", use_cache=False,
                     attn_implementation="sdpa", **rope)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(int(m.get("init_seed", 0)))  # eager and compile start from the same weights
    with torch.device(device):
        model = LlamaForCausalLM(hf)
    attn = getattr(model.config, "_attn_implementation", None)
    params = sum(p.numel() for p in model.parameters())  # tied weights once, as shardtrain counts them
    embed = model.get_input_embeddings().weight.numel()
    L, D = m["num_hidden_layers"], m["hidden_size"]
    fpt = 6.0 * (params - embed) + 12.0 * L * D * S  # the rule: tied or not, minus the input embedding
    if fs.get("activation_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=dtypes[fs.get("param_dtype", "bf16")], reduce_dtype=dtypes[fs.get("reduce_dtype", "fp32")])
    reshard = bool(fs.get("reshard_after_forward", True))
    for i, layer in enumerate(model.model.layers):
        if args.torch_worker == "compile":  # torchtitan's order: the compiled wrapper replaces the layer, then fully_shard
            layer = torch.compile(layer)
            model.model.layers[i] = layer
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    adamw = dict(lr=opt_cfg.get("lr", 1e-3), betas=(opt_cfg.get("beta1", 0.9), opt_cfg.get("beta2", 0.999)),
                 eps=opt_cfg.get("eps", 1e-8), weight_decay=opt_cfg.get("weight_decay", 0.0))
    try:
        opt = torch.optim.AdamW(model.parameters(), fused=True, **adamw)
        opt_name = "AdamW (fused)"
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(model.parameters(), foreach=True, **adamw)
        opt_name = "AdamW (foreach)"
    max_norm = float(opt_cfg.get("max_grad_norm", 1.0))
    reduce_each = fs.get("grad_accumulation", "reduce_each") == "reduce_each"

    total_steps = args.warmup + args.steps
    batches, source = load_batches(cfg, torch, micro, accumulation * total_steps, device)
    counted = [int(sum((t != -100).sum().item() for _, t in batches[s * accumulation:(s + 1) * accumulation]))
               for s in range(total_steps)]
    V = m["vocab_size"]

    def cross_entropy_sum(logits, tgt):
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1), ignore_index=-100, reduction="sum")

    # torchtitan compiles the loss too: inductor fuses the upcast, log-softmax and gather of the logits.
    loss_fn = torch.compile(cross_entropy_sum) if args.torch_worker == "compile" else cross_entropy_sum

    # Attention: SDPA's flash backend forced on a GPU (what a user tuning PyTorch would ask for); if it refuses
    # these shapes (at the first forward, before any backward), the default choice runs and the row says why.
    attention = {"backend": "default (CPU)", "context": contextlib.nullcontext}
    if device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        attention = {"backend": "flash (forced)", "context": lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])}

    def forward(inp):
        try:
            with attention["context"]():
                return model(input_ids=inp, use_cache=False).logits
        except RuntimeError as e:
            if attention["context"] is contextlib.nullcontext or isinstance(e, torch.OutOfMemoryError):
                raise
            attention["backend"] = f"default: flash refused these shapes ({str(e).splitlines()[0][:200]})"
            attention["context"] = contextlib.nullcontext
            print(f"note: SDPA {attention['backend']}", file=sys.stderr)
            return model(input_ids=inp, use_cache=False).logits

    def step(s):
        loss_sum = torch.zeros((), device=device)
        for i in range(accumulation):
            inp, tgt = batches[s * accumulation + i]
            if not reduce_each:
                model.set_requires_gradient_sync(i == accumulation - 1)
            logits = forward(inp)
            loss = loss_fn(logits, tgt) / max(1, counted[s])
            loss.backward()
            loss_sum += loss.detach()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss_sum

    clock = StepClock(torch, device)
    t0 = time.time()
    spans, losses = [], []
    for s in range(total_steps):
        begin = clock.start()
        losses.append(step(s))
        spans.append((begin, clock.start()))
        if s == 0:
            clock.sync()
            first_step_s = time.time() - t0
    clock.sync()
    times = [clock.seconds(a, b) for a, b in spans[args.warmup:]]
    graph_breaks = {}
    if args.torch_worker == "compile":
        from torch._dynamo.utils import counters
        graph_breaks = {str(k): int(v) for k, v in counters["graph_break"].items()}
    step_s = statistics.median(times)
    tokens_per_s = G * S / step_s
    last_loss = float(losses[-1].item())
    if device == "cuda":
        device_name, memory = torch.cuda.get_device_name(0), torch.cuda.max_memory_allocated()
        reserved, memory_source = torch.cuda.max_memory_reserved(), "torch.cuda.max_memory_allocated"
    else:  # no allocator statistics on the CPU: the process's peak resident set (Linux: KiB)
        device_name, reserved, memory_source = "cpu", None, "peak RSS of the process"
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {
        "name": "PyTorch " + args.torch_worker, "device": device_name,
        "torch": torch.__version__, "transformers": transformers.__version__, "attn_implementation": attn,
        "compile": "torch.compile per decoder layer and of the loss" if args.torch_worker == "compile" else "eager",
        "sdpa_backend": attention["backend"], "graph_breaks": graph_breaks,
        "optimizer": opt_name, "data": source, "micro_batch": micro, "accumulation_steps": accumulation,
        "seq_len": S, "global_batch_size": G, "tokens_per_step": G * S, "warmup": args.warmup, "steps": args.steps,
        "step_times_s": times, "step_time_median_s": step_s, "first_step_s": first_step_s, "tokens_per_s": tokens_per_s,
        "params": params, "flops_per_token": fpt, "peak_flops": peak, "mfu_measured_peak": tokens_per_s * fpt / peak,
        "peak_memory_bytes": memory, "reserved_bytes": reserved, "peak_memory_source": memory_source,
        "last_loss": last_loss if math.isfinite(last_loss) else None,
    }
    with open(args.worker_json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{result['name']}: {step_s * 1e3:.1f} ms/step, {tokens_per_s:.0f} tokens/s, MFU {100 * result['mfu_measured_peak']:.1f} % "
          f"of the measured {fmt_flops(peak)}, peak memory {fmt_bytes(memory)} ({memory_source}), loss {last_loss:.4f}; "
          f"first step {first_step_s:.1f} s; data: {source}; attention: {attn}, SDPA {attention['backend']}"
          + (f"; graph breaks: {graph_breaks}" if graph_breaks else ("; no graph breaks" if args.torch_worker == "compile" else "")))
    dist.destroy_process_group()


# ---------------------------------------------------------------- the table

def fmt_num(v, spec):
    return "n/a" if v is None else format(v, spec)


def decimals_for(value, target, higher_is_better, decimals):
    """The decimals that show `value` on the same side of `target` as it is: 49.99 % shown as "50.0 %" would read
    as meeting a 50 % target that it misses (the 2026-11-26 GPU table did that)."""
    ok = value >= target if higher_is_better else value <= target
    while decimals < 6:
        shown = round(value, decimals)
        if (shown >= target if higher_is_better else shown <= target) == ok:
            break
        decimals += 1
    return decimals


def fmt_ratio(v, target=None, higher_is_better=True):
    if v is None:
        return "n/a"
    d = 2 if target is None else decimals_for(v, target, higher_is_better, 2)
    return f"{v:.{d}f}x"


def fmt_bytes(v):
    return "n/a" if v is None else (f"{v / 2**30:.2f} GiB" if v >= 2**30 else f"{v / 2**20:.1f} MiB")


def fmt_flops(v):
    return f"{v * 1e-12:.1f} TFLOP/s" if v >= 1e12 else f"{v * 1e-9:.3g} GFLOP/s"


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def verdict(value, target, higher_is_better=True):
    if value is None:
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return "meets" if ok else "misses"


def spec_peak(results):
    """The device's datasheet peak as shardtrain's bench step reported it (the same device for every part of one
    call), and its label; (None, None) where shardtrain used no datasheet figure (the CPU, an unknown GPU)."""
    for part in ("shardtrain", "shardtrain+offload"):
        r = results.get(part)
        if r and r.get("peak_kind") == "spec":
            return r["peak_flops_per_rank"], r.get("peak_label", "datasheet")
    return None, None


def set_mfu(results):
    """Every row's MFU over one denominator: the datasheet peak where known; else each side's own (shardtrain's
    bench step already reports its own; PyTorch's is its measured matmul), labelled. Returns the label."""
    spec, label = spec_peak(results)
    for part, r in results.items():
        if not part.startswith("PyTorch"):
            continue
        r["mfu"] = r["tokens_per_s"] * r["flops_per_token"] / spec if spec else r["mfu_measured_peak"]
    return f"of the datasheet peak ({label})" if spec else "of each side's own measured peak (no datasheet figure for this device)"


def build_report(results, errors, cfg, cfg_source, args):
    get = lambda part, key: (results.get(part) or {}).get(key)  # noqa: E731
    st, off, eager, comp = "shardtrain", "shardtrain+offload", "PyTorch eager", "PyTorch compile"
    mfu_label = set_mfu(results)
    title = args.title or os.path.basename(args.config)
    lines = [f"# shardtrain vs PyTorch FSDP2: {title}", "",
             f"config {args.config} (resolved by {cfg_source}); overrides: {', '.join(args.override) or 'none'}; "
             f"model {cfg['model']['num_hidden_layers']} layers x hidden {cfg['model']['hidden_size']}, vocab {cfg['model']['vocab_size']}; "
             f"global batch {cfg['data']['global_batch_size']} x seq {cfg['data']['seq_len']}; "
             f"{args.steps} timed steps after {args.warmup} warm-up, medians. MFU: FLOPs per token x tokens/s {mfu_label}; "
             "beside it, each side's MFU of the matmul rate it measured in its own process", "",
             "| run | step time | tokens/s | MFU | MFU of measured peak | peak memory | measured peak | notes |",
             "|---|---|---|---|---|---|---|---|"]
    for part in PARTS:
        r = results.get(part)
        if r is None:
            lines.append(f"| {part} | | | | | | | {errors.get(part, 'not run')} |")
            continue
        mem_text = fmt_bytes(r.get("peak_memory_bytes"))
        if part.startswith("PyTorch"):
            if r.get("reserved_bytes") is not None:
                mem_text += f" (reserved {fmt_bytes(r['reserved_bytes'])})"
            breaks = r.get("graph_breaks")
            notes = (f"{r['device']}; {r['compile']}; {r['optimizer']}; attention {r['attn_implementation']}, SDPA "
                     f"{r.get('sdpa_backend', 'n/a')}"
                     + (f"; graph breaks {sum(breaks.values())}" if breaks else ("; no graph breaks" if part.endswith("compile") else ""))
                     + f"; memory: {r.get('peak_memory_source', 'torch.cuda.max_memory_allocated')}; data: {r['data']}; "
                     f"loss {fmt_num(r.get('last_loss'), '.4f')}")
        else:
            notes = (f"{r['device']}; mesh {r['mesh']['replicate']} x {r['mesh']['shard']} ({r['mesh']['strategy']}); {r['comm_backend']}; "
                     f"memory: {r['peak_memory_source']}; loss {fmt_num(r.get('last_loss'), '.4f')}")
            if r.get("host_update_median_s"):  # CPU offload on a GPU: the host update beside the forward
                notes += (f"; host update {1e3 * r['host_update_median_s']:.1f} ms, of which the step waited "
                          f"{1e3 * r.get('update_wait_median_s', 0):.1f} ms")
        if part.startswith("PyTorch"):
            measured, measured_mfu = r["peak_flops"], r["mfu_measured_peak"]
        else:  # bench step: its measured matmul, or (the CPU, an unknown GPU) the peak it reported MFU against
            measured = r.get("measured_peak_flops_per_rank") or r["peak_flops_per_rank"]
            measured_mfu = r.get("mfu_measured_peak") or r["mfu"]
        lines.append(f"| {part} | {r['step_time_median_s'] * 1e3:.1f} ms | {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f} % | "
                     f"{100 * measured_mfu:.1f} % | {mem_text} | {fmt_flops(measured)} | {notes} |")

    def memory_ratio(torch_part):
        """shardtrain's peak memory over PyTorch's, like for like: device memory, or both processes' peak RSS
        where PyTorch ran on the CPU (it has no allocator statistics there)."""
        on_cpu = get(torch_part, "device") == "cpu"
        return ratio(get(st, "rss_peak_bytes" if on_cpu else "peak_memory_bytes"), get(torch_part, "peak_memory_bytes"))

    ratios = {
        "vs_eager": ratio(get(st, "tokens_per_s"), get(eager, "tokens_per_s")),
        "vs_compile": ratio(get(st, "tokens_per_s"), get(comp, "tokens_per_s")),
        "mfu": get(st, "mfu"),
        "memory_vs_eager": memory_ratio(eager),
        "memory_vs_compile": memory_ratio(comp),
        "offload": ratio(get(off, "tokens_per_s"), get(st, "tokens_per_s")),
    }
    mfu, mfu_target = ratios["mfu"], args.mfu_target
    mfu_text = "n/a" if mfu is None else f"{100 * mfu:.{decimals_for(100 * mfu, 100 * mfu_target, True, 1)}f} %"
    lines += ["", "| ratio | value | target | |", "|---|---|---|---|",
              f"| shardtrain / PyTorch eager tokens/s | {fmt_ratio(ratios['vs_eager'], TARGETS['vs_eager'])} | >= {TARGETS['vs_eager']}x | {verdict(ratios['vs_eager'], TARGETS['vs_eager'])} |",
              f"| shardtrain / PyTorch compile tokens/s | {fmt_ratio(ratios['vs_compile'], TARGETS['vs_compile'])} | >= {TARGETS['vs_compile']}x | {verdict(ratios['vs_compile'], TARGETS['vs_compile'])} |",
              f"| shardtrain MFU | {mfu_text} | >= {100 * mfu_target:.0f} % | {verdict(ratios['mfu'], mfu_target)} |",
              f"| shardtrain / PyTorch eager peak memory | {fmt_ratio(ratios['memory_vs_eager'], TARGETS['memory'], False)} | <= {TARGETS['memory']}x | {verdict(ratios['memory_vs_eager'], TARGETS['memory'], False)} |",
              f"| shardtrain / PyTorch compile peak memory | {fmt_ratio(ratios['memory_vs_compile'], TARGETS['memory'], False)} | <= {TARGETS['memory']}x | {verdict(ratios['memory_vs_compile'], TARGETS['memory'], False)} |",
              f"| shardtrain+offload / shardtrain tokens/s | {fmt_ratio(ratios['offload'], TARGETS['offload'])} | >= {TARGETS['offload']}x | {verdict(ratios['offload'], TARGETS['offload'])} |"]
    if any(get(p, "device") == "cpu" for p in (eager, comp)):
        lines += ["", "NOTE: PyTorch ran on the CPU (--torch-device cpu), each side with its own BLAS: this table checks the "
                      "script, it is not a benchmark. Its memory ratios compare peak RSS."]
    fpts = {p: results[p]["flops_per_token"] for p in PARTS if results.get(p)}
    if len(set(round(v) for v in fpts.values())) > 1:
        lines += ["", f"WARNING: the parts count different FLOPs per token: {fpts}"]
    if get(st, "backend") == "cuda" and get(st, "device_peak_bytes") == 0:
        lines += ["", "WARNING: shardtrain ran on a GPU device but allocated no device memory: its step ran on the CPU ops"]
    if errors:
        lines += ["", "Errors:"] + [f"- {p}: {e}" for p, e in errors.items()]
    return "\n".join(lines) + "\n", ratios


def main():
    args = parse_args()
    if args.torch_worker:
        torch_worker(args)
        return 0
    os.makedirs(args.out, exist_ok=True)
    cfg, cfg_source = resolve_config(args)
    worker_config = os.path.join(args.out, "resolved-config.json")
    with open(worker_config, "w") as f:
        json.dump(cfg, f, indent=2)
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        raise SystemExit(f"--parts: unknown {unknown}; expected some of {PARTS}")
    if args.skip_torch:
        wanted = [p for p in wanted if not p.startswith("PyTorch")]
    results, errors = {}, {}
    flags = [x for o in args.override for x in (f"--{split_override(o)[0]}", split_override(o)[1])]
    for part in PARTS:
        json_path = os.path.join(args.out, FILE_STEM[part] + ".json")
        if part not in wanted:
            if args.reuse and os.path.exists(json_path):
                with open(json_path) as f:
                    results[part] = json.load(f)
                print(f"==> {part}: taken from {json_path} (an earlier run)")
            elif part.startswith("PyTorch") and args.skip_torch:
                errors[part] = "skipped (--skip-torch)"
            else:
                errors[part] = "not run (--parts)"
            continue
        if part.startswith("shardtrain"):
            extra = ["--fsdp.offload_params", "true"] if part.endswith("offload") else []
            cmd = [*shlex.split(args.launcher), args.shardtrain, "bench", "step", "--config", args.config, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--json", json_path, *flags, *extra]
        else:
            cmd = [*shlex.split(args.torch_python), os.path.abspath(__file__), "--config", args.config,
                   "--torch-worker", part.split()[1], "--torch-device", args.torch_device, "--worker-config", worker_config,
                   "--worker-json", json_path, "--steps", str(args.steps), "--warmup", str(args.warmup)]
        result, error = run_part(part, cmd, args, json_path)
        if result is not None:
            results[part] = result
        else:
            errors[part] = error
    report, ratios = build_report(results, errors, cfg, cfg_source, args)
    print("\n" + report)
    with open(os.path.join(args.out, "bench-vs-pytorch.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "bench-vs-pytorch.json"), "w") as f:
        json.dump({"config": args.config, "config_source": cfg_source, "overrides": args.override, "steps": args.steps,
                   "warmup": args.warmup, "results": results, "errors": errors, "ratios": ratios,
                   "targets": {**TARGETS, "mfu": args.mfu_target}, "title": args.title or os.path.basename(args.config)}, f, indent=2)
    print(f"wrote {os.path.join(args.out, 'bench-vs-pytorch.md')} and bench-vs-pytorch.json")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
