// Stand-in for CUDA's <cuda_bf16.h> on the CPU: everything is in cuda_cpu.h.
#pragma once
#include "cuda_cpu.h"
