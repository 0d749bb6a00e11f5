#!/usr/bin/env bash
# Run here, before a device call: gathers what the GPU machine lacks into the git-ignored .gpu/
# (carried with the call): headers and static libraries of the Debian packages the build uses,
# GoogleTest's sources, and the HF baseline script from ../shared.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu && mkdir -p .gpu/deps/include .gpu/deps/lib
cp -r /usr/include/yaml-cpp /usr/include/nlohmann /usr/include/gloo .gpu/deps/include/
cp /usr/lib/x86_64-linux-gnu/libyaml-cpp.a .gpu/deps/lib/
cp -r /usr/src/googletest .gpu/deps/googletest
cp ../shared/bench/hf_baseline.py .gpu/
du -sh .gpu
