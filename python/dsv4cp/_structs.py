"""_structs.py: the ONLY place that mirrors C structs of include/dsv4cp.h in ctypes.

Every struct the binding passes is a versioned one (dsv4cp.h): it begins with struct_size and
struct_version, which `make()` fills with this mirror's size. The library reads only that many
bytes of an input and writes only that many of an output, so a library whose structs grew (fields
appended) still works with this mirror: the fields it lacks take their defaults. Beyond that:
  * the binding reads as few fields as it can and asks the library for the rest
    (dsv4_weights_get for names and shapes, dsv4_config_ratio for the layer kind);
  * every mirrored struct and field is listed in MIRRORED below, and tests/test_python.py compiles a
    small C program that prints sizeof/offsetof of each of them and compares with ctypes.
"""
import ctypes
from ctypes import c_char_p, c_double, c_int, c_int64, c_void_p, POINTER

MAX_LAYERS = 1024          # DSV4_MAX_LAYERS
STRUCT_VERSION = 1         # DSV4_STRUCT_VERSION
HEAD = [("struct_size", ctypes.c_uint32), ("struct_version", ctypes.c_uint32)]

# enum values (include/dsv4cp.h)
SPLIT_CONTIGUOUS, SPLIT_ZIGZAG = 0, 1
STATUS_NAMES = ("DSV4_OK", "DSV4_ERR_ARG", "DSV4_ERR_CONFIG", "DSV4_ERR_IO", "DSV4_ERR_FORMAT",
                "DSV4_ERR_TENSOR", "DSV4_ERR_NOMEM", "DSV4_ERR_LAYOUT", "DSV4_ERR_COMM", "DSV4_ERR_STATE",
                "DSV4_ERR_UNSUPPORTED")


class Config(ctypes.Structure):
    """dsv4_config."""
    _fields_ = HEAD + [
        ("dim", c_int), ("n_heads", c_int), ("head_dim", c_int), ("rope_dim", c_int),
        ("q_lora_rank", c_int), ("o_groups", c_int), ("o_lora_rank", c_int), ("window", c_int),
        ("index_n_heads", c_int), ("index_head_dim", c_int), ("index_topk", c_int), ("n_layers", c_int),
        ("compress_ratios", c_int * MAX_LAYERS),
        ("rope_theta", c_double), ("compress_rope_theta", c_double), ("rope_factor", c_double),
        ("rope_orig_max_pos", c_double), ("beta_fast", c_double), ("beta_slow", c_double),
        ("eps", c_double), ("index_loss_coeff", c_double),
        ("index_loss_mode", c_int),
        ("n_hidden_layers", c_int), ("fp8_block", c_int * 2),
        ("v41", c_int), ("n_kv_sources", c_int), ("kv_sources", c_int * MAX_LAYERS),
        ("n_index_sources", c_int), ("index_sources", c_int * MAX_LAYERS),
        ("candidate_source", c_int), ("candidate_topk_blocks", c_int), ("candidate_block_size", c_int),
    ]


class Tensor(ctypes.Structure):
    """dsv4_tensor."""
    _fields_ = HEAD + [("name", c_char_p), ("ndim", c_int), ("shape", c_int64 * 2), ("numel", c_int64),
                ("data", c_void_p)]


class Packing(ctypes.Structure):
    """dsv4_packing."""
    _fields_ = HEAD + [("cu_seqlens", c_void_p), ("seqlens_real", c_void_p), ("n_docs", c_int), ("T", c_int64),
                ("batched", c_int)]


class CPConfig(ctypes.Structure):
    """dsv4_cp_config."""
    _fields_ = HEAD + [("split", c_int), ("overlap", c_int)]


class LayerFwdArgs(ctypes.Structure):
    """dsv4_layer_fwd_args."""
    _fields_ = HEAD + [("out", c_void_p), ("topk_ids", c_void_p), ("indexer_loss", c_void_p), ("x", c_void_p),
                       ("n", c_int64), ("pk", c_void_p), ("train", c_int), ("shared", c_void_p)]


class LayerBwdArgs(ctypes.Structure):
    """dsv4_layer_bwd_args."""
    _fields_ = HEAD + [("dx", c_void_p), ("grads", c_void_p), ("dout", c_void_p), ("d_loss", ctypes.c_float)]


class LayerInfo(ctypes.Structure):
    """dsv4_layer_info."""
    _fields_ = HEAD + [("layer", c_int), ("ratio", c_int), ("role", c_int), ("kv_source", c_int),
                       ("index_source", c_int), ("selects", c_int), ("candidate_source", c_int),
                       ("uses_candidates", c_int)]


ROLE_NAMES = ("window", "own", "kv source", "reindex", "reuse")   # dsv4_role

# C type name -> (mirror, fields the binding touches); the layout test checks all fields anyway
MIRRORED = {"dsv4_config": Config, "dsv4_tensor": Tensor, "dsv4_packing": Packing, "dsv4_cp_config": CPConfig,
            "dsv4_layer_fwd_args": LayerFwdArgs, "dsv4_layer_bwd_args": LayerBwdArgs, "dsv4_layer_info": LayerInfo}


def make(cls, **fields):
    """A versioned struct: its head set to this mirror's size, then the given fields."""
    return cls(struct_size=ctypes.sizeof(cls), struct_version=STRUCT_VERSION, **fields)


P_CONFIG = POINTER(Config)
P_TENSOR = POINTER(Tensor)
P_PACKING = POINTER(Packing)
P_CPCONFIG = POINTER(CPConfig)
P_FWDARGS = POINTER(LayerFwdArgs)
P_BWDARGS = POINTER(LayerBwdArgs)
VOIDP = c_void_p
