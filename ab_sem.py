import sys
from ggml_ciq import ops as O
from ggml_ciq.compare import run_compare
sem = sys.argv[1]
orig = O.NativeOps.__init__
def init(self, device="cpu", semantics=None, attention_kernel="auto"):
    orig(self, device, sem, sys.argv[2])
O.NativeOps.__init__ = init
r = run_compare("/tmp/gemma3-270m.gguf", 512, repeat=2, device="cuda")
a = r.agreement
print(f"semantics={sem} attention={sys.argv[2]}: top1 {a['top1']:.4f} KL {a['kld_mean']:.2e} NMSE {a['nmse']:.2e} speed {r.speedup:.2f}")
