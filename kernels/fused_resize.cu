// Fused crop + antialiased bilinear or bicubic resize + horizontal flip + normalise +
// HWC->CHW + cast.
//
// One launch per batch: grid (ceil(W/32), ceil(H/8), N), block (32, 8, 1); thread
// (x, y) of block z writes the three channels of output pixel (y, x) of sample z.
// The math (Pillow's BILINEAR and BICUBIC reductions with fractional boxes) is in
// docs/kernels.md and docs/transform-semantics.md;
// why a single fused pass and not a separable two-pass kernel is argued there too.
//
// The same file compiles three ways: NVRTC at run time (gpu_loader/cuda/_kernels.py),
// nvcc in the tests, and the host C++ compiler with -DGPU_LOADER_EMULATION through
// cuda_emulation.h (gpu_loader/cuda/_emulation.py), which is how the CPU-only test
// suite runs it.
#ifdef GPU_LOADER_EMULATION
#include "cuda_emulation.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

// Per-sample parameters, one 48-byte record per image, packed on the host by
// gpu_loader/cuda/_launch.py (SAMPLE_DTYPE mirrors this layout; a test compares them).
// The planner may move the origin (src, height, width and the box together) to whole
// pixels just before what the box's filter reads; the fields describe that view.
struct FusedSample {
    unsigned long long src;  // device pointer to HWC uint8 RGB pixels (the view's first)
    long long pitch;         // bytes from one source row to the next
    int height;              // rows from src to the image's last
    int width;               // columns from src to the image's last
    float box_top;           // crop box in pixels from src; fractional allowed
    float box_left;
    float box_height;
    float box_width;
    int flip;                // nonzero: mirror the output horizontally
    int reserved;            // keeps the record a multiple of 8 bytes
};

__device__ __forceinline__ int gl_imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ int gl_imin(int a, int b) { return a < b ? a : b; }

// Pillow's triangle filter, support 1.
__device__ __forceinline__ float gl_tri(float t) { return fmaxf(0.0f, 1.0f - fabsf(t)); }

// Pillow's bicubic filter (Keys, a = -0.5), support 2; docs/transform-semantics.md.
__device__ __forceinline__ float gl_cubic(float t) {
    const float a = -0.5f;
    t = fabsf(t);
    if (t < 1.0f) {
        return ((a + 2.0f) * t - (a + 3.0f)) * t * t + 1.0f;
    }
    if (t < 2.0f) {
        return (((t - 5.0f) * t + 8.0f) * t - 4.0f) * a;
    }
    return 0.0f;
}

// The filter a kernel instance uses, fixed at compile time (one entry point per filter).
template <bool Cubic>
__device__ __forceinline__ float gl_filter(float t) {
    return Cubic ? gl_cubic(t) : gl_tri(t);
}

// The source pixels one output pixel reads along one axis, and their weight sum.
struct GlWindow {
    int first;         // first source index (inclusive)
    int last;          // last source index (exclusive)
    float t_first;     // the filter's argument at `first`: (first - c + 0.5) / filterscale
    float t_step;      // its increment per source pixel: 1 / filterscale
    float weight_sum;  // the sum of the taps, to normalise them as Pillow does
};

// Pillow's precompute_coeffs for output index `index` (Resample.c): centre
// c = start + (index + 0.5) * scale, window [int(c - support + 0.5), int(c + support + 0.5))
// clipped to the image (the int() truncates toward zero, as the C cast here does), tap
// weight filter((x - c + 0.5) / filterscale); support is 1 (bilinear) or 2 (bicubic)
// times filterscale. The argument advances by a constant per tap,
// so the loops below add t_step instead of converting every index to float (int->float
// conversions run at a quarter of the FP32 rate on sm_80/sm_90).
template <bool Cubic>
__device__ __forceinline__ GlWindow gl_window(float box_start, float box_size, int out_size,
                                              int index, int in_size) {
    const float scale = box_size / static_cast<float>(out_size);
    const float filterscale = fmaxf(scale, 1.0f);
    const float support = Cubic ? 2.0f * filterscale : filterscale;
    const float center = box_start + (static_cast<float>(index) + 0.5f) * scale;
    GlWindow w;
    w.t_step = 1.0f / filterscale;
    w.first = gl_imax(static_cast<int>(center - support + 0.5f), 0);
    w.last = gl_imin(static_cast<int>(center + support + 0.5f), in_size);
    w.t_first = (static_cast<float>(w.first) - center + 0.5f) * w.t_step;
    float sum = 0.0f;
    float t = w.t_first;
    for (int i = w.first; i < w.last; ++i, t += w.t_step) {
        sum += gl_filter<Cubic>(t);
    }
    w.weight_sum = sum;
    return w;
}

// Exact uint8 -> float without the quarter-rate conversion instruction: 2^23 + v has v
// in its low mantissa bits, so subtracting 2^23 leaves v.
__device__ __forceinline__ float gl_u8_to_float(unsigned char v) {
    return __uint_as_float(0x4B000000u | static_cast<unsigned int>(v)) - 8388608.0f;
}

// value is in 0..255 units; scale = 1 / (255 std), shift = -mean / std.
__device__ __forceinline__ void gl_store(float* dst, float value, float scale, float shift) {
    *dst = fmaf(value, scale, shift);
}

__device__ __forceinline__ void gl_store(__half* dst, float value, float scale, float shift) {
    *dst = __float2half_rn(fmaf(value, scale, shift));
}

__device__ __forceinline__ void gl_store(__nv_bfloat16* dst, float value, float scale,
                                         float shift) {
    *dst = __float2bfloat16_rn(fmaf(value, scale, shift));
}

// uint8 skips normalisation: round half to even, clamp to 0..255.
__device__ __forceinline__ void gl_store(unsigned char* dst, float value, float, float) {
    const int q = __float2int_rn(value);
    *dst = static_cast<unsigned char>(gl_imin(gl_imax(q, 0), 255));
}

// One entry point per (output dtype, filter): a filter chosen at run time in one kernel
// took 54 registers a thread against 46-48 for either alone (nvcc 13, sm_80/sm_90), so
// 4 blocks of 256 threads an SM instead of 5.
template <typename Out, bool Cubic>
__device__ __forceinline__ void gl_fused_resize(const FusedSample* __restrict__ samples,
                                                int out_h, int out_w, float scale0,
                                                float scale1, float scale2, float shift0,
                                                float shift1, float shift2,
                                                Out* __restrict__ out) {
    const int ox = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    const int oy = static_cast<int>(blockIdx.y * blockDim.y + threadIdx.y);
    const int n = static_cast<int>(blockIdx.z);
    if (ox >= out_w || oy >= out_h) {
        return;
    }
    const FusedSample s = samples[n];
    // The flip comes after the resize: output column ox is resized column W-1-ox.
    const int rx = s.flip ? out_w - 1 - ox : ox;
    const GlWindow wx = gl_window<Cubic>(s.box_left, s.box_width, out_w, rx, s.width);
    const GlWindow wy = gl_window<Cubic>(s.box_top, s.box_height, out_h, oy, s.height);
    const unsigned char* __restrict__ src = reinterpret_cast<const unsigned char*>(s.src);

    // Separable weights, so one 2D sum normalised by the product of the two 1D sums
    // equals Pillow's horizontal-then-vertical passes (without its 8-bit rounding).
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f;
    float ty = wy.t_first;
    for (int y = wy.first; y < wy.last; ++y, ty += wy.t_step) {
        const float ky = gl_filter<Cubic>(ty);
        if (ky == 0.0f) {
            continue;
        }
        const unsigned char* __restrict__ p = src + static_cast<long long>(y) * s.pitch + 3 * wx.first;
        float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f;
        float tx = wx.t_first;
        for (int x = wx.first; x < wx.last; ++x, tx += wx.t_step, p += 3) {
            const float kx = gl_filter<Cubic>(tx);
            r0 = fmaf(kx, gl_u8_to_float(p[0]), r0);
            r1 = fmaf(kx, gl_u8_to_float(p[1]), r1);
            r2 = fmaf(kx, gl_u8_to_float(p[2]), r2);
        }
        acc0 = fmaf(ky, r0, acc0);
        acc1 = fmaf(ky, r1, acc1);
        acc2 = fmaf(ky, r2, acc2);
    }
    const float total = wx.weight_sum * wy.weight_sum;
    const float norm = total > 0.0f ? 1.0f / total : 0.0f;
    float v0 = acc0 * norm, v1 = acc1 * norm, v2 = acc2 * norm;
    if (Cubic) {
        // The bicubic lobes can overshoot: clamp once, to 0..255, before normalising
        // (as the CPU path and torchvision's antialiased bicubic do).
        v0 = fminf(fmaxf(v0, 0.0f), 255.0f);
        v1 = fminf(fmaxf(v1, 0.0f), 255.0f);
        v2 = fminf(fmaxf(v2, 0.0f), 255.0f);
    }

    const long long plane = static_cast<long long>(out_h) * out_w;
    Out* dst = out + static_cast<long long>(n) * 3 * plane + static_cast<long long>(oy) * out_w + ox;
    gl_store(dst, v0, scale0, shift0);
    gl_store(dst + plane, v1, scale1, shift1);
    gl_store(dst + 2 * plane, v2, scale2, shift2);
}

// One extern "C" entry point per output dtype and filter (names are the contract with
// gpu_loader/cuda/_launch.py KERNEL_NAMES).
#define GL_FUSED_KERNEL(name, Out, Cubic)                                                   \
    extern "C" __global__ void name(const FusedSample* __restrict__ samples, int out_h,     \
                                    int out_w, float scale0, float scale1, float scale2,    \
                                    float shift0, float shift1, float shift2,               \
                                    Out* __restrict__ out) {                                \
        gl_fused_resize<Out, Cubic>(samples, out_h, out_w, scale0, scale1, scale2, shift0,  \
                                    shift1, shift2, out);                                   \
    }

// The entry points, listed once: X(name, output type, bicubic).
#define GL_FUSED_ENTRY_POINTS(X)                      \
    X(fused_resize_f32, float, false)                 \
    X(fused_resize_f16, __half, false)                \
    X(fused_resize_bf16, __nv_bfloat16, false)        \
    X(fused_resize_u8, unsigned char, false)          \
    X(fused_resize_bicubic_f32, float, true)          \
    X(fused_resize_bicubic_f16, __half, true)         \
    X(fused_resize_bicubic_bf16, __nv_bfloat16, true) \
    X(fused_resize_bicubic_u8, unsigned char, true)

GL_FUSED_ENTRY_POINTS(GL_FUSED_KERNEL)

#ifdef GPU_LOADER_EMULATION
#define GL_EMULATE_FUSED(name, Out, Cubic)                                                  \
    GPU_LOADER_EMULATED_KERNEL(name,                                                        \
                               (const FusedSample* samples, int out_h, int out_w,           \
                                float scale0, float scale1, float scale2, float shift0,     \
                                float shift1, float shift2, Out* out),                      \
                               (samples, out_h, out_w, scale0, scale1, scale2, shift0,      \
                                shift1, shift2, out))

GL_FUSED_ENTRY_POINTS(GL_EMULATE_FUSED)

#include <cstddef>

// The host side's record layout must match; the tests compare it with SAMPLE_DTYPE.
extern "C" void emulated_fused_sample_layout(long long* out) {
    out[0] = static_cast<long long>(sizeof(FusedSample));
    out[1] = static_cast<long long>(offsetof(FusedSample, src));
    out[2] = static_cast<long long>(offsetof(FusedSample, pitch));
    out[3] = static_cast<long long>(offsetof(FusedSample, height));
    out[4] = static_cast<long long>(offsetof(FusedSample, width));
    out[5] = static_cast<long long>(offsetof(FusedSample, box_top));
    out[6] = static_cast<long long>(offsetof(FusedSample, box_left));
    out[7] = static_cast<long long>(offsetof(FusedSample, box_height));
    out[8] = static_cast<long long>(offsetof(FusedSample, box_width));
    out[9] = static_cast<long long>(offsetof(FusedSample, flip));
    out[10] = static_cast<long long>(offsetof(FusedSample, reserved));
}

// Exposes the conversions the kernels use, so the tests can compare them with NumPy's
// float16 and a bfloat16 reference bit for bit.
extern "C" void emulated_convert(const float* in, long long count, unsigned short* half_out,
                                 unsigned short* bf16_out, int* rint_out) {
    for (long long i = 0; i < count; ++i) {
        half_out[i] = __float2half_rn(in[i]).bits;
        bf16_out[i] = __float2bfloat16_rn(in[i]).bits;
        rint_out[i] = __float2int_rn(in[i]);
    }
}
#endif  // GPU_LOADER_EMULATION
