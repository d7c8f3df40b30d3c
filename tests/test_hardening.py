#!/usr/bin/env -S /usr/bin/python3
"""test_hardening.py: untrusted input reaching the command line (issue 12):
  * bytes from argv or files shown in an error are escaped: one printable line per rank;
  * numbers from JSON are range-checked (compress_ratios 1e300 names the value, no int overflow);
  * a directory, FIFO or device given as a file gets a true message, and a FIFO never hangs;
  * SIGTERM / SIGINT while the output is being written leave no <output>.tmp<pid>.<k> behind and the
    process dies by that signal."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

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


def big_checkpoint(tmp):
    """BIG's one layer as F32 zeros left as holes in the file (no disk, no time to write)."""
    full = dict(BIG, index_n_heads=1, index_head_dim=64, index_topk=1, rope_theta=1e4, compress_rope_theta=1e4,
                rope_scaling={"factor": 1, "original_max_position_embeddings": 0, "beta_fast": 1, "beta_slow": 1},
                rms_norm_eps=1e-6)
    lc = layer_spec.layer_config_from_dict(full, 0)
    entries = []
    for short, shape in layer_spec.weight_shapes(lc).items():
        n = 1
        for s in shape:
            n *= s
        entries.append(("layers.0." + short, "F32", shape, 4 * n))
    path = os.path.join(tmp, "big.safetensors")
    K.write_raw(path, entries)
    return write_json(os.path.join(tmp, "big.json"), BIG), path


def interrupt_export(b, tmp, cfg, weights, sig):
    """Starts an export, waits for its temporary file, sends sig; returns (exit status, leftovers,
    whether the temporary was seen)."""
    d = os.path.join(tmp, f"sig{int(sig)}")
    os.makedirs(d)
    out = os.path.join(d, "out.safetensors")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen([os.path.join(b, "dsv4cp"), "weights", "--config", cfg, "--layer", "0", "--weights", weights,
                          "--export", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    seen, t0 = False, time.time()
    while p.poll() is None and time.time() - t0 < SIGNAL_TIMEOUT:
        if any(".tmp" in f for f in os.listdir(d)):
            seen = True
            p.send_signal(sig)
            break
        time.sleep(POLL_SECONDS)
    try:
        rc = p.wait(timeout=SIGNAL_TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    return rc, os.listdir(d), seen


def test_signals(b, tmp):
    cfg, weights = big_checkpoint(tmp)
    for sig in (signal.SIGTERM, signal.SIGINT):
        rc, left, seen = interrupt_export(b, tmp, cfg, weights, sig)
        T.check(seen and rc == -sig and not left,
                f"hardening: {sig.name} while the output is written: no temporary left, death by the signal",
                f"temporary seen {seen}, exit {rc}, left {left}")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    a = p.parse_args()
    tmp = os.path.join(T.golden_dir(a.build), "hardening")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    test_messages(a.build, tmp)
    test_not_regular(a.build, tmp)
    test_signals(a.build, tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
