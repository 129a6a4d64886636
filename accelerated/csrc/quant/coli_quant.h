/* Fused dequantize-and-dot for colibri's quantized expert formats (spec/model.md §14).
 *
 *   y[r, o] = sum_i W[o, i] * x[r, i]      r < n_rows, o0 <= o < o1
 *
 * W stays in the bytes and .qs scales a container stores; a kernel decodes one chunk of a row
 * (at most 256 columns, never crossing a scale group) onto the stack and dots it with every
 * activation row of the batch. No dequantized copy of the matrix ever exists.
 *
 * Summation order (fixed in the source, the same for every batch size, output range and
 * thread split, so a row's result is byte-identical alone or batched):
 *   - every scale group g of row o (the whole row for the *-row formats, gs columns for
 *     int4-grouped, 64 for int3-g64, 128 for fp8, one 32-weight sub-block for e8) is summed
 *     into 32 lane partials: lane l takes the columns i = l (mod 32) of the group, ascending,
 *     p[l] += q[i] * x[i], with q the unscaled decoded value;
 *   - after each group, t[l] += s_g * p[l] for all 32 lanes (s_g that group's scale) and p
 *     restarts at 0;
 *   - u[l] = (t[l] + t[l+8]) + (t[l+16] + t[l+24]) for l < 8, then
 *     y = ((u0 + u4) + (u2 + u6)) + ((u1 + u5) + (u3 + u7)).
 * Whether a chunk's weights pass through a stack buffer or stay in registers (the avx2
 * build's fused int8/int4/fp8 path, taken for small batches) changes no operation.
 * The avx2 build contracts each multiply-add into one FMA, the generic build rounds twice:
 * the two variants agree within kind-(b) tolerance, each is deterministic (kind c).
 *
 * e8-iq3-lattice stores W·Q; the kernel dots the decoded weights with Q^T x = rotate(x)
 * (colibri's way, equal up to rounding to the reference's unrotate-then-dot). Pass
 * COLI_Q_X_ROTATED when x is already rotated (coli_q_rotate), e.g. when a thread pool splits
 * one product by output ranges and should rotate once; otherwise the kernel rotates each row
 * into a scratch buffer itself.
 *
 * Every function validates its sizes and returns a COLI_Q_E* code; nothing is read or written
 * before the sizes are known to fit.
 */
#ifndef COLI_QUANT_H
#define COLI_QUANT_H

#include <stdint.h>

/* Format ordinals: colibri's public numbering (reference/quant/formats.py). */
enum {
    COLI_Q_INT8_ROW = 1,
    COLI_Q_INT4_ROW = 2,
    COLI_Q_INT2_ROW = 3,
    COLI_Q_INT4_GROUPED = 4,
    COLI_Q_INT3_G64 = 5,
    COLI_Q_E8_IQ3 = 6,
    COLI_Q_FP8_E4M3_B128 = 8
};

/* Return codes. */
enum {
    COLI_Q_OK = 0,
    COLI_Q_EFORMAT = 1,    /* unknown format ordinal */
    COLI_Q_ESHAPE = 2,     /* non-positive or too large dimensions; e8 width not a multiple of 256 */
    COLI_Q_EPAYLOAD = 3,   /* packed byte count does not fit [out, in] in this format */
    COLI_Q_ESCALES = 4,    /* .qs count does not fit */
    COLI_Q_EGROUP = 5,     /* int4-grouped group size not one of 16 32 48 64 96 128 192 256 */
    COLI_Q_ERANGE = 6,     /* output range not within [0, out_features] */
    COLI_Q_ESTRIDE = 7,    /* a row stride shorter than its row, or a negative row count */
    COLI_Q_ENULL = 8,      /* a required pointer is NULL */
    COLI_Q_ENONFINITE = 9, /* a scale (or e8 super-scale) is not finite */
    COLI_Q_ENAN = 10,      /* an fp8 payload byte is an e4m3 NaN (0x7f / 0xff) */
    COLI_Q_ETAG = 11,      /* an e8 .qs is not the single tag 6.0 */
    COLI_Q_ENOMEM = 12     /* the e8 scratch buffer could not be allocated */
};

/* flags of coli_q_matmul */
#define COLI_Q_X_ROTATED 1

/* Largest accepted dimension: keeps every byte offset far inside int64. */
#define COLI_Q_MAX_DIM ((int64_t)1 << 31)

/* Expected payload bytes and .qs float count of an [out, in] tensor; group_size is used by
 * int4-grouped only. Returns a code; on success writes both counts. */
int coli_q_sizes(int fmt, int group_size, int64_t out_features, int64_t in_features,
                 int64_t *payload_bytes, int64_t *n_scales);

/* Size checks plus a scan of the content a kernel trusts: every scale finite, no fp8 NaN
 * byte, every e8 super-scale finite and the e8 tag. O(payload); call once per tensor. */
int coli_q_check(int fmt, int group_size, const uint8_t *packed, int64_t packed_len,
                 const float *scales, int64_t n_scales, int64_t out_features,
                 int64_t in_features);

/* y[r * y_stride + o] for r < n_rows and o0 <= o < o1 (other outputs untouched). Sizes are
 * checked (O(1)); content is not (see coli_q_check). */
int coli_q_matmul(int fmt, int group_size, const uint8_t *packed, int64_t packed_len,
                  const float *scales, int64_t n_scales, int64_t out_features,
                  int64_t in_features, const float *x, int64_t n_rows, int64_t x_stride,
                  float *y, int64_t y_stride, int64_t o0, int64_t o1, int flags);

/* The fmt6 activation rotation (spec §14 "Rotation"): bit-identical to the reference's
 * rotate_activations. out may equal x (in place). */
int coli_q_rotate(const float *x, int64_t n_rows, int64_t x_stride, int64_t cols, float *out,
                  int64_t out_stride);

/* Copies the iq3xxs grid (1024 bytes) and the e4m3 table (256 floats) the kernels use. */
void coli_q_tables(uint8_t grid_out[1024], float e4m3_out[256]);

/* A static description of a return code. */
const char *coli_q_strerror(int code);

#endif
