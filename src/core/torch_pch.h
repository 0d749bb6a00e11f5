// Precompiled header: the LibTorch headers most translation units use. Only the build
// includes this (CMake's target_precompile_headers); sources still include what they use.
#pragma once
#include <ATen/ATen.h>
#include <torch/torch.h>
