#pragma once
// CPU emulation (lessons/cpu_emulation): stands in for CUDA's cuda_runtime.h in the lessons' CPU builds.
#include "flashlab_cpu/emulation.hpp"
