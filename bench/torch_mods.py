"""torch_mods.py -- the torch equivalents of the flexgen gallery (mods/*.c).

A comparison is only fair when both systems compute the same function, so
every gallery mod has its FlexAttention twin here, written the way
attention-gym writes them, with the same parameter values and the same
buffers on both sides. python/test_flexgen.py checks each twin against
flexgen's CPU evaluator element by element, so a drift between a mod file and
its twin fails a test instead of skewing a benchmark.

The contract (the gallery entries follow it, and so does a file given to
compare_torch.py with --torch-mods):

  mask_mod(b, h, q_idx, kv_idx) -> bool tensor            optional
  score_mod(score, b, h, q_idx, kv_idx) -> tensor         optional
  setup(B, H, S, device) -> dict with
      params   {name: int | float}: the flexgen mod's scalar parameters
      buffers  {name: int32 / float32 tensor on device}: its buffers
      mask_mod / score_mod   torch callables replacing the module-level ones
               (closures over this setup's tensors); optional
      mask_b / mask_h        block-mask batch / heads (None, the default:
               broadcast, as create_block_mask's B=None / H=None)
  SDPA = None | "none" | "causal"   which SDPA call computes the same thing

The mods must work under FlexAttention's vmap and on broadcast index
tensors (the float64 reference calls them that way): torch operations, `&`
`|` `~` and torch.where, never Python `and`, `or` or `if` on tensors.
"""

import importlib.util
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Spec:
    """One comparable mod: its flexgen file(s), its torch setup, and which
    SDPA call (if any) computes the same attention."""

    def __init__(self, name, setup, sdpa=None, mask_file=None, score_file=None):
        self.name = name
        self.setup = setup
        self.sdpa = sdpa
        self.mask_file = mask_file
        self.score_file = score_file

    def __repr__(self):
        return f"<Spec {self.name}>"


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _random_lengths(total, count, seed):
    """`count` positive lengths summing to `total`: cut points drawn without
    replacement, so lengths vary the way real packed batches do."""
    g = torch.Generator().manual_seed(seed)
    count = max(1, min(count, total))
    cuts = torch.randperm(total - 1, generator=g)[: count - 1] + 1
    bounds = torch.cat([torch.tensor([0]), cuts.sort().values, torch.tensor([total])])
    return (bounds[1:] - bounds[:-1]).tolist()


def _doc_ids(lengths, device):
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return ids.to(device=device, dtype=torch.int32)


def _image_side(S):
    """A canvas (width, height) with width * height == S, as square as S
    allows: (128, 64) for S = 8192, the gallery's defaults."""
    w = int(S ** 0.5)
    while S % w:
        w -= 1
    return S // w, w  # (width, height): width >= height


# ---------------------------------------------------------------------------
# The gallery. Parameter names and meanings follow mods/<name>.c exactly.
# ---------------------------------------------------------------------------

def setup_noop(B, H, S, device):
    return {"params": {}, "buffers": {}}


def setup_causal(B, H, S, device):
    return {"params": {}, "buffers": {}, "mask_mod": _causal}


SLIDING_WINDOW = 1024


def setup_sliding_window(B, H, S, device):
    w = SLIDING_WINDOW

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= w)
    return {"params": {"WINDOW": w}, "buffers": {}, "mask_mod": mask_mod}


PREFIX = 2048


def setup_prefix_lm(B, H, S, device):
    p = PREFIX

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx < p) | (q_idx >= kv_idx)
    return {"params": {"PREFIX": p}, "buffers": {}, "mask_mod": mask_mod}


DOCUMENTS = 12


def setup_document(B, H, S, device):
    doc = _doc_ids(_random_lengths(S, DOCUMENTS, seed=1), device)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx])
    return {"params": {}, "buffers": {"document_id": doc}, "mask_mod": mask_mod}


def setup_jagged(B, H, S, device):
    lengths = _random_lengths(S, DOCUMENTS, seed=2)
    offsets = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    offsets = offsets.to(device=device, dtype=torch.int32)
    seq = _doc_ids(lengths, device)

    def mask_mod(b, h, q_idx, kv_idx):
        s = seq[q_idx]
        return (s >= 0) & (kv_idx <= q_idx) & (kv_idx >= offsets[s.clamp(min=0)])
    return {"params": {}, "buffers": {"offsets": offsets, "seq_idx": seq}, "mask_mod": mask_mod}


SASA_WINDOW = 8  # half-width: a 17 x 17 window


def setup_sasa(B, H, S, device):
    width, _ = _image_side(S)
    k = SASA_WINDOW

    def mask_mod(b, h, q_idx, kv_idx):
        qx, qy = q_idx % width, q_idx // width
        kx, ky = kv_idx % width, kv_idx // width
        return ((qy - ky).abs() <= k) & ((qx - kx).abs() <= k)
    return {"params": {"W": width, "WINDOW": k}, "buffers": {}, "mask_mod": mask_mod}


NATTEN_KERNEL = 15


def setup_natten(B, H, S, device):
    width, height = _image_side(S)
    r = NATTEN_KERNEL // 2

    def mask_mod(b, h, q_idx, kv_idx):
        qx, qy = q_idx % width, q_idx // width
        kx, ky = kv_idx % width, kv_idx // width
        cx = qx.clamp(r, width - 1 - r)
        cy = qy.clamp(r, height - 1 - r)
        return ((cy - ky).abs() <= r) & ((cx - kx).abs() <= r)
    return {"params": {"W": width, "H": height, "KERNEL": NATTEN_KERNEL}, "buffers": {},
            "mask_mod": mask_mod}


def alibi_slopes(H):
    """The ALiBi paper's geometric slopes 2^(-8 (h + 1) / H)."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)], dtype=torch.float32)


def setup_alibi(B, H, S, device):
    slopes = alibi_slopes(H).to(device)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    return {"params": {}, "buffers": {"slopes": slopes}, "mask_mod": _causal,
            "score_mod": score_mod}


SOFTCAP = 20.0


def setup_softcap(B, H, S, device):
    cap = SOFTCAP

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return {"params": {"SOFTCAP": cap}, "buffers": {}, "mask_mod": _causal,
            "score_mod": score_mod}


FLAMINGO_IMAGES = 8


def setup_flamingo(B, H, S, device):
    """Queries are text tokens in FLAMINGO_IMAGES + 1 intervals (the first,
    before any image, sees nothing); keys are the image tokens, S /
    FLAMINGO_IMAGES per image. Text of interval i attends to image i - 1."""
    lengths = _random_lengths(S, FLAMINGO_IMAGES + 1, seed=3)
    text_image = torch.repeat_interleave(torch.arange(len(lengths)) - 1, torch.tensor(lengths))
    per_image = max(1, S // FLAMINGO_IMAGES)
    kv_image = (torch.arange(S) // per_image).clamp(max=FLAMINGO_IMAGES - 1)
    ti = text_image.to(device=device, dtype=torch.int32)
    ki = kv_image.to(device=device, dtype=torch.int32)

    def mask_mod(b, h, q_idx, kv_idx):
        img = ti[q_idx]
        return (img >= 0) & (ki[kv_idx] == img)
    return {"params": {}, "buffers": {"text_image": ti, "kv_image": ki}, "mask_mod": mask_mod}


DILATION = 4
DILATED_WINDOW = 256  # keys at distances 0, 4, ..., 1024: sliding_window's reach


def setup_dilated(B, H, S, device):
    dil, w = DILATION, DILATED_WINDOW

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        return (d >= 0) & (d <= w * dil) & (d % dil == 0)
    return {"params": {"DILATION": dil, "WINDOW": w}, "buffers": {}, "mask_mod": mask_mod}


LOCAL_WINDOW = 512
GLOBAL_TOKENS = 64


def setup_local_global(B, H, S, device):
    w, g = LOCAL_WINDOW, GLOBAL_TOKENS

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & ((kv_idx < g) | (q_idx - kv_idx <= w))
    return {"params": {"WINDOW": w, "GLOBAL": g}, "buffers": {}, "mask_mod": mask_mod}


def _gallery():
    def mod(name):
        return os.path.join(ROOT, "mods", name + ".c")
    g = {}
    for name, setup, sdpa in (
        ("noop", setup_noop, "none"),
        ("causal", setup_causal, "causal"),
        ("sliding_window", setup_sliding_window, None),
        ("prefix_lm", setup_prefix_lm, None),
        ("document", setup_document, None),
        ("jagged", setup_jagged, None),
        ("sasa", setup_sasa, None),
        ("natten", setup_natten, None),
        ("alibi", setup_alibi, None),
        ("softcap", setup_softcap, None),
        ("flamingo", setup_flamingo, None),
        ("dilated", setup_dilated, None),
        ("local_global", setup_local_global, None),
    ):
        g[name] = Spec(name, setup, sdpa, mask_file=mod(name))
    return g


GALLERY = _gallery()


def load_file(path, mask_file=None, score_file=None, name=None):
    """A Spec from a torch mods file (the contract above) and the flexgen
    mod file(s) it mirrors."""
    spec = importlib.util.spec_from_file_location("flexgen_torch_mods_extra", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "setup"):
        raise ValueError(f"{path}: defines no setup(B, H, S, device)")

    def setup(B, H, S, device):
        st = dict(module.setup(B, H, S, device) or {})
        st.setdefault("params", {})
        st.setdefault("buffers", {})
        st.setdefault("mask_mod", getattr(module, "mask_mod", None))
        st.setdefault("score_mod", getattr(module, "score_mod", None))
        return st
    def base(f):
        return os.path.splitext(os.path.basename(f))[0]
    label = name or "+".join(base(f) for f in (mask_file, score_file) if f) or base(path)
    return Spec(label, setup, getattr(module, "SDPA", None), mask_file=mask_file,
                score_file=score_file)
