/* bench/wgmma_rate.cu - the rate of Hopper's TF32 warp-group products (wgmma) with both operands in
   shared memory, one block a multiprocessor, on every multiprocessor; and what the TF32X3 kernel's stage
   structure (mnistcu__k_gemm_wg) costs on top of the instructions alone.

   Build:  nvcc -O3 -arch=sm_90a -std=c++17 bench/wgmma_rate.cu -o build/wgmma_rate
   Run:    build/wgmma_rate        (needs an sm_90 GPU)

   A stage is 32 k: 4 k-steps of m64nNk8 a warp group (TF32), or 12 (TF32X3: al bh + ah bl + ah bh).
   Modes, each over ITERS stages of the same shared-memory operands (their values do not matter):
     0  TF32, a stage's 4 products committed as a group, at most two groups in flight
     1  TF32X3's 12 a stage, likewise: the tensor cores' rate for the instruction mix
     2  TF32X3 as mnistcu__k_gemm_wg runs it: each stage's sum from zero, waited for (wait_group 0), added to
        an FP32 total, then a barrier before the next stage
     3  2, and the threads writing the next stage's hi and lo parts (A's rows and B's, 16-byte stores, as
        the k-major operands are written) into the other buffer while the stage's products run
     4  3 with 4-byte stores (as the transposed operands are written: four times the instructions)
   Prints, for each mode, tile (warp groups x N) and blocks, the cycles a stage (clock64, the mean over
   blocks), the FLOP a cycle a multiprocessor (TF32X3 counting its three products), and the TFLOP/s of
   the whole grid from CUDA events. bench/RESULTS.md has the figures. */
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "wgmma_rate: FAILED: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,             \
                    cudaGetErrorString(e_));                                                           \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ON 1
#else
#define WG_ON 0
#endif

#if WG_ON
static __device__ __forceinline__ void wgmma_n64(float *d, uint64_t a, uint64_t b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(scale_d));
}

static __device__ __forceinline__ void wgmma_n128(float *d, uint64_t a, uint64_t b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b), "r"(scale_d));
}

static __device__ __forceinline__ void wgmma_n256(float *d, uint64_t a, uint64_t b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(a), "l"(b), "r"(scale_d));
}

template <int N> struct wg_t;
template <> struct wg_t<64> {
    static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int s) { wgmma_n64(d, a, b, s); }
};
template <> struct wg_t<128> {
    static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int s) { wgmma_n128(d, a, b, s); }
};
template <> struct wg_t<256> {
    static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int s) { wgmma_n256(d, a, b, s); }
};
/* a k-major operand's descriptor: 128-byte swizzle, 8-row atoms 1024 bytes apart (mnistcu__wg_desc) */
static __device__ __forceinline__ uint64_t desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3ffff) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
#endif

/* a stage's bytes: hi and lo of A's 64 WGS rows and B's N rows, 128 bytes each */
static constexpr __host__ __device__ size_t stage_bytes(int WGS, int N) { return (size_t)2 * (64 * WGS + N) * 128; }

template <int N, int WGS, int MODE>
__global__ void __launch_bounds__(128 * WGS) k_rate(float *out, long long *cyc, int iters)
{
#if WG_ON
    extern __shared__ __align__(1024) char sm_raw[];
    char *sm = (char *)(((uintptr_t)sm_raw + 1023) & ~(uintptr_t)1023);
    constexpr int T = 128 * WGS, ST = (int)stage_bytes(WGS, N), OA = 64 * WGS * 128, NA = N / 2;
    const int wg = (int)threadIdx.x / 128;
    int i, j, kk, it;
    for (i = (int)threadIdx.x; i < 2 * ST / 4; i += T) /* small normal values in both buffers */
        ((float *)sm)[i] = 1.0f + 1e-3f * (float)(i % 97);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
    float acc[NA], tot[NA];
    for (j = 0; j < NA; ++j) acc[j] = tot[j] = 0.0f;
    const long long t0 = clock64();
    for (it = 0; it < iters; ++it) {
        const uint32_t s = base + (uint32_t)((MODE >= 3 ? (it & 1) : 0) * ST);
        const uint64_t ah = desc(s + wg * 64 * 128), al = desc(s + OA + wg * 64 * 128);
        const uint64_t bh = desc(s + 2 * OA), bl = desc(s + 2 * OA + N * 128);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (kk = 0; kk < 4; ++kk) {
            if (MODE >= 1) {
                wg_t<N>::run(acc, al + 2 * kk, bh + 2 * kk, MODE >= 2 ? kk > 0 : 1);
                wg_t<N>::run(acc, ah + 2 * kk, bl + 2 * kk, 1);
            }
            wg_t<N>::run(acc, ah + 2 * kk, bh + 2 * kk, 1);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        if (MODE >= 3) { /* the next stage's parts into the other buffer */
            char *nb = sm + ((it + 1) & 1) * ST;
            const uint32_t v = (uint32_t)it;
            if (MODE == 3)
#pragma unroll 4
                for (i = (int)threadIdx.x; i < ST / 16; i += T)
                    *(uint4 *)(nb + 16 * i) = make_uint4(v, v + 1, v + 2, v + 3);
            else
#pragma unroll 4
                for (i = (int)threadIdx.x; i < ST / 4; i += T) *(uint32_t *)(nb + 4 * i) = v + (uint32_t)i;
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        }
        if (MODE >= 2) {
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
            for (j = 0; j < NA; ++j) {
                asm volatile("" : "+f"(acc[j])::"memory");
                tot[j] += acc[j];
            }
            __syncthreads();
        } else
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    const long long t1 = clock64();
    float sum = 0.0f;
    for (j = 0; j < NA; ++j) sum += acc[j] + tot[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
    if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
#else
    (void)out, (void)cyc, (void)iters;
#endif
}

__global__ void k_probe(int *on) { *on = WG_ON; }

template <int N, int WGS, int MODE> static void run(int sms, int blocks_per_sm, int iters)
{
    const int blocks = sms * blocks_per_sm, T = 128 * WGS;
    const size_t smem = 2 * stage_bytes(WGS, N) + 1024;
    float *out;
    long long *cyc;
    CK(cudaMalloc((void **)&out, (size_t)blocks * T * sizeof(float)));
    CK(cudaMalloc((void **)&cyc, (size_t)blocks * sizeof(long long)));
    CK(cudaFuncSetAttribute(k_rate<N, WGS, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    k_rate<N, WGS, MODE><<<blocks, T, smem>>>(out, cyc, iters / 10); /* warm */
    CK(cudaEventRecord(a));
    k_rate<N, WGS, MODE><<<blocks, T, smem>>>(out, cyc, iters);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, a, b));
    long long *h = (long long *)malloc((size_t)blocks * sizeof(long long));
    CK(cudaMemcpy(h, cyc, (size_t)blocks * sizeof(long long), cudaMemcpyDeviceToHost));
    double mean = 0.0;
    for (int i = 0; i < blocks; ++i) mean += (double)h[i];
    mean /= blocks;
    const double per_stage_flop = 2.0 * 64 * N * 32 * WGS * (MODE >= 1 ? 3 : 1); /* a block's stage */
    const double cyc_stage = mean / iters;
    const double flop_cyc_sm = per_stage_flop * blocks_per_sm / cyc_stage;
    const double tflops = per_stage_flop * blocks * iters / (ms * 1e-3) / 1e12;
    printf("mode %d  %d x m64n%-3d  blocks %4d (%d a multiprocessor)  %8.1f cycles a stage  %7.1f FLOP/cycle/SM  "
           "%6.1f TFLOP/s  (%.2f GHz from events)\n",
           MODE, WGS, N, blocks, blocks_per_sm, cyc_stage, flop_cyc_sm, tflops,
           mean / (ms * 1e-3) / 1e9);
    free(h);
    CK(cudaFree(out));
    CK(cudaFree(cyc));
}

int main()
{
    int dev = 0, sms = 0, *don, on = 0;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    sms = prop.multiProcessorCount;
    CK(cudaMalloc((void **)&don, sizeof(int)));
    k_probe<<<1, 1>>>(don);
    CK(cudaMemcpy(&on, don, sizeof on, cudaMemcpyDeviceToHost));
    printf("wgmma_rate: %s, %d multiprocessors, sm_%d%d\n", prop.name, sms, prop.major, prop.minor);
    if (!on) {
        printf("wgmma_rate: no sm_90a code for this GPU\n");
        return 0;
    }
    const int it = 4000;
    run<64, 2, 0>(sms, 1, it);
    run<128, 2, 0>(sms, 1, it);
    run<256, 2, 0>(sms, 1, it);
    run<128, 1, 0>(sms, 1, it);
    run<128, 1, 0>(sms, 2, it);
    run<64, 2, 1>(sms, 1, it);
    run<128, 2, 1>(sms, 1, it);
    run<256, 1, 1>(sms, 1, it);
    run<128, 2, 2>(sms, 1, it);
    run<64, 2, 2>(sms, 1, it);
    run<64, 2, 2>(sms, 2, it);
    run<128, 2, 3>(sms, 1, it);
    run<64, 2, 3>(sms, 1, it);
    run<128, 2, 4>(sms, 1, it);
    return 0;
}
