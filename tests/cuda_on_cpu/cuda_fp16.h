// Part of cuda_runtime.h in the CPU emulation (tests/test_cuda_emulation.py).
#pragma once
#include "cuda_runtime.h"
