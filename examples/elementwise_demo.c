/*
 * elementwise_demo.c: a small, complete fusekit program in C99.
 *
 *   z   = 2*x - 0.5*y          (fused axpby, one pass)
 *   z   = exp(z)               (in place)
 *   out = z + bias             (bias has shape [cols]: broadcast over the rows)
 *
 * on a 2048 x 2048 float32 matrix (4 Mi elements), on the GPU when one is usable
 * and on the CPU otherwise. Build and run (see examples/README.md):
 *
 *   gcc -std=c99 -O2 -Iinclude examples/elementwise_demo.c \
 *       -Ltarget/release -lfusekit -lm -Wl,-rpath,$PWD/target/release -o demo
 *   ./demo
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include "fusekit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Every fusekit call returns a status; on failure print its name and the
 * thread's last error message (which names the function and the argument),
 * then jump to the cleanup code. */
#define FK_TRY(call)                                                                     \
    do {                                                                                 \
        fk_status st_ = (call);                                                          \
        if (st_ != FK_OK) {                                                              \
            fprintf(stderr, "%s:%d: %s failed: %s\n  %s\n", __FILE__, __LINE__, #call,   \
                    fk_status_string(st_), fk_last_error_message());                    \
            goto cleanup;                                                                \
        }                                                                                \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(void)
{
    enum { ROWS = 2048, COLS = 2048 };
    const size_t n = (size_t)ROWS * COLS;
    const int64_t shape[2] = {ROWS, COLS};
    const int64_t bias_shape[1] = {COLS};
    const fk_scalar alpha = {2.0, 0.0}, beta = {-0.5, 0.0};

    fk_context *ctx = NULL;
    fk_stream *stream = NULL;
    fk_buffer *x = NULL, *y = NULL, *z = NULL, *bias = NULL, *out = NULL;
    float *hx = NULL, *hy = NULL, *hbias = NULL, *hout = NULL;
    char name[256];
    fk_device_kind kind = FK_DEVICE_CPU;
    double t0, t_axpby, t_exp, t_add, checksum = 0.0, max_err = 0.0;
    size_t i;
    int rc = 1;

    /* 1. A context on the best device (CUDA when a GPU and driver are usable). */
    FK_TRY(fk_context_create(FK_ABI_VERSION, FK_DEVICE_AUTO, 0, &ctx));
    FK_TRY(fk_context_device(ctx, &kind, NULL));
    FK_TRY(fk_context_name(ctx, name, sizeof name, NULL));
    printf("%s on %s: %s\n", fk_version_string(), kind == FK_DEVICE_CUDA ? "CUDA" : "CPU", name);

    /* Compile the GPU kernels now (a no-op on the CPU) so timings exclude it. */
    FK_TRY(fk_context_warmup(ctx));
    FK_TRY(fk_stream_create(ctx, &stream));

    /* 2. Host data. */
    hx = malloc(n * sizeof *hx);
    hy = malloc(n * sizeof *hy);
    hbias = malloc(COLS * sizeof *hbias);
    hout = malloc(n * sizeof *hout);
    if (!hx || !hy || !hbias || !hout) {
        fprintf(stderr, "out of host memory\n");
        goto cleanup;
    }
    for (i = 0; i < n; i++) {
        hx[i] = (float)(i % 1000) * 1e-3f;      /* 0 .. 0.999 */
        hy[i] = (float)((i * 7) % 1000) * 1e-3f; /* 0 .. 0.999 */
    }
    for (i = 0; i < COLS; i++)
        hbias[i] = (float)i / COLS;

    /* 3. Device buffers (allocated on our stream), filled from the host. */
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, shape, stream, &x));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, shape, stream, &y));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, shape, stream, &z));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, shape, stream, &out));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 1, bias_shape, stream, &bias));
    FK_TRY(fk_buffer_copy_from_host(x, hx, n * sizeof *hx, stream));
    FK_TRY(fk_buffer_copy_from_host(y, hy, n * sizeof *hy, stream));
    FK_TRY(fk_buffer_copy_from_host(bias, hbias, COLS * sizeof *hbias, stream));

    /* 4. The ops. Launches are asynchronous on CUDA: synchronise to time them. */
    t0 = now_ms();
    FK_TRY(fk_axpby(alpha, x, beta, y, z, stream));
    FK_TRY(fk_stream_synchronize(stream));
    t_axpby = now_ms() - t0;

    t0 = now_ms();
    FK_TRY(fk_exp(z, z, stream)); /* in place: out may alias its input exactly */
    FK_TRY(fk_stream_synchronize(stream));
    t_exp = now_ms() - t0;

    t0 = now_ms();
    FK_TRY(fk_add(z, bias, out, stream)); /* [2048,2048] + [2048] broadcasts */
    FK_TRY(fk_stream_synchronize(stream));
    t_add = now_ms() - t0;

    /* 5. Results back to the host (waits for the copy). */
    FK_TRY(fk_buffer_copy_to_host(out, hout, n * sizeof *hout, stream));

    for (i = 0; i < n; i++) {
        double ref = exp(2.0 * hx[i] - 0.5 * hy[i]) + hbias[i % COLS];
        double err = fabs(hout[i] - ref) / fabs(ref);
        if (err > max_err)
            max_err = err;
        checksum += hout[i];
    }
    printf("elements: %lu (%d x %d float32)\n", (unsigned long)n, ROWS, COLS);
    printf("axpby %.3f ms, exp %.3f ms, add(broadcast) %.3f ms\n", t_axpby, t_exp, t_add);
    printf("checksum: %.6e, max relative error vs C: %.2e\n", checksum, max_err);
    rc = max_err < 1e-5 ? 0 : 1;
    if (rc != 0)
        fprintf(stderr, "result check failed\n");

cleanup:
    /* Destroy functions accept NULL, so cleanup needs no bookkeeping. */
    fk_buffer_destroy(x);
    fk_buffer_destroy(y);
    fk_buffer_destroy(z);
    fk_buffer_destroy(out);
    fk_buffer_destroy(bias);
    fk_stream_destroy(stream);
    fk_context_destroy(ctx);
    free(hx);
    free(hy);
    free(hbias);
    free(hout);
    return rc;
}
