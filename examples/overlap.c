/*
 * overlap.c: overlapping host-to-device copies with compute (C99).
 *
 * The input lives in pinned host memory, cut into chunks. One stream copies the
 * chunks to the device one after the other; a second stream computes on each chunk
 * as soon as its copy is done:
 *
 *   copy stream:     [copy 0][copy 1][copy 2] ...           record copied[c]
 *   compute stream:          [comp 0][comp 1][comp 2] ...   waits for copied[c]
 *
 * so that copying chunk c+1 overlaps computing chunk c. The compute per chunk is
 *
 *   out = exp(x); out = 2*out - x      (fk_exp, then fk_axpby in place)
 *
 * repeated R times, with R chosen by a short calibration so that computing a chunk
 * takes about as long as copying it (the case where overlap matters most). Events
 * time every copy and every computation; the program prints the measured timeline,
 * the total, and the total relative to max(sum of copies, sum of computations):
 * with perfect overlap that ratio is (chunks + 1) / chunks (one stage cannot be
 * hidden), 1.06 for 16 chunks.
 *
 * On the CPU backend the same program runs (a "pinned" buffer is an ordinary host
 * buffer, events are host timestamps) but ops run inside their calls, so nothing
 * overlaps: it just reports the times.
 *
 *   gcc -std=c99 -O2 -Iinclude examples/overlap.c -Ltarget/release -lfusekit -lm \
 *       -Wl,-rpath,$PWD/target/release -o overlap
 *   ./overlap [chunks [elements_per_chunk]]
 */
#include "fusekit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define FK_TRY(call)                                                                     \
    do {                                                                                 \
        fk_status st_ = (call);                                                          \
        if (st_ != FK_OK) {                                                              \
            fprintf(stderr, "%s:%d: %s failed: %s\n  %s\n", __FILE__, __LINE__, #call,   \
                    fk_status_string(st_), fk_last_error_message());                    \
            goto cleanup;                                                                \
        }                                                                                \
    } while (0)

#define MAX_CHUNKS 64

/* The compute of one chunk, R times, on `stream`. */
static fk_status compute(fk_buffer *in, fk_buffer *out, int reps, fk_stream *stream)
{
    const fk_scalar two = {2.0, 0.0}, minus_one = {-1.0, 0.0};
    int r;
    for (r = 0; r < reps; r++) {
        fk_status s = fk_exp(in, out, stream);
        if (s == FK_OK)
            s = fk_axpby(two, out, minus_one, in, out, stream);
        if (s != FK_OK)
            return s;
    }
    return FK_OK;
}

int main(int argc, char **argv)
{
    fk_context *ctx = NULL;
    fk_stream *copy_s = NULL, *comp_s = NULL;
    fk_buffer *host[MAX_CHUNKS] = {0}, *dev_in[MAX_CHUNKS] = {0}, *dev_out[MAX_CHUNKS] = {0};
    fk_buffer *check = NULL;
    fk_event *t0 = NULL, *t1 = NULL;
    fk_event *cp0[MAX_CHUNKS] = {0}, *cp1[MAX_CHUNKS] = {0}, *k0[MAX_CHUNKS] = {0},
             *k1[MAX_CHUNKS] = {0};
    fk_device_kind kind = FK_DEVICE_CPU;
    char name[256];
    int chunks = 16, reps = 1, c, rc = 1;
    int64_t m = 0;
    float copy_one = 0, comp_one = 0, total = 0, copy_sum = 0, comp_sum = 0;
    double max_err = 0;

    FK_TRY(fk_context_create(FK_ABI_VERSION, FK_DEVICE_AUTO, 0, &ctx));
    FK_TRY(fk_context_device(ctx, &kind, NULL));
    FK_TRY(fk_context_name(ctx, name, sizeof name, NULL));
    FK_TRY(fk_context_warmup(ctx));
    /* 8 MiB of float32 per chunk on a GPU, 256 KiB on the CPU (a quick run) */
    m = kind == FK_DEVICE_CUDA ? ((int64_t)2 << 20) : ((int64_t)64 << 10);
    if (argc > 1)
        chunks = atoi(argv[1]);
    if (argc > 2)
        m = (int64_t)atoll(argv[2]);
    if (chunks < 1 || chunks > MAX_CHUNKS || m < 1) {
        fprintf(stderr, "usage: %s [chunks (1..%d) [elements_per_chunk]]\n", argv[0], MAX_CHUNKS);
        return 2;
    }
    printf("fusekit overlap on %s: %d chunks of %lld float32 (%.1f MiB each)\n", name, chunks,
           (long long)m, m * 4.0 / (1 << 20));

    FK_TRY(fk_stream_create(ctx, &copy_s));
    FK_TRY(fk_stream_create(ctx, &comp_s));
    for (c = 0; c < chunks; c++) {
        float *p = NULL;
        int64_t i;
        FK_TRY(fk_buffer_create_pinned(ctx, FK_DTYPE_F32, 1, &m, &host[c]));
        FK_TRY(fk_buffer_data(host[c], (void **)&p));
        for (i = 0; i < m; i++)
            p[i] = (float)((c * m + i) % 1000) * 1e-3f;
        FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 1, &m, copy_s, &dev_in[c]));
        FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 1, &m, copy_s, &dev_out[c]));
        FK_TRY(fk_event_create(ctx, &cp0[c]));
        FK_TRY(fk_event_create(ctx, &cp1[c]));
        FK_TRY(fk_event_create(ctx, &k0[c]));
        FK_TRY(fk_event_create(ctx, &k1[c]));
    }
    FK_TRY(fk_event_create(ctx, &t0));
    FK_TRY(fk_event_create(ctx, &t1));
    FK_TRY(fk_stream_synchronize(copy_s)); /* the buffers are used on comp_s too */

    /* Calibration: one copy and one compute pass alone (after a warm-up of each). */
    FK_TRY(fk_buffer_copy(dev_in[0], host[0], copy_s));
    FK_TRY(compute(dev_in[0], dev_out[0], 1, copy_s));
    FK_TRY(fk_event_record(cp0[0], copy_s));
    FK_TRY(fk_buffer_copy(dev_in[0], host[0], copy_s));
    FK_TRY(fk_event_record(cp1[0], copy_s));
    FK_TRY(compute(dev_in[0], dev_out[0], 1, copy_s));
    FK_TRY(fk_event_record(k1[0], copy_s));
    FK_TRY(fk_event_elapsed_ms(cp0[0], cp1[0], &copy_one));
    FK_TRY(fk_event_elapsed_ms(cp1[0], k1[0], &comp_one));
    if (kind == FK_DEVICE_CUDA && comp_one > 0) {
        reps = (int)(copy_one / comp_one + 0.5f);
        if (reps < 1)
            reps = 1;
        if (reps > 200)
            reps = 200;
    }
    printf("calibration: copy of a chunk %.3f ms, one compute pass %.3f ms -> %d pass(es) per chunk\n",
           copy_one, comp_one, reps);

    /* The pipeline. */
    FK_TRY(fk_event_record(t0, copy_s));
    FK_TRY(fk_stream_wait_event(comp_s, t0));
    for (c = 0; c < chunks; c++) {
        FK_TRY(fk_event_record(cp0[c], copy_s));
        FK_TRY(fk_buffer_copy(dev_in[c], host[c], copy_s));
        FK_TRY(fk_event_record(cp1[c], copy_s));
        FK_TRY(fk_stream_wait_event(comp_s, cp1[c])); /* compute c after its copy */
        FK_TRY(fk_event_record(k0[c], comp_s));
        FK_TRY(compute(dev_in[c], dev_out[c], reps, comp_s));
        FK_TRY(fk_event_record(k1[c], comp_s));
    }
    FK_TRY(fk_event_record(t1, comp_s));
    FK_TRY(fk_event_synchronize(t1));

    printf("chunk   copy start..end (ms)   compute start..end (ms)\n");
    for (c = 0; c < chunks; c++) {
        float a, b, k, l;
        FK_TRY(fk_event_elapsed_ms(t0, cp0[c], &a));
        FK_TRY(fk_event_elapsed_ms(t0, cp1[c], &b));
        FK_TRY(fk_event_elapsed_ms(t0, k0[c], &k));
        FK_TRY(fk_event_elapsed_ms(t0, k1[c], &l));
        copy_sum += b - a;
        comp_sum += l - k;
        printf("%5d   %8.3f .. %8.3f     %8.3f .. %8.3f\n", c, a, b, k, l);
    }
    FK_TRY(fk_event_elapsed_ms(t0, t1, &total));
    {
        float mx = copy_sum > comp_sum ? copy_sum : comp_sum;
        printf("total %.3f ms; copies %.3f ms (%.1f GB/s), compute %.3f ms; max %.3f ms\n", total,
               copy_sum, copy_sum > 0 ? chunks * m * 4.0 / (copy_sum * 1e-3) / 1e9 : 0.0,
               comp_sum, mx);
        if (kind == FK_DEVICE_CUDA)
            printf("total / max(copy, compute) = %.3f (perfect overlap: %.3f; goal <= 1.15)\n",
                   mx > 0 ? total / mx : 0.0, (chunks + 1.0) / chunks);
        else
            printf("CPU backend: ops run inside their calls, so nothing overlaps "
                   "(total / (copy + compute) = %.3f)\n",
                   copy_sum + comp_sum > 0 ? total / (copy_sum + comp_sum) : 0.0);
    }

    /* Check the results: out = 2 exp(x) - x after `reps` passes (each pass starts
     * from x again), on a sample of every chunk. */
    FK_TRY(fk_buffer_create_pinned(ctx, FK_DTYPE_F32, 1, &m, &check));
    for (c = 0; c < chunks; c++) {
        const float *p = NULL;
        int64_t i;
        FK_TRY(fk_buffer_copy(check, dev_out[c], comp_s));
        FK_TRY(fk_stream_synchronize(comp_s));
        FK_TRY(fk_buffer_data(check, (void **)&p));
        for (i = 0; i < m; i += 101) {
            double x = (float)((c * m + i) % 1000) * 1e-3f;
            double want = 2.0 * exp(x) - x;
            double err = fabs(p[i] - want) / fabs(want);
            if (err > max_err)
                max_err = err;
        }
    }
    printf("max relative error vs C: %.2e\n", max_err);
    rc = max_err < 1e-5 ? 0 : 1;
    if (rc)
        fprintf(stderr, "overlap: wrong results (max relative error %.2e)\n", max_err);

cleanup:
    fk_buffer_destroy(check);
    for (c = 0; c < MAX_CHUNKS; c++) {
        fk_event_destroy(cp0[c]);
        fk_event_destroy(cp1[c]);
        fk_event_destroy(k0[c]);
        fk_event_destroy(k1[c]);
        fk_buffer_destroy(dev_in[c]);
        fk_buffer_destroy(dev_out[c]);
        fk_buffer_destroy(host[c]);
    }
    fk_event_destroy(t0);
    fk_event_destroy(t1);
    fk_stream_destroy(copy_s);
    fk_stream_destroy(comp_s);
    fk_context_destroy(ctx);
    return rc;
}
