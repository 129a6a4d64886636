/* A routed expert's SwiGLU on the device (spec §7.2): gate and up products, silu(g) * u,
 * the down product; e8 experts get their rows rotated once for gate and up and h once for
 * down, as csrc/moe.c does. The grouping of a step's rows by expert, and the weighted sum,
 * are the caller's (ccu_expert_sum). */
#include "ccu_internal.cuh"

int ccu_host_scratch(size_t bytes, void **out);

static int is_e8(const ccu_weight *w) { return w->quantized && w->view.fmt == CCU_Q_E8_IQ3; }

int ccu_expert_mlp(const ccu_weight *gate, const ccu_weight *up, const ccu_weight *down,
                   const float *x_dev, int64_t n, float *out_dev, int flags) {
    if (!gate || !up || !down || n < 0 || (n && (!x_dev || !out_dev)) ||
        gate->rows != up->rows || gate->cols != up->cols || down->cols != gate->rows ||
        down->rows != gate->cols || is_e8(gate) != is_e8(up) ||
        (flags & ~CCU_TWO_ROUNDINGS))
        return ccu_fail(CCU_EINVAL, "ccu_expert_mlp: shapes do not chain or bad arguments");
    if (n == 0) return CCU_OK;
    const int64_t d = gate->cols, mid = gate->rows;
    float *buf = NULL;
    size_t floats = (size_t)(n * d + 3 * n * mid);
    int rc = ccu_alloc(floats * sizeof(float), (void **)&buf);
    if (rc != CCU_OK) return rc;
    float *xs = buf, *g = xs + n * d, *u = g + n * mid, *h = u + n * mid;
    int in_flags = flags, down_flags = flags;
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
    cudaError_t freed = cudaFree(buf);
    if (rc == CCU_OK) rc = ccu_fail_cuda(freed, "cudaFree expert scratch");
    return rc;
}

int ccu_expert_mlp_host(const ccu_weight *gate, const ccu_weight *up, const ccu_weight *down,
                        const float *x_host, int64_t n, float *out_host, int flags) {
    if (!gate || n < 0 || (n && (!x_host || !out_host)))
        return ccu_fail(CCU_EINVAL, "ccu_expert_mlp_host: NULL or n < 0");
    if (n == 0) return CCU_OK;
    size_t bytes = (size_t)(n * gate->cols) * 4;
    void *buf = NULL;
    int rc = ccu_host_scratch(2 * bytes, &buf);
    if (rc != CCU_OK) return rc;
    float *x = (float *)buf, *y = (float *)((char *)buf + bytes);
    if ((rc = ccu_to_device(x, x_host, bytes)) != CCU_OK) return rc;
    if ((rc = ccu_expert_mlp(gate, up, down, x, n, y, flags)) != CCU_OK) return rc;
    return ccu_to_host(out_host, y, bytes);
}
