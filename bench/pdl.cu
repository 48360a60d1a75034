/* bench/pdl.cu: what a kernel boundary costs in a CUDA graph, with and without programmatic
   dependent launch (Hopper's griddepcontrol).

   A chain of K dependent kernels (each reads the buffer the one before wrote) captured as one graph
   and replayed; the time a kernel is the replay's time over K. Variants:
     plain   ordinary launches (the next kernel starts after the last finished and its writes flushed)
     wait    launched with programmaticStreamSerialization, every kernel waits (griddepcontrol.wait)
             before its first global access; dependents launched when blocks exit (implicit trigger)
     trig    as wait, and each block also releases its dependents (griddepcontrol.launch_dependents)
             right after its wait, so the next grid is launched while this one's last wave runs
   plain x10, wait x10: the chain captured ten times in one graph, replayed a tenth as often (what a
             graph launch adds over a kernel boundary).
   Sizes: 'small' (one block a multiprocessor), 'mid' (1M floats), 'big' (8M floats).
   Every variant must produce the same final buffer (checked).

   nvcc -O3 -arch=sm_90 -o pdl bench/pdl.cu && ./pdl */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

template <int MODE>
__global__ void k_step(const float *x, float *y, int n, float a) {
    if (MODE >= 1) pdl_wait();
    if (MODE == 2) pdl_trigger();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = x[i] * a + 1.0f;
}

static void launch(int mode, int grid, const float *x, float *y, int n, float a, cudaStream_t st) {
    cudaLaunchConfig_t c;
    memset(&c, 0, sizeof c);
    c.gridDim = dim3(grid);
    c.blockDim = dim3(256);
    c.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    if (mode) {
        c.attrs = at;
        c.numAttrs = 1;
    }
    if (mode == 0) CK(cudaLaunchKernelEx(&c, k_step<0>, x, y, n, a));
    else if (mode == 1) CK(cudaLaunchKernelEx(&c, k_step<1>, x, y, n, a));
    else CK(cudaLaunchKernelEx(&c, k_step<2>, x, y, n, a));
}

int main(void) {
    const int K = 24, REPS = 300; /* REPS a multiple of 10 */
    const char *mname[3] = {"plain", "wait", "trig"};
    struct { const char *name; int n, grid; } sz[3] = {{"small", 132 * 256, 132}, {"mid", 1 << 20, 1024},
                                                       {"big", 8 << 20, 4096}};
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("device %s, %d SMs, cc %d.%d\n", p.name, p.multiProcessorCount, p.major, p.minor);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int s = 0; s < 3; s++) {
        int n = sz[s].n;
        float *a, *b;
        CK(cudaMalloc(&a, n * sizeof(float)));
        CK(cudaMalloc(&b, n * sizeof(float)));
        float *ref = (float *)malloc(n * sizeof(float)), *got = (float *)malloc(n * sizeof(float));
        for (int v = 0; v < 5; v++) {
            /* modes 3, 4: plain and wait, the chain captured 10 times in one graph (a tenth of the graph
               launches for the same kernels) */
            int mode = v < 3 ? v : v - 3, rep = v < 3 ? 1 : 10;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaMemsetAsync(a, 0, n * sizeof(float), st));
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int k = 0; k < K * rep; k++)
                launch(mode, sz[s].grid, k & 1 ? b : a, k & 1 ? a : b, n, k & 2 ? 0.5f : 0.25f, st);
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            /* correctness: one replay from zeros */
            CK(cudaGraphLaunch(ge, st));
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(got, a, n * sizeof(float), cudaMemcpyDeviceToHost));
            if (mode == 0) memcpy(ref, got, n * sizeof(float));
            int bad = memcmp(ref, got, n * sizeof(float)) != 0;
            for (int w = 0; w < 20; w++) CK(cudaGraphLaunch(ge, st));
            float best = 1e30f, tot = 0;
            for (int r = 0; r < 5; r++) {
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < REPS / rep; i++) CK(cudaGraphLaunch(ge, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                float us = ms * 1000.0f / (REPS * K);
                tot += us;
                if (us < best) best = us;
            }
            printf("%-6s %-6s%-4s  %.3f us a kernel (best of 5), %.3f mean%s\n", sz[s].name, mname[mode], rep > 1 ? "x10" : "", best,
                   tot / 5, bad ? "  RESULT DIFFERS" : "");
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
        CK(cudaFree(a));
        CK(cudaFree(b));
        free(ref);
        free(got);
    }
    return 0;
}
