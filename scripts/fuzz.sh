#!/usr/bin/env bash
# Fuzz campaigns over the parsers (fuzz/fuzz_*.cpp) with libFuzzer, ASan and UBSan.
#
#   [FUZZ_JOBS=N] scripts/fuzz.sh [TARGET[,TARGET...]|all] [SECONDS]   (default: all, 600 s each, one at a time)
#
# Installs clang (Debian's clang-16 and its runtime) when missing, builds into build-fuzz/, and
# runs each target on a working copy of its seed corpus (fuzz/corpus/TARGET/ stays as it is;
# build-fuzz/corpus/TARGET/ grows). A crash, leak, UB report or timeout stops the target and
# leaves the input in build-fuzz/artifacts/TARGET/; copy it into fuzz/corpus/TARGET/ once fixed,
# and the test suite replays it from then on (tests/core/test_fuzz_corpora.cpp).
# Exit status: 0 when every target ran its time clean, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-all}
seconds=${2:-600}
build=build-fuzz

if ! command -v clang++-16 > /dev/null || [ ! -e /usr/lib/llvm-16/lib/clang/16/lib/linux/libclang_rt.fuzzer-x86_64.a ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get install -y -q clang-16 libclang-rt-16-dev libpcre2-dev libutf8proc-dev nlohmann-json3-dev libsentencepiece-dev \
    zlib1g-dev cmake ninja-build > /dev/null
fi
# The LibTorch-side targets link the rest of megatron.cpp from the main build (build/, `make build`).
main_build=""
if [ -f build/CMakeCache.txt ]; then
  cmake --build build --target megatron_cli > /dev/null || { echo "fuzz.sh: building build/'s libraries failed"; exit 1; }
  main_build=$PWD/build
else
  echo "fuzz.sh: no build/ (make build): the LibTorch-side targets (safetensors, hf_config, train_flags, native_checkpoint) are not built"
fi
cmake -S fuzz -B $build -G Ninja -DCMAKE_CXX_COMPILER=clang++-16 -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGATRON_BUILD="$main_build" > /dev/null
cmake --build $build -j "$(nproc)" > $build/build.log || { cat $build/build.log; exit 1; }

if [ "$target" = all ]; then
  # Every target that was built ($build is relative to the repository root, where this runs).
  targets=$(ls fuzz/fuzz_*.cpp | sed -e 's|^fuzz/fuzz_||' -e 's/\.cpp$//' | grep -v '^support$' |
            while read -r t; do if [ -x "$build/fuzz_$t" ]; then echo "$t"; fi; done)
else
  targets=$(echo "$target" | tr , " ")
fi
# One campaign; its report (one line, or FOUND and the sanitizer's summary) goes to $build/$t.report.
campaign() {
  local t=$1
  mkdir -p $build/corpus/$t $build/artifacts/$t
  cp -n fuzz/corpus/$t/* $build/corpus/$t/ 2> /dev/null || true
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
     $build/fuzz_$t $build/corpus/$t -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -artifact_prefix=$build/artifacts/$t/ -print_final_stats=1 > $build/$t.log 2>&1; then
    echo "== $t: $(grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' $build/$t.log | tr -s ' ' | tr '\n' ' ')$(grep -oE 'cov: [0-9]+' $build/$t.log | tail -1) corpus: $(ls $build/corpus/$t | wc -l) files: clean" > $build/$t.report
  else
    { echo "== $t: FOUND: see $build/$t.log and $build/artifacts/$t/"
      grep -E 'ERROR|SUMMARY|runtime error|uncaught|deadly|what\(\)' $build/$t.log | head -5; } > $build/$t.report
  fi
}

# FUZZ_JOBS campaigns at a time (default 1; one per core fills the machine).
jobs=${FUZZ_JOBS:-1}
for t in $targets; do
  [ -x $build/fuzz_$t ] || { echo "fuzz.sh: no target '$t' (fuzz/fuzz_$t.cpp; the LibTorch-side ones need build/)"; exit 2; }
done
echo "fuzz.sh: $(echo $targets | wc -w) target(s), ${seconds} s each, $jobs at a time"
running=0
for t in $targets; do
  campaign $t &
  running=$((running + 1))
  if [ $running -ge $jobs ]; then wait -n || true; running=$((running - 1)); fi
done
wait
status=0
for t in $targets; do
  cat $build/$t.report
  grep -q 'FOUND' $build/$t.report && status=1
done
exit $status
