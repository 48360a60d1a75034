/* bench/gemm_wg.cu - FP32 products on Hopper's warp-group tensor instructions (wgmma), in one TF32 part
   or three, against cuBLAS.

   Build:  nvcc -O3 -arch=sm_90a -std=c++17 bench/gemm_wg.cu -o build/gemm_wg -lcublas
   Run:    build/gemm_wg            (needs an sm_90 GPU; exits 1 when a variant is wrong)

   C[M][N] = op(A)[M][K] op(B)[K][N], row-major, the shapes of bench/gemm_tc3.cu: P3's five products
   and the Fashion CNN's second convolution.

   wgmma takes both operands of a TF32 product from shared memory, k-major (A as [m][k], B as [n][k]),
   in 8-row atoms of 128 bytes whose 16-byte chunks are permuted by the row (the 128-byte swizzle), and
   a warp group of four warps makes 64 rows of C at once. So the operands cannot be copied as they are:
   each thread loads its part of a stage (32 k) from global memory into registers, a stage ahead, and
   writes it into the swizzled layout, transposed where the global matrix is k-minor (A [k][m], B [k][n])
   and, in three parts, split into hi = v rounded to TF32 and lo = v - hi, each in its own tile. A stage
   is then 4 k-steps of one product (1xTF32), or three (3xTF32: al bh + ah bl + ah bh). Three parts
   sum each stage's 32 k on the tensor cores from zero and add it to an FP32 total rounded to nearest
   (the tensor cores' own sums over long K truncate: bench/gemm_tc3.cu), in one accumulator (the next
   stage waits for the add), or two in turn ("pp": the next stage runs while the last is added), or
   one over pairs of stages ("pair": 64 k summed on the tensor cores, a wait every other stage).
   One part keeps a stage of wgmma in flight while the next stage is written. A block is one or two
   warp groups (64 or 128 rows of C) and BN columns (64, 128 or 256), over a slice of K; slices are
   added by a second kernel in order.

   "A regs" variants take A from registers (each thread loads its own fragments; shared memory then
   holds B only). With any argument, only P3's products and the edges, and four variants.

   Checked and timed as bench/gemm_tc3.cu: relative Frobenius error against a double-precision CPU
   product (3xTF32 within 2x cuBLAS FP32's error plus 1e-6, 1xTF32 below 2e-3); CUDA events over 20
   launches, median of 15. bench/RESULTS.md has the figures. */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#define CK(x)                                                                                           \
    do {                                                                                                \
        cudaError_t e_ = (x);                                                                           \
        if (e_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "gemm_wg: FAILED: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,                \
                    cudaGetErrorString(e_));                                                            \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)

#define BK 32 /* k a stage: one 128-byte row of the swizzle */

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ON 1
#else
#define WG_ON 0
#endif

static __device__ __forceinline__ __attribute__((unused)) uint32_t tf32(float x)
{
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

#if WG_ON
static __device__ __forceinline__ void wgmma_n64(float *d, uint64_t a, uint64_t b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(scale_d));
}

static __device__ __forceinline__ void wgmma_n128(float *d, uint64_t a, uint64_t b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b), "r"(scale_d));
}

static __device__ __forceinline__ void wgmma_n256(float *d, uint64_t a, uint64_t b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(a), "l"(b), "r"(scale_d));
}
static __device__ __forceinline__ void wgmma_rs_n64(float *d, const uint32_t *a, uint64_t b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

static __device__ __forceinline__ void wgmma_rs_n128(float *d, const uint32_t *a, uint64_t b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

static __device__ __forceinline__ void wgmma_rs_n256(float *d, const uint32_t *a, uint64_t b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, {%128, %129, %130, %131}, %132, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

/* A k-major operand in shared memory, 128-byte swizzle: rows of 32 k (128 bytes), 8-row atoms of 1024
   bytes one after another (the stride 1024 bytes, the leading offset unused). The start address moves
   by 32 bytes a k-step of 8 inside the atom's row. */
static __device__ __forceinline__ uint64_t desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3ffff) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* the threads' stores into shared memory made visible to wgmma's reads (the async proxy) */
static __device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

template <int BN> static __device__ __forceinline__ void wgmma(float *d, uint64_t a, uint64_t b, int scale_d)
{
    if (BN == 64) wgmma_n64(d, a, b, scale_d);
    else if (BN == 128) wgmma_n128(d, a, b, scale_d);
    else wgmma_n256(d, a, b, scale_d);
}

/* Byte offset of element (r, k) in a swizzled k-major tile. */
static __device__ __forceinline__ uint32_t swz(int r, int k)
{
    return (uint32_t)(r * 128 + ((((k >> 2) ^ r) & 7) << 4) + (k & 3) * 4);
}

/* One operand's stage in registers: R rows from r0 (below rlim) and k from k0 (below kend); KM: the
   global matrix is X[r][k], else X[k][r]. Chunk c of R * 8 (16 bytes each): KM: row c / 8, k 4 (c % 8);
   else a warp's 32 chunks are 8 k by 4 runs of 4 rows (64 bytes of a global row each, and at most a
   2-way bank conflict on the transposed stores). */
template <int KM, int R, int THREADS> struct opload {
    static constexpr int C = R * 8 / THREADS;
    float4 v[C];
    __device__ __forceinline__ void load(const float *X, int ld, int r0, int rlim, int k0, int kend)
    {
#pragma unroll
        for (int i = 0; i < C; ++i) {
            const int c = (int)threadIdx.x + i * THREADS;
            int r, k;
            at(c, r, k);
            const bool in = r0 + r < rlim && k0 + k < kend;
            v[i] = in ? (KM ? __ldg((const float4 *)(X + (size_t)(r0 + r) * ld + k0 + k))
                            : __ldg((const float4 *)(X + (size_t)(k0 + k) * ld + r0 + r)))
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    static __device__ __forceinline__ void at(int c, int &r, int &k)
    {
        if (KM) {
            r = c >> 3;
            k = (c & 7) * 4;
        } else {
            const int lane = c & 31, grp = c >> 5;
            r = ((grp % (R / 16)) * 4 + (lane & 3)) * 4;
            k = (grp / (R / 16)) * 8 + (lane >> 2);
        }
    }
    /* into the swizzled tiles hi (and lo, when NP is 3) */
    template <int NP> __device__ __forceinline__ void store(char *hi, char *lo) const
    {
#pragma unroll
        for (int i = 0; i < C; ++i) {
            const int c = (int)threadIdx.x + i * THREADS;
            int r, k;
            at(c, r, k);
            const float e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
            float h[4], l[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                h[j] = __uint_as_float(tf32(e[j]));
                l[j] = e[j] - h[j];
            }
            if (KM) {
                *(float4 *)(hi + swz(r, k)) = make_float4(h[0], h[1], h[2], h[3]);
                if (NP == 3) *(float4 *)(lo + swz(r, k)) = make_float4(l[0], l[1], l[2], l[3]);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    *(float *)(hi + swz(r + j, k)) = h[j];
                    if (NP == 3) *(float *)(lo + swz(r + j, k)) = l[j];
                }
            }
        }
    }
};

#endif

/* C (or slice z's part) = op(A) op(B) over k in [z Ks, (z + 1) Ks). WGS warp groups of 64 rows, BN
   columns; NP 1 or 3 parts; PP (3 parts): two accumulators in turn; PAIR (3 parts, one accumulator):
   the tensor cores sum two stages (64 k) before the FP32 total takes them, so that the products wait
   for the sum once a pair of stages, not every stage. */
template <int BN, int WGS, int TA, int TB, int NP, int PP, int PAIR = 0>
__global__ void __launch_bounds__(128 * WGS)
    k_wg(int M, int N, int K, int Ks, const float *__restrict__ A, int lda, const float *__restrict__ B, int ldb,
         float *__restrict__ C, int ldc)
{
#if WG_ON
    constexpr int BM = 64 * WGS, THREADS = 128 * WGS, PARTS = NP == 3 ? 2 : 1, NR = BN / 2;
    constexpr int ABYTES = BM * 128, BBYTES = BN * 128, STAGE = PARTS * (ABYTES + BBYTES);
    constexpr int NACC = NP == 3 && PP ? 2 : 1;
    extern __shared__ __align__(1024) char sm_raw[];
    char *sm = (char *)(((uintptr_t)sm_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm);
    const int wg = (int)threadIdx.x / 128;
    const int m0 = (int)blockIdx.y * BM, n0 = (int)blockIdx.x * BN;
    const int kbeg = (int)blockIdx.z * Ks, kend = min(K, kbeg + Ks), nk = (kend - kbeg + BK - 1) / BK;
    opload<!TA, BM, THREADS> la;
    opload<TB, BN, THREADS> lb;
    float acc[NACC][NR], tot[NP == 3 ? NR : 1];
#pragma unroll
    for (int j = 0; j < (NP == 3 ? NR : 1); ++j) tot[j] = 0.0f;
#pragma unroll
    for (int a = 0; a < NACC; ++a)
#pragma unroll
        for (int j = 0; j < NR; ++j) acc[a][j] = 0.0f;
    /* a stage's tiles: A hi, A lo, B hi, B lo */
    auto put = [&](int buf) {
        char *s = sm + buf * STAGE;
        la.template store<NP>(s, s + ABYTES);
        lb.template store<NP>(s + PARTS * ABYTES, s + PARTS * ABYTES + BBYTES);
    };
    if (nk > 0) {
        la.load(A, lda, m0, M, kbeg, kend);
        lb.load(B, ldb, n0, N, kbeg, kend);
        put(0);
        if (nk > 1) {
            la.load(A, lda, m0, M, kbeg + BK, kend);
            lb.load(B, ldb, n0, N, kbeg + BK, kend);
        }
    }
    proxy_fence();
    __syncthreads();
    /* stage kt; PAR: kt's parity, known at compile time so that the two accumulators stay in registers */
    auto step = [&](int kt, auto par) {
        constexpr int PAR = decltype(par)::value;
        const uint32_t s = sbase + (uint32_t)(PAR * STAGE);
        const uint64_t ah = desc(s + wg * 64 * 128), bh = desc(s + PARTS * ABYTES);
        const uint64_t al = desc(s + ABYTES + wg * 64 * 128), bl = desc(s + PARTS * ABYTES + BBYTES);
        float *d = acc[NACC == 2 ? PAR : 0];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            const uint64_t o = (uint64_t)(kk * 32 >> 4); /* 32 bytes a k-step */
            if (NP == 3) {
                wgmma<BN>(d, al + o, bh + o, kk > 0 || (PAIR && (kt & 1)));
                wgmma<BN>(d, ah + o, bl + o, 1);
                wgmma<BN>(d, ah + o, bh + o, 1);
            } else
                wgmma<BN>(d, ah + o, bh + o, kk > 0 || kt > 0);
        }
        wg_commit();
        if (NP == 3 && !PP) {
            /* one accumulator: stage kt - 1's products were waited for (with PAIR, at odd kt, they are now),
               so the next stage goes into the other buffer while this one's run; then this stage's sum (or
               the pair's) into the total */
            if (PAIR && (kt & 1)) wg_wait<1>();
            if (kt + 1 < nk) {
                put(1 - PAR);
                proxy_fence();
            }
            if (kt + 2 < nk) {
                la.load(A, lda, m0, M, kbeg + (kt + 2) * BK, kend);
                lb.load(B, ldb, n0, N, kbeg + (kt + 2) * BK, kend);
            }
            if (!PAIR || (kt & 1) || kt + 1 == nk) {
                wg_wait<0>();
#pragma unroll
                for (int j = 0; j < NR; ++j) tot[j] += acc[0][j];
            }
        } else {
            wg_wait<1>(); /* stage kt - 1's products are done: its buffer takes the next stage */
            if (NP == 3 && kt > 0) {
                const float *p = acc[NACC == 2 ? 1 - PAR : 0];
#pragma unroll
                for (int j = 0; j < NR; ++j) tot[j] += p[j];
            }
            if (kt + 1 < nk) {
                put(1 - PAR);
                proxy_fence();
            }
            if (kt + 2 < nk) {
                la.load(A, lda, m0, M, kbeg + (kt + 2) * BK, kend);
                lb.load(B, ldb, n0, N, kbeg + (kt + 2) * BK, kend);
            }
        }
        __syncthreads();
    };
    for (int kt = 0; kt < nk; kt += 2) {
        step(kt, std::integral_constant<int, 0>());
        if (kt + 1 < nk) step(kt + 1, std::integral_constant<int, 1>());
    }
    wg_wait<0>();
    if (NP == 3 && PP && nk > 0) {
#pragma unroll
        for (int j = 0; j < NR; ++j) tot[j] += (nk & 1) ? acc[0][j] : acc[NACC - 1][j];
    }
    const float *res = NP == 3 ? tot : acc[0];
    float *out = C + (size_t)blockIdx.z * (gridDim.z > 1 ? (size_t)M * N : 0);
    const int ld = gridDim.z > 1 ? N : ldc;
    const int lane = (int)threadIdx.x % 32, w = ((int)threadIdx.x / 32) % 4;
    const int r = m0 + wg * 64 + w * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int c = n0 + j * 8 + (lane % 4) * 2;
        if (c < N) {
            if (r < M) *(float2 *)(out + (size_t)r * ld + c) = make_float2(res[4 * j], res[4 * j + 1]);
            if (r + 8 < M) *(float2 *)(out + (size_t)(r + 8) * ld + c) = make_float2(res[4 * j + 2], res[4 * j + 3]);
        }
    }
#endif
}

#if WG_ON
template <int BN> static __device__ __forceinline__ void wgmma_rs(float *d, const uint32_t *a, uint64_t b, int scale_d)
{
    if (BN == 64) wgmma_rs_n64(d, a, b, scale_d);
    else if (BN == 128) wgmma_rs_n128(d, a, b, scale_d);
    else wgmma_rs_n256(d, a, b, scale_d);
}

/* A thread's part of A for a stage, as wgmma's register fragments want it: rows g and g + 8 of its
   warp's 16 (g = lane / 4), k = t + 4 i (t = lane % 4, i = 0..7); fragment kk is (g, t + 8 kk),
   (g + 8, t + 8 kk), (g, t + 4 + 8 kk), (g + 8, t + 4 + 8 kk). */
template <int KM> struct afrag {
    float v[2][8];
    __device__ __forceinline__ void load(const float *X, int ld, int row, int rlim, int k0, int kend)
    {
        const int t = (int)threadIdx.x % 4;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int r = row + 8 * h, k = k0 + t + 4 * i;
                v[h][i] = r < rlim && k < kend ? __ldg(KM ? X + (size_t)r * ld + k : X + (size_t)k * ld + r) : 0.0f;
            }
    }
    /* hi (and lo) of fragment kk */
    template <int NP> __device__ __forceinline__ void split(uint32_t (*hi)[4], uint32_t (*lo)[4]) const
    {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const float e[4] = {v[0][2 * kk], v[1][2 * kk], v[0][2 * kk + 1], v[1][2 * kk + 1]};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                hi[kk][j] = tf32(e[j]);
                if (NP == 3) lo[kk][j] = __float_as_uint(e[j] - __uint_as_float(hi[kk][j]));
            }
        }
    }
};
#endif

/* As k_wg, with A in registers: each thread loads its fragments of A from global memory a stage ahead
   and splits them itself; shared memory holds B only, which halves what wgmma reads from it. */
template <int BN, int WGS, int TA, int TB, int NP>
__global__ void __launch_bounds__(128 * WGS)
    k_wgr(int M, int N, int K, int Ks, const float *__restrict__ A, int lda, const float *__restrict__ B, int ldb,
          float *__restrict__ C, int ldc)
{
#if WG_ON
    constexpr int THREADS = 128 * WGS, PARTS = NP == 3 ? 2 : 1, NR = BN / 2;
    constexpr int BBYTES = BN * 128, STAGE = PARTS * BBYTES;
    constexpr int NF = NP == 3 ? 1 : 2; /* fragment sets: one part keeps two stages in flight */
    extern __shared__ __align__(1024) char sm_raw[];
    char *sm = (char *)(((uintptr_t)sm_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm);
    const int wg = (int)threadIdx.x / 128, lane = (int)threadIdx.x % 32, w = ((int)threadIdx.x / 32) % 4;
    const int m0 = (int)blockIdx.y * 64 * WGS, n0 = (int)blockIdx.x * BN;
    const int row = m0 + wg * 64 + w * 16 + lane / 4;
    const int kbeg = (int)blockIdx.z * Ks, kend = min(K, kbeg + Ks), nk = (kend - kbeg + BK - 1) / BK;
    afrag<!TA> la;
    opload<TB, BN, THREADS> lb;
    uint32_t ah[NF][4][4], al[NP == 3 ? 4 : 1][4];
    float acc[NR], tot[NP == 3 ? NR : 1];
#pragma unroll
    for (int j = 0; j < (NP == 3 ? NR : 1); ++j) tot[j] = 0.0f;
#pragma unroll
    for (int j = 0; j < NR; ++j) acc[j] = 0.0f;
    auto put = [&](int buf) {
        char *s = sm + buf * STAGE;
        lb.template store<NP>(s, s + BBYTES);
    };
    if (nk > 0) {
        la.load(A, lda, row, M, kbeg, kend);
        lb.load(B, ldb, n0, N, kbeg, kend);
        put(0);
        if (nk > 1) lb.load(B, ldb, n0, N, kbeg + BK, kend);
    }
    proxy_fence();
    __syncthreads();
    auto step = [&](int kt, auto par) {
        constexpr int PAR = decltype(par)::value;
        const uint32_t s = sbase + (uint32_t)(PAR * STAGE);
        const uint64_t bh = desc(s), bl = desc(s + BBYTES);
        uint32_t(*h)[4] = ah[NF == 2 ? PAR : 0];
        la.template split<NP>(h, al);
        if (kt + 1 < nk) la.load(A, lda, row, M, kbeg + (kt + 1) * BK, kend);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            const uint64_t o = (uint64_t)(kk * 32 >> 4);
            if (NP == 3) {
                wgmma_rs<BN>(acc, al[kk], bh + o, kk > 0);
                wgmma_rs<BN>(acc, h[kk], bl + o, 1);
                wgmma_rs<BN>(acc, h[kk], bh + o, 1);
            } else
                wgmma_rs<BN>(acc, h[kk], bh + o, kk > 0 || kt > 0);
        }
        wg_commit();
        if (NP == 3) {
            if (kt + 1 < nk) {
                put(1 - PAR);
                proxy_fence();
            }
            if (kt + 2 < nk) lb.load(B, ldb, n0, N, kbeg + (kt + 2) * BK, kend);
            wg_wait<0>();
#pragma unroll
            for (int j = 0; j < NR; ++j) tot[j] += acc[j];
        } else {
            wg_wait<1>();
            if (kt + 1 < nk) {
                put(1 - PAR);
                proxy_fence();
            }
            if (kt + 2 < nk) lb.load(B, ldb, n0, N, kbeg + (kt + 2) * BK, kend);
        }
        __syncthreads();
    };
    for (int kt = 0; kt < nk; kt += 2) {
        step(kt, std::integral_constant<int, 0>());
        if (kt + 1 < nk) step(kt + 1, std::integral_constant<int, 1>());
    }
    wg_wait<0>();
    const float *res = NP == 3 ? tot : acc;
    float *out = C + (size_t)blockIdx.z * (gridDim.z > 1 ? (size_t)M * N : 0);
    const int ld = gridDim.z > 1 ? N : ldc;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int c = n0 + j * 8 + (lane % 4) * 2;
        if (c < N) {
            if (row < M) *(float2 *)(out + (size_t)row * ld + c) = make_float2(res[4 * j], res[4 * j + 1]);
            if (row + 8 < M)
                *(float2 *)(out + (size_t)(row + 8) * ld + c) = make_float2(res[4 * j + 2], res[4 * j + 3]);
        }
    }
#endif
}

__global__ void k_probe(int *on) { *on = WG_ON; }

/* C = the sum of S parts [S][M][N] in slice order, four outputs a thread (N a multiple of 4). */
__global__ void k_sum(const float *part, int S, int M, int N, float *C, int ldc)
{
    const size_t n4 = (size_t)M * N / 4;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n4; e += (size_t)gridDim.x * blockDim.x) {
        float4 a = ((const float4 *)part)[e];
        for (int s = 1; s < S; ++s) {
            const float4 b = ((const float4 *)part)[(size_t)s * n4 + e];
            a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
        }
        const size_t row = e / ((size_t)N / 4), col = (e % ((size_t)N / 4)) * 4;
        *(float4 *)(C + row * ldc + col) = a;
    }
}

struct shape {
    const char *name;
    int ta, tb, M, N, K;
    int p3; /* 1: one of P3's five products a step */
};
static const shape SHAPES[] = {
    {"P3 fwd1  NT 512x1024x784", 0, 1, 512, 1024, 784, 1},
    {"P3 fwd2  NT 512x1024x1024", 0, 1, 512, 1024, 1024, 1},
    {"P3 dX2   NN 512x1024x1024", 0, 0, 512, 1024, 1024, 1},
    {"P3 dW2   TN 1024x1024x512", 1, 0, 1024, 1024, 512, 1},
    {"P3 dW1   TN 1024x784x512", 1, 0, 1024, 784, 512, 1},
    {"conv2 fwd NN 128x7744x576", 0, 0, 128, 7744, 576, 0},
    {"conv2 dW  NT 128x576x7744", 0, 1, 128, 576, 7744, 0},
    {"conv2 dX  TN 576x7744x128", 1, 0, 576, 7744, 128, 0},
    {"edges   TN 260x1036x204", 1, 0, 260, 1036, 204, 0},
    {"edges   NT 260x1036x204", 0, 1, 260, 1036, 204, 0},
};

typedef void (*kern_t)(int, int, int, int, const float *, int, const float *, int, float *, int);
struct cfg {
    char name[48];
    int bm, bn, threads, np;
    size_t smem;
    kern_t kern;
};

template <int BN, int WGS, int NP> static cfg make_cfg_r(int ta, int tb)
{
    cfg c;
    snprintf(c.name, sizeof c.name, "%s %dx%d A regs", NP == 3 ? "3xTF32" : "1xTF32", 64 * WGS, BN);
    c.bm = 64 * WGS;
    c.bn = BN;
    c.threads = 128 * WGS;
    c.np = NP;
    c.smem = 2 * (size_t)(NP == 3 ? 2 : 1) * BN * 128 + 1024;
    if (!ta && !tb) c.kern = k_wgr<BN, WGS, 0, 0, NP>;
    else if (!ta && tb) c.kern = k_wgr<BN, WGS, 0, 1, NP>;
    else if (ta && !tb) c.kern = k_wgr<BN, WGS, 1, 0, NP>;
    else c.kern = k_wgr<BN, WGS, 1, 1, NP>;
    return c;
}

template <int BN, int WGS, int NP, int PP, int PAIR = 0> static cfg make_cfg(int ta, int tb)
{
    cfg c;
    snprintf(c.name, sizeof c.name, "%s %dx%d%s%s", NP == 3 ? "3xTF32" : "1xTF32", 64 * WGS, BN, PP ? " pp" : "",
             PAIR ? " pair" : "");
    c.bm = 64 * WGS;
    c.bn = BN;
    c.threads = 128 * WGS;
    c.np = NP;
    c.smem = 2 * (size_t)(NP == 3 ? 2 : 1) * (64 * WGS + BN) * 128 + 1024;
    if (!ta && !tb) c.kern = k_wg<BN, WGS, 0, 0, NP, PP, PAIR>;
    else if (!ta && tb) c.kern = k_wg<BN, WGS, 0, 1, NP, PP, PAIR>;
    else if (ta && !tb) c.kern = k_wg<BN, WGS, 1, 0, NP, PP, PAIR>;
    else c.kern = k_wg<BN, WGS, 1, 1, NP, PP, PAIR>;
    return c;
}

static cublasHandle_t g_blas;
static cudaEvent_t g_e0, g_e1;

static void run_wg(const shape &s, const cfg &c, int S, const float *A, const float *B, float *C, float *part,
                   bool sum = true)
{
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    int Ks = (s.K + S - 1) / S;
    Ks = (Ks + BK - 1) / BK * BK;
    const int Sz = (s.K + Ks - 1) / Ks;
    dim3 grid((unsigned)((s.N + c.bn - 1) / c.bn), (unsigned)((s.M + c.bm - 1) / c.bm), (unsigned)Sz);
    c.kern<<<grid, c.threads, c.smem>>>(s.M, s.N, s.K, Ks, A, lda, B, ldb, Sz > 1 ? part : C, s.N);
    if (Sz > 1 && sum) k_sum<<<264, 256>>>(part, Sz, s.M, s.N, C, s.N);
}

static void run_blas(const shape &s, int tf32, const float *A, const float *B, float *C)
{
    const float one = 1.0f, zero = 0.0f;
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    cublasSetMathMode(g_blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (cublasSgemm(g_blas, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, s.N, s.M, s.K, &one, B,
                    ldb, A, lda, &zero, C, s.N) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "gemm_wg: FAILED: cublasSgemm %s\n", s.name);
        exit(1);
    }
}

template <class F> static double time_us(F f)
{
    std::vector<float> t;
    for (int i = 0; i < 3; ++i) f();
    for (int p = 0; p < 15; ++p) {
        float ms = 0.0f;
        CK(cudaEventRecord(g_e0));
        for (int i = 0; i < 20; ++i) f();
        CK(cudaEventRecord(g_e1));
        CK(cudaEventSynchronize(g_e1));
        CK(cudaEventElapsedTime(&ms, g_e0, g_e1));
        t.push_back(ms * 1000.0f / 20.0f);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static double rel_err(const std::vector<float> &c, const std::vector<double> &ref)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < c.size(); ++i) {
        const double d = (double)c[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
}

int main(int argc, char **argv)
{
    const int quick = argc > 1; /* any argument: P3's shapes and the edges only */
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        fprintf(stderr, "gemm_wg: no CUDA device\n");
        return 1;
    }
    if (prop.major != 9) {
        fprintf(stderr, "gemm_wg: needs an sm_90 GPU (wgmma)\n");
        return 1;
    }
    {
        int *on, h = 0;
        CK(cudaMalloc(&on, sizeof(int)));
        k_probe<<<1, 1>>>(on);
        CK(cudaMemcpy(&h, on, sizeof(int), cudaMemcpyDeviceToHost));
        cudaFree(on);
        if (!h) {
            fprintf(stderr, "gemm_wg: built without sm_90a's features (build with -arch=sm_90a)\n");
            return 1;
        }
    }
    printf("device: %s, %d multiprocessors\n", prop.name, prop.multiProcessorCount);
    CK(cudaEventCreate(&g_e0));
    CK(cudaEventCreate(&g_e1));
    if (cublasCreate(&g_blas) != CUBLAS_STATUS_SUCCESS) return 1;
    int bad = 0;
    double p3_blas = 0.0, p3_blas_tf32 = 0.0, p3_best3 = 0.0, p3_best1 = 0.0;
    srand(7);
    for (const shape &s : SHAPES) {
        if (quick && !s.p3 && s.M != 260) continue;
        const size_t na = (size_t)s.M * s.K, nb = (size_t)s.K * s.N, nc = (size_t)s.M * s.N;
        std::vector<float> ha(na), hb(nb), hc(nc);
        std::vector<double> ref(nc, 0.0);
        for (auto &v : ha) v = (float)rand() / RAND_MAX * 2.0f - 1.0f;
        for (auto &v : hb) v = ((float)rand() / RAND_MAX * 2.0f - 1.0f) * 0.05f;
        {
            for (int m = 0; m < s.M; ++m)
                for (int k = 0; k < s.K; ++k) {
                    const double a = s.ta ? ha[(size_t)k * s.M + m] : ha[(size_t)m * s.K + k];
                    double *r = &ref[(size_t)m * s.N];
                    if (s.tb)
                        for (int n = 0; n < s.N; ++n) r[n] += a * hb[(size_t)n * s.K + k];
                    else
                        for (int n = 0; n < s.N; ++n) r[n] += a * hb[(size_t)k * s.N + n];
                }
        }
        float *A, *B, *C, *part;
        CK(cudaMalloc(&A, na * 4));
        CK(cudaMalloc(&B, nb * 4));
        CK(cudaMalloc(&C, nc * 4));
        CK(cudaMalloc(&part, nc * 4 * 8));
        CK(cudaMemcpy(A, ha.data(), na * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(B, hb.data(), nb * 4, cudaMemcpyHostToDevice));
        const double flop = 2.0 * s.M * s.N * s.K;
        printf("\n%s (%.2f GFLOP)\n", s.name, flop * 1e-9);
        double eb = 0.0, tb = 0.0, tbt = 0.0;
        for (int tf = 0; tf < 2; ++tf) {
            CK(cudaMemset(C, 0, nc * 4));
            run_blas(s, tf, A, B, C);
            CK(cudaMemcpy(hc.data(), C, nc * 4, cudaMemcpyDeviceToHost));
            const double e = rel_err(hc, ref);
            if (!tf) eb = e;
            const double us = time_us([&] { run_blas(s, tf, A, B, C); });
            (tf ? tbt : tb) = us;
            printf("  %-22s %9.2f us %7.1f TFLOP/s  err %.2e\n", tf ? "cuBLAS TF32" : "cuBLAS FP32", us,
                   flop / us * 1e-6, e);
        }
        double best[2] = {1e30, 1e30}; /* 1xTF32, 3xTF32 */
        const cfg all[] = {
            make_cfg<128, 2, 3, 0>(s.ta, s.tb),    make_cfg<128, 2, 3, 0, 1>(s.ta, s.tb),
            make_cfg<128, 1, 3, 0, 1>(s.ta, s.tb), make_cfg<64, 1, 3, 1>(s.ta, s.tb),
            make_cfg<128, 2, 1, 1>(s.ta, s.tb),    make_cfg_r<128, 2, 3>(s.ta, s.tb),
            make_cfg_r<128, 1, 3>(s.ta, s.tb),     make_cfg_r<64, 2, 3>(s.ta, s.tb),
            make_cfg_r<128, 2, 1>(s.ta, s.tb),     make_cfg_r<256, 1, 1>(s.ta, s.tb),
            make_cfg_r<256, 2, 1>(s.ta, s.tb),     make_cfg_r<128, 1, 1>(s.ta, s.tb),
        };
        /* quick: the header's kernel, with and without pairs, and one 64-row variant */
        const int ncs = quick ? 4 : (int)(sizeof all / sizeof all[0]);
        std::vector<cfg> cs(all, all + ncs);
        for (const cfg &c : cs) {
            CK(cudaFuncSetAttribute(c.kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c.smem));
            for (int S : {1, 2, 3, 4, 6, 8}) {
                if ((s.K + S - 1) / S < 2 * BK && S > 1) continue;
                CK(cudaMemset(C, 0, nc * 4));
                run_wg(s, c, S, A, B, C, part);
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(hc.data(), C, nc * 4, cudaMemcpyDeviceToHost));
                const double e = rel_err(hc, ref);
                const bool ok = c.np == 3 ? e <= 2.0 * eb + 1e-6 : e < 2e-3;
                const double us = time_us([&] { run_wg(s, c, S, A, B, C, part); });
                int Ks = ((s.K + S - 1) / S + BK - 1) / BK * BK;
                const int blocks = ((s.N + c.bn - 1) / c.bn) * ((s.M + c.bm - 1) / c.bm) * ((s.K + Ks - 1) / Ks);
                const double us_k = S > 1 ? time_us([&] { run_wg(s, c, S, A, B, C, part, false); }) : us;
                printf("  %-18s S=%d %4d blocks %9.2f us (product %7.2f) %7.1f TFLOP/s  err %.2e%s\n", c.name, S,
                       blocks, us, us_k, flop / us * 1e-6, e, ok ? "" : "  WRONG");
                if (!ok) bad = 1;
                else best[c.np == 3] = std::min(best[c.np == 3], us);
            }
        }
        printf("  best: 3xTF32 %.2f us (cuBLAS FP32 %.2fx its time); 1xTF32 %.2f us (cuBLAS TF32 %.2fx)\n", best[1],
               tb / best[1], best[0], tbt / best[0]);
        if (s.p3) {
            p3_blas += tb;
            p3_blas_tf32 += tbt;
            p3_best3 += best[1];
            p3_best1 += best[0];
        }
        cudaFree(A);
        cudaFree(B);
        cudaFree(C);
        cudaFree(part);
    }
    printf("\nP3's five products, a step and an epoch of 118 steps: cuBLAS FP32 %.1f us (%.2f ms), 3xTF32 %.1f us "
           "(%.2f ms); cuBLAS TF32 %.1f us (%.2f ms), 1xTF32 %.1f us (%.2f ms)\n",
           p3_blas, p3_blas * 0.118, p3_best3, p3_best3 * 0.118, p3_blas_tf32, p3_blas_tf32 * 0.118, p3_best1,
           p3_best1 * 0.118);
    cublasDestroy(g_blas);
    if (bad) fprintf(stderr, "gemm_wg: FAILED: a variant is wrong\n");
    return bad;
}
