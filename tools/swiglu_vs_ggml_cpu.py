"""ggml CPU's SwiGLU (ggml_swiglu_split through the bridge) against ours in the host order (ciq_glu silu): the
measurement behind docs/SEMANTICS.md's "SwiGLU is not ggml CPU's" (41d23b3:bench/results/cpu/swiglu-vs-ggml-cpu.txt).

    python tools/swiglu_vs_ggml_cpu.py
"""
import numpy as np
from ggml_ciq.llamacpp import LlamaCpp, OpGraph
from ggml_ciq.ops import NativeOps
from ggml_ciq import quants as Q, environment
rng = np.random.default_rng(9)
llama = LlamaCpp.load()
print("ggml CPU SwiGLU (ggml_swiglu_split) vs ours (host order, ciq_glu silu), inputs N(0, 9) gate, N(0, 1) up")
for shape in ((9, 700), (37, 2048)):
    x = (rng.standard_normal(shape) * 3).astype(np.float32); up = rng.standard_normal(shape).astype(np.float32)
    with OpGraph(llama, "CPU", "swiglu", shape) as g:
        theirs = g.run(x=x, up=up)
    ours = NativeOps("cpu").glu(x, up, "silu").numpy().reshape(shape)
    print(f"{shape}: {np.count_nonzero(ours != theirs)} of {ours.size} values differ, NMSE {Q.nmse(ours, theirs):.3g}")
env = environment.describe()
print("cpu:", env["cpu"], "| ggml_ciq", env["ggml_ciq_commit"], "| llama.cpp", env.get("llamacpp_commit"))
