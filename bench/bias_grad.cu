/* bench/bias_grad.cu - the bias gradient (column sums of dz[B][OUT], rows in order from zero, the
   CPU's bits) two ways: v1, a thread per column reading its column row by row (the header's first
   version), and v2, the header's mnistcu__k_bias_grad (32 columns a block, 128 rows staged in shared
   memory per pass by all 8 warps, the next pass loading while one warp runs the chains). Shapes of
   P3 (batch 512: 1024 and 10 columns) and LeNet-5 (batch 64: 120, 84, 10). Prints us per call
   (median of 9 runs of 200 back-to-back launches) and checks v2's bits against v1's.

   Build:  nvcc -O3 -arch=sm_90 -std=c++17 -o build/bias_grad bench/bias_grad.cu
   Run:    build/bias_grad            (needs a CUDA GPU) */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"
#include <stdio.h>
#include <algorithm>

__global__ void v1_bias_grad(const float *dz, int B, int OUT, float *db)
{
    int j = (int)(blockIdx.x * blockDim.x + threadIdx.x), i;
    float s = 0.0f;
    if (j >= OUT) return;
    for (i = 0; i < B; ++i) s += dz[(size_t)i * OUT + j];
    db[j] = s;
}

int main(void)
{
    static const int shapes[][2] = {{512, 1024}, {512, 10}, {64, 120}, {64, 84}, {64, 10}, {32, 1024}};
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    printf("%-12s %10s %10s %8s\n", "B x OUT", "v1 us", "v2 us", "bits");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
        int B = shapes[s][0], OUT = shapes[s][1];
        size_t n = (size_t)B * OUT;
        float *h = (float *)malloc(n * sizeof(float)), *dz, *d1, *d2, t[2][9];
        float *h1 = (float *)malloc(OUT * sizeof(float)), *h2 = (float *)malloc(OUT * sizeof(float));
        for (size_t i = 0; i < n; ++i) h[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        cudaMalloc(&dz, n * sizeof(float));
        cudaMalloc(&d1, OUT * sizeof(float));
        cudaMalloc(&d2, OUT * sizeof(float));
        cudaMemcpy(dz, h, n * sizeof(float), cudaMemcpyHostToDevice);
        for (int rep = 0; rep < 9; ++rep)
            for (int v = 0; v < 2; ++v) {
                cudaEventRecord(e0);
                for (int i = 0; i < 200; ++i) {
                    if (v == 0) v1_bias_grad<<<(OUT + 255) / 256, 256>>>(dz, B, OUT, d1);
                    else mnistcu__k_bias_grad<<<(OUT + 31) / 32, 256>>>(dz, B, OUT, d2);
                }
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                cudaEventElapsedTime(&t[v][rep], e0, e1);
            }
        std::sort(t[0], t[0] + 9);
        std::sort(t[1], t[1] + 9);
        cudaMemcpy(h1, d1, OUT * sizeof(float), cudaMemcpyDeviceToHost);
        cudaMemcpy(h2, d2, OUT * sizeof(float), cudaMemcpyDeviceToHost);
        char name[32];
        snprintf(name, sizeof name, "%d x %d", B, OUT);
        printf("%-12s %10.2f %10.2f %8s\n", name, 1000.0f * t[0][4] / 200, 1000.0f * t[1][4] / 200,
               memcmp(h1, h2, OUT * sizeof(float)) ? "DIFFER" : "same");
        cudaFree(dz); cudaFree(d1); cudaFree(d2); free(h); free(h1); free(h2);
    }
    return 0;
}
