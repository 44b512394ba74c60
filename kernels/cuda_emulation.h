// CPU emulation of the small part of CUDA C that kernels/*.cu use, so the same sources
// compile with the host C++ compiler (g++ -std=c++17 -O2 -shared -fPIC
// -DGPU_LOADER_EMULATION) and the test suite runs them on machines without a GPU.
//
// What it provides:
//   * the qualifiers __global__, __device__, __host__, __forceinline__, __restrict__;
//   * dim3 and the built-ins blockIdx, threadIdx, blockDim, gridDim. They are
//     thread_local so two Python threads may run emulated launches at the same time;
//   * __half / __nv_bfloat16 with the round-to-nearest-even conversions that
//     cuda_fp16.h / cuda_bf16.h perform on the device: the conversions give the same bits.
//     The arithmetic before them may not: NVRTC contracts a * b + c into one fused
//     multiply-add by default (--fmad=true) and g++ here does not, so a float32 output can
//     differ in its last bits, and rarely a uint8 by one level (QA: 25% of float32 values,
//     0.17% of float16, 5 of 635k uint8 values). The tests allow for that;
//   * __float2int_rn (round half to even, as the PTX cvt.rni instruction) and
//     __uint_as_float (a bit cast);
//   * GPU_LOADER_EMULATED_KERNEL, which defines an exported C launcher
//     `emulated_<kernel>(gx, gy, gz, bx, by, bz, <kernel params>)` that runs every thread
//     of every block in turn. That is exact for kernels without __syncthreads, shared
//     memory or warp intrinsics: the kernels here use none of them, and this header
//     deliberately does not define them, so a kernel that starts to will fail to compile
//     here instead of being emulated wrongly.
#ifndef GPU_LOADER_CUDA_EMULATION_H
#define GPU_LOADER_CUDA_EMULATION_H

#include <cmath>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict

struct dim3 {
    unsigned int x, y, z;
};

static thread_local dim3 blockIdx;
static thread_local dim3 threadIdx;
static thread_local dim3 blockDim;
static thread_local dim3 gridDim;

// Round half to even, like the device's __float2int_rn. nearbyint follows the current
// rounding mode, which is round-to-nearest-even unless someone changed it.
static inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }

static inline float __uint_as_float(unsigned int u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

struct __half {
    std::uint16_t bits;
};

struct __nv_bfloat16 {
    std::uint16_t bits;
};

static inline std::uint32_t gpu_loader_float_bits(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

// IEEE binary32 -> binary16, round to nearest even, with subnormals, overflow to
// infinity and NaN as the canonical 0x7fff: what __float2half_rn does.
static inline __half __float2half_rn(float f) {
    const std::uint32_t u = gpu_loader_float_bits(f);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    const std::uint32_t abs = u & 0x7fffffffu;
    std::uint16_t out;
    if (abs > 0x7f800000u) {  // NaN: the device's canonical NaN
        out = 0x7fffu;
    } else if (abs >= 0x477ff000u) {  // rounds to >= 65520: infinity
        out = static_cast<std::uint16_t>(sign | 0x7c00u);
    } else if (abs >= 0x38800000u) {  // normal half (>= 2^-14)
        const std::uint32_t mant_odd = (abs >> 13) & 1u;
        const std::uint32_t rounded = abs + 0xfffu + mant_odd;
        out = static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
    } else if (abs >= 0x33000000u) {  // subnormal half, or rounds up to the smallest one
        const std::uint32_t exp = abs >> 23;              // 102 .. 112
        const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const std::uint32_t shift = 126u - exp;           // 14 .. 24
        const std::uint32_t half_mant = mant >> shift;
        const std::uint32_t rest = mant & ((1u << shift) - 1u);
        const std::uint32_t halfway = 1u << (shift - 1u);
        std::uint32_t value = half_mant;
        if (rest > halfway || (rest == halfway && (half_mant & 1u))) {
            value += 1u;
        }
        out = static_cast<std::uint16_t>(sign | value);
    } else {  // below half the smallest subnormal: signed zero
        out = static_cast<std::uint16_t>(sign);
    }
    return __half{out};
}

// IEEE binary32 -> bfloat16, round to nearest even, NaN as 0x7fff: what
// __float2bfloat16_rn does.
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const std::uint32_t u = gpu_loader_float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return __nv_bfloat16{0x7fffu};  // the device's canonical NaN
    }
    const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{static_cast<std::uint16_t>(rounded >> 16)};
}

// Runs body() once per thread of the grid, setting the built-ins first.
template <typename Body>
static void gpu_loader_emulate_launch(unsigned int gx, unsigned int gy, unsigned int gz,
                                      unsigned int bx, unsigned int by, unsigned int bz,
                                      Body body) {
    gridDim = dim3{gx, gy, gz};
    blockDim = dim3{bx, by, bz};
    for (unsigned int z = 0; z < gz; ++z)
        for (unsigned int y = 0; y < gy; ++y)
            for (unsigned int x = 0; x < gx; ++x) {
                blockIdx = dim3{x, y, z};
                for (unsigned int tz = 0; tz < bz; ++tz)
                    for (unsigned int ty = 0; ty < by; ++ty)
                        for (unsigned int tx = 0; tx < bx; ++tx) {
                            threadIdx = dim3{tx, ty, tz};
                            body();
                        }
            }
}

#define GPU_LOADER_UNPAREN(...) __VA_ARGS__

// GPU_LOADER_EMULATED_KERNEL(name, (T a, U b), (a, b)) defines
// extern "C" void emulated_name(gx, gy, gz, bx, by, bz, T a, U b).
#define GPU_LOADER_EMULATED_KERNEL(name, params, args)                                  \
    extern "C" void emulated_##name(unsigned int gx, unsigned int gy, unsigned int gz,   \
                                    unsigned int bx, unsigned int by, unsigned int bz,   \
                                    GPU_LOADER_UNPAREN params) {                         \
        gpu_loader_emulate_launch(gx, gy, gz, bx, by, bz, [&]() { name args; });        \
    }

#endif  // GPU_LOADER_CUDA_EMULATION_H
