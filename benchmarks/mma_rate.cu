// The issue-rate ceilings of one GPU: FFMA (float32 on CUDA cores) and mma.sync m16n8k8 TF32 (tensor cores,
// float32 accumulate), each from CHAINS independent chains in registers (no memory traffic in the timed loop), one
// block an SM at 4, 8, 16 and 32 warps, best of 4 timed launches (the first is a warm-up).
//
// Build and run (needs nvcc and a GPU of cc 8.0 or later for the mma; not part of the test suite):
//   nvcc -O3 -arch=sm_90 -o mma_rate benchmarks/mma_rate.cu && ./mma_rate
//
// FLOPs: an FFMA is 2 a thread an instruction; an m16n8k8 mma is 2 * 16 * 8 * 8 a warp an instruction.  3xTF32
// (x = big + small, three mma a product, as PyTorch's memory-efficient float32 kernel runs) has a third of the mma
// rate.  Recorded: 2026-12-01, commit 613d762, benchmarks/results/h200-2026-12-01-s15/B/mma_rate.txt (H200: FFMA
// 62.1 TFLOP/s, mma TF32 321 at 32 warps an SM); docs/PERFORMANCE.md, "The ceilings".
#include <cstdio>
#include <cuda_runtime.h>

#define CHAINS 8
#define ITERS 4096

__global__ void ffma(float *out, float a, float b) {
  float x[CHAINS];
  for (int c = 0; c < CHAINS; ++c) x[c] = threadIdx.x + c;
  for (int i = 0; i < ITERS; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) x[c] = fmaf(x[c], a, b);
  float s = 0;
  for (int c = 0; c < CHAINS; ++c) s += x[c];
  if (s == 1.2345f) out[0] = s;
}

__global__ void mma_tf32(float *out, unsigned a0) {
  unsigned a[4] = {a0, a0 + 1, a0 + 2, a0 + 3}, b[2] = {a0 + 4, a0 + 5};
  float d[CHAINS][4];
  for (int c = 0; c < CHAINS; ++c)
    for (int t = 0; t < 4; ++t) d[c][t] = 0.f;
  for (int i = 0; i < ITERS; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
      asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                   "{%0,%1,%2,%3};\n"
                   : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  float s = 0;
  for (int c = 0; c < CHAINS; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  if (s == 1.2345f) out[0] = s;
}

int main() {
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  float *out;
  cudaMalloc(&out, 4);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  printf("gpu: %s, %d SMs\n", p.name, p.multiProcessorCount);
  printf("%-10s %8s %10s %10s\n", "kernel", "warps/SM", "ms", "TFLOP/s");
  for (int warps : {4, 8, 16, 32}) {
    int threads = 32 * warps, blocks = p.multiProcessorCount;
    for (int k = 0; k < 2; ++k) {
      float best = 1e30f;
      for (int rep = 0; rep < 5; ++rep) {
        cudaEventRecord(e0);
        if (k == 0) ffma<<<blocks, threads>>>(out, 0.999f, 0.001f);
        else mma_tf32<<<blocks, threads>>>(out, 0x3f800000u);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (rep && ms < best) best = ms;
      }
      // FFMA: 2 FLOPs a thread an instruction; mma m16n8k8: 2*16*8*8 FLOPs a warp an instruction
      double flops = k == 0 ? 2.0 * threads * blocks * (double)ITERS * CHAINS
                            : 2.0 * 16 * 8 * 8 * warps * blocks * (double)ITERS * CHAINS;
      printf("%-10s %8d %10.3f %10.1f\n", k == 0 ? "ffma" : "mma.tf32", warps, best, flops / best / 1e9);
    }
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) { printf("error: %s\n", cudaGetErrorString(err)); return 1; }
  return 0;
}
