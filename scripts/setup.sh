#!/usr/bin/env bash
# Installs what building and testing megatron.cpp needs on Debian 12, idempotently:
# Debian packages (compiler, CMake, ccache, GoogleTest, Gloo headers, yaml-cpp, nlohmann-json)
# and a Python venv holding the PyTorch wheel (LibTorch) plus the reference implementations
# the tests compare against. The venv lives outside the checkout, keyed by requirements.txt,
# so fresh clones on the same machine reuse it. Prints the venv path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake make ninja-build ccache git python3 python3-venv libgtest-dev libgmock-dev
          libgloo-dev libyaml-cpp-dev nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}" >&2
fi

hash=$(sha256sum requirements.txt | cut -c1-12)
venv="${MEGATRON_VENV:-$HOME/.cache/megatron.cpp/venv-$hash}"
if [ ! -f "$venv/.complete" ]; then
  echo "setup: creating $venv (PyTorch wheel + test references; several GB, first time only)" >&2
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q -r requirements.txt >&2
  touch "$venv/.complete"
fi
echo "$venv"
