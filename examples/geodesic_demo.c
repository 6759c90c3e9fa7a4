/*
 * geodesic_demo.c: integrate a batch of geodesics with fusekit's fused leapfrog.
 *
 *   vh = v + dt/2 (f - Gamma(v) - mu v);  x += dt vh;  v = vh + dt/2 (f - Gamma(vh) - mu vh)
 *   Gamma(v) = clamp((v U)^2 W^T, -c, c)
 *
 * B = 4096 geodesics in D = 64 dimensions, rank R = 8, no force and no friction,
 * T = 32 steps in one call that also writes the trajectory [T, 2, B, D]. From the
 * trajectory it prints, per step, the mean kinetic energy E = |v|^2 / 2 and its drift
 * relative to the start; then the same flow with dt/2 and dt/4 to measure the
 * integrator's order (the force depends on v, so the kick-drift-kick of docs/ops.md section 5 is
 * first order in v: halving dt about halves the error, a ratio of 3 below; a
 * position-only force would give second order, a ratio of 5); then the gradient of the final energy with respect to U from the backward, checked
 * against a central finite difference on one element.
 *
 * On the GPU when one is usable, else on the CPU. Build and run (examples/README.md):
 *
 *   gcc -std=c99 -O2 -Iinclude examples/geodesic_demo.c \
 *       -Ltarget/release -lfusekit -lm -Wl,-rpath,$PWD/target/release -o geodesic_demo
 *   ./geodesic_demo
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

enum { B = 4096, D = 64, R = 8, T = 32 };
static const double C_CLAMP = 0.1;
static const double DT = 0.05;

/* splitmix64 -> uniform [lo, hi) */
static unsigned long long rng = 0x1234;
static double uniform(double lo, double hi)
{
    unsigned long long z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return lo + (hi - lo) * (double)(z >> 11) / 9007199254740992.0;
}

static double mean_energy(const float *v)
{
    double e = 0.0;
    size_t i;
    for (i = 0; i < (size_t)B * D; ++i)
        e += 0.5 * (double)v[i] * v[i];
    return e / B;
}

/* Runs `steps` leapfrog steps of size dt from (x0, v0) into (x, v) (and traj if given). */
static fk_status integrate(fk_buffer *x0, fk_buffer *v0, fk_buffer *U, fk_buffer *W, double dt, int64_t steps,
                           fk_buffer *x, fk_buffer *v, fk_buffer *traj)
{
    return fk_leapfrog_forward(x0, v0, NULL, U, W, NULL, dt, steps, C_CLAMP, 0, x, v, traj, NULL);
}

int main(void)
{
    const int64_t bd[2] = {B, D}, dr[2] = {D, R}, tr[4] = {T, 2, B, D};
    const size_t nbd = (size_t)B * D, ndr = (size_t)D * R;
    fk_context *ctx = NULL;
    fk_buffer *x0 = NULL, *v0 = NULL, *U = NULL, *W = NULL, *x = NULL, *v = NULL, *traj = NULL;
    fk_buffer *x2 = NULL, *v2 = NULL, *gv = NULL, *dU = NULL;
    float *hx = NULL, *hv = NULL, *hu = NULL, *hw = NULL, *htraj = NULL, *hx2 = NULL, *hv2 = NULL, *hdu = NULL;
    char name[256];
    fk_device_kind kind = FK_DEVICE_CPU;
    double e0, diff_dt, diff_half, fd, eps = 1e-2;
    size_t i;
    int t, rc = 1;

    FK_TRY(fk_context_create(FK_ABI_VERSION, FK_DEVICE_AUTO, 0, &ctx));
    FK_TRY(fk_context_device(ctx, &kind, NULL));
    FK_TRY(fk_context_name(ctx, name, sizeof name, NULL));
    printf("%s on %s: %s\n", fk_version_string(), kind == FK_DEVICE_CUDA ? "CUDA" : "CPU", name);
    printf("B = %d geodesics, D = %d, R = %d, T = %d steps of dt = %g, clamp c = %g\n", B, D, R, T, DT, C_CLAMP);

    hx = malloc(nbd * sizeof *hx);
    hv = malloc(nbd * sizeof *hv);
    hu = malloc(ndr * sizeof *hu);
    hw = malloc(ndr * sizeof *hw);
    htraj = malloc((size_t)T * 2 * nbd * sizeof *htraj);
    hx2 = malloc(nbd * sizeof *hx2);
    hv2 = malloc(nbd * sizeof *hv2);
    hdu = malloc(ndr * sizeof *hdu);
    if (!hx || !hv || !hu || !hw || !htraj || !hx2 || !hv2 || !hdu) {
        fprintf(stderr, "out of host memory\n");
        goto cleanup;
    }
    for (i = 0; i < nbd; ++i) {
        hx[i] = (float)uniform(-1.0, 1.0);
        hv[i] = (float)uniform(-1.0, 1.0);
    }
    for (i = 0; i < ndr; ++i) {
        hu[i] = (float)uniform(-0.25, 0.25);
        hw[i] = (float)uniform(-0.05, 0.05);
    }

    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, bd, NULL, &x0));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, bd, NULL, &v0));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, dr, NULL, &U));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, dr, NULL, &W));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, bd, NULL, &x));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, bd, NULL, &v));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 4, tr, NULL, &traj));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, bd, NULL, &x2));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, bd, NULL, &v2));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, bd, NULL, &gv));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, dr, NULL, &dU));
    FK_TRY(fk_buffer_copy_from_host(x0, hx, nbd * sizeof *hx, NULL));
    FK_TRY(fk_buffer_copy_from_host(v0, hv, nbd * sizeof *hv, NULL));
    FK_TRY(fk_buffer_copy_from_host(U, hu, ndr * sizeof *hu, NULL));
    FK_TRY(fk_buffer_copy_from_host(W, hw, ndr * sizeof *hw, NULL));

    /* 1. T steps in one call, with the trajectory. */
    FK_TRY(integrate(x0, v0, U, W, DT, T, x, v, traj));
    FK_TRY(fk_buffer_copy_to_host(traj, htraj, (size_t)T * 2 * nbd * sizeof *htraj, NULL));
    e0 = mean_energy(hv);
    printf("step  mean energy   drift vs start\n");
    printf("%4d  %.6f     %+.3e\n", 0, e0, 0.0);
    for (t = 0; t < T; ++t) {
        double e = mean_energy(htraj + ((size_t)2 * t + 1) * nbd); /* traj[t][1] = v after step t */
        if (t < 4 || t % 8 == 7)
            printf("%4d  %.6f     %+.3e\n", t + 1, e, (e - e0) / e0);
    }

    /* 2. The order of the integrator: dt, dt/2 against dt/4. */
    FK_TRY(fk_buffer_copy_to_host(v, hv2, nbd * sizeof *hv2, NULL));        /* v_T(dt) */
    FK_TRY(integrate(x0, v0, U, W, DT / 2, 2 * T, x2, v2, NULL));
    FK_TRY(fk_buffer_copy_to_host(v2, hx2, nbd * sizeof *hx2, NULL));       /* v_T(dt/2) */
    FK_TRY(integrate(x0, v0, U, W, DT / 4, 4 * T, x2, v2, NULL));
    FK_TRY(fk_buffer_copy_to_host(v2, hx, nbd * sizeof *hx, NULL));         /* v_T(dt/4), reference */
    diff_dt = diff_half = 0.0;
    for (i = 0; i < nbd; ++i) {
        diff_dt += ((double)hv2[i] - hx[i]) * ((double)hv2[i] - hx[i]);
        diff_half += ((double)hx2[i] - hx[i]) * ((double)hx2[i] - hx[i]);
    }
    printf("|v_T(dt) - v_T(dt/4)| = %.3e, |v_T(dt/2) - v_T(dt/4)| = %.3e: ratio %.2f (3: first order, 5: second)\n",
           sqrt(diff_dt), sqrt(diff_half), sqrt(diff_dt / diff_half));

    /* 3. Gradient of L = mean energy at T w.r.t. U: gv = dL/dv_T = v_T / B. */
    for (i = 0; i < nbd; ++i)
        hx2[i] = hv2[i] / (float)B;
    FK_TRY(fk_buffer_copy_from_host(gv, hx2, nbd * sizeof *hx2, NULL));
    FK_TRY(fk_leapfrog_backward(v0, NULL, U, W, NULL, DT, T, C_CLAMP, 0, traj, NULL, gv, NULL, NULL, NULL, dU, NULL,
                                NULL));
    FK_TRY(fk_buffer_copy_to_host(dU, hdu, ndr * sizeof *hdu, NULL));
    {
        /* central difference on U[0][0] (f32 forward: a loose check) */
        float keep = hu[0];
        double ep, em;
        hu[0] = keep + (float)eps;
        FK_TRY(fk_buffer_copy_from_host(U, hu, ndr * sizeof *hu, NULL));
        FK_TRY(integrate(x0, v0, U, W, DT, T, x2, v2, NULL));
        FK_TRY(fk_buffer_copy_to_host(v2, hx2, nbd * sizeof *hx2, NULL));
        ep = mean_energy(hx2);
        hu[0] = keep - (float)eps;
        FK_TRY(fk_buffer_copy_from_host(U, hu, ndr * sizeof *hu, NULL));
        FK_TRY(integrate(x0, v0, U, W, DT, T, x2, v2, NULL));
        FK_TRY(fk_buffer_copy_to_host(v2, hx2, nbd * sizeof *hx2, NULL));
        em = mean_energy(hx2);
        hu[0] = keep;
        fd = (ep - em) / (2 * eps);
    }
    printf("dL/dU[0][0]: backward %.6e, finite difference %.6e\n", hdu[0], fd);
    if (fabs(hdu[0] - fd) > 2e-2 * fabs(fd) + 1e-5) {
        fprintf(stderr, "gradient check failed\n");
        goto cleanup;
    }
    rc = 0;

cleanup:
    fk_buffer_destroy(x0);
    fk_buffer_destroy(v0);
    fk_buffer_destroy(U);
    fk_buffer_destroy(W);
    fk_buffer_destroy(x);
    fk_buffer_destroy(v);
    fk_buffer_destroy(traj);
    fk_buffer_destroy(x2);
    fk_buffer_destroy(v2);
    fk_buffer_destroy(gv);
    fk_buffer_destroy(dU);
    fk_context_destroy(ctx);
    free(hx);
    free(hv);
    free(hu);
    free(hw);
    free(htraj);
    free(hx2);
    free(hv2);
    free(hdu);
    return rc;
}
