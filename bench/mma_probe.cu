/* bench/mma_probe.cu - the latency and rate of mma.sync m16n8k8 with TF32 operands on one
   multiprocessor: one block of 1-12 warps, each running CH independent chains of dependent mma.

   nvcc -O3 -arch=sm_90 -o build/mma_probe bench/mma_probe.cu && build/mma_probe

   Prints, for each chain count and warp count, the cycles between a warp's mma (one chain: the
   latency) and the multiprocessor's mma a cycle (many: the rate). The cluster MLP kernel's products
   (mnistcu.h, >>cuda_fused_clusters) run on this instruction; bench/RESULTS.md (2026-11-28). */
#include <cstdint>
#include <cstdio>

__device__ __forceinline__ void mma(float *d, const uint32_t *a, const uint32_t *b)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int CH> __global__ void chains(float *out, long long *cycles, int n)
{
    uint32_t a[4], b[2];
    float d[CH][4] = {};
    for (int i = 0; i < 4; ++i) a[i] = __float_as_uint(1e-3f * (float)(threadIdx.x + i));
    for (int i = 0; i < 2; ++i) b[i] = __float_as_uint(1e-3f * (float)(threadIdx.x - i));
    __syncthreads();
    const long long t0 = clock64();
    for (int i = 0; i < n; ++i)
#pragma unroll
        for (int c = 0; c < CH; ++c) mma(d[c], a, b);
    __syncthreads();
    const long long t1 = clock64();
    float s = 0.0f;
    for (int c = 0; c < CH; ++c)
        for (int e = 0; e < 4; ++e) s += d[c][e];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s; /* keeps the chains */
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int CH> static int run(float *out, long long *cyc)
{
    const int n = 4096, warps[] = {1, 4, 8, 12};
    for (int w : warps) {
        long long h = 0;
        chains<CH><<<1, 32 * w>>>(out, cyc, n); /* warm-up */
        chains<CH><<<1, 32 * w>>>(out, cyc, n);
        if (cudaMemcpy(&h, cyc, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess || h <= 0) return 1;
        printf("chains %2d warps %2d: %.2f cycles between a warp's mma, %.2f mma a cycle on the multiprocessor\n",
               CH, w, (double)h / (n * CH), (double)n * CH * w / (double)h);
    }
    return 0;
}

int main()
{
    float *out = NULL;
    long long *cyc = NULL;
    if (cudaMalloc(&out, 1 << 20) != cudaSuccess || cudaMalloc(&cyc, 1024) != cudaSuccess) {
        fprintf(stderr, "mma_probe: no GPU memory\n");
        return 1;
    }
    if (run<1>(out, cyc) || run<2>(out, cyc) || run<4>(out, cyc) || run<8>(out, cyc)) {
        fprintf(stderr, "mma_probe: a launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    cudaFree(out);
    cudaFree(cyc);
    return 0;
}
