/* Products y = x @ W.T over float or quantized weights in device memory, and fmt6's
 * activation rotation. One warp computes output o for a tile of up to CCU_ROW_TILE rows:
 * that item is ccu_float_item / ccu_quant_item of ccu_orders.h (lane l runs the CPU build's
 * lane l, per row, and the warp reduces each row with the CPU trees' pairing). Warps walk the
 * (tile, o) items grid-stride, so the grid and block sizes decide only which warp computes
 * an item, never its value; a row's result is the same alone or in any batch (sameness kind
 * (c)), and equal to the CPU build's bits: the host runs the same items lane by lane against
 * the CPU builds (tests/accelerated/test_cuda_formats.py), test_cuda_ptx.py reads what nvcc
 * made of them, and the GPU tests check the device. */
#include <mutex>

#include "ccu_internal.cuh"
#include "quant/coli_quant_tables.h"

/* The iq3xxs grid (doubled magnitudes) for the e8 decoder, copied in by ccu_products_init. */
static __constant__ uint8_t c_grid[256][4];

int ccu_products_init(void) {
    CCU_TRY(cudaMemcpyToSymbol(c_grid, coli_q_iq3_grid, sizeof coli_q_iq3_grid),
            "cudaMemcpyToSymbol grid");
    return CCU_OK;
}

/* Specialised on the dtype / format and on fused (folded away in the lane loops); every
 * instantiation runs the same ccu_orders.h warp item, (row tile, output o), so a row's bits
 * do not depend on the tile it shares. */
template <int DTYPE, int FUSED>
static __global__ void float_product(const void *w, int64_t rows, int64_t k, const float *x,
                                     int64_t m, int64_t ldx, float *y, int64_t ldy) {
    const int lane = (int)(threadIdx.x & 31);
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const int64_t tiles = (m + CCU_ROW_TILE - 1) / CCU_ROW_TILE;
    for (int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
         item < tiles * rows; item += warps) {
        int64_t r0 = (item / rows) * CCU_ROW_TILE, o = item % rows;
        int nr = (int)(m - r0 < CCU_ROW_TILE ? m - r0 : CCU_ROW_TILE);
        ccu_float_item(w, DTYPE, o, k, x + r0 * ldx, ldx, nr, lane, FUSED, y + r0 * ldy, ldy);
    }
}

template <int FMT, int FUSED>
static __global__ void quant_product(ccu_qview view, const float *x, int64_t m, int64_t ldx,
                                     float *y, int64_t ldy) {
    const int lane = (int)(threadIdx.x & 31);
    const int64_t rows = view.out_features;
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const int64_t tiles = (m + CCU_ROW_TILE - 1) / CCU_ROW_TILE;
    for (int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
         item < tiles * rows; item += warps) {
        int64_t r0 = (item / rows) * CCU_ROW_TILE, o = item % rows;
        int nr = (int)(m - r0 < CCU_ROW_TILE ? m - r0 : CCU_ROW_TILE);
        ccu_quant_item(FMT, &view, o, x + r0 * ldx, ldx, nr, lane, FUSED, c_grid, y + r0 * ldy,
                       ldy);
    }
}

template <int FUSED>
static void launch_float(const ccu_weight *w, unsigned blocks, const float *x, int64_t m,
                         int64_t ldx, float *y, int64_t ldy) {
    switch (w->dtype) {
    case CCU_BF16:
        float_product<CCU_BF16, FUSED><<<blocks, CCU_BLOCK>>>(w->data, w->rows, w->cols, x, m, ldx, y, ldy);
        break;
    case CCU_F16:
        float_product<CCU_F16, FUSED><<<blocks, CCU_BLOCK>>>(w->data, w->rows, w->cols, x, m, ldx, y, ldy);
        break;
    default:
        float_product<CCU_F32, FUSED><<<blocks, CCU_BLOCK>>>(w->data, w->rows, w->cols, x, m, ldx, y, ldy);
    }
}

#define CCU_QUANT_CASE(F)                                                                    \
    case F: quant_product<F, FUSED><<<blocks, CCU_BLOCK>>>(w->view, x, m, ldx, y, ldy); break;

template <int FUSED>
static void launch_quant(const ccu_weight *w, unsigned blocks, const float *x, int64_t m,
                         int64_t ldx, float *y, int64_t ldy) {
    switch (w->view.fmt) {
        CCU_QUANT_CASE(COLI_Q_INT8_ROW)
        CCU_QUANT_CASE(COLI_Q_INT4_ROW)
        CCU_QUANT_CASE(COLI_Q_INT2_ROW)
        CCU_QUANT_CASE(COLI_Q_INT4_GROUPED)
        CCU_QUANT_CASE(COLI_Q_INT3_G64)
        CCU_QUANT_CASE(COLI_Q_E8_IQ3)
        CCU_QUANT_CASE(COLI_Q_FP8_E4M3_B128)
    }
}

/* One block per row: each power-of-two segment gets its signs (one thread walks the
 * xorshift stream, which is sequential), then every span's independent butterflies, then
 * the 1/sqrt(n) multiply -- csrc/quant/q_rotate.c's operations on the same pairs. */
static __global__ void rotate_rows(float *x, int64_t cols) {
    float *row = x + (int64_t)blockIdx.x * cols;
    for (int64_t off = 0; off < cols;) {
        int64_t n = ccu_rot_block(cols - off);
        float *b = row + off;
        if (threadIdx.x == 0) {
            uint64_t s = 417u + (uint64_t)n;
            for (int64_t i = 0; i < (n + 7) / 8; i++) {
                unsigned byte = ccu_rot_sign_byte(&s);
                for (int k = 0; k < 8 && 8 * i + k < n; k++)
                    if ((byte >> k) & 1) b[8 * i + k] = -b[8 * i + k];
            }
        }
        __syncthreads();
        for (int64_t span = 1; span < n; span *= 2) {
            for (int64_t p = threadIdx.x; p < n / 2; p += blockDim.x)
                ccu_butterfly(b, (p / span) * 2 * span + p % span, span);
            __syncthreads();
        }
        float inv = __fdiv_rn(1.0f, __fsqrt_rn((float)n));
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) b[j] = __fmul_rn(b[j], inv);
        __syncthreads();
        off += n;
    }
}

int ccu_rotate(float *x_dev, int64_t m, int64_t cols) {
    if (m < 0 || cols <= 0 || (m > 0 && x_dev == NULL) || m > 65535)
        return ccu_fail(CCU_EINVAL, "ccu_rotate: bad rows, width or pointer");
    if (m == 0) return CCU_OK;
    rotate_rows<<<(unsigned)m, CCU_BLOCK>>>(x_dev, cols);
    CCU_LAUNCHED("rotate_rows");
    return CCU_OK;
}

int ccu_matmul(const ccu_weight *w, const float *x_dev, int64_t m, int64_t ldx, float *y_dev,
               int64_t ldy, int flags) {
    if (w == NULL || m < 0 || (flags & ~(CCU_X_ROTATED | CCU_TWO_ROUNDINGS)))
        return ccu_fail(CCU_EINVAL, "ccu_matmul: NULL weight, negative rows or unknown flags");
    if (m == 0) return CCU_OK;
    if (x_dev == NULL || y_dev == NULL || ldx < w->cols || ldy < w->rows)
        return ccu_fail(CCU_EINVAL, "ccu_matmul: NULL rows or strides shorter than a row");
    int bound = ccu_bind_thread();
    if (bound != CCU_OK) return bound;
    int fused = !(flags & CCU_TWO_ROUNDINGS);
    unsigned blocks = ccu_blocks((m + CCU_ROW_TILE - 1) / CCU_ROW_TILE * w->rows, CCU_BLOCK / 32);
    if (!w->quantized) {
        if (fused)
            launch_float<1>(w, blocks, x_dev, m, ldx, y_dev, ldy);
        else
            launch_float<0>(w, blocks, x_dev, m, ldx, y_dev, ldy);
        CCU_LAUNCHED("float_product");
        return CCU_OK;
    }
    const float *x = x_dev;
    float *rotated = NULL;
    if (w->view.fmt == COLI_Q_E8_IQ3 && !(flags & CCU_X_ROTATED)) {
        int rc = ccu_alloc((size_t)(m * w->cols) * sizeof(float), (void **)&rotated);
        if (rc != CCU_OK) return rc;
        CCU_TRY(cudaMemcpy2D(rotated, (size_t)w->cols * 4, x_dev, (size_t)ldx * 4,
                             (size_t)w->cols * 4, (size_t)m, cudaMemcpyDeviceToDevice),
                "cudaMemcpy2D rotate");
        rc = ccu_rotate(rotated, m, w->cols);
        if (rc != CCU_OK) {
            cudaFree(rotated);
            return rc;
        }
        x = rotated;
        ldx = w->cols;
    }
    if (fused)
        launch_quant<1>(w, blocks, x, m, ldx, y_dev, ldy);
    else
        launch_quant<0>(w, blocks, x, m, ldx, y_dev, ldy);
    cudaError_t launched = cudaGetLastError();
    if (rotated) cudaFree(rotated); /* cudaFree waits for the kernel */
    CCU_TRY(launched, "quant_product");
    return CCU_OK;
}

/* A process-wide device scratch for the host-array entry points, grown as needed, used
 * under host_lock (ctypes releases the GIL, so two Python threads may call at once). */
static void *scratch = NULL;
static size_t scratch_bytes = 0;
static std::mutex host_lock;

void ccu_host_lock(void) { host_lock.lock(); }
void ccu_host_unlock(void) { host_lock.unlock(); }

int ccu_host_scratch(size_t bytes, void **out) {
    if (bytes > scratch_bytes) {
        if (scratch) cudaFree(scratch);
        scratch = NULL;
        scratch_bytes = 0;
        int rc = ccu_alloc(bytes, &scratch);
        if (rc != CCU_OK) return rc;
        scratch_bytes = bytes;
    }
    *out = scratch;
    return CCU_OK;
}

int ccu_matmul_host(const ccu_weight *w, const float *x_host, int64_t m, float *y_host,
                    int flags) {
    if (w == NULL || m < 0) return ccu_fail(CCU_EINVAL, "ccu_matmul_host: NULL weight or m < 0");
    if (m == 0) return CCU_OK;
    if (x_host == NULL || y_host == NULL) return ccu_fail(CCU_EINVAL, "ccu_matmul_host: NULL");
    size_t xb = (size_t)(m * w->cols) * 4, yb = (size_t)(m * w->rows) * 4;
    void *buf = NULL;
    ccu_host_lock();
    int rc = ccu_host_scratch(xb + yb, &buf);
    float *x = (float *)buf, *y = (float *)((char *)buf + xb);
    if (rc == CCU_OK) rc = ccu_to_device(x, x_host, xb);
    /* e8 rotates x in the scratch (x is a copy already), so ccu_matmul allocates nothing. */
    if (rc == CCU_OK && w->quantized && w->view.fmt == COLI_Q_E8_IQ3 && !(flags & CCU_X_ROTATED)) {
        rc = ccu_rotate(x, m, w->cols);
        flags |= CCU_X_ROTATED;
    }
    if (rc == CCU_OK) rc = ccu_matmul(w, x, m, w->cols, y, w->rows, flags);
    if (rc == CCU_OK) rc = ccu_to_host(y_host, y, yb);
    ccu_host_unlock();
    return rc;
}

/* Several weights of one width over the same host rows: x crosses to the device once (and is
 * rotated once if any weight is e8); each product as ccu_matmul computes it. */
int ccu_matmul_many_host(int n, const ccu_weight *const *ws, const float *x_host, int64_t m,
                         float *const *ys_host, int flags) {
    if (n <= 0 || ws == NULL || ys_host == NULL || m < 0 || (m && x_host == NULL) ||
        (flags & ~CCU_TWO_ROUNDINGS))
        return ccu_fail(CCU_EINVAL, "ccu_matmul_many_host: bad count, pointers or flags");
    int64_t cols = ws[0] ? ws[0]->cols : 0, out_floats = 0;
    int any_e8 = 0;
    for (int i = 0; i < n; i++) {
        if (ws[i] == NULL || ws[i]->cols != cols || ys_host[i] == NULL)
            return ccu_fail(CCU_EINVAL, "ccu_matmul_many_host: weights of different widths");
        out_floats += ws[i]->rows;
        any_e8 |= ws[i]->quantized && ws[i]->view.fmt == COLI_Q_E8_IQ3;
    }
    if (m == 0) return CCU_OK;
    size_t xb = (size_t)(m * cols) * 4, yb = (size_t)(m * out_floats) * 4;
    void *buf = NULL;
    ccu_host_lock();
    int rc = ccu_host_scratch(2 * xb + yb, &buf);
    float *x = (float *)buf, *xr = (float *)((char *)buf + xb);
    float *y = (float *)((char *)buf + 2 * xb);
    if (rc == CCU_OK) rc = ccu_to_device(x, x_host, xb);
    if (rc == CCU_OK && any_e8) {
        rc = ccu_fail_cuda(cudaMemcpy(xr, x, xb, cudaMemcpyDeviceToDevice), "cudaMemcpy rotate");
        if (rc == CCU_OK) rc = ccu_rotate(xr, m, cols);
    }
    float *yi = y;
    for (int i = 0; rc == CCU_OK && i < n; i++) {
        int e8 = ws[i]->quantized && ws[i]->view.fmt == COLI_Q_E8_IQ3;
        rc = ccu_matmul(ws[i], e8 ? xr : x, m, cols, yi, ws[i]->rows,
                        flags | (e8 ? CCU_X_ROTATED : 0));
        if (rc == CCU_OK) rc = ccu_to_host(ys_host[i], yi, (size_t)(m * ws[i]->rows) * 4);
        yi += m * ws[i]->rows;
    }
    ccu_host_unlock();
    return rc;
}
