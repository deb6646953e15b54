"""test_flexgen.py -- the Python wrapper, as a specification.

Three layers, each run where it can be:
  - argument checks (torch, no library, no GPU): every bad call raises the
    documented exception naming the argument, before any library call;
  - the library through ctypes (libflexgen, no GPU): mods parse or fail with
    the library's status, offset and caret; the CPU block mask has the
    counts computed here from first principles and equals torch's
    create_block_mask; every torch twin in bench/torch_mods.py computes the
    same mask and score as its gallery mod under flexgen's evaluator;
  - the GPU: one attention call per gallery mod against the float64
    reference and torch's flex_attention, plus LSE, GQA, strides and the
    block-mask cache;
  - the backward: for every gallery mod (and a learned bias table), the
    gradients of q, k, v and of the float buffers, measured against float64
    autograd gradients, must be within 1.5 times (plus 1e-3) the error of
    torch.compile'd flex_attention's on the same inputs; deterministic runs
    repeat bit for bit; GQA, strides, buffers without a gradient, and the
    errors for what cannot be differentiated. The library's CPU reference
    backward is checked against float64 autograd without a GPU;
  - context parallelism: the shard helpers and the argument checks without
    a GPU; with two GPUs, two processes run the sharded forward and
    backward and match flexgen.attention on one GPU.

Run directly (python3 python/test_flexgen.py [-v]) or through meson (suite
cpu). Exit status: 0 when everything ran and passed, 1 on a failure, 77
(meson: skipped) when torch or the library is missing or the library is
built with sanitizers, so that a machine that cannot run these tests
never reports them as passed.
"""

import math
import os
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bench"))

try:
    import torch
except ImportError:
    torch = None

import flexgen  # noqa: E402

try:
    flexgen.library_path()
    HAVE_LIB = True
except flexgen.LibraryNotFound:
    HAVE_LIB = False

HAVE_GPU = bool(HAVE_LIB and torch is not None and torch.cuda.is_available())
if torch is not None:
    import torch_mods
    GALLERY = torch_mods.GALLERY
else:
    GALLERY = {}


def gallery_file(name):
    return os.path.join(ROOT, "mods", name + ".c")


needs_torch = unittest.skipIf(torch is None, "torch is not importable")
needs_lib = unittest.skipIf(not HAVE_LIB, "libflexgen not found (set FLEXGEN_LIB)")
needs_gpu = unittest.skipIf(not HAVE_GPU, "no CUDA device")


def _has_backward():
    try:
        return hasattr(flexgen._load(), "fg_attention_reference_backward")
    except flexgen.LibraryNotFound:
        return False


needs_backward = unittest.skipIf(not _has_backward(), "libflexgen has no backward pass")


# ---------------------------------------------------------------------------
# Argument checks: no library, no GPU
# ---------------------------------------------------------------------------

def _t(*shape, dtype=None, **kw):
    return torch.randn(*shape, dtype=dtype or torch.bfloat16, **kw)


def _bad_calls():
    """(what, call, exception, words in the message) -- each call is wrong in
    exactly one way, and the first check that fails names that way."""
    q = _t(1, 4, 32, 64)
    k = _t(1, 4, 32, 64)
    kv2 = _t(1, 2, 32, 64)
    kv3 = _t(1, 3, 32, 64)
    strided = _t(1, 4, 32, 128)[..., ::2]
    A = flexgen.attention
    return [
        ("q not a tensor", lambda: A([1.0], k, k), TypeError, "q must be a torch.Tensor"),
        ("v not a tensor", lambda: A(q, k, None), TypeError, "v must be a torch.Tensor"),
        ("q of rank 3", lambda: A(q[0], k, k), ValueError, "q must have 4 dimensions"),
        ("float32 inputs", lambda: A(q.float(), k.float(), k.float()), TypeError,
         "float16 or bfloat16"),
        ("mixed dtypes", lambda: A(q, k.half(), k.half()), TypeError, "share a dtype"),
        ("k and v shapes differ", lambda: A(q, k, _t(1, 4, 16, 64)), ValueError,
         "same shape"),
        ("batch sizes differ", lambda: A(q, _t(2, 4, 32, 64), _t(2, 4, 32, 64)), ValueError,
         "batch sizes differ"),
        ("head dims differ", lambda: A(q, _t(1, 4, 32, 32), _t(1, 4, 32, 32)), ValueError,
         "head dims differ"),
        ("GQA without enable_gqa", lambda: A(q, kv2, kv2), ValueError, "enable_gqa=True"),
        ("GQA ratio not whole", lambda: A(q, kv3, kv3, enable_gqa=True), ValueError,
         "multiple of k/v heads"),
        ("last dim not contiguous", lambda: A(strided, k, k), ValueError,
         "contiguous last dimension"),
        ("params not a dict", lambda: A(q, k, k, params=[("W", 1)]), TypeError,
         "params must be a dict"),
        ("buffers not a dict", lambda: A(q, k, k, buffers=3), TypeError,
         "buffers must be a dict"),
        ("buffer not a tensor", lambda: A(q, k, k, buffers={"ids": [1, 2]}), TypeError,
         "buffer 'ids' must be a torch tensor"),
        ("int64 buffer", lambda: A(q, k, k, buffers={"ids": torch.zeros(4, dtype=torch.int64)}),
         TypeError, "int32 or float32"),
        ("scale a string", lambda: A(q, k, k, scale="0.1"), TypeError, "scale must be a float"),
        ("block size zero", lambda: A(q, k, k, block_size=0), ValueError, "positive ints"),
        ("block size triple", lambda: A(q, k, k, block_size=(64, 64, 64)), TypeError,
         "block_size must be"),
        ("block_mask not a BlockMask", lambda: A(q, k, k, block_mask="causal"), TypeError,
         "block_mask must be a flexgen.BlockMask"),
        ("CPU tensors", lambda: A(q, k, k), ValueError, "must be a CUDA tensor"),
        ("deterministic a string", lambda: A(q, k, k, deterministic="yes"), TypeError,
         "deterministic must be a bool"),
        ("a scalar tensor requiring grad",
         lambda: A(q, k, k, params={"SOFTCAP": torch.tensor(20.0, requires_grad=True)}),
         ValueError, "gets no gradient"),
        ("prepare() on an input requiring grad",
         lambda: flexgen.prepare(_t(1, 4, 32, 64).requires_grad_(), k, k), ValueError,
         "outside autograd"),
    ]


@needs_torch
class ArgumentChecks(unittest.TestCase):
    def test_each_bad_call_names_its_argument(self):
        for what, call, exc, words in _bad_calls():
            with self.subTest(what):
                with self.assertRaises(exc) as cm:
                    call()
                self.assertIn(words, str(cm.exception))

    def test_a_good_call_fails_only_on_the_device(self):
        q = _t(2, 8, 64, 64)
        kv = _t(2, 2, 64, 64)
        with self.assertRaises(ValueError) as cm:
            flexgen.attention(q, kv, kv, enable_gqa=True, scale=0.1, block_size=(64, 128))
        self.assertIn("CUDA", str(cm.exception))

    def test_without_grad_a_tensor_scalar_is_only_a_value(self):
        q, k = _t(1, 4, 32, 64).requires_grad_(), _t(1, 4, 32, 64)
        cap = torch.tensor(20.0, requires_grad=True)
        for call in (lambda: flexgen.attention(q, k, k, params={"SOFTCAP": cap}),
                     lambda: flexgen.prepare(q, k, k, params={"SOFTCAP": cap})):
            with torch.no_grad(), self.assertRaises(ValueError) as cm:
                call()
            self.assertIn("CUDA", str(cm.exception))


# ---------------------------------------------------------------------------
# The library through ctypes: no GPU
# ---------------------------------------------------------------------------

def _src(body):
    return "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n    return " + body + ";\n}\n"


@needs_lib
class Mods(unittest.TestCase):
    def test_gallery_files_parse(self):
        for name in ("noop", "causal", "sliding_window", "document", "alibi", "softcap"):
            with self.subTest(name):
                m = flexgen.load_mod(gallery_file(name))
                self.assertEqual(m.name, name)
                self.assertTrue(m.has_mask or m.has_score)

    def test_parsed_once_per_text(self):
        a = flexgen.load_mod(_src("q_idx >= kv_idx"))
        b = flexgen.load_mod(_src("q_idx >= kv_idx"))
        self.assertIs(a, b)

    def test_reformatting_keeps_the_hash(self):
        a = flexgen.load_mod(_src("q_idx >= kv_idx"))
        b = flexgen.load_mod("/* causal */\n" + _src("(q_idx)   >=  kv_idx"))
        c = flexgen.load_mod(_src("q_idx > kv_idx"))
        self.assertEqual(a.hash, b.hash)
        self.assertNotEqual(a.hash, c.hash)

    def test_errors_carry_status_offset_and_caret(self):
        text = _src("q_idx >= kv_ix")
        with self.assertRaises(flexgen.FlexgenError) as cm:
            flexgen.load_mod(text)
        e = cm.exception
        self.assertEqual(e.status_name, "FG_ERR_NAME")
        self.assertEqual(e.offset, text.index("kv_ix"))
        self.assertIn("kv_ix", e.message)
        self.assertIn("^", e.diagnostic)
        self.assertIn("return q_idx >= kv_ix;", e.diagnostic)

    def test_unsupported_c_is_refused(self):
        bad = [
            ("a loop", "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
                       "    for (;;) {}\n    return true;\n}\n"),
            ("a string", _src('"x" == 0')),
            ("an unknown call", _src("system(0) == 0")),
        ]
        for what, text in bad:
            with self.subTest(what):
                with self.assertRaises(flexgen.FlexgenError):
                    flexgen.load_mod(text)

    def test_missing_file_is_an_error_not_an_expression(self):
        with self.assertRaises(FileNotFoundError):
            flexgen.load_mod("mods/no_such_mod.c")

    def test_expression_form_declares_params_from_values(self):
        m = flexgen.load_mod("q_idx >= kv_idx && q_idx - kv_idx <= W", params={"W": 2})
        self.assertEqual(m.params["W"][:2], ("scalar", "int"))
        got = m.eval_mask(5, 5, params={"W": 2})
        want = [[int(i >= j and i - j <= 2) for j in range(5)] for i in range(5)]
        self.assertEqual(got, want)

    def test_block_masks_broadcast_only_over_unread_dimensions(self):
        cases = [  # mask_mod, reads b, reads h
            (gallery_file("causal"), False, False),
            (gallery_file("alibi"), False, False),  # the score_mod reads h, the mask does not
            ("b == 0 && q_idx >= kv_idx", True, False),
            ("h % 2 == 0 || q_idx >= kv_idx", False, True),
        ]
        for text, b, h in cases:
            with self.subTest(text):
                m = flexgen.load_mod(text)
                self.assertEqual((m.mask_uses("b"), m.mask_uses("h")), (b, h))

    def test_param_checks(self):
        m = flexgen.load_mod(gallery_file("sliding_window"))
        scalar = next(n for n, p in m.params.items() if p[0] == "scalar")
        cases = [
            ("unknown name", {"NO_SUCH": 1}, ValueError, "has no parameter 'NO_SUCH'"),
            ("a string value", {scalar: "8"}, TypeError, "must be an int or float"),
            ("a fraction for an int", {scalar: 2.5}, ValueError, "is an int"),
        ]
        for what, params, exc, words in cases:
            with self.subTest(what):
                with self.assertRaises(exc) as cm:
                    m.eval_mask(4, 4, params=params)
                self.assertIn(words, str(cm.exception))

    def test_combining_a_mask_and_a_score(self):
        m = flexgen.load_mod(gallery_file("causal"), gallery_file("softcap"))
        self.assertTrue(m.has_mask and m.has_score)
        score_only = ("float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
                      "    return score * 0.5;\n}\n")
        with self.assertRaises(ValueError) as cm:
            flexgen.load_mod(score_only, gallery_file("softcap"))
        self.assertIn("defines no mask_mod", str(cm.exception))


@needs_lib
class ApproxMath(unittest.TestCase):
    @needs_lib
    def test_set_approx_math_respells_score_mod_only(self):
        try:
            flexgen.set_approx_math(True)
            src = flexgen.generate_source(gallery_file("softcap"))
            self.assertIn("#define FG_APPROX_MATH 1\n", src)
            self.assertIn("fg_tanh_approx(fg_fdiv_approx(score, p.SOFTCAP))", src)
            self.assertNotIn("FG_APPROX_MATH", flexgen.generate_source(gallery_file("softcap"), kernel="blockmask"))
        finally:
            flexgen.set_approx_math(False)
        self.assertNotIn("FG_APPROX_MATH", flexgen.generate_source(gallery_file("softcap")))
        with self.assertRaises(TypeError):
            flexgen.set_approx_math(2)


class CpuBlockMask(unittest.TestCase):
    def test_causal_counts_from_first_principles(self):
        for S, blk in ((1000, 128), (1024, 128), (256, 64), (129, 128)):
            with self.subTest(S=S, block=blk):
                bm = flexgen.block_mask(gallery_file("causal"), None, None, S, S,
                                        block_size=blk, device="cpu")
                nb = (S + blk - 1) // blk
                # Block (i, j) holds q in [i*blk, q1], kv in [j*blk, k1] (in range
                # only): all true when its first q is past its last kv, none
                # when its last q is before its first kv, else partial.
                partial, full = [0] * nb, [0] * nb
                for i in range(nb):
                    q0, q1 = i * blk, min(S, (i + 1) * blk) - 1
                    for j in range(nb):
                        k0, k1 = j * blk, min(S, (j + 1) * blk) - 1
                        if q0 >= k1:
                            full[i] += 1
                        elif q1 >= k0:
                            partial[i] += 1
                got_p = bm.array("kv_num_blocks")
                got_f = bm.array("full_kv_num_blocks")
                if torch is not None:
                    got_p, got_f = got_p.flatten().tolist(), got_f.flatten().tolist()
                self.assertEqual(got_p, partial)
                self.assertEqual(got_f, full)
                empty = nb * nb - sum(partial) - sum(full)
                self.assertAlmostEqual(bm.sparsity(), empty / (nb * nb))
                self.assertIn("#", bm.picture())

    @needs_torch
    def test_equal_to_torch_create_block_mask(self):
        from torch.nn.attention.flex_attention import create_block_mask
        for name, spec in GALLERY.items():
            st = spec.setup(1, 1, 1024, "cpu")
            if st.get("mask_mod") is None:
                continue
            with self.subTest(name):
                ours = flexgen.block_mask(spec.mask_file, None, None, 1024, 1024,
                                          params=st["params"], buffers=st["buffers"],
                                          device="cpu")
                theirs = create_block_mask(st["mask_mod"], None, None, 1024, 1024, device="cpu")
                for kind in ("", "full_"):
                    n_ours = ours.array(kind + "kv_num_blocks")
                    n_theirs = getattr(theirs, kind + "kv_num_blocks")
                    self.assertTrue(torch.equal(n_ours, n_theirs.to(torch.int32)),
                                    f"{kind}kv_num_blocks")
                    i_ours = ours.array(kind + "kv_indices")
                    i_theirs = getattr(theirs, kind + "kv_indices")
                    for r in range(n_ours.shape[-1]):
                        n = int(n_ours[0, 0, r])
                        self.assertEqual(sorted(i_ours[0, 0, r, :n].tolist()),
                                         sorted(i_theirs[0, 0, r, :n].tolist()))


def _index_grids(S):
    return (torch.arange(S).view(-1, 1), torch.arange(S).view(1, -1))


@needs_lib
@needs_torch
class TorchTwins(unittest.TestCase):
    """bench/torch_mods.py computes what mods/*.c compute: the benchmark
    compares like with like."""

    S = 256  # a square canvas (16 x 16) for the 2-D mods

    def test_every_gallery_mod_has_a_twin(self):
        files = sorted(f[:-2] for f in os.listdir(os.path.join(ROOT, "mods")) if f.endswith(".c"))
        self.assertEqual(sorted(GALLERY), files)

    def test_masks_and_scores_agree_with_the_evaluator(self):
        S, B, H = self.S, 2, 4
        qi, ki = _index_grids(S)
        g = torch.Generator().manual_seed(7)
        for name, spec in GALLERY.items():
            st = spec.setup(B, H, S, "cpu")
            mod = flexgen.load_mod(spec.mask_file, spec.score_file)
            for b, h in ((0, 0), (B - 1, H - 1)):
                with self.subTest(name, b=b, h=h):
                    bt, ht = torch.tensor(b).view(1, 1), torch.tensor(h).view(1, 1)
                    if mod.has_mask:
                        ours = torch.tensor(mod.eval_mask(S, S, b, h, st["params"], st["buffers"]),
                                            dtype=torch.bool)
                        theirs = torch.broadcast_to(st["mask_mod"](bt, ht, qi, ki), (S, S))
                        bad = (ours != theirs).nonzero()
                        self.assertEqual(bad.numel(), 0, f"mask differs at (q, kv) {bad[:4].tolist()}")
                    else:
                        self.assertIsNone(st.get("mask_mod"))
                    if mod.has_score:  # a twin without score_mod means the identity
                        scores = torch.randn(S, S, generator=g) * 4
                        ours = torch.tensor(mod.eval_score(scores.tolist(), b, h, st["params"],
                                                           st["buffers"]))
                        twin = st.get("score_mod") or (lambda s, *_: s)
                        theirs = twin(scores, bt, ht, qi, ki)
                        torch.testing.assert_close(ours, theirs.float(), rtol=1e-5, atol=1e-5)
                    else:
                        self.assertIsNone(st.get("score_mod"))


@needs_lib
@needs_torch
class BenchClockLog(unittest.TestCase):
    """compare_torch's ClockLog over a stand-in nvidia-smi on PATH: samples
    placed by their own timestamps, a line it cannot read left out, the
    settle gate, and nothing at all without nvidia-smi."""

    STAMP = "$(date '+%Y/%m/%d %H:%M:%S.%3N')"

    def with_path(self, folder, fn):
        old = os.environ["PATH"]
        os.environ["PATH"] = folder
        try:
            return fn()
        finally:
            os.environ["PATH"] = old

    def fake(self, d, body):
        path = os.path.join(d, "nvidia-smi")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body + "exec sleep 30\n")
        os.chmod(path, 0o755)

    def start(self, d):
        import compare_torch as ct
        return self.with_path(d + os.pathsep + os.environ["PATH"], lambda: ct.ClockLog(0))

    def test_parse(self):
        import compare_torch as ct
        t, mhz, reasons, watts = ct.ClockLog.parse("2026/11/28 04:43:30.328, 1755, 0x0000000000000004, 699.5\r\n")
        self.assertAlmostEqual(t, time.mktime(time.strptime("2026/11/28 04:43:30", "%Y/%m/%d %H:%M:%S")) + 0.328)
        self.assertEqual((mhz, reasons, watts), (1755.0, 4, 699.5))
        self.assertIsNone(ct.ClockLog.parse("not a sample"))
        self.assertIsNone(ct.ClockLog.parse("1980, 0x0"))

    def test_samples_inside_an_interval(self):
        with tempfile.TemporaryDirectory() as d:
            self.fake(d, f'echo "{self.STAMP}, 1980, 0x0000000000000000, 117.5"\n'
                         f'echo "{self.STAMP}, 1755, 0x0000000000000004, 699.0"\n'
                         "echo 'not a sample'\n"
                         'echo "2001/01/01 00:00:00.000, 1395, 0x0000000000000004, 700.0"\n')
            t0 = time.time() - 0.01  # the stamps are cut to milliseconds
            log = self.start(d)
            deadline = time.time() + 10
            while len(log.samples) < 3 and time.time() < deadline:
                time.sleep(0.01)
            got = log.between(t0, time.time())
            log.stop()
        self.assertEqual(got, {"median_mhz": 1980.0, "min_mhz": 1755.0, "samples": 2, "power_cap_share": 0.5,
                               "median_watts": 699.0})
        self.assertIsNone(log.between(0, 1))

    def test_settle_waits_for_the_power_to_fall(self):
        with tempfile.TemporaryDirectory() as d:
            self.fake(d, "i=0\nwhile [ $i -lt 8 ]; do\n"
                         f'  echo "{self.STAMP}, 1590, 0x0000000000000004, 695.0"; sleep 0.05; i=$((i+1))\n'
                         "done\nwhile true; do\n"
                         f'  echo "{self.STAMP}, 1980, 0x0000000000000000, 130.0"; sleep 0.05\n'
                         "done\n")
            log = self.start(d)
            waited = log.settle(250)
            last = log.samples[-1]
            log.stop()
        self.assertIsNotNone(waited)
        self.assertLess(waited, 5)
        self.assertEqual(last[1:], (1980.0, 0, 130.0))

    def test_settle_gives_up_at_its_timeout(self):
        with tempfile.TemporaryDirectory() as d:
            self.fake(d, "while true; do\n"
                         f'  echo "{self.STAMP}, 1590, 0x0000000000000004, 695.0"; sleep 0.05\n'
                         "done\n")
            log = self.start(d)
            waited = log.settle(250, timeout=0.3)
            log.stop()
        self.assertGreaterEqual(waited, 0.3)

    def test_without_nvidia_smi_nothing(self):
        import compare_torch as ct
        with tempfile.TemporaryDirectory() as d:
            log = self.with_path(d, lambda: ct.ClockLog(0))
        self.assertIsNone(log.proc)
        self.assertIsNone(log.between(0, time.time()))
        self.assertIsNone(log.settle(250))
        log.stop()


@needs_lib
@needs_torch
class CpuReference(unittest.TestCase):
    def test_reference_matches_torch_float64(self):
        import compare_torch as ct
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(1, 2, 96, 32, generator=g).bfloat16() for _ in range(3))
        for name in ("causal", "alibi", "softcap"):
            spec = GALLERY[name]
            st = spec.setup(1, 2, 96, "cpu")
            with self.subTest(name):
                out, lse = flexgen.reference(q, k, v, spec.mask_file, params=st["params"],
                                             buffers=st["buffers"])
                rows = torch.arange(96)
                for h in range(2):
                    ref = ct.reference_rows(q, k, v, 0, h, rows, st.get("mask_mod"),
                                            st.get("score_mod"), 1 / math.sqrt(32))
                    # The mods see float32 scores (their language is float), so
                    # the two float64 computations agree to float32 rounding.
                    torch.testing.assert_close(out[0, h], ref, rtol=1e-5, atol=1e-6)


@needs_lib
@needs_torch
@needs_backward
class CpuReferenceBackward(unittest.TestCase):
    """The library's float64 reference backward (score_mod's derivative
    through the evaluator) against float64 autograd through the torch mods."""

    def test_reference_backward_matches_torch_float64_autograd(self):
        import compare_torch as ct
        B, H, S, D = 1, 2, 96, 32
        g = torch.Generator().manual_seed(4)
        q, k, v, dout = (torch.randn(B, H, S, D, generator=g).bfloat16() for _ in range(4))
        for name in ("causal", "alibi", "softcap", "document"):
            spec = GALLERY[name]
            st = spec.setup(B, H, S, "cpu")
            floats = [n for n, t in st["buffers"].items() if t.is_floating_point()]
            with self.subTest(name):
                dq, dk, dv, dbuf = flexgen.reference_backward(
                    q, k, v, dout, spec.mask_file, params=st["params"], buffers=st["buffers"],
                    grad_buffers=floats)
                wrt = [st["buffers"][n].requires_grad_() for n in floats]
                want = [torch.zeros(t.shape, dtype=torch.float64) for t in (q, k, v, *wrt)]
                for b in range(B):
                    for h in range(H):
                        gq, gk, gv, gw = ct.reference_grads(q, k, v, dout, b, h,
                                                            st.get("mask_mod"),
                                                            st.get("score_mod"),
                                                            1 / math.sqrt(D), wrt)
                        want[0][b, h] = gq
                        want[1][b, h] += gk
                        want[2][b, h] += gv
                        for acc, x in zip(want[3:], gw):
                            acc += x
                got = [dq, dk, dv] + [dbuf[n] for n in floats]
                for label, x, y in zip(("dq", "dk", "dv", *floats), got, want):
                    # float32 inside the mods, float64 everywhere else
                    torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, msg=label)

    def test_reference_backward_refuses_what_has_no_gradient(self):
        B, H, S, D = 1, 2, 64, 32
        q, k, v, dout = (torch.randn(B, H, S, D).bfloat16() for _ in range(4))
        gate = torch.tensor([1.0, -1.0])
        with self.assertRaises(flexgen.FlexgenError) as cm:
            flexgen.reference_backward(q, k, v, dout, GATED_SCORE, buffers={"gate": gate,
                                       "gain": torch.ones(2)}, grad_buffers=["gate"])
        self.assertEqual(cm.exception.status_name, "FG_ERR_UNBOUND")


# ---------------------------------------------------------------------------
# The GPU
# ---------------------------------------------------------------------------

def _rel(x, ref):
    x, ref = x.double(), ref.double()
    return float(torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref))


@needs_gpu
class Gpu(unittest.TestCase):
    B, H, S, D = 2, 4, 1000, 64

    def inputs(self, seed, dtype=None, B=None, H=None, S=None, D=None, Hkv=None):
        B, H, S, D = B or self.B, H or self.H, S or self.S, D or self.D
        dtype = dtype or torch.bfloat16
        g = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(B, Hkv or H, S, D, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(B, Hkv or H, S, D, device="cuda", dtype=dtype, generator=g)
        return q, k, v

    def reference(self, q, k, v, st, b, h, rows=None):
        import compare_torch as ct
        rows = torch.arange(q.shape[2], device="cuda") if rows is None else rows
        return ct.reference_rows(q, k, v, b, h, rows, st.get("mask_mod"), st.get("score_mod"),
                                 1 / math.sqrt(q.shape[3]))

    def test_every_gallery_mod_matches_reference_and_flex(self):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        q, k, v = self.inputs(1)
        for name, spec in GALLERY.items():
            st = spec.setup(self.B, self.H, self.S, "cuda")
            with self.subTest(name):
                out = flexgen.attention(q, k, v, spec.mask_file, spec.score_file,
                                        st["params"], st["buffers"])
                bm = (create_block_mask(st["mask_mod"], None, None, self.S, self.S, device="cuda")
                      if st.get("mask_mod") else None)
                flex = flex_attention(q, k, v, score_mod=st.get("score_mod"), block_mask=bm)
                self.assertFalse(out.isnan().any())
                for b, h in ((0, 0), (self.B - 1, self.H - 1)):
                    self.assertLess(_rel(out[b, h], self.reference(q, k, v, st, b, h)), 1e-2)
                self.assertLess(_rel(out, flex), 2e-2)

    def test_approx_math_softcap_forward_and_backward(self):
        # tanh.approx's relative 2^-11 on scores within the cap (2 here)
        # stays inside the accurate kernels' tolerances (flexgen.h)
        q, k, v = self.inputs(9, dtype=torch.float16, S=300)
        spec = GALLERY["softcap"]
        st = spec.setup(self.B, self.H, 300, "cuda")
        params = dict(st["params"], SOFTCAP=2.0)
        st = dict(st, score_mod=lambda s, b, h, qi, ki: 2.0 * torch.tanh(s / 2.0))
        try:
            flexgen.set_approx_math(True)
            qg = q.detach().clone().requires_grad_()
            out = flexgen.attention(qg, k, v, spec.mask_file, spec.score_file, params, st["buffers"])
            out.float().sum().backward()
        finally:
            flexgen.set_approx_math(False)
        self.assertFalse(out.isnan().any() or qg.grad.isnan().any())
        for b, h in ((0, 0), (self.B - 1, self.H - 1)):
            self.assertLess(_rel(out[b, h], self.reference(q, k, v, st, b, h)), 2e-3)

    def test_lse_fp16_and_explicit_scale(self):
        q, k, v = self.inputs(2, dtype=torch.float16)
        spec = GALLERY["causal"]
        st = spec.setup(self.B, self.H, self.S, "cuda")
        out, lse = flexgen.attention(q, k, v, spec.mask_file, scale=0.05, return_lse=True)
        self.assertEqual(lse.shape, (self.B, self.H, self.S))
        self.assertEqual(lse.dtype, torch.float32)
        s = (q[0, 1].double() @ k[0, 1].double().T) * 0.05
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
        ref_lse = torch.logsumexp(s, dim=-1)
        ref = torch.softmax(s, dim=-1) @ v[0, 1].double()
        self.assertLess(_rel(out[0, 1], ref), 2e-3)
        self.assertLess(float((lse[0, 1].double() - ref_lse).abs().max()), 1e-3 * (1 + float(ref_lse.abs().max())))
        del st

    def test_gqa_and_bshd_strides(self):
        q, k, v = self.inputs(3, H=8, Hkv=2)
        spec = GALLERY["sliding_window"]
        st = spec.setup(self.B, 8, self.S, "cuda")
        out = flexgen.attention(q, k, v, spec.mask_file, params=st["params"], enable_gqa=True)
        for h in (0, 5):
            self.assertLess(_rel(out[1, h], self.reference(q, k, v, st, 1, h)), 1e-2)
        # The same tensors as BSHD views: same numbers.
        qs, ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        self.assertNotEqual(qs.stride(), q.stride())
        out2 = flexgen.attention(qs, ks, vs, spec.mask_file, params=st["params"], enable_gqa=True)
        self.assertTrue(torch.equal(out, out2))

    def test_decode_steps_contiguous_and_paged(self):
        """A decode step (queries at the end of the sequence, GQA 4) on the
        decode kernel, contiguous through q_offset and paged through a
        shuffled block table, against the float64 reference; then a ragged
        batch whose second sequence is shorter."""
        import compare_decode as cd
        B, Hq, Hkv, KV, D = 3, 8, 2, 1000, 128
        for name, Q in (("causal", 1), ("alibi", 4), ("sliding_window", 2)):
            spec = GALLERY[name]
            st = spec.setup(B, Hq, KV, "cuda")
            g = torch.Generator(device="cuda").manual_seed(Q)
            q = torch.randn(B, Hq, Q, D, device="cuda", dtype=torch.bfloat16, generator=g)
            k = torch.randn(B, Hkv, KV, D, device="cuda", dtype=torch.bfloat16, generator=g)
            v = torch.randn(B, Hkv, KV, D, device="cuda", dtype=torch.bfloat16, generator=g)
            ref = cd.reference(q, k, v, st.get("mask_mod"), st.get("score_mod"), KV - Q, 1 / math.sqrt(D))
            with self.subTest(name):
                call = flexgen.prepare(q, k, v, spec.mask_file, spec.score_file, st["params"], st["buffers"],
                                       enable_gqa=True, q_offset=KV - Q)
                self.assertEqual(call.kernel_kind, flexgen.FG_KERNEL_ATTENTION_DECODE)
                self.assertLess(_rel(call(), ref), 1e-2)
                kc, vc, table, lens = cd.paged_copy(k, v, 16, seed=Q)
                paged = flexgen.paged_attention(q, kc, vc, table, lens, spec.mask_file, spec.score_file,
                                                st["params"], st["buffers"])
                self.assertLess(_rel(paged, ref), 1e-2)
        # ragged: sequence 1 holds 600 keys; its queries sit at 599
        spec = GALLERY["causal"]
        st = spec.setup(B, Hq, KV, "cuda")
        lens = torch.tensor([KV, 600, KV], dtype=torch.int32, device="cuda")
        kc, vc, table, _ = cd.paged_copy(k, v, 64, seed=5)
        out = flexgen.paged_attention(q[:, :, :1], kc, vc, table, lens, spec.mask_file)
        short = cd.reference(q[1:2, :, :1], k[1:2, :, :600], v[1:2, :, :600], st.get("mask_mod"), None, 599,
                             1 / math.sqrt(D))
        self.assertLess(_rel(out[1:2], short), 1e-2)
        with self.assertRaises(ValueError):
            flexgen.paged_attention(q, kc, vc, table.to(torch.int64), lens, spec.mask_file)
        # a chunk of prefill into the same cache: 200 queries at the end of
        # each sequence, on the forward kernel
        g = torch.Generator(device="cuda").manual_seed(11)
        qp = torch.randn(B, Hq, 200, D, device="cuda", dtype=torch.bfloat16, generator=g)
        call = flexgen.prepare_paged(qp, kc, vc, table, lens, spec.mask_file)
        self.assertEqual(call.kernel_kind, flexgen.FG_KERNEL_ATTENTION_FWD)
        out = call()
        for b, n in enumerate(lens.tolist()):
            ref = cd.reference(qp[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], st.get("mask_mod"), None,
                               n - 200, 1 / math.sqrt(D))
            self.assertLess(_rel(out[b:b + 1], ref), 1e-2)

    def test_merge_of_two_halves_is_the_whole(self):
        NOOP = os.path.join(ROOT, "mods", "noop.c")
        q, k, v = self.inputs(7, S=300)
        parts = [flexgen.attention(q, k[:, :, a:b], v[:, :, a:b], NOOP, return_lse=True)
                 for a, b in ((0, 120), (120, 300))]
        out, lse = flexgen.merge([p[0] for p in parts], [p[1] for p in parts])
        whole, whole_lse = flexgen.attention(q, k, v, NOOP, return_lse=True)
        self.assertLess(_rel(out, whole), 1e-2)
        self.assertLess(float((lse - whole_lse).abs().max()), 1e-3 * (1 + float(whole_lse.abs().max())))
        with self.assertRaises(ValueError):
            flexgen.merge([parts[0][0]], [])

    def test_block_mask_cache_follows_buffer_versions(self):
        spec = GALLERY["document"]
        st = spec.setup(1, 2, 512, "cuda")
        q, k, v = self.inputs(4, B=1, H=2, S=512)
        name, ids = next(iter(st["buffers"].items()))
        flexgen.forget_memory_cache()
        flexgen.attention(q, k, v, spec.mask_file, params=st["params"], buffers=st["buffers"])
        cached = len(flexgen._bm_cache)
        out1 = flexgen.attention(q, k, v, spec.mask_file, params=st["params"], buffers=st["buffers"])
        self.assertEqual(len(flexgen._bm_cache), cached)  # a hit, not a new mask
        ids.zero_()  # one document: written in place, _version moves
        out2 = flexgen.attention(q, k, v, spec.mask_file, params=st["params"], buffers=st["buffers"])
        self.assertEqual(len(flexgen._bm_cache), cached + 1)
        causal = flexgen.attention(q, k, v, gallery_file("causal"))
        self.assertFalse(torch.equal(out1, out2))
        self.assertLess(_rel(out2, causal), 1e-6)

    def test_explicit_block_mask_is_reused(self):
        spec = GALLERY["causal"]
        q, k, v = self.inputs(5)
        bm = flexgen.block_mask(spec.mask_file, None, None, self.S, self.S)
        self.assertAlmostEqual(bm.sparsity(), 28 / 64)  # 8 x 8 blocks, 36 non-empty
        a = flexgen.attention(q, k, v, spec.mask_file, block_mask=bm)
        b = flexgen.attention(q, k, v, spec.mask_file)
        self.assertTrue(torch.equal(a, b))
        again = flexgen.prepare(q, k, v, spec.mask_file, block_mask=bm)
        self.assertTrue(torch.equal(again(), a))
        flexgen.forget_memory_cache()  # the prepared call fetches its kernel again
        self.assertTrue(torch.equal(again(), a))
        with self.assertRaises(ValueError):
            flexgen.attention(q[:, :, :500], k, v, spec.mask_file, block_mask=bm)

    def test_disk_cache_hit_after_forgetting_memory(self):
        with tempfile.TemporaryDirectory() as d:
            flexgen.set_cache_dir(d)
            try:
                flexgen.forget_memory_cache()
                flexgen.reset_cache_stats()
                q, k, v = self.inputs(6, B=1, H=1, S=128)
                flexgen.attention(q, k, v, gallery_file("causal"))
                self.assertGreaterEqual(flexgen.cache_stats()["misses"], 1)
                flexgen.forget_memory_cache()
                flexgen.reset_cache_stats()
                flexgen.attention(q, k, v, gallery_file("causal"))
                s = flexgen.cache_stats()
                self.assertEqual(s["misses"], 0)
                self.assertGreaterEqual(s["disk_hits"], 1)
            finally:
                flexgen.set_cache_dir(None)

    def test_library_errors_raise(self):
        q, k, v = self.inputs(7, B=1, H=1, S=64, D=64)
        with self.assertRaises(flexgen.FlexgenError) as cm:
            flexgen.attention(q, k, v, _src("q_idx >= kv_ix"))
        self.assertEqual(cm.exception.status_name, "FG_ERR_NAME")
        with self.assertRaises(ValueError):
            flexgen.attention(q, k, v, gallery_file("document"))  # buffer not given


# ---------------------------------------------------------------------------
# The backward
# ---------------------------------------------------------------------------

# A learned relative-position bias: one value per head and distance (T5,
# Swin), read at an index computed from q_idx and kv_idx.
REL_BIAS = """
const float *bias;  /* [heads][2 * SPAN - 1]: by head and kv_idx - q_idx */
int SPAN = 256;

float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
    return score + bias[h * (2 * SPAN - 1) + kv_idx - q_idx + SPAN - 1];
}

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    return q_idx >= kv_idx;
}
"""

# Float buffers of which only `gain` has a gradient: `gate` is only
# compared, `reach` only read by mask_mod.
GATED_SCORE = """
const float *gain;  /* [heads]: scales the scores of the open heads */
const float *gate;  /* [heads]: > 0 opens a head                    */

float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
    return gate[h] > 0.0 ? score * gain[h] : score;
}
"""
GATED = GATED_SCORE + """
const float *reach; /* [heads]: how far past itself a query sees    */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    return (float)(kv_idx - q_idx) <= reach[h];
}
"""


def _float_buffers(st):
    """The setup's float buffers, made leaves that require grad: the torch
    mods capture these very tensors, so flex and the float64 reference
    differentiate them too."""
    return {n: t.requires_grad_() for n, t in st["buffers"].items() if t.is_floating_point()}


@needs_gpu
class GpuBackward(unittest.TestCase):
    B, H, S, D = 2, 4, 256, 64

    def leaves(self, seed, B=None, H=None, Hkv=None, S=None, D=None, dtype=None):
        """q, k, v requiring grad, and a dout, random normal."""
        B, H, S, D = B or self.B, H or self.H, S or self.S, D or self.D
        dtype = dtype or torch.bfloat16
        g = torch.Generator(device="cuda").manual_seed(seed)

        def r(h):
            return torch.randn(B, h, S, D, device="cuda", dtype=dtype, generator=g)
        q, k, v = r(H).requires_grad_(), r(Hkv or H).requires_grad_(), r(Hkv or H).requires_grad_()
        return q, k, v, r(H)

    def reference(self, q, k, v, dout, st, wrt):
        """float64 gradients of q, k, v and `wrt` through the torch mods."""
        import compare_torch as ct
        B, H, _, D = q.shape
        group = H // k.shape[1]
        want = [torch.zeros(t.shape, dtype=torch.float64, device="cuda") for t in (q, k, v, *wrt)]
        for b in range(B):
            for h in range(H):
                gq, gk, gv, gw = ct.reference_grads(q, k, v, dout, b, h, st.get("mask_mod"),
                                                    st.get("score_mod"), 1 / math.sqrt(D), wrt)
                want[0][b, h] = gq
                want[1][b, h // group] += gk
                want[2][b, h // group] += gv
                for acc, x in zip(want[3:], gw):
                    acc += x
        return want

    # Inductor's default tiles for some captured buffers that require grad
    # need more shared memory than an H100 has (seen with the bias table:
    # 245760 bytes against 232448); fewer stages, then smaller tiles, fit.
    FLEX_OPTIONS = (None, {"num_stages": 1}, {"num_stages": 1, "BLOCK_M": 64, "BLOCK_N": 64})

    def flex(self, q, k, v, dout, st, wrt, enable_gqa=False):
        """torch.compile'd flex_attention's gradients of q, k, v and `wrt`."""
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        bm = None
        if st.get("mask_mod") is not None:
            bm = create_block_mask(st["mask_mod"], st.get("mask_b"), st.get("mask_h"),
                                   q.shape[2], k.shape[2], device="cuda")
        for options in self.FLEX_OPTIONS:
            torch._dynamo.reset()  # past dynamo's recompile limit flex would run eagerly
            try:
                out = torch.compile(flex_attention, dynamic=False)(
                    q, k, v, score_mod=st.get("score_mod"), block_mask=bm,
                    enable_gqa=enable_gqa, kernel_options=options)
                return torch.autograd.grad(out, [q, k, v, *wrt], dout)
            except Exception as e:
                if "out of resource" not in str(e) or options is self.FLEX_OPTIONS[-1]:
                    raise

    def assert_as_good_as_flex(self, label, names, ours, theirs, ref):
        for name, x, y, r in zip(names, ours, theirs, ref):
            self.assertFalse(x.isnan().any(), f"{label} {name}: NaN")
            e_ours, e_flex = _rel(x, r), _rel(y, r)
            self.assertLessEqual(e_ours, 1.5 * e_flex + 1e-3,
                                 f"{label} {name}: flexgen {e_ours:.2e}, flex {e_flex:.2e}")

    def test_every_gallery_mod_as_good_as_flex(self):
        q, k, v, dout = self.leaves(11)
        for name, spec in GALLERY.items():
            with self.subTest(name):
                st = spec.setup(self.B, self.H, self.S, "cuda")
                bufs = _float_buffers(st)
                wrt = list(bufs.values())
                out = flexgen.attention(q, k, v, spec.mask_file, spec.score_file, st["params"],
                                        st["buffers"])
                ours = torch.autograd.grad(out, [q, k, v, *wrt], dout)
                theirs = self.flex(q, k, v, dout, st, wrt)
                ref = self.reference(q, k, v, dout, st, wrt)
                self.assert_as_good_as_flex(name, ("dq", "dk", "dv", *bufs), ours, theirs, ref)

    def test_a_learned_bias_table(self):
        H, S = self.H, self.S
        q, k, v, dout = self.leaves(12)
        g = torch.Generator(device="cuda").manual_seed(13)
        bias = (0.5 * torch.randn(H * (2 * S - 1), device="cuda", generator=g)).requires_grad_()

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[h * (2 * S - 1) + kv_idx - q_idx + (S - 1)]

        def mask_mod(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
        st = {"mask_mod": mask_mod, "score_mod": score_mod}
        out = flexgen.attention(q, k, v, REL_BIAS, params={"SPAN": S}, buffers={"bias": bias})
        ours = torch.autograd.grad(out, [q, k, v, bias], dout)
        self.assertEqual(ours[3].shape, bias.shape)
        theirs = self.flex(q, k, v, dout, st, [bias])
        ref = self.reference(q, k, v, dout, st, [bias])
        self.assert_as_good_as_flex("bias table", ("dq", "dk", "dv", "bias"), ours, theirs, ref)

    def test_gqa(self):
        spec = GALLERY["alibi"]  # a slope per query head
        q, k, v, dout = self.leaves(16, H=8, Hkv=2)
        st = spec.setup(self.B, 8, self.S, "cuda")
        bufs = _float_buffers(st)
        wrt = list(bufs.values())
        out = flexgen.attention(q, k, v, spec.mask_file, params=st["params"],
                                buffers=st["buffers"], enable_gqa=True)
        ours = torch.autograd.grad(out, [q, k, v, *wrt], dout)
        self.assertEqual((ours[1].shape, ours[2].shape), (k.shape, v.shape))
        theirs = self.flex(q, k, v, dout, st, wrt, enable_gqa=True)
        ref = self.reference(q, k, v, dout, st, wrt)
        self.assert_as_good_as_flex("gqa", ("dq", "dk", "dv", *bufs), ours, theirs, ref)

    def test_deterministic_gradients_repeat_bit_for_bit(self):
        spec = GALLERY["alibi"]
        S = 1000  # not a multiple of the blocks
        q, k, v, dout = self.leaves(15, S=S)
        st = spec.setup(self.B, self.H, S, "cuda")
        bufs = _float_buffers(st)
        names = ("dq", "dk", "dv", *bufs)

        def run(deterministic):
            out = flexgen.attention(q, k, v, spec.mask_file, params=st["params"],
                                    buffers=st["buffers"], deterministic=deterministic)
            return torch.autograd.grad(out, [q, k, v, *bufs.values()], dout)
        first, second = run(True), run(True)
        for name, x, y in zip(names, first, second):
            self.assertTrue(torch.equal(x, y), f"{name} differs between two runs")
        for name, x, y in zip(names, first, run(False)):
            self.assertLess(_rel(y, x), 1e-2, name)

    def test_buffers_without_a_gradient_get_zeros(self):
        q, k, v, dout = self.leaves(14)
        gain = torch.tensor([1.5, 0.5, 1.25, 0.75], device="cuda", requires_grad=True)
        gate = torch.tensor([1.0, -1.0, 1.0, -1.0], device="cuda", requires_grad=True)
        reach = torch.tensor([0.0, 16.0, 64.0, 300.0], device="cuda", requires_grad=True)

        def twins(gain, gate, reach):
            def score_mod(score, b, h, q_idx, kv_idx):
                return torch.where(gate[h] > 0, score * gain[h], score)

            def mask_mod(b, h, q_idx, kv_idx):
                return (kv_idx - q_idx).float() <= reach[h]
            return {"score_mod": score_mod, "mask_mod": mask_mod}
        ref = self.reference(q, k, v, dout, twins(gain, gate, reach), [gain, gate, reach])
        theirs = self.flex(q, k, v, dout, twins(gain, gate.detach(), reach.detach()), [gain])
        runs = []
        for _ in range(2):  # the first call finds the refused buffers, the second knows them
            out = flexgen.attention(q, k, v, GATED, buffers={"gain": gain, "gate": gate,
                                                             "reach": reach},
                                    deterministic=True)
            runs.append(torch.autograd.grad(out, [q, k, v, gain, gate, reach], dout))
        for ours in runs:
            self.assertTrue(torch.equal(ours[4], torch.zeros_like(gate)))
            self.assertTrue(torch.equal(ours[5], torch.zeros_like(reach)))
            self.assert_as_good_as_flex("gated", ("dq", "dk", "dv", "gain"), ours[:4], theirs,
                                        ref[:4])
        for x, y in zip(*runs):
            self.assertTrue(torch.equal(x, y))

    def test_bshd_views_fp16_and_a_strided_dout(self):
        spec = GALLERY["softcap"]
        q, k, v, dout = self.leaves(17, dtype=torch.float16)
        st = spec.setup(self.B, self.H, self.S, "cuda")

        def run(q, k, v, dout):
            out = flexgen.attention(q, k, v, spec.mask_file, params=st["params"],
                                    deterministic=True)
            return torch.autograd.grad(out, [q, k, v], dout)
        base = run(q, k, v, dout)
        bshd = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
        views = [t.transpose(1, 2) for t in bshd]
        self.assertNotEqual(views[0].stride(), q.stride())
        wide = torch.zeros(*dout.shape[:3], 2 * dout.shape[3], dtype=dout.dtype, device="cuda")
        wide[..., ::2] = dout
        for name, x, y in zip(("dq", "dk", "dv"), base, run(*views, wide[..., ::2])):
            self.assertTrue(torch.equal(x, y), name)

    def test_a_loss_that_reads_the_lse(self):
        """d/d(q, k, v) of sum(dout * out) + sum(dlse * lse), and of the lse
        alone, against float64 autograd of the same causal attention."""
        B, H, S, D = 1, 2, 200, 64
        q, k, v, dout = self.leaves(19, B=B, H=H, S=S, D=D)
        dlse = torch.randn(B, H, S, device="cuda")
        out, lse = flexgen.attention(q, k, v, gallery_file("causal"), return_lse=True)
        x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
        s = x64[0] @ x64[1].transpose(-1, -2) / math.sqrt(D)
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool, device="cuda").tril(), -math.inf)
        lse64, out64 = torch.logsumexp(s, -1), torch.softmax(s, -1) @ x64[2]
        for outs, grads, outs64, grads64 in (
                ([out, lse], [dout, dlse], [out64, lse64], [dout.double(), dlse.double()]),
                ([lse], [dlse], [lse64], [dlse.double()])):
            got = torch.autograd.grad(outs, [q, k, v], grads, retain_graph=True)
            # the lse alone does not depend on v: float64 autograd gives None there
            want = torch.autograd.grad(outs64, x64, grads64, retain_graph=True, allow_unused=True)
            for name, x, r in zip("qkv", got, want):
                if r is None:
                    self.assertTrue(bool((x == 0).all()), f"d{name} with {len(outs)} outputs: not zero")
                else:
                    self.assertLess(_rel(x, r), 2e-2, f"d{name} with {len(outs)} outputs")

    def test_what_cannot_be_differentiated_raises(self):
        q, k, v, _ = self.leaves(18, B=1, H=2, S=128)
        causal = gallery_file("causal")
        out, lse = flexgen.attention(q, k, v, causal, return_lse=True)
        self.assertIsNotNone(out.grad_fn)
        # out alone is differentiable beside a returned lse; out.sum()'s dout
        # is a broadcast (stride 0) tensor.
        (dq,) = torch.autograd.grad(out.sum(), [q], retain_graph=True)
        self.assertTrue(dq.isfinite().all())
        # No second derivative.
        dout = torch.randn_like(out, requires_grad=True)
        (dq,) = torch.autograd.grad(out, [q], dout, create_graph=True)
        with self.assertRaisesRegex(RuntimeError, "once_differentiable"):
            dq.sum().backward()
        # Without grad, no autograd node.
        with torch.no_grad():
            self.assertIsNone(flexgen.attention(q, k, v, causal).grad_fn)

    def test_workspace_from_torch(self):
        """The backward's workspace (its fp32 dQ accumulator, B*H*S*D floats
        outside deterministic mode) comes from torch's caching allocator:
        torch's peak during the backward covers it beside dq, dk and dv
        (bf16), where the library's own pool would leave it out."""
        B, H, S, D = 2, 4, 1024, 128
        q, k, v, dout = self.leaves(19, B=B, H=H, S=S, D=D)
        out = flexgen.attention(q, k, v, gallery_file("causal"))
        want = torch.autograd.grad(out, [q, k, v], dout, retain_graph=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        got = torch.autograd.grad(out, [q, k, v], dout, retain_graph=True)
        torch.cuda.synchronize()
        n = B * H * S * D
        self.assertGreaterEqual(torch.cuda.max_memory_allocated() - base, 3 * 2 * n + 4 * n)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=0, atol=0.05)
        # deterministic: no accumulator, and bit-identical runs
        out = flexgen.attention(q, k, v, gallery_file("causal"), deterministic=True)
        a = torch.autograd.grad(out, [q, k, v], dout, retain_graph=True)
        b = torch.autograd.grad(out, [q, k, v], dout)
        for x, y in zip(a, b):
            self.assertTrue(torch.equal(x, y))



def _documents(S, seed):
    """int32 document ids of random lengths back to back, on the GPU."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, S // 2 + 2, (S,), generator=g)
    ids = torch.repeat_interleave(torch.arange(S), lens)[:S]
    return ids.to(torch.int32).cuda()


DOC_CAUSAL = "doc[q_idx] == doc[kv_idx] && q_idx >= kv_idx && q_idx - kv_idx <= WINDOW"
ALIBI = "score + slopes[h] * (float)(kv_idx - q_idx)"


@unittest.skipUnless(HAVE_GPU and hasattr(torch.library, "custom_op") and _has_backward(),
                     "needs a GPU, torch.library.custom_op and a library with the backward")
class TorchCompile(unittest.TestCase):
    """flexgen.attention inside torch.compile(fullgraph=True): one graph
    (the custom op flexgen::attention), the same results as eager, forward
    and backward."""

    class Block(torch.nn.Module if torch is not None else object):
        """A transformer block's attention half: qkv projection, document
        + causal + window mask, ALiBi with learned slopes, output projection,
        residual."""

        def __init__(self, H=4, D=64):
            super().__init__()
            self.H, self.D = H, D
            self.qkv = torch.nn.Linear(H * D, 3 * H * D, bias=False, dtype=torch.bfloat16)
            self.proj = torch.nn.Linear(H * D, H * D, bias=False, dtype=torch.bfloat16)
            self.slopes = torch.nn.Parameter(torch.tensor([2.0 ** (-8 * (i + 1) / H) for i in range(H)]))

        def forward(self, x, doc):
            B, S, _ = x.shape
            q, k, v = self.qkv(x).view(B, S, 3, self.H, self.D).permute(2, 0, 3, 1, 4)
            o = flexgen.attention(q, k, v, mask_mod=DOC_CAUSAL, score_mod=ALIBI, params={"WINDOW": 96},
                                  buffers={"doc": doc, "slopes": self.slopes})
            return x + self.proj(o.transpose(1, 2).reshape(B, S, self.H * self.D))

    def run_block(self, block, x, doc):
        y = block(x, doc)
        grads = torch.autograd.grad(y.float().square().mean(), [x, *block.parameters()])
        return [y, *grads]

    def test_a_block_compiles_to_one_graph_with_eager_results(self):
        torch.manual_seed(0)
        block = self.Block().cuda()
        x = torch.randn(2, 256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        doc = _documents(256, 3)
        eager = self.run_block(block, x, doc)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(block)(x, doc)
        self.assertEqual(explained.graph_break_count, 0, str(explained.break_reasons))
        self.assertEqual(explained.graph_count, 1)
        torch._dynamo.reset()
        compiled = self.run_block(torch.compile(block, fullgraph=True), x, doc)
        for name, a, b in zip(["y", "dx", "dqkv", "dproj", "dslopes"], compiled, eager):
            self.assertFalse(a.isnan().any(), name)
            self.assertLess(_rel(a, b), 2e-2, name)
        # The attention itself is the same op in both: at the op's inputs the
        # results are equal bit for bit.
        q, k, v = (torch.randn(1, 4, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        args = dict(mask_mod=DOC_CAUSAL, score_mod=ALIBI, params={"WINDOW": 96},
                    buffers={"doc": _documents(300, 4), "slopes": block.slopes.detach()}, return_lse=True)
        e_out, e_lse = flexgen.attention(q, k, v, **args)
        c_out, c_lse = torch.compile(lambda q, k, v: flexgen.attention(q, k, v, **args), fullgraph=True)(q, k, v)
        self.assertTrue(torch.equal(e_out, c_out))
        self.assertTrue(torch.equal(e_lse, c_lse))

    def test_block_mask_objects_lse_and_decode_under_compile(self):
        S = 512
        doc = _documents(S, 5)
        bm = flexgen.block_mask(DOC_CAUSAL, 1, 1, S, S, params={"WINDOW": 200}, buffers={"doc": doc})
        q, k, v = (torch.randn(2, 4, S, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout, dlse = torch.randn_like(q), torch.randn(2, 4, S, device="cuda")

        def f(q, k, v):
            return flexgen.attention(q, k, v, DOC_CAUSAL, params={"WINDOW": 200}, buffers={"doc": doc},
                                     block_mask=bm, return_lse=True)
        torch._dynamo.reset()
        outs = [f(q, k, v), torch.compile(f, fullgraph=True)(q, k, v)]
        grads = [torch.autograd.grad(o, [q, k, v], [dout, dlse]) for o in outs]
        for a, b in zip(outs[0], outs[1]):  # the same kernel on the same inputs
            self.assertTrue(torch.equal(a, b))
        for a, b in zip(grads[0], grads[1]):  # dq's fp32 atomics may add in another order
            self.assertLess(_rel(a, b), 1e-2)
        # A decode step (4 queries at the end of 4096 keys) compiles too.
        kq = torch.randn(2, 2, 4096, 128, device="cuda", dtype=torch.bfloat16)
        qd = torch.randn(2, 8, 4, 128, device="cuda", dtype=torch.bfloat16)

        def step(q, k, v):
            return flexgen.attention(q, k, v, "q_idx >= kv_idx", enable_gqa=True, q_offset=4092)
        torch._dynamo.reset()
        self.assertTrue(torch.equal(step(qd, kq, kq), torch.compile(step, fullgraph=True)(qd, kq, kq)))

    def test_opcheck(self):
        q, k, v = (torch.randn(1, 2, 130, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        slopes = torch.tensor([0.5, 0.25], device="cuda", requires_grad=True)
        args = (q, k, v, [slopes], "q_idx >= kv_idx", ALIBI, "", [], "", [], "slopes", None, False,
                [128, 128], 0, -1, False)
        torch.library.opcheck(torch.ops.flexgen.attention.default, args,
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))


@unittest.skipUnless(HAVE_GPU, "needs a GPU")
class CudaGraphs(unittest.TestCase):
    """flexgen.attention captured with torch.cuda.graph and replayed with
    new inputs written into the captured tensors, each replay against the
    CPU float64 reference."""

    def capture(self, fn):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the kernels compiled and cached first
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        return g, out

    def check(self, out, q, k, v, **ref_args):
        want, _ = flexgen.reference(q.cpu(), k.cpu(), v.cpu(), **ref_args)
        self.assertFalse(out.isnan().any())
        self.assertLess(_rel(out.cpu().double(), want), 1e-2)

    def test_forward_and_decode_replays(self):
        for Q, KV, mods in ((256, 256, dict(mask_mod="q_idx >= kv_idx", score_mod=ALIBI)),
                            (1, 4096, dict(score_mod=ALIBI))):  # a decode step: split walk + merge
            q = torch.empty(2, 8, Q, 64, device="cuda", dtype=torch.bfloat16)
            k = torch.empty(2, 2, KV, 64, device="cuda", dtype=torch.bfloat16)
            v = torch.empty_like(k)
            slopes = torch.tensor([2.0 ** -i for i in range(8)], device="cuda")
            for t in (q, k, v):
                t.normal_()
            g, out = self.capture(lambda: flexgen.attention(q, k, v, **mods, buffers={"slopes": slopes},
                                                            enable_gqa=True))
            for i in range(20):
                for t in (q, k, v):
                    t.normal_()
                slopes.uniform_(0.01, 0.5)
                out.fill_(float("nan"))
                g.replay()
                torch.cuda.synchronize()
                self.check(out, q, k, v, **mods, buffers={"slopes": slopes.cpu()}, enable_gqa=True)

    def test_block_mask_rebuild_replays(self):
        S = 384
        doc = _documents(S, 7)
        args = dict(params={"WINDOW": S}, buffers={"doc": doc})
        bm = flexgen.block_mask(DOC_CAUSAL, 1, 1, S, S, **args)
        q, k, v = (torch.randn(1, 4, S, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))

        def step():
            bm.rebuild(**args)
            return flexgen.attention(q, k, v, DOC_CAUSAL, block_mask=bm, **args)
        g, out = self.capture(step)
        for i in range(20):
            doc.copy_(_documents(S, 100 + i))
            for t in (q, k, v):
                t.normal_()
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            self.check(out, q, k, v, mask_mod=DOC_CAUSAL, params={"WINDOW": S}, buffers={"doc": doc.cpu()})


# ---------------------------------------------------------------------------
# Context parallelism: shards on the CPU; two GPUs against one
# ---------------------------------------------------------------------------

def _has_cp(names=("fg_cp_shard_rows", "fg_attention_forward_cp", "fg_attention_backward_cp")):
    try:
        lib = flexgen._load()
    except flexgen.LibraryNotFound:
        return False
    return all(hasattr(lib, n) for n in names)


def _expected_chunks(S, chunks, unit=128):
    """(start, length) of each of `chunks` chunks of S rows, from the rule
    in flexgen.h: units of 128 rows, the first units % chunks chunks taking
    one unit more, the last unit holding what is left."""
    units = -(-S // unit)
    base, rem = divmod(units, chunks)
    out, u = [], 0
    for c in range(chunks):
        n = base + (c < rem)
        a, b = min(u * unit, S), min((u + n) * unit, S)
        out.append((a, b - a))
        u += n
    return out


def _dist_initialized():
    return (torch is not None and torch.distributed.is_available()
            and torch.distributed.is_initialized())


# The 2-GPU cases: (gallery mod, layout, params, k/v heads (None: as q),
# whether the loss also reads the lse, seq_len given or found by the call).
CP_CASES = (
    ("causal", "zigzag", {}, None, True, True),
    ("sliding_window", "contiguous", {"WINDOW": 200}, None, False, True),
    ("document", "zigzag", {}, 2, False, False),
    ("document", "contiguous", {}, None, False, True),
    ("alibi", "zigzag", {}, None, True, True),  # slopes learnt: a buffer gradient per rank
)
CP_SHAPE = (2, 4, 1000, 64)  # B, H, S, D: S not a multiple of the 128-row units


def _cp_label(case):
    return f"{case[0]}/{case[1]}"


def _cp_inputs(seed=31):
    """The whole-sequence q, k, v, dout, dlse of every case, on the CPU."""
    B, H, S, D = CP_SHAPE
    g = torch.Generator().manual_seed(seed)
    data = {}
    for case in CP_CASES:
        hkv = case[3] or H

        def r(*shape):
            return torch.randn(*shape, generator=g).to(torch.bfloat16)
        data[_cp_label(case)] = {"q": r(B, H, S, D), "k": r(B, hkv, S, D), "v": r(B, hkv, S, D),
                                 "dout": r(B, H, S, D), "dlse": torch.randn(B, H, S, generator=g)}
    return data


def _cp_call(case, q, k, v, buffers, **kw):
    name, layout, params, hkv, _, _ = case
    return flexgen.context_parallel_attention(q, k, v, gallery_file(name), params=params,
                                              buffers=buffers, enable_gqa=hkv is not None,
                                              layout=layout, return_lse=True, **kw)


def _cp_worker(rank, world, folder):
    """One rank of the 2-GPU test (torch.multiprocessing, spawned): every
    case's forward and backward on this rank's shard, written to
    rank{rank}.pt as CPU tensors for the parent to put together."""
    dist = torch.distributed
    torch.cuda.set_device(rank)
    # no device_id: the group's communicator is made lazily, in NCCL's
    # blocking mode, so the calls use torch's own (unless the environment
    # says otherwise; see flexgen's "Context parallelism" section)
    dist.init_process_group("nccl", init_method=f"file://{folder}/store", rank=rank,
                            world_size=world)
    try:
        data = torch.load(os.path.join(folder, "inputs.pt"))
        dev = torch.device("cuda", rank)
        B, H, S, D = CP_SHAPE
        results = {}
        for case in CP_CASES:
            name, layout, _, _, reads_lse, give_len = case
            x = data[_cp_label(case)]
            cut = {n: flexgen.shard(t, world, rank, layout, dim=2).to(dev) for n, t in x.items()}
            leaves = [cut[n].requires_grad_() for n in ("q", "k", "v")]
            buffers = GALLERY[name].setup(B, H, S, dev)["buffers"]  # the whole sequence's
            learnt = {n: b.clone().requires_grad_() for n, b in buffers.items() if b.is_floating_point()}
            buffers.update(learnt)
            out, lse = _cp_call(case, *leaves, buffers, seq_len=S if give_len else None)
            outs, grads = (([out, lse], [cut["dout"], cut["dlse"]]) if reads_lse
                           else ([out], [cut["dout"]]))
            dq, dk, dv, *dbuf = torch.autograd.grad(outs, leaves + list(learnt.values()), grads)
            results[_cp_label(case)] = {n: t.detach().cpu() for n, t in
                                        (("out", out), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv))}
            results[_cp_label(case)].update({"d" + n: g.cpu() for n, g in zip(learnt, dbuf)})
        # The first case's forward again through the group's own
        # communicator where it is safe (FLEXGEN_CP_COMM=auto; the other way
        # to the group's NCCL): the same numbers.
        case = CP_CASES[0]
        x = data[_cp_label(case)]
        q, k, v = (flexgen.shard(x[n], world, rank, case[1]).to(dev) for n in ("q", "k", "v"))
        results["comm_kinds"] = sorted({e.kind for e in flexgen._cp_comms.values()})
        with torch.no_grad():
            os.environ["FLEXGEN_CP_COMM"] = "auto"
            flexgen._cp_comms.clear()
            out, _ = _cp_call(case, q, k, v, {}, seq_len=S)
            results["auto_comm_out"] = out.cpu()
        results["auto_comm_kinds"] = sorted({e.kind for e in flexgen._cp_comms.values()})
        # The second case with a plan made once and used twice
        # (context_parallel_plan): the same kernels, so the same numbers.
        case = CP_CASES[1]
        x = data[_cp_label(case)]
        q, k, v = (flexgen.shard(x[n], world, rank, case[1]).to(dev) for n in ("q", "k", "v"))
        plan = flexgen.context_parallel_plan(q, k, v, gallery_file(case[0]), params=case[2],
                                             layout=case[1], seq_len=S)
        with torch.no_grad():
            results["plan_outs"] = [_cp_call(case, q, k, v, {}, seq_len=S, plan=plan)[0].cpu()
                                    for _ in range(2)]
        plan.close()
        torch.save(results, os.path.join(folder, f"rank{rank}.pt"))
        dist.barrier(device_ids=[rank])
    finally:
        dist.destroy_process_group()


def _two_gpus():
    return (HAVE_GPU and torch.cuda.device_count() >= 2 and torch.distributed.is_available()
            and torch.distributed.is_nccl_available() and _has_cp())


@unittest.skipUnless(_has_cp(("fg_cp_shard_rows",)), "libflexgen has no context parallelism")
class ContextParallel(unittest.TestCase):
    """Shards (shard_rows, shard, unshard) and the argument checks of
    context_parallel_attention run anywhere; the sharded forward and
    backward on two GPUs are checked against the same attention on one."""

    LAYOUTS = ("contiguous", "zigzag")

    def test_shard_rows_follow_the_documented_rule(self):
        for layout in self.LAYOUTS:
            for world in (1, 2, 3, 4, 7):
                for S in (1, 127, 128, 129, 1000, 1001, 4097, 65537):
                    with self.subTest(layout=layout, world=world, S=S):
                        count = 2 * world if layout == "zigzag" else world
                        chunks = _expected_chunks(S, count)
                        covered = []
                        for rank in range(world):
                            rows = flexgen.shard_rows(S, world, rank, layout)
                            ids = [rank, count - 1 - rank] if layout == "zigzag" else [rank]
                            self.assertEqual(rows, [chunks[c] for c in ids])
                            covered += [r for a, n in rows for r in range(a, a + n)]
                        self.assertEqual(sorted(covered), list(range(S)))  # every row once

    def test_shard_rows_rejects_bad_arguments(self):
        for args, words in (((1000, 0, 0), "world"), ((1000, 65, 0), "world"),
                            ((1000, 2, 2), "rank"), ((1000, 2, -1), "rank"), ((0, 2, 0), "seq_len"),
                            ((2 ** 31, 2, 0), "seq_len"), ((1000.0, 2, 0), "seq_len"),
                            ((1000, True, 0), "world")):
            with self.subTest(args=args), self.assertRaises(ValueError) as cm:
                flexgen.shard_rows(*args)
            self.assertIn(words, str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            flexgen.shard_rows(1000, 2, 0, "diagonal")
        self.assertIn("'zigzag' or 'contiguous'", str(cm.exception))

    @needs_torch
    def test_shard_and_unshard_round_trip(self):
        for layout in self.LAYOUTS:
            for world in (1, 2, 3, 4):
                for S in (1, 129, 1000, 1001):
                    with self.subTest(layout=layout, world=world, S=S):
                        x = torch.arange(2 * 3 * S * 4).reshape(2, 3, S, 4)
                        parts = [flexgen.shard(x, world, r, layout) for r in range(world)]
                        for r, p in enumerate(parts):
                            held = sum(n for _, n in flexgen.shard_rows(S, world, r, layout))
                            self.assertEqual(tuple(p.shape), (2, 3, held, 4))
                            self.assertTrue(p.is_contiguous())
                        self.assertTrue(torch.equal(flexgen.unshard(parts, layout), x))
                        # BSHD: the sequence on dim 1
                        xs = x.transpose(1, 2)
                        parts = [flexgen.shard(xs, world, r, layout, dim=1) for r in range(world)]
                        self.assertTrue(torch.equal(flexgen.unshard(parts, layout, dim=1), xs))

    @needs_torch
    def test_shard_and_unshard_are_differentiable(self):
        x = torch.randn(1, 2, 1000, 8, requires_grad=True)
        g = torch.randn(1, 2, 1000, 8)
        y = flexgen.unshard([flexgen.shard(x, 3, r, "zigzag") for r in range(3)], "zigzag")
        y.backward(g)
        self.assertTrue(torch.equal(x.grad, g))

    @needs_torch
    def test_unshard_rejects_shards_of_the_wrong_size(self):
        x = torch.zeros(1, 1, 1000, 4)
        parts = [flexgen.shard(x, 2, r, "zigzag") for r in range(2)]
        with self.assertRaises(ValueError) as cm:
            flexgen.unshard([parts[0], parts[1][:, :, 1:]], "zigzag")
        self.assertIn("under the 'zigzag' layout", str(cm.exception))
        with self.assertRaises(TypeError):
            flexgen.unshard([], "zigzag")

    @needs_torch
    @unittest.skipUnless(hasattr(torch, "compile") if torch is not None else False, "no torch.compile")
    @unittest.skipIf(_dist_initialized(), "torch.distributed is initialised in this process")
    def test_compiled_models_run_it_eagerly(self):
        """Under torch.compile the sharded call is a graph break, not an
        error: dynamo runs it as it is (here it then says torch.distributed
        is not initialised, as eager does)."""
        q = _t(1, 4, 256, 64)

        def model(x):
            return flexgen.context_parallel_attention(x, x, x, gallery_file("causal")) * 2
        with self.assertRaises(ValueError) as cm:
            torch.compile(model, backend="eager")(q)
        self.assertIn("torch.distributed initialised", str(cm.exception))

    @needs_torch
    @unittest.skipIf(_dist_initialized(), "torch.distributed is initialised in this process")
    def test_arguments_checked_before_distributed(self):
        """Each bad call raises before torch.distributed is needed; a good
        one then says torch.distributed is not initialised."""
        q = _t(1, 4, 640, 64)
        kv2 = _t(1, 2, 640, 64)
        CPA = flexgen.context_parallel_attention
        for what, call, exc, words in (
                ("q not a tensor", lambda: CPA([1.0], q, q), TypeError, "q must be a torch.Tensor"),
                ("float32", lambda: CPA(q.float(), q.float(), q.float()), TypeError,
                 "float16 or bfloat16"),
                ("GQA without enable_gqa", lambda: CPA(q, kv2, kv2), ValueError, "enable_gqa=True"),
                ("rows differ", lambda: CPA(q, q[:, :, :512], q[:, :, :512]), ValueError,
                 "same rows"),
                ("unknown layout", lambda: CPA(q, q, q, layout="ring"), ValueError,
                 "'zigzag' or 'contiguous'"),
                ("seq_len zero", lambda: CPA(q, q, q, seq_len=0), ValueError, "seq_len"),
                ("deterministic a string", lambda: CPA(q, q, q, deterministic="yes"), TypeError,
                 "deterministic must be a bool"),
                ("buffers not a dict", lambda: CPA(q, q, q, buffers=3), TypeError,
                 "buffers must be a dict"),
                ("scale a string", lambda: CPA(q, q, q, scale="0.1"), TypeError,
                 "scale must be a float"),
                ("torch.distributed not initialised", lambda: CPA(q, q, q, gallery_file("causal")),
                 ValueError, "torch.distributed initialised")):
            with self.subTest(what), self.assertRaises(exc) as cm:
                call()
            self.assertIn(words, str(cm.exception))

    @needs_torch
    @unittest.skipIf(_dist_initialized() or torch is None or not torch.distributed.is_available()
                     or not torch.distributed.is_gloo_available(),
                     "needs torch.distributed with gloo, not initialised yet")
    def test_group_checks_with_a_cpu_group(self):
        """In a one-process gloo group: a shard of the wrong length for the
        layout, then the backend (NCCL only), then the device."""
        dist = torch.distributed
        with tempfile.TemporaryDirectory() as d:
            dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
            try:
                q = _t(1, 4, 640, 64)
                CPA = flexgen.context_parallel_attention
                with self.assertRaises(ValueError) as cm:
                    CPA(q, q, q, seq_len=700)
                self.assertIn("rank 0 of 1 holds 700 rows", str(cm.exception))
                for kw in ({"seq_len": 640}, {}):
                    with self.assertRaises(ValueError) as cm:
                        CPA(q, q, q, **kw)
                    self.assertIn("'gloo'", str(cm.exception))
                with self.assertRaises(TypeError):
                    CPA(q, q, q, group="world")
                if dist.is_nccl_available() and torch.cuda.is_available():
                    cuda_group = dist.new_group([0], backend="nccl")
                    with self.assertRaises(ValueError) as cm:  # CPU tensors, an NCCL group
                        CPA(q, q, q, group=cuda_group, seq_len=640)
                    self.assertIn("must be a CUDA tensor", str(cm.exception))
            finally:
                dist.destroy_process_group()

    @needs_torch
    @unittest.skipUnless(_has_cp(), "libflexgen has no context parallelism")
    def test_arguments_reach_the_library(self):
        """The fg_cp_args / fg_cp_bwd_args mirrors and the shard's arguments
        pass every check of the library up to the communicator's (NULL
        here), which needs no GPU: a struct that drifted from flexgen.h would
        fail earlier, on its size or on a field read at the wrong place."""
        import types as pytypes
        from unittest import mock
        S = 640
        q, k, v = (_t(1, 4, S, 64) for _ in range(3))
        mod = flexgen.load_mod(gallery_file("causal"))
        call = pytypes.SimpleNamespace(mod=mod, binds=flexgen._Bindings(mod, None, None, device=0),
                                       scale=None, comm=pytypes.SimpleNamespace(pointer=lambda: None),
                                       seq_len=S, layout=flexgen.FG_CP_ZIGZAG, index=0,
                                       deterministic=False, plan=None)
        stream = pytypes.SimpleNamespace(cuda_stream=None)
        with mock.patch.object(torch.cuda, "current_stream", lambda index=None: stream):
            with self.assertRaises(flexgen.FlexgenError) as cm:
                flexgen._cp_forward(call, q, k, v)
            self.assertIn("NULL communicator (fg_cp_args.comm)", str(cm.exception))
            out, lse = torch.zeros_like(q), torch.zeros(1, 4, S)
            with self.assertRaises(flexgen.FlexgenError) as cm:
                flexgen._cp_backward(call, q, k, v, out, lse, None, torch.zeros(1, 4, S))
            self.assertIn("NULL communicator (fg_cp_bwd_args.comm)", str(cm.exception))
            with self.assertRaises(flexgen.FlexgenError) as cm:
                flexgen._cp_make_plan(call, q, k, v)
            self.assertIn("NULL communicator (fg_cp_args.comm)", str(cm.exception))

    @needs_torch
    def test_torch_communicator_only_when_blocking(self):
        """The group's own communicator is used only in NCCL's blocking mode
        (the ring expects ncclSuccess from every call), by ProcessGroupNCCL's
        rules: the group's config, then the environment, then eager init."""
        import types as pytypes
        from unittest import mock

        def backend(blocking=None, bound=None):
            config = pytypes.SimpleNamespace(blocking=-2 ** 31 if blocking is None else blocking)
            return pytypes.SimpleNamespace(options=pytypes.SimpleNamespace(config=config),
                                           bound_device_id=bound)
        is_blocking = flexgen._torch_comm_is_blocking
        with mock.patch.dict(os.environ, {"TORCH_NCCL_USE_COMM_NONBLOCKING": ""}):
            self.assertTrue(is_blocking(backend()))  # lazy init
            self.assertFalse(is_blocking(backend(bound="cuda:0")))  # eager init
            self.assertTrue(is_blocking(backend(blocking=1, bound="cuda:0")))
            self.assertFalse(is_blocking(backend(blocking=0)))
        with mock.patch.dict(os.environ, {"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"}):
            self.assertFalse(is_blocking(backend()))
            self.assertTrue(is_blocking(backend(blocking=1)))
        with mock.patch.dict(os.environ, {"TORCH_NCCL_USE_COMM_NONBLOCKING": "0"}):
            self.assertTrue(is_blocking(backend(bound="cuda:0")))

    @unittest.skipUnless(_two_gpus(), "needs 2 GPUs, NCCL and a library with context parallelism")
    def test_two_gpus_match_one(self):
        """Two processes, one GPU each, run every case of CP_CASES on their
        shards, forward and backward; the shards put back together match
        flexgen.attention on the whole tensors on one GPU: outputs within
        1e-2 (relative norm, as the single-GPU tests against float64), lse
        within 1e-3 * (1 + max |lse|), gradients within 2e-2. The same
        forward through flexgen's own communicator gives the same bits."""
        for name, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                            ("NVSHMEM_DISABLE_NVLS", "1")):
            os.environ[name] = value  # NVLink multicast stays off (inherited by the workers)
        world = 2
        B, H, S, D = CP_SHAPE
        with tempfile.TemporaryDirectory() as folder:
            data = _cp_inputs()
            torch.save(data, os.path.join(folder, "inputs.pt"))
            procs = torch.multiprocessing.start_processes(_cp_worker, args=(world, folder), nprocs=world,
                                                          join=False, start_method="spawn")
            deadline = time.monotonic() + 600
            while not procs.join(timeout=5):  # raises with a worker's traceback if one failed
                if time.monotonic() > deadline:
                    for p in procs.processes:
                        p.terminate()
                    self.fail("the 2-GPU workers did not finish in 600 s (a ring that never met?)")
            ranks = [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in range(world)]
        lazy_blocking = not os.environ.get("TORCH_NCCL_USE_COMM_NONBLOCKING")
        for r in ranks:
            if not os.environ.get("FLEXGEN_CP_COMM"):
                self.assertEqual(r["comm_kinds"], ["own"])  # the default: a communicator of ours
            if lazy_blocking:
                self.assertEqual(r["auto_comm_kinds"], ["torch"])  # the group's own, where safe
        dev = torch.device("cuda", 0)
        for case in CP_CASES:
            label, layout, reads_lse = _cp_label(case), case[1], case[4]
            x = {n: t.to(dev) for n, t in data[label].items()}
            with self.subTest(label):
                got = {n: flexgen.unshard([r[label][n] for r in ranks], layout).to(dev)
                       for n in ("out", "lse", "dq", "dk", "dv")}
                leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v")]
                buffers = GALLERY[case[0]].setup(B, H, S, dev)["buffers"]
                learnt = {n: b.clone().requires_grad_() for n, b in buffers.items() if b.is_floating_point()}
                buffers.update(learnt)
                out, lse = flexgen.attention(*leaves, gallery_file(case[0]), params=case[2],
                                             buffers=buffers, enable_gqa=case[3] is not None,
                                             return_lse=True)
                outs, grads = ([out, lse], [x["dout"], x["dlse"]]) if reads_lse else ([out], [x["dout"]])
                names = ["dq", "dk", "dv"] + ["d" + n for n in learnt]
                want = dict(zip(names, torch.autograd.grad(outs, leaves + list(learnt.values()), grads)))
                for n in names[3:]:  # each rank its copy's gradient: they add up to the whole
                    total = sum(r[label][n].to(dev) for r in ranks)
                    self.assertLess(_rel(total, want[n]), 2e-2, n)
                self.assertFalse(got["out"].isnan().any())
                self.assertLess(_rel(got["out"], out), 1e-2)
                finite = lse.isfinite()
                self.assertTrue(torch.equal(finite, got["lse"].isfinite()))
                self.assertLess(float((got["lse"][finite] - lse[finite]).abs().max()),
                                1e-3 * (1 + float(lse[finite].abs().max())))
                for n in ("dq", "dk", "dv"):
                    self.assertEqual(got[n].shape, want[n].shape, n)
                    self.assertLess(_rel(got[n], want[n]), 2e-2, n)
        first = _cp_label(CP_CASES[0])
        second = _cp_label(CP_CASES[1])
        for r in ranks:
            self.assertTrue(torch.equal(r["auto_comm_out"], r[first]["out"]))
            for out in r["plan_outs"]:
                self.assertTrue(torch.equal(out, r[second]["out"]))



def main():
    if os.environ.get("FLEXGEN_SANITIZED") == "1":
        print("test_flexgen: the library is built with sanitizers and cannot be loaded "
              "into python: skipped")
        return 77
    prog = unittest.main(exit=False, verbosity=2 if "-v" in sys.argv else 1)
    r = prog.result
    ran_all = torch is not None and HAVE_LIB
    if not r.wasSuccessful():
        return 1
    if not ran_all:
        print(f"test_flexgen: {'torch is not importable' if torch is None else 'no libflexgen'}"
              f": reported as skipped")
        return 77
    print(f"{r.testsRun - len(r.skipped)} passed, 0 failed, {len(r.skipped)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
