"""The installed package, without a GPU: what `pip install .` must give.

Run by scripts/test.sh with the interpreter of a fresh virtual environment
into which `pip install .` put flexgen: the module imports with no
environment variable and loads the library installed inside it, parses a
mod, builds a CPU block mask, prints the generated CUDA and compiles it with
NVRTC (a portable forward for sm_80, the Hopper backward as PTX for
sm_90a). Exits non-zero on the first thing that does not hold."""
import os
import sys

os.environ.pop("FLEXGEN_LIB", None)
import flexgen  # noqa: E402

here = os.path.dirname(os.path.abspath(flexgen.__file__))
assert os.path.basename(here) == "flexgen", f"imported {flexgen.__file__}, not the installed package"
lib = flexgen.library_path()
assert os.path.dirname(lib) == here, f"library {lib} is not the package's ({here})"

mod = flexgen.load_mod("bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx >= kv_idx; }")
bm = flexgen.block_mask(mod, 1, 1, 256, 256, device="cpu")
assert bm.sparsity() > 0.2, bm.sparsity()
src = flexgen.generate_source(mod, kernel="attention", head_dim=64)
assert "fg_mask_mod" in src and "#line" in src
cubin = flexgen.compile_kernel(mod, kernel="attention", head_dim=64, arch="sm_80")
assert cubin[:4] == b"\x7fELF", cubin[:4]
ptx = flexgen.compile_kernel(mod, kernel="attention-bwd-sm90", arch="sm_90a", emit="ptx")
assert b".entry fg_attention_bwd_dkdv" in ptx
try:
    flexgen.generate_source(mod, kernel="nope")
    raise AssertionError("an unknown kernel name was accepted")
except ValueError:
    pass
print(f"flexgen {flexgen.version()} installed at {here}: import, parse, CPU block mask, "
      f"source ({len(src)} chars), cubin ({len(cubin)} bytes), PTX: ok")
sys.exit(0)
