/* bench/cuda_layout.cu - the convolution and pooling layers' passes that move data rather than
   multiply: the 2x2 max pool forward and backward, the columns path's im2col, col2im and the
   product's reordering (conv_out, conv_dout), at the shapes of LeNet-5 (P4) and the Fashion CNN
   (P5), batch 64; and the small-problem product (mnistcu__k_gemm16) at LeNet-5's dense shapes.
   Each pass in its earlier form (a thread an element, the planes in the grid's y; loops over the
   kernel size at run time; the product's tiles staged 16 values of k at a time, below as
   old_gemm16) and in the header's current one, on the same inputs: the outputs compared bit for
   bit, then each timed (CUDA events around 200 launches, median of 7 rounds, us a launch).

   Build:  nvcc -O3 -arch=sm_90 -o build/cuda_layout bench/cuda_layout.cu
   Run:    build/cuda_layout            (needs a CUDA GPU) */
#define MNISTCU_IMPLEMENTATION
#define MNISTCU_NO_PDL
#include "../mnistcu.h"
#include <stdio.h>
#include <algorithm>
#include <vector>

static int bad = 0;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

template <typename F> static float timed(F launch)
{
    cudaEvent_t a, b;
    float t[7], ms;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    launch(); CK(cudaDeviceSynchronize());
    for (int r = 0; r < 7; ++r) {
        CK(cudaEventRecord(a));
        for (int i = 0; i < 200; ++i) launch();
        CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms, a, b));
        t[r] = 1000.0f * ms / 200;
    }
    CK(cudaGetLastError());
    std::sort(t, t + 7);
    return t[3];
}
static float *dev_rand(size_t n, unsigned seed, int ties)
{
    std::vector<float> h(n);
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; ++i) {
        s = s * 1664525u + 1013904223u;
        h[i] = ties ? (float)((s >> 16) % 7) - 3.0f : (float)((int)(s >> 8) % 20001 - 10000) / 1000.0f;
    }
    float *d; CK(cudaMalloc(&d, n * 4)); CK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
    return d;
}
static void same(const char *what, const void *a, const void *b, size_t bytes)
{
    std::vector<char> x(bytes), y(bytes);
    CK(cudaMemcpy(x.data(), a, bytes, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(y.data(), b, bytes, cudaMemcpyDeviceToHost));
    int ok = !memcmp(x.data(), y.data(), bytes);
    if (!ok) ++bad;
    printf("  %-44s %s\n", what, ok ? "same bits" : "DIFFERENT");
}

/* the header's mnistcu__k_gemm16 before its tiles were staged 128 values of k at a time */
template <int TA, int TB, int FUSE>
__global__ void __launch_bounds__(256) old_gemm16(int M, int N, int K, const float *__restrict__ A, int lda,
                                                          const float *__restrict__ B, int ldb, float *__restrict__ C,
                                                          int ldc, const float *__restrict__ bias, int act)
{
    MNISTCU__PDL_WAIT();
    __shared__ float As[MNISTCU__GT][MNISTCU__GT + 1]; /* [m][k] */
    __shared__ float Bs[MNISTCU__GT][MNISTCU__GT + 1]; /* [k][n] */
    const int tx = (int)threadIdx.x % MNISTCU__GT, ty = (int)threadIdx.x / MNISTCU__GT;
    const int n0 = (int)blockIdx.x * MNISTCU__GT;
    int m0, k0, kk;
    MNISTCU__GEMM_SLICE();
    for (m0 = (int)blockIdx.y * MNISTCU__GT; m0 < M; m0 += (int)gridDim.y * MNISTCU__GT) {
        float acc = 0.0f;
        for (k0 = kz0; k0 < K; k0 += MNISTCU__GT) {
            /* each thread stages one element of each tile, reading along the
               source's contiguous direction */
            int am = TA ? tx : ty, ak = TA ? ty : tx, bk = TB ? tx : ty, bn = TB ? ty : tx;
            int gm = m0 + am, gka = k0 + ak, gn = n0 + bn, gkb = k0 + bk;
            As[am][ak] = (gm < M && gka < K) ? (TA ? A[(size_t)gka * lda + gm] : A[(size_t)gm * lda + gka]) : 0.0f;
            Bs[bk][bn] = (gn < N && gkb < K) ? (TB ? B[(size_t)gn * ldb + gkb] : B[(size_t)gkb * ldb + gn]) : 0.0f;
            __syncthreads();
#pragma unroll
            for (kk = 0; kk < MNISTCU__GT; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
            __syncthreads();
        }
        if (m0 + ty < M && n0 + tx < N)
            C[(size_t)(m0 + ty) * ldc + n0 + tx] =
                FUSE ? mnistcu__act_f((mnistcu_act)act, bias ? acc + bias[n0 + tx] : acc) : acc;
    }
}

/* C [M][N] = op(A) op(B) (+ bias, ReLU where fused), as the header launches the small product */
template <int TA, int TB, int FUSE> static void small_product(const char *name, int M, int N, int K, int S)
{
    const int lda = TA ? M : K, ldb = TB ? K : N;
    float *A = dev_rand((size_t)M * K, 7, 0), *B = dev_rand((size_t)K * N, 8, 0), *bias = dev_rand(N, 9, 0), *c0, *c1;
    CK(cudaMalloc(&c0, (size_t)S * M * N * 4)); CK(cudaMalloc(&c1, (size_t)S * M * N * 4));
    dim3 grid((N + 15) / 16, (M + 15) / 16, S);
    const float *bb = FUSE ? bias : NULL;
    const int act = FUSE ? (int)MNISTCU_ACT_RELU : 0;
    auto g0 = [&] { old_gemm16<TA, TB, FUSE><<<grid, 256>>>(M, N, K, A, lda, B, ldb, c0, N, bb, act); };
    auto g1 = [&] { mnistcu__k_gemm16<TA, TB, FUSE><<<grid, 256>>>(M, N, K, A, lda, B, ldb, c1, N, bb, act); };
    printf("%s: %d x %d x %d%s%s, %d slice(s)\n", name, M, N, K, TA ? ", A transposed" : "", TB ? ", B transposed" : "", S);
    g0(); g1(); CK(cudaDeviceSynchronize());
    same("product", c0, c1, (size_t)S * M * N * 4);
    printf("  product   %7.2f -> %7.2f us\n", timed(g0), timed(g1));
    cudaFree(A); cudaFree(B); cudaFree(bias); cudaFree(c0); cudaFree(c1);
}

/* planes of h x w, 2x2 windows of stride 2; act: the pool's folded ReLU; act_in: the derivative of the
   convolution's activation taken in the backward pass (LeNet's ReLU) */
static void pool(const char *name, int planes, int h, int w, int relu, int relu_in, int ties)
{
    const int act = relu ? MNISTCU_ACT_RELU : MNISTCU_ACT_IDENTITY, act_in = relu_in ? MNISTCU_ACT_RELU : MNISTCU_ACT_IDENTITY;
    mnistcu__geom g = {1, h, w, 2, 2, 2, 2, 0, (h - 2) / 2 + 1, (w - 2) / 2 + 1};
    size_t S = (size_t)h * w, P = (size_t)g.oh * g.ow, Q = (size_t)((h + 1) / 2) * ((w + 1) / 2);
    float *x = dev_rand(planes * S, 1, ties), *dy = dev_rand(planes * P, 2, 0), *y0, *y1, *dx0, *dx1;
    int32_t *a0, *a1;
    CK(cudaMalloc(&y0, planes * P * 4)); CK(cudaMalloc(&y1, planes * P * 4));
    CK(cudaMalloc(&a0, planes * P * 4)); CK(cudaMalloc(&a1, planes * P * 4));
    CK(cudaMalloc(&dx0, planes * S * 4)); CK(cudaMalloc(&dx1, planes * S * 4));
    CK(cudaMemset(dx0, 0xff, planes * S * 4)); CK(cudaMemset(dx1, 0x7f, planes * S * 4));
    dim3 gp = mnistcu__grid_plane(P, planes, 1), gs = mnistcu__grid_plane(S, planes, 1);
    auto f0 = [&] { mnistcu__k_pool_forward_y<<<gp, MNISTCU__PLANE_THREADS>>>(x, g, 1, act, y0, a0); };
    auto f1 = [&] { mnistcu__k_pool2_forward<<<mnistcu__blocks(planes * P), MNISTCU__THREADS>>>(x, h, w, g.oh, g.ow, (int)(planes * P), act, y1, a1); };
    const float *yb = relu ? y0 : NULL, *yin = relu_in ? x : NULL;
    auto b0 = [&] { mnistcu__k_pool_backward_y<1><<<gs, MNISTCU__PLANE_THREADS>>>(dy, a0, yb, g, dx0, act_in, yin); };
    auto b1 = [&] { mnistcu__k_pool2_backward<<<mnistcu__blocks(planes * Q), MNISTCU__THREADS>>>(dy, a0, yb, h, w, g.oh, g.ow, (int)(planes * Q), dx1, act_in, yin, 0, 0); };
    printf("%s: %d planes of %dx%d%s%s\n", name, planes, h, w, relu ? ", ReLU folded" : "", relu_in ? ", the ReLU derivative before" : "");
    f0(); f1(); b0(); b1(); CK(cudaDeviceSynchronize());
    same("forward output", y0, y1, planes * P * 4); same("forward argmax", a0, a1, planes * P * 4);
    same("backward input gradient", dx0, dx1, planes * S * 4);
    printf("  forward  %7.2f -> %7.2f us\n", timed(f0), timed(f1));
    printf("  backward %7.2f -> %7.2f us\n", timed(b0), timed(b1));
    cudaFree(x); cudaFree(dy); cudaFree(y0); cudaFree(y1); cudaFree(a0); cudaFree(a1); cudaFree(dx0); cudaFree(dx1);
}

/* the columns path of a stride-1 convolution: B samples of c x h x w, k x k, oc outputs */
static void columns(const char *name, int B, int c, int h, int w, int k, int pad, int oc)
{
    mnistcu__geom g = {c, h, w, k, k, 1, 1, pad, h + 2 * pad - k + 1, w + 2 * pad - k + 1};
    size_t S = (size_t)h * w, P = (size_t)g.oh * g.ow, BP = (size_t)B * P, K = (size_t)c * k * k, in = (size_t)c * S;
    float *x = dev_rand(B * in, 3, 0), *c0, *c1, *dx0, *dx1, *prod = dev_rand(oc * BP, 4, 0), *bias = dev_rand(oc, 5, 0);
    float *y0, *y1, *dy = dev_rand(oc * BP, 6, 0), *dp0, *dp1;
    CK(cudaMalloc(&c0, K * BP * 4)); CK(cudaMalloc(&c1, K * BP * 4));
    CK(cudaMalloc(&dx0, B * in * 4)); CK(cudaMalloc(&dx1, B * in * 4));
    CK(cudaMalloc(&y0, oc * BP * 4)); CK(cudaMalloc(&y1, oc * BP * 4));
    CK(cudaMalloc(&dp0, oc * BP * 4)); CK(cudaMalloc(&dp1, oc * BP * 4));
    dim3 gi = mnistcu__grid_plane(P, (size_t)c * k, B), gc = mnistcu__grid_plane(S, c, B);
    void (*im)(const float *, mnistcu__geom, int, size_t, float *) = k == 3 ? mnistcu__k_im2col_rows<3> : mnistcu__k_im2col_rows<5>;
    void (*ci)(const float *, mnistcu__geom, int, float *) = k == 3 ? mnistcu__k_col2im_s1<3> : mnistcu__k_col2im_s1<5>;
    auto i0 = [&] { mnistcu__k_im2col_rows<0><<<gi, MNISTCU__PLANE_THREADS>>>(x, g, B, in, c0); };
    auto i1 = [&] { im<<<gi, MNISTCU__PLANE_THREADS>>>(x, g, B, in, c1); };
    auto o0 = [&] { mnistcu__k_col2im_s1<0><<<gc, MNISTCU__PLANE_THREADS>>>(c0, g, B, dx0); };
    auto o1 = [&] { ci<<<gc, MNISTCU__PLANE_THREADS>>>(c0, g, B, dx1); };
    int n = (int)(oc * BP);
    auto p0 = [&] { mnistcu__k_conv_out<<<mnistcu__blocks(n), MNISTCU__THREADS>>>(prod, bias, (int)MNISTCU_ACT_RELU, B, oc, (int)P, y0); };
    auto p1 = [&] { mnistcu__k_conv_out4<<<mnistcu__blocks4(n), MNISTCU__THREADS>>>(prod, bias, (int)MNISTCU_ACT_RELU, B, oc, (int)P, y1); };
    auto d0 = [&] { mnistcu__k_conv_dout<<<mnistcu__blocks(n), MNISTCU__THREADS>>>(dy, y0, (int)MNISTCU_ACT_RELU, B, oc, (int)P, dp0); };
    auto d1 = [&] { mnistcu__k_conv_dout4<<<mnistcu__blocks4(n), MNISTCU__THREADS>>>(dy, y0, (int)MNISTCU_ACT_RELU, B, oc, (int)P, dp1); };
    printf("%s: batch %d, %d x %dx%d -> %d, %dx%d kernel, padding %d\n", name, B, c, h, w, oc, k, k, pad);
    i0(); i1(); o0(); o1(); p0(); p1(); d0(); d1(); CK(cudaDeviceSynchronize());
    same("im2col columns", c0, c1, K * BP * 4); same("col2im input gradient", dx0, dx1, B * in * 4);
    same("conv_out (bias, ReLU, reordered)", y0, y1, oc * BP * 4); same("conv_dout (ReLU derivative, reordered)", dp0, dp1, oc * BP * 4);
    printf("  im2col    %7.2f -> %7.2f us\n", timed(i0), timed(i1));
    printf("  col2im    %7.2f -> %7.2f us\n", timed(o0), timed(o1));
    printf("  conv_out  %7.2f -> %7.2f us\n", timed(p0), timed(p1));
    printf("  conv_dout %7.2f -> %7.2f us\n", timed(d0), timed(d1));
    cudaFree(x); cudaFree(c0); cudaFree(c1); cudaFree(dx0); cudaFree(dx1); cudaFree(prod); cudaFree(bias);
    cudaFree(y0); cudaFree(y1); cudaFree(dy); cudaFree(dp0); cudaFree(dp1);
}

int main(void)
{
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("%s\n", p.name);
    pool("Fashion CNN pool 1", 64 * 64, 26, 26, 1, 0, 0);
    pool("Fashion CNN pool 2", 64 * 128, 11, 11, 1, 0, 0);
    pool("LeNet-5 pool 1", 64 * 6, 24, 24, 0, 1, 0);
    pool("LeNet-5 pool 2", 64 * 16, 8, 8, 0, 1, 0);
    pool("ties, odd map", 1000, 13, 9, 1, 1, 1);
    columns("Fashion CNN conv2", 64, 64, 13, 13, 3, 0, 128);
    columns("5x5, padding 2, odd map", 8, 6, 11, 9, 5, 2, 16);
    small_product<0, 1, 1>("LeNet-5 dense1 forward (bias, ReLU)", 64, 120, 256, 1);
    small_product<0, 1, 1>("LeNet-5 dense2 forward (bias, ReLU)", 64, 84, 120, 1);
    small_product<1, 0, 0>("LeNet-5 dense1 weight gradient", 120, 256, 64, 1);
    small_product<0, 0, 0>("LeNet-5 dense2 input gradient", 64, 120, 84, 1);
    small_product<0, 0, 0>("LeNet-5 dense1 input gradient", 64, 256, 120, 1);
    small_product<0, 1, 0>("odd sizes, K split in 3", 37, 29, 701, 3);
    small_product<1, 1, 0>("odd sizes, both transposed", 19, 45, 133, 1);
    printf("%s\n", bad ? "SOME OUTPUTS DIFFER" : "every pass: the same bits");
    return bad != 0;
}
