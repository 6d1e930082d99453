#!/usr/bin/env python3
"""`shardtrain tokenizer` and `prepare-data` on what a hostile user gives them (the audit's repros): outputs that
exist, are folders, empty or are an input are refused with exit 2 before any work and leave every file as it was;
--special takes its text as written ([BOT] stayed BOT); an empty special token is refused (encode --special on one
never ended); --threads past the cap is 2 with no temporary left; encode's --text with --input, or a folder as
--input, and `dataset info` of a folder say what is wrong; a save_to_disk state.json names no file outside its
folder; an output inside an input folder replaces only the tool's own earlier output, never a corpus file; a binary file
among the inputs (an earlier dataset) is refused, not tokenized as text; SIGTERM, SIGINT or SIGHUP mid-run leaves no temporary; decode refuses ids it cannot read whole; tokenizer
files and patterns that would mislead are named. Each check asserts the exit code, the message and the files."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = args.shardtrain
sotu = clitest.corpus(args, "sotu")
os.chdir(work)

inputs = os.path.join(work, "in")
os.makedirs(inputs)
for name in sorted(os.listdir(sotu))[:3]:
    shutil.copy(os.path.join(sotu, name), inputs)
one = os.path.join(inputs, sorted(os.listdir(inputs))[0])


def run(*cmd, timeout=60):
    """The command's result; one that runs past `timeout` (a hang) is killed and reads as exit 124."""
    try:
        return subprocess.run([st, *cmd, "--log-level", "warn"], capture_output=True, text=True, errors="replace",
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"killed after {timeout} s")


def train(output, *extra):
    return run("tokenizer", "train", "--input", one, "--vocab-size", "300", "--output", output, *extra)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def dataset_tokens(path):
    """The tokens `dataset info` counts in the dataset, or None when it cannot read it."""
    r = run("dataset", "info", path, "--json")
    return json.loads(r.stdout)["datasets"][0]["tokens"] if r.returncode == 0 else None


def leftovers():
    return sorted(p for p in os.listdir(work) if "tmp-" in p)


def error_line(r):
    lines = [l for l in r.stderr.splitlines() if " E] " in l or " W] " in l or l.startswith("--")]
    return lines[-1] if lines else r.stderr.strip()


# tokenizer train never replaces a file unless asked, its own input least of all; the name must load back.
with open("corpus.txt", "w") as f:
    f.write("my text about things\n")
with open("precious.json", "w") as f:
    f.write('{"precious": 1}\n')
r = run("tokenizer", "train", "--input", "corpus.txt", "--vocab-size", "300", "--output", "corpus.txt")
check(r.returncode == 2 and "corpus.txt: already exists; tokenizer train does not replace it unless asked (--overwrite)"
      in r.stderr and read("corpus.txt") == b"my text about things\n", f"train over its input: {r.returncode} {error_line(r)}")
r = train("precious.json")
check(r.returncode == 2 and "--overwrite" in r.stderr and read("precious.json") == b'{"precious": 1}\n',
      f"train over a file: {r.returncode} {error_line(r)}")
r = run("tokenizer", "train", "--input", "precious.json", "--input", one, "--vocab-size", "300", "--output", "precious.json",
        "--overwrite")
check(r.returncode == 2 and "precious.json: is both an input and the output" in r.stderr
      and read("precious.json") == b'{"precious": 1}\n', f"train --overwrite over its input: {r.returncode} {error_line(r)}")
r = train("tok.txt")
check(r.returncode == 2 and "tok.txt: a tokenizer.json's name must end in .json" in r.stderr and not os.path.exists("tok.txt"),
      f"train to a name that does not load: {r.returncode} {error_line(r)}")
os.makedirs("outdir")
for output, message in (("outdir", "outdir: is a folder; tokenizer train writes one file"),
                        ("", "tokenizer train: the output is an empty name"),
                        ("nodir/t.json", "nodir/t.json: the output's folder nodir does not exist")):
    r = train(output, "--overwrite")
    check(r.returncode == 2 and message in r.stderr, f"train -o '{output}': {r.returncode} {error_line(r)}")
r = train("precious.json", "--overwrite")
check(r.returncode == 0 and json.loads(read("precious.json"))["model"]["type"] == "BPE", f"train --overwrite: {r.returncode} {r.stderr}")

# --special as written: brackets, a comma, and angle brackets survive; the docs' [BOT] [EOT] [PAD] are found.
specials = ["[BOT]", "[EOT]", "[PAD]", "[a,b]", "<|endoftext|>"]
r = train("special.json", *[x for s in specials for x in ("--special", s)])
check(r.returncode == 0, f"train --special: {r.stderr}")
added = [t["content"] for t in json.loads(read("special.json"))["added_tokens"]]
check(added == specials, f"special tokens as written: {added}")
info = json.loads(run("tokenizer", "info", "-t", "special.json").stdout)
check((info["bot_id"], info["eot_id"], info["pad_id"]) == (0, 1, 2), f"special ids: {info}")
ids = run("tokenizer", "encode", "-t", "special.json", "--text", "x[a,b]<|endoftext|>", "--special").stdout.split()
check(ids[-2:] == ["3", "4"], f"encode --special of the bracketed tokens: {ids}")

# An empty special token: refused when training, and when loading a file that has one (encode --special hung).
r = train("empty.json", "--special", "")
check(r.returncode == 2 and "--special: special token 0 is empty" in r.stderr and not os.path.exists("empty.json"),
      f"train --special '': {r.returncode} {error_line(r)}")
r = train("twice.json", "--special", "[A]", "--special", "[A]")
check(r.returncode == 2 and "--special: '[A]' is given twice" in r.stderr, f"train --special twice: {r.returncode} {error_line(r)}")
tok = json.loads(read("precious.json"))
tok["added_tokens"][2]["content"] = ""
with open("emptyspecial.json", "w") as f:
    json.dump(tok, f)
r = run("tokenizer", "encode", "-t", "emptyspecial.json", "--text", "hi", "--special", timeout=30)
check(r.returncode == 4 and "emptyspecial.json: field 'added_tokens[2].content' is empty" in r.stderr,
      f"a tokenizer with an empty special token: {r.returncode} {error_line(r)}")

# --threads 65536 (in the documented range; it aborted with std::terminate, leaving OUT.tokens-tmp-PID) is cut to
# 1024, with a warning, and gives what 2 threads give.
cut = "--threads 65536: cut to 1024"
r = run("tokenizer", "train", "--input", inputs, "--vocab-size", "300", "--output", "th.json", "--threads", "65536")
r2 = run("tokenizer", "train", "--input", inputs, "--vocab-size", "300", "--output", "th2.json", "--threads", "2")
check(r.returncode == 0 and cut in r.stderr and r2.returncode == 0 and read("th.json") == read("th2.json"),
      f"train --threads 65536: {r.returncode} {error_line(r)}")
r = run("prepare-data", "-t", "th.json", "-i", inputs, "-o", "th.h5", "--threads", "65536")
r2 = run("prepare-data", "-t", "th.json", "-i", inputs, "-o", "th2.h5", "--threads", "2")
tokens = [dataset_tokens(ds) for ds in ("th.h5", "th2.h5")]
check(r.returncode == 0 and cut in r.stderr and r2.returncode == 0 and tokens[0] is not None and tokens[0] == tokens[1]
      and leftovers() == [],
      f"prepare-data --threads 65536: {r.returncode} {error_line(r)}, tokens {tokens}, left {leftovers()}")

# prepare-data: outputs it cannot write and a NaN fraction are usage errors before any work (the tokenizer does not
# exist, so work begun would be a data error).
for extra, message in ((["-o", "outdir", "--overwrite"], "outdir: is a folder; prepare-data writes one file"),
                       (["-o", ""], "prepare-data: the output is an empty name"),
                       (["-o", "vf.h5", "--validation-fraction", "nan"], "--validation-fraction nan is outside [0, 1)"),
                       (["-o", one, "--overwrite"], f"{one}: is both an input and the output")):
    r = run("prepare-data", "-t", "missing.json", "-i", one, *extra)
    check(r.returncode == 2 and message in r.stderr, f"prepare-data {extra}: {r.returncode} {error_line(r)}")
check(leftovers() == [] and os.listdir("outdir") == [], f"left behind: {leftovers()}")

# The output inside its input folder: the same dataset on every run, not one that swallows the last.
tokens = []
for _ in range(3):
    r = run("prepare-data", "-t", "precious.json", "-i", inputs, "-o", os.path.join(inputs, "ds.h5"), "--overwrite")
    check(r.returncode == 0, f"prepare-data in place: {r.stderr}")
    tokens.append(dataset_tokens(os.path.join(inputs, "ds.h5")))
check(tokens[0] is not None and tokens == tokens[:1] * 3, f"tokens of runs in place: {tokens}")

# An output inside an input folder that is not the tool's own (a corpus file, or a link to one) is an input the output
# would replace: refused with --overwrite too (prepare-data replaced doc.txt by the dataset, exit 0). An earlier
# tokenizer.json there is tokenizer train's own, and is replaced.
victim = os.path.join(inputs, sorted(os.listdir(inputs))[1])
linked = os.path.join(work, "linked")
os.makedirs(linked)
os.symlink(victim, os.path.join(linked, "link.txt"))
text = read(victim)
for folder, output in ((inputs, victim), (linked, os.path.join(linked, "link.txt"))):
    r = run("prepare-data", "-t", "precious.json", "-i", folder, "-o", output, "--overwrite")
    check(r.returncode == 2 and f"{output}: is a file of the input folder {folder} (an input) and the output" in r.stderr
          and "it is not a dataset (an HDF5 file)" in r.stderr, f"prepare-data -o a corpus file: {r.returncode} {error_line(r)}")
check(read(victim) == text and os.path.islink(os.path.join(linked, "link.txt")), "a corpus file was replaced")
jsonl_input = os.path.join(work, "jin")
os.makedirs(jsonl_input)
with open(os.path.join(jsonl_input, "a.json"), "w") as f:
    f.write(json.dumps({"text": "one two three four"}) + "\n")
r = run("tokenizer", "train", "-i", jsonl_input, "--vocab-size", "300", "-o", os.path.join(jsonl_input, "a.json"), "--overwrite")
check(r.returncode == 2 and "it is not a tokenizer.json" in r.stderr and json.loads(read(os.path.join(jsonl_input, "a.json")))["text"],
      f"tokenizer train -o a JSONL input: {r.returncode} {error_line(r)}")
shutil.copy("precious.json", os.path.join(jsonl_input, "tok.json"))
with open(os.path.join(jsonl_input, "b.jsonl"), "w") as f:
    f.write(json.dumps({"text": "five six seven eight"}) + "\n")
os.remove(os.path.join(jsonl_input, "a.json"))
r = run("tokenizer", "train", "-i", jsonl_input, "--vocab-size", "300", "-o", os.path.join(jsonl_input, "tok.json"), "--overwrite")
check(r.returncode == 0 and json.loads(read(os.path.join(jsonl_input, "tok.json")))["model"]["type"] == "BPE",
      f"tokenizer train over its own earlier tokenizer.json: {r.returncode} {error_line(r)}")

# A binary file in an input folder (the dataset of an earlier preparation under another name, any file holding a NUL
# byte) is not read as text: it was tokenized into the training data without a word.
r = run("prepare-data", "-t", "precious.json", "-i", inputs, "-o", os.path.join(inputs, "ds2.h5"))
# (Byte 11 since datasets keep their attributes dense: the 1.8 format's superblock; byte 8 in older datasets.)
check(r.returncode == 4 and f"{os.path.join(inputs, 'ds.h5')}: is not text: it holds a NUL byte (byte 11), and is an HDF5 "
      "file (a prepared dataset?)" in r.stderr and not os.path.exists(os.path.join(inputs, "ds2.h5")),
      f"prepare-data with a dataset among its inputs: {r.returncode} {error_line(r)}")
os.remove(os.path.join(inputs, "ds.h5"))  # the folder is text again (the checks below once read the dataset as text)
binary = os.path.join(work, "bin")
os.makedirs(binary)
shutil.copy(one, binary)
with open(os.path.join(binary, "z.dat"), "wb") as f:
    f.write(b"text, then\x00 a NUL")
for cmd in (["prepare-data", "-t", "precious.json", "-o", "b.h5"], ["tokenizer", "train", "--vocab-size", "300", "-o", "b.json"]):
    r = run(*cmd, "-i", binary)
    check(r.returncode == 4 and "z.dat: is not text: it holds a NUL byte (byte 10);" in r.stderr
          and "HDF5" not in error_line(r) and not os.path.exists(cmd[-1]), f"{cmd[0]} with a binary input: {r.returncode} {error_line(r)}")
check(leftovers() == [], f"left behind: {leftovers()}")

# encode: one source; a folder is not a file.
r = run("tokenizer", "encode", "-t", "precious.json", "--text", "a", "--input", one)
check(r.returncode == 2 and ("--input excludes --text" in r.stderr or "--text excludes --input" in r.stderr),
      f"encode --text with --input: {r.returncode} {error_line(r)}")
r = run("tokenizer", "encode", "-t", "precious.json", "--input", "outdir")
check(r.returncode == 4 and "outdir: is a folder; --input takes a file to encode" in r.stderr,
      f"encode --input DIR: {r.returncode} {error_line(r)}")
r = run("dataset", "info", "outdir")
check(r.returncode == 4 and "outdir: is a folder, not a dataset file" in r.stderr, f"dataset info DIR: {r.returncode} {error_line(r)}")

# A save_to_disk folder whose state.json reaches outside it.
os.makedirs("saved")
with open("saved/state.json", "w") as f:
    json.dump({"_data_files": [{"filename": "../../../../etc/passwd"}]}, f)
r = run("prepare-data", "-t", "precious.json", "-i", "saved", "-o", "saved.h5")
check(r.returncode == 4 and "saved/state.json: \"_data_files\" lists '../../../../etc/passwd', which is not a file name in the folder"
      in r.stderr and not os.path.exists("saved.h5"), f"state.json with ../: {r.returncode} {error_line(r)}")

# A symbolic link loop in an input folder.
os.makedirs("loop")
os.symlink("../loop", "loop/self")
with open("loop/a.txt", "w") as f:
    f.write("hi")
r = run("prepare-data", "-t", "precious.json", "-i", "loop", "-o", "loop.h5")
check(r.returncode == 4 and "loop/self: leads to" in r.stderr, f"a link loop: {r.returncode} {error_line(r)}")
check(leftovers() == [], f"left behind: {leftovers()}")

# --text-field where every input is text would be ignored: refused, naming the field; with a JSONL input it is read.
for cmd in (["tokenizer", "train", "--vocab-size", "300", "--output", "tf.json"], ["prepare-data", "-t", "precious.json", "-o", "tf.h5"]):
    r = run(*cmd, "-i", inputs, "--text-field", "body")
    check(r.returncode == 2 and "--text-field body: every input is plain text (" in r.stderr
          and not os.path.exists("tf.json") and not os.path.exists("tf.h5"), f"{cmd[0]} --text-field on text: {r.returncode} {error_line(r)}")
with open("docs.jsonl", "w") as f:
    f.write(json.dumps({"body": "a document about the union"}) + "\n")
r = run("prepare-data", "-t", "precious.json", "-i", inputs, "-i", "docs.jsonl", "-o", "tf.h5", "--text-field", "body")
check(r.returncode == 0 and dataset_tokens("tf.h5"), f"prepare-data --text-field with a JSONL input: {r.returncode} {error_line(r)}")

# Inputs that are not regular files: /dev/zero and a FIFO with no writer ran without end (a SIGTERM then left
# OUT.tokens-tmp-PID behind). Refused with 2 before any work, by prepare-data and tokenizer train alike.
os.mkfifo("fifo")
not_file = "; --input takes regular files or folders of them (a pipe or a device has no end to read to)"
for cmd in (["prepare-data", "-t", "precious.json", "-o", "nf.h5"], ["tokenizer", "train", "--vocab-size", "300", "-o", "nf.json"]):
    for bad, what in (("/dev/zero", "a character device"), ("fifo", "a FIFO (named pipe)")):
        r = run(*cmd, "-i", one, bad, timeout=30)
        check(r.returncode == 2 and f"{bad}: is {what}{not_file}" in r.stderr and leftovers() == []
              and not os.path.exists("nf.h5") and not os.path.exists("nf.json"),
              f"{cmd[0]} -i {bad}: {r.returncode} {error_line(r)}, left {leftovers()}")

# One file given twice, however spelled (its documents went in twice, and a copy could land in the validation split).
os.symlink(one, "one-link.txt")
twice = ("is the same file as {}, given before; its documents would be read twice (and a copy could land in the "
         "validation split); give each file once")
for cmd in (["prepare-data", "-t", "precious.json", "-o", "tw.h5"], ["tokenizer", "train", "--vocab-size", "300", "-o", "tw.json"]):
    for first, second in ((one, one), (one, "one-link.txt"), (inputs, one)):
        r = run(*cmd, "-i", first, second)
        check(r.returncode == 2 and f"{one if first == inputs else second}: {twice.format(one if first == inputs else first)}"
              in r.stderr and not os.path.exists("tw.h5") and not os.path.exists("tw.json"),
              f"{cmd[0]} -i {first} {second}: {r.returncode} {error_line(r)}")

# A stop signal mid-run (Ctrl-C, a Slurm time limit, a closed terminal) ends prepare-data as the signal does, and
# leaves no temporary behind: OUT.tokens-tmp-PID (as large as the tokens) stayed after every Ctrl-C.
big = "big.txt"
with open(big, "wb") as out:
    text = read(one)
    while out.tell() < 48 << 20:
        out.write(text)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    p = subprocess.Popen([st, "prepare-data", "-t", "precious.json", "-i", big, "-o", "stopped.h5", "--threads", "1",
                          "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while time.time() < deadline and p.poll() is None and not [f for f in leftovers() if f.startswith("stopped.h5.")]:
        time.sleep(0.01)
    seen = leftovers()
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    check(p.returncode == -sig and any(f.startswith("stopped.h5.tokens-tmp-") for f in seen) and leftovers() == []
          and not os.path.exists("stopped.h5"),
          f"prepare-data stopped by {sig.name}: status {p.returncode}, temporaries then {seen}, left {leftovers()}: {err[-500:]}")
os.remove(big)

# decode reads whole decimal ids from stdin, or refuses: "9906,1917" printed only 9906's text, "1e3" id 1, "-1" and
# 2^32 + 1 wrapped, all with exit 0. Commas separate ids as spaces do.
fetched_tokenizers = os.path.join(args.source, "data/fetched/tokenizers")
r50k = os.path.join(fetched_tokenizers, "r50k_base.tiktoken")


def decode_stdin(text):
    return subprocess.run([st, "tokenizer", "decode", "-t", r50k, "--log-level", "warn"], input=text, capture_output=True,
                          text=True, timeout=60)


whole = decode_stdin("9906 1917")
check(whole.returncode == 0 and whole.stdout == " coalition problem", f"decode 9906 1917: {whole.returncode} {whole.stdout!r}")
r = decode_stdin("9906,1917\n")
check(r.returncode == 0 and r.stdout == whole.stdout, f"decode 9906,1917: {r.returncode} {r.stdout!r}")
for bad in ("9906;1917", "9906.5", "1e3", "0x10", "12abc", "4294967297", "-1"):
    r = decode_stdin(bad)
    check(r.returncode == 2 and r.stdout == "" and f"tokenizer decode: '{bad}' on stdin is not a token id" in r.stderr,
          f"decode {bad!r}: {r.returncode} {r.stdout!r} {error_line(r)}")
# An id argument CLI11 cannot read points at the decode command's own help (it named `tokenizer --help`).
r = run("tokenizer", "decode", "-t", r50k, "abc")
check(r.returncode == 2 and "(see shardtrain tokenizer decode --help)" in r.stderr, f"decode abc: {r.returncode} {error_line(r)}")
# A gap in the ids is named as one; GPT-2's encoder.json alone says to give its folder.
r = run("tokenizer", "decode", "-t", os.path.join(fetched_tokenizers, "cl100k_base.tiktoken"), "100261")
check(r.returncode == 4 and "token id 100261 is not in the vocabulary of cl100k_base: a gap in its ids 0 to 100276" in r.stderr,
      f"decode of a gap: {r.returncode} {error_line(r)}")
r = run("tokenizer", "encode", "-t", os.path.join(fetched_tokenizers, "gpt2", "encoder.json"), "--text", "hi")
check(r.returncode == 4 and "is GPT-2's encoder.json, half of a tokenizer: give its folder" in r.stderr,
      f"encode with encoder.json: {r.returncode} {error_line(r)}")
# A split pattern that can match nothing (its tokenizer.json gave other ids than Hugging Face's), and an empty one
# (it meant the default, without a word), are refused.
for pattern, needle in (("x*", "--pattern 'x*': can match the empty string"), ("", "--pattern: expected a regex")):
    r = train("pattern.json", "--pattern", pattern)
    check(r.returncode == 2 and needle in r.stderr and not os.path.exists("pattern.json"),
          f"--pattern {pattern!r}: {r.returncode} {error_line(r)}")

# A SIGKILLed preparation's temporaries (this host's, its process gone) are removed by the next preparation of that
# output, with a warning; another host's stay.
import socket  # noqa: E402
gone = subprocess.Popen(["true"])
gone.wait()
host = socket.gethostname()
dead = [f"k.h5.tokens-tmp-{host}-{gone.pid}", f"k.h5.tmp-{host}-{gone.pid}"]
kept = f"k.h5.tokens-tmp-elsewhere-{gone.pid}"
for name in dead + [kept]:
    open(name, "w").write("ids of a killed run\n")
r = run("prepare-data", "-t", "precious.json", "-i", one, "-o", "k.h5")
check(r.returncode == 0 and all(not os.path.exists(n) and f"{n}: removed, the temporary of a run on this host" in r.stderr for n in dead)
      and os.path.exists(kept) and dataset_tokens("k.h5"), f"a killed run's temporaries: {r.returncode} {r.stderr[-800:]}")
os.remove(kept)
# The tokenizer is never the output (-o tok.json --overwrite replaced it with the dataset, exit 0), nor a link to it.
shutil.copy("precious.json", "tok3.json")
before = read("tok3.json")
r = run("prepare-data", "-t", "tok3.json", "-i", one, "-o", "tok3.json", "--overwrite")
check(r.returncode == 2 and "tok3.json: is the tokenizer (--tokenizer tok3.json) and the output" in r.stderr
      and read("tok3.json") == before, f"output is the tokenizer: {r.returncode} {error_line(r)}")
os.symlink("tok3.json", "tok3-link.h5")
r = run("prepare-data", "-t", "tok3.json", "-i", one, "-o", "tok3-link.h5", "--overwrite")
check(r.returncode == 2 and "tok3-link.h5: is the tokenizer" in r.stderr and read("tok3.json") == before
      and os.path.islink("tok3-link.h5"), f"output a link to the tokenizer: {r.returncode} {error_line(r)}")

# The tokenizer's own file inside an input folder is not an input: a tiktoken file there was 99.7% of the dataset, and
# a tokenizer.json in a JSONL folder failed as a bad JSONL line.
os.makedirs("withtok/jsonl")
shutil.copy(one, "withtok/a.txt")
shutil.copy(r50k, "withtok/r50k_base.tiktoken")
r = run("prepare-data", "-t", "withtok/r50k_base.tiktoken", "-i", "withtok", "-o", "withtok.h5")
r_alone = run("prepare-data", "-t", r50k, "-i", one, "-o", "alone.h5")
check(r.returncode == 0 and r_alone.returncode == 0 and dataset_tokens("withtok.h5") == dataset_tokens("alone.h5"),
      f"tiktoken file in the input folder: {r.returncode} {error_line(r)} {dataset_tokens('withtok.h5')} "
      f"vs {dataset_tokens('alone.h5')}")
with open("withtok/jsonl/d.jsonl", "w") as f:
    f.write('{"text": "hello world"}\n')
shutil.copy(os.path.join(fetched_tokenizers, "gpt2-hf", "tokenizer.json"), "withtok/jsonl/tokenizer.json")
r = run("prepare-data", "-t", "withtok/jsonl/tokenizer.json", "-i", "withtok/jsonl", "-o", "withtok-jsonl.h5",
        "--validation-fraction", "0")
check(r.returncode == 0 and dataset_tokens("withtok-jsonl.h5") == 2,
      f"tokenizer.json in a JSONL folder: {r.returncode} {error_line(r)} {dataset_tokens('withtok-jsonl.h5')}")

# A link in an input folder that leads nowhere (a Hub cache snapshot whose blob is missing) is named, exit 4; it
# was left out with its shard, exit 0.
os.makedirs("snapshot")
shutil.copy(one, "snapshot/a.txt")
os.symlink("../blobs/missing", "snapshot/b.txt")
for cmd in (["prepare-data", "-t", r50k, "-o", "snapshot.h5"], ["tokenizer", "train", "--vocab-size", "300", "-o", "snap.json"]):
    r = run(*cmd, "-i", "snapshot")
    check(r.returncode == 4 and "snapshot/b.txt: is a symbolic link to ../blobs/missing, which is not there" in r.stderr
          and not os.path.exists(cmd[-1]), f"{cmd[0]} with a dangling link: {r.returncode} {error_line(r)}")

# Extensions in upper or mixed case say the format as lower case does (SHARD.JSONL was read as plain text).
import gzip  # noqa: E402
os.makedirs("upper")
with open("upper/A.JSONL", "w") as f:
    f.write('{"text": "hello world"}\n')
with gzip.open("upper/b.Json.GZ", "wt") as f:
    f.write('{"text": "hello world"}\n')
r = run("prepare-data", "-t", r50k, "-i", "upper", "-o", "upper.h5", "--validation-fraction", "0")
check(r.returncode == 0 and dataset_tokens("upper.h5") == 4, f"upper-case extensions: {r.returncode} {error_line(r)} "
      f"{dataset_tokens('upper.h5')} tokens (4: two documents 'hello world')")

# A file name that is not UTF-8 (latin-1 'caf\xe9.txt'): its path is recorded with U+FFFD; prepare-data and
# `dataset info --json` failed on it (type_error 316, exit 1).
os.makedirs(b"latin1")
shutil.copy(one, b"latin1/caf\xe9.txt")
r = run("prepare-data", "-t", r50k, "-i", "latin1", "-o", "latin1.h5")
info = run("dataset", "info", "latin1.h5", "--json")
check(r.returncode == 0 and info.returncode == 0 and json.loads(info.stdout)["datasets"][0]["sources"] == ["latin1/caf\ufffd.txt"],
      f"latin-1 file name: {r.returncode} {error_line(r)}; info {info.returncode} {error_line(info)}")
# A failed write of the temporary token file gives the file system's reason (it said "disk full?" of any): a file size
# limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes the write fail with EFBIG.
import resource  # noqa: E402


def small_files():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 10, 8 << 10))


r = subprocess.run([st, "prepare-data", "-t", r50k, "-i", inputs, "-o", "fsize.h5", "--batch-mb", "1", "--log-level", "warn"],
                   capture_output=True, text=True, errors="replace", preexec_fn=small_files, timeout=60)
check(r.returncode == 8 and "fsize.h5.tokens-tmp-" in r.stderr and "cannot write the temporary token file: File too large"
      in r.stderr and not os.path.exists("fsize.h5") and not leftovers(), f"token file write refused: {r.returncode} {error_line(r)}")
# A Hub download's README.md (its dataset card) beside data/*.jsonl is read as a document: warned, naming it and how to
# leave it out; a folder of JSONL alone, or of text alone, says nothing.
os.makedirs("hub/data")
with open("hub/data/train.jsonl", "w") as f:
    f.write('{"text": "hello world"}\n')
with open("hub/README.md", "w") as f:
    f.write("# A dataset card\n")
r = run("prepare-data", "-t", r50k, "-i", "hub", "-o", "hub.h5")
check(r.returncode == 0 and "1 file is read as plain text (one training document each) among 1 JSONL, Parquet or Arrow "
      "file: hub/README.md; if it is not training text" in r.stderr and "-i DOWNLOAD/data" in r.stderr,
      f"README.md beside JSONL: {r.returncode} {error_line(r)}")
r = run("prepare-data", "-t", r50k, "-i", "hub/data", "-o", "hub-data.h5")
check(r.returncode == 0 and "plain text" not in r.stderr, f"JSONL alone: {r.returncode} {error_line(r)}")
# A training run on a dataset whose path is not UTF-8 saves its checkpoints (the first save threw type_error 316,
# losing every step before it) and resumes from them as the same data: the recorded path (U+FFFD for the byte) is
# compared with the current one through the same replacement.
with open("tiny.toml", "w") as f:
    f.write('[model]\nvocab_size = 50304\nmax_position_embeddings = 64\nhidden_size = 32\nintermediate_size = 64\n'
            'num_hidden_layers = 1\nnum_attention_heads = 2\nnum_key_value_heads = 1\n[schedule]\neval_every = 0\n'
            '[data]\nlayout = "packed"\nseq_len = 32\nglobal_batch_size = 8\n')
latin1_ds = b"donn\xe9es.h5"
if os.path.exists("latin1.h5"):  # (its preparation is checked above)
    shutil.copy("latin1.h5", latin1_ds)
train_runs = []
for steps in ("6", "9"):
    train_runs.append(subprocess.run([os.fsencode(st), b"train", b"-c", b"tiny.toml", b"--data.path", latin1_ds,
                                      b"--schedule.max_steps", steps.encode(), b"--checkpoint.every_n_steps", b"3",
                                      b"--checkpoint.resume", b"auto", b"--logging.run_dir", b"latin1-run"],
                                     capture_output=True, timeout=300))
saved = sorted(n for n in os.listdir("latin1-run/checkpoints") if not n.startswith(".")) if os.path.isdir("latin1-run/checkpoints") else []
second = train_runs[1].stderr.decode(errors="replace")
check(all(t.returncode == 0 for t in train_runs) and saved == ["step_00000003", "step_00000006", "step_00000009"]
      and "resumed from" in second and "at step 6" in second and "was trained on" not in second
      and "prepared again" not in second,
      f"training on a latin-1 data.path: {[t.returncode for t in train_runs]} {saved} {second[-600:]}")
check.finish("data CLI: outputs, --special, threads and inputs as expected")
