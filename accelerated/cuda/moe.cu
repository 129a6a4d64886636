/* A routed expert's SwiGLU on the device (spec §7.2): gate and up products, silu(g) * u,
 * the down product; e8 experts get their rows rotated once for gate and up and h once for
 * down, as csrc/moe.c does. The grouping of a step's rows by expert, and the weighted sum,
 * are the caller's (ccu_expert_sum). */
#include "ccu_internal.cuh"

static int is_e8(const ccu_weight *w) { return w->quantized && w->view.fmt == COLI_Q_E8_IQ3; }

static int chain_ok(const ccu_weight *gate, const ccu_weight *up, const ccu_weight *down) {
    return gate && up && down && gate->rows == up->rows && gate->cols == up->cols &&
           down->cols == gate->rows && down->rows == gate->cols && is_e8(gate) == is_e8(up);
}

/* Floats of work space for n rows: the gathered (rotated) rows, gate, up and h. */
static size_t work_floats(const ccu_weight *gate, int64_t n) {
    return (size_t)(n * gate->cols + 3 * n * gate->rows);
}

static int expert_mlp_in(const ccu_weight *gate, const ccu_weight *up, const ccu_weight *down,
                         const float *x_dev, int64_t n, float *out_dev, int flags, float *work) {
    const int64_t d = gate->cols, mid = gate->rows;
    float *xs = work, *g = xs + n * d, *u = g + n * mid, *h = u + n * mid;
    int rc = CCU_OK, in_flags = flags, down_flags = flags;
    const float *x = x_dev;
    if (is_e8(gate)) {
        rc = ccu_fail_cuda(cudaMemcpy(xs, x_dev, (size_t)(n * d) * 4, cudaMemcpyDeviceToDevice),
                           "cudaMemcpy expert rows");
        if (rc == CCU_OK) rc = ccu_rotate(xs, n, d);
        x = xs;
        in_flags |= CCU_X_ROTATED;
    }
    if (rc == CCU_OK) rc = ccu_matmul(gate, x, n, d, g, mid, in_flags);
    if (rc == CCU_OK) rc = ccu_matmul(up, x, n, d, u, mid, in_flags);
    if (rc == CCU_OK) rc = ccu_silu_mul(g, u, n * mid, h);
    if (rc == CCU_OK && is_e8(down)) {
        rc = ccu_rotate(h, n, mid);
        down_flags |= CCU_X_ROTATED;
    }
    if (rc == CCU_OK) rc = ccu_matmul(down, h, n, mid, out_dev, d, down_flags);
    return rc;
}

int ccu_expert_mlp(const ccu_weight *gate, const ccu_weight *up, const ccu_weight *down,
                   const float *x_dev, int64_t n, float *out_dev, int flags) {
    if (!chain_ok(gate, up, down) || n < 0 || (n && (!x_dev || !out_dev)) ||
        (flags & ~CCU_TWO_ROUNDINGS))
        return ccu_fail(CCU_EINVAL, "ccu_expert_mlp: shapes do not chain or bad arguments");
    if (n == 0) return CCU_OK;
    float *work = NULL;
    int rc = ccu_alloc(work_floats(gate, n) * sizeof(float), (void **)&work);
    if (rc != CCU_OK) return rc;
    rc = expert_mlp_in(gate, up, down, x_dev, n, out_dev, flags, work);
    cudaError_t freed = cudaFree(work); /* waits for the kernels */
    if (rc == CCU_OK) rc = ccu_fail_cuda(freed, "cudaFree expert scratch");
    return rc;
}

int ccu_expert_mlp_host(const ccu_weight *gate, const ccu_weight *up, const ccu_weight *down,
                        const float *x_host, int64_t n, float *out_host, int flags) {
    if (!chain_ok(gate, up, down) || n < 0 || (n && (!x_host || !out_host)) ||
        (flags & ~CCU_TWO_ROUNDINGS))
        return ccu_fail(CCU_EINVAL, "ccu_expert_mlp_host: shapes do not chain or bad arguments");
    if (n == 0) return CCU_OK;
    size_t bytes = (size_t)(n * gate->cols) * 4;
    void *buf = NULL;
    ccu_host_lock();
    /* One scratch for the rows in, the rows out and the work between: no allocation per
     * expert once it has grown. */
    int rc = ccu_host_scratch(2 * bytes + work_floats(gate, n) * sizeof(float), &buf);
    float *x = (float *)buf, *y = (float *)((char *)buf + bytes);
    float *work = (float *)((char *)buf + 2 * bytes);
    if (rc == CCU_OK) rc = ccu_to_device(x, x_host, bytes);
    if (rc == CCU_OK) rc = expert_mlp_in(gate, up, down, x, n, y, flags, work);
    if (rc == CCU_OK) rc = ccu_to_host(out_host, y, bytes);
    ccu_host_unlock();
    return rc;
}
