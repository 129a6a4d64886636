/* Weights in device memory: validated on the host by the CPU library's rules (ccu_formats.h:
 * sizes as coli_q_sizes, content as coli_q_check) before any byte is copied. */
#include <stdlib.h>

#include "ccu_internal.cuh"

static int upload(const void *src, int64_t bytes, void **dst) {
    int rc = ccu_alloc((size_t)bytes, dst);
    if (rc != CCU_OK) return rc;
    rc = ccu_to_device(*dst, src, (size_t)bytes);
    if (rc != CCU_OK) {
        cudaFree(*dst);
        *dst = NULL;
    }
    return rc;
}

int ccu_upload_float(const void *w_host, int dtype, int64_t rows, int64_t cols,
                     ccu_weight **out) {
    if (out == NULL) return ccu_fail(CCU_EINVAL, "ccu_upload_float: out is NULL");
    *out = NULL;
    if (dtype != CCU_F32 && dtype != CCU_BF16 && dtype != CCU_F16)
        return ccu_fail(CCU_EDTYPE, "ccu_upload_float: dtype is not f32, bf16 or f16");
    if (w_host == NULL || rows <= 0 || cols <= 0 || rows > COLI_Q_MAX_DIM || cols > COLI_Q_MAX_DIM)
        return ccu_fail(CCU_EINVAL, "ccu_upload_float: NULL weight or bad shape");
    ccu_weight *w = (ccu_weight *)calloc(1, sizeof *w);
    if (w == NULL) return ccu_fail(CCU_ENOMEM, "ccu_upload_float: out of host memory");
    w->dtype = dtype;
    w->rows = rows;
    w->cols = cols;
    w->data_len = rows * cols * (dtype == CCU_F32 ? 4 : 2);
    int rc = upload(w_host, w->data_len, &w->data);
    if (rc != CCU_OK) {
        free(w);
        return rc;
    }
    *out = w;
    return CCU_OK;
}

int ccu_upload_quant(int fmt, int group_size, const uint8_t *packed_host, int64_t packed_len,
                     const float *scales_host, int64_t n_scales, int64_t out_features,
                     int64_t in_features, ccu_weight **out) {
    if (out == NULL) return ccu_fail(CCU_EINVAL, "ccu_upload_quant: out is NULL");
    *out = NULL;
    ccu_qview host;
    int rc = ccu_qview_init(&host, fmt, group_size, packed_host, packed_len, scales_host,
                            n_scales, out_features, in_features);
    if (rc == COLI_Q_OK) rc = ccu_q_check_content(&host, n_scales);
    if (rc != COLI_Q_OK) return ccu_fail(CCU_EQUANT_BASE + rc, "ccu_upload_quant: refused");
    ccu_weight *w = (ccu_weight *)calloc(1, sizeof *w);
    if (w == NULL) return ccu_fail(CCU_ENOMEM, "ccu_upload_quant: out of host memory");
    w->quantized = 1;
    w->group_size = group_size;
    w->rows = out_features;
    w->cols = in_features;
    w->data_len = packed_len;
    w->n_scales = n_scales;
    rc = upload(packed_host, packed_len, &w->data);
    if (rc == CCU_OK) rc = upload(scales_host, n_scales * 4, (void **)&w->scales);
    if (rc != CCU_OK) {
        cudaFree(w->data);
        free(w);
        return rc;
    }
    w->view = host;
    w->view.packed = (const uint8_t *)w->data;
    w->view.scales = w->scales;
    *out = w;
    return CCU_OK;
}

int ccu_weight_free(ccu_weight *w) {
    if (w == NULL) return CCU_OK;
    cudaError_t a = w->data ? cudaFree(w->data) : cudaSuccess;
    cudaError_t b = w->scales ? cudaFree(w->scales) : cudaSuccess;
    free(w);
    CCU_TRY(a, "cudaFree weight");
    CCU_TRY(b, "cudaFree scales");
    return CCU_OK;
}

int64_t ccu_weight_bytes(const ccu_weight *w) {
    return w == NULL ? 0 : w->data_len + 4 * w->n_scales;
}

int ccu_weight_shape(const ccu_weight *w, int64_t *rows, int64_t *cols) {
    if (w == NULL || rows == NULL || cols == NULL) return ccu_fail(CCU_EINVAL, "ccu_weight_shape: NULL");
    *rows = w->rows;
    *cols = w->cols;
    return CCU_OK;
}
