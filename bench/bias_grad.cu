/* bench/bias_grad.cu - the bias gradient (column sums of dz[B][OUT], rows in order from zero, the
   CPU's bits) two ways: v1, a thread per column reading its column row by row (the header's first
   version), and v2, the header's mnistcu__k_bias_grad with no activation (32 columns a block, 128 rows
   staged in shared memory per pass by all 8 warps, the next pass loading while one warp runs the
   chains). Shapes of
   P3 (batch 512: 1024 and 10 columns) and LeNet-5 (batch 64: 120, 84, 10). Prints us per call
   (median of 9 runs of 200 back-to-back launches) and checks v2's bits against v1's; then the same
   with a ReLU's derivative applied first (the activation kernel then v1, against the header's kernel
   doing both), and the training step's loss and statistics as two kernels against the header's one.

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

/* us per call of f, median of 9 runs of 200 back-to-back calls */
template <class F> static float time_us(F f)
{
    cudaEvent_t e0, e1;
    float t[9];
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int rep = 0; rep < 9; ++rep) {
        cudaEventRecord(e0);
        for (int i = 0; i < 200; ++i) f();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&t[rep], e0, e1);
    }
    std::sort(t, t + 9);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1000.0f * t[4] / 200;
}

int main(void)
{
    static const int shapes[][2] = {{512, 1024}, {512, 10}, {64, 120}, {64, 84}, {64, 10}, {32, 1024}};
    printf("bias gradient alone, and with a ReLU's derivative: v3 = the activation kernel then v1, v4 = the one\n"
           "kernel; then the loss and statistics, two kernels against one\n");
    printf("%-12s %8s %8s %6s %8s %8s %6s\n", "B x OUT", "v1 us", "v2 us", "bits", "v3 us", "v4 us", "bits");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
        int B = shapes[s][0], OUT = shapes[s][1];
        size_t n = (size_t)B * OUT;
        float *h = (float *)malloc(n * sizeof(float)), *dz, *y, *dza, *dzb, *d1, *d2;
        float *h1 = (float *)malloc(OUT * sizeof(float)), *h2 = (float *)malloc(OUT * sizeof(float));
        for (size_t i = 0; i < n; ++i) h[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        cudaMalloc(&dz, n * sizeof(float));
        cudaMalloc(&y, n * sizeof(float));
        cudaMalloc(&dza, n * sizeof(float));
        cudaMalloc(&dzb, n * sizeof(float));
        cudaMalloc(&d1, OUT * sizeof(float));
        cudaMalloc(&d2, OUT * sizeof(float));
        cudaMemcpy(dz, h, n * sizeof(float), cudaMemcpyHostToDevice);
        cudaMemcpy(y, h, n * sizeof(float), cudaMemcpyHostToDevice);
        float t1 = time_us([&] { v1_bias_grad<<<(OUT + 255) / 256, 256>>>(dz, B, OUT, d1); });
        float t2 = time_us([&] { mnistcu__k_bias_grad<<<(OUT + 31) / 32, 256>>>(dz, NULL, MNISTCU_ACT_IDENTITY, B, OUT, d2, NULL, NULL, NULL, mnistcu__opt{}); });
        cudaMemcpy(h1, d1, OUT * sizeof(float), cudaMemcpyDeviceToHost);
        cudaMemcpy(h2, d2, OUT * sizeof(float), cudaMemcpyDeviceToHost);
        int same12 = !memcmp(h1, h2, OUT * sizeof(float));
        /* with the activation (in place: each timed call works on a copy's result, the same work) */
        float t3 = time_us([&] {
            mnistcu__k_act_backward<<<mnistcu__blocks(n), MNISTCU__THREADS>>>(dza, y, n, MNISTCU_ACT_RELU);
            v1_bias_grad<<<(OUT + 255) / 256, 256>>>(dza, B, OUT, d1);
        });
        float t4 = time_us([&] {
            mnistcu__k_bias_grad<<<(OUT + 31) / 32, 256>>>(dzb, y, MNISTCU_ACT_RELU, B, OUT, d2, NULL, NULL, NULL, mnistcu__opt{});
        });
        cudaMemcpy(dza, dz, n * sizeof(float), cudaMemcpyDeviceToDevice);
        cudaMemcpy(dzb, dz, n * sizeof(float), cudaMemcpyDeviceToDevice);
        mnistcu__k_act_backward<<<mnistcu__blocks(n), MNISTCU__THREADS>>>(dza, y, n, MNISTCU_ACT_RELU);
        v1_bias_grad<<<(OUT + 255) / 256, 256>>>(dza, B, OUT, d1);
        mnistcu__k_bias_grad<<<(OUT + 31) / 32, 256>>>(dzb, y, MNISTCU_ACT_RELU, B, OUT, d2, NULL, NULL, NULL, mnistcu__opt{});
        cudaMemcpy(h1, d1, OUT * sizeof(float), cudaMemcpyDeviceToHost);
        cudaMemcpy(h2, d2, OUT * sizeof(float), cudaMemcpyDeviceToHost);
        char name[32];
        snprintf(name, sizeof name, "%d x %d", B, OUT);
        printf("%-12s %8.2f %8.2f %6s %8.2f %8.2f %6s\n", name, t1, t2, same12 ? "same" : "DIFFER", t3, t4,
               memcmp(h1, h2, OUT * sizeof(float)) ? "DIFFER" : "same");
        cudaFree(dz); cudaFree(y); cudaFree(dza); cudaFree(dzb); cudaFree(d1); cudaFree(d2);
        free(h); free(h1); free(h2);
    }
    printf("%-12s %12s %12s\n", "B (C = 10)", "2 kernels us", "1 kernel us");
    for (int B = 64; B <= 512; B *= 8) {
        const int C = 10;
        mnistcu__lossp lp;
        float *z, *g, *l;
        int32_t *lab, *pred;
        double *o;
        memset(&lp, 0, sizeof lp);
        lp.kind = MNISTCU_LOSS_SOFTMAX_CE;
        cudaMalloc(&z, (size_t)B * C * sizeof(float));
        cudaMalloc(&g, (size_t)B * C * sizeof(float));
        cudaMalloc(&l, (size_t)B * sizeof(float));
        cudaMalloc(&lab, (size_t)B * sizeof(int32_t));
        cudaMalloc(&pred, (size_t)B * sizeof(int32_t));
        cudaMalloc(&o, 2 * sizeof(double));
        cudaMemset(z, 0, (size_t)B * C * sizeof(float));
        cudaMemset(lab, 0, (size_t)B * sizeof(int32_t));
        float a = time_us([&] {
            mnistcu__k_loss<<<mnistcu__blocks((size_t)B), MNISTCU__THREADS>>>(lp, z, lab, NULL, B, C, 1.0f / B, g, l, pred);
            mnistcu__k_step_stats<<<1, MNISTCU__THREADS>>>(l, pred, lab, B, o, o + 1, NULL);
        });
        float b = time_us([&] {
            mnistcu__k_loss_stats<<<1, MNISTCU__THREADS>>>(lp, z, lab, NULL, B, C, 1.0f / B, g, l, pred, o, o + 1, NULL);
        });
        printf("%-12d %12.2f %12.2f\n", B, a, b);
        cudaFree(z); cudaFree(g); cudaFree(l); cudaFree(lab); cudaFree(pred); cudaFree(o);
    }
    return 0;
}
