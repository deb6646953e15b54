"""flexgen.py -- FlexAttention-style attention for PyTorch tensors, through libflexgen.

The library does the real work: it parses and checks the mod text, builds the
block mask with a generated GPU kernel, compiles the attention kernel with
NVRTC and caches it. This module only translates: torch tensors become device
pointers, strides and a dtype; a dict of parameters becomes an array of
fg_binding; torch's current stream becomes the CUstream of the launch; a
failing fg_status becomes a FlexgenError carrying the library's message and
its caret diagnostic. It is plain ctypes over the shared library, so there is
no build step beyond the library's own.

Three caches keep repeated calls cheap, because a training or serving loop
calls attention() with the same mods thousands of times:
  - mods are parsed once per text (and, for files, per content);
  - block masks are kept per (mod, shape, block size, scalar values, and the
    identity and version counter of every buffer): a document-id tensor
    written in place bumps its _version, so the mask is rebuilt, and a new
    tensor with new ids is a new key;
  - kernels are cached by the library itself (memory, then disk).

attention() is differentiable: when grad is enabled and q, k, v or a float
buffer requires grad, the forward also writes the log-sum-exp, and the
backward runs fg_attention_backward on torch's current stream
(_AttentionFunction). Which float buffers have a gradient is the library's
to say: one it refuses (score_mod's value does not depend on it) gets
zeros, and the refusal is remembered per mod (_run_backward). Without
grad nothing changes: no lse is allocated and no autograd node is made.

Checks that need no library call (types, ranks, dtypes, shapes, GQA ratios,
strides, devices, parameter names and types) run first, in that order, in
Python, so their messages name the Python argument and they work on a
machine without a GPU. The library checks everything again.

context_parallel_attention() runs one sequence over the GPUs of a
torch.distributed NCCL group, one process per GPU, each holding a shard of
the rows (shard_rows, shard, unshard); see the section "Context
parallelism" at the end for how the NCCL communicator is found.

The library is found through $FLEXGEN_LIB (a path to libflexgen.so), else
beside this module (where `pip install .` puts it), else a build folder
beside this file in a checkout (../build*/src/libflexgen.so, newest first),
else the system loader.
"""

import ctypes
import glob
import os
import re
import itertools
import threading
import types
import weakref
from collections import OrderedDict
from typing import List, Optional, Tuple

try:  # the mod-level API (parsing, CPU block masks) works without torch
    import torch
except ImportError:  # pragma: no cover - exercised on machines without torch
    torch = None

__all__ = [
    "FlexgenError", "LibraryNotFound", "Mod", "BlockMask", "Prepared", "attention", "prepare",
    "block_mask",
    "load_mod", "reference", "reference_backward", "cache_stats", "reset_cache_stats",
    "forget_memory_cache", "set_cache_dir", "cache_dir", "set_approx_math", "library_path", "version",
    "generate_source", "compile_kernel",
    "shard_rows", "shard", "unshard", "context_parallel_attention", "context_parallel_plan",
    "ContextParallelPlan",
]

# ---------------------------------------------------------------------------
# The C ABI (include/flexgen.h), mirrored field for field.
# ---------------------------------------------------------------------------

FG_OK = 0
FG_ERR_UNBOUND = 18
FG_PARAM_SCALAR, FG_PARAM_BUFFER = 1, 2
FG_TYPE_BOOL, FG_TYPE_INT, FG_TYPE_FLOAT = 1, 2, 3
FG_MASK_MOD, FG_SCORE_MOD = 1, 2
FG_BF16, FG_FP16 = 1, 2
FG_KERNEL_ATTENTION_FWD = 1
FG_KERNEL_BLOCK_MASK = 2
FG_KERNEL_ATTENTION_FWD_SM90 = 3
FG_KERNEL_ATTENTION_BWD = 4
FG_KERNEL_ATTENTION_BWD_SM90 = 5
FG_KERNEL_ATTENTION_DECODE = 6
FG_OPT_DEVICE, FG_OPT_ARCH, FG_OPT_CACHE_DIR, FG_OPT_DISK_CACHE = 1, 2, 3, 4
FG_OPT_APPROX_MATH = 11
FG_OPT_DECODE_SPLITS = 13
FG_CP_CONTIGUOUS, FG_CP_ZIGZAG = 1, 2
FG_BM_ARRAYS = {
    "kv_num_blocks": 1, "kv_indices": 2, "full_kv_num_blocks": 3, "full_kv_indices": 4,
    "q_num_blocks": 5, "q_indices": 6, "full_q_num_blocks": 7, "full_q_indices": 8,
}


class _BufferValue(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("length", ctypes.c_int64)]


class _BindingValue(ctypes.Union):
    _fields_ = [("i", ctypes.c_int32), ("f", ctypes.c_float), ("buffer", _BufferValue)]


class _Binding(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int),
                ("value", _BindingValue), ("type", ctypes.c_int)]


class _ParamInfo(ctypes.Structure):  # also the layout of fg_param_decl
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int),
                ("type", ctypes.c_int), ("default_value", ctypes.c_double)]


class _Growable(ctypes.Structure):
    """A public argument struct that may grow (flexgen.h, Conventions): its
    last field, struct_size, tells the library which layout this mirror has,
    so a library newer than the mirror reads its later fields as defaults."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.struct_size = ctypes.sizeof(type(self))


class _BlockMaskDesc(_Growable):
    _fields_ = [("batch", ctypes.c_int), ("heads", ctypes.c_int), ("q_len", ctypes.c_int),
                ("kv_len", ctypes.c_int), ("q_block", ctypes.c_int), ("kv_block", ctypes.c_int),
                ("struct_size", ctypes.c_size_t),
                ("q_offset", ctypes.c_int), ("kv_offset", ctypes.c_int)]


class _CacheStats(ctypes.Structure):
    _fields_ = [("memory_hits", ctypes.c_uint64), ("disk_hits", ctypes.c_uint64),
                ("misses", ctypes.c_uint64), ("disk_rejects", ctypes.c_uint64),
                ("compile_ms", ctypes.c_double), ("load_ms", ctypes.c_double)]


class _KernelConfig(_Growable):
    _fields_ = [("kind", ctypes.c_int), ("dtype", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("q_block", ctypes.c_int), ("kv_block", ctypes.c_int), ("arch", ctypes.c_char_p),
                ("struct_size", ctypes.c_size_t)]


_Stride = ctypes.c_int64 * 4


class _AttentionArgs(_Growable):
    _fields_ = [
        ("batch", ctypes.c_int), ("heads_q", ctypes.c_int), ("heads_kv", ctypes.c_int),
        ("q_len", ctypes.c_int), ("kv_len", ctypes.c_int), ("head_dim", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
        ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p),
        ("q_stride", _Stride), ("k_stride", _Stride), ("v_stride", _Stride),
        ("out_stride", _Stride),
        ("scale", ctypes.c_float), ("q_offset", ctypes.c_int), ("kv_offset", ctypes.c_int),
        ("block_mask", ctypes.c_void_p),
        ("binds", ctypes.POINTER(_Binding)), ("nbinds", ctypes.c_size_t),
        ("stream", ctypes.c_void_p),
        ("struct_size", ctypes.c_size_t),
        ("kv_lens", ctypes.c_void_p), ("q_offsets", ctypes.c_void_p), ("block_table", ctypes.c_void_p),
        ("page_size", ctypes.c_int), ("num_pages", ctypes.c_int), ("max_pages", ctypes.c_int),
        ("workspace", ctypes.c_void_p), ("workspace_size", ctypes.c_size_t),
    ]


class _MergeArgs(_Growable):
    _fields_ = [
        ("batch", ctypes.c_int), ("heads", ctypes.c_int), ("q_len", ctypes.c_int),
        ("head_dim", ctypes.c_int), ("dtype", ctypes.c_int), ("nparts", ctypes.c_int),
        ("outs", ctypes.c_void_p * 16), ("lses", ctypes.c_void_p * 16),
        ("part_stride", _Stride), ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p),
        ("out_stride", _Stride), ("stream", ctypes.c_void_p),
        ("struct_size", ctypes.c_size_t),
    ]


class _AttentionBwdArgs(_Growable):
    _fields_ = [
        ("fwd", ctypes.POINTER(_AttentionArgs)),
        ("dout", ctypes.c_void_p),
        ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p), ("dv", ctypes.c_void_p),
        ("dout_stride", _Stride), ("dq_stride", _Stride), ("dk_stride", _Stride),
        ("dv_stride", _Stride),
        ("grad_binds", ctypes.POINTER(_Binding)), ("ngrad_binds", ctypes.c_size_t),
        ("deterministic", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("workspace", ctypes.c_void_p), ("workspace_size", ctypes.c_size_t),
        ("dlse", ctypes.c_void_p),
    ]


class _CpArgs(_Growable):  # fg_cp_args
    _fields_ = [
        ("local", ctypes.POINTER(_AttentionArgs)),
        ("comm", ctypes.c_void_p),  # ncclComm_t
        ("global_len", ctypes.c_int64),
        ("layout", ctypes.c_int),
        ("plan", ctypes.c_void_p),  # const fg_cp_plan *: None, the call builds its schedule
        ("struct_size", ctypes.c_size_t),
    ]


class _CpBwdArgs(_Growable):  # fg_cp_bwd_args
    _fields_ = [
        ("local", ctypes.POINTER(_AttentionBwdArgs)),
        ("comm", ctypes.c_void_p),  # ncclComm_t
        ("global_len", ctypes.c_int64),
        ("layout", ctypes.c_int),
        ("plan", ctypes.c_void_p),  # const fg_cp_plan *: None, the call builds its schedule
        ("grads_summed", ctypes.c_int),  # 0: each rank the gradient of its copy of a buffer
        ("struct_size", ctypes.c_size_t),
    ]


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES = {
    # name: (restype, argtypes)
    "fg_version_string": (ctypes.c_char_p, []),
    "fg_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "fg_free": (None, [_P]),
    "fg_generate_source": (ctypes.c_int, [_P, _P, ctypes.POINTER(_KernelConfig),
                                          ctypes.POINTER(ctypes.c_char_p)]),
    "fg_compile": (ctypes.c_int, [_P, _P, ctypes.POINTER(_KernelConfig), ctypes.c_int,
                                  ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]),
    "fg_ctx_create": (ctypes.c_int, [_PP]),
    "fg_ctx_destroy": (None, [_P]),
    "fg_errmsg": (ctypes.c_char_p, [_P]),
    "fg_error_offset": (ctypes.c_int64, [_P]),
    "fg_error_diagnostic": (ctypes.c_char_p, [_P]),
    "fg_compile_log": (ctypes.c_char_p, [_P]),
    "fg_ctx_set_int": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int64]),
    "fg_ctx_set_string": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_char_p]),
    "fg_ctx_get_string": (ctypes.c_int, [_P, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
    "fg_mod_from_file": (ctypes.c_int, [_P, ctypes.c_char_p, _PP]),
    "fg_mod_from_source": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, _PP]),
    "fg_mod_from_expr": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_char_p,
                                        ctypes.POINTER(_ParamInfo), ctypes.c_size_t, _PP]),
    "fg_mod_combine": (ctypes.c_int, [_P, _P, _P, _PP]),
    "fg_mod_destroy": (None, [_P]),
    "fg_mod_has_mask": (ctypes.c_int, [_P]),
    "fg_mod_has_score": (ctypes.c_int, [_P]),
    "fg_mod_name": (ctypes.c_char_p, [_P]),
    "fg_mod_canonical": (ctypes.c_char_p, [_P]),
    "fg_mod_hash": (ctypes.c_uint64, [_P]),
    "fg_mod_param_count": (ctypes.c_size_t, [_P]),
    "fg_mod_param": (ctypes.c_int, [_P, ctypes.c_size_t, ctypes.POINTER(_ParamInfo)]),
    "fg_mod_eval_mask": (ctypes.c_int, [_P, _P, ctypes.POINTER(_Binding), ctypes.c_size_t,
                                        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                        ctypes.c_int, ctypes.c_int, ctypes.c_void_p]),
    "fg_mod_eval_score": (ctypes.c_int, [_P, _P, ctypes.POINTER(_Binding), ctypes.c_size_t,
                                         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                         ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                         ctypes.c_void_p]),
    "fg_block_mask_create": (ctypes.c_int, [_P, _P, ctypes.POINTER(_BlockMaskDesc),
                                            ctypes.POINTER(_Binding), ctypes.c_size_t, _PP]),
    "fg_block_mask_create_gpu": (ctypes.c_int, [_P, _P, ctypes.POINTER(_BlockMaskDesc),
                                                ctypes.POINTER(_Binding), ctypes.c_size_t, _P, _PP]),
    "fg_block_mask_rebuild_gpu": (ctypes.c_int, [_P, _P, _P, ctypes.POINTER(_Binding),
                                                 ctypes.c_size_t, _P]),
    "fg_block_mask_destroy": (None, [_P]),
    "fg_block_mask_download": (ctypes.c_int, [_P, _P]),
    "fg_block_mask_array_get": (ctypes.c_int, [_P, ctypes.c_int,
                                               ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)),
                                               ctypes.POINTER(ctypes.c_uint64),
                                               ctypes.POINTER(ctypes.c_int64)]),
    "fg_block_mask_sparsity": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_double)]),
    "fg_block_mask_picture": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int,
                                             ctypes.POINTER(ctypes.c_void_p)]),
    "fg_attention_forward": (ctypes.c_int, [_P, _P, ctypes.POINTER(_AttentionArgs)]),
    "fg_kernel_get": (ctypes.c_int, [_P, _P, ctypes.POINTER(_KernelConfig), _PP]),
    "fg_kernel_launch": (ctypes.c_int, [_P, _P, ctypes.POINTER(_AttentionArgs)]),
    "fg_attention_kernel_for": (ctypes.c_int, [_P, _P, ctypes.POINTER(_AttentionArgs), _PP]),
    "fg_kernel_kind_of": (ctypes.c_int, [_P]),
    "fg_attention_merge": (ctypes.c_int, [_P, ctypes.POINTER(_MergeArgs)]),
    "fg_kernel_release": (None, [_P]),
    "fg_attention_reference": (ctypes.c_int, [_P, _P, ctypes.POINTER(_AttentionArgs),
                                              ctypes.c_void_p, ctypes.c_void_p]),
    "fg_attention_backward": (ctypes.c_int, [_P, _P, ctypes.POINTER(_AttentionBwdArgs)]),
    "fg_kernel_launch_backward": (ctypes.c_int, [_P, _P, ctypes.POINTER(_AttentionBwdArgs)]),
    "fg_attention_backward_workspace_size": (ctypes.c_int, [_P, _P, ctypes.POINTER(_AttentionBwdArgs),
                                                            ctypes.POINTER(ctypes.c_size_t)]),
    "fg_attention_reference_backward": (ctypes.c_int, [_P, _P,
                                                       ctypes.POINTER(_AttentionBwdArgs)]),
    "fg_cache_get_stats": (None, [ctypes.POINTER(_CacheStats)]),
    "fg_cache_reset_stats": (None, []),
    "fg_cache_forget_memory": (None, []),
    "fg_cache_clear": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "fg_cp_shard_rows": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                        ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                                        ctypes.POINTER(ctypes.c_int)]),
    "fg_attention_forward_cp": (ctypes.c_int, [_P, _P, ctypes.POINTER(_CpArgs)]),
    "fg_attention_backward_cp": (ctypes.c_int, [_P, _P, ctypes.POINTER(_CpBwdArgs)]),
    "fg_cp_plan_create": (ctypes.c_int, [_P, _P, ctypes.POINTER(_CpArgs), ctypes.POINTER(_P)]),
    "fg_cp_plan_destroy": (None, [_P]),
}
# Functions a library built before the backward pass (or before context
# parallelism) lacks: every other call works without them, and the calls
# that need them say what is missing.
_OPTIONAL = {"fg_attention_backward", "fg_kernel_launch_backward",
             "fg_attention_backward_workspace_size", "fg_attention_reference_backward",
             "fg_cp_shard_rows", "fg_attention_forward_cp", "fg_attention_backward_cp",
             "fg_cp_plan_create", "fg_cp_plan_destroy"}


class LibraryNotFound(OSError):
    """libflexgen.so could not be located or loaded."""


class FlexgenError(RuntimeError):
    """A failing fg_status: `status` (int), `status_name`, `message`, `offset`
    (byte offset into the mod text, -1 when none), `diagnostic` (the rendered
    file:line:col + source line + caret) and `compile_log` (NVRTC's log, or "")."""

    def __init__(self, status, status_name, message, offset=-1, diagnostic="", compile_log=""):
        self.status = status
        self.status_name = status_name
        self.message = message
        self.offset = offset
        self.diagnostic = diagnostic
        self.compile_log = compile_log
        super().__init__(self._text())

    def _text(self):
        text = f"{self.status_name}: {self.message}"
        if self.diagnostic and self.offset >= 0:
            text += "\n" + self.diagnostic.rstrip("\n")
        if self.compile_log:
            text += "\n" + self.compile_log.rstrip("\n")
        return text


# ---------------------------------------------------------------------------
# Loading the library and the per-device contexts.
# ---------------------------------------------------------------------------

_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def _candidate_paths():
    env = os.environ.get("FLEXGEN_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    packaged = os.path.join(here, "libflexgen.so")
    found = glob.glob(os.path.join(here, "..", "build*", "src", "libflexgen.so"))
    found.sort(key=lambda p: os.path.getmtime(p), reverse=True)
    return ([packaged] if os.path.exists(packaged) else []) + found + ["libflexgen.so", "libflexgen.so.0"]


def _load():
    global _lib, _lib_path
    with _lib_lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidate_paths():
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name, None)
                if fn is None and name in _OPTIONAL:
                    continue
                if fn is None:
                    fn = getattr(lib, name)  # the loader's own error names the symbol
                fn.restype = res
                fn.argtypes = args
            _lib, _lib_path = lib, path
            return lib
        raise LibraryNotFound("libflexgen not found; set FLEXGEN_LIB to the path of "
                              "libflexgen.so (tried: " + "; ".join(errors) + ")")


def _function(name, feature="the backward pass"):
    """A library function that older builds lack (_OPTIONAL), or a clear error."""
    fn = getattr(_load(), name, None)
    if fn is None:
        raise NotImplementedError(f"{_lib_path} has no {name}: it was built before "
                                  f"{feature}; rebuild libflexgen")
    return fn


def library_path():
    """The path of the loaded libflexgen (loading it if needed)."""
    _load()
    return _lib_path


def version():
    return _load().fg_version_string().decode()


def _status_name(status):
    s = _load().fg_status_string(status)
    return s.decode().split(":")[0] if s else f"status {status}"


class _Context:
    """One fg_ctx (contexts are not thread-safe: every use holds the lock, and
    the error is read under the same lock as the failing call)."""

    def __init__(self, device):
        lib = _load()
        handle = ctypes.c_void_p()
        st = lib.fg_ctx_create(ctypes.byref(handle))
        if st != FG_OK:
            raise FlexgenError(st, _status_name(st), "could not create a context")
        self.handle = handle
        self.lock = threading.RLock()
        self.device = device
        self._lib = lib
        if device is not None:
            self.check(lib.fg_ctx_set_int(handle, FG_OPT_DEVICE, device))
        if _cache_dir_override is not None:
            self.check(lib.fg_ctx_set_string(handle, FG_OPT_CACHE_DIR,
                                             _cache_dir_override.encode()))
        if _approx_math_override is not None:
            self.check(lib.fg_ctx_set_int(handle, FG_OPT_APPROX_MATH, int(_approx_math_override)))

    def check(self, status):
        if status == FG_OK:
            return
        lib = self._lib
        raise FlexgenError(status, _status_name(status),
                           (lib.fg_errmsg(self.handle) or b"").decode(errors="replace"),
                           int(lib.fg_error_offset(self.handle)),
                           (lib.fg_error_diagnostic(self.handle) or b"").decode(errors="replace"),
                           (lib.fg_compile_log(self.handle) or b"").decode(errors="replace"))

    def __del__(self):
        try:
            self._lib.fg_ctx_destroy(self.handle)
        except Exception:
            pass


_contexts = {}
_contexts_lock = threading.Lock()
_cache_dir_override = None
_approx_math_override = None  # set_approx_math(); None: $FLEXGEN_APPROX_MATH


def _ctx(device=None):
    """The context for a CUDA device ordinal (None: one for host-only work)."""
    with _contexts_lock:
        c = _contexts.get(device)
        if c is None:
            c = _contexts[device] = _Context(device)
        return c


# ---------------------------------------------------------------------------
# Mods.
# ---------------------------------------------------------------------------

_TYPE_NAMES = {FG_TYPE_INT: "int", FG_TYPE_FLOAT: "float", FG_TYPE_BOOL: "bool"}


class Mod:
    """A checked mod (immutable). `name`, `canonical`, `hash`, `has_mask`,
    `has_score`, and `params`: name -> (kind, type, default) with kind
    'scalar' or 'buffer' and type 'int' or 'float'."""

    def __init__(self, handle, keep=()):
        lib = _load()
        self._lib = lib
        self.handle = handle
        self._keep = keep  # the mods it was combined from live as long as it
        self.name = lib.fg_mod_name(handle).decode()
        self.canonical = (lib.fg_mod_canonical(handle) or b"").decode()
        self.hash = int(lib.fg_mod_hash(handle))
        self.has_mask = bool(lib.fg_mod_has_mask(handle))
        self.has_score = bool(lib.fg_mod_has_score(handle))
        # Float buffers the backward refused (FG_ERR_UNBOUND): score_mod's
        # value does not depend on them, their gradient is zero.
        self._no_gradient = set()
        self.params = OrderedDict()
        for i in range(lib.fg_mod_param_count(handle)):
            info = _ParamInfo()
            if lib.fg_mod_param(handle, i, ctypes.byref(info)) != FG_OK:
                raise FlexgenError(1, "FG_ERR_INVALID_ARGUMENT", f"parameter {i} unreadable")
            kind = "buffer" if info.kind == FG_PARAM_BUFFER else "scalar"
            self.params[info.name.decode()] = (kind, _TYPE_NAMES.get(info.type, "?"),
                                               info.default_value)

    _MASK_BODY = re.compile(r"^bool \w+\(int b, int h, int q_idx, int kv_idx\) \{\n(.*?)^\}",
                            re.S | re.M)

    def mask_uses(self, arg):
        """Whether a mask_mod body of the canonical text reads the index
        argument `arg` ('b' or 'h'); True when unsure, so a block mask is
        never broadcast over a dimension the mask reads."""
        bodies = self._MASK_BODY.findall(self.canonical or "")
        if not bodies:
            return True
        word = re.compile(r"\b" + re.escape(arg) + r"\b")
        return any(word.search(body) for body in bodies)

    def __repr__(self):
        parts = [p for p, f in (("mask_mod", self.has_mask), ("score_mod", self.has_score)) if f]
        return f"<flexgen.Mod {self.name!r} {'+'.join(parts) or 'empty'} params={list(self.params)}>"

    def __del__(self):
        try:
            self._lib.fg_mod_destroy(self.handle)
        except Exception:
            pass

    # CPU evaluation (no GPU): the evaluator the CPU block mask and the
    # reference use. Buffers are host tensors or sequences.
    def eval_mask(self, q_len, kv_len, b=0, h=0, params=None, buffers=None, q0=0, kv0=0):
        """The dense mask over [q0, q0+q_len) x [kv0, kv0+kv_len) for (b, h), as a
        list of rows of 0/1."""
        binds = _Bindings(self, params, buffers, host=True)
        out = (ctypes.c_uint8 * (q_len * kv_len))()
        c = _ctx(None)
        with c.lock:
            c.check(self._lib.fg_mod_eval_mask(c.handle, self.handle, binds.array, binds.count,
                                               b, h, q0, q_len, kv0, kv_len, out))
        return [list(out[i * kv_len:(i + 1) * kv_len]) for i in range(q_len)]

    def eval_score(self, scores, b=0, h=0, params=None, buffers=None, q0=0, kv0=0):
        """score_mod over a q_len x kv_len list of rows of input scores."""
        q_len = len(scores)
        kv_len = len(scores[0]) if q_len else 0
        flat = (ctypes.c_float * (q_len * kv_len))(*[x for row in scores for x in row])
        out = (ctypes.c_float * (q_len * kv_len))()
        binds = _Bindings(self, params, buffers, host=True)
        c = _ctx(None)
        with c.lock:
            c.check(self._lib.fg_mod_eval_score(c.handle, self.handle, binds.array, binds.count,
                                                b, h, q0, q_len, kv0, kv_len, flat, out))
        return [list(out[i * kv_len:(i + 1) * kv_len]) for i in range(q_len)]


_MOD_CACHE_MAX = 256
_mod_cache = OrderedDict()
_mod_lock = threading.Lock()
_FUNC_RE = re.compile(r"\b(mask_mod|score_mod)\s*\(")


def _classify(text):
    """'file', 'source' or 'expr' for a mask_mod / score_mod argument."""
    if "\n" not in text and len(text) < 4096 and os.path.isfile(text):
        return "file"
    if _FUNC_RE.search(text):
        return "source"
    if text.endswith((".c", ".h", ".mod")) and "(" not in text:
        raise FileNotFoundError(f"mod file not found: {text}")
    return "expr"


def _cached(key, make):
    with _mod_lock:
        m = _mod_cache.get(key)
        if m is not None:
            _mod_cache.move_to_end(key)
            return m
    m = make()
    with _mod_lock:
        _mod_cache[key] = m
        while len(_mod_cache) > _MOD_CACHE_MAX:
            _mod_cache.popitem(last=False)
    return m


def _parse_one(text, kind, decls):
    lib = _load()
    form = _classify(text)
    if form == "file":
        path = os.path.abspath(text)
        with open(path, "rb") as f:
            content = f.read()
        key = ("file", path, content)

        def make():
            c, h = _ctx(None), ctypes.c_void_p()
            with c.lock:
                c.check(lib.fg_mod_from_file(c.handle, path.encode(), ctypes.byref(h)))
            return Mod(h)
        return _cached(key, make)
    if form == "source":
        key = ("source", text)

        def make():
            c, h = _ctx(None), ctypes.c_void_p()
            data = text.encode()
            with c.lock:
                c.check(lib.fg_mod_from_source(c.handle, b"<source>", data, len(data),
                                               ctypes.byref(h)))
            return Mod(h)
        return _cached(key, make)
    key = ("expr", kind, text, tuple(decls))

    def make():
        c, h = _ctx(None), ctypes.c_void_p()
        arr = (_ParamInfo * max(1, len(decls)))()
        names = []
        for i, (name, pkind, ptype, default) in enumerate(decls):
            names.append(name.encode())
            arr[i] = _ParamInfo(names[-1], pkind, ptype, default)
        with c.lock:
            c.check(lib.fg_mod_from_expr(c.handle, kind, text.encode(), arr, len(decls),
                                         ctypes.byref(h)))
        return Mod(h)
    return _cached(key, make)


def _expr_decls(params, buffers):
    """Parameter declarations for the expression form, from the values given."""
    decls = []
    for name, value in sorted((params or {}).items()):
        t = FG_TYPE_FLOAT if isinstance(value, float) else FG_TYPE_INT
        decls.append((name, FG_PARAM_SCALAR, t, float(value)))
    for name, buf in sorted((buffers or {}).items()):
        t = FG_TYPE_FLOAT if _is_float_buffer(buf) else FG_TYPE_INT
        decls.append((name, FG_PARAM_BUFFER, t, 0.0))
    return decls


def _is_float_buffer(buf):
    if torch is not None and isinstance(buf, torch.Tensor):
        return buf.dtype == torch.float32
    return any(isinstance(x, float) for x in buf)


def load_mod(mask_mod=None, score_mod=None, params=None, buffers=None):
    """The Mod for a mask_mod and/or score_mod given as a file path, the text
    of a mod file, or a bare expression (its parameters declared from the
    types of `params` / `buffers`). With one argument, the whole mod it names
    is used (a file may define both functions); with two, the mask_mod of the
    first and the score_mod of the second are combined."""
    if mask_mod is None and score_mod is None:
        return _parse_one("score", FG_SCORE_MOD, [])
    for argname, value in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        if value is not None and not isinstance(value, (str, os.PathLike, Mod)):
            raise TypeError(f"{argname} must be a path, mod text or flexgen.Mod, "
                            f"not {type(value).__name__}")
    decls = _expr_decls(params, buffers)

    def one(value, kind):
        return value if isinstance(value, Mod) else _parse_one(os.fspath(value), kind, decls)

    mm = one(mask_mod, FG_MASK_MOD) if mask_mod is not None else None
    sm = one(score_mod, FG_SCORE_MOD) if score_mod is not None else None
    if mm is None or sm is None or mm is sm:
        return mm or sm  # one mod: all of it (a file may define both functions)
    if not mm.has_mask:
        raise ValueError(f"mask_mod: mod '{mm.name}' defines no mask_mod")
    if not sm.has_score:
        raise ValueError(f"score_mod: mod '{sm.name}' defines no score_mod")
    key = ("combine", mm.hash, mm.canonical, sm.hash, sm.canonical, id(mm), id(sm))

    def make():
        c, h = _ctx(None), ctypes.c_void_p()
        with c.lock:
            c.check(_load().fg_mod_combine(c.handle, mm.handle, sm.handle, ctypes.byref(h)))
        return Mod(h, keep=(mm, sm))
    return _cached(key, make)


# ---------------------------------------------------------------------------
# Bindings: params and buffers checked against the mod's declarations.
# ---------------------------------------------------------------------------

class _Bindings:
    """An fg_binding array (and the bytes objects and tensors it points to,
    kept alive as long as it)."""

    def __init__(self, mod, params, buffers, host=False, device=None):
        params = dict(params or {})
        buffers = dict(buffers or {})
        rows, self._keep = [], []
        for name, value in params.items():
            rows.append(self._scalar(mod, name, value))
        for name, buf in buffers.items():
            rows.append(self._buffer(mod, name, buf, host, device))
        for name, (kind, _, _) in mod.params.items():
            if kind == "buffer" and name not in buffers:
                raise ValueError(f"mod '{mod.name}' needs buffer '{name}': pass it in buffers=")
        self.count = len(rows)
        self.array = (_Binding * max(1, len(rows)))(*rows)
        self.key = (tuple(sorted((n, repr(v)) for n, v in params.items())),
                    tuple(sorted((n, id(b), _version(b), _data_ptr(b), _numel(b))
                                 for n, b in buffers.items())))
        self.buffers = buffers

    def _decl(self, mod, name, want):
        if not isinstance(name, str):
            raise TypeError(f"parameter names must be str, not {type(name).__name__}")
        if name not in mod.params:
            raise ValueError(f"mod '{mod.name}' has no parameter '{name}' "
                             f"(it has: {', '.join(mod.params) or 'none'})")
        kind, ptype, _ = mod.params[name]
        if kind != want:
            raise TypeError(f"parameter '{name}' of mod '{mod.name}' is a {kind}: pass it in "
                            f"{'buffers' if kind == 'buffer' else 'params'}=")
        return ptype

    def _scalar(self, mod, name, value):
        ptype = self._decl(mod, name, "scalar")
        if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"parameter '{name}' must be an int or float, not {type(value).__name__}")
        nb = name.encode()
        self._keep.append(nb)
        b = _Binding()
        b.name, b.kind = nb, FG_PARAM_SCALAR
        if ptype == "int":
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError(f"parameter '{name}' is an int; got {value}")
                value = int(value)
            if not -2**31 <= value < 2**31:
                raise ValueError(f"parameter '{name}' = {value} does not fit in int32")
            b.type, b.value.i = FG_TYPE_INT, value
        else:
            b.type, b.value.f = FG_TYPE_FLOAT, float(value)
        return b

    def _buffer(self, mod, name, buf, host, device):
        ptype = self._decl(mod, name, "buffer")
        nb = name.encode()
        b = _Binding()
        b.name, b.kind = nb, FG_PARAM_BUFFER
        b.type = FG_TYPE_INT if ptype == "int" else FG_TYPE_FLOAT
        if torch is not None and isinstance(buf, torch.Tensor):
            want = torch.int32 if ptype == "int" else torch.float32
            if buf.dtype != want:
                raise TypeError(f"buffer '{name}' must be a {want} tensor, not {buf.dtype}")
            if not buf.is_contiguous():
                raise ValueError(f"buffer '{name}' must be contiguous")
            if host and buf.device.type != "cpu":
                raise ValueError(f"buffer '{name}' must be a CPU tensor for a CPU call")
            if not host and (buf.device.type != "cuda" or buf.device.index != device):
                raise ValueError(f"buffer '{name}' must be on cuda:{device}, not {buf.device}")
            b.value.buffer.data = buf.data_ptr() if buf.numel() else None
            b.value.buffer.length = buf.numel()
            self._keep.append(buf)
        elif host and isinstance(buf, (list, tuple)):
            ctype = ctypes.c_int32 if ptype == "int" else ctypes.c_float
            arr = (ctype * max(1, len(buf)))(*buf)
            b.value.buffer.data = ctypes.addressof(arr)
            b.value.buffer.length = len(buf)
            self._keep.append(arr)
        else:
            raise TypeError(f"buffer '{name}' must be a torch tensor"
                            + (" or a list" if host else "") + f", not {type(buf).__name__}")
        self._keep.append(nb)
        return b


def _version(t):
    return getattr(t, "_version", None)


def _data_ptr(t):
    return t.data_ptr() if torch is not None and isinstance(t, torch.Tensor) else id(t)


def _numel(t):
    return t.numel() if torch is not None and isinstance(t, torch.Tensor) else len(t)


# ---------------------------------------------------------------------------
# Block masks.
# ---------------------------------------------------------------------------

# Every BlockMask by a number of its own, which the custom op's schema can
# carry (see _compiled_attention); weak, so the registry keeps none alive.
_block_mask_ids = itertools.count()
_block_masks = weakref.WeakValueDictionary()


class BlockMask:
    """An fg_block_mask (FlexAttention's BlockMask layout). Built on the GPU
    (device arrays) or the CPU (host arrays). `shape` is (batch, heads,
    q_len, kv_len) with 1 meaning broadcast; `block_size` is (q, kv)."""

    def __init__(self, handle, mod, shape, block_size, device):
        self.handle = handle
        self._op_id = next(_block_mask_ids)  # how the custom op names it
        _block_masks[self._op_id] = self
        self.mod = mod
        self.shape = shape
        self.block_size = block_size
        self.device = device  # CUDA ordinal, or None for a CPU mask
        self._lib = _load()
        self._downloaded = device is None
        self._sparsity = None

    def _host(self):
        if not self._downloaded:
            c = _ctx(self.device)
            with c.lock:
                c.check(self._lib.fg_block_mask_download(c.handle, self.handle))
            self._downloaded = True

    def sparsity(self):
        """Fraction of (b, h, q block, kv block) tiles that are empty, in [0, 1]."""
        if self._sparsity is None:
            self._host()
            s = ctypes.c_double()
            c = _ctx(self.device)
            with c.lock:
                c.check(self._lib.fg_block_mask_sparsity(self.handle, ctypes.byref(s)))
            self._sparsity = s.value
        return self._sparsity

    def density(self):
        return 1.0 - self.sparsity()

    def picture(self, max_rows=0, max_cols=0):
        self._host()
        p = ctypes.c_void_p()
        c = _ctx(self.device)
        with c.lock:
            c.check(self._lib.fg_block_mask_picture(self.handle, max_rows, max_cols,
                                                    ctypes.byref(p)))
        try:
            return ctypes.string_at(p).decode()
        finally:
            self._lib.fg_free(p)

    def array(self, name):
        """One array as nested lists shaped like it (downloads a GPU mask)."""
        self._host()
        host = ctypes.POINTER(ctypes.c_int32)()
        dev = ctypes.c_uint64()
        dims = (ctypes.c_int64 * 4)()
        c = _ctx(self.device)
        with c.lock:
            c.check(self._lib.fg_block_mask_array_get(self.handle, FG_BM_ARRAYS[name],
                                                       ctypes.byref(host), ctypes.byref(dev), dims))
        n = dims[0] * dims[1] * dims[2] * dims[3]
        flat = host[:n] if n else []
        if torch is not None:
            t = torch.tensor(flat, dtype=torch.int32).reshape(tuple(dims))
            return t[..., 0] if name.endswith("num_blocks") else t
        return flat

    def rebuild(self, params=None, buffers=None):
        """Rebuild a GPU mask in place for new values (no allocation, no
        compile) on torch's current stream."""
        if self.device is None:
            raise ValueError("rebuild() is for GPU block masks")
        binds = _Bindings(self.mod, params, buffers, device=self.device)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        c = _ctx(self.device)
        with c.lock:
            c.check(self._lib.fg_block_mask_rebuild_gpu(c.handle, self.handle, self.mod.handle,
                                                        binds.array, binds.count, stream))
        self._downloaded = False
        self._sparsity = None

    def __repr__(self):
        where = "cpu" if self.device is None else f"cuda:{self.device}"
        return (f"<flexgen.BlockMask {self.mod.name} shape={self.shape} "
                f"block={self.block_size} on {where}>")

    def __del__(self):
        try:
            self._lib.fg_block_mask_destroy(self.handle)
        except Exception:
            pass


def _block_dims(block_size):
    if isinstance(block_size, int):
        qb = kvb = block_size
    elif isinstance(block_size, (tuple, list)) and len(block_size) == 2:
        qb, kvb = block_size
    else:
        raise TypeError("block_size must be an int or a (q_block, kv_block) pair")
    for v in (qb, kvb):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"block sizes must be positive ints, got {block_size!r}")
    return qb, kvb


def block_mask(mask_mod, B, H, Q_LEN, KV_LEN, params=None, buffers=None, block_size=128,
               device="cuda", q_offset=0, kv_offset=0):
    """Build a block mask like FlexAttention's create_block_mask. B or H of
    None broadcasts (1). device: a CUDA device (the GPU builder, on torch's
    current stream; buffers on that device) or 'cpu' (the CPU builder; buffers
    on the host). q_offset / kv_offset: the positions the mask is built for
    (the mod sees q_idx = q_offset + i), the same as the attention call's.
    The result can be passed as attention(..., block_mask=)."""
    mod = mask_mod if isinstance(mask_mod, Mod) else load_mod(mask_mod, None, params, buffers)
    if not mod.has_mask:
        raise ValueError(f"mod '{mod.name}' defines no mask_mod")
    B = 1 if B is None else B
    H = 1 if H is None else H
    for name, v in (("B", B), ("H", H), ("Q_LEN", Q_LEN), ("KV_LEN", KV_LEN)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    qb, kvb = _block_dims(block_size)
    desc = _BlockMaskDesc(B, H, Q_LEN, KV_LEN, qb, kvb)
    desc.q_offset, desc.kv_offset = _offset(q_offset, "q_offset"), _offset(kv_offset, "kv_offset")
    cpu = device == "cpu" or (torch is not None and isinstance(device, torch.device)
                              and device.type == "cpu")
    handle = ctypes.c_void_p()
    if cpu:
        binds = _Bindings(mod, params, buffers, host=True)
        c = _ctx(None)
        with c.lock:
            c.check(_load().fg_block_mask_create(c.handle, mod.handle, ctypes.byref(desc),
                                                 binds.array, binds.count, ctypes.byref(handle)))
        return BlockMask(handle, mod, (B, H, Q_LEN, KV_LEN), (qb, kvb), None)
    _need_torch()
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device or 'cpu', not {device!r}")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return _gpu_block_mask(mod, desc, params, buffers, index)


def _offset(v, name):
    if isinstance(v, bool) or not isinstance(v, int) or not -(1 << 31) <= v < (1 << 31):
        raise ValueError(f"{name} must be an int, got {v!r}")
    return v


def _gpu_block_mask(mod, desc, params, buffers, index):
    binds = _Bindings(mod, params, buffers, device=index)
    stream = torch.cuda.current_stream(index).cuda_stream
    handle = ctypes.c_void_p()
    c = _ctx(index)
    with c.lock:
        c.check(_load().fg_block_mask_create_gpu(c.handle, mod.handle, ctypes.byref(desc),
                                                 binds.array, binds.count, stream,
                                                 ctypes.byref(handle)))
    return BlockMask(handle, mod, (desc.batch, desc.heads, desc.q_len, desc.kv_len),
                     (desc.q_block, desc.kv_block), index)


_BM_CACHE_MAX = 64
_bm_cache = OrderedDict()  # key -> (BlockMask, weakrefs of the buffers)
_bm_lock = threading.Lock()


def _cached_block_mask(mod, B, H, Q_LEN, KV_LEN, qb, kvb, binds, params, buffers, index, q_offset=0):
    """A GPU block mask from the cache, or built and cached. Buffer identity
    is checked through weak references so a recycled id() never matches."""
    key = (mod.hash, mod.canonical, id(mod), B, H, Q_LEN, KV_LEN, qb, kvb, index, q_offset) + binds.key
    with _bm_lock:
        hit = _bm_cache.get(key)
        if hit is not None:
            bm, refs = hit
            if all(r() is buffers[n] for n, r in refs.items()):
                _bm_cache.move_to_end(key)
                return bm
            del _bm_cache[key]
    desc = _BlockMaskDesc(B, H, Q_LEN, KV_LEN, qb, kvb)
    desc.q_offset = q_offset
    bm = _gpu_block_mask(mod, desc, params, buffers, index)
    refs = {n: weakref.ref(t) for n, t in buffers.items()}
    with _bm_lock:
        _bm_cache[key] = (bm, refs)
        while len(_bm_cache) > _BM_CACHE_MAX:
            _bm_cache.popitem(last=False)
    return bm


# ---------------------------------------------------------------------------
# Attention.
# ---------------------------------------------------------------------------

def _need_torch():
    if torch is None:
        raise ImportError("flexgen.attention needs torch")


def _check_qkv(q, k, v, enable_gqa):
    """The tensor checks that need no device, in a fixed order (types,
    ranks, dtypes, shapes, GQA, strides); attention() checks devices last so
    that tests on a machine without a GPU reach every other check with CPU
    tensors."""
    _need_torch()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (B, H, S, D), got shape {tuple(t.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"{name} must be float16 or bfloat16, not {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"batch sizes differ: q has {q.shape[0]}, k has {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"head dims differ: q has {q.shape[3]}, k has {k.shape[3]}")
    if min(q.shape) == 0 or min(k.shape) == 0:
        raise ValueError("empty tensors are not supported")
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        if not enable_gqa:
            raise ValueError(f"q has {hq} heads and k/v {hkv}: pass enable_gqa=True for "
                             f"grouped-query attention")
        if hq % hkv != 0:
            raise ValueError(f"q heads ({hq}) must be a multiple of k/v heads ({hkv})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(3) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride {t.stride(3)})")


def _check_devices(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, not on {t.device}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def _check_params(params, buffers):
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"params must be a dict, not {type(params).__name__}")
    if buffers is not None and not isinstance(buffers, dict):
        raise TypeError(f"buffers must be a dict, not {type(buffers).__name__}")
    for name, buf in (buffers or {}).items():
        if torch is None or not isinstance(buf, torch.Tensor):
            raise TypeError(f"buffer '{name}' must be a torch tensor, not {type(buf).__name__}")
        if buf.dtype not in (torch.int32, torch.float32):
            raise TypeError(f"buffer '{name}' must be int32 or float32, not {buf.dtype}")
    if _grad_enabled():
        for name, value in (params or {}).items():
            if isinstance(value, torch.Tensor) and value.requires_grad:
                raise ValueError(
                    f"parameter '{name}' is a scalar, which gets no gradient, but the tensor "
                    f"given for it requires grad: pass a number or a detached tensor, or "
                    f"declare it as a one-element buffer (const float *{name};) to learn it")


def _grad_enabled():
    return torch is not None and torch.is_grad_enabled()


def _wants_grad(q, k, v, buffers):
    """Whether autograd must record the call: grad is enabled and q, k, v
    or a buffer requires grad (an int32 tensor never does)."""
    if not _grad_enabled():
        return False
    tensors = [q, k, v] + (list(buffers.values()) if isinstance(buffers, dict) else [])
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _mask_dims(mod, B, H):
    """The block mask's batch and heads: 1 (broadcast) where the mask_mod
    cannot depend on the dimension."""
    return (B if mod.mask_uses("b") else 1), (H if mod.mask_uses("h") else 1)


def _fill_args(args, q, k, v, out, lse, scale, bm, binds, stream):
    B, Hq, S, D = q.shape
    args.batch, args.heads_q, args.heads_kv = B, Hq, k.shape[1]
    args.q_len, args.kv_len, args.head_dim = S, k.shape[2], D
    args.dtype = FG_BF16 if q.dtype == torch.bfloat16 else FG_FP16
    args.q, args.k, args.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
    args.out = out.data_ptr()
    args.lse = lse.data_ptr() if lse is not None else None
    args.q_stride = _Stride(*q.stride())
    args.k_stride = _Stride(*k.stride())
    args.v_stride = _Stride(*v.stride())
    args.out_stride = _Stride(*out.stride())
    args.scale = 0.0 if scale is None else float(scale)
    args.q_offset = args.kv_offset = 0
    args.block_mask = bm.handle.value if bm is not None else None
    args.binds = ctypes.cast(binds.array, ctypes.POINTER(_Binding))
    args.nbinds = binds.count
    args.stream = stream


def attention(q, k, v, mask_mod=None, score_mod=None, params=None, buffers=None, scale=None,
              enable_gqa=False, return_lse=False, block_size=128, block_mask=None,
              deterministic=False, q_offset=0):
    """softmax(score_mod(q k^T * scale) masked by mask_mod) v, like
    FlexAttention's flex_attention.

    q: (B, Hq, Q_LEN, D), k and v: (B, Hkv, KV_LEN, D), CUDA, float16 or
    bfloat16, last dimension contiguous (BHSD or BSHD views both work).
    mask_mod / score_mod: a mod file path, mod text or bare expression (see
    load_mod). params: {name: int or float}; buffers: {name: int32 or
    float32 CUDA tensor}. scale: default 1/sqrt(D). block_mask: from
    block_mask(), else built (and cached) here. Runs on torch's current
    stream. Returns out (B, Hq, Q_LEN, D) contiguous, and with return_lse
    also lse (B, Hq, Q_LEN) float32 (natural log; -inf for a fully masked
    row, whose output is 0). q_offset: the position of the first query
    (the mods see q_idx = q_offset + i): a decode step's queries at the end
    of the sequence, q_offset = KV_LEN - Q_LEN. With Q_LEN up to 16 the call
    runs on the decode kernel (split-KV, grouped heads packed).

    Differentiable with respect to q, k, v and the float32 buffers that
    score_mod reads: when grad is enabled and one of them requires grad, the
    forward also keeps the log-sum-exp and out.backward() runs the
    library's backward pass on torch's current stream. A float buffer
    score_mod's value does not depend on (read only by mask_mod, under a
    comparison or through a cast to int) gets a zero gradient.
    deterministic=True makes dq and the buffer gradients bit-reproducible
    from run to run (no floating-point atomics; somewhat slower). The
    returned lse is differentiable too (a loss may read it: d lse / d score
    is the softmax). Not differentiable, each an error rather than a
    silently missing gradient: a scalar parameter given as a tensor that
    requires grad (make it a one-element float buffer), and a second
    derivative.

    Under torch.compile the call is the custom op flexgen::attention (with
    flexgen::attention_backward for its gradient), so a compiled model keeps
    one graph; see _compiled_attention."""
    if not isinstance(deterministic, int) or deterministic not in (0, 1):
        raise TypeError(f"deterministic must be a bool, not {deterministic!r}")
    deterministic = bool(deterministic)
    if _compiling():
        return _compiled_attention(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa,
                                   return_lse, block_size, block_mask, deterministic, q_offset)
    if not _wants_grad(q, k, v, buffers):
        return _prepare(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa,
                        return_lse, block_size, block_mask, q_offset)()
    call = _prepare(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa,
                    True, block_size, block_mask, q_offset)
    names = list(call.binds.buffers)
    out, lse = _AttentionFunction.apply(call, deterministic, names, q, k, v,
                                        *(call.binds.buffers[n] for n in names))
    return (out, lse) if return_lse else out


class Prepared:
    """One attention call with every argument checked and converted once,
    and its kernel fetched once (fg_kernel_get): calling it only launches
    (fg_kernel_launch) on torch's current stream, writing the same `out`
    (and `lse`). For loops that call the same attention on tensors updated
    in place, and for timing the kernel without the per-call host work.
    It runs outside autograd: its out carries no gradient."""

    def __init__(self, mod, args, out, lse, tensors, block_mask, binds, index):
        self.mod, self.out, self.lse = mod, out, lse
        self.block_mask, self.binds = block_mask, binds
        self._args, self._keep, self._index = args, tensors, index
        self._ctx = _ctx(index)
        self._lib = _load()
        self._kernel = ctypes.c_void_p()
        self._fetch()

    def _fetch(self):
        """The kernel forward would use; again after forget_memory_cache(),
        which may unload the module a held kernel points into."""
        if self._kernel:
            self._lib.fg_kernel_release(self._kernel)
            self._kernel = ctypes.c_void_p()
        c = self._ctx
        with c.lock:
            c.check(self._lib.fg_attention_kernel_for(c.handle, self.mod.handle, ctypes.byref(self._args),
                                                      ctypes.byref(self._kernel)))
        self._generation = _memory_generation

    @property
    def kernel_kind(self):
        """The kernel this call launches: FG_KERNEL_ATTENTION_DECODE, or a
        forward kind (FG_KERNEL_ATTENTION_FWD, FG_KERNEL_ATTENTION_FWD_SM90)."""
        return self._lib.fg_kernel_kind_of(self._kernel)

    def __call__(self):
        if self._generation != _memory_generation:
            self._fetch()
        self._args.stream = torch.cuda.current_stream(self._index).cuda_stream
        c = self._ctx
        with c.lock:
            c.check(self._lib.fg_kernel_launch(c.handle, self._kernel, ctypes.byref(self._args)))
        return (self.out, self.lse) if self.lse is not None else self.out

    def __del__(self):
        try:
            self._lib.fg_kernel_release(self._kernel)
        except Exception:
            pass


def prepare(q, k, v, mask_mod=None, score_mod=None, params=None, buffers=None, scale=None,
            enable_gqa=False, return_lse=False, block_size=128, block_mask=None, q_offset=0):
    """attention()'s checks, mod, block mask and output allocation, without
    the launch: returns a Prepared call (same arguments as attention, less
    deterministic). A Prepared call launches outside autograd, so with grad
    enabled an input that requires grad is refused (ValueError) rather than
    silently detached: use attention() to differentiate, or detach."""
    if _wants_grad(q, k, v, buffers):
        raise ValueError("prepare() launches outside autograd and an input requires grad: "
                         "use attention() to get gradients, or detach the inputs (or call "
                         "under torch.no_grad())")
    return _prepare(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa,
                    return_lse, block_size, block_mask, q_offset)


def _call_block_mask(mod, q, k, binds, params, qb, kvb, block_mask, index, q_offset):
    """The block mask a call runs with: the caller's (checked against the
    shapes), else the cached one of its mask_mod, else None (no mask_mod:
    every block is visited and nothing is evaluated)."""
    B, Hq, S, _ = q.shape
    KV = k.shape[2]
    if block_mask is not None:
        if block_mask.device != index:
            raise ValueError(f"block_mask lives on {block_mask.device}, not cuda:{index}")
        bB, bH, bS, bKV = block_mask.shape
        if (bS, bKV) != (S, KV) or bB not in (1, B) or bH not in (1, Hq):
            raise ValueError(f"block_mask shape {block_mask.shape} does not fit "
                             f"(B={B}, H={Hq}, Q_LEN={S}, KV_LEN={KV})")
        return block_mask
    if not mod.has_mask:
        return None
    mB, mH = _mask_dims(mod, B, Hq)
    return _cached_block_mask(mod, mB, mH, S, KV, qb, kvb, binds, params or {}, binds.buffers, index,
                              _offset(q_offset, "q_offset"))


def _prepare(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa, return_lse,
             block_size, block_mask, q_offset=0):
    _check_qkv(q, k, v, enable_gqa)
    _check_params(params, buffers)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be a float, not {type(scale).__name__}")
    qb, kvb = _block_dims(block_size)
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a flexgen.BlockMask, not {type(block_mask).__name__}")
    _check_devices(q, k, v)
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    mod = load_mod(mask_mod, score_mod, params, buffers)
    binds = _Bindings(mod, params, buffers, device=index)
    B, Hq, S, D = q.shape
    bm = _call_block_mask(mod, q, k, binds, params, qb, kvb, block_mask, index, q_offset)
    out = torch.empty((B, Hq, S, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device) if return_lse else None
    args = _AttentionArgs()
    _fill_args(args, q, k, v, out, lse, scale, bm, binds, None)
    args.q_offset = _offset(q_offset, "q_offset")
    return Prepared(mod, args, out, lse, (q, k, v), bm, binds, index)


def merge(outs, lses):
    """Merge partial attention results over disjoint sets of keys exactly:
    outs, a list of (B, H, Q_LEN, D) float16 / bfloat16 tensors with the
    same shape and strides, and lses, their (B, H, Q_LEN) float32
    log-sum-exps (attention(..., return_lse=True) gives both). Returns (out,
    lse) of the attention over all the keys: out = sum_i e^(lse_i - M) out_i
    / sum_i e^(lse_i - M). At most 16 parts per call."""
    _need_torch()
    if not outs or len(outs) != len(lses) or len(outs) > 16:
        raise ValueError("merge takes 1 to 16 parts, as many LSEs as outputs")
    o0 = outs[0]
    for o, l in zip(outs, lses):
        if not (isinstance(o, torch.Tensor) and o.dim() == 4 and o.is_cuda and o.dtype == o0.dtype
                and o.shape == o0.shape and o.stride() == o0.stride() and o.device == o0.device):
            raise ValueError("every part's output must be a CUDA tensor of the first one's shape, strides and dtype")
        if not (isinstance(l, torch.Tensor) and l.dtype == torch.float32 and l.is_contiguous()
                and tuple(l.shape) == tuple(o0.shape[:3]) and l.device == o0.device):
            raise ValueError("every LSE must be a contiguous float32 (B, H, Q_LEN) tensor on the outputs' device")
    if o0.dtype not in (torch.float16, torch.bfloat16) or o0.stride(3) != 1:
        raise TypeError("outputs must be float16 or bfloat16 with a contiguous last dimension")
    B, H, Q, D = o0.shape
    out = torch.empty((B, H, Q, D), dtype=o0.dtype, device=o0.device)
    lse = torch.empty((B, H, Q), dtype=torch.float32, device=o0.device)
    args = _MergeArgs()
    args.batch, args.heads, args.q_len, args.head_dim = B, H, Q, D
    args.dtype = FG_BF16 if o0.dtype == torch.bfloat16 else FG_FP16
    args.nparts = len(outs)
    for i, (o, l) in enumerate(zip(outs, lses)):
        args.outs[i], args.lses[i] = o.data_ptr(), l.data_ptr()
    args.part_stride = _Stride(*o0.stride())
    args.out, args.lse, args.out_stride = out.data_ptr(), lse.data_ptr(), _Stride(*out.stride())
    index = o0.device.index if o0.device.index is not None else torch.cuda.current_device()
    args.stream = torch.cuda.current_stream(index).cuda_stream
    c = _ctx(index)
    with c.lock:
        c.check(_load().fg_attention_merge(c.handle, ctypes.byref(args)))
    return out, lse


def _check_paged(q, k_cache, v_cache, block_table, seq_lens, q_offsets):
    _need_torch()
    if not (isinstance(q, torch.Tensor) and q.dim() == 4 and q.is_cuda):
        raise ValueError("q must be a 4-D CUDA tensor (B, Hq, Q_LEN, D)")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q must be float16 or bfloat16, not {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not (isinstance(t, torch.Tensor) and t.dim() == 4 and t.device == q.device):
            raise ValueError(f"{name} must be a 4-D tensor (num_pages, page_size, Hkv, D) on {q.device}")
        if t.dtype != q.dtype or t.shape != k_cache.shape or t.stride(3) != 1:
            raise ValueError(f"{name} must have q's dtype, k_cache's shape and a contiguous last dimension")
    B, Hq, S, D = q.shape
    P, ps, Hkv, Dk = k_cache.shape
    if Dk != D or Hq % Hkv != 0:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} does not fit q {tuple(q.shape)}")
    for name, t, shape in (("block_table", block_table, None), ("seq_lens", seq_lens, (B,)),
                           ("q_offsets", q_offsets, (B,))):
        if t is None and name == "q_offsets":
            continue
        if not (isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.device == q.device
                and t.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous int32 tensor on {q.device}")
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, not {tuple(t.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != B:
        raise ValueError(f"block_table must have shape (B={B}, max_pages)")


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, mask_mod=None, score_mod=None,
                    params=None, buffers=None, scale=None, q_offsets=None, return_lse=False,
                    block_mask=None):
    """Attention of q against a paged KV cache (vLLM / FlashInfer layout).

    q: (B, Hq, Q_LEN, D); k_cache, v_cache: (num_pages, page_size, Hkv, D),
    page_size a power of two in [16, 256]; block_table: int32 (B,
    max_pages), sequence b's key j is row j % page_size of page
    block_table[b, j // page_size]; seq_lens: int32 (B,), each sequence's
    KV length; q_offsets: int32 (B,), the position of each sequence's first
    query (default seq_lens - Q_LEN, at least 0: the queries are the last
    tokens). All on q's device, read by the kernel at run time (nothing
    recompiles when they change). A table entry outside [0, num_pages) is
    never read; its keys are masked. Up to 16 queries per sequence run on
    the decode kernel, more (a prefill or a chunk of one into the cache)
    on the portable forward kernel; no gradient."""
    return prepare_paged(q, k_cache, v_cache, block_table, seq_lens, mask_mod, score_mod, params,
                         buffers, scale, q_offsets, return_lse, block_mask)()


def prepare_paged(q, k_cache, v_cache, block_table, seq_lens, mask_mod=None, score_mod=None,
                  params=None, buffers=None, scale=None, q_offsets=None, return_lse=False,
                  block_mask=None):
    """paged_attention's checks and kernel fetch without the launch: a
    Prepared call that launches on torch's current stream. The tensors are
    read at each launch, so a serving loop updates seq_lens, q_offsets
    (default: seq_lens - Q_LEN computed here once, kept as .q_offsets) and
    block_table in place between calls."""
    _check_paged(q, k_cache, v_cache, block_table, seq_lens, q_offsets)
    if q_offsets is None:
        q_offsets = (seq_lens - q.shape[2]).clamp_min(0).to(torch.int32)
    _check_params(params, buffers)
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a flexgen.BlockMask, not {type(block_mask).__name__}")
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    mod = load_mod(mask_mod, score_mod, params, buffers)
    binds = _Bindings(mod, params, buffers, device=index)
    B, Hq, S, D = q.shape
    P, ps, Hkv, _ = k_cache.shape
    out = torch.empty((B, Hq, S, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device) if return_lse else None
    args = _AttentionArgs()
    _fill_args(args, q, k_cache, v_cache, out, lse, scale, block_mask, binds, None)
    max_pages = block_table.shape[1]
    args.heads_kv, args.kv_len = Hkv, max_pages * ps
    ks, vs = k_cache.stride(), v_cache.stride()
    args.k_stride = _Stride(ks[0], ks[2], ks[1], 1)  # (page, head, row in page, d)
    args.v_stride = _Stride(vs[0], vs[2], vs[1], 1)
    args.block_table, args.page_size, args.num_pages, args.max_pages = (
        block_table.data_ptr(), ps, P, max_pages)
    args.kv_lens, args.q_offsets = seq_lens.data_ptr(), q_offsets.data_ptr()
    call = Prepared(mod, args, out, lse, (q, k_cache, v_cache, block_table, seq_lens, q_offsets),
                    block_mask, binds, index)
    call.q_offsets = q_offsets
    return call


# ---------------------------------------------------------------------------
# The backward pass.
# ---------------------------------------------------------------------------

def _grad_bindings(grads):
    """An fg_binding array naming, for each {name: tensor}, the float
    buffer whose gradient goes into the tensor (fp32 on the device for the
    GPU backward, float64 on the host for the reference); and the name
    bytes it points to, which the caller keeps alive."""
    names = [n.encode() for n in grads]
    rows = []
    for nb, t in zip(names, grads.values()):
        b = _Binding()
        b.name, b.kind, b.type = nb, FG_PARAM_BUFFER, FG_TYPE_FLOAT
        b.value.buffer.data = t.data_ptr() if t.numel() else None
        b.value.buffer.length = t.numel()
        rows.append(b)
    return (_Binding * max(1, len(rows)))(*rows), names


def _run_backward(c, mod, bwd, grads, call=None, probe=None, workspace_device=None):
    """fg_attention_backward, asking for the gradient of each float buffer
    in `grads` ({name: fp32 tensor}) that the library has not refused for
    this mod before; returns the names left out, whose gradient is zero.

    Which buffers have a gradient is the library's to say: its derivative
    pass drops a read whose derivative is zero everywhere (under a
    comparison, through a cast to int), which a look at the mod text could
    not tell. A binding for a buffer score_mod's value does not depend on is
    refused with FG_ERR_UNBOUND before any launch; the refused names are
    found (the one asked for, or with several, each tried alone), the call
    is made again without them, and once that succeeds they are remembered
    on the mod, so the extra calls happen once per mod.

    `call` (default: fg_attention_backward on bwd) makes the call once bwd
    holds the bindings. `probe`, when given, answers the same question
    without making the call: the sharded backward's call is collective, so
    the refused names are found by probing (locally, the same answer on
    every rank) and the call is made once, with the rest.

    `workspace_device` (a CUDA device index), when given, has the call's
    workspace (fg_attention_backward_workspace_size: the dQ accumulator,
    268 MB at B=4 H=16 S=8192 D=128) taken from torch's caching allocator
    on that device's current stream, where torch's memory statistics and
    limits see it and a CUDA graph capture gets it from the graph's pool.
    The library's own pool keeps only 64 MiB mapped across a
    synchronisation, so a training step that synchronises would map the
    accumulator afresh each time (~0.2 ms). The tensor is freed after the
    launch: torch's allocator reuses it only for later work on the same
    stream."""
    if call is None:
        fn = _function("fg_attention_backward")

        def call():
            return fn(c.handle, mod.handle, ctypes.byref(bwd))
    size_fn = _function("fg_attention_backward_workspace_size") if workspace_device is not None else None

    def launch(names, how=call):
        arr, keep = _grad_bindings({n: grads[n] for n in names})
        bwd.grad_binds = ctypes.cast(arr, ctypes.POINTER(_Binding))
        bwd.ngrad_binds = len(names)
        ws = None
        if size_fn is not None and how is call:
            size = ctypes.c_size_t()
            # a refused binding fails here as in the call; the call reports it
            if size_fn(c.handle, mod.handle, ctypes.byref(bwd), ctypes.byref(size)) == FG_OK and size.value:
                ws = torch.empty(size.value, dtype=torch.uint8, device=torch.device("cuda", workspace_device))
                bwd.workspace, bwd.workspace_size = ws.data_ptr(), ws.numel()
        st = how()
        bwd.workspace, bwd.workspace_size = None, 0
        del arr, keep, ws
        return st

    ask = [n for n in grads if n not in mod._no_gradient]
    with c.lock:
        if probe is not None and ask and launch(ask, probe) == FG_ERR_UNBOUND:
            refused = ask if len(ask) == 1 else [n for n in ask if launch([n], probe) == FG_ERR_UNBOUND]
            mod._no_gradient.update(refused)
            ask = [n for n in ask if n not in refused]
        st = launch(ask)
        if st == FG_ERR_UNBOUND and ask and probe is None:
            refused = ask if len(ask) == 1 else [n for n in ask if launch([n]) == FG_ERR_UNBOUND]
            rest = [n for n in ask if n not in refused]
            st = launch(rest)  # also renews the error message if it fails again
            if st == FG_OK:
                mod._no_gradient.update(refused)
                ask = rest
        c.check(st)
    return [n for n in grads if n not in ask]


def _bwd_args(fwd, out, dout, dq, dk, dv, deterministic, dlse):
    """fg_attention_bwd_args over the forward's `fwd`, from dout (None:
    zero; cast to out's dtype, made dense where the library cannot take its
    strides) and dlse (None: zero). Returns the struct and the tensors it
    points at, which must outlive the call."""
    if dout is None:
        dout = torch.zeros_like(out)
    if dout.dtype != out.dtype:
        dout = dout.to(out.dtype)
    # The library takes any strides with a contiguous last dimension; a
    # broadcast dout (stride 0, as out.sum() gives) is made dense.
    if dout.stride(3) != 1 or any(s == 0 and n > 1 for s, n in zip(dout.stride(), dout.shape)):
        dout = dout.contiguous()
    bwd = _AttentionBwdArgs()
    bwd.fwd = ctypes.pointer(fwd)
    bwd.dout = dout.data_ptr()
    bwd.dq, bwd.dk, bwd.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    bwd.dout_stride = _Stride(*dout.stride())
    bwd.dq_stride = _Stride(*dq.stride())
    bwd.dk_stride = _Stride(*dk.stride())
    bwd.dv_stride = _Stride(*dv.stride())
    bwd.deterministic = 1 if deterministic else 0
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
        bwd.dlse = dlse.data_ptr()
    return bwd, (dout, dlse)


def _backward(ctx, q, k, v, out, lse, dout, grads, dlse=None):
    """dq, dk, dv (shaped and strided like q, k, v where those are dense)
    from dout (and dlse, d loss / d lse, when the loss reads the lse); fills
    the buffer gradients in `grads`. `ctx` carries the forward's index,
    scale, block_mask, binds, mod and deterministic."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    stream = torch.cuda.current_stream(ctx.index).cuda_stream
    fwd = _AttentionArgs()
    _fill_args(fwd, q, k, v, out, lse, ctx.scale, ctx.block_mask, ctx.binds, stream)
    bwd, keep = _bwd_args(fwd, out, dout, dq, dk, dv, ctx.deterministic, dlse)
    for name in _run_backward(_ctx(ctx.index), ctx.mod, bwd, grads, workspace_device=ctx.index):
        grads[name].zero_()
    return dq, dk, dv


if torch is not None:
    from torch.autograd.function import once_differentiable

    class _AttentionFunction(torch.autograd.Function):
        """attention() under autograd. forward launches the prepared call
        (lse included) and saves q, k, v, out, lse and every buffer, so
        that autograd's version check catches a tensor changed in place
        before backward; the mod, the block mask and the bindings stay on
        ctx (they hold no output, so no reference cycle). backward returns
        dq, dk, dv and a gradient for each float buffer that requires grad,
        in apply's argument order."""

        @staticmethod
        def forward(ctx, call, deterministic, names, q, k, v, *buffers):
            out, lse = call()
            ctx.set_materialize_grads(False)
            ctx.mod, ctx.block_mask, ctx.binds = call.mod, call.block_mask, call.binds
            ctx.index, ctx.scale = call._index, call._args.scale
            ctx.deterministic, ctx.names = deterministic, names
            ctx.save_for_backward(q, k, v, out, lse, *buffers)
            return out, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, dout, dlse):
            q, k, v, out, lse, *buffers = ctx.saved_tensors
            if dout is None and dlse is None:
                return (None,) * (6 + len(buffers))
            need = ctx.needs_input_grad
            grads = {n: torch.empty_like(b)
                     for n, b, wanted in zip(ctx.names, buffers, need[6:]) if wanted}
            dq, dk, dv = _backward(ctx, q, k, v, out, lse, dout, grads, dlse)
            return (None, None, None, dq if need[3] else None, dk if need[4] else None,
                    dv if need[5] else None, *(grads.get(n) for n in ctx.names))


# ---------------------------------------------------------------------------
# torch.compile: attention as a custom op.
# ---------------------------------------------------------------------------
#
# Dynamo cannot trace ctypes calls: a compiled model that called attention()
# as it runs eagerly would break its graph there. Under torch.compile,
# attention() instead calls the custom op flexgen::attention, one node of
# the graph, whose implementation is the eager call (so results are the
# same), whose fake implementation gives the shapes, and whose gradient is
# the op flexgen::attention_backward (register_autograd). An op schema
# carries tensors, strings, numbers and lists of them; what was chosen:
#   - mask_mod / score_mod: the text as given (a path, mod text or an
#     expression), a Mod object as its canonical text (which parses to the
#     same mod), "" for none;
#   - params split by type, names joined by ',' beside their values: the
#     expression form declares a parameter's type from its Python value.
#     They are constants of the compiled graph: dynamo guards on them and
#     recompiles when one changes (as for numbers a FlexAttention score_mod
#     closes over); a value that changes every step belongs in a buffer;
#   - buffers: their names joined by ',' and the tensors in that order;
#   - block_mask: the BlockMask's number in a weak registry (-1: none); the
#     caller keeps the mask alive while the compiled model uses it, and
#     BlockMask.rebuild updates it in place as in eager;
#   - scale (None: 1/sqrt(D)), enable_gqa, the (q, kv) block sizes, q_offset,
#     deterministic (the backward's).
# The op always returns (out, lse), lse being the backward's input;
# attention() drops it unless return_lse. The backward takes dlse, so a
# loss that reads the lse is differentiated as in eager.

def _compiling():
    return torch is not None and torch.compiler.is_compiling()


def _mod_text(m):
    if m is None:
        return ""
    if isinstance(m, Mod):
        return m.canonical
    if isinstance(m, str):
        return m
    return os.fspath(m)


def _compiled_attention(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa,
                        return_lse, block_size, block_mask, deterministic, q_offset):
    params = params or {}
    buffers = buffers or {}
    for name, value in params.items():
        if isinstance(value, torch.Tensor):
            raise TypeError(f"params['{name}']: under torch.compile a parameter is a number (a "
                            f"constant of the graph); pass a value that changes per step as a "
                            f"one-element buffer")
    int_names = sorted(n for n, x in params.items() if not isinstance(x, float))
    float_names = sorted(n for n, x in params.items() if isinstance(x, float))
    buffer_names = sorted(buffers)
    qb, kvb = _block_dims(block_size)
    out, lse = torch.ops.flexgen.attention(
        q, k, v, [buffers[n] for n in buffer_names], _mod_text(mask_mod), _mod_text(score_mod),
        ",".join(int_names), [int(params[n]) for n in int_names], ",".join(float_names),
        [params[n] for n in float_names], ",".join(buffer_names),
        None if scale is None else float(scale), bool(enable_gqa), [qb, kvb], q_offset,
        -1 if block_mask is None else block_mask._op_id, bool(deterministic))
    return (out, lse) if return_lse else out


def _names(joined):
    return joined.split(",") if joined else []


class _OpCall:
    """The op's arguments turned back into attention()'s."""

    def __init__(self, q, buffers, mask_mod, score_mod, int_names, int_values, float_names,
                 float_values, buffer_names, scale, enable_gqa, block_size, q_offset, block_mask,
                 deterministic):
        self.mask_mod, self.score_mod = mask_mod or None, score_mod or None
        self.params = dict(zip(_names(int_names), int_values))
        self.params.update(zip(_names(float_names), float_values))
        self.buffers = dict(zip(_names(buffer_names), buffers))
        self.scale, self.enable_gqa, self.q_offset = scale, enable_gqa, q_offset
        self.block_size = tuple(block_size)
        self.deterministic = deterministic
        self.block_mask = None
        if block_mask >= 0:
            self.block_mask = _block_masks.get(block_mask)
            if self.block_mask is None:
                raise ValueError(f"flexgen.attention: block mask {block_mask} no longer exists; keep "
                                 f"the BlockMask alive while a compiled model uses it")
        self.index = q.device.index if q.device.index is not None else torch.cuda.current_device()


if torch is not None and hasattr(torch, "library") and hasattr(torch.library, "custom_op"):

    @torch.library.custom_op("flexgen::attention", mutates_args=())
    def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, buffers: List[torch.Tensor],
                      mask_mod: str, score_mod: str, int_names: str, int_values: List[int],
                      float_names: str, float_values: List[float], buffer_names: str,
                      scale: Optional[float], enable_gqa: bool, block_size: List[int], q_offset: int,
                      block_mask: int, deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        c = _OpCall(q, buffers, mask_mod, score_mod, int_names, int_values, float_names,
                    float_values, buffer_names, scale, enable_gqa, block_size, q_offset, block_mask,
                    deterministic)
        return _prepare(q, k, v, c.mask_mod, c.score_mod, c.params, c.buffers, c.scale,
                        c.enable_gqa, True, c.block_size, c.block_mask, c.q_offset)()

    @_attention_op.register_fake
    def _attention_fake(q, k, v, buffers, *rest):
        B, Hq, S, D = q.shape
        return q.new_empty((B, Hq, S, D)), q.new_empty((B, Hq, S), dtype=torch.float32)

    @torch.library.custom_op("flexgen::attention_backward", mutates_args=())
    def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                               lse: torch.Tensor, dout: torch.Tensor, dlse: Optional[torch.Tensor],
                               buffers: List[torch.Tensor], mask_mod: str, score_mod: str,
                               int_names: str, int_values: List[int], float_names: str,
                               float_values: List[float], buffer_names: str, scale: Optional[float],
                               enable_gqa: bool, block_size: List[int], q_offset: int,
                               block_mask: int, deterministic: bool) -> List[torch.Tensor]:
        """[dq, dk, dv] and the gradient of each float32 buffer, in order."""
        c = _OpCall(q, buffers, mask_mod, score_mod, int_names, int_values, float_names,
                    float_values, buffer_names, scale, enable_gqa, block_size, q_offset, block_mask,
                    deterministic)
        mod = load_mod(c.mask_mod, c.score_mod, c.params, c.buffers)
        binds = _Bindings(mod, c.params, c.buffers, device=c.index)
        bm = _call_block_mask(mod, q, k, binds, c.params, c.block_size[0], c.block_size[1],
                              c.block_mask, c.index, c.q_offset)
        call = types.SimpleNamespace(index=c.index, scale=c.scale, block_mask=bm, binds=binds,
                                     mod=mod, deterministic=c.deterministic)
        grads = {n: torch.empty_like(b) for n, b in c.buffers.items() if b.dtype == torch.float32}
        dq, dk, dv = _backward(call, q, k, v, out, lse, dout, grads, dlse)
        return [dq, dk, dv] + list(grads.values())

    @_attention_backward_op.register_fake
    def _attention_backward_fake(q, k, v, out, lse, dout, dlse, buffers, *rest):
        return ([torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)] +
                [torch.empty_like(b) for b in buffers if b.dtype == torch.float32])

    def _attention_op_setup(ctx, inputs, output):
        q, k, v, buffers, *rest = inputs
        ctx.save_for_backward(q, k, v, *output, *buffers)
        ctx.rest = rest

    def _attention_op_grad(ctx, dout, dlse):
        q, k, v, out, lse, *buffers = ctx.saved_tensors
        dq, dk, dv, *floats = torch.ops.flexgen.attention_backward(q, k, v, out, lse, dout, dlse,
                                                                   buffers, *ctx.rest)
        floats = iter(floats)
        dbuf = [next(floats) if b.dtype == torch.float32 else None for b in buffers]
        # No gradient for the rest; an empty list argument (no params of a
        # type) is an empty node of the inputs' tree, so it gets [] back.
        return (dq, dk, dv, dbuf) + tuple([] if isinstance(x, list) and not x else None for x in ctx.rest)

    torch.library.register_autograd("flexgen::attention", _attention_op_grad,
                                    setup_context=_attention_op_setup)


# ---------------------------------------------------------------------------
# The CPU references.
# ---------------------------------------------------------------------------

def _reference_args(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa):
    """The checks and the fg_attention_args of a reference call on CPU
    tensors: (mod, bindings, contiguous q, k, v, args without out / lse)."""
    _need_torch()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor for the reference")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[3] != k.shape[3]:
        raise ValueError("q, k, v must be (B, H, S, D) with matching k/v shapes and head dims")
    if q.dtype not in (torch.float16, torch.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        raise TypeError("q, k, v must all be float16 or all bfloat16")
    if q.shape[1] != k.shape[1] and (not enable_gqa or q.shape[1] % k.shape[1]):
        raise ValueError("q heads must equal k/v heads (or be a multiple with enable_gqa=True)")
    mod = load_mod(mask_mod, score_mod, params, buffers)
    binds = _Bindings(mod, params, buffers, host=True)
    q, k, v = (t.detach().contiguous() for t in (q, k, v))
    B, Hq, S, D = q.shape
    args = _AttentionArgs()
    args.batch, args.heads_q, args.heads_kv = B, Hq, k.shape[1]
    args.q_len, args.kv_len, args.head_dim = S, k.shape[2], D
    args.dtype = FG_BF16 if q.dtype == torch.bfloat16 else FG_FP16
    args.q, args.k, args.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
    args.q_stride = _Stride(*q.stride())
    args.k_stride = _Stride(*k.stride())
    args.v_stride = _Stride(*v.stride())
    args.scale = 0.0 if scale is None else float(scale)
    args.binds = ctypes.cast(binds.array, ctypes.POINTER(_Binding))
    args.nbinds = binds.count
    return mod, binds, q, k, v, args


def reference(q, k, v, mask_mod=None, score_mod=None, params=None, buffers=None, scale=None,
              enable_gqa=False):
    """The library's CPU reference (float64 accumulation, mods through the
    evaluator) on CPU tensors: returns (out float64, lse float64)."""
    mod, binds, q, k, v, args = _reference_args(q, k, v, mask_mod, score_mod, params, buffers,
                                                scale, enable_gqa)
    B, Hq, S, D = q.shape
    out = torch.empty((B, Hq, S, D), dtype=torch.float64)
    lse = torch.empty((B, Hq, S), dtype=torch.float64)
    args.out_stride = _Stride(*out.stride())
    args.out, args.lse = out.data_ptr(), lse.data_ptr()  # (the results go to out / lse below)
    c = _ctx(None)
    with c.lock:
        c.check(_load().fg_attention_reference(c.handle, mod.handle, ctypes.byref(args),
                                               out.data_ptr(), lse.data_ptr()))
    return out, lse


def reference_backward(q, k, v, dout, mask_mod=None, score_mod=None, params=None, buffers=None,
                       scale=None, enable_gqa=False, grad_buffers=()):
    """The library's CPU reference backward (float64 accumulation; score_mod
    and its derivative through the evaluator) on CPU tensors: the gradients
    of q, k, v for d loss / d out = dout (shaped like q, in q's dtype), as
    float64 (dq, dk, dv, {name: gradient}) with a float64 gradient, shaped
    like the buffer, for each float buffer named in grad_buffers. Naming a
    buffer score_mod's value does not depend on is FG_ERR_UNBOUND."""
    mod, binds, q, k, v, args = _reference_args(q, k, v, mask_mod, score_mod, params, buffers,
                                                scale, enable_gqa)
    if not isinstance(dout, torch.Tensor) or dout.device.type != "cpu":
        raise ValueError("dout must be a CPU tensor for the reference")
    if dout.shape != q.shape or dout.dtype != q.dtype:
        raise ValueError(f"dout must have q's shape {tuple(q.shape)} and dtype {q.dtype}, "
                         f"got {tuple(dout.shape)} {dout.dtype}")
    if isinstance(grad_buffers, str):
        grad_buffers = (grad_buffers,)
    grads = {}
    for name in grad_buffers:
        if name not in binds.buffers or mod.params.get(name, ("",))[:2] != ("buffer", "float"):
            raise ValueError(f"grad_buffers: '{name}' is not a float buffer given in buffers=")
        grads[name] = torch.empty(_numel(binds.buffers[name]), dtype=torch.float64)
    dout = dout.detach().contiguous()
    B, Hq, S, D = q.shape
    out = torch.empty((B, Hq, S, D), dtype=q.dtype)  # not read: the reference recomputes
    lse = torch.empty((B, Hq, S), dtype=torch.float32)
    args.out, args.lse = out.data_ptr(), lse.data_ptr()
    args.out_stride = _Stride(*out.stride())
    dq = torch.empty(q.shape, dtype=torch.float64)
    dk = torch.empty(k.shape, dtype=torch.float64)
    dv = torch.empty(v.shape, dtype=torch.float64)
    bwd = _AttentionBwdArgs()
    bwd.fwd = ctypes.pointer(args)
    bwd.dout = dout.data_ptr()
    bwd.dq, bwd.dk, bwd.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    bwd.dout_stride = _Stride(*dout.stride())  # the gradients: all zero, contiguous
    arr, keep = _grad_bindings(grads)
    bwd.grad_binds = ctypes.cast(arr, ctypes.POINTER(_Binding))
    bwd.ngrad_binds = len(grads)
    fn = _function("fg_attention_reference_backward")
    c = _ctx(None)
    with c.lock:
        c.check(fn(c.handle, mod.handle, ctypes.byref(bwd)))
    del keep
    shaped = {}
    for name, g in grads.items():
        buf = binds.buffers[name]
        shaped[name] = g.reshape(buf.shape) if isinstance(buf, torch.Tensor) else g
    return dq, dk, dv, shaped


# ---------------------------------------------------------------------------
# The kernel cache (process-wide in the library).
# ---------------------------------------------------------------------------

def cache_stats():
    """The library's kernel-cache counters as a dict."""
    s = _CacheStats()
    _load().fg_cache_get_stats(ctypes.byref(s))
    return {f: getattr(s, f) for f, _ in _CacheStats._fields_}


def reset_cache_stats():
    _load().fg_cache_reset_stats()


_memory_generation = 0  # bumped by forget_memory_cache(): Prepared calls re-fetch


def forget_memory_cache():
    """Drop every kernel from the in-memory cache (the next call loads from
    disk or compiles): for measuring cold and warm first calls."""
    global _memory_generation
    _memory_generation += 1
    _load().fg_cache_forget_memory()
    with _bm_lock:
        _bm_cache.clear()


def set_cache_dir(path):
    """Use `path` as the disk cache folder for every context (None: default)."""
    global _cache_dir_override
    _cache_dir_override = os.fspath(path) if path is not None else None
    with _contexts_lock:
        contexts = list(_contexts.values())
    for c in contexts:
        with c.lock:
            c.check(c._lib.fg_ctx_set_string(c.handle, FG_OPT_CACHE_DIR,
                                             _cache_dir_override.encode()
                                             if _cache_dir_override else None))


def set_approx_math(enabled):
    """Approximate math in score_mod and its derivative, for every context
    (FG_OPT_APPROX_MATH): the hardware's tanh.approx, ex2 / lg2 /
    rsqrt.approx and div.full instead of the accurate functions, mask_mod
    unchanged. The largest error is tanh's, relative 2^-11 (an eighth of
    bf16's rounding); include/flexgen.h gives every bound. Such kernels are
    compiled and cached apart from the accurate ones. It applies to the
    calls that start after it (a Prepared call keeps the kernel it
    fetched): switch between training steps, not between a forward and its
    backward. Without a call, $FLEXGEN_APPROX_MATH=1 turns it on."""
    global _approx_math_override
    if not isinstance(enabled, int) or enabled not in (0, 1):
        raise TypeError(f"enabled must be a bool, not {enabled!r}")
    _approx_math_override = bool(enabled)
    with _contexts_lock:
        contexts = list(_contexts.values())
    for c in contexts:
        with c.lock:
            c.check(c._lib.fg_ctx_set_int(c.handle, FG_OPT_APPROX_MATH, int(enabled)))


def cache_dir():
    c = _ctx(None)
    v = ctypes.c_char_p()
    with c.lock:
        c.check(c._lib.fg_ctx_get_string(c.handle, FG_OPT_CACHE_DIR, ctypes.byref(v)))
    return v.value.decode() if v.value else ""


# ---------------------------------------------------------------------------
# Generated code (no GPU needed): what `flexgen --kernel K --emit ...` prints.
# ---------------------------------------------------------------------------

_KERNEL_KINDS = {
    "attention": FG_KERNEL_ATTENTION_FWD, "attention-sm90": FG_KERNEL_ATTENTION_FWD_SM90,
    "attention-bwd": FG_KERNEL_ATTENTION_BWD, "attention-bwd-sm90": FG_KERNEL_ATTENTION_BWD_SM90,
    "blockmask": FG_KERNEL_BLOCK_MASK,
}
_EMIT_KINDS = {"ptx": 1, "cubin": 2}


def _kernel_config(kernel, dtype, head_dim, block_size, arch):
    if kernel not in _KERNEL_KINDS:
        raise ValueError(f"kernel must be one of {sorted(_KERNEL_KINDS)}, not {kernel!r}")
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype must be 'bf16' or 'fp16', not {dtype!r}")
    qb, kvb = _block_dims(block_size)
    return _KernelConfig(_KERNEL_KINDS[kernel], FG_BF16 if dtype == "bf16" else FG_FP16, int(head_dim),
                         qb, kvb, arch.encode() if arch else None)


def generate_source(mod, kernel="attention", dtype="bf16", head_dim=128, block_size=128, arch=None):
    """The CUDA source flexgen compiles for `mod` (a Mod, or what load_mod
    takes): kernel 'attention' (portable forward), 'attention-sm90',
    'attention-bwd', 'attention-bwd-sm90' or 'blockmask'. No GPU needed."""
    mod = mod if isinstance(mod, Mod) else load_mod(mod)
    cfg = _kernel_config(kernel, dtype, head_dim, block_size, arch)
    lib, c = _load(), _ctx(None)
    text = ctypes.c_char_p()
    with c.lock:
        c.check(lib.fg_generate_source(c.handle, mod.handle, ctypes.byref(cfg), ctypes.byref(text)))
    try:
        return text.value.decode()
    finally:
        lib.fg_free(ctypes.cast(text, ctypes.c_void_p))


def compile_kernel(mod, kernel="attention", dtype="bf16", head_dim=128, block_size=128, arch=None,
                   emit="cubin"):
    """That source compiled by NVRTC: the cubin or PTX as bytes. arch: e.g.
    'sm_80' or 'sm_90a' (default: the GPU's, sm_90a without one). No GPU
    needed."""
    if emit not in _EMIT_KINDS:
        raise ValueError(f"emit must be 'ptx' or 'cubin', not {emit!r}")
    mod = mod if isinstance(mod, Mod) else load_mod(mod)
    cfg = _kernel_config(kernel, dtype, head_dim, block_size, arch)
    lib, c = _load(), _ctx(None)
    image, size = ctypes.c_void_p(), ctypes.c_size_t()
    with c.lock:
        c.check(lib.fg_compile(c.handle, mod.handle, ctypes.byref(cfg), _EMIT_KINDS[emit], ctypes.byref(image),
                               ctypes.byref(size)))
    try:
        return ctypes.string_at(image, size.value)
    finally:
        lib.fg_free(image)


# ---------------------------------------------------------------------------
# Context parallelism: one sequence over the GPUs of a torch.distributed group.
# ---------------------------------------------------------------------------
#
# Every rank (one process per GPU) holds a shard of the sequence's rows, cut
# by fg_cp_shard_rows (shard_rows, shard), and calls
# context_parallel_attention on its shard; the library passes the K/V shards
# round a ring over NCCL (include/flexgen.h, "context parallelism";
# docs/context_parallel.md).
#
# The library takes the group's raw ncclComm_t and opens libnccl itself with
# dlopen. A communicator is a pointer into the memory of the libnccl that
# made it, so the library must reach it through that same libnccl instance.
# Two ways to get one ($FLEXGEN_CP_COMM: own, the default; torch; auto,
# torch's where it is safe, else our own):
#   - torch's: ProcessGroupNCCL._comm_ptr() (torch 2.8 and newer) returns
#     the communicator the group uses for collectives on the current device,
#     0 before it exists: ProcessGroupNCCL makes it at the group's first
#     collective on the device (or at init_process_group(device_id=...)), so
#     a one-element all_reduce comes first. Taken only when
#       * torch's libnccl is a shared library of this process that can be
#         named (/proc/self/maps; a torch with NCCL linked in statically has
#         none) and the library opens that file: $FLEXGEN_NCCL_LIB is set to
#         it when unset. dlopen of a file already loaded returns the loaded
#         instance, so both then share one NCCL;
#       * the communicator is in NCCL's blocking mode: the ring expects
#         ncclSuccess from every NCCL call, and a non-blocking communicator
#         may answer ncclInProgress (see _torch_comm_is_blocking);
#   - our own: rank 0 of the group draws an ncclUniqueId, broadcast_object_list
#     gives it to the others, and every rank calls ncclCommInitRank through
#     the libnccl the library opens ($FLEXGEN_NCCL_LIB, else torch's, else the
#     nvidia-nccl wheel's, else libnccl.so.2). One per (group, device), kept
#     for the life of the process (its exit frees it; a destroy at exit would
#     have to be ordered with every peer's).
# Our own is the default because the ring runs on a stream of the
# library's: with torch's communicator, its sends and receives and the
# collectives torch runs on its own stream (the gradient all-reduce of data
# parallelism, say) could be in flight at once on one communicator, whose
# operations must not overlap. torch's (FLEXGEN_CP_COMM=torch or auto) saves
# a communicator's memory where nothing else uses the group meanwhile.
# Every rank reaches the same choice from the same inputs (environment,
# torch build, group options), which matters: the two ways start with
# different collectives.

_CP_LAYOUTS = {"contiguous": FG_CP_CONTIGUOUS, "zigzag": FG_CP_ZIGZAG}
_CP_MAX_WORLD = 64  # fg_cp_shard_rows' limit
_CP_MAX_LEN = 2 ** 31 - 1


def _cp_layout(layout):
    if not isinstance(layout, str) or layout not in _CP_LAYOUTS:
        raise ValueError(f"layout must be 'zigzag' or 'contiguous', not {layout!r}")
    return _CP_LAYOUTS[layout]


def _cp_int(value, name, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
    return value


def shard_rows(seq_len, world, rank, layout="zigzag"):
    """The rows of a sequence of `seq_len` rows that rank `rank` of `world`
    holds, as a list of (start, length) in the order they sit in its shard
    (fg_cp_shard_rows): one chunk under 'contiguous' (rank r holds the r-th
    of `world` consecutive chunks), two under 'zigzag' (chunks r and
    2 * world - 1 - r of 2 * world, which balances causal-like masks).
    Chunks are cut in units of 128 rows, the first ones taking a unit more
    when the units do not divide evenly, so a short sequence leaves some
    chunks empty (length 0). No GPU needed."""
    code = _cp_layout(layout)
    world = _cp_int(world, "world", 1, _CP_MAX_WORLD)
    rank = _cp_int(rank, "rank", 0, world - 1)
    seq_len = _cp_int(seq_len, "seq_len", 1, _CP_MAX_LEN)
    starts, lens = (ctypes.c_int64 * 2)(), (ctypes.c_int64 * 2)()
    n = ctypes.c_int()
    st = _function("fg_cp_shard_rows", "context parallelism")(code, world, rank, seq_len, starts,
                                                              lens, ctypes.byref(n))
    if st != FG_OK:
        raise FlexgenError(st, _status_name(st), f"fg_cp_shard_rows({layout}, world={world}, "
                                                 f"rank={rank}, seq_len={seq_len}) failed")
    return [(int(starts[i]), int(lens[i])) for i in range(n.value)]


def _seq_dim(x, dim):
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be a dimension of a {x.dim()}-D tensor, got {dim!r}")
    return dim % x.dim()


def shard(x, world, rank, layout="zigzag", dim=2):
    """Rank `rank`'s shard of a tensor over the whole sequence: the rows
    shard_rows gives it along `dim` (2 for [B, H, S, D], 1 for [B, S, H, D]),
    back to back, as a new contiguous tensor. Differentiable."""
    _need_torch()
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, not {type(x).__name__}")
    dim = _seq_dim(x, dim)
    pieces = [x.narrow(dim, start, n) for start, n in shard_rows(x.shape[dim], world, rank, layout)]
    return torch.cat(pieces, dim).contiguous()


def unshard(shards, layout="zigzag", dim=2):
    """The tensor over the whole sequence from every rank's shard (a list in
    rank order, as shard() cut them, or outputs of context_parallel_attention
    gathered from the ranks): shard()'s inverse. Differentiable."""
    _need_torch()
    if not isinstance(shards, (list, tuple)) or not shards:
        raise TypeError("shards must be a non-empty list of tensors, one per rank in rank order")
    for i, t in enumerate(shards):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"shards[{i}] must be a torch.Tensor, not {type(t).__name__}")
    dim = _seq_dim(shards[0], dim)
    world = len(shards)
    seq_len = sum(t.shape[dim] for t in shards)
    order = []  # the global row of each row of the shards put back to back
    for r, t in enumerate(shards):
        rows = shard_rows(seq_len, world, r, layout)
        held = sum(n for _, n in rows)
        if t.shape[dim] != held:
            raise ValueError(f"shards[{r}] has {t.shape[dim]} rows along dim {dim}, but rank {r} of "
                             f"{world} holds {held} of a {seq_len}-row sequence under the "
                             f"{layout!r} layout (flexgen.shard_rows)")
        order += [torch.arange(start, start + n) for start, n in rows]
    order = torch.cat(order)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(seq_len)
    whole = torch.cat(list(shards), dim)
    return whole.index_select(dim, inverse.to(whole.device))


# --- the communicator ------------------------------------------------------

_NCCL_UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES, nccl.h


class _NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * _NCCL_UNIQUE_ID_BYTES)]


class _CpComm:
    """How one (group, device) reaches its ncclComm_t: 'torch' (the group's
    own, read again at each call) or 'own' (made here, `own_pointer`)."""

    def __init__(self, kind, group, index, backend=None, own_pointer=None, nccl=None):
        self.kind, self.group, self.index = kind, group, index
        self.backend, self.own_pointer, self.nccl = backend, own_pointer, nccl

    def pointer(self):
        if self.kind == "own":
            return self.own_pointer
        with torch.cuda.device(self.index):
            ptr = self.backend._comm_ptr()
        if not ptr:
            raise RuntimeError(f"the process group has no NCCL communicator on cuda:{self.index} any "
                               f"more (destroyed or aborted?)")
        return ptr


_cp_comms = {}  # (id(group), device index) -> _CpComm; the entry keeps the group alive
_cp_comms_lock = threading.Lock()


def _loaded_nccl_path():
    """The file of the libnccl mapped into this process (torch's, when torch
    uses NCCL as a shared library), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libnccl.so"):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def _nccl_wheel_path():
    """libnccl.so.2 of the nvidia-nccl wheel, when it is installed."""
    try:
        import nvidia.nccl
    except ImportError:
        return None
    for folder in getattr(nvidia.nccl, "__path__", []):
        path = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(path):
            return path
    return None


def _same_file(a, b):
    try:
        return bool(a and b) and os.path.samefile(a, b)
    except OSError:
        return False


def _torch_comm_is_blocking(backend):
    """Whether ProcessGroupNCCL makes this group's communicators in NCCL's
    blocking mode, by the order of its own rules (useNonblocking): the
    group's pg_options config.blocking when set, else
    $TORCH_NCCL_USE_COMM_NONBLOCKING when set, else eager init (a bound
    device, init_process_group(device_id=...)) counts as non-blocking, which
    some releases choose by default there."""
    config = getattr(getattr(backend, "options", None), "config", None)
    blocking = getattr(config, "blocking", None)
    if blocking in (0, 1):
        return bool(blocking)
    env = os.environ.get("TORCH_NCCL_USE_COMM_NONBLOCKING", "").strip().lower()
    if env:
        return env not in ("1", "true", "yes", "on", "y")
    return getattr(backend, "bound_device_id", None) is None


def _nccl_check(nccl, result, what):
    if result != 0:
        nccl.ncclGetErrorString.restype = ctypes.c_char_p
        nccl.ncclGetErrorString.argtypes = [ctypes.c_int]
        text = (nccl.ncclGetErrorString(result) or b"").decode(errors="replace")
        raise RuntimeError(f"{what}: NCCL error {result}: {text}")


def _global_rank(group, rank):
    dist = torch.distributed
    fn = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return fn(group, rank)


def _own_comm(group, index, rank, world):
    """A communicator of our own for the group, through the libnccl the
    library will open. Collective: every rank of the group calls it."""
    path = (os.environ.get("FLEXGEN_NCCL_LIB") or _loaded_nccl_path() or _nccl_wheel_path()
            or "libnccl.so.2")
    try:
        nccl = ctypes.CDLL(path)
    except OSError as e:
        nccl, error = None, (f"NCCL could not be loaded from {path} ({e}); set FLEXGEN_NCCL_LIB "
                             f"to libnccl.so.2")
    if nccl is not None and not os.environ.get("FLEXGEN_NCCL_LIB"):
        # the file just loaded, by its path, so that the library's dlopen
        # finds this instance and not another copy
        os.environ["FLEXGEN_NCCL_LIB"] = _loaded_nccl_path() or path
    device = torch.device("cuda", index)
    with torch.cuda.device(index):
        # Rank 0 sends the unique id, or its error: the others would
        # otherwise wait in the broadcast forever.
        payload = [None]
        if rank == 0:
            if nccl is None:
                payload = [error]
            else:
                nccl.ncclGetUniqueId.restype = ctypes.c_int
                nccl.ncclGetUniqueId.argtypes = [ctypes.POINTER(_NcclUniqueId)]
                uid = _NcclUniqueId()
                result = nccl.ncclGetUniqueId(ctypes.byref(uid))
                payload = [bytes(uid) if result == 0 else f"ncclGetUniqueId: NCCL error {result}"]
        torch.distributed.broadcast_object_list(payload, src=_global_rank(group, 0), group=group,
                                                device=device)
        if nccl is None or isinstance(payload[0], str):
            raise RuntimeError(error if nccl is None else
                               f"rank 0 could not start the communicator: {payload[0]}")
        uid = _NcclUniqueId.from_buffer_copy(payload[0])
        nccl.ncclCommInitRank.restype = ctypes.c_int
        nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                          _NcclUniqueId, ctypes.c_int]
        comm = ctypes.c_void_p()
        _nccl_check(nccl, nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank),
                    "ncclCommInitRank")
    return _CpComm("own", group, index, own_pointer=comm.value, nccl=nccl)


def _torch_comm(group, backend, index):
    """The group's own communicator on cuda:index. Collective: every rank
    of the group calls it."""
    with torch.cuda.device(index):
        # makes the device's communicator if the group has none yet (lazy
        # init), on every rank alike
        torch.distributed.all_reduce(torch.zeros(1, device=torch.device("cuda", index)), group=group)
        ptr = backend._comm_ptr()
    if not ptr:
        raise RuntimeError(f"ProcessGroupNCCL._comm_ptr() is 0 on cuda:{index} after a collective there")
    return _CpComm("torch", group, index, backend=backend)


def _cp_comm(group, index, rank, world):
    """The _CpComm of (group, cuda:index), made on first use (see the
    section's comment for the choice)."""
    key = (id(group), index)
    with _cp_comms_lock:
        hit = _cp_comms.get(key)
    if hit is not None and hit.group is group:
        return hit
    mode = os.environ.get("FLEXGEN_CP_COMM", "").strip().lower() or "own"
    if mode not in ("auto", "torch", "own"):
        raise ValueError(f"FLEXGEN_CP_COMM must be auto, torch or own, not {mode!r}")
    backend = group._get_backend(torch.device("cuda", index))
    nccl_class = getattr(torch.distributed, "ProcessGroupNCCL", None)
    if nccl_class is None or not isinstance(backend, nccl_class):
        raise ValueError(f"the group's CUDA backend is {type(backend).__name__}, not ProcessGroupNCCL: "
                         f"context parallelism runs over NCCL")
    torch_nccl = _loaded_nccl_path()
    if torch_nccl and not os.environ.get("FLEXGEN_NCCL_LIB"):
        # The library dlopens $FLEXGEN_NCCL_LIB (else libnccl.so.2) at its
        # first NCCL call; pointing it at the file torch loaded gives it
        # torch's instance, the one a communicator of torch's belongs to.
        os.environ["FLEXGEN_NCCL_LIB"] = torch_nccl
    flexgen_nccl = os.environ.get("FLEXGEN_NCCL_LIB")
    why_not_torch = None
    if not hasattr(backend, "_comm_ptr"):
        why_not_torch = f"torch {torch.__version__}'s ProcessGroupNCCL has no _comm_ptr (torch 2.8 has)"
    elif torch_nccl is None:
        why_not_torch = "torch's NCCL is not a shared library of this process"
    elif not _same_file(flexgen_nccl, torch_nccl):
        why_not_torch = f"FLEXGEN_NCCL_LIB names {flexgen_nccl}, not torch's {torch_nccl}"
    elif not _torch_comm_is_blocking(backend):
        why_not_torch = ("the group's communicator may be non-blocking (pg_options config.blocking, "
                         "TORCH_NCCL_USE_COMM_NONBLOCKING or init_process_group(device_id=...))")
    if mode == "torch" and why_not_torch:
        raise ValueError(f"FLEXGEN_CP_COMM=torch, but the group's communicator cannot be used: "
                         f"{why_not_torch}")
    if mode == "own" or why_not_torch:
        entry = _own_comm(group, index, rank, world)
    else:
        entry = _torch_comm(group, backend, index)
    with _cp_comms_lock:
        _cp_comms[key] = entry
    return entry


# --- the call --------------------------------------------------------------

def _cp_group(group):
    """(group, rank, world) of a torch.distributed group (None: the default one)."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("context_parallel_attention needs torch.distributed initialised: call "
                         "torch.distributed.init_process_group('nccl', ...) in every process "
                         "(one per GPU) first")
    if group is None:
        group = dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup, not {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the group")
    world = dist.get_world_size(group)
    if world > _CP_MAX_WORLD:
        raise ValueError(f"the group has {world} ranks; context parallelism takes up to {_CP_MAX_WORLD}")
    return group, rank, world


def _check_shard(q, seq_len, world, rank, layout):
    held = sum(n for _, n in shard_rows(seq_len, world, rank, layout))
    if q.shape[2] != held:
        raise ValueError(f"rank {rank} of {world} holds {held} rows of a {seq_len}-row sequence under "
                         f"the {layout!r} layout (flexgen.shard_rows), but q has {q.shape[2]}: cut "
                         f"the shards with flexgen.shard(x, {world}, {rank}, {layout!r})")


def _cp_forward(call, q, k, v, want_lse=True):
    B, Hq, S, D = q.shape
    out = torch.empty((B, Hq, S, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device) if want_lse else None
    args = _AttentionArgs()
    _fill_args(args, q, k, v, out, lse, call.scale, None, call.binds,
               torch.cuda.current_stream(call.index).cuda_stream)
    cp = _CpArgs()
    cp.local = ctypes.pointer(args)
    cp.comm = call.comm.pointer()
    cp.global_len, cp.layout = call.seq_len, call.layout
    cp.plan = call.plan._handle if call.plan is not None else None
    fn = _function("fg_attention_forward_cp", "context parallelism")
    c = _ctx(call.index)
    try:
        with c.lock:
            c.check(fn(c.handle, call.mod.handle, ctypes.byref(cp)))
    finally:
        if call.plan is not None:
            call.plan._used(call.index)  # its masks may be read until here
    return out, lse


def _cp_backward(call, q, k, v, out, lse, dout, dlse, grads=None):
    """dq, dk, dv of the rank's shard (contiguous) from dout and dlse (either
    may be None: this rank's loss does not read that output); fills the
    buffer gradients in `grads` ({name: fp32 tensor}, the whole sequence's
    gradient on every rank)."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    fwd = _AttentionArgs()
    _fill_args(fwd, q, k, v, out, lse, call.scale, None, call.binds,
               torch.cuda.current_stream(call.index).cuda_stream)
    bwd, keep = _bwd_args(fwd, out, dout, dq, dk, dv, call.deterministic, dlse)
    cp = _CpBwdArgs()
    cp.local = ctypes.pointer(bwd)
    cp.comm = call.comm.pointer()
    cp.global_len, cp.layout = call.seq_len, call.layout
    cp.plan = call.plan._handle if call.plan is not None else None
    fn = _function("fg_attention_backward_cp", "the context-parallel backward")
    size_fn = _function("fg_attention_backward_workspace_size")
    c = _ctx(call.index)
    size = ctypes.c_size_t()
    try:
        # which buffers have a gradient, asked of the shard's own backward
        # (no launch, no communication); then one call of the ring
        left_out = _run_backward(
            c, call.mod, bwd, grads or {}, lambda: fn(c.handle, call.mod.handle, ctypes.byref(cp)),
            probe=lambda: size_fn(c.handle, call.mod.handle, ctypes.byref(bwd), ctypes.byref(size)))
    finally:
        if call.plan is not None:
            call.plan._used(call.index)  # its masks may be read until here
    for name in left_out:
        grads[name].zero_()
    return dq, dk, dv


class ContextParallelPlan:
    """The schedule of context_parallel_attention kept across calls
    (fg_cp_plan): the block masks of every chunk pair of the sequence and
    the ring's plan, made by context_parallel_plan() for one mod, parameter
    and buffer values, layout, group, sequence length and shard shape.
    Calls given it (plan=...) build nothing and do not synchronise with the
    host; the library checks it fits the call, but new parameter or buffer
    values (new document ids) need a new plan. Freed when it is no longer
    referenced, after the GPU work of the calls that used it."""

    def __init__(self, handle, call):
        self._handle = handle
        # what the plan was made with stays alive with it (not `call`,
        # which holds the plan: a cycle only the collector would free)
        self._keep = (call.mod, call.binds, call.comm)
        self._done = None

    def _used(self, index):
        if self._done is None:
            self._done = torch.cuda.Event()
        self._done.record(torch.cuda.current_stream(index))

    def close(self):
        """Free the plan now (after the GPU work that used it)."""
        handle, self._handle = self._handle, None
        if handle:
            if self._done is not None:
                self._done.synchronize()
            _function("fg_cp_plan_destroy", "context parallelism")(handle)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the process frees it
            pass


def _cp_make_plan(call, q, k, v):
    """A ContextParallelPlan for `call` on this shard (fg_cp_plan_create: the
    pair masks built on torch's current stream, one synchronisation)."""
    args = _AttentionArgs()
    # The plan reads the shapes, binds and stream; out is not written.
    _fill_args(args, q, k, v, q, None, call.scale, None, call.binds,
               torch.cuda.current_stream(call.index).cuda_stream)
    cp = _CpArgs()
    cp.local = ctypes.pointer(args)
    cp.comm = call.comm.pointer()
    cp.global_len, cp.layout = call.seq_len, call.layout
    handle = _P()
    fn = _function("fg_cp_plan_create", "context parallelism")
    c = _ctx(call.index)
    with c.lock:
        c.check(fn(c.handle, call.mod.handle, ctypes.byref(cp), ctypes.byref(handle)))
    return ContextParallelPlan(handle.value, call)


if torch is not None:

    class _ContextParallelFunction(torch.autograd.Function):
        """context_parallel_attention under autograd: the forward keeps the
        merged lse, which the sharded backward requires; the mod, bindings
        and communicator stay on ctx."""

        @staticmethod
        def forward(ctx, call, names, q, k, v, *buffers):
            out, lse = _cp_forward(call, q, k, v)
            ctx.set_materialize_grads(False)
            ctx.call, ctx.names = call, names
            ctx.save_for_backward(q, k, v, out, lse, *buffers)
            return out, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, dout, dlse):
            q, k, v, out, lse, *buffers = ctx.saved_tensors
            need = ctx.needs_input_grad
            grads = {n: torch.empty_like(b, dtype=torch.float32)
                     for n, b, wanted in zip(ctx.names, buffers, need[5:]) if wanted}
            # Every rank's backward is a step of the same ring, so it runs
            # (with dout = 0) even where this rank's loss ignores the output.
            dq, dk, dv = _cp_backward(ctx.call, q, k, v, out, lse, dout, dlse, grads)
            return (None, None, dq if need[2] else None, dk if need[3] else None, dv if need[4] else None,
                    *(grads.get(n) for n in ctx.names))


def _cp_prepare(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa, layout, group,
                seq_len, deterministic):
    """The checks of a context-parallel call and what it needs: the mod, the
    bindings, the communicator, the sequence length (see
    context_parallel_attention)."""
    _check_qkv(q, k, v, enable_gqa)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q has {q.shape[2]} rows and k/v {k.shape[2]}: a shard of self-attention "
                         f"holds the same rows of q, k and v")
    code = _cp_layout(layout)
    if seq_len is not None:
        _cp_int(seq_len, "seq_len", 1, _CP_MAX_LEN)
    if not isinstance(deterministic, int) or deterministic not in (0, 1):
        raise TypeError(f"deterministic must be a bool, not {deterministic!r}")
    _check_params(params, buffers)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be a float, not {type(scale).__name__}")
    group, rank, world = _cp_group(group)
    if seq_len is not None:
        _check_shard(q, seq_len, world, rank, layout)
    backend_name = str(torch.distributed.get_backend(group)).lower()
    if "nccl" not in backend_name:
        raise ValueError(f"the group's backend is {backend_name!r}: context parallelism runs over "
                         f"NCCL (init_process_group('nccl') or new_group(backend='nccl'))")
    _check_devices(q, k, v)
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    bound = getattr(group, "bound_device_id", None)
    if bound is not None and bound.index is not None and bound.index != index:
        raise ValueError(f"the group is bound to {bound}, but q, k, v are on cuda:{index}")
    if seq_len is None:
        # Every rank learns every rank's length and checks them all, so a
        # wrong shard stops every rank here rather than one, leaving the
        # others waiting in the ring.
        mine = torch.tensor([q.shape[2]], dtype=torch.int64, device=q.device)
        every = torch.empty(world, dtype=torch.int64, device=q.device)
        torch.distributed.all_gather_into_tensor(every, mine, group=group)
        lengths = every.tolist()
        seq_len = sum(lengths)
        for r, n in enumerate(lengths):
            held = sum(m for _, m in shard_rows(seq_len, world, r, layout))
            if n != held:
                raise ValueError(f"rank {r} of {world} has a shard of {n} rows, but holds {held} of the "
                                 f"{seq_len}-row sequence the ranks' shards make under the {layout!r} "
                                 f"layout (flexgen.shard_rows): cut the shards with flexgen.shard")
    comm = _cp_comm(group, index, rank, world)
    mod = load_mod(mask_mod, score_mod, params, buffers)
    binds = _Bindings(mod, params, buffers, device=index)
    return types.SimpleNamespace(mod=mod, binds=binds, scale=scale, comm=comm, seq_len=seq_len,
                                 layout=code, index=index, deterministic=bool(deterministic), plan=None)


def context_parallel_attention(q, k, v, mask_mod=None, score_mod=None, params=None, buffers=None,
                               scale=None, enable_gqa=False, layout="zigzag", group=None,
                               return_lse=False, seq_len=None, deterministic=False, plan=None):
    """attention() over one sequence spread across the ranks of a
    torch.distributed NCCL group, one process per GPU (ring attention,
    fg_attention_forward_cp). Every rank of the group calls it together,
    with the same mods, parameters and layout.

    q: (B, Hq, rows, D), k and v: (B, Hkv, rows, D), this rank's shard of
    the sequence's rows on the GPU the rank drives: shard(x, world, rank,
    layout) of the whole tensors, or rows made in that order (shard_rows).
    The mods see global positions. buffers (document ids, ...) cover the
    whole sequence and hold the same values on every rank. layout:
    'zigzag' (the choice for causal-like masks, whose work grows along the
    sequence) or 'contiguous' (masks with even work per row: no mask,
    windows shorter than a shard, short documents). group: the NCCL process
    group (default: the default group). seq_len: the whole sequence's rows;
    None finds it with an all_reduce of the shard lengths (a synchronisation
    more). Returns this rank's rows of the output (B, Hq, rows, D), and with
    return_lse its log-sum-exps (B, Hq, rows) float32; unshard() puts the
    ranks' pieces back in order.

    Differentiable with respect to q, k, v and float buffers that require
    grad (fg_attention_backward_cp): every rank must then run the backward
    too, since its steps exchange data with the others. A buffer is a
    parameter every rank holds a copy of; its gradient here is that of this
    rank's copy (the share of this rank's q rows, exact), and the ranks'
    gradients add up to the whole sequence's, as the gradient all-reduce of
    data parallelism over these ranks makes them. Runs on torch's current stream; without a plan the call
    synchronises with the host twice (the library builds the ring's plan
    from block masks on the GPU).

    The NCCL communicator is one made for the group on first use (a
    collective of the group), or the group's own with $FLEXGEN_CP_COMM=torch
    or auto (the comment of this section in flexgen.py says when each is
    right). Under torch.compile it is left out of the graph (a graph
    break): dynamo runs it as it is, ring and autograd included.

    plan: a ContextParallelPlan (context_parallel_plan) made for these
    mods, values and shapes: the call then builds no block masks and does
    not synchronise with the host. Without one, a call that will be
    differentiated makes one for its forward and backward to share."""
    if plan is not None and not isinstance(plan, ContextParallelPlan):
        raise TypeError(f"plan must be a flexgen.ContextParallelPlan, not {type(plan).__name__}")
    call = _cp_prepare(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa, layout, group,
                       seq_len, deterministic)
    k, v = k.contiguous(), v.contiguous()  # a K/V shard travels round the ring as it is
    grad = _wants_grad(q, k, v, buffers)
    if plan is not None:
        if plan._handle is None:
            raise ValueError("the plan was closed")
        call.plan = plan
    elif grad:
        call.plan = _cp_make_plan(call, q, k, v)
    if not grad:
        out, lse = _cp_forward(call, q, k, v, want_lse=return_lse)
    else:
        names = list(call.binds.buffers)
        out, lse = _ContextParallelFunction.apply(call, names, q, k, v,
                                                  *(call.binds.buffers[n] for n in names))
    return (out, lse) if return_lse else out


def _eager_only(fn):
    """fn left out of torch.compile's graphs (a graph break where a compiled
    model calls it): the ring's collective calls, host synchronisations and
    ctypes are not traceable, and eager is what they need."""
    if torch is not None and hasattr(torch, "compiler") and hasattr(torch.compiler, "disable"):
        return torch.compiler.disable(fn)
    return fn


context_parallel_attention = _eager_only(context_parallel_attention)


def context_parallel_plan(q, k, v, mask_mod=None, score_mod=None, params=None, buffers=None, scale=None,
                          enable_gqa=False, layout="zigzag", group=None, seq_len=None):
    """A ContextParallelPlan for context_parallel_attention calls with these
    arguments (the rank's shard q, k, v give the shapes and device; nothing
    is computed): the block masks of every chunk pair, built once on the GPU
    (one synchronisation), and the ring's schedule. Every rank of the group
    calls it together: it may all-gather the shard lengths (seq_len None)
    and makes the group's communicator on first use."""
    call = _cp_prepare(q, k, v, mask_mod, score_mod, params, buffers, scale, enable_gqa, layout, group,
                       seq_len, False)
    return _cp_make_plan(call, q, k.contiguous(), v.contiguous())


context_parallel_plan = _eager_only(context_parallel_plan)
