/* bench/graph_step.cu - what capturing the training step in a CUDA graph would gain: the step
   (forward, loss, backward, optimizer update; the batch already in place) launched as today, 200
   steps back to back, against the same step captured once in a CUDA graph and replayed 200 times.
   Both run the same kernels in the same order on the same data; the difference is launch and
   inter-kernel overhead. An epoch equivalent is steps_per_epoch times the per-step time (the
   gather and the statistics, left out here, add two small kernels per step).

   Build:  nvcc -O3 -arch=sm_90 -std=c++17 -o build/graph_step bench/graph_step.cu
   Run:    build/graph_step            (needs a CUDA GPU) */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"
#include <stdio.h>

static void run(const char *name, const char *spec, size_t B, size_t steps_per_epoch, float lr, float momentum)
{
    mnistcu_ctx_desc d;
    mnistcu_ctx *ctx = NULL;
    mnistcu_model *m = NULL;
    mnistcu_optim_desc o;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0, e1;
    float t_launch = 0, t_graph = 0;
    const int N = 200;
    int i, kernels = 0;
    size_t nn = 0;
    memset(&d, 0, sizeof d);
    d.device = MNISTCU_DEVICE_CUDA;
    d.gemm = MNISTCU_GEMM_OWN;
    d.log_level = MNISTCU_LOG_SILENT;
    if (mnistcu_ctx_create(&ctx, &d) || mnistcu_model_create_spec(ctx, spec, &m)) {
        printf("%s: cannot make the model: %s\n", name, ctx ? mnistcu_ctx_error(ctx) : "no context");
        mnistcu_ctx_destroy(ctx);
        return;
    }
    {
        float *x = (float *)malloc(B * m->inputs * sizeof(float));
        int32_t *lab = (int32_t *)malloc(B * sizeof(int32_t));
        double loss;
        for (size_t k = 0; k < B * m->inputs; ++k) x[k] = (float)((k * 2654435761u) % 1000) / 500.0f - 1.0f;
        for (size_t k = 0; k < B; ++k) lab[k] = (int32_t)(k % 10);
        mnistcu_model_compute_grads(m, x, lab, B, &loss); /* the batch in place, every buffer made */
        free(x);
        free(lab);
    }
    memset(&o, 0, sizeof o);
    o.kind = MNISTCU_OPTIM_SGD;
    o.learning_rate = lr;
    o.momentum = momentum;
    mnistcu__resolve_optim(ctx, &o, &o);
    mnistcu__update(m, &o); /* the optimizer state exists before capture */
    cudaStream_t st = mnistcu__cuda_stream(ctx);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaStreamSynchronize(st);
    /* launched as today */
    for (int rep = 0; rep < 2; ++rep) {
        cudaEventRecord(e0, st);
        for (i = 0; i < N; ++i) {
            mnistcu__forward(m, B);
            mnistcu__loss(m, B, 1);
            mnistcu__backward(m, B);
            mnistcu__update(m, &o);
        }
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&t_launch, e0, e1);
    }
    /* captured once, replayed */
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        printf("%s: capture refused\n", name);
    } else {
        mnistcu__forward(m, B);
        mnistcu__loss(m, B, 1);
        mnistcu__backward(m, B);
        mnistcu__update(m, &o);
        if (cudaStreamEndCapture(st, &graph) != cudaSuccess || !graph ||
            cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
            printf("%s: capture failed: %s\n", name, cudaGetErrorString(cudaGetLastError()));
            exec = NULL;
        }
    }
    if (exec) {
        cudaGraphGetNodes(graph, NULL, &nn);
        kernels = (int)nn;
        for (int rep = 0; rep < 2; ++rep) {
            cudaEventRecord(e0, st);
            for (i = 0; i < N; ++i) cudaGraphLaunch(exec, st);
            cudaEventRecord(e1, st);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&t_graph, e0, e1);
        }
        printf("%-10s %-14s batch %3zu: %2d kernels per step; launched %7.2f us/step (%6.1f ms/epoch), graph %7.2f "
               "us/step (%6.1f ms/epoch): %.2fx\n", name, spec, B, kernels, 1000.0f * t_launch / N,
               t_launch / N * steps_per_epoch, 1000.0f * t_graph / N, t_graph / N * steps_per_epoch, t_launch / t_graph);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    } else {
        printf("%-10s %-14s batch %3zu: launched %7.2f us/step (%6.1f ms/epoch), no graph\n", name, spec, B,
               1000.0f * t_launch / N, t_launch / N * steps_per_epoch);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    mnistcu_ctx_destroy(ctx);
}

int main(void)
{
    run("P1", "784-1024-10", 32, 313, 0.1f, 0.0f); /* 10 epochs of 10k: 3130 steps, printed per 313 */
    run("P2", "784-128-10", 64, 938, 0.1f, 0.0f);
    run("P3", "784-1024-1024-10", 512, 118, 0.1f, 0.0f);
    run("P4", "lenet5", 64, 938, 0.01f, 0.9f);
    run("P5", "fashion-cnn", 64, 938, 0.02f, 0.9f);
    return 0;
}
