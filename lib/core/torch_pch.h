#pragma once
// Precompiled header shared by every translation unit that needs LibTorch.
#include <torch/torch.h>
#include <fmt/format.h>
#include <string>
#include <vector>
