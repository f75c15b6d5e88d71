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

from models.cores import fused_attention, fused_kernels  # noqa: E402
from tasks import counter_kernel, counter_sampler  # noqa: E402

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
                     | dict.fromkeys(("order", "starts"), I64),
                     dict(E=E, BLOCK_E=E, BLOCK_N=fused_attention.BLOCK_N)),
    "counter prompts": (counter_kernel.prompts, dict.fromkeys((
        "seeds", "step", "tokens", "subjects", "relations", "answers", "subject_pos", "relation_pos", "n_subjects",
        "first_noise", "n_noise", "eos", "subject_ticks", "relation_ticks", "facts"), I64),
        dict(T=T, STEP_IS_POINTER=True, BLOCK_B=counter_sampler.COUNTER_BLOCK_B, BLOCK_T=T,
             BLOCK_S=counter_sampler.COUNTER_BLOCK_TICKS)),
}


def loop_cost(sass: str) -> tuple[int, int]:
    """The instructions, and the barriers among them, of the largest loop in a kernel's SASS:
    the span from a backward branch's target to the branch (the work of one iteration)."""
    lines = re.findall(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?);", sass, re.M)
    addresses = [int(address, 16) for address, _ in lines]
    largest: list[str] = []
    for address, (_, text) in zip(addresses, lines):
        branch = re.search(r"\bBRA\s+0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            body = [t for a, (_, t) in zip(addresses, lines) if int(branch.group(1), 16) <= a <= address]
            largest = max(largest, body, key=len)
    return len(largest), sum(t.split()[-1].startswith("BAR") or " BAR." in t for t in largest)


def resources(name: str, arch: int) -> dict[str, int]:
    """Registers, local (spilled) bytes and shared bytes per thread block, global atomic
    instructions in the PTX, its SASS instructions, and those and the barriers of its largest loop, of
    KERNELS[name] compiled for sm_`arch`."""
    kernel, pointers, constexprs = KERNELS[name]
    signature = {p: "constexpr" if p in constexprs else pointers.get(p, "i32")
                 for p in inspect.signature(kernel.fn).parameters}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", arch, 32))
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([str(tool), "-res-usage", cubin.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(tool), "-sass", cubin.name], capture_output=True, text=True, check=True).stdout
    found = {key: int(value) for key, value in re.findall(r"(REG|LOCAL|SHARED):(\d+)", usage)}
    atomics = re.findall(r"(?:^|\s)(?:atom|red)\.global", compiled.asm["ptx"], re.M)  # not cp.async's .shared.global
    loop, barriers = loop_cost(sass)
    instructions = len(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+\S", sass, re.M))
    return {"registers": found["REG"], "local": found["LOCAL"], "shared": found["SHARED"], "atomics": len(atomics),
            "warps": compiled.metadata.num_warps, "instructions": instructions, "loop": loop,
            "loop_barriers": barriers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, as 90 for sm_90 (H100, H200)")
    args = parser.parse_args()
    print(f"Triton {triton.__version__}, compiled for sm_{args.arch} (e = {E}, T = {T})")
    for name in KERNELS:
        r = resources(name, args.arch)
        print(f"{name:<16} {r['warps']} warps, {r['registers']:>3} registers, {r['local']} B spilled, "
              f"{r['shared']} B shared, {r['instructions']} instructions (largest loop {r['loop']}, "
              f"with {r['loop_barriers']} barriers), "
              f"{r['atomics']} global atomic instructions")


if __name__ == "__main__":
    main()
