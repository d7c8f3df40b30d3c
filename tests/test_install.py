#!/usr/bin/env -S /usr/bin/python3
"""test_install.py: the library as a user outside this tree meets it.
  - `make install PREFIX=<tmp>` then a plain gcc program that includes every public header, built
    only through `pkg-config --cflags --libs dsv4cp` (MPI's include path comes along), runs alone and
    under mpirun -np 2 from the non-system prefix;
  - the shared library exports exactly the functions the public headers declare (DSV4_API);
  - the dsv4cp program is a client of that API: its objects refer to no other library symbol and its
    sources include no header of src/;
  - nothing in the repository refers to files outside it."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import testlib as T

PROGRAM = r"""
#include <dsv4cp.h>
#include <dsv4cp_io.h>
#include <dsv4cp_mpi.h>
#include <dsv4cp_ops.h>
#include <stdio.h>
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  dsv4_config cfg = DSV4_CONFIG_INIT;
  dsv4_comm *comm = NULL;
  int ok = dsv4_config_preset(&cfg, "tiny") == DSV4_OK && dsv4_comm_create_mpi(&comm, MPI_COMM_WORLD) == DSV4_OK;
  printf("dsv4cp %s header %s %s ranks %d\n", dsv4_version(), DSV4_VERSION_STRING, ok ? "ok" : dsv4_last_error(),
         comm ? dsv4_comm_size(comm) : 0);
  dsv4_comm_free(comm);
  MPI_Finalize();
  return !ok;
}
"""


PUBLIC_HEADERS = ("dsv4cp.h", "dsv4cp_io.h", "dsv4cp_mpi.h", "dsv4cp_ops.h")


def program_uses_public_api_only(build):
    """The CLI's objects: every dsv4_ symbol they need is declared by a public header, and no source
    of tools/ includes a header of the library's src/."""
    objs = [os.path.join(build, "obj", "tools", f) for f in sorted(os.listdir(os.path.join(build, "obj", "tools")))
            if f.endswith(".o")]
    nm = subprocess.run(["nm", "-u"] + objs, capture_output=True, text=True)
    used = {l.split()[-1] for l in nm.stdout.splitlines() if l.strip().startswith("U ") and "dsv4_" in l}
    internal = sorted(n for n in used if n.startswith("dsv4_") and n not in declared_api())
    T.check(nm.returncode == 0 and len(objs) > 10 and used and not internal,
            f"the dsv4cp program's {len(objs)} objects use only public functions ({len(used)} of them)",
            f"library-internal: {internal[:8]}")
    tools = os.path.join(T.ROOT, "tools")
    own = set(os.listdir(tools))
    bad = []
    for f in sorted(os.listdir(tools)):
        if f.endswith((".c", ".h")):
            for m in re.finditer(r'^#include\s+"([^"]+)"', open(os.path.join(tools, f)).read(), re.M):
                if m.group(1) not in own and m.group(1) not in PUBLIC_HEADERS:
                    bad.append(f"{f}: {m.group(1)}")
    T.check(not bad, "tools/ includes only its own headers and the public ones", "; ".join(bad[:5]))


def declared_api():
    names = set()
    for h in PUBLIC_HEADERS:
        for m in re.finditer(r"^DSV4_API\b[^(]*?\b(dsv4_\w+)\s*\(", open(os.path.join(T.ROOT, "include", h)).read(), re.M):
            names.add(m.group(1))
    return names


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    a = p.parse_args()
    build = os.path.abspath(a.build)
    if T.sanitized():
        print("note: install test skipped in the sanitizer pass (a plain gcc program cannot link an ASan library)")
        return T.finish()
    program_uses_public_api_only(build)
    tmp = tempfile.mkdtemp(prefix="dsv4cp-install-")
    try:
        prefix = os.path.join(tmp, "prefix")
        rc, out, err = T.run(["make", "-C", T.ROOT, "--no-print-directory", "install", f"BUILD={build}",
                              f"PREFIX={prefix}"], timeout=600)
        if not T.check(rc == 0 and os.path.exists(os.path.join(prefix, "lib", "pkgconfig", "dsv4cp.pc")),
                       "make install PREFIX=<tmp> installs headers, libraries, CLI and dsv4cp.pc", err.strip()[-300:]):
            return T.finish()
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "lib", "pkgconfig"))
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "dsv4cp"], capture_output=True, text=True, env=env)
        src, exe = os.path.join(tmp, "user.c"), os.path.join(tmp, "user")
        open(src, "w").write(PROGRAM)
        cc = subprocess.run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", exe, src] + flags.stdout.split(),
                            capture_output=True, text=True)
        T.check(flags.returncode == 0 and cc.returncode == 0,
                "a plain gcc program with every public header builds with pkg-config --cflags --libs dsv4cp",
                (flags.stderr + cc.stderr).strip()[-300:])
        if cc.returncode == 0:
            rc, out, err = T.run([exe], env={"LD_LIBRARY_PATH": ""})
            T.check(rc == 0 and "ok ranks 1" in out, "it runs from the non-system prefix (rpath)", (out + err).strip()[-200:])
            rc, out, err = T.run(["mpirun", "--quiet", "--oversubscribe", "--allow-run-as-root", "-np", "2", exe])
            T.check(rc == 0 and out.count("ok ranks 2") == 2, "it runs under mpirun -np 2", (out + err).strip()[-200:])
        nm = subprocess.run(["nm", "-D", "--defined-only", os.path.join(prefix, "lib", "libdsv4cp.so")],
                            capture_output=True, text=True)
        exported = {l.split()[-1] for l in nm.stdout.splitlines() if l.split() and l.split()[-2] in ("T", "W")}
        declared = declared_api()
        T.check(nm.returncode == 0 and exported == declared and len(declared) > 40,
                f"libdsv4cp.so exports exactly the {len(declared)} functions the public headers declare",
                f"not declared: {sorted(exported - declared)[:5]}, not exported: {sorted(declared - exported)[:5]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    git = subprocess.run(["git", "-C", T.ROOT, "grep", "-n", "-I", "-E", r"\.\./shared|shared/SPEC|seeds/0"],
                         capture_output=True, text=True)
    hits = [l for l in git.stdout.splitlines() if not l.startswith("tests/test_install.py")]
    T.check(git.returncode in (0, 1) and not hits, "no file of the repository refers to files outside it", "; ".join(hits[:3]))
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
