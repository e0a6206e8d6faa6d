#pragma once
#include <torch/torch.h>

#include <string>

namespace memlab {

// "auto" -> CUDA when a GPU is visible, else CPU; "cuda" without a GPU is a UserError.
torch::Device pick_device(const std::string& want);
std::string device_description(const torch::Device& d);  // "cpu (2 threads)", "cuda:0 (NVIDIA H100 80GB HBM3)"

}  // namespace memlab
