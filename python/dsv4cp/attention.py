"""attention.py: dsv4cp.Attention, a torch.nn.Module over one DeepSeek V4 / V4.1 attention layer of
the C library (SPEC sections 9 and 10), dsv4cp.Shared (the state V4.1 layers share in one forward
pass), their autograd function, and allreduce_grads / shard_rows.

V4.1: a kv source writes its compressed kv into the Shared object of the pass and the layers of its
group read it; in the backward each adds its gradient of it there and the kv source's backward,
which must come last, uses the sums. Autograd is made to run them in that order: the kv source's
forward also returns a 0-dim token (kept in the Shared object) that every reader takes as an input,
so the source's backward waits for all of theirs.

Memory: every parameter is a view of the library's own weight memory, so load_state_dict and an
optimizer's in-place updates reach the C layer without a copy (a parameter whose .data a user
rebinds is copied back into the C buffer before the next forward). x, out, topk_ids, dout and dx
are passed to C by pointer (x and dout are copied only when not contiguous fp32). Each backward
fills a fresh C gradient set whose tensors become the parameters' gradients (no copy either).

State: the C layer keeps what the backward needs from ONE training forward. Every forward bumps a
generation counter; a backward whose forward is no longer the latest raises instead of using
another forward's activations.

Under CP (comm with more than one rank) the module takes this rank's rows and every rank must call
forward and backward together. What the binding itself checks (types, shapes, a stale backward)
could fail on one rank alone, so its verdict is agreed on with one small all-gather and every rank
raises the same exception instead of leaving the others waiting in a collective of the library.
The library agrees on everything else itself (config, packing meta, row counts: one all-reduce
before any other message) and fails the same way on every rank. The packing rules are the
library's alone; the binding encodes none of them.
"""
import ctypes
import json
import math
import os
import threading
import weakref
from typing import NamedTuple, Optional

import torch
from torch.autograd.function import once_differentiable

from . import _lib
from ._lib import DSV4Error, check, lib
from ._structs import (Config, CPConfig, LayerBwdArgs, LayerFwdArgs, LayerInfo, Packing, ROLE_NAMES,
                       SPLIT_CONTIGUOUS, SPLIT_ZIGZAG, Tensor, make)

SPLITS = {"contiguous": SPLIT_CONTIGUOUS, "zigzag": SPLIT_ZIGZAG}
ROLE_FULL = 2   # dsv4_role: a V4.1 kv source
_EXCEPTIONS = {c.__name__: c for c in (ValueError, TypeError, DSV4Error, RuntimeError)}
_live_cp = weakref.WeakSet()   # layer owners of CP modules: freed (layer, then communicator) at exit
_atexit_registered = []


# ---- ownership of C objects ------------------------------------------------------------------

class _Owned:
    """A C handle freed by `free` when the last Python reference goes; `keep` holds objects that
    must outlive it (the layer borrows the weights and the communicator)."""

    def __init__(self, handle, free, keep=(), mpi=None):
        self.handle, self._free, self.keep, self.mpi = handle, free, list(keep), mpi

    def release(self):
        if self.handle is not None and self.handle.value:
            if self.mpi is None or not _mpi_finalized():
                self._free(self.handle)
            self.handle = None
        if self.mpi is not None and not _mpi_finalized():
            self.mpi.Free()
        self.mpi = None

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown: nothing left to report to
            pass


def _mpi_finalized():
    try:
        from mpi4py import MPI
        return MPI.Is_finalized()
    except Exception:
        return True


def _float_view(owner, ptr, numel, shape):
    """A torch float32 tensor on C memory at ptr, keeping `owner` alive as long as it lives."""
    buf = (ctypes.c_float * numel).from_address(ptr)
    buf._owner = owner
    return torch.frombuffer(buf, dtype=torch.float32).view(*shape)


def _weights_tensors(owner):
    """[(short name, ptr, shape)] of a dsv4_weights set, in the library's order."""
    out = []
    t = make(Tensor)
    for i in range(lib.dsv4_weights_count(owner.handle)):
        check(lib.dsv4_weights_get(owner.handle, i, ctypes.byref(t)))
        out.append((t.name.decode(), t.data, tuple(t.shape[k] for k in range(t.ndim)), t.numel))
    return out


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else None


# ---- CP agreement ------------------------------------------------------------------------------

def _agree(mpi, err):
    """Collective when mpi is not None: raises on EVERY rank the exception of the lowest failing
    rank; returns when no rank failed. Without mpi, raises err when set."""
    if mpi is None:
        if err is not None:
            raise err
        return
    mine = None if err is None else (type(err).__name__, str(err), getattr(err, "status", None))
    everyone = mpi.allgather(mine)
    for rank, e in enumerate(everyone):
        if e is not None:
            if err is not None and rank == mpi.Get_rank():
                raise err
            cls = _EXCEPTIONS.get(e[0], RuntimeError)
            exc = cls(e[1], e[2]) if cls is DSV4Error else cls(e[1])
            exc.rank = rank
            raise exc


# ---- packing meta of one call --------------------------------------------------------------------

class _Meta:
    """The dsv4_packing of one forward and the arrays it points to (kept alive with it)."""

    def __init__(self, T, cu, real, batched, n_local, x_shape):
        self.cu, self.real, self.n_local, self.x_shape = cu, real, n_local, x_shape
        self.pk = make(Packing, cu_seqlens=_ptr(cu), seqlens_real=_ptr(real),
                       n_docs=0 if cu is None else cu.numel() - 1, T=T, batched=int(batched))


def _int32_1d(v, name):
    """cu_seqlens / seqlens_real as a contiguous int32 CPU tensor (None stays None)."""
    if v is None:
        return None
    t = torch.as_tensor(v)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (int32), not {t.dtype}")
    if t.device.type != "cpu":
        raise TypeError(f"{name} must be a CPU tensor, not on {t.device}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-d, has shape {list(t.shape)}")
    if t.numel() and (int(t.min()) < -2 ** 31 or int(t.max()) >= 2 ** 31):
        raise ValueError(f"{name} has values outside int32")
    return t.to(torch.int32).contiguous()


# ---- autograd -------------------------------------------------------------------------------------

class AttentionOutput(NamedTuple):
    """What Attention returns; unpacks as `out, topk_ids, indexer_loss`."""
    out: torch.Tensor
    topk_ids: Optional[torch.Tensor]
    indexer_loss: Optional[torch.Tensor]


class Shared:
    """The state DeepSeek V4.1 layers share in ONE forward pass (SPEC 10): create one per pass and
    hand it to every layer, called in model order; autograd runs the backwards in reverse. V4
    layers accept it and ignore it. reset() starts another pass with the same buffers (after the
    previous pass's backward). A reader whose outputs do not reach the loss is fine: autograd never
    runs its backward, and its kv source's backward counts it as contributing nothing."""

    def __init__(self):
        h = ctypes.c_void_p()
        check(lib.dsv4_shared_create(ctypes.byref(h)))
        self._owned = _Owned(h, lib.dsv4_shared_free)
        self.tokens = {}   # kv source layer -> its token (the readers' autograd dependency)
        self._pending = {}  # kv source layer -> readers that ran a training forward, backward not yet

    @property
    def handle(self):
        return self._owned.handle

    def reset(self):
        lib.dsv4_shared_reset(self._owned.handle)
        self.tokens = {}
        self._pending = {}

    def _before_backward(self, attn):
        """A reader's backward: it is no longer pending. A kv source's: autograd runs every reader
        whose outputs reach the loss before it, so the readers still pending never will; tell the
        library they contribute nothing (else it would wait for them and refuse the backward)."""
        if attn._reader:
            self._pending.get(attn.kv_source, set()).discard(attn.layer)
            return
        for j in sorted(self._pending.pop(attn.layer, set())):
            check(lib.dsv4_shared_skip_backward(self._owned.handle, j))


class _LayerFunction(torch.autograd.Function):
    """out, topk_ids, indexer_loss, token = layer(x); params are inputs so that autograd routes their
    gradients (the C layer reads them from its own memory, which they view). token_in: a V4.1
    reader's kv source token (its backward then waits for this one); token out: a kv source's. The
    backward is the library's, computed once: it is not itself differentiable (a double backward
    raises instead of quietly dropping the second-order terms)."""

    @staticmethod
    def forward(ctx, attn, meta, shared, x, token_in, *params):
        out, topk, loss = attn._forward_c(x, meta, train=True, shared=shared)
        ctx.attn, ctx.meta, ctx.generation, ctx.shared = attn, meta, attn._generation, shared
        ctx.save_for_backward(x, *params)   # version counters: in-place changes before backward raise
        ctx.mark_non_differentiable(topk)
        return out, topk, loss, torch.zeros(())

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _dtopk, dloss, _dtoken):
        attn = ctx.attn
        x = ctx.saved_tensors[0]
        if ctx.shared is not None and (attn._full or attn._reader):
            ctx.shared._before_backward(attn)
        dx, grads = attn._backward_c(ctx.generation, ctx.meta, x, dout, dloss, ctx.shared)
        return (None, None, None, dx, None) + tuple(grads)


# ---- the module ---------------------------------------------------------------------------------

class Attention(torch.nn.Module):
    """One DeepSeek V4 attention layer (sliding window, CSA or HCA by the layer's compress ratio), or
    V4.1 layer (a kv source, a reindex or reuse layer, window only: SPEC 10), computed by libdsv4cp,
    forward and backward, optionally with context parallelism.

    Attention(config, layer, comm=None, split="contiguous", recompute=False, seed=0)
      config: path of a config.json, or a dict of its keys; layer: index into compress_ratios;
      comm: None (one rank) or an mpi4py communicator (CP over its ranks; collective);
      split: "contiguous" or "zigzag" (SPEC 5); recompute: save fewer activations and rebuild them
      in the backward (bitwise the same results); seed: the initial weights are the library's seeded random
      weights, the same as `dsv4cp run --seed S` without --weights; threads: OpenMP threads of the
      library's calls, a setting of this module alone (dsv4_layer_set_threads; default: the dsv4cp
      program's rule, OMP_NUM_THREADS or cores / ranks per node).

    out, topk_ids, indexer_loss = attn(x, cu_seqlens=None, seqlens_real=None, shared=None)   # an AttentionOutput
      x: float32 [n_local, d] (packed stream; this rank's rows under CP) or [B, S_local, d] (B sequences);
      other dtypes raise TypeError (the library computes in float32 and converts nothing silently),
      a NaN or infinite value raises ValueError;
      cu_seqlens, seqlens_real: int32, GLOBAL (the whole stream, every rank the same).
      shared: a dsv4cp.Shared, one per forward pass, for V4.1 layers that read another layer's
      compressed kv or top-k (required for them; ignored by V4 layers);
      out: the shape of x; topk_ids: int32 [n_local, index_topk] global compressed ids (r = 4, V4.1
      index sources) or None; indexer_loss: 0-dim tensor, the whole-batch value on every rank (the
      same layers), or None.
    """

    def __init__(self, config, layer, comm=None, split="contiguous", recompute=False, seed=0, threads=None):
        super().__init__()
        self._mpi = None
        self._comm = None
        self._generation = 0
        self._spent = None      # the generation whose backward ran (it consumed the saved state)
        self._live = None          # generation whose activations the C layer holds, or None
        self._lock = threading.Lock()   # one call at a time: the C layer keeps one forward's state
        err = None
        try:
            self._setup_local(config, layer, split, seed)
        except (ValueError, TypeError, DSV4Error, OSError) as e:
            err = e if not isinstance(e, OSError) else ValueError(str(e))
        if comm is not None and comm.Get_size() > 1:
            _agree(comm, err)      # every rank raises when one cannot build its layer
            self._setup_cp(comm)
        elif err is not None:
            raise err
        self.threads = threads or _lib.default_threads(self.size)
        self.recompute = False
        if recompute:
            self.set_recompute(True)

    # -- construction ------------------------------------------------------------------------
    def _setup_local(self, config, layer, split, seed):
        if split not in SPLITS:
            raise ValueError(f"split must be 'contiguous' or 'zigzag', not {split!r}")
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int, not {type(layer).__name__}")
        self.split, self.layer = split, layer
        cfg = make(Config)
        if isinstance(config, dict):
            check(lib.dsv4_config_parse(ctypes.byref(cfg), json.dumps(config).encode()))
        elif isinstance(config, (str, os.PathLike)):
            check(lib.dsv4_config_load(ctypes.byref(cfg), os.fsencode(config)))
        else:
            raise TypeError(f"config must be a path or a dict, not {type(config).__name__}")
        self._cfg = cfg
        w = ctypes.c_void_p()
        check(lib.dsv4_weights_create(ctypes.byref(w), cfg, layer))
        self._weights = _Owned(w, lib.dsv4_weights_free)
        check(lib.dsv4_weights_init_random(w, int(seed)))
        self.ratio = lib.dsv4_config_ratio(cfg, layer)
        info = make(LayerInfo)
        check(lib.dsv4_config_layer(cfg, layer, ctypes.cast(ctypes.byref(info), ctypes.c_void_p)))
        self.role, self.selects = ROLE_NAMES[info.role], bool(info.selects)
        self.kv_source = info.kv_source
        self._full = info.role == ROLE_FULL and bool(cfg.v41)
        self._reader = bool(cfg.v41) and 0 <= info.kv_source != layer   # reads another layer's kv
        self.dim, self.index_topk = cfg.dim, cfg.index_topk
        self._params, self._views = [], []
        for name, ptr, shape, numel in _weights_tensors(self._weights):
            view = _float_view(self._weights, ptr, numel, shape)
            p = torch.nn.Parameter(view)
            self._register(name, p)
            self._params.append(p)
            self._views.append((name, view))
        if self._views[0][0] != "attn.wq_a.weight" or self._views[0][1].shape[1] != self.dim:
            raise RuntimeError("dsv4cp: the library's weight table does not start with attn.wq_a.weight [dq, d]")
        lay = ctypes.c_void_p()
        check(lib.dsv4_layer_create(ctypes.byref(lay), cfg, layer, w))
        self._layer = _Owned(lay, lib.dsv4_layer_free, keep=[self._weights])

    def _register(self, dotted, param):
        """Registers "attn.wq_a.weight" as submodule attn -> wq_a -> parameter weight, so that
        named_parameters() and state_dict() use DeepSeek's short names."""
        *path, leaf = dotted.split(".")
        mod = self
        for part in path:
            if part not in mod._modules:
                mod.add_module(part, torch.nn.Module())
            mod = mod._modules[part]
        mod.register_parameter(leaf, param)

    def _setup_cp(self, comm):
        self._mpi = comm.Dup()
        c = _lib.comm_create_mpi(self._mpi)
        self._comm = _Owned(c, lib.dsv4_comm_free, mpi=self._mpi)
        self._layer.keep.append(self._comm)   # the core uses the communicator until it is freed
        self._layer.cp_comm = self._comm
        _live_cp.add(self._layer)
        if not _atexit_registered:             # after mpi4py's import: runs before MPI is finalised
            import atexit
            atexit.register(_free_mpi_at_exit)
            _atexit_registered.append(True)
        cp = make(CPConfig, split=SPLITS[self.split], overlap=1)
        err = None
        try:
            check(lib.dsv4_cp_patch(lib.dsv4_layer_core(self._layer.handle), c, ctypes.byref(cp)))
        except DSV4Error as e:
            err = e
        _agree(self._mpi, err)

    @property
    def threads(self):
        """OpenMP threads of this module's library calls (a per-layer setting; process-wide OpenMP
        state is left alone)."""
        return self._threads

    @threads.setter
    def threads(self, n):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"threads must be a positive int, not {n!r}")
        check(lib.dsv4_layer_set_threads(self._layer.handle, n))
        self._threads = n

    def _apply(self, fn, *args, **kwargs):
        """Module conversions (.double(), .half(), .bfloat16(), .to(device), .cuda(), .share_memory())
        would replace the parameters, which are views of the C layer's float32 CPU memory: the C
        weights would then be rounded or left behind. They are refused; a conversion that keeps
        float32 on the CPU (.float(), .cpu(), .to(torch.float32)) changes nothing and is allowed."""
        probe = torch.zeros(1, dtype=torch.float32)
        moved = fn(probe)
        if moved is not probe or moved.data_ptr() != probe.data_ptr():
            raise TypeError(f"dsv4cp.Attention computes in float32 on the CPU: its parameters are views of the "
                            f"C library's weights and cannot become {moved.dtype} on {moved.device} "
                            f"(convert the inputs instead, or copy state_dict() into another module)")
        return self

    def set_recompute(self, on=True):
        """Saves fewer activations in the forward and recomputes them in the backward (bitwise the
        same results)."""
        check(lib.dsv4_layer_set_recompute(self._layer.handle, int(bool(on))))
        self.recompute = bool(on)
        self._live = None

    def __deepcopy__(self, memo):
        raise TypeError("dsv4cp.Attention owns C memory and cannot be copied: create another one and "
                        "load_state_dict(attn.state_dict())")

    def __getstate__(self):
        raise TypeError("dsv4cp.Attention cannot be pickled: save attn.state_dict() instead")

    # -- properties ---------------------------------------------------------------------------
    @property
    def rank(self):
        return 0 if self._mpi is None else self._mpi.Get_rank()

    @property
    def size(self):
        return 1 if self._mpi is None else self._mpi.Get_size()

    @property
    def weights_prefix(self):
        """"layers.L." or "" as the loaded file names the tensors (the CLI names gradients
        grad.<prefix><short name>)."""
        return lib.dsv4_weights_prefix(self._weights.handle).decode()

    def extra_repr(self):
        return (f"layer={self.layer}, compress_ratio={self.ratio}, role={self.role}, dim={self.dim}, ranks={self.size}, "
                f"split={self.split}")

    # -- weights -------------------------------------------------------------------------------
    def _rebind_views(self):
        """After the C memory was rewritten: parameters view it again (a rebound .data is dropped)."""
        for p, (_, view) in zip(self._params, self._views):
            if p.data_ptr() != view.data_ptr() or p.dtype != torch.float32:
                p.data = view

    def load_weights(self, path):
        """Loads the layer's tensors with the library's loader (the formats of `dsv4cp run
        --weights`). Collective under CP: every rank raises when one fails."""
        err = None
        try:
            check(lib.dsv4_weights_load(self._weights.handle, os.fsencode(path)))
        except DSV4Error as e:
            err = e
        _agree(self._mpi, err)
        self._rebind_views()

    def init_random(self, seed):
        """The library's seeded random weights (those of `dsv4cp run --seed S` without --weights)."""
        check(lib.dsv4_weights_init_random(self._weights.handle, int(seed)))
        self._rebind_views()

    def _sync_params(self):
        """Copies a parameter whose .data was rebound (not the C view any more) into the C buffer."""
        for p, (name, view) in zip(self._params, self._views):
            if p.data_ptr() == view.data_ptr() and p.dtype == torch.float32:
                continue
            if p.shape != view.shape:
                raise ValueError(f"parameter {name} has shape {list(p.shape)}, the layer needs {list(view.shape)}")
            if p.device.type != "cpu":
                raise TypeError(f"parameter {name} is on {p.device}; dsv4cp computes on the CPU")
            with torch.no_grad():
                view.copy_(p.data)

    # -- calls ---------------------------------------------------------------------------------
    def shard_rows(self, T, batch=None):
        """Global rows this rank holds of a stream of T tokens (or of `batch` sequences of T // batch)."""
        return shard_rows(T, self.rank, self.size, self.split, batch)

    def _meta(self, x, cu_seqlens, seqlens_real):
        """Validates one call's input on this rank; returns its _Meta (raises on bad input)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, not {type(x).__name__}")
        if x.device.type != "cpu":
            raise TypeError(f"x must be a CPU tensor, not on {x.device}")
        if x.dtype != torch.float32:
            raise TypeError(f"x must be float32, not {x.dtype}: the library computes in float32 and "
                            f"converts nothing silently (pass x.float() to compute in float32)")
        if x.dim() not in (2, 3):
            raise ValueError(f"x must be [n, d] or [B, S, d], has shape {list(x.shape)}")
        if x.shape[-1] != self.dim:
            raise ValueError(f"x has width {x.shape[-1]} but hidden_size is {self.dim}")
        cu = _int32_1d(cu_seqlens, "cu_seqlens")
        real = _int32_1d(seqlens_real, "seqlens_real")
        N = self.size
        if cu is not None and cu.numel() < 2:
            raise ValueError(f"cu_seqlens must have at least 2 entries, has {cu.numel()}")
        if x.dim() == 3:
            if cu is not None:
                raise ValueError("cu_seqlens given with a [B, S, d] input (use [T, d] for packed documents)")
            B, S_local = x.shape[0], x.shape[1]
            S = S_local * N
            cu = torch.arange(0, (B + 1) * S, S, dtype=torch.int64).to(torch.int32) if B > 0 else None
            T, batched = B * S, True
        else:
            if real is not None and cu is None:
                raise ValueError("seqlens_real given without cu_seqlens")
            T = int(cu[-1]) if cu is not None and cu.numel() else x.shape[0] * N
            batched = False
        n_docs = cu.numel() - 1 if cu is not None else 0
        if real is not None and real.numel() != n_docs:   # the library reads n_docs entries
            raise ValueError(f"seqlens_real must have one entry per document ({n_docs}), has {real.numel()}")
        n_local = x.shape[0] * (x.shape[1] if x.dim() == 3 else 1)
        if n_local == 0 or T <= 0 or T >= 2 ** 31:
            raise ValueError(f"x holds {n_local} rows of a stream of {T} tokens")
        if not bool(torch.isfinite(x).all()):   # as the CLI: one NaN would spread over its document
            bad = (~torch.isfinite(x.reshape(n_local, -1))).any(dim=1).nonzero()[0, 0].item()
            raise ValueError(f"x has a non-finite value at local row {bad}")
        meta = _Meta(T, cu, real, batched, n_local, tuple(x.shape))
        return meta

    def forward(self, x, cu_seqlens=None, seqlens_real=None, shared=None):
        with self._lock:
            return self._forward_locked(x, cu_seqlens, seqlens_real, shared)

    def _forward_locked(self, x, cu_seqlens, seqlens_real, shared):
        meta, err = None, None
        try:
            if shared is not None and not isinstance(shared, Shared):
                raise TypeError(f"shared must be a dsv4cp.Shared, not {type(shared).__name__}")
            meta = self._meta(x, cu_seqlens, seqlens_real)
            self._sync_params()
        except (ValueError, TypeError, DSV4Error) as e:
            err = e
        _agree(self._mpi, err)
        train = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self._params))
        xc = x.to(torch.float32).contiguous()   # no copy when already contiguous fp32
        if train:
            token_in = None
            if shared is not None and self._reader:
                token_in = shared.tokens.get(self.kv_source)   # absent: the library names the missing source
            out, topk, loss, token = _LayerFunction.apply(self, meta, shared, xc, token_in, *self._params)
            if shared is not None and self._full:
                shared.tokens[self.layer] = token
            elif shared is not None and self._reader:
                shared._pending.setdefault(self.kv_source, set()).add(self.layer)
        else:
            with torch.no_grad():
                out, topk, loss = self._forward_c(xc, meta, train=False, shared=shared)
        if not self.selects:
            return AttentionOutput(out, None, None)
        return AttentionOutput(out, topk, loss)

    def _forward_c(self, x, meta, train, shared=None, again=False):
        """again: the latest training forward once more (its backward consumed the saved state)."""
        if not again:
            self._generation += 1
            self._live = None
        sel = self.selects
        out = torch.empty(meta.x_shape, dtype=torch.float32)
        topk = torch.empty((meta.n_local, self.index_topk) if sel else (0,), dtype=torch.int32)
        loss = torch.zeros((), dtype=torch.float32)
        args = make(LayerFwdArgs, out=_ptr(out), topk_ids=_ptr(topk) if sel else None,
                    indexer_loss=_ptr(loss) if sel else None, x=_ptr(x), n=meta.n_local,
                    pk=ctypes.cast(ctypes.byref(meta.pk), ctypes.c_void_p), train=int(train),
                    shared=shared.handle if shared is not None else None)
        check(lib.dsv4_layer_forward(self._layer.handle, ctypes.byref(args)))
        if train and not again:
            self._live = self._generation
        return out, topk, loss

    def _backward_c(self, generation, meta, x, dout, dloss, shared=None):
        with self._lock:   # a forward on another thread must not replace the state between check and call
            return self._backward_locked(generation, meta, x, dout, dloss, shared)

    def _backward_locked(self, generation, meta, x, dout, dloss, shared):
        err = None
        again = self._spent == generation   # a second backward (retain_graph) of one forward
        if self._live != generation:
            err = RuntimeError("dsv4cp.Attention: this backward belongs to an earlier forward of the same "
                               "module; the layer keeps the activations of its latest training forward only "
                               "(run the forward again, or use one module per call)")
        elif again and shared is not None:
            err = RuntimeError("dsv4cp.Attention: a second backward of one forward (retain_graph) is not "
                               "supported for a layer of a V4.1 shared pass: run the pass's forward again")
        _agree(self._mpi, err)
        if again:
            # the library's backward consumes the forward's saved state (it keeps the weight products'
            # rows there): the same training forward again rebuilds it, bitwise
            self._forward_c(x, meta, train=True, again=True)
        n, d = meta.n_local, self.dim
        g = torch.zeros((n, d), dtype=torch.float32) if dout is None else dout.to(torch.float32).contiguous()
        d_loss = 0.0 if dloss is None else float(dloss)
        dx = torch.empty(meta.x_shape, dtype=torch.float32)
        w = ctypes.c_void_p()
        check(lib.dsv4_weights_create(ctypes.byref(w), self._cfg, self.layer))   # zeros: accumulated into
        grads = _Owned(w, lib.dsv4_weights_free)
        args = make(LayerBwdArgs, dx=_ptr(dx), grads=w, dout=_ptr(g), d_loss=d_loss)
        check(lib.dsv4_layer_backward(self._layer.handle, ctypes.byref(args)))
        self._spent = generation
        return dx, [_float_view(grads, ptr, numel, shape) for _, ptr, shape, numel in _weights_tensors(grads)]


# ---- module-level functions ------------------------------------------------------------------------

def allreduce_grads(attn):
    """Kept for scripts written before the exact gradient sums: the backward already gives every
    rank the weight gradients summed over the CP group (the same bits for every CP degree), so this
    does nothing (summing again would count each rank's share N times)."""
    if not isinstance(attn, Attention):
        raise TypeError("allreduce_grads: expected a dsv4cp.Attention")


def shard_rows(T, rank, size, split="contiguous", batch=None):
    """The global rows (int64 tensor) that `rank` of `size` holds of a stream of T tokens, or, with
    batch=B, of B sequences of T // B tokens (flattened index b * S + s): the library's rule
    (dsv4_cp_shard_rows, SPEC 5)."""
    if split not in SPLITS:
        raise ValueError(f"split must be 'contiguous' or 'zigzag', not {split!r}")
    cu = None
    if batch:
        if T % batch:
            raise ValueError(f"T = {T} is not {batch} sequences of equal length")
        cu = torch.arange(0, T + 1, T // batch, dtype=torch.int32)
    pk = make(Packing, cu_seqlens=_ptr(cu), seqlens_real=None, n_docs=batch or 0, T=T, batched=int(bool(batch)))
    cp = make(CPConfig, split=SPLITS[split], overlap=1)
    n = ctypes.c_int64()
    check(lib.dsv4_cp_shard_rows(ctypes.byref(pk), ctypes.byref(cp), rank, size, None, ctypes.byref(n)))
    rows = torch.empty(n.value, dtype=torch.int64)
    check(lib.dsv4_cp_shard_rows(ctypes.byref(pk), ctypes.byref(cp), rank, size,
                                 ctypes.cast(rows.data_ptr(), ctypes.POINTER(ctypes.c_int64)), ctypes.byref(n)))
    return rows


def version():
    """Version of the loaded libdsv4cp ("MAJOR.MINOR.PATCH")."""
    return lib.dsv4_version().decode()


def _free_mpi_at_exit():
    """Frees every live CP layer, then its communicator, while MPI is still initialised (mpi4py
    finalises MPI at exit; the layer's CP state waits on the communicator when freed)."""
    for layer in list(_live_cp):
        layer.release()
        layer.cp_comm.release()
