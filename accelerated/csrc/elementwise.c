/* Norms (statistics in float64, spec §3.1-3.2), interleaved RoPE (spec §4), SwiGLU's gate. */
#include <math.h>
#include <stdlib.h>

#include "colibri.h"

int col_rms_norm(const float *x, size_t m, size_t d, const float *w, double eps, float *out) {
    if (x == NULL || w == NULL || out == NULL || d == 0) return COL_EINVAL;
    for (size_t r = 0; r < m; r++) {
        const float *xr = x + r * d;
        double sum = 0.0;
        for (size_t i = 0; i < d; i++) sum += (double)xr[i] * (double)xr[i];
        float scale = (float)(1.0 / sqrt(sum / (double)d + eps));
        for (size_t i = 0; i < d; i++) out[r * d + i] = (xr[i] * scale) * w[i];
    }
    return COL_OK;
}

int col_layer_norm(const float *x, size_t m, size_t d, const float *w, const float *b,
                   double eps, float *out) {
    if (x == NULL || w == NULL || b == NULL || out == NULL || d == 0) return COL_EINVAL;
    for (size_t r = 0; r < m; r++) {
        const float *xr = x + r * d;
        double mean = 0.0, var = 0.0;
        for (size_t i = 0; i < d; i++) mean += (double)xr[i];
        mean /= (double)d;
        for (size_t i = 0; i < d; i++) {
            double c = (double)xr[i] - mean;
            var += c * c;
        }
        var /= (double)d;
        double inv = sqrt(var + eps);
        for (size_t i = 0; i < d; i++) {
            float normed = (float)(((double)xr[i] - mean) / inv);
            out[r * d + i] = normed * w[i] + b[i];
        }
    }
    return COL_OK;
}

int col_rope(float *x, size_t m, size_t heads, size_t row_stride, size_t head_stride, size_t d,
             const float *cos, const float *sin, int interleaved) {
    if (x == NULL || cos == NULL || sin == NULL || d == 0 || d % 2 != 0 || d > 4096)
        return COL_EINVAL;
    size_t half = d / 2;
    float tmp[4096];
    for (size_t r = 0; r < m; r++) {
        const float *c = cos + r * half, *s = sin + r * half;
        for (size_t h = 0; h < heads; h++) {
            float *v = x + r * row_stride + h * head_stride;
            for (size_t j = 0; j < half; j++) {
                float a = interleaved ? v[2 * j] : v[j];
                float b = interleaved ? v[2 * j + 1] : v[half + j];
                tmp[j] = a * c[j] - b * s[j];
                tmp[half + j] = b * c[j] + a * s[j];
            }
            for (size_t j = 0; j < d; j++) v[j] = tmp[j];
        }
    }
    return COL_OK;
}

int col_silu_mul(const float *g, const float *u, size_t n, float *out) {
    if (g == NULL || u == NULL || out == NULL) return COL_EINVAL;
    for (size_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + expf(-g[i]));
        out[i] = (g[i] * sig) * u[i];
    }
    return COL_OK;
}
