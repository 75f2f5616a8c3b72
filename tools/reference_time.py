"""How long the float64 reference forward pass (`--device reference`, ggml_ciq.reference_ops) takes on Gemma 3 270M:
N random token ids, all logits, micro-batches of 512; load and forward seconds, and the profile's top entries.

    python3 tools/reference_time.py 4096        # 41d23b3:bench/results/cpu/reference-time-gemma3-270m.txt
"""
import cProfile, pstats, time, sys, numpy as np
from ggml_ciq import catalog
from ggml_ciq.model import ModelFile
from ggml_ciq.engine import Transformer
n = int(sys.argv[1])
m = ModelFile(catalog.gemma3_270m_path())
rng = np.random.default_rng(0)
tokens = rng.integers(0, 262144, n).tolist()
t = time.perf_counter(); e = Transformer(m, device="reference", n_ctx=n, n_ubatch=512); t1 = time.perf_counter()
pr = cProfile.Profile(); pr.enable()
logits = e.forward(tokens, all_logits=True)
pr.disable(); t2 = time.perf_counter()
print(f"load {t1-t:.1f} s forward {t2-t1:.1f} s")
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
