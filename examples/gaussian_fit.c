/*
 * gaussian_fit.c: fit a field of N 3-D Gaussians to a synthetic density, entirely
 * through the fusekit C ABI (C99, no other dependency).
 *
 *   field(p) = sum_n w_n exp(-0.5 |(L_n + eps I)^-1 (p - mu_n)|^2)
 *   loss     = mean_b (field(p_b) - target(p_b))^2      over B sample points
 *
 * Every step: fk_gaussian_field_forward, the loss gradient dout = 2 (field -
 * target) / B (fk_sub, fk_scalar_mul), fk_gaussian_field_backward for the means,
 * Cholesky factors and weights, and an Adam update of each parameter built from
 * fusekit elementwise ops (fk_axpby, fk_mul, fk_sqrt, fk_scalar_add, fk_div), all
 * on fusekit buffers: on the GPU when one is usable (FK_DEVICE_AUTO), else the CPU.
 * The loss is printed as it goes; at the end the z = 0 slice of the target and of
 * the fit are written side by side to a PNG (a minimal encoder below: stored
 * deflate blocks, CRC-32, Adler-32).
 *
 *   gaussian_fit [--gaussians N] [--points B] [--steps S] [--lr LR]
 *                [--image PX] [--out PATH] [--seed K] [--cpu] [--every K]
 *
 * Build (see examples/README.md):
 *   cc -std=c99 -O2 -Iinclude examples/gaussian_fit.c -Ltarget/release -lfusekit \
 *      -Wl,-rpath,$PWD/target/release -lm -o gaussian_fit
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include "fusekit.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FK_TRY(call)                                                                     \
    do {                                                                                 \
        fk_status st_ = (call);                                                          \
        if (st_ != FK_OK) {                                                              \
            fprintf(stderr, "%s:%d: %s failed: %s\n  %s\n", __FILE__, __LINE__, #call,   \
                    fk_status_string(st_), fk_last_error_message());                    \
            goto cleanup;                                                                \
        }                                                                                \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ random numbers */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void) /* splitmix64 -> [0, 1) */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z >> 11) * (1.0 / 9007199254740992.0);
}
static double normal(void)
{
    double u = uniform(), v = uniform();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* ------------------------------------------------------------------ the target density */
/* A torus of radius 0.8 in the z = 0 plane and a tilted ellipsoidal blob at its centre. */
static double target(double x, double y, double z)
{
    double rho = sqrt(x * x + y * y) - 0.8;
    double torus = exp(-(rho * rho + z * z) / (2.0 * 0.12 * 0.12));
    double u = (x + 0.5 * y) / 0.22, v = (y - 0.3 * x) / 0.1, w = z / 0.15;
    double blob = 0.8 * exp(-0.5 * (u * u + v * v + w * w));
    return torus + blob;
}

/* Sample points: a third uniform in the box, two thirds near the structures. */
static void sample_point(float *p)
{
    double r = uniform();
    if (r < 0.34) {
        p[0] = (float)(2.6 * uniform() - 1.3);
        p[1] = (float)(2.6 * uniform() - 1.3);
        p[2] = (float)(1.2 * uniform() - 0.6);
    } else if (r < 0.85) {
        double t = 6.283185307179586 * uniform(), rad = 0.8 + 0.15 * normal();
        p[0] = (float)(rad * cos(t));
        p[1] = (float)(rad * sin(t));
        p[2] = (float)(0.15 * normal());
    } else {
        p[0] = (float)(0.25 * normal());
        p[1] = (float)(0.15 * normal());
        p[2] = (float)(0.15 * normal());
    }
}

/* ------------------------------------------------------------------ a minimal PNG writer */
static uint32_t crc_table[256];
static void crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}
static uint32_t crc_update(uint32_t crc, const unsigned char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) crc = crc_table[(crc ^ buf[i]) & 0xff] ^ (crc >> 8);
    return crc;
}
static void put32(unsigned char *b, uint32_t v)
{
    b[0] = (unsigned char)(v >> 24);
    b[1] = (unsigned char)(v >> 16);
    b[2] = (unsigned char)(v >> 8);
    b[3] = (unsigned char)v;
}
static int write_chunk(FILE *f, const char *type, const unsigned char *data, size_t len)
{
    unsigned char hdr[8];
    uint32_t crc;
    put32(hdr, (uint32_t)len);
    memcpy(hdr + 4, type, 4);
    crc = crc_update(0xffffffffu, hdr + 4, 4);
    crc = crc_update(crc, data, len) ^ 0xffffffffu;
    unsigned char tail[4];
    put32(tail, crc);
    return fwrite(hdr, 1, 8, f) == 8 && (len == 0 || fwrite(data, 1, len, f) == len) &&
           fwrite(tail, 1, 4, f) == 4;
}
/* RGB 8-bit image, rows top to bottom; zlib stream of stored (uncompressed) blocks. */
static int write_png(const char *path, const unsigned char *rgb, int w, int h)
{
    size_t row = 1 + (size_t)w * 3, raw_len = row * (size_t)h;
    size_t nblocks = raw_len / 65535 + 1;
    size_t z_len = 2 + raw_len + nblocks * 5 + 4;
    unsigned char *raw = malloc(raw_len), *z = malloc(z_len);
    unsigned char ihdr[13];
    static const unsigned char sig[8] = {137, 80, 78, 71, 13, 10, 26, 10};
    FILE *f = NULL;
    int ok = 0;
    if (!raw || !z) goto done;
    for (int y = 0; y < h; y++) {
        raw[y * row] = 0; /* filter: none */
        memcpy(raw + y * row + 1, rgb + (size_t)y * w * 3, (size_t)w * 3);
    }
    size_t o = 0, pos = 0;
    uint32_t a = 1, b = 0; /* Adler-32 */
    z[o++] = 0x78;
    z[o++] = 0x01;
    do {
        size_t n = raw_len - pos > 65535 ? 65535 : raw_len - pos;
        int final = pos + n == raw_len;
        z[o++] = (unsigned char)final;
        z[o++] = (unsigned char)(n & 0xff);
        z[o++] = (unsigned char)(n >> 8);
        z[o++] = (unsigned char)(~n & 0xff);
        z[o++] = (unsigned char)((~n >> 8) & 0xff);
        memcpy(z + o, raw + pos, n);
        for (size_t i = 0; i < n; i++) {
            a = (a + raw[pos + i]) % 65521;
            b = (b + a) % 65521;
        }
        o += n;
        pos += n;
    } while (pos < raw_len);
    put32(z + o, (b << 16) | a);
    o += 4;
    put32(ihdr, (uint32_t)w);
    put32(ihdr + 4, (uint32_t)h);
    ihdr[8] = 8;  /* bit depth */
    ihdr[9] = 2;  /* colour type: RGB */
    ihdr[10] = 0; /* deflate */
    ihdr[11] = 0; /* adaptive filtering */
    ihdr[12] = 0; /* no interlace */
    crc_init();
    f = fopen(path, "wb");
    if (!f) goto done;
    ok = fwrite(sig, 1, 8, f) == 8 && write_chunk(f, "IHDR", ihdr, 13) &&
         write_chunk(f, "IDAT", z, o) && write_chunk(f, "IEND", NULL, 0);
done:
    if (f && fclose(f) != 0) ok = 0;
    free(raw);
    free(z);
    return ok;
}

/* A dark-blue -> magenta -> orange -> pale-yellow colour ramp for v in [0, 1]. */
static void colour(double v, unsigned char *c)
{
    static const double stops[5][3] = {
        {0, 0, 4}, {87, 16, 110}, {188, 55, 84}, {249, 142, 9}, {252, 255, 164}};
    if (!(v > 0)) v = 0; /* NaN too */
    if (v > 1) v = 1;
    double t = v * 4;
    int i = (int)t;
    if (i > 3) i = 3;
    double f = t - i;
    for (int k = 0; k < 3; k++)
        c[k] = (unsigned char)(stops[i][k] + f * (stops[i + 1][k] - stops[i][k]) + 0.5);
}

/* ------------------------------------------------------------------ Adam on fusekit buffers */
typedef struct {
    fk_buffer *p, *g, *m, *v, *t; /* parameter, gradient, moments, scratch */
} param;

static fk_status param_create(fk_context *ctx, int ndim, const int64_t *shape, const float *init,
                              size_t n, param *out)
{
    fk_status s;
    float *zeros = calloc(n, sizeof(float));
    if (!zeros) return FK_ERROR_OUT_OF_MEMORY;
    memset(out, 0, sizeof *out);
    if ((s = fk_buffer_create(ctx, FK_DTYPE_F32, ndim, shape, NULL, &out->p)) != FK_OK ||
        (s = fk_buffer_create(ctx, FK_DTYPE_F32, ndim, shape, NULL, &out->g)) != FK_OK ||
        (s = fk_buffer_create(ctx, FK_DTYPE_F32, ndim, shape, NULL, &out->m)) != FK_OK ||
        (s = fk_buffer_create(ctx, FK_DTYPE_F32, ndim, shape, NULL, &out->v)) != FK_OK ||
        (s = fk_buffer_create(ctx, FK_DTYPE_F32, ndim, shape, NULL, &out->t)) != FK_OK ||
        (s = fk_buffer_copy_from_host(out->p, init, n * sizeof(float), NULL)) != FK_OK ||
        (s = fk_buffer_copy_from_host(out->g, zeros, n * sizeof(float), NULL)) != FK_OK ||
        (s = fk_buffer_copy_from_host(out->m, zeros, n * sizeof(float), NULL)) != FK_OK ||
        (s = fk_buffer_copy_from_host(out->v, zeros, n * sizeof(float), NULL)) != FK_OK) {
    }
    free(zeros);
    return s;
}

static void param_destroy(param *q)
{
    fk_buffer_destroy(q->p);
    fk_buffer_destroy(q->g);
    fk_buffer_destroy(q->m);
    fk_buffer_destroy(q->v);
    fk_buffer_destroy(q->t);
}

/* m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 * p -= lr_t m / (sqrt(v) + eps_t),  lr_t = lr sqrt(1-b2^t)/(1-b1^t), eps_t = eps sqrt(1-b2^t)
 * (Adam with the bias corrections folded into the step size). */
static fk_status adam_step(param *q, double lr, int t)
{
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double c1 = 1 - pow(b1, t), c2 = sqrt(1 - pow(b2, t));
    fk_scalar one = {1, 0}, sb1 = {b1, 0}, sb1c = {1 - b1, 0}, sb2 = {b2, 0}, sb2c = {1 - b2, 0};
    fk_scalar step = {-lr * c2 / c1, 0}, e = {eps * c2, 0};
    fk_status s;
    if ((s = fk_axpby(sb1, q->m, sb1c, q->g, q->m, NULL)) != FK_OK) return s;
    if ((s = fk_mul(q->g, q->g, q->t, NULL)) != FK_OK) return s;
    if ((s = fk_axpby(sb2, q->v, sb2c, q->t, q->v, NULL)) != FK_OK) return s;
    if ((s = fk_sqrt(q->v, q->t, NULL)) != FK_OK) return s;
    if ((s = fk_scalar_add(q->t, e, q->t, NULL)) != FK_OK) return s;
    if ((s = fk_div(q->m, q->t, q->t, NULL)) != FK_OK) return s;
    return fk_axpby(one, q->p, step, q->t, q->p, NULL);
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--gaussians N] [--points B] [--steps S] [--lr LR] [--image PX]\n"
            "          [--out PATH] [--seed K] [--every K] [--cpu]\n",
            argv0);
}

int main(int argc, char **argv)
{
    long n_gauss = 96, n_points = 6144, steps = 300, image = 160, every = 25, seed = 1;
    double lr = 0.01;
    const char *out_path = "gaussian_fit.png";
    int force_cpu = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--cpu")) { force_cpu = 1; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(argv[0]); return 0; }
        if (!v) { usage(argv[0]); return 2; }
        if (!strcmp(a, "--gaussians")) n_gauss = atol(v);
        else if (!strcmp(a, "--points")) n_points = atol(v);
        else if (!strcmp(a, "--steps")) steps = atol(v);
        else if (!strcmp(a, "--lr")) lr = atof(v);
        else if (!strcmp(a, "--image")) image = atol(v);
        else if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--seed")) seed = atol(v);
        else if (!strcmp(a, "--every")) every = atol(v);
        else { usage(argv[0]); return 2; }
        i++;
    }
    if (n_gauss < 1 || n_points < 1 || steps < 1 || image < 8 || every < 1 || !(lr > 0)) {
        usage(argv[0]);
        return 2;
    }
    rng_state += (uint64_t)seed * 0x632be59bd9b4e019ull;

    const int64_t N = n_gauss, B = n_points, S = image, G = image * image;
    const int64_t sh_pts[2] = {B, 3}, sh_mu[2] = {N, 3}, sh_l[3] = {N, 3, 3}, sh_w[1] = {N},
                  sh_b[1] = {B}, sh_grid[2] = {G, 3}, sh_g[1] = {G};
    const double eps = FK_GAUSSIAN_DEFAULT_EPS;

    fk_context *ctx = NULL;
    fk_buffer *pts = NULL, *tgt = NULL, *fld = NULL, *diff = NULL, *dout = NULL, *ws = NULL,
              *grid = NULL, *gfield = NULL;
    param mu = {0}, chol = {0}, w = {0};
    float *h_pts = NULL, *h_tgt = NULL, *h_mu = NULL, *h_l = NULL, *h_w = NULL, *h_diff = NULL,
          *h_grid = NULL, *h_gfield = NULL;
    unsigned char *rgb = NULL;
    char name[256];
    fk_device_kind kind = FK_DEVICE_CPU;
    size_t ws_bytes = 0;
    double loss0 = -1, loss = -1, t0, t_train = 0;
    int rc = 1;

    FK_TRY(fk_context_create(FK_ABI_VERSION, force_cpu ? FK_DEVICE_CPU : FK_DEVICE_AUTO, 0, &ctx));
    FK_TRY(fk_context_device(ctx, &kind, NULL));
    FK_TRY(fk_context_name(ctx, name, sizeof name, NULL));
    printf("%s on %s: %s\n", fk_version_string(), kind == FK_DEVICE_CUDA ? "CUDA" : "CPU", name);
    printf("fitting %ld Gaussians to a torus + blob density at %ld sample points, %ld Adam steps (lr %g)\n",
           n_gauss, n_points, steps, lr);
    t0 = now_s();
    FK_TRY(fk_context_warmup(ctx)); /* NVRTC compile (or cache load) on the GPU; no-op on the CPU */
    if (kind == FK_DEVICE_CUDA) printf("kernels ready in %.1f s\n", now_s() - t0);

    /* ---- host data: sample points, target values, initial parameters */
    h_pts = malloc(sizeof(float) * 3 * B);
    h_tgt = malloc(sizeof(float) * B);
    h_diff = malloc(sizeof(float) * B);
    h_mu = malloc(sizeof(float) * 3 * N);
    h_l = calloc(9 * N, sizeof(float));
    h_w = malloc(sizeof(float) * N);
    h_grid = malloc(sizeof(float) * 3 * G);
    h_gfield = malloc(sizeof(float) * G);
    rgb = malloc((size_t)3 * (2 * S + 8) * S);
    if (!h_pts || !h_tgt || !h_diff || !h_mu || !h_l || !h_w || !h_grid || !h_gfield || !rgb) {
        fprintf(stderr, "out of host memory\n");
        goto cleanup;
    }
    for (int64_t b = 0; b < B; b++) {
        sample_point(h_pts + 3 * b);
        h_tgt[b] = (float)target(h_pts[3 * b], h_pts[3 * b + 1], h_pts[3 * b + 2]);
    }
    for (int64_t n = 0; n < N; n++) { /* means at sample points near the structures */
        float p[3];
        do sample_point(p); while (target(p[0], p[1], p[2]) < 0.3);
        memcpy(h_mu + 3 * n, p, sizeof p);
        h_l[9 * n + 0] = h_l[9 * n + 4] = h_l[9 * n + 8] = 0.2f; /* L = 0.2 I */
        h_w[n] = 0.3f;
    }

    /* ---- fusekit buffers */
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, sh_pts, NULL, &pts));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 1, sh_b, NULL, &tgt));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 1, sh_b, NULL, &fld));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 1, sh_b, NULL, &diff));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 1, sh_b, NULL, &dout));
    FK_TRY(fk_buffer_copy_from_host(pts, h_pts, sizeof(float) * 3 * B, NULL));
    FK_TRY(fk_buffer_copy_from_host(tgt, h_tgt, sizeof(float) * B, NULL));
    FK_TRY(param_create(ctx, 2, sh_mu, h_mu, 3 * N, &mu));
    FK_TRY(param_create(ctx, 3, sh_l, h_l, 9 * N, &chol));
    FK_TRY(param_create(ctx, 1, sh_w, h_w, N, &w));
    /* the backward's workspace (0 bytes on the CPU): fusekit allocates nothing itself */
    FK_TRY(fk_gaussian_backward_workspace_size(ctx, FK_DTYPE_F32, B, N, &ws_bytes));
    if (ws_bytes > 0) {
        int64_t wsn = (int64_t)((ws_bytes + 3) / 4);
        FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 1, &wsn, NULL, &ws));
    }

    /* ---- training */
    const fk_scalar grad_scale = {2.0 / (double)B, 0};
    t0 = now_s();
    for (long step = 1; step <= steps + 1; step++) {
        FK_TRY(fk_gaussian_field_forward(pts, mu.p, chol.p, w.p, eps, fld, NULL));
        FK_TRY(fk_sub(fld, tgt, diff, NULL));
        if (step == 1 || step % every == 0 || step == steps + 1) {
            FK_TRY(fk_buffer_copy_to_host(diff, h_diff, sizeof(float) * B, NULL));
            double s = 0;
            for (int64_t b = 0; b < B; b++) s += (double)h_diff[b] * h_diff[b];
            loss = s / (double)B;
            if (loss0 < 0) loss0 = loss;
            printf("step %4ld  loss %.6f  (%.1f%% of the initial)  %.2f s\n", step - 1, loss,
                   100.0 * loss / loss0, now_s() - t0);
            fflush(stdout);
        }
        if (step == steps + 1) break; /* the last pass only measures the final loss */
        FK_TRY(fk_scalar_mul(diff, grad_scale, dout, NULL)); /* dL/dfield = 2 (field - target) / B */
        FK_TRY(fk_gaussian_field_backward(pts, mu.p, chol.p, w.p, eps, dout, NULL, mu.g, chol.g, w.g,
                                          ws, NULL));
        FK_TRY(adam_step(&mu, lr, (int)step));
        FK_TRY(adam_step(&chol, lr, (int)step));
        FK_TRY(adam_step(&w, lr, (int)step));
    }
    t_train = now_s() - t0;
    printf("trained in %.2f s (%.1f ms per step); loss %.6f -> %.6f (%.1fx lower)\n", t_train,
           1e3 * t_train / steps, loss0, loss, loss0 / loss);

    /* ---- the z = 0 slice: target (left) and fit (right) */
    for (int64_t i = 0; i < S; i++)
        for (int64_t j = 0; j < S; j++) {
            float *p = h_grid + 3 * (i * S + j);
            p[0] = (float)(-1.3 + 2.6 * (j + 0.5) / S);
            p[1] = (float)(1.3 - 2.6 * (i + 0.5) / S);
            p[2] = 0.0f;
        }
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 2, sh_grid, NULL, &grid));
    FK_TRY(fk_buffer_create(ctx, FK_DTYPE_F32, 1, sh_g, NULL, &gfield));
    FK_TRY(fk_buffer_copy_from_host(grid, h_grid, sizeof(float) * 3 * G, NULL));
    FK_TRY(fk_gaussian_field_forward(grid, mu.p, chol.p, w.p, eps, gfield, NULL));
    FK_TRY(fk_buffer_copy_to_host(gfield, h_gfield, sizeof(float) * G, NULL));
    {
        const int64_t W = 2 * S + 8;
        double vmax = 1.2, err = 0, ref = 0;
        memset(rgb, 255, (size_t)3 * W * S);
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++) {
                const float *p = h_grid + 3 * (i * S + j);
                double t = target(p[0], p[1], p[2]), f = h_gfield[i * S + j];
                err += (f - t) * (f - t);
                ref += t * t;
                colour(t / vmax, rgb + 3 * (i * W + j));
                colour(f / vmax, rgb + 3 * (i * W + S + 8 + j));
            }
        printf("z = 0 slice: relative error of the fit %.3f\n", sqrt(err / ref));
        if (!write_png(out_path, rgb, (int)W, (int)S)) {
            fprintf(stderr, "could not write %s\n", out_path);
            goto cleanup;
        }
        printf("wrote %s (%ldx%ld: target left, fit right)\n", out_path, (long)W, (long)S);
    }
    if (!(loss < 0.5 * loss0)) {
        fprintf(stderr, "the loss did not decrease clearly (%.6f -> %.6f)\n", loss0, loss);
        goto cleanup;
    }
    rc = 0;

cleanup:
    param_destroy(&mu);
    param_destroy(&chol);
    param_destroy(&w);
    fk_buffer_destroy(pts);
    fk_buffer_destroy(tgt);
    fk_buffer_destroy(fld);
    fk_buffer_destroy(diff);
    fk_buffer_destroy(dout);
    fk_buffer_destroy(ws);
    fk_buffer_destroy(grid);
    fk_buffer_destroy(gfield);
    fk_context_destroy(ctx);
    free(h_pts);
    free(h_tgt);
    free(h_diff);
    free(h_mu);
    free(h_l);
    free(h_w);
    free(h_grid);
    free(h_gfield);
    free(rgb);
    return rc;
}
