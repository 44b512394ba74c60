/*
 * gpu_loader.ops._native: the CPU fast path, in C, with the GIL released.
 *
 * Two entry points compute the same function as gpu_loader.ops.transform_into and as the
 * CUDA kernel (kernels/fused_resize.cu): crop box -> antialiased bilinear resize (Pillow's
 * BILINEAR weights, float, no rounding between the passes) -> optional horizontal flip ->
 * (x / 255 - mean) / std -> CHW -> float32 / float16 / bfloat16 / uint8, written straight
 * into a caller's [3, H, W] slot.
 *
 *   resize_into(src, height, width, channels, box, out, out_h, out_w, flip, dtype, scale, shift)
 *       src: C-contiguous HWC uint8 with 1, 3 or 4 channels (RGB, or RGBX whose X is ignored).
 *   decode_resize_jpeg(data, denom, height, width, box, out, out_h, out_w, flip, dtype,
 *                      scale, shift)
 *       decodes a YCbCr or greyscale JPEG with libjpeg-turbo at 1/denom scale (DCT domain),
 *       only the columns the box needs (jpeg_crop_scanline) and from the first row it needs
 *       (jpeg_skip_scanlines), streaming each decoded row into the resize; no full-size image
 *       is ever allocated. The rows after the box are still entropy-decoded (skipped, not
 *       reconstructed), so a truncated or corrupt file fails wherever its damage is, exactly as
 *       a full decode would. (height, width) are the expected scaled dimensions.
 *   decode_resize_jpegs(calls)
 *       decode_resize_jpeg on each argument tuple of ``calls``, all in one release of the
 *       GIL; per call None, the JpegError message, or -1 (out of memory).
 *
 * The resize runs vertical-first: each source row is added, weighted, into the accumulators
 * of the few output rows whose window contains it (a ring of rows, contiguous and
 * vectorisable); when an output row's window is complete its horizontal pass writes the
 * normalised values into the three output planes. Working memory is a few rows.
 *
 *   train_params(key_low, key_high, height, width, s0, s1, log_r0, log_r1, flip_prob)
 *       TrainTransform.make_params drawn from sample_rng's stream without building numpy's
 *       Generator: Philox4x64-10 keyed as numpy's Philox, its uniform / bounded-integer /
 *       random draws reproduced bit for bit (tests compare them with numpy's). Holds the GIL
 *       (a microsecond of arithmetic).
 *   jpeg_header(data)
 *       _formats.jpeg_header and jpeg_chroma_ratio in one walk over the marker segments, the
 *       same rules: (height, width, colourspace, EXIF orientation, chroma ratio) or None.
 *       Holds the GIL (about 1 us; the Python walk took 15).
 *
 * Weights follow transform-semantics.md: scale = (b1 - b0) / out, filterscale = max(scale, 1),
 * support = filterscale, centre c = b0 + (i + 0.5) * scale, taps [max(int(c - support + 0.5), 0),
 * min(int(c + support + 0.5), in)), weight tri((x - c + 0.5) / filterscale), normalised.
 * Both resize entry points take an optional last argument, the filter: 0 that triangle
 * (Pillow's BILINEAR), 1 Pillow's BICUBIC (a = -0.5, support 2 * filterscale), whose
 * negative lobes can overshoot: its resized values are clamped to [0, 255] before the
 * stores (as Pillow's 8-bit result is; no clamp between the passes, which Pillow has).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jpeglib.h>

enum { OUT_F32 = 0, OUT_F16 = 1, OUT_BF16 = 2, OUT_U8 = 3 };
static const int OUT_ITEMSIZE[4] = {4, 2, 2, 1};

/* ------------------------------------------------------------------ resampling weights */

typedef struct {
    int n;          /* output size along this axis */
    int *lo;        /* first source index of each output index */
    int *count;     /* number of taps of each output index */
    int max_taps;   /* the largest count */
    float *w;       /* [n][max_taps] normalised weights, zero padded */
} Axis;

static void axis_free(Axis *a) {
    free(a->lo);
    free(a->count);
    free(a->w);
    a->lo = a->count = NULL;
    a->w = NULL;
}

enum { FILTER_BILINEAR = 0, FILTER_BICUBIC = 1 };

/* Pillow's bicubic kernel (a = -0.5), support 2. */
static double bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

/* Pillow's precompute_coeffs in double, normalised, stored as float. 0 on success. */
static int axis_init(Axis *a, int in_size, double b0, double b1, int out_size, int filter) {
    const double scale = (b1 - b0) / out_size;
    const double filterscale = scale > 1.0 ? scale : 1.0;
    const double support = (filter == FILTER_BICUBIC ? 2.0 : 1.0) * filterscale;
    a->n = out_size;
    a->max_taps = (int)ceil(support) * 2 + 1;
    a->lo = malloc(sizeof(int) * (size_t)out_size);
    a->count = malloc(sizeof(int) * (size_t)out_size);
    a->w = calloc((size_t)out_size * (size_t)a->max_taps, sizeof(float));
    if (!a->lo || !a->count || !a->w) {
        axis_free(a);
        return -1;
    }
    for (int i = 0; i < out_size; ++i) {
        const double c = b0 + (i + 0.5) * scale;
        int lo = (int)(c - support + 0.5);
        int hi = (int)(c + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        if (hi - lo > a->max_taps) hi = lo + a->max_taps; /* cannot happen; keeps writes in range */
        double ws[64];
        double *wp = a->max_taps <= 64 ? ws : malloc(sizeof(double) * (size_t)a->max_taps);
        if (!wp) {
            axis_free(a);
            return -1;
        }
        double total = 0.0; /* normalised unless 0 (Pillow's guard): bicubic taps may be < 0 */
        for (int x = lo; x < hi; ++x) {
            double t = fabs((x - c + 0.5) / filterscale);
            double v = filter == FILTER_BICUBIC ? bicubic(t) : t < 1.0 ? 1.0 - t : 0.0;
            wp[x - lo] = v;
            total += v;
        }
        float *row = a->w + (size_t)i * (size_t)a->max_taps;
        for (int x = lo; x < hi; ++x) {
            row[x - lo] = total != 0.0 ? (float)(wp[x - lo] / total) : 0.0f;
        }
        if (wp != ws) free(wp);
        a->lo[i] = lo;
        a->count[i] = hi - lo;
    }
    return 0;
}

/* ------------------------------------------------------------------------ output stores */

/* float32 -> float16 bits, round to nearest even (numpy's astype(float16)). Branch-free
   (every case computed, one selected), so the store loops vectorise. */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    /* Normal halves: rebias the exponent (-112 << 23), round the 13 dropped bits to nearest
       even; a carry into the exponent rounds up to the next binade, or to inf. */
    const uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
    /* Below the smallest normal half: adding 0.5 lines the half's subnormal bits up with the
       float mantissa's low bits, and the float addition rounds them to nearest even. */
    float a;
    memcpy(&a, &x, 4);
    a += 0.5f;
    uint32_t sub;
    memcpy(&sub, &a, 4);
    sub -= 0x3f000000u;
    const uint32_t special = x > 0x7f800000u ? 0x7e00u : 0x7c00u; /* nan : inf or overflow */
    uint32_t h = x < 0x38800000u ? sub : normal;
    h = x >= 0x47800000u ? special : h;
    return (uint16_t)(h | sign);
}

/* float32 -> bfloat16 bits, round to nearest even (finite inputs). */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline uint8_t to_u8(float v) {
    /* 1.5 * 2^23 + v has no fraction bits left: the addition rounds v to nearest even (IEEE
       default rounding; -ffast-math would break this, so it is not used). Resized values
       lie in [0, 255] up to float round-off; the clamp is in integers so the loop
       vectorises. */
    const int q = (int)((v + 12582912.0f) - 12582912.0f);
    return (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
}

/* One loop per direction, so each vectorises (a select in the index would not). */
#define GL_STORE_LOOPS(T, EXPR)                                                       \
    do {                                                                              \
        T *d = plane_row;                                                             \
        if (flip) {                                                                   \
            for (int j = 0; j < out_w; ++j) {                                         \
                const float x = values[j];                                            \
                d[out_w - 1 - j] = (EXPR);                                            \
            }                                                                         \
        } else {                                                                      \
            for (int j = 0; j < out_w; ++j) {                                         \
                const float x = values[j];                                            \
                d[j] = (EXPR);                                                        \
            }                                                                         \
        }                                                                             \
    } while (0)

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GL_HAVE_F16C_PATH 1
/* float16 stores with the F16C instruction (round to nearest even, as f32_to_f16): 8 values
   per instruction instead of ~20 integer operations each. Used when the CPU has it. */
__attribute__((target("avx,f16c"))) static void store_f16_f16c(uint16_t *d, const float *values,
                                                              int out_w, int flip, float scale,
                                                              float shift) {
    const __m256 vs = _mm256_set1_ps(scale), vh = _mm256_set1_ps(shift);
    const __m128i reverse = _mm_setr_epi8(14, 15, 12, 13, 10, 11, 8, 9, 6, 7, 4, 5, 2, 3, 0, 1);
    int j = 0;
    for (; j + 8 <= out_w; j += 8) {
        const __m256 x = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(values + j), vs), vh);
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
        if (flip) {
            h = _mm_shuffle_epi8(h, reverse);
            _mm_storeu_si128((__m128i *)(d + out_w - 8 - j), h);
        } else {
            _mm_storeu_si128((__m128i *)(d + j), h);
        }
    }
    for (; j < out_w; ++j) d[flip ? out_w - 1 - j : j] = f32_to_f16(values[j] * scale + shift);
}

static int has_f16c(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    }
    return cached;
}
#endif

/* Writes one output row of one plane from `values` (out_w floats, resized order). uint8
   skips normalisation (round half to even, clamped), as the CUDA kernel does. */
static void store_row(void *plane_row, const float *values, int out_w, int flip, int dtype,
                      float scale, float shift) {
    switch (dtype) {
    case OUT_F32:
        GL_STORE_LOOPS(float, x * scale + shift);
        break;
    case OUT_F16:
#ifdef GL_HAVE_F16C_PATH
        if (has_f16c()) {
            store_f16_f16c(plane_row, values, out_w, flip, scale, shift);
            break;
        }
#endif
        GL_STORE_LOOPS(uint16_t, f32_to_f16(x * scale + shift));
        break;
    case OUT_BF16:
        GL_STORE_LOOPS(uint16_t, f32_to_bf16(x * scale + shift));
        break;
    default:
        GL_STORE_LOOPS(uint8_t, to_u8(x));
        break;
    }
}

/* --------------------------------------------------------------------- streaming resize */

typedef float v4f __attribute__((vector_size(16))); /* GCC/Clang vector extension */

/* acc += w * pixels: the vertical pass's inner loop, cloned for AVX2 where the CPU has it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void accumulate(float *restrict acc, const uint8_t *restrict pixels, float w, int len) {
    for (int t = 0; t < len; ++t) acc[t] += w * (float)pixels[t];
}

typedef struct {
    Axis ax, ay;
    int channels;     /* channels per source pixel: 1, 3 or 4 (the 4th is ignored) */
    int x0;           /* first source column the horizontal taps read */
    int row_len;      /* floats per accumulator row: (last column - x0) * channels */
    int row_pitch;    /* row_len plus padding for the 4-lane loads of the horizontal pass */
    int ring;         /* accumulator rows kept */
    float *acc;       /* [ring][row_pitch] */
    float *values;    /* [3][out_w] one output row, resized order */
    int next_start;   /* first output row not yet started */
    int next_done;    /* first output row not yet written */
    /* output */
    char *out;
    int out_h, out_w, flip, dtype;
    int clamp; /* the filter can overshoot [0, 255] (bicubic): clamp before the stores */
    float scale[3], shift[3];
} Resizer;

static void resizer_free(Resizer *r) {
    axis_free(&r->ax);
    axis_free(&r->ay);
    free(r->acc);
    free(r->values);
    r->acc = r->values = NULL;
}

/* The first and one-past-last source row (or column) any output index reads. */
static void axis_span(const Axis *a, int *first, int *last) {
    int f = a->lo[0], l = a->lo[0] + a->count[0];
    for (int i = 1; i < a->n; ++i) {
        if (a->lo[i] < f) f = a->lo[i];
        if (a->lo[i] + a->count[i] > l) l = a->lo[i] + a->count[i];
    }
    *first = f;
    *last = l;
}

/* 0 on success, -1 out of memory. Box is (top, left, height, width) in source pixels. */
static int resizer_init(Resizer *r, int height, int width, int channels, const double box[4],
                        char *out, int out_h, int out_w, int flip, int dtype,
                        const float scale[3], const float shift[3], int filter) {
    memset(r, 0, sizeof(*r));
    if (axis_init(&r->ay, height, box[0], box[0] + box[2], out_h, filter) ||
        axis_init(&r->ax, width, box[1], box[1] + box[3], out_w, filter)) {
        resizer_free(r);
        return -1;
    }
    int x1;
    axis_span(&r->ax, &r->x0, &x1);
    r->channels = channels;
    r->row_len = (x1 - r->x0) * channels;
    r->row_pitch = r->row_len + 4;
    /* Output rows live at once: those whose window holds one source row. */
    int ring = 1;
    for (int i = 0; i < out_h; ++i) {
        int end = r->ay.lo[i] + r->ay.count[i], k = i + 1;
        while (k < out_h && r->ay.lo[k] < end) ++k;
        if (k - i > ring) ring = k - i;
    }
    r->ring = ring;
    r->acc = calloc((size_t)ring * (size_t)r->row_pitch, sizeof(float));
    r->values = malloc(sizeof(float) * 3 * (size_t)out_w);
    if (!r->acc || !r->values) {
        resizer_free(r);
        return -1;
    }
    r->out = out;
    r->out_h = out_h;
    r->out_w = out_w;
    r->flip = flip;
    r->dtype = dtype;
    r->clamp = filter == FILTER_BICUBIC;
    for (int c = 0; c < 3; ++c) {
        r->scale[c] = scale[c];
        r->shift[c] = shift[c];
    }
    return 0;
}

/* The horizontal pass for 3 or 4 channels (a compile-time constant in each caller), one
   4-lane multiply-add per tap: lanes 0-2 are R, G, B; lane 3 reads the next pixel's first
   channel (or the row's padding) and is discarded. */
static inline void horizontal_rgb(const Resizer *r, const float *acc, int C) {
    const int out_w = r->out_w, taps = r->ax.max_taps;
    float *v0 = r->values, *v1 = r->values + out_w, *v2 = r->values + 2 * out_w;
    for (int j = 0; j < out_w; ++j) {
        const float *w = r->ax.w + (size_t)j * (size_t)taps;
        const float *p = acc + (size_t)(r->ax.lo[j] - r->x0) * (size_t)C;
        const int n = r->ax.count[j];
        v4f s = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma GCC unroll 4
        for (int k = 0; k < n; ++k) {
            v4f px;
            memcpy(&px, p + k * C, sizeof(px));
            s += w[k] * px;
        }
        v0[j] = s[0];
        v1[j] = s[1];
        v2[j] = s[2];
    }
}

static void horizontal_grey(const Resizer *r, const float *acc) {
    const int taps = r->ax.max_taps;
    for (int j = 0; j < r->out_w; ++j) {
        const float *w = r->ax.w + (size_t)j * (size_t)taps;
        const float *p = acc + (r->ax.lo[j] - r->x0);
        float s = 0.0f;
        for (int k = 0; k < r->ax.count[j]; ++k) s += w[k] * p[k];
        r->values[j] = s;
    }
}

/* The horizontal pass of a finished accumulator row into output row `i`. */
static void finish_row(Resizer *r, int i) {
    const float *acc = r->acc + (size_t)(i % r->ring) * (size_t)r->row_pitch;
    const int out_w = r->out_w;
    if (r->channels == 3) {
        horizontal_rgb(r, acc, 3);
    } else if (r->channels == 4) {
        horizontal_rgb(r, acc, 4);
    } else {
        horizontal_grey(r, acc);
    }
    const int planes = r->channels == 1 ? 1 : 3;
    if (r->clamp) {
        float *v = r->values;
        for (int j = 0; j < planes * out_w; ++j) {
            v[j] = v[j] < 0.0f ? 0.0f : v[j] > 255.0f ? 255.0f : v[j];
        }
    }
    const size_t plane = (size_t)r->out_h * (size_t)out_w * (size_t)OUT_ITEMSIZE[r->dtype];
    const size_t row = (size_t)i * (size_t)out_w * (size_t)OUT_ITEMSIZE[r->dtype];
    for (int c = 0; c < 3; ++c) {
        const float *v = r->values + (size_t)(planes == 1 ? 0 : c) * (size_t)out_w;
        store_row(r->out + c * plane + row, v, out_w, r->flip, r->dtype, r->scale[c],
                  r->shift[c]);
    }
}

/* Feeds source row `y` (pixels from column x0 on, `channels` bytes each). */
static void resizer_row(Resizer *r, int y, const uint8_t *pixels) {
    const int len = r->row_len;
    while (r->next_start < r->out_h && r->ay.lo[r->next_start] <= y) {
        memset(r->acc + (size_t)(r->next_start % r->ring) * (size_t)r->row_pitch, 0,
               sizeof(float) * (size_t)len);
        r->next_start++;
    }
    for (int i = r->next_done; i < r->next_start; ++i) {
        const int k = y - r->ay.lo[i];
        if (k >= r->ay.count[i]) continue;
        const float w = r->ay.w[(size_t)i * (size_t)r->ay.max_taps + (size_t)k];
        accumulate(r->acc + (size_t)(i % r->ring) * (size_t)r->row_pitch, pixels, w, len);
    }
    while (r->next_done < r->next_start &&
           r->ay.lo[r->next_done] + r->ay.count[r->next_done] <= y + 1) {
        finish_row(r, r->next_done);
        r->next_done++;
    }
}

/* ---------------------------------------------------------------------- argument helpers */

static int parse_common(PyObject *box_obj, PyObject *scale_obj, PyObject *shift_obj,
                        double box[4], float scale[3], float shift[3], int dtype) {
    if (!PyTuple_Check(box_obj) || !PyTuple_Check(scale_obj) || !PyTuple_Check(shift_obj)) {
        PyErr_SetString(PyExc_TypeError, "box, scale and shift must be tuples of floats");
        return -1;
    }
    if (!PyArg_ParseTuple(box_obj, "dddd;box must be (top, left, height, width)", &box[0],
                          &box[1], &box[2], &box[3]))
        return -1;
    double s[3], h[3];
    if (!PyArg_ParseTuple(scale_obj, "ddd;scale must be 3 floats", &s[0], &s[1], &s[2]) ||
        !PyArg_ParseTuple(shift_obj, "ddd;shift must be 3 floats", &h[0], &h[1], &h[2]))
        return -1;
    for (int c = 0; c < 3; ++c) {
        scale[c] = (float)s[c];
        shift[c] = (float)h[c];
    }
    if (dtype < 0 || dtype > 3) {
        PyErr_Format(PyExc_ValueError, "dtype code must be 0..3, got %d", dtype);
        return -1;
    }
    if (!isfinite(box[0]) || !isfinite(box[1]) || !isfinite(box[2]) || !isfinite(box[3])) {
        PyErr_Format(PyExc_ValueError, "crop box must be finite");
        return -1;
    }
    if (!(box[2] > 0.0) || !(box[3] > 0.0) || box[0] < 0.0 || box[1] < 0.0) {
        PyErr_Format(PyExc_ValueError, "crop box must have top, left >= 0 and positive size");
        return -1;
    }
    return 0;
}

static int check_filter(int filter) {
    if (filter != FILTER_BILINEAR && filter != FILTER_BICUBIC) {
        PyErr_Format(PyExc_ValueError, "filter must be 0 (bilinear) or 1 (bicubic), got %d",
                     filter);
        return -1;
    }
    return 0;
}

static int check_box(const double box[4], int height, int width) {
    if (box[0] + box[2] > height + 1e-3 || box[1] + box[3] > width + 1e-3) {
        PyErr_Format(PyExc_ValueError, "crop box exceeds the %dx%d image", height, width);
        return -1;
    }
    return 0;
}

static int check_out(Py_buffer *out, int out_h, int out_w, int dtype) {
    if (out_h < 1 || out_w < 1) {
        PyErr_Format(PyExc_ValueError, "output size must be >= 1, got %dx%d", out_h, out_w);
        return -1;
    }
    const Py_ssize_t need = (Py_ssize_t)3 * out_h * out_w * OUT_ITEMSIZE[dtype];
    if (out->len != need) {
        PyErr_Format(PyExc_ValueError, "`out` holds %zd bytes, [3, %d, %d] of this dtype needs %zd",
                     out->len, out_h, out_w, need);
        return -1;
    }
    return 0;
}

/* Clamps float round-off at the far edge, as gpu_loader.ops.clamp_box does. */
static void clamp_box(double box[4], int height, int width) {
    if (box[0] + box[2] > height) box[2] = height - box[0];
    if (box[1] + box[3] > width) box[3] = width - box[1];
}

/* ------------------------------------------------------------------------- resize_into */

static PyObject *py_resize_into(PyObject *self, PyObject *args) {
    Py_buffer src, out;
    int height, width, channels, out_h, out_w, flip, dtype, filter = FILTER_BILINEAR;
    PyObject *box_obj, *scale_obj, *shift_obj;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiiOw*iipiOO|i", &src, &height, &width, &channels, &box_obj,
                          &out, &out_h, &out_w, &flip, &dtype, &scale_obj, &shift_obj, &filter))
        return NULL;
    PyObject *result = NULL;
    double box[4];
    float scale[3], shift[3];
    Resizer r;
    memset(&r, 0, sizeof(r));
    if (parse_common(box_obj, scale_obj, shift_obj, box, scale, shift, dtype) ||
        check_filter(filter) || check_out(&out, out_h, out_w, dtype) ||
        check_box(box, height, width))
        goto done;
    if (channels != 1 && channels != 3 && channels != 4) {
        PyErr_Format(PyExc_ValueError, "channels must be 1, 3 or 4, got %d", channels);
        goto done;
    }
    if (height < 1 || width < 1 || src.len != (Py_ssize_t)height * width * channels) {
        PyErr_Format(PyExc_ValueError, "`src` holds %zd bytes, not %d x %d x %d", src.len,
                     height, width, channels);
        goto done;
    }
    clamp_box(box, height, width);
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = resizer_init(&r, height, width, channels, box, out.buf, out_h, out_w, flip, dtype,
                          scale, shift, filter);
    if (!failed) {
        int y0, y1;
        axis_span(&r.ay, &y0, &y1);
        const uint8_t *base = src.buf;
        for (int y = y0; y < y1; ++y) {
            resizer_row(&r, y, base + ((size_t)y * (size_t)width + (size_t)r.x0) * (size_t)channels);
        }
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    resizer_free(&r);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return result;
}

/* ------------------------------------------------------------------ decode_resize_jpeg */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    int max_scans; /* on_progress's limit */
} ErrorManager;

static void on_error(j_common_ptr cinfo) {
    ErrorManager *e = (ErrorManager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->message);
    longjmp(e->jump, 1);
}

/* Warnings (corrupt data, premature end of file) are errors here, as simplejpeg's strict
   mode makes them: a damaged file must be reported, not delivered with grey blocks. */
static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) on_error(cinfo);
}

/* A progressive JPEG's every scan walks the whole coefficient buffer, so a few bytes per
   scan buy a pass over the image: a crafted file of thousands of tiny scans (valid ones,
   which raise no warning) holds a decode thread for seconds to minutes (cure53's
   libjpeg-turbo report, LJT-01-004). libjpeg-turbo's advice is a progress monitor with a
   scan limit; nvImageCodec's default limit is the same (NVIMGCODEC_MAX_JPEG_SCANS).
   decode_resize_jpeg takes the limit (at most this; the caller lowers it for large
   images: _decode.scan_limit); the Python paths count scans first (_decode.check_scans). */
enum { MAX_JPEG_SCANS = 256 };

static void on_progress(j_common_ptr cinfo) {
    if (!cinfo->is_decompressor) return;
    ErrorManager *e = (ErrorManager *)cinfo->err;
    if (((j_decompress_ptr)cinfo)->input_scan_number > e->max_scans) {
        snprintf(e->message, sizeof(e->message), "more than %d scans", e->max_scans);
        longjmp(e->jump, 1);
    }
}

static PyObject *JpegError;

enum { ROWS_PER_READ = 16 }; /* scanlines asked of libjpeg per call */
enum { CROP_MARGIN = 16 }; /* pixels: the widest iMCU (h2 sampling, 8x8 blocks) */

typedef struct {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    struct jpeg_progress_mgr progress;
    Resizer r;
    JSAMPLE *rows;
    int created;
    int filter;
} JpegJob;

/* Returns 0, or 1 with job->err.message set, or -1 out of memory. Runs without the GIL. */
static int jpeg_job_run(JpegJob *job, const uint8_t *data, size_t size, int denom, int height,
                        int width, const double box_in[4], char *out, int out_h, int out_w,
                        int flip, int dtype, const float scale[3], const float shift[3]) {
    struct jpeg_decompress_struct *cinfo = &job->cinfo;
    double box[4] = {box_in[0], box_in[1], box_in[2], box_in[3]};
    cinfo->err = jpeg_std_error(&job->err.pub);
    job->err.pub.error_exit = on_error;
    job->err.pub.emit_message = on_message;
    if (setjmp(job->err.jump)) return 1;
    jpeg_create_decompress(cinfo);
    job->created = 1;
    job->progress.progress_monitor = on_progress;
    cinfo->progress = &job->progress;
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    const int grey = cinfo->jpeg_color_space == JCS_GRAYSCALE;
    if (!grey && cinfo->jpeg_color_space != JCS_YCbCr && cinfo->jpeg_color_space != JCS_RGB) {
        snprintf(job->err.message, sizeof(job->err.message),
                 "colour space %d is not YCbCr, RGB or greyscale", (int)cinfo->jpeg_color_space);
        return 1;
    }
    cinfo->out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)denom;
    cinfo->dct_method = JDCT_ISLOW; /* the library default, as simplejpeg and Pillow use */
    jpeg_start_decompress(cinfo);
    if ((int)cinfo->output_height != height || (int)cinfo->output_width != width) {
        snprintf(job->err.message, sizeof(job->err.message),
                 "decoder gives %ux%u at 1/%d scale, expected %dx%d", cinfo->output_height,
                 cinfo->output_width, denom, height, width);
        return 1;
    }
    const int channels = grey ? 1 : 3;
    clamp_box(box, height, width);
    if (resizer_init(&job->r, height, width, channels, box, out, out_h, out_w, flip, dtype,
                     scale, shift, job->filter))
        return -1;
    int x0, x1, y0, y1;
    axis_span(&job->r.ax, &x0, &x1);
    axis_span(&job->r.ay, &y0, &y1);
    /* The chroma upsampler treats the decoded span's edges as image edges, so a margin of
       one iMCU (at most 16 pixels) on each side keeps the columns we use exact. libjpeg
       then moves xoffset down to an iMCU boundary and widens the span to match. */
    const int left = x0 > CROP_MARGIN ? x0 - CROP_MARGIN : 0;
    const int right = x1 + CROP_MARGIN < width ? x1 + CROP_MARGIN : width;
    JDIMENSION xoffset = (JDIMENSION)left, cropped = (JDIMENSION)(right - left);
    if (left > 0 || right < width) jpeg_crop_scanline(cinfo, &xoffset, &cropped);
    const size_t skip_cols = (size_t)(x0 - (int)xoffset) * (size_t)channels;
    const size_t stride = (size_t)cropped * (size_t)channels;
    /* Several rows per call: one row at a time costs libjpeg a copy through its spare row. */
    job->rows = malloc(stride * ROWS_PER_READ);
    if (!job->rows) return -1;
    JSAMPROW pointers[ROWS_PER_READ];
    for (int k = 0; k < ROWS_PER_READ; ++k) pointers[k] = job->rows + (size_t)k * stride;
    if (y0 > 0) jpeg_skip_scanlines(cinfo, (JDIMENSION)y0);
    int y = y0;
    while (y < y1) {
        const int want = y1 - y < ROWS_PER_READ ? y1 - y : ROWS_PER_READ;
        const int got = (int)jpeg_read_scanlines(cinfo, pointers, (JDIMENSION)want);
        if (got < 1) {
            snprintf(job->err.message, sizeof(job->err.message), "no scanline %d", y);
            return 1;
        }
        for (int k = 0; k < got; ++k, ++y) resizer_row(&job->r, y, pointers[k] + skip_cols);
    }
    /* Entropy-decode the rest without reconstructing it, so damage anywhere is found.
       libjpeg-turbo's skip discards whole iMCU rows' coefficients after decoding them, but a
       skip that reaches the last row returns at once without decoding anything: so skip to
       the row before it and read that one. */
    if ((int)cinfo->output_scanline < height - 1)
        jpeg_skip_scanlines(cinfo, (JDIMENSION)(height - 1 - (int)cinfo->output_scanline));
    while ((int)cinfo->output_scanline < height) {
        if (jpeg_read_scanlines(cinfo, pointers, 1) != 1) break;
    }
    jpeg_finish_decompress(cinfo);
    return 0;
}

/* A small decode keeps the GIL. Letting go of it and taking it back costs two hand-offs
 * between threads, futex calls and context switches included, which for a 32-64 px JPEG
 * to a 32 px output (20-30 us of work) cost more than running it alone: with several
 * threads on them the CPU path spent 149 us of CPU per image, 105 with these kept. The
 * bounds keep the hold short: at most SMALL_JOB_PIXELS decoded plus output pixels (about
 * a 64 px image to a 64 px output, ~50 us) and SMALL_JOB_BYTES of data, which bounds what
 * a hostile file's scans can cost. */
#define SMALL_JOB_PIXELS 8192
#define SMALL_JOB_BYTES 32768
/* One decode_resize_jpeg call's arguments, parsed and checked (the GIL held), and its job. */
typedef struct {
    Py_buffer data, out;
    int held; /* the two buffers are held (released by job_args_free) */
    int denom, height, width, out_h, out_w, flip, dtype;
    double box[4];
    float scale[3], shift[3];
    JpegJob *job;
} JobArgs;

/* Parse one call's arguments into a (zeroed) JobArgs: 0, or -1 with an exception set. */
static int job_args_parse(PyObject *args, JobArgs *a) {
    PyObject *box_obj, *scale_obj, *shift_obj;
    int filter = FILTER_BILINEAR, max_scans = MAX_JPEG_SCANS;
    if (!PyArg_ParseTuple(args, "y*iiiOw*iipiOO|ii", &a->data, &a->denom, &a->height, &a->width,
                          &box_obj, &a->out, &a->out_h, &a->out_w, &a->flip, &a->dtype,
                          &scale_obj, &shift_obj, &filter, &max_scans))
        return -1;
    a->held = 1;
    a->job = calloc(1, sizeof(JpegJob));
    if (!a->job) {
        PyErr_NoMemory();
        return -1;
    }
    if (parse_common(box_obj, scale_obj, shift_obj, a->box, a->scale, a->shift, a->dtype) ||
        check_filter(filter) || check_out(&a->out, a->out_h, a->out_w, a->dtype) ||
        check_box(a->box, a->height, a->width))
        return -1;
    a->job->filter = filter;
    if (max_scans < 1 || max_scans > MAX_JPEG_SCANS) {
        PyErr_Format(PyExc_ValueError, "max_scans must be 1 to %d, got %d", MAX_JPEG_SCANS,
                     max_scans);
        return -1;
    }
    a->job->err.max_scans = max_scans;
    if (a->denom != 1 && a->denom != 2 && a->denom != 4 && a->denom != 8) {
        PyErr_Format(PyExc_ValueError, "denom must be 1, 2, 4 or 8, got %d", a->denom);
        return -1;
    }
    return 0;
}

/* jpeg_job_run on a parsed call; runs without the GIL. */
static int job_args_run(JobArgs *a) {
    return jpeg_job_run(a->job, a->data.buf, (size_t)a->data.len, a->denom, a->height, a->width,
                        a->box, a->out.buf, a->out_h, a->out_w, a->flip, a->dtype, a->scale,
                        a->shift);
}

/* A job's working memory (libjpeg's, a whole image's coefficients for a progressive file,
 * and the resizer's), freed; its error message stays. Runs without the GIL. */
static void job_release(JpegJob *job) {
    if (job->created) jpeg_destroy_decompress(&job->cinfo);
    job->created = 0;
    free(job->rows);
    job->rows = NULL;
    resizer_free(&job->r);
}

static void job_args_free(JobArgs *a) {
    if (a->job) {
        job_release(a->job);
        free(a->job);
        a->job = NULL;
    }
    if (a->held) {
        PyBuffer_Release(&a->data);
        PyBuffer_Release(&a->out);
        a->held = 0;
    }
}

static PyObject *py_decode_resize_jpeg(PyObject *self, PyObject *args) {
    (void)self;
    JobArgs a;
    memset(&a, 0, sizeof(a));
    PyObject *result = NULL;
    if (job_args_parse(args, &a)) goto done;
    int status;
    if ((long long)a.height * a.width + (long long)a.out_h * a.out_w <= SMALL_JOB_PIXELS &&
        a.data.len <= SMALL_JOB_BYTES) {
        status = job_args_run(&a);
    } else {
        Py_BEGIN_ALLOW_THREADS
        status = job_args_run(&a);
        Py_END_ALLOW_THREADS
    }
    if (status < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (status > 0) {
        PyErr_SetString(JpegError, a.job->err.message);
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    job_args_free(&a);
    return result;
}

/* decode_resize_jpegs(calls): decode_resize_jpeg on each argument tuple of the sequence
 * ``calls``, all of them in one release of the GIL (a run of small JPEGs otherwise paid two
 * hand-offs of it per image, or held it through every decode). Arguments are checked first,
 * all of them: a bad one raises as decode_resize_jpeg would, and nothing is decoded. Returns
 * a list with one entry per call: None (decoded), the JpegError message (a str), or -1 (out
 * of memory); a failed call leaves the others' results as they are. */
static PyObject *py_decode_resize_jpegs(PyObject *self, PyObject *arg) {
    (void)self;
    /* A tuple of its own: converting an argument may run Python code that changes a list. */
    if (!PyList_Check(arg) && !PyTuple_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "decode_resize_jpegs takes a sequence of argument tuples");
        return NULL;
    }
    PyObject *calls = PySequence_Tuple(arg);
    if (!calls) return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(calls);
    PyObject *result = NULL;
    JobArgs *jobs = n > 0 ? calloc((size_t)n, sizeof(JobArgs)) : NULL;
    int *status = n > 0 ? calloc((size_t)n, sizeof(int)) : NULL;
    if (n > 0 && (!jobs || !status)) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *item = PyTuple_GET_ITEM(calls, i);
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "decode_resize_jpegs: call %zd is not a tuple", i);
            goto done;
        }
        if (job_args_parse(item, &jobs[i])) goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; ++i) {
        status[i] = job_args_run(&jobs[i]);
        job_release(jobs[i].job); /* a failed progressive decode held a whole image's worth */
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    if (!result) goto done;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *entry;
        if (status[i] == 0) {
            entry = Py_None;
            Py_INCREF(entry);
        } else if (status[i] < 0) {
            entry = PyLong_FromLong(-1);
        } else {
            entry = PyUnicode_DecodeUTF8(jobs[i].job->err.message,
                                         (Py_ssize_t)strlen(jobs[i].job->err.message), "replace");
        }
        if (!entry) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, entry);
    }
done:
    for (Py_ssize_t i = 0; jobs && i < n; ++i) job_args_free(&jobs[i]);
    free(jobs);
    free(status);
    Py_DECREF(calls);
    return result;
}

/* ------------------------------------------------------------- crop parameters (Philox) */

/* numpy's Philox (Random123's Philox4x64 with 10 rounds): a 256-bit counter and a 128-bit
   key give four 64-bit words per block. numpy starts the counter at 0 and increments it
   before each block, hands the words out in order, and splits one word into two 32-bit
   draws (low half first) for bounded integers. Floats take a whole word each. */
typedef struct {
    uint64_t ctr[4], key[2], block[4];
    int pos; /* next word of block to hand out; 4: a new block is due */
    int has_u32;
    uint32_t u32;
} Philox;

static void philox_init(Philox *p, uint64_t key_low, uint64_t key_high) {
    memset(p, 0, sizeof(*p));
    p->key[0] = key_low;
    p->key[1] = key_high;
    p->pos = 4;
}

static uint64_t philox_next64(Philox *p) {
    if (p->pos < 4) return p->block[p->pos++];
    for (int i = 0; i < 4 && ++p->ctr[i] == 0; ++i) {
    } /* carry */
    uint64_t c0 = p->ctr[0], c1 = p->ctr[1], c2 = p->ctr[2], c3 = p->ctr[3];
    uint64_t k0 = p->key[0], k1 = p->key[1];
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B97F4A7C15ULL;
            k1 += 0xBB67AE8584CAA73BULL;
        }
        const unsigned __int128 m0 = (unsigned __int128)0xD2E7470EE14C6C93ULL * c0;
        const unsigned __int128 m1 = (unsigned __int128)0xCA5A826395121157ULL * c2;
        const uint64_t hi0 = (uint64_t)(m0 >> 64), lo0 = (uint64_t)m0;
        const uint64_t hi1 = (uint64_t)(m1 >> 64), lo1 = (uint64_t)m1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    p->block[0] = c0;
    p->block[1] = c1;
    p->block[2] = c2;
    p->block[3] = c3;
    p->pos = 1;
    return c0;
}

static uint32_t philox_next32(Philox *p) {
    if (p->has_u32) {
        p->has_u32 = 0;
        return p->u32;
    }
    const uint64_t word = philox_next64(p);
    p->has_u32 = 1;
    p->u32 = (uint32_t)(word >> 32);
    return (uint32_t)word;
}

/* Generator.random(): 53 bits of a word. */
static double philox_double(Philox *p) {
    return (double)(philox_next64(p) >> 11) * (1.0 / 9007199254740992.0);
}

/* Generator.integers(0, n) for 1 <= n <= 2**32 - 1 (int64): Lemire's rejection method on
   32-bit draws, as numpy's bounded integers; n == 1 draws nothing. */
static uint64_t philox_below(Philox *p, uint64_t n) {
    const uint32_t rng = (uint32_t)(n - 1);
    if (rng == 0) return 0;
    const uint32_t excl = rng + 1;
    uint64_t m = (uint64_t)philox_next32(p) * excl;
    uint32_t leftover = (uint32_t)m;
    if (leftover < excl) {
        const uint32_t threshold = (UINT32_MAX - rng) % excl;
        while (leftover < threshold) {
            m = (uint64_t)philox_next32(p) * excl;
            leftover = (uint32_t)m;
        }
    }
    return m >> 32;
}

enum { MAX_TRIES = 10 }; /* _transforms._MAX_TRIES */

/* Returns (top, left, height, width, flip); top == -1: no try fitted (the caller takes
   torchvision's centre-crop fallback, flip drawn as usual); top == -2: a value left the
   finite range Python's round() accepts, so the caller draws in Python (which raises as
   it always did). */
static PyObject *py_train_params(PyObject *self, PyObject *args) {
    unsigned long long key_low, key_high;
    long long height, width;
    double s0, s1, log_r0, log_r1, flip_prob;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKLLddddd", &key_low, &key_high, &height, &width, &s0, &s1,
                          &log_r0, &log_r1, &flip_prob))
        return NULL;
    if (height < 1 || width < 1 || height > INT32_MAX || width > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "train_params: height and width must be in [1, 2**31), "
                                       "got %lld x %lld", height, width);
        return NULL;
    }
    Philox p;
    philox_init(&p, key_low, key_high);
    const double area = (double)(height * width), s_range = s1 - s0, r_range = log_r1 - log_r0;
    if (!isfinite(s_range) || !isfinite(r_range)) return Py_BuildValue("iiiii", -2, 0, 0, 0, 0);
    long long top = -1, left = -1, h = 0, w = 0;
    for (int i = 0; i < MAX_TRIES; ++i) {
        const double target = area * (s0 + s_range * philox_double(&p));
        const double aspect = exp(log_r0 + r_range * philox_double(&p));
        const double wd = nearbyint(sqrt(target * aspect)); /* half to even, as Python */
        const double hd = nearbyint(sqrt(target / aspect));
        if (!isfinite(wd) || !isfinite(hd)) return Py_BuildValue("iiiii", -2, 0, 0, 0, 0);
        if (0 < wd && wd <= (double)width && 0 < hd && hd <= (double)height) {
            w = (long long)wd;
            h = (long long)hd;
            top = (long long)philox_below(&p, (uint64_t)(height - h + 1));
            left = (long long)philox_below(&p, (uint64_t)(width - w + 1));
            break;
        }
    }
    const int flip = philox_double(&p) < flip_prob;
    return Py_BuildValue("LLLLO", top, left, h, w, flip ? Py_True : Py_False);
}

/* Raw 64-bit words of the stream, for the tests that compare it with numpy's Philox. */
static PyObject *py_philox_words(PyObject *self, PyObject *args) {
    unsigned long long key_low, key_high;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKn", &key_low, &key_high, &n)) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "philox_words: n must be >= 0");
        return NULL;
    }
    Philox p;
    philox_init(&p, key_low, key_high);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *v = PyLong_FromUnsignedLongLong(philox_next64(&p));
        if (!v) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

/* ------------------------------------------------------------------------- JPEG header */

/* _formats._tiff_orientation, rule for rule: the orientation Pillow's exif_transpose applies
   for an APP1 Exif block (the bytes after its "Exif\0\0"), 1 when it has none or one it
   cannot read or use. Offsets are 64-bit so no IFD offset or value size can wrap. */
static uint64_t tiff_u32(const uint8_t *p, int little) {
    return little ? ((uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
                     (uint64_t)p[3] << 24)
                  : ((uint64_t)p[0] << 24 | (uint64_t)p[1] << 16 | (uint64_t)p[2] << 8 |
                     (uint64_t)p[3]);
}

static unsigned tiff_u16(const uint8_t *p, int little) {
    return little ? (unsigned)(p[0] | p[1] << 8) : (unsigned)(p[0] << 8 | p[1]);
}

/* Bytes per value of the TIFF field types Pillow reads (_formats._TIFF_UNITS), 0 for others. */
static uint64_t tiff_unit(unsigned type) {
    switch (type) {
    case 1: case 2: case 6: case 7: return 1;
    case 3: case 8: return 2;
    case 4: case 9: case 11: case 13: return 4;
    case 5: case 10: case 12: case 16: return 8;
    default: return 0;
    }
}

/* The orientation a field's first value gives (_formats._tiff_orientation_value), 1 when
   it is not a number equal to an integer 1-8. */
static int tiff_orientation_value(const uint8_t *v, unsigned type, int little) {
    double value;
    switch (type) {
    case 3: value = tiff_u16(v, little); break;
    case 8: value = (int16_t)tiff_u16(v, little); break;
    case 6: value = (int8_t)v[0]; break;
    case 4: case 13: value = (double)tiff_u32(v, little); break;
    case 9: value = (int32_t)(uint32_t)tiff_u32(v, little); break;
    case 16: { /* LONG8: any value outside 1-8 turns nothing, so the high word decides */
        const uint64_t hi = tiff_u32(little ? v + 4 : v, little);
        const uint64_t lo = tiff_u32(little ? v : v + 4, little);
        value = hi ? 0 : (double)lo;
        break;
    }
    case 11: {
        const uint32_t bits = (uint32_t)tiff_u32(v, little);
        float f;
        memcpy(&f, &bits, 4);
        value = f;
        break;
    }
    case 12: {
        const uint64_t bits = little ? tiff_u32(v, 1) | tiff_u32(v + 4, 1) << 32
                                     : tiff_u32(v, 0) << 32 | tiff_u32(v + 4, 0);
        memcpy(&value, &bits, 8);
        break;
    }
    case 5: case 10: { /* RATIONAL, SRATIONAL: a whole quotient, none for a zero denominator */
        const uint32_t un = (uint32_t)tiff_u32(v, little), ud = (uint32_t)tiff_u32(v + 4, little);
        const int64_t num = type == 5 ? (int64_t)un : (int64_t)(int32_t)un;
        const int64_t den = type == 5 ? (int64_t)ud : (int64_t)(int32_t)ud;
        if (den == 0 || num % den != 0) return 1;
        value = (double)(num / den);
        break;
    }
    default: return 1; /* BYTE, ASCII, UNDEFINED: bytes or text in Pillow */
    }
    return value >= 1 && value <= 8 && value == (double)(int)value ? (int)value : 1;
}

static int tiff_orientation(const uint8_t *t, uint64_t n) {
    if (n >= 6 && memcmp(t, "Exif\0", 6) == 0) { /* a doubled prefix */
        t += 6;
        n -= 6;
    }
    if (n < 8) return 1;
    int little;
    if (memcmp(t, "II*\0", 4) == 0 || memcmp(t, "II\0*", 4) == 0) little = 1;
    else if (memcmp(t, "MM\0*", 4) == 0 || memcmp(t, "MM*\0", 4) == 0 ||
             memcmp(t, "MM\0+", 4) == 0) /* Pillow misses big-endian BigTIFF's magic */
        little = 0;
    else return 1; /* no TIFF header, or little-endian BigTIFF */
    const uint64_t ifd = tiff_u32(t + 4, little);
    if (ifd + 2 > n) return 1;
    const unsigned count = tiff_u16(t + ifd, little);
    uint64_t read[65536 / 64]; /* tags already read: a repeat is skipped */
    memset(read, 0, sizeof read);
    uint64_t budget = 0; /* out-of-line bytes so far, skipped entries' included */
    for (unsigned i = 0; i < count; ++i) {
        const uint64_t entry = ifd + 2 + 12 * (uint64_t)i;
        if (entry + 12 > n) return 1;
        const unsigned tag = tiff_u16(t + entry, little), type = tiff_u16(t + entry + 2, little);
        const uint64_t unit = tiff_unit(type);
        if (read[tag / 64] >> (tag % 64) & 1 || unit == 0) continue;
        const uint64_t size = tiff_u32(t + entry + 4, little) * unit;
        uint64_t at = entry + 8;
        if (size > 4) {
            at = tiff_u32(t + entry + 8, little);
            budget += size;
            if (budget > n) continue;
            if (at + size > n) return 1; /* a short read ends Pillow's walk */
        }
        if (size == 0) continue;
        if (tag == 0x0112) return tiff_orientation_value(t + at, type, little);
        read[tag / 64] |= (uint64_t)1 << (tag % 64);
    }
    return 1;
}

/* _formats.jpeg_header and jpeg_chroma_ratio in one walk, with the GIL held (no release and
   retake for a few microseconds of work). Returns 1 and fills the fields for a common JPEG,
   0 where those return None; the rules are theirs, line for line (tests compare the two
   on every colour-space rule and thousands of damaged headers). colorspace: 0 Gray,
   1 YCbCr, 2 RGB, 3 CMYK, 4 YCCK. */
typedef struct {
    long height, width;
    int colorspace, orientation, chroma;
} JpegHeader;

static int is_other_sof(int m) {
    return m >= 0xC3 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

/* The orientation of the Exif block Pillow reads from several APP1 Exif segments before the
   scan (_formats._add_exif_segment): their payloads after "Exif\0\0", joined (``total``
   bytes). -1 when the copy cannot be made (the caller steps aside to the Python walk). */
static int joined_exif_orientation(const uint8_t *v, size_t end, size_t total) {
    if (total == 0) return 1;
    uint8_t *joined = malloc(total);
    if (joined == NULL) return -1;
    size_t pos = 2, filled = 0;
    while (pos + 4 <= end && v[pos] == 0xFF) {
        const int marker = v[pos + 1];
        if (marker == 0xFF) {
            pos += 1;
            continue;
        }
        if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
            pos += 2;
            continue;
        }
        const size_t length = (size_t)v[pos + 2] << 8 | v[pos + 3];
        if (length < 2 || pos + 2 + length > end || marker == 0xDA) break;
        const size_t at = pos + 4, size = length - 2;
        if (marker == 0xE1 && at + 6 <= end && memcmp(v + at, "Exif\0", 6) == 0 && size > 6) {
            memcpy(joined + filled, v + at + 6, size - 6);
            filled += size - 6;
        }
        pos += 2 + length;
    }
    const int orientation = tiff_orientation(joined, filled);
    free(joined);
    return orientation;
}

static int jpeg_header_read(const uint8_t *v, size_t end, JpegHeader *h) {
    size_t pos = 2, frame = 0; /* frame: data offset of the frame header, 0 when none yet */
    int jfif = 0, adobe = -1, orientation = 1, exif_segments = 0;
    size_t exif_at = 0, exif_size = 0, exif_total = 0; /* the first; all payloads' bytes */
    while (pos + 4 <= end) {
        if (v[pos] != 0xFF) return 0;
        const int marker = v[pos + 1];
        if (marker == 0xFF) { /* fill byte */
            pos += 1;
            continue;
        }
        if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
            pos += 2; /* SOI, TEM, RSTn: no length */
            continue;
        }
        const size_t length = (size_t)v[pos + 2] << 8 | v[pos + 3];
        if (length < 2 || pos + 2 + length > end) return 0;
        const size_t at = pos + 4, size = length - 2;
        if (marker == 0xDA) break;
        if (marker == 0xC0 || marker == 0xC1 || marker == 0xC2) {
            if (frame || size < 6 || v[at] != 8 || size != 6 + 3 * (size_t)v[at + 5]) return 0;
            frame = at;
        } else if (is_other_sof(marker)) {
            return 0;
        } else if (marker == 0xE0 && size >= 14 && memcmp(v + at, "JFIF", 5) == 0) {
            jfif = 1;
        } else if (marker == 0xEE && size >= 12 && memcmp(v + at, "Adobe", 5) == 0) {
            adobe = v[at + 11];
        } else if (marker == 0xE1 && at + 6 <= end && memcmp(v + at, "Exif\0", 6) == 0) {
            /* As the Python slice: the 6 bytes are read even past a shorter segment. */
            if (exif_segments++ == 0) {
                exif_at = at;
                exif_size = size;
            }
            exif_total += size > 6 ? size - 6 : 0;
        }
        pos += 2 + length;
    }
    if (!(pos + 4 <= end) || !frame) return 0; /* no scan (truncated), or no frame */
    if (exif_segments == 1 && exif_size > 6) {
        orientation = tiff_orientation(v + exif_at + 6, exif_size - 6);
    } else if (exif_segments > 1) {
        orientation = joined_exif_orientation(v, end, exif_total);
        if (orientation < 0) return 0;
    }
    const long height = (long)v[frame + 1] << 8 | v[frame + 2];
    const long width = (long)v[frame + 3] << 8 | v[frame + 4];
    const int count = v[frame + 5];
    if (height == 0 || width == 0) return 0;
    const uint8_t *ids = v + frame + 6; /* component i: id ids[3i], sampling ids[3i + 1] */
    if (count == 1) {
        h->colorspace = 0;
    } else if (count == 3) {
        if (jfif) h->colorspace = 1;
        else if (adobe >= 0) h->colorspace = adobe == 0 ? 2 : 1;
        else h->colorspace = ids[0] == 'R' && ids[3] == 'G' && ids[6] == 'B' ? 2 : 1;
    } else if (count == 4) {
        h->colorspace = adobe == -1 || adobe == 0 ? 3 : 4;
    } else {
        return 0;
    }
    int hmax = 0, hmin = 16, vmax = 0, vmin = 16;
    for (int i = 0; i < count; ++i) {
        const int f = ids[3 * i + 1], fh = f >> 4, fv = f & 15;
        hmax = fh > hmax ? fh : hmax;
        hmin = fh < hmin ? fh : hmin;
        vmax = fv > vmax ? fv : vmax;
        vmin = fv < vmin ? fv : vmin;
    }
    if (hmin == 0 || vmin == 0) h->chroma = 1;
    else h->chroma = hmax / hmin > vmax / vmin ? hmax / hmin : vmax / vmin;
    h->height = height;
    h->width = width;
    h->orientation = orientation;
    return 1;
}

static const char *const COLORSPACE_NAMES[5] = {"Gray", "YCbCr", "RGB", "CMYK", "YCCK"};

static PyObject *py_jpeg_header(PyObject *self, PyObject *args) {
    Py_buffer data;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    JpegHeader h;
    const int ok = jpeg_header_read((const uint8_t *)data.buf, (size_t)data.len, &h);
    PyBuffer_Release(&data);
    if (!ok) Py_RETURN_NONE;
    return Py_BuildValue("llsii", h.height, h.width, COLORSPACE_NAMES[h.colorspace],
                         h.orientation, h.chroma);
}

/* --------------------------------------------------------- JPEG compressed data check */

/* jpeg_data_damage(data) -> None | (kind, at, a, b): _jpeg_check.jpeg_data_damage's walk
 * (the Python version is the reference; a test keeps them equal), with memchr over the
 * compressed data instead of a Python walk, and the GIL released for it. Kinds: 1 restart
 * marker with no interval (a: its number), 2 restart marker out of sequence (a: its
 * number, b: the one due), 3 marker that cannot sit there (a: its code), 4 segment cut
 * short, 5 segment past the end, 6 no end-of-image marker. */

static int jpeg_first_scan(const uint8_t *p, size_t n, size_t *scan, unsigned *restart) {
    size_t pos = 2;
    *restart = 0;
    while (pos + 4 <= n) {
        if (p[pos] != 0xFF) return 0;
        const uint8_t m = p[pos + 1];
        if (m == 0xFF) { pos += 1; continue; }
        if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) { pos += 2; continue; }
        const size_t len = ((size_t)p[pos + 2] << 8) | p[pos + 3];
        if (len < 2 || pos + 2 + len > n) return 0;
        if (m == 0xDD && len >= 4) *restart = ((unsigned)p[pos + 4] << 8) | p[pos + 5];
        if (m == 0xDA) { *scan = pos + 2 + len; return 1; }
        pos += 2 + len;
    }
    return 0;
}

static int between_scans(uint8_t m) {
    return m == 0xC4 || m == 0xCC || m == 0xDB || m == 0xDC || m == 0xDD || m == 0xDA ||
           m == 0xFE || (m >= 0xE0 && m <= 0xEF);
}

static int jpeg_data_walk(const uint8_t *p, size_t n, size_t i, unsigned restart, long long r[3],
                          long long *scans) {
    unsigned due = 0;
    while (n > 0 && i < n - 1) {
        const uint8_t *f = memchr(p + i, 0xFF, n - 1 - i);
        if (!f) break;
        const size_t at = (size_t)(f - p);
        const uint8_t c = p[at + 1];
        r[0] = (long long)at;
        if (c == 0x00 || c == 0xFF) { i = at + 1; continue; }
        if (c == 0x01) { i = at + 2; continue; } /* TEM: no length, allowed between scans */
        if (c >= 0xD0 && c <= 0xD7) {
            r[1] = c - 0xD0;
            if (restart == 0) return 1;
            if ((unsigned)(c - 0xD0) != due) { r[2] = due; return 2; }
            due = (due + 1) % 8;
            i = at + 2;
            continue;
        }
        if (c == 0xD9) return 0;
        if (!between_scans(c)) { r[1] = c; return 3; }
        if (at + 4 > n) return 4;
        const size_t after = at + 2 + (((size_t)p[at + 2] << 8) | p[at + 3]);
        if (after > n) return 5;
        if (c == 0xDD) restart = after >= at + 6 ? ((unsigned)p[at + 4] << 8) | p[at + 5] : 0;
        else if (c == 0xDA) {
            due = 0;
            ++*scans;
        }
        i = after;
    }
    return 6;
}

/* The whole walk of `data`: its header to the first scan, then its compressed data with
 * the GIL released. Returns jpeg_data_walk's kind (0 too when the header has no scan), its
 * scans in *scans (0 without a scan). */
static int jpeg_walk_all(const Py_buffer *data, long long r[3], long long *scans) {
    const uint8_t *p = data->buf;
    const size_t n = (size_t)data->len;
    size_t scan = 0;
    unsigned restart = 0;
    int kind = 0;
    *scans = 0;
    if (jpeg_first_scan(p, n, &scan, &restart)) {
        *scans = 1;
        Py_BEGIN_ALLOW_THREADS
        kind = jpeg_data_walk(p, n, scan, restart, r, scans);
        Py_END_ALLOW_THREADS
    }
    return kind;
}

static PyObject *py_jpeg_data_damage(PyObject *self, PyObject *args) {
    Py_buffer data;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    long long r[3] = {0, 0, 0}, scans;
    const int kind = jpeg_walk_all(&data, r, &scans);
    const long long n = (long long)data.len;
    PyBuffer_Release(&data);
    if (kind == 0) Py_RETURN_NONE;
    if (kind == 6) r[0] = n;
    if (kind != 2) r[2] = 0;            /* only kinds 1-3 name a marker, only 2 a due one */
    if (kind > 3) r[1] = 0;
    return Py_BuildValue("iLLL", kind, r[0], r[1], r[2]);
}

/* jpeg_scans(data) -> int: the scans of a JPEG up to its end of image (or the first break
 * in its marker structure), by the same walk: _formats.walk_jpeg_data's count. 0 when its
 * header has no scan. Data after the end of image (a motion photo's video) is not read. */
static PyObject *py_jpeg_scans(PyObject *self, PyObject *args) {
    Py_buffer data;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    long long r[3] = {0, 0, 0}, scans;
    jpeg_walk_all(&data, r, &scans);
    PyBuffer_Release(&data);
    return PyLong_FromLongLong(scans);
}

/* ------------------------------------------------------------------- conversions (tests) */

static PyObject *py_convert(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    int dtype;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*i", &src, &dst, &dtype)) return NULL;
    PyObject *result = NULL;
    const Py_ssize_t n = src.len / 4;
    if ((dtype != OUT_F16 && dtype != OUT_BF16) || dst.len != n * 2) {
        PyErr_SetString(PyExc_ValueError, "convert: float32 in, 2-byte out, dtype 1 or 2");
        goto done;
    }
    const float *s = src.buf;
    uint16_t *d = dst.buf;
    for (Py_ssize_t i = 0; i < n; ++i) d[i] = dtype == OUT_F16 ? f32_to_f16(s[i]) : f32_to_bf16(s[i]);
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* ------------------------------------------------------------------ whole-file reads */

/* open(path) for reading, non-blocking (a FIFO fails at once) and close-on-exec, again
 * after an EINTR: the fd, or -1 with errno set. */
static int open_nonblocking(const char *path) {
    int flags = O_RDONLY | O_NONBLOCK;
#ifdef O_CLOEXEC
    flags |= O_CLOEXEC;
#endif
    int fd;
    do {
        fd = open(path, flags);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

/* One whole-file read, the GIL released by the caller: open + fstat + read to EOF +
 * close. Opened non-blocking (a FIFO fails at once). A file that is not regular, or holds
 * more than `limit` bytes (-1: no limit), is not read (`refused`, with its mode and size);
 * one that grows past the limit while it is read is refused with `grew` and the bytes
 * read. On success `buf` holds `len` bytes (malloc'd: the caller frees it). */
typedef struct {
    char *buf;
    size_t len;
    mode_t mode;
    int err, nomem, refused, grew;
    double seconds;
} FileRead;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void read_one(const char *path, long long limit, FileRead *r) {
    memset(r, 0, sizeof *r);
    int fd = open_nonblocking(path);
    struct stat st;
    if (fd < 0) {
        r->err = errno;
    } else if (fstat(fd, &st) != 0) {
        r->err = errno;
    } else if (!S_ISREG(st.st_mode) || (limit >= 0 && st.st_size > limit)) {
        r->refused = 1;
        r->mode = st.st_mode;
        r->len = (size_t)st.st_size;
    } else {
        r->mode = st.st_mode;
        /* One byte of room past the size, so the read that finds EOF (or a file that
         * grew) needs no second buffer. */
        size_t cap = (size_t)st.st_size + 1;
        r->buf = malloc(cap);
        r->nomem = r->buf == NULL;
        while (r->buf != NULL) {
            if (r->len == cap) {
                if (limit >= 0 && (long long)r->len > limit) {
                    r->refused = r->grew = 1;
                    break;
                }
                /* Never more room than one byte past the limit: reaching it is enough. */
                size_t more = cap * 2;
                if (limit >= 0 && more > (size_t)limit + 1) more = (size_t)limit + 1;
                char *grown = realloc(r->buf, more);
                if (grown == NULL) {
                    r->nomem = 1;
                    break;
                }
                r->buf = grown;
                cap = more;
            }
            ssize_t n = read(fd, r->buf + r->len, cap - r->len);
            if (n < 0) {
                if (errno == EINTR) continue;
                r->err = errno;
                break;
            }
            if (n == 0) break;
            r->len += (size_t)n;
        }
        if (limit >= 0 && (long long)r->len > limit) r->refused = r->grew = 1;
    }
    if (fd >= 0) close(fd);
    if (r->err || r->nomem || r->refused) {
        free(r->buf);
        r->buf = NULL;
    }
}

/* One range of a file (a tar member), the GIL released by the caller: open + fstat +
 * pread of `size` bytes at `offset` (to EOF if shorter) + close; `stage` says how far it
 * got (RANGE_*), `err` the errno where it stopped, and the stamp fields a tar index
 * checks come from the fstat. */
enum { RANGE_SKIPPED = -1, RANGE_OPEN, RANGE_FSTAT, RANGE_NOT_REGULAR, RANGE_READ, RANGE_OK,
       RANGE_NOMEM };
typedef struct {
    char *buf;
    size_t len;
    int stage, err;
    mode_t mode;
    long long st_size, mtime_ns;
    unsigned long long ino; /* as Python's os.stat gives it: unsigned (QA75) */
    double seconds;
} RangeRead;

static void read_range_one(const char *path, long long offset, long long size, RangeRead *r) {
    memset(r, 0, sizeof *r);
    int fd = open_nonblocking(path);
    struct stat st;
    if (fd < 0) {
        r->stage = RANGE_OPEN;
        r->err = errno;
        return;
    }
    if (fstat(fd, &st) != 0) {
        r->stage = RANGE_FSTAT;
        r->err = errno;
    } else if (r->mode = st.st_mode, !S_ISREG(st.st_mode)) {
        r->stage = RANGE_NOT_REGULAR;
    } else {
        r->st_size = (long long)st.st_size;
        r->mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        r->ino = (unsigned long long)st.st_ino;
        r->buf = malloc(size > 0 ? (size_t)size : 1);
        r->stage = r->buf == NULL ? RANGE_NOMEM : RANGE_OK;
        while (r->buf != NULL && (long long)r->len < size) {
            ssize_t n = pread(fd, r->buf + r->len, (size_t)(size - (long long)r->len),
                              (off_t)(offset + (long long)r->len));
            if (n < 0) {
                if (errno == EINTR) continue;
                r->stage = RANGE_READ;
                r->err = errno;
                break;
            }
            if (n == 0) break; /* EOF: short, which the caller words */
            r->len += (size_t)n;
        }
    }
    close(fd);
    if (r->stage != RANGE_OK) {
        free(r->buf);
        r->buf = NULL;
    }
}

/* read_ranges(paths, offsets, sizes) -> (results, seconds)
 *
 * `read_range_one` on each (path, offset, size), all in one release of the GIL (a run of
 * tar members otherwise waits to retake it for each system call). A size < 0 skips its
 * item. Per item (data, stage, st_mode, st_size, mtime_ns, ino): data is the bytes read
 * (stage RANGE_OK; fewer than asked at EOF), the errno (open, fstat or pread failed) or
 * None; and each read's seconds. */
static PyObject *py_read_ranges(PyObject *self, PyObject *args) {
    PyObject *paths_arg, *offsets_arg, *sizes_arg;
    if (!PyArg_ParseTuple(args, "OOO:read_ranges", &paths_arg, &offsets_arg, &sizes_arg))
        return NULL;
    PyObject *paths = PySequence_Tuple(paths_arg);
    PyObject *offsets = paths ? PySequence_Tuple(offsets_arg) : NULL;
    PyObject *sizes = offsets ? PySequence_Tuple(sizes_arg) : NULL;
    PyObject **converted = NULL, *results = NULL, *seconds = NULL, *out = NULL;
    long long *offs = NULL, *lens = NULL;
    RangeRead *reads = NULL;
    Py_ssize_t n = 0;
    if (sizes == NULL) goto done;
    n = PyTuple_GET_SIZE(paths);
    if (PyTuple_GET_SIZE(offsets) != n || PyTuple_GET_SIZE(sizes) != n) {
        PyErr_SetString(PyExc_ValueError, "read_ranges: paths, offsets and sizes differ in length");
        goto done;
    }
    converted = PyMem_Calloc((size_t)(n ? n : 1), sizeof *converted);
    offs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *offs);
    lens = PyMem_Calloc((size_t)(n ? n : 1), sizeof *lens);
    reads = PyMem_Calloc((size_t)(n ? n : 1), sizeof *reads);
    if (converted == NULL || offs == NULL || lens == NULL || reads == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        offs[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(offsets, i));
        lens[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, i));
        if (PyErr_Occurred()) goto done;
        if (offs[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "read_ranges: a negative offset");
            goto done;
        }
        if (lens[i] >= 0 && !PyUnicode_FSConverter(PyTuple_GET_ITEM(paths, i), &converted[i]))
            goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (lens[i] < 0) {
            reads[i].stage = RANGE_SKIPPED;
            continue;
        }
        double began = now_s();
        read_range_one(PyBytes_AS_STRING(converted[i]), offs[i], lens[i], &reads[i]);
        reads[i].seconds = now_s() - began;
    }
    Py_END_ALLOW_THREADS
    results = PyList_New(n);
    seconds = PyList_New(n);
    if (results == NULL || seconds == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; ++i) {
        RangeRead *r = &reads[i];
        PyObject *data;
        if (r->stage == RANGE_OK) {
            data = PyBytes_FromStringAndSize(r->buf, (Py_ssize_t)r->len);
        } else if (r->stage == RANGE_OPEN || r->stage == RANGE_FSTAT || r->stage == RANGE_READ) {
            data = PyLong_FromLong(r->err);
        } else {
            data = Py_None;
            Py_INCREF(data);
        }
        if (data == NULL) goto done;
        PyObject *item = Py_BuildValue("(NiiLLK)", data, r->stage, (int)r->mode, r->st_size,
                                       r->mtime_ns, r->ino);
        if (item == NULL) goto done;
        PyList_SET_ITEM(results, i, item);
        PyObject *t = PyFloat_FromDouble(r->seconds);
        if (t == NULL) goto done;
        PyList_SET_ITEM(seconds, i, t);
    }
    out = PyTuple_Pack(2, results, seconds);
done:
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (converted != NULL) Py_XDECREF(converted[i]);
        if (reads != NULL) free(reads[i].buf);
    }
    PyMem_Free(converted);
    PyMem_Free(offs);
    PyMem_Free(lens);
    PyMem_Free(reads);
    Py_XDECREF(results);
    Py_XDECREF(seconds);
    Py_XDECREF(paths);
    Py_XDECREF(offsets);
    Py_XDECREF(sizes);
    return out;
}

/* read_regular(path, limit) -> bytes | (st_mode, size, grew)
 *
 * `read_one` with the GIL released once. Python's own file calls release and retake it
 * for each system call (six to eight per file), and every retake waits behind the threads
 * that hold it. A file that is not regular or is over the limit gives (st_mode, size,
 * grew) for the caller to word the error. System errors raise OSError with the path. */
static PyObject *py_read_regular(PyObject *self, PyObject *args) {
    PyObject *path_arg, *path_bytes = NULL;
    long long limit;
    if (!PyArg_ParseTuple(args, "OL:read_regular", &path_arg, &limit)) return NULL;
    if (!PyUnicode_FSConverter(path_arg, &path_bytes)) return NULL;
    const char *path = PyBytes_AS_STRING(path_bytes);
    FileRead r;
    Py_BEGIN_ALLOW_THREADS
    read_one(path, limit, &r);
    Py_END_ALLOW_THREADS
    Py_DECREF(path_bytes);
    PyObject *result = NULL;
    if (r.err) {
        errno = r.err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_arg);
    } else if (r.nomem) {
        PyErr_NoMemory();
    } else if (r.refused) {
        result = Py_BuildValue("(iKi)", (int)r.mode, (unsigned long long)r.len, r.grew);
    } else {
        result = PyBytes_FromStringAndSize(r.buf, (Py_ssize_t)r.len);
    }
    free(r.buf);
    return result;
}

/* read_regulars(paths, limit) -> (results, seconds)
 *
 * `read_regular` on each path of a list or tuple, all in one release of the GIL (a run of
 * small files otherwise waits to retake it once per file). Per path: bytes, (st_mode,
 * size, grew) as read_regular, the errno of a failed system call (an int), -1 when out
 * of memory, or the exception the path's conversion raised (a str with a NUL); and each
 * read's seconds. Files are read in order, each one's buffer kept until the GIL is back. */
static PyObject *py_read_regulars(PyObject *self, PyObject *args) {
    PyObject *paths_arg;
    long long limit;
    if (!PyArg_ParseTuple(args, "OL:read_regulars", &paths_arg, &limit)) return NULL;
    /* A copy: converting a path runs Python code (os.fspath), which could change a list. */
    PyObject *paths = PySequence_Tuple(paths_arg);
    if (paths == NULL) return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(paths);
    PyObject **converted = PyMem_Calloc((size_t)(n ? n : 1), sizeof *converted);
    PyObject **failed = PyMem_Calloc((size_t)(n ? n : 1), sizeof *failed);
    FileRead *reads = PyMem_Calloc((size_t)(n ? n : 1), sizeof *reads);
    PyObject *results = NULL, *seconds = NULL, *out = NULL;
    if (converted == NULL || failed == NULL || reads == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(paths, i), &converted[i])) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (value == NULL || !PyErr_GivenExceptionMatches(value, PyExc_Exception)) {
                PyErr_Restore(type, value, tb); /* a KeyboardInterrupt: raised */
                goto done;
            }
            Py_XDECREF(type);
            Py_XDECREF(tb);
            failed[i] = value;
            converted[i] = NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (converted[i] == NULL) continue;
        double began = now_s();
        read_one(PyBytes_AS_STRING(converted[i]), limit, &reads[i]);
        reads[i].seconds = now_s() - began;
    }
    Py_END_ALLOW_THREADS
    results = PyList_New(n);
    seconds = PyList_New(n);
    if (results == NULL || seconds == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; ++i) {
        FileRead *r = &reads[i];
        PyObject *item;
        if (failed[i] != NULL) {
            item = failed[i];
            failed[i] = NULL;
        } else if (r->err) {
            item = PyLong_FromLong(r->err);
        } else if (r->nomem) {
            item = PyLong_FromLong(-1);
        } else if (r->refused) {
            item = Py_BuildValue("(iKi)", (int)r->mode, (unsigned long long)r->len, r->grew);
        } else {
            item = PyBytes_FromStringAndSize(r->buf, (Py_ssize_t)r->len);
        }
        if (item == NULL) goto done;
        PyList_SET_ITEM(results, i, item);
        PyObject *t = PyFloat_FromDouble(r->seconds);
        if (t == NULL) goto done;
        PyList_SET_ITEM(seconds, i, t);
    }
    out = PyTuple_Pack(2, results, seconds);
done:
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (converted != NULL) Py_XDECREF(converted[i]);
        if (failed != NULL) Py_XDECREF(failed[i]);
        if (reads != NULL) free(reads[i].buf);
    }
    PyMem_Free(converted);
    PyMem_Free(failed);
    PyMem_Free(reads);
    Py_XDECREF(results);
    Py_XDECREF(seconds);
    Py_DECREF(paths);
    return out;
}

static PyMethodDef methods[] = {
    {"resize_into", py_resize_into, METH_VARARGS,
     "resize_into(src, height, width, channels, box, out, out_h, out_w, flip, dtype, scale, "
     "shift)\n\nCrop box -> antialiased bilinear resize -> flip -> x * scale + shift -> CHW "
     "-> dtype, into out. GIL released."},
    {"decode_resize_jpeg", py_decode_resize_jpeg, METH_VARARGS,
     "decode_resize_jpeg(data, denom, height, width, box, out, out_h, out_w, flip, dtype, "
     "scale, shift)\n\nDecode a JPEG at 1/denom scale, only the region the box needs, "
     "streaming into resize_into's transform. Raises JpegError. GIL released."},
    {"decode_resize_jpegs", py_decode_resize_jpegs, METH_O,
     "decode_resize_jpegs(calls)\n\ndecode_resize_jpeg on each argument tuple, in one "
     "release of the GIL: a list of None (decoded), the error message, or -1 (out of memory)."},
    {"train_params", py_train_params, METH_VARARGS,
     "train_params(key_low, key_high, height, width, s0, s1, log_r0, log_r1, flip_prob)\n\n"
     "TrainTransform.make_params from Philox(key=key_low | key_high << 64): (top, left, "
     "height, width, flip); top -1: centre-crop fallback; -2: draw in Python."},
    {"philox_words", py_philox_words, METH_VARARGS,
     "philox_words(key_low, key_high, n)\n\nThe first n 64-bit words of numpy's "
     "Philox(key=key_low | key_high << 64), for tests."},
    {"jpeg_header", py_jpeg_header, METH_VARARGS,
     "jpeg_header(data)\n\n(height, width, colourspace, EXIF orientation, chroma ratio) of a "
     "common JPEG, None otherwise: _formats.jpeg_header and jpeg_chroma_ratio in one walk. "
     "Holds the GIL."},
    {"jpeg_scans", py_jpeg_scans, METH_VARARGS,
     "jpeg_scans(data)\n\nThe scans of a JPEG up to its end of image: _formats.walk_jpeg_data's "
     "count, with memchr, the GIL released."},
    {"jpeg_data_damage", py_jpeg_data_damage, METH_VARARGS,
     "jpeg_data_damage(data)\n\nNone, or (kind, at, a, b): what breaks the marker structure "
     "of a JPEG's compressed data (_jpeg_check). GIL released for the walk."},
    {"read_ranges", py_read_ranges, METH_VARARGS,
     "read_ranges(paths, offsets, sizes)\n\nEach file's range (a tar member) in one release of "
     "the GIL: (results, seconds); a result is (data, stage, st_mode, st_size, mtime_ns, "
     "ino), data the bytes, an errno or None; a size < 0 skips its item."},
    {"read_regulars", py_read_regulars, METH_VARARGS,
     "read_regulars(paths, limit)\n\nread_regular on each path in one release of the GIL: "
     "(results, seconds); a result is bytes, (st_mode, size, grew), an errno, -1 (out of "
     "memory) or the exception converting its path raised."},
    {"read_regular", py_read_regular, METH_VARARGS,
     "read_regular(path, limit)\n\nA regular file's bytes, read with the GIL released once; "
     "(st_mode, size, grew) instead for a file that is not regular or holds more than limit "
     "bytes (-1: no limit). Raises OSError."},
    {"convert", py_convert, METH_VARARGS,
     "convert(float32_src, dst, dtype)\n\nThe float16 (1) / bfloat16 (2) rounding the stores "
     "use, exposed for tests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "gpu_loader's CPU fast path: streaming JPEG region decode and fused resize (C, GIL free).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    JpegError = PyErr_NewException("gpu_loader.ops._native.JpegError", PyExc_ValueError, NULL);
    if (!JpegError || PyModule_AddObject(m, "JpegError", JpegError) < 0) {
        Py_XDECREF(JpegError);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(JpegError);
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    if (PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    if (PyModule_AddIntConstant(m, "MAX_JPEG_SCANS", MAX_JPEG_SCANS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
