"""The toolkit's Triton kernels compiled for a GPU on a machine without one: each kernel's
registers, spills (local memory), shared memory and global atomics per thread, as ptxas and
cuobjdump (shipped with Triton) report them for the target. Triton's interpreter (the CPU
tests) runs a kernel's Python, not its compilation: this is where a kernel that would not
compile, spills, or adds atomically to global memory shows before a GPU sees it.

Compiled at the sizes of the 169-model cell (head size e = 8, T = 32), the block sizes the
launchers use, for an H100 (sm_90) by default.

    .venv/bin/python bench/kernel_resources.py [--arch 90]
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret (read when Triton is imported)

import argparse  # noqa: E402
import inspect  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the toolkit, run as a script

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from models import fused_attention, fused_kernels  # noqa: E402
from tasks import counter_kernel, factual_recall  # noqa: E402

F32, I64 = "*fp32", "*i64"
E, T = 8, 32
# kernel: (its pointer arguments' types (other arguments are int32), its constexprs)
KERNELS = {
    "fused forward": (fused_kernels.forward, dict.fromkeys(("q", "key", "value", "score_pos", "z", "pattern"), F32)
                      | {"index": I64}, dict(E=E, BLOCK_B=fused_attention.BLOCK_B, BLOCK_T=T, POSITIONAL=False,
                                             LINEAR=False)),
    "fused backward": (fused_kernels.backward, dict.fromkeys(("q", "key", "value", "pattern", "d_z", "d_pattern",
                                                              "d_q", "d_scores"), F32) | {"index": I64},
                       dict(E=E, BLOCK_B=fused_attention.BLOCK_B, BLOCK_T=T, HAS_DPATTERN=False, LINEAR=False)),
    "fused tables": (fused_kernels.tables, dict.fromkeys(("q", "pattern", "d_z", "d_scores", "d_key", "d_value"), F32)
                     | {"index": I64}, dict(E=E, BLOCK_E=E, BLOCK_B=fused_attention.BLOCK_B, BLOCK_T=T,
                                            BLOCK_V=fused_attention.BLOCK_V)),
    "counter prompts": (counter_kernel.prompts, dict.fromkeys((
        "seeds", "step", "tokens", "subjects", "relations", "answers", "subject_pos", "relation_pos", "n_subjects",
        "first_noise", "n_noise", "eos", "subject_ticks", "relation_ticks", "facts"), I64),
        dict(T=T, STEP_IS_POINTER=True, BLOCK_B=factual_recall.COUNTER_BLOCK_B, BLOCK_T=T,
             BLOCK_S=factual_recall.COUNTER_BLOCK_TICKS)),
}


def resources(name: str, arch: int) -> dict[str, int]:
    """Registers, local (spilled) bytes and shared bytes per thread block, and global atomic
    instructions in the PTX, of KERNELS[name] compiled for sm_`arch`."""
    kernel, pointers, constexprs = KERNELS[name]
    signature = {p: "constexpr" if p in constexprs else pointers.get(p, "i32")
                 for p in inspect.signature(kernel.fn).parameters}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", arch, 32))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        usage = subprocess.run([str(tool), "-res-usage", cubin.name], capture_output=True, text=True, check=True).stdout
    found = {key: int(value) for key, value in re.findall(r"(REG|LOCAL|SHARED):(\d+)", usage)}
    ptx = compiled.asm["ptx"]
    return {"registers": found["REG"], "local": found["LOCAL"], "shared": found["SHARED"],
            "atomics": ptx.count("atom.global") + ptx.count("red.global"), "warps": compiled.metadata.num_warps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, as 90 for sm_90 (H100, H200)")
    args = parser.parse_args()
    print(f"Triton {triton.__version__}, compiled for sm_{args.arch} (e = {E}, T = {T})")
    for name in KERNELS:
        r = resources(name, args.arch)
        print(f"{name:<16} {r['warps']} warps, {r['registers']:>3} registers, {r['local']} B spilled, "
              f"{r['shared']} B shared, {r['atomics']} global atomic instructions")


if __name__ == "__main__":
    main()
