# Entry points for people and CI. `make demo` and `make test` each install what they need
# (Debian packages, the Python venv with the PyTorch wheel) and build what they use.
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
export CCACHE_SLOPPINESS := pch_defines,time_macros,include_file_mtime,include_file_ctime
# Hash paths relative to the checkout and ignore the build directory's location, so a fresh
# clone elsewhere (CI) reuses the compile cache of an earlier build.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := true

.PHONY: setup configure build test demo clean sanitize

setup:
	@scripts/setup.sh > $(BUILD).venv-path.tmp && mkdir -p $(BUILD) && mv $(BUILD).venv-path.tmp $(BUILD)/venv-path

configure: setup
	@venv=$$(cat $(BUILD)/venv-path); \
	torch_root=$$($$venv/bin/python -c 'import torch, os; print(os.path.dirname(torch.__file__))'); \
	cmake -S . -B $(BUILD) -G Ninja -DTORCH_ROOT=$$torch_root -DMEGATRON_VENV=$$venv $(CMAKE_ARGS) > $(BUILD)/configure.log \
	  || { cat $(BUILD)/configure.log; exit 1; }

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The whole suite built and run under AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/
# (docs/fuzzing.md); about twice the time of `make test`.
sanitize:
	$(MAKE) test BUILD=build-asan CMAKE_ARGS=-DMEGATRON_SANITIZE=ON

demo: build
	scripts/demo.sh $(BUILD)/megatron

clean:
	rm -rf $(BUILD)
