"""_lib.py: finds and loads libdsv4cp.so, declares the C functions the binding calls (only the
public DSV4_API ones), turns a failing status into a Python exception carrying the library's
one-line message, and makes OpenBLAS use the kernels the dsv4cp program uses.

Why the BLAS kernels matter: results are bitwise reproducible for a fixed BLAS kernel, but two
kernel families (e.g. AVX-512 and SSE3) round differently. The dsv4cp program sets
OPENBLAS_CORETYPE (SkylakeX when the CPU has AVX-512F, Haswell when it has AVX2, the user's value
when set) and re-executes itself, because Debian's OpenBLAS 0.3.21 misdetects some new CPUs. In a
Python process OpenBLAS is shared (one libopenblas.so.0 per process, whoever loads it first:
numpy, torch or us) and reads OPENBLAS_CORETYPE once, when it loads. So:
  * loaded first (`import dsv4cp` before numpy/torch): the variable is set for the load, then restored;
  * already loaded with other kernels (`import torch` first): OpenBLAS's own dynamic-arch entry
    points re-select the kernels (gotoblas_dynamic_quit/init, exported by every DYNAMIC_ARCH
    build), which also changes the kernels numpy and torch use from then on;
  * DSV4CP_BLAS_SWITCH=0 leaves OpenBLAS alone; a mismatch is then reported by a warning
    (results may differ from `dsv4cp run` in the last bits; they remain reproducible).
blas_info() tells what happened.
"""
import ctypes
import ctypes.util
import os
import warnings

from ._structs import (P_BWDARGS, P_CONFIG, P_CPCONFIG, P_FWDARGS, P_PACKING, P_TENSOR, STATUS_NAMES, VOIDP)
from ctypes import POINTER, c_char_p, c_float, c_int, c_int64, c_uint64, c_void_p

_HERE = os.path.dirname(os.path.abspath(__file__))
LIB_ENV = "DSV4CP_LIBRARY"
SWITCH_ENV = "DSV4CP_BLAS_SWITCH"
CORE_ENV = "OPENBLAS_CORETYPE"


class DSV4Error(RuntimeError):
    """A libdsv4cp call failed. str(e) is the library's one-line message; e.status the status name
    (e.g. "DSV4_ERR_ARG")."""

    def __init__(self, message, status="DSV4_ERR_ARG"):
        super().__init__(message)
        self.status = status


def _candidates():
    env = os.environ.get(LIB_ENV)
    if env:
        return [env]
    out = [os.path.normpath(os.path.join(_HERE, "..", "..", "build", "libdsv4cp.so")),  # source tree
           os.path.join(_HERE, "libdsv4cp.so")]                                          # next to the package
    found = ctypes.util.find_library("dsv4cp")                                           # installed
    if found:
        out.append(found)
    return out


def _openblas_loaded():
    try:
        with open("/proc/self/maps") as fh:
            return any("libopenblas" in line for line in fh)
    except OSError:
        return False


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def blas_target():
    """The OpenBLAS core type the dsv4cp program would run with (tools/dsv4cp.c), or None when it
    leaves OpenBLAS's own choice."""
    if os.environ.get(CORE_ENV):
        return os.environ[CORE_ENV]
    if os.environ.get("DSV4_NO_REEXEC"):
        return None
    flags = _cpu_flags()
    return "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None


_blas = {"target": None, "core_at_import": None, "core": None, "switched": False, "loaded_before": False}


def _load():
    target = blas_target()
    _blas["target"] = target
    _blas["loaded_before"] = _openblas_loaded()
    set_env = target is not None and not _blas["loaded_before"] and not os.environ.get(CORE_ENV)
    if set_env:
        os.environ[CORE_ENV] = target
    errors = []
    try:
        for path in _candidates():
            if not os.path.exists(path) and os.sep in path:
                errors.append(f"{path}: no such file")
                continue
            try:
                return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                errors.append(str(e))
    finally:
        if set_env:
            del os.environ[CORE_ENV]
    raise ImportError("dsv4cp: cannot load libdsv4cp.so (run `make` first, or set "
                      f"{LIB_ENV}=/path/to/libdsv4cp.so): " + "; ".join(errors))


lib = _load()


def _corename(ob):
    ob.openblas_get_corename.restype = c_char_p
    name = ob.openblas_get_corename()
    return name.decode() if name else None


def _match_blas():
    """Makes the loaded OpenBLAS use the target kernels (see the top of the file)."""
    try:
        ob = ctypes.CDLL("libopenblas.so.0")   # the copy already in the process (same soname)
        core = _corename(ob)
    except (OSError, AttributeError):
        return
    _blas["core_at_import"] = _blas["core"] = core
    target = _blas["target"]
    if target is None or core is None or core.lower() == target.lower():
        return
    can_switch = hasattr(ob, "gotoblas_dynamic_init") and hasattr(ob, "gotoblas_dynamic_quit")
    if os.environ.get(SWITCH_ENV, "1") != "0" and can_switch:
        had = os.environ.get(CORE_ENV)
        os.environ[CORE_ENV] = target
        try:
            ob.gotoblas_dynamic_quit()
            ob.gotoblas_dynamic_init()
        finally:
            if had is None:
                del os.environ[CORE_ENV]
        _blas["core"] = _corename(ob)
        _blas["switched"] = True
    if (_blas["core"] or "").lower() != target.lower():
        warnings.warn(f"dsv4cp: OpenBLAS runs its '{_blas['core']}' kernels, the dsv4cp program uses "
                      f"'{target}': results are reproducible but may differ from `dsv4cp run` in the last "
                      f"bits (import dsv4cp before numpy/torch, or leave {SWITCH_ENV} unset)",
                      RuntimeWarning, stacklevel=3)


_match_blas()


def blas_info():
    """{'target': core the dsv4cp program uses, 'core': core OpenBLAS runs now, 'core_at_import',
    'switched': whether dsv4cp re-selected the kernels, 'loaded_before': whether OpenBLAS was
    loaded before dsv4cp, 'fingerprint': how this process's BLAS rounds (dsv4_blas_fingerprint, 16
    hex digits: `dsv4cp info` prints the program's; every rank of a CP job must have the same)}."""
    return dict(_blas, fingerprint=f"{lib.dsv4_blas_fingerprint():016x}")


# ---- prototypes (include/dsv4cp.h, include/dsv4cp_mpi.h) -------------------------------------
_I, _P = c_int, c_void_p
_PROTOS = {
    "dsv4_version": (c_char_p, []),
    "dsv4_status_string": (c_char_p, [_I]),
    "dsv4_last_error": (c_char_p, []),
    "dsv4_last_error_location": (c_char_p, []),
    "dsv4_clear_error": (None, []),
    "dsv4_config_preset": (_I, [P_CONFIG, c_char_p]),
    "dsv4_config_parse": (_I, [P_CONFIG, c_char_p]),
    "dsv4_config_load": (_I, [P_CONFIG, c_char_p]),
    "dsv4_config_ratio": (_I, [P_CONFIG, _I]),
    "dsv4_weights_create": (_I, [POINTER(_P), P_CONFIG, _I]),
    "dsv4_weights_free": (None, [_P]),
    "dsv4_weights_count": (_I, [_P]),
    "dsv4_weights_get": (_I, [_P, _I, P_TENSOR]),
    "dsv4_weights_init_random": (_I, [_P, c_uint64]),
    "dsv4_weights_load": (_I, [_P, c_char_p]),
    "dsv4_weights_prefix": (c_char_p, [_P]),
    "dsv4_weights_zero": (None, [_P]),
    "dsv4_layer_create": (_I, [POINTER(_P), P_CONFIG, _I, _P]),
    "dsv4_layer_free": (None, [_P]),
    "dsv4_layer_core": (_P, [_P]),
    "dsv4_layer_set_recompute": (_I, [_P, _I]),
    "dsv4_layer_set_threads": (_I, [_P, _I]),
    "dsv4_layer_forward": (_I, [_P, P_FWDARGS]),
    "dsv4_layer_backward": (_I, [_P, P_BWDARGS]),
    "dsv4_shared_create": (_I, [POINTER(_P)]),
    "dsv4_shared_reset": (None, [_P]),
    "dsv4_shared_free": (None, [_P]),
    "dsv4_shared_skip_backward": (_I, [_P, _I]),
    "dsv4_config_layer": (_I, [P_CONFIG, _I, _P]),
    "dsv4_comm_create_self": (_I, [POINTER(_P)]),
    "dsv4_comm_free": (None, [_P]),
    "dsv4_comm_rank": (_I, [_P]),
    "dsv4_comm_size": (_I, [_P]),
    "dsv4_cp_patch": (_I, [_P, _P, P_CPCONFIG]),
    "dsv4_cp_allreduce_grads": (_I, [_P, _P]),
    "dsv4_cp_shard_rows": (_I, [P_PACKING, P_CPCONFIG, _I, _I, POINTER(c_int64), POINTER(c_int64)]),
    "dsv4_blas_fingerprint": (c_uint64, []),
}
for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


def default_threads(nranks):
    """OpenMP threads per rank by the dsv4cp program's rule (tools/cli.c): OMP_NUM_THREADS when set,
    else the cores of this node divided by the ranks on it."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "")
    ranks = int(local) if local.isdigit() and int(local) > 0 else nranks
    return max(1, (os.cpu_count() or 1) // max(1, ranks))


def check(rc):
    """Raises DSV4Error with the library's last error when rc is not DSV4_OK."""
    if rc != 0:
        msg = (lib.dsv4_last_error() or b"").decode(errors="replace") or "unknown failure"
        status = STATUS_NAMES[rc] if 0 <= rc < len(STATUS_NAMES) else f"status {rc}"
        raise DSV4Error(msg, status)


def comm_create_mpi(mpi_comm):
    """dsv4_comm_create_mpi on an mpi4py communicator (its C handle, by value). Collective."""
    from mpi4py import MPI
    handle_t = c_void_p if MPI._sizeof(MPI.Comm) == ctypes.sizeof(c_void_p) else c_int
    f = lib.dsv4_comm_create_mpi
    f.restype, f.argtypes = c_int, [POINTER(_P), handle_t]
    out = _P()
    check(f(ctypes.byref(out), handle_t(MPI._handleof(mpi_comm))))
    return out


