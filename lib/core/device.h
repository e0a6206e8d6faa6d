#pragma once
#include <torch/torch.h>

#include <string>

namespace memlab {

class Config;

// "auto" -> CUDA when a GPU is visible, else CPU; "cuda" without a GPU is a UserError.
torch::Device pick_device(const std::string& want);
std::string device_description(const torch::Device& d);  // "cpu (2 threads)", "cuda:0 (NVIDIA H100 80GB HBM3)"
// Whether a run autocasts to bf16, from its precision key (auto, fp32, bf16): auto is bf16 on CUDA; bf16 off
// CUDA is an error naming the key.
bool bf16_autocast(const Config& cfg, const std::string& precision_key, const torch::Device& d);
// A CUDA device's compute capability as 10 * major + minor (90 for an H100); 0 for the CPU or when unknown.
int device_capability(const torch::Device& d);
// Total memory of a CUDA device in bytes; 0 for the CPU.
double device_memory_bytes(const torch::Device& d);

}  // namespace memlab
