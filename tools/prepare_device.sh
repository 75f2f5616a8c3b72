#!/usr/bin/env bash
# Stage what the GPU machine cannot download into .device/ (git-ignored; carried with `run`, < 64 MiB):
# wheels for cffi/pycparser/gguf/diskcache (Python 3.12), a slim llama-cpp-python sdist (the CUDA reference, llama.cpp's tools and
# the ggml plugin's headers come from it there), the Q4_K/Q6_K tensors of Gemma 3 270M (the whole file is 253 MB) and
# the perplexity text.
set -euo pipefail
cd "$(dirname "$0")/.."
# BASELINE=COMMIT: that commit's native/ in .baseline/ (git-ignored; carried to the call that runs
# `tools/gpu_run.sh baseline`, then `lib-ab` benches its library against this tree's in one process); with
# BASELINE_ONLY=1 nothing else is staged.
if [ -n "${BASELINE:-}" ]; then
  rm -rf .baseline && mkdir -p .baseline && git archive "$BASELINE" native | tar x -C .baseline
  git rev-parse --short "$BASELINE" > .baseline/COMMIT
  # an earlier API version: its header is made to say this tree's, so that this package loads it for `bench gemm`
  # alone, valid only while the calls bench gemm makes are the same in both (so for 9b4011e, v14, under 474f736, v15)
  v=$(sed -n 's/^#define GGML_CIQ_API_VERSION \([0-9]*\).*/\1/p' native/include/ggml_ciq.h)
  sed -i "s/^#define GGML_CIQ_API_VERSION [0-9]*/#define GGML_CIQ_API_VERSION $v/" .baseline/native/include/ggml_ciq.h
  if [ -n "${BASELINE_ONLY:-}" ]; then exit 0; fi
fi
out=.device
rm -rf "$out" && mkdir -p "$out/whl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$out/whl" cffi==2.0.0 pycparser==3.12 gguf==0.19.0 diskcache==5.6.3  # diskcache: llama_cpp's Python package
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" llama-cpp-python==0.3.36
tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
src="$tmp/llama_cpp_python-0.3.36"
rm -rf "$src/.git" "$src/docs" "$src/vendor/llama.cpp/docs" "$src/vendor/llama.cpp/media" \
  "$src/vendor/llama.cpp/benches" "$src/vendor/llama.cpp/tools/ui" "$src/vendor/llama.cpp/.git"
# models/llama3_8b_synthetic.py --vocab: in .device-extra/, carried by the last staging call (.device and the tracked
# tree together come near the 64 MiB a call carries)
rm -rf .device-extra && mkdir -p .device-extra
cp "$src/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf" .device-extra/
find "$src/vendor/llama.cpp/models" -name '*.gguf' -delete
tar czf "$out/llama_cpp_python.tar.gz" -C "$tmp" llama_cpp_python-0.3.36
# The sdist carries no git metadata, so its build reports ggml_commit() "unknown": llama-cpp-python 0.3.36 vendors
# llama.cpp 0c1e570, recorded for tools/gpu_run.sh (GGML_CIQ_LLAMACPP_COMMIT).
echo 0c1e570 > "$out/LLAMACPP_COMMIT"
rm -rf "$tmp"
PYTHONPATH=$PWD python3 tools/gemma_kquants.py "$out/gemma3-270m-kquants.gguf"
# llama-perplexity --kl-divergence text for the plugin (gpu_run.sh plugin-kld): a real English text of >= 8k tokens
# that a package here ships, never a repeated passage - chapters 2 and 3 of the Vim user manual (Debian vim-runtime),
# 13.2k Gemma tokens.
manual=/usr/share/vim/vim90/doc
cat "$manual/usr_02.txt" "$manual/usr_03.txt" > "$out/perplexity-text.txt"
echo "$manual/usr_02.txt + usr_03.txt ($(dpkg -S "$manual/usr_02.txt" 2>/dev/null | cut -d: -f1) $(dpkg-query -W -f='${Version}' vim-runtime 2>/dev/null))" \
  > "$out/perplexity-text.source"
# The whole Gemma file (253 MB, for the engine and `compare` there) in 24 MiB parts (11 of them: with the tracked
# tree, 33.1 MB at 71a87f5, each call stays under the 64 MiB it carries; 40 MiB parts stopped fitting at 5b644f3,
# 36 MiB ones at 8d3b6cf, 32 MiB ones at 71a87f5; a part's call takes ~5 s), each carried by its own call (`run` carry:
# [".device-parts/NAME", ".device-parts/SHA256SUMS"]; a call that also works), joined there by `tools/gpu_run.sh stage`.
rm -rf .device-parts && mkdir -p .device-parts
gemma=$(PYTHONPATH=$PWD python3 -c 'from ggml_ciq import catalog; print(catalog.gemma3_270m_path())')
split -b 24M -d "$gemma" .device-parts/gemma3-270m.gguf.part
(cd .device-parts && sha256sum "$gemma" | sed "s|  .*|  gemma3-270m.gguf|" > SHA256SUMS && sha256sum gemma3-270m.gguf.part* >> SHA256SUMS)
du -sh "$out"
