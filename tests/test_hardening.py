#!/usr/bin/env -S /usr/bin/python3
"""test_hardening.py: untrusted input reaching the command line (issue 12, and the hardening issue
of checkpoints, outputs and input sizes):
  * bytes from argv or files shown in an error are escaped: one printable line per rank;
  * numbers from JSON are range-checked (compress_ratios 1e300 names the value, no int overflow);
  * a directory, FIFO or device given as a file gets a true message, and a FIFO never hangs;
  * a checkpoint cannot make the loader open a file outside its directory: a symlinked shard, a
    symlinked directory in a shard path, a directory's model.safetensors / index that is a link
    out, all refused naming the index entry and the directory, never quoting the target's bytes;
    links staying inside, a checkpoint directory named through a link, and the Hugging Face cache
    layout (snapshot files linked to ../../blobs/<sha>) load; a blob of another repository, a
    non-blob file of the repository, or a blob linking out are refused;
  * an output path holding a device, FIFO, directory or symbolic link is refused before anything
    is loaded, and is still what it was afterwards;
  * SIGTERM / SIGINT / kill -9 of the writer, and SIGTERM to mpirun, while the output is written
    leave nothing but the old file, intact (the unnamed O_TMPFILE file, and the named-temporary
    fallback forced by an LD_PRELOAD shim where O_TMPFILE "is not supported");
  * a sparse input declaring 2^28 cu_seqlens or seqlens_real entries, a 90 MB header hole, or a
    huge dout costs no more peak memory than a legitimate run of the same T;
  * x or dout in F64, and FP8 block scales in F32 that are not powers of two, are refused."""
import argparse
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time

import numpy as np

import ckptlib as K
import testlib as T

sys.path.insert(0, T.REF)
import layer_spec  # noqa: E402

SMALL = {"hidden_size": 32, "num_attention_heads": 4, "head_dim": 16, "qk_rope_head_dim": 8, "q_lora_rank": 24,
         "o_groups": 2, "o_lora_rank": 12, "sliding_window": 8, "compress_ratios": [0]}
# one SWA layer of ~28 M parameters: a ~113 MB fp32 export takes long enough to be interrupted
BIG = {"hidden_size": 2048, "num_attention_heads": 16, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024,
       "o_groups": 4, "o_lora_rank": 1024, "sliding_window": 128, "compress_ratios": [0]}
POLL_SECONDS = 0.001
SIGNAL_TIMEOUT = 120
HOSTILE_ENTRIES = 1 << 28       # a 1 GiB int32 cu_seqlens, declared by a file of a few KB (a hole)
HEADER_HOLE = 90_000_000        # under the 100 MB header limit: a header of zeros (a hole)
RSS_MARGIN_KIB = 32 * 1024      # hostile run's peak RSS may exceed the legitimate run's by this much
SEQ = 64                        # tokens of the small inputs


def expect_error(build, name, args, needles, forbidden=(), nranks=1, timeout=60):
    rc, out, err = T.cli(build, args, nranks=nranks, timeout=timeout)
    lines = [l for l in err.splitlines() if l.strip()]
    printable = all(0x20 <= ord(ch) < 0x7F for l in lines for ch in l)
    ok = rc not in (0, -9) and 0 < rc < 128 and len(lines) == nranks and len(set(lines)) == 1 and printable \
        and lines[0].startswith("dsv4cp: error:") and all(n in lines[0] for n in needles) \
        and not any(f in lines[0] for f in forbidden)
    return T.check(ok, f"hardening: {name}", f"exit {rc}: {' | '.join(lines)[:300]!r}")


def write_json(path, obj):
    with open(path, "w") as fh:
        json.dump(obj, fh)
    return path


def test_messages(b, tmp):
    out = os.path.join(tmp, "out.safetensors")
    evil = "a\nb\x1b[31mc"
    expect_error(b, "argv with a newline and an escape code (config path)",
                 ["run", "--config", os.path.join(tmp, evil), "--layer", "0", "--output", out], ["a\\x0ab\\x1b[31mc"])
    expect_error(b, "the same on 2 ranks", ["run", "--config", os.path.join(tmp, evil), "--layer", "0", "--output", out],
                 ["a\\x0ab\\x1b[31mc"], nranks=2)
    expect_error(b, "unknown command with an escape code", ["x\x1b[2Jy"], ["x\\x1b[2Jy"])
    expect_error(b, "unknown option with a newline", ["run", "--bo\ngus"], ["--bo\\x0agus"])
    cfg = os.path.join(tmp, "c.json")
    write_json(cfg, dict(SMALL, compress_ratios=[0, 1e300]))
    expect_error(b, "compress_ratios 1e300: range-checked, value shown as written",
                 ["run", "--config", cfg, "--layer", "0", "--output", out], ["compress_ratios[1]", "1e+300"],
                 forbidden=["(got -2147483648)"])
    write_json(cfg, dict(SMALL, hidden_size=-1e300))
    expect_error(b, "hidden_size -1e300", ["run", "--config", cfg, "--layer", "0", "--output", out],
                 ["hidden_size", "-1e+300"])
    write_json(cfg, dict(SMALL, sliding_window=2 ** 40))
    expect_error(b, "sliding_window 2^40 (beyond int32)", ["run", "--config", cfg, "--layer", "0", "--output", out],
                 ["sliding_window", "1099511627776"])
    write_json(cfg, dict(SMALL, dim=64))
    expect_error(b, "hidden_size and dim disagree", ["run", "--config", cfg, "--layer", "0", "--output", out],
                 ["'hidden_size'", "'dim'"])


def test_not_regular(b, tmp):
    out = os.path.join(tmp, "out.safetensors")
    expect_error(b, "--config is a directory", ["run", "--config", tmp, "--layer", "0", "--output", out],
                 ["is a directory"], forbidden=["9223372036854775807", "too large"])
    fifo = os.path.join(tmp, "fifo.json")
    os.mkfifo(fifo)
    expect_error(b, "--config is a FIFO (no hang)", ["run", "--config", fifo, "--layer", "0", "--output", out],
                 ["is a FIFO"], timeout=30)
    expect_error(b, "--config is a device", ["run", "--config", "/dev/zero", "--layer", "0", "--output", out],
                 ["character device"])
    cfg = write_json(os.path.join(tmp, "small.json"), SMALL)
    expect_error(b, "--weights is a device", ["run", "--config", cfg, "--layer", "0", "--weights", "/dev/null",
                                              "--output", out], ["/dev/null", "character device"])
    expect_error(b, "--weights FIFO (no hang)", ["run", "--config", cfg, "--layer", "0", "--weights", fifo,
                                                 "--output", out], ["is a FIFO"], timeout=30)
    expect_error(b, "--input is a directory", ["run", "--config", cfg, "--layer", "0", "--input", tmp,
                                               "--output", out], ["is a directory"])
    os.remove(fifo)


def full_config(cfg):
    """cfg with the keys tests/ref/layer_spec needs (the CLI defaults them)."""
    return dict(cfg, index_n_heads=1, index_head_dim=64, index_topk=1, rope_theta=1e4, compress_rope_theta=1e4,
                rope_scaling={"factor": 1, "original_max_position_embeddings": 0, "beta_fast": 1, "beta_slow": 1},
                rms_norm_eps=1e-6)


def layer_shapes(cfg):
    return layer_spec.weight_shapes(layer_spec.layer_config_from_dict(full_config(cfg), 0))


def small_entries(seed=0):
    """SMALL's layer 0 as F32 entries with seeded values."""
    rng = np.random.default_rng(seed)
    return [("layers.0." + short, "F32", shape, (rng.standard_normal(shape) * 0.1).astype(np.float32).tobytes())
            for short, shape in layer_shapes(SMALL).items()]


def big_checkpoint(tmp):
    """BIG's one layer as F32 zeros left as holes in the file (no disk, no time to write)."""
    entries = []
    for short, shape in layer_shapes(BIG).items():
        entries.append(("layers.0." + short, "F32", shape, 4 * int(np.prod(shape))))
    path = os.path.join(tmp, "big.safetensors")
    K.write_raw(path, entries)
    return write_json(os.path.join(tmp, "big.json"), BIG), path


def weights_cmd(cfg, weights, export=None):
    return ["weights", "--config", cfg, "--layer", "0", "--weights", weights] + (["--export", export] if export else [])


def index_to(d, entries, shard):
    """d/model.safetensors.index.json sending every tensor of entries to shard."""
    os.makedirs(d, exist_ok=True)
    return write_json(os.path.join(d, "model.safetensors.index.json"), {"weight_map": {e[0]: shard for e in entries}})


def loads(b, name, cfg, weights, expect_values=None, tmp=None):
    """weights --export from weights succeeds (and, with expect_values, exports exactly them)."""
    out = os.path.join(tmp, "export.safetensors")
    if os.path.exists(out):
        os.remove(out)
    rc, _, err = T.cli(b, weights_cmd(cfg, weights, out), timeout=60)
    ok = rc == 0 and os.path.exists(out)
    if ok and expect_values is not None:
        got = T.load(out)
        ok = all(np.array_equal(got[n], np.frombuffer(raw, np.float32).reshape(shape))
                 for n, _, shape, raw in expect_values)
    return T.check(ok, f"hardening: {name} loads", f"exit {rc}: {err.strip()[-300:]}")


def test_checkpoint_links(b, tmp):
    cfg = write_json(os.path.join(tmp, "small.json"), SMALL)
    ents = small_entries()
    outside = os.path.abspath(os.path.join(tmp, "outside"))
    os.makedirs(outside)
    K.write_raw(os.path.join(outside, "w.safetensors"), ents)        # a valid file: would load silently
    index_to(outside, ents, "w.safetensors")
    export = os.path.join(tmp, "must_not_exist.safetensors")

    def refused(name, weights, needles, forbidden=()):
        expect_error(b, f"checkpoint: {name}", weights_cmd(cfg, weights, export), needles, forbidden)
        T.check(not os.path.exists(export), f"hardening: checkpoint: {name}: weights --export wrote nothing")

    # link -> / and the index entry link/etc/passwd: refused before anything outside is looked up
    d = os.path.join(tmp, "ck_root")
    index_to(d, ents, "link/etc/passwd")
    os.symlink("/", os.path.join(d, "link"))
    head = open("/etc/passwd", "rb").read(8) if os.path.exists("/etc/passwd") else b"root:x:0"
    passwd_number = str(struct.unpack("<Q", head.ljust(8, b"\0"))[0])
    refused("shard path through a link to / (link/etc/passwd)", d,
            ["'link/etc/passwd'", "layers.0.attn.", f"checkpoint directory '{d}'", "symbolic link 'link'"],
            [passwd_number, "header length", "root:"])
    # a shard that is itself a link out, relative and absolute
    for kind, target in (("relative", "../outside/w.safetensors"), ("absolute", os.path.join(outside, "w.safetensors"))):
        d = os.path.join(tmp, f"ck_shard_{kind}")
        index_to(d, ents, "s.safetensors")
        os.symlink(target, os.path.join(d, "s.safetensors"))
        refused(f"shard that is a {kind} link to a valid file outside", d,
                ["'s.safetensors'", f"checkpoint directory '{d}'", "symbolic link 's.safetensors'"])
    # a directory of the shard path that is a link out
    d = os.path.join(tmp, "ck_dirlink")
    index_to(d, ents, "sub/w.safetensors")
    os.symlink("../outside", os.path.join(d, "sub"))
    refused("shard path through a symlinked directory (sub -> ../outside)", d,
            ["'sub/w.safetensors'", "symbolic link 'sub'", d])
    # the directory's own model.safetensors / index as links out
    d = os.path.join(tmp, "ck_single")
    os.makedirs(d)
    os.symlink("../outside/w.safetensors", os.path.join(d, "model.safetensors"))
    refused("directory whose model.safetensors links out", d, ["'model.safetensors'", "symbolic link", d])
    d = os.path.join(tmp, "ck_index")
    os.makedirs(d)
    os.symlink("../outside/model.safetensors.index.json", os.path.join(d, "model.safetensors.index.json"))
    refused("directory whose index links out", d, ["'model.safetensors.index.json'", "symbolic link", d])
    # a shard inside that is not a safetensors file: no byte of it is shown
    d = os.path.join(tmp, "ck_text")
    index_to(d, ents, "notes.safetensors")
    with open(os.path.join(d, "notes.safetensors"), "w") as fh:
        fh.write("root:x:0:0:root:/root:/bin/bash\n")
    refused("shard that is a text file", d, ["not a safetensors file: header length implausible"],
            [str(struct.unpack("<Q", b"root:x:0")[0])])
    # links that stay inside, and a checkpoint directory named through a link: allowed
    d = os.path.join(tmp, "ck_inside")
    index_to(d, ents, "alias/w.safetensors")
    os.makedirs(os.path.join(d, "real"))
    K.write_raw(os.path.join(d, "real", "w.safetensors"), ents)
    os.symlink("real/../real", os.path.join(d, "alias"))
    loads(b, "checkpoint: links that stay inside (alias -> real/../real)", cfg, d, ents, tmp)
    os.symlink(os.path.abspath(d), os.path.join(tmp, "ck_named_link"))
    loads(b, "checkpoint: directory given through a link", cfg, os.path.join(tmp, "ck_named_link"), ents, tmp)
    test_hf_cache(b, tmp, cfg, ents, outside)


def test_hf_cache(b, tmp, cfg, ents, outside):
    """models--org--name/snapshots/<rev>/file -> ../../blobs/<sha>: loads; anything else out refused."""
    repo = os.path.join(tmp, "hub", "models--deepseek-ai--tiny")
    snap = os.path.join(repo, "snapshots", "0123abc")
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(snap)
    os.makedirs(os.path.join(repo, "refs"))
    K.write_raw(os.path.join(repo, "blobs", "5a1e"), ents)
    write_json(os.path.join(repo, "blobs", "9dex"), {"weight_map": {e[0]: "model-00001-of-00001.safetensors"
                                                                    for e in ents}})
    shard = os.path.join(snap, "model-00001-of-00001.safetensors")
    os.symlink("../../blobs/9dex", os.path.join(snap, "model.safetensors.index.json"))
    os.symlink("../../blobs/5a1e", shard)
    loads(b, "Hugging Face cache: snapshot directory (index and shard linked to ../../blobs)", cfg, snap, ents, tmp)
    loads(b, "Hugging Face cache: the snapshot's index file", cfg, os.path.join(snap, "model.safetensors.index.json"),
          ents, tmp)
    other = os.path.join(tmp, "hub", "models--evil--x", "blobs")
    os.makedirs(other)
    K.write_raw(os.path.join(other, "5a1e"), ents)
    K.write_raw(os.path.join(repo, "refs", "w.safetensors"), ents)
    os.symlink(os.path.abspath(os.path.join(outside, "w.safetensors")), os.path.join(repo, "blobs", "0ut"))
    cases = (("a blob of another repository", "../../../models--evil--x/blobs/5a1e"),
             ("a file of the repository that is not a blob", "../../refs/w.safetensors"),
             ("a blob that links out", "../../blobs/0ut"))
    for name, target in cases:
        os.remove(shard)
        os.symlink(target, shard)
        expect_error(b, f"Hugging Face cache: snapshot file linked to {name}", weights_cmd(cfg, snap),
                     ["'model-00001-of-00001.safetensors'", snap, "symbolic link"])
    os.remove(shard)
    os.symlink("../../blobs/5a1e", shard)


def test_outputs(b, tmp):
    """Outputs that are not regular files are refused before loading (a bad --weights must not be
    what fails) and are still what they were afterwards."""
    cfg = write_json(os.path.join(tmp, "small.json"), SMALL)
    d = os.path.join(tmp, "outputs")
    os.makedirs(d)
    missing = os.path.join(tmp, "no_such_weights.safetensors")
    dev = os.path.join(d, "null")
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        dev = "/dev/null"       # without the right to create a device, the right to replace it is lacking too
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    sub = os.path.join(d, "dir")
    os.makedirs(sub)
    target = os.path.join(d, "target")
    with open(target, "w") as fh:
        fh.write("old")
    link = os.path.join(d, "link")
    os.symlink("target", link)
    cases = ((dev, "character device", stat.S_ISCHR), (fifo, "FIFO", stat.S_ISFIFO), (sub, "directory", stat.S_ISDIR),
             (link, "symbolic link", stat.S_ISLNK))
    for path, kind, still in cases:
        expect_error(b, f"--output is a {kind} (refused before loading)",
                     ["run", "--config", cfg, "--layer", "0", "--weights", missing, "--output", path],
                     ["--output", path, kind], forbidden=[missing], timeout=30)
        T.check(still(os.lstat(path).st_mode), f"hardening: --output {kind}: still a {kind} afterwards")
    expect_error(b, "--output is a device, 2 ranks", ["run", "--config", cfg, "--layer", "0", "--output", dev],
                 ["--output", "character device"], nranks=2)
    for path, kind, _ in cases[2:]:
        expect_error(b, f"weights --export is a {kind}", weights_cmd(cfg, missing, path), ["--export", path, kind],
                     forbidden=[missing])
    T.check(open(target).read() == "old" and os.readlink(link) == "target",
            "hardening: the symbolic link's target is untouched and the link is still a link")


# ---- signals while the output is written -------------------------------------------------------
# What to wait for before the signal: with O_TMPFILE the writer holds an unnamed file in the output
# directory ("/dir/#123 (deleted)" in /proc/PID/fd); with the named fallback "<out>.tmp<pid>.<k>".
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
/* DSV4_SHIM_NO_TMPFILE=1: openat(..., O_TMPFILE) fails as on a filesystem without it.
 * DSV4_SHIM_WRITE_US_PER_MB=N: a write to a regular file first sleeps N us per MB (a slow disk). */
static int pass(const char *sym, int dirfd, const char *path, int flags, va_list ap) {
  int (*real)(int, const char *, int, ...) = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, sym);
  mode_t mode = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, mode_t) : 0;
  const char *e = getenv("DSV4_SHIM_NO_TMPFILE");
  if ((flags & O_TMPFILE) == O_TMPFILE && e && *e == '1') { errno = EOPNOTSUPP; return -1; }
  return real(dirfd, path, flags, mode);
}
int openat(int dirfd, const char *path, int flags, ...) {
  va_list ap; va_start(ap, flags); int r = pass("openat", dirfd, path, flags, ap); va_end(ap); return r;
}
int openat64(int dirfd, const char *path, int flags, ...) {
  va_list ap; va_start(ap, flags); int r = pass("openat64", dirfd, path, flags, ap); va_end(ap); return r;
}
ssize_t write(int fd, const void *buf, size_t n) {
  ssize_t (*real)(int, const void *, size_t) = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
  const char *e = getenv("DSV4_SHIM_WRITE_US_PER_MB");
  struct stat st;
  if (e && n >= 65536 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) usleep((useconds_t)((atol(e) * (long)n) >> 20));
  return real(fd, buf, n);
}
"""
SLOW_WRITE_US_PER_MB = "20000"   # BIG's ~113 MB of gradients then take ~2.3 s to write: longer than the
                                 # second mpirun waits between forwarding SIGCONT and SIGTERM


def build_shim(tmp):
    """The LD_PRELOAD library above; None when it cannot be built."""
    src, so = os.path.join(tmp, "shim.c"), os.path.join(tmp, "shim.so")
    with open(src, "w") as fh:
        fh.write(SHIM)
    rc, _, err = T.run(["gcc", "-shared", "-fPIC", "-O1", "-o", so, src, "-ldl"], timeout=60)
    return so if rc == 0 else None


def shim_env(shim, no_tmpfile=False, slow=False):
    """The environment with the shim preloaded (ASan must accept a preload before its runtime)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if shim and (no_tmpfile or slow):
        env["LD_PRELOAD"] = shim
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0").lstrip(":")
        env["DSV4_SHIM_NO_TMPFILE"] = "1" if no_tmpfile else "0"
        env["DSV4_SHIM_WRITE_US_PER_MB"] = SLOW_WRITE_US_PER_MB if slow else "0"
    return env


def holds_unnamed(pid, d):
    """pid has an unnamed (O_TMPFILE) file of directory d open."""
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return False
    for fd in names:
        try:
            t = os.readlink(os.path.join(fds, fd))
        except OSError:
            continue
        if t.startswith(d + "/#") or (t.startswith(d + "/") and t.endswith(" (deleted)")):
            return True
    return False


def children(pid):
    """Pids of the live processes whose parent is pid."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    return out


def writing(d, pids, named):
    if named:
        return any(".tmp" in f for f in os.listdir(d))
    return any(holds_unnamed(p, d) for p in pids)


def interrupt(cmd, d, sig, named, env, ranks_of=None):
    """Starts cmd, waits until its output is being written in d, sends sig (to cmd's process);
    returns (exit status, whether the write was seen). ranks_of(pid): the writing processes."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    seen, t0, pids = False, time.time(), [p.pid]
    while p.poll() is None and time.time() - t0 < SIGNAL_TIMEOUT:
        if ranks_of and len(pids) < 2:   # found once (scanning /proc each poll would be too slow)
            pids = ranks_of(p.pid) or pids
        if writing(d, pids, named):
            seen = True
            p.send_signal(sig)
            break
        time.sleep(POLL_SECONDS)
    try:
        rc = p.wait(timeout=SIGNAL_TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    return rc, seen


def fresh_output_dir(tmp, name):
    """A directory holding only out.safetensors with the content 'old'."""
    d = os.path.realpath(os.path.join(tmp, name))
    os.makedirs(d)
    out = os.path.join(d, "out.safetensors")
    with open(out, "w") as fh:
        fh.write("old")
    return d, out


def only_old(d, out):
    return os.listdir(d) == ["out.safetensors"] and open(out, "rb").read() == b"old"


def test_signals(b, tmp):
    cfg, weights = big_checkpoint(tmp)
    exe = os.path.join(b, "dsv4cp")
    shim = build_shim(tmp)
    T.check(shim is not None, "hardening: the LD_PRELOAD shim (no O_TMPFILE, slow writes) builds with gcc")
    for named in (False, True):
        if named and not shim:
            continue
        how = "named temporary (no O_TMPFILE)" if named else "unnamed O_TMPFILE file"
        env = shim_env(shim, no_tmpfile=named)
        sigs = (signal.SIGTERM, signal.SIGINT) if named else (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)
        for sig in sigs:
            d, out = fresh_output_dir(tmp, f"sig{int(sig)}{'n' if named else 'u'}")
            rc, seen = interrupt([exe] + weights_cmd(cfg, weights, out), d, sig, named, env)
            T.check(seen and rc == -sig and only_old(d, out),
                    f"hardening: {sig.name} while the output is written ({how}): the old file intact, nothing else",
                    f"write seen {seen}, exit {rc}, left {os.listdir(d)}")
        d, out = fresh_output_dir(tmp, f"complete{'n' if named else 'u'}")
        rc, _, err = T.run([exe] + weights_cmd(cfg, weights, out), env=env, timeout=SIGNAL_TIMEOUT)
        ok = rc == 0 and os.listdir(d) == ["out.safetensors"] and len(T.load(out)) == len(layer_shapes(BIG))
        T.check(ok, f"hardening: export completes through the {how}", f"exit {rc}: {err.strip()[-200:]}")
    if not shim:
        return
    # mpirun -np 2 run with the gradients of BIG (113 MB) written slowly: SIGTERM to mpirun while
    # rank 0 writes; mpirun forwards SIGCONT, a second later SIGTERM, a second after that SIGKILL
    dout = os.path.join(tmp, "dout.safetensors")
    K.write_raw(dout, [("dout", "F32", [SEQ, BIG["hidden_size"]], 4 * SEQ * BIG["hidden_size"])])
    for named in (False, True):
        d, out = fresh_output_dir(tmp, f"mpirun{'n' if named else 'u'}")
        cmd = ["mpirun", "--quiet", "--oversubscribe", "--allow-run-as-root", "-np", "2"] + \
            [a for v in ("LD_PRELOAD", "ASAN_OPTIONS", "DSV4_SHIM_NO_TMPFILE", "DSV4_SHIM_WRITE_US_PER_MB")
             for a in ("-x", v)] + \
            [exe, "run", "--config", cfg, "--layer", "0", "--seq", str(SEQ), "--grad-output", dout, "--output", out,
             "--quiet"]
        rc, seen = interrupt(cmd, d, signal.SIGTERM, named, shim_env(shim, no_tmpfile=named, slow=True),
                             ranks_of=children)
        T.check(seen and rc != 0 and only_old(d, out),
                f"hardening: SIGTERM to mpirun -np 2 while rank 0 writes ({'named temporary' if named else 'O_TMPFILE'})"
                f": the old file intact, nothing else", f"write seen {seen}, exit {rc}, left {os.listdir(d)}")


# ---- input sizes ----------------------------------------------------------------------------------
def run_rss(b, args):
    """dsv4cp args (one process); returns (exit status, stderr, peak RSS in KiB)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(os.devnull, "w") as null:
        p = subprocess.Popen([os.path.join(b, "dsv4cp")] + args, stdout=null, stderr=subprocess.PIPE, env=env)
        err = p.stderr.read().decode(errors="replace")
        _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err, ru.ru_maxrss


def x_entry(dtype="F32"):
    d = SMALL["hidden_size"]
    x = (np.random.default_rng(1).standard_normal((SEQ, d)) * 0.5)
    return ("x", dtype, [SEQ, d], x.astype(np.float64 if dtype == "F64" else np.float32).tobytes())


def test_input_memory(b, tmp):
    cfg = write_json(os.path.join(tmp, "small.json"), SMALL)
    out = os.path.join(tmp, "mem_out.safetensors")
    base = ["run", "--config", cfg, "--layer", "0", "--output", out]
    good = os.path.join(tmp, "good_in.safetensors")
    K.write_raw(good, [x_entry(), ("cu_seqlens", "I32", [2], struct.pack("<2i", 0, SEQ))])
    rc, err, legit = run_rss(b, base + ["--input", good])
    T.check(rc == 0, "hardening: legitimate packed input runs (baseline for peak memory)", err.strip()[-200:])
    hostile = {
        "cu_seqlens declaring 2^28 entries": ([x_entry(), ("cu_seqlens", "I32", [HOSTILE_ENTRIES], 4 * HOSTILE_ENTRIES)],
                                              ["cu_seqlens", f"2 to {SEQ + 1} entries", str(HOSTILE_ENTRIES)]),
        "seqlens_real declaring 2^28 entries": ([x_entry(), ("cu_seqlens", "I32", [2], struct.pack("<2i", 0, SEQ)),
                                                 ("seqlens_real", "I32", [HOSTILE_ENTRIES], 4 * HOSTILE_ENTRIES)],
                                                ["seqlens_real", "1 entries", str(HOSTILE_ENTRIES)]),
    }
    for name, (entries, needles) in hostile.items():
        path = os.path.join(tmp, "hostile.safetensors")
        K.write_raw(path, entries)
        small = os.stat(path).st_blocks * 512 < (1 << 20)
        rc, err, peak = run_rss(b, base + ["--input", path])
        line = err.strip()
        T.check(small and rc == 1 and all(n in line for n in needles) and peak <= legit + RSS_MARGIN_KIB,
                f"hardening: sparse input, {name}: refused before reading, peak RSS within {RSS_MARGIN_KIB} KiB of a "
                f"legitimate run", f"peak {peak} KiB vs {legit} KiB, exit {rc}: {line[-200:]}")
    # a header of 90 MB declared, all of it a hole (zeros): refused at the first chunk
    path = os.path.join(tmp, "hole_header.safetensors")
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", HEADER_HOLE) + b"{")
        fh.truncate(8 + HEADER_HOLE)
    rc, err, peak = run_rss(b, base + ["--input", path])
    T.check(rc == 1 and "not a safetensors file" in err and peak <= legit + RSS_MARGIN_KIB,
            "hardening: a 90 MB header hole costs no more than a legitimate run", f"peak {peak} vs {legit} KiB: "
            f"{err.strip()[-200:]}")
    # dout declaring 2^26 rows (8 GiB of holes): refused by its shape before any read
    path = os.path.join(tmp, "hostile_dout.safetensors")
    rows = 1 << 26
    K.write_raw(path, [("dout", "F32", [rows, SMALL["hidden_size"]], 4 * rows * SMALL["hidden_size"])])
    rc, err, peak = run_rss(b, base + ["--input", good, "--grad-output", path])
    T.check(rc == 1 and "'dout'" in err and peak <= legit + RSS_MARGIN_KIB,
            "hardening: a dout of 2^26 rows is refused by its shape, peak RSS bounded", f"peak {peak} vs {legit} KiB: "
            f"{err.strip()[-200:]}")


def test_dtypes(b, tmp):
    cfg = write_json(os.path.join(tmp, "small.json"), SMALL)
    out = os.path.join(tmp, "dt_out.safetensors")
    base = ["run", "--config", cfg, "--layer", "0", "--output", out]
    x64 = os.path.join(tmp, "x64.safetensors")
    K.write_raw(x64, [x_entry("F64")])
    expect_error(b, "x in F64 refused", base + ["--input", x64], ["tensor 'x'", "F64", "F32, BF16 or F16"])
    good = os.path.join(tmp, "x32.safetensors")
    K.write_raw(good, [x_entry()])
    d64 = os.path.join(tmp, "dout64.safetensors")
    K.write_raw(d64, [("dout", "F64", [SEQ, SMALL["hidden_size"]], bytes(8 * SEQ * SMALL["hidden_size"]))])
    expect_error(b, "dout in F64 refused", base + ["--input", good, "--grad-output", d64],
                 ["tensor 'dout'", "F64", "F32, BF16 or F16"])
    # FP8 wq_a with an F32 block scale: 0.3 and -2 are not powers of two E8M0 holds; 0.25 is
    block = [8, 8]
    qcfg = write_json(os.path.join(tmp, "fp8.json"), dict(SMALL, quantization_config={
        "quant_method": "fp8", "weight_block_size": block}))
    ents = small_entries()
    for value, ok in ((0.3, False), (-2.0, False), (0.25, True)):
        es = []
        for name, dtype, shape, raw in ents:
            if name.endswith("attn.wq_a.weight"):
                sshape = [-(-shape[0] // block[0]), -(-shape[1] // block[1])]
                es.append((name, "F8_E4M3", shape, bytes([0x38]) * (shape[0] * shape[1])))   # 0x38 = 1.0
                es.append((name + "_scale_inv", "F32", sshape, np.full(sshape, value, np.float32).tobytes()))
            else:
                es.append((name, dtype, shape, raw))
        path = os.path.join(tmp, "fp8_scale.safetensors")
        K.write_raw(path, es)
        if ok:
            loads(b, f"FP8 weight with F32 scale {value}", qcfg, path, tmp=tmp)
        else:
            expect_error(b, f"FP8 F32 block scale {value} (not a power of two) refused", weights_cmd(qcfg, path),
                         ["layers.0.attn.wq_a.weight_scale_inv", "F32", "power of two"])


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    a = p.parse_args()
    tmp = os.path.join(T.golden_dir(a.build), "hardening")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    test_messages(a.build, tmp)
    test_not_regular(a.build, tmp)
    test_checkpoint_links(a.build, tmp)
    test_outputs(a.build, tmp)
    test_input_memory(a.build, tmp)
    test_dtypes(a.build, tmp)
    test_signals(a.build, tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
