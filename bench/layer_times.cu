/* bench/layer_times.cu - where a training step's time goes: each layer's forward and backward pass
   timed alone (CUDA events around its launches, median of 50), and the whole step (forward, loss,
   backward), for LeNet-5 and the Fashion CNN at batch 64, with our kernels and with cuDNN.

   Build:  nvcc -O3 -arch=sm_90 -std=c++17 -DMNISTCU_CUDNN -o build/layer_times bench/layer_times.cu -lcudnn
           (without -DMNISTCU_CUDNN and -lcudnn: our kernels only; the cuDNN rows then fail to make a context)
   Run:    build/layer_times            (needs a CUDA GPU) */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"
#include <stdio.h>
#include <algorithm>
static float med(float *t, int n) { std::sort(t, t + n); return t[n / 2]; }
static void prof(const char *spec, mnistcu_cnn cnn, size_t B)
{
    mnistcu_ctx_desc d; memset(&d, 0, sizeof d); d.device = MNISTCU_DEVICE_CUDA; d.cnn = cnn; d.gemm = MNISTCU_GEMM_OWN;
    d.log_level = MNISTCU_LOG_SILENT;
    mnistcu_ctx *ctx; mnistcu_model *m;
    if (mnistcu_ctx_create(&ctx, &d) || mnistcu_model_create_spec(ctx, spec, &m)) { printf("fail %s\n", mnistcu_ctx_error(ctx)); return; }
    float *x = (float *)malloc(B * m->inputs * 4); int32_t *lab = (int32_t *)malloc(B * 4); double loss;
    for (size_t i = 0; i < B * m->inputs; ++i) x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    for (size_t i = 0; i < B; ++i) lab[i] = (int32_t)(i % 10);
    mnistcu_model_compute_grads(m, x, lab, B, &loss);
    cudaStream_t st = mnistcu__cuda_stream(ctx);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    float tf[64][50], tb[64][50], tstep[50], tot_f = 0, tot_b = 0;
    for (int it = 0; it < 50; ++it) {
        cudaEventRecord(e0, st);
        mnistcu__forward(m, B); mnistcu__loss(m, B, 1); mnistcu__backward(m, B);
        cudaEventRecord(e1, st); cudaEventSynchronize(e1); cudaEventElapsedTime(&tstep[it], e0, e1);
        for (int l = 0; l < m->num_layers; ++l) {
            mnistcu__layer *L = &m->layers[l]; tf[l][it] = tb[l][it] = 0;
            if (L->passthrough) continue;
            cudaEventRecord(e0, st); mnistcu__kinds[L->d.kind]->forward[1](m, L, B); cudaEventRecord(e1, st);
            cudaEventSynchronize(e1); cudaEventElapsedTime(&tf[l][it], e0, e1);
            if (!L->need_dx && L->nw + L->nb == 0) continue;
            cudaEventRecord(e0, st); mnistcu__kinds[L->d.kind]->backward[1](m, L, B, m->dbuf[0], L->need_dx ? m->dbuf[1] : NULL); cudaEventRecord(e1, st);
            cudaEventSynchronize(e1); cudaEventElapsedTime(&tb[l][it], e0, e1);
        }
    }
    printf("%s, %s, batch %zu: whole step (forward, loss, backward) %.1f us\n", spec, cnn == MNISTCU_CNN_CUDNN ? "cuDNN" : "own", B, 1000 * med(tstep, 50));
    for (int l = 0; l < m->num_layers; ++l) {
        mnistcu_layer_info li; mnistcu_model_layer_info(m, l, &li);
        float f = 1000 * med(tf[l], 50), b = 1000 * med(tb[l], 50); tot_f += f; tot_b += b;
        printf("  %2d %-14s fwd %8.1f us  bwd %8.1f us\n", l, li.spec, f, b);
    }
    printf("  sum: fwd %.1f us, bwd %.1f us (each layer timed alone, launch gaps included)\n", tot_f, tot_b);
    mnistcu_ctx_destroy(ctx); free(x); free(lab);
}
int main() {
    prof("fashion-cnn", MNISTCU_CNN_OWN, 64); prof("fashion-cnn", MNISTCU_CNN_CUDNN, 64);
    prof("lenet5", MNISTCU_CNN_OWN, 64); prof("lenet5", MNISTCU_CNN_CUDNN, 64);
    return 0;
}
