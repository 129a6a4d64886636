/* The size rules of colibri's quantized formats (spec/model.md §14), written once for both
 * libraries: the CPU library's coli_q_sizes and the CUDA library's upload checks
 * (accelerated/cuda/ccu_formats.h) call coli_q_size_rule, so the two can never accept
 * different payloads. C/CUDA common subset: under nvcc the functions are host and device. */
#ifndef COLI_Q_SIZES_H
#define COLI_Q_SIZES_H

#include <stddef.h>
#include <stdint.h>

#include "quant/coli_quant.h"

#ifdef __CUDACC__
#define COLI_Q_HD static __host__ __device__ inline
#else
#define COLI_Q_HD static inline
#endif

#define COLI_Q_E8_BLOCK 256
#define COLI_Q_E8_BLOCK_BYTES 98
#define COLI_Q_INT3_GROUP 64
#define COLI_Q_INT3_GROUP_BYTES 24
#define COLI_Q_FP8_BLOCK 128

COLI_Q_HD int64_t coli_q_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The int4-grouped group sizes colibri accepts. */
COLI_Q_HD int coli_q_group_size_ok(int gs) {
    return gs == 16 || gs == 32 || gs == 48 || gs == 64 || gs == 96 || gs == 128 || gs == 192 ||
           gs == 256;
}

/* Payload bytes and .qs count of an [O, I] tensor of format fmt (group size gs for
 * int4-grouped only); a COLI_Q_* code. */
COLI_Q_HD int coli_q_size_rule(int fmt, int gs, int64_t O, int64_t I, int64_t *bytes,
                               int64_t *scales) {
    if (bytes == NULL || scales == NULL) return COLI_Q_ENULL;
    if (O <= 0 || I <= 0 || O > COLI_Q_MAX_DIM || I > COLI_Q_MAX_DIM) return COLI_Q_ESHAPE;
    switch (fmt) {
    case COLI_Q_INT8_ROW: *bytes = O * I; *scales = O; return COLI_Q_OK;
    case COLI_Q_INT4_ROW: *bytes = O * coli_q_ceil_div(I, 2); *scales = O; return COLI_Q_OK;
    case COLI_Q_INT2_ROW: *bytes = O * coli_q_ceil_div(I, 4); *scales = O; return COLI_Q_OK;
    case COLI_Q_INT4_GROUPED:
        if (!coli_q_group_size_ok(gs)) return COLI_Q_EGROUP;
        *bytes = O * coli_q_ceil_div(I, 2);
        *scales = O * coli_q_ceil_div(I, gs);
        return COLI_Q_OK;
    case COLI_Q_INT3_G64:
        *bytes = O * coli_q_ceil_div(I, COLI_Q_INT3_GROUP) * COLI_Q_INT3_GROUP_BYTES;
        *scales = O * coli_q_ceil_div(I, COLI_Q_INT3_GROUP);
        return COLI_Q_OK;
    case COLI_Q_E8_IQ3:
        if (I % COLI_Q_E8_BLOCK != 0) return COLI_Q_ESHAPE;
        *bytes = O * (I / COLI_Q_E8_BLOCK) * COLI_Q_E8_BLOCK_BYTES;
        *scales = 1;
        return COLI_Q_OK;
    case COLI_Q_FP8_E4M3_B128:
        *bytes = O * I;
        *scales = coli_q_ceil_div(O, COLI_Q_FP8_BLOCK) * coli_q_ceil_div(I, COLI_Q_FP8_BLOCK);
        return COLI_Q_OK;
    default: return COLI_Q_EFORMAT;
    }
}

#endif
