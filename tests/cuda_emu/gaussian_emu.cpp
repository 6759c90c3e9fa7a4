// Runs kernels/gaussian.cu itself on the CPU (through the emulation in common.cuh)
// and checks every kernel against an f64 reference written from docs/ops.md section 3,
// including launch configurations that put several Gaussian tiles and point chunks
// in one CTA (the partial-sum paths). Built once per dtype: -DFK_GS_f32 / -DFK_GS_f64.
//   bash tests/cuda_emu/run.sh
#include "gaussian.cu"  // the copy run.sh makes, next to emu.cuh as common.cuh

#include <cstdio>
#include <random>

#if defined(FK_GS_f32)
typedef float T;
#define K_(name) name##_f32
static const double TOL_F = 1e-5, TOL_B = 1e-4;
#else
typedef double T;
#define K_(name) name##_f64
static const double TOL_F = 1e-12, TOL_B = 1e-11;
#endif

struct Problem {
    int B, N;
    std::vector<T> p, mu, L, w;
    double eps;
};

static Problem make(int B, int N, unsigned seed, double eps) {
    std::mt19937_64 r(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    Problem P{B, N, {}, {}, {}, {}, eps};
    for (int i = 0; i < 3 * B; i++) P.p.push_back((T)u(r));
    for (int i = 0; i < 3 * N; i++) P.mu.push_back((T)u(r));
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < 9; k++) {
            int i = k / 3, j = k % 3;
            double v = i == j ? 0.5 + 0.25 * u(r) : (i > j ? 0.3 * u(r) : 5 * u(r));
            P.L.push_back((T)v);
        }
        P.w.push_back((T)(0.5 + u(r)));
    }
    return P;
}

// reference: y, m for pair (b, n), in f64 with divisions
static void ref_y(const Problem& P, int b, int n, double y[3]) {
    const T* L = &P.L[9 * n];
    double d[3];
    for (int k = 0; k < 3; k++) d[k] = (double)P.p[3 * b + k] - (double)P.mu[3 * n + k];
    for (int i = 0; i < 3; i++) {
        double s = d[i];
        for (int j = 0; j < i; j++) s -= (double)L[3 * i + j] * y[j];
        y[i] = s / ((double)L[4 * i] + P.eps);
    }
}
static void ref_zt(const Problem& P, int n, const double v[3], double z[3]) {
    const T* L = &P.L[9 * n];
    for (int i = 2; i >= 0; i--) {
        double s = v[i];
        for (int j = i + 1; j < 3; j++) s -= (double)L[3 * j + i] * z[j];
        z[i] = s / ((double)L[4 * i] + P.eps);
    }
}

static double rel(const std::vector<T>& out, const std::vector<double>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        double o = (double)out[i];
        if (!std::isfinite(o)) return INFINITY;
        num += (o - ref[i]) * (o - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

static int failures = 0;
static void check(const char* what, const std::vector<T>& out, const std::vector<double>& ref, double tol, int B, int N) {
    double e = rel(out, ref);
    bool ok = e <= tol;
    if (!ok) failures++;
    std::printf("%-4s %-26s B=%-5d N=%-5d rel err %.2e %s\n", ok ? "ok" : "FAIL", what, B, N, e, ok ? "" : "<-- ");
}

static u64 addr(const void* p) { return (u64)(uintptr_t)p; }

static void run(int B, int N, unsigned seed, int force_sg = 0, int force_sp = 0, int gs_override = 0) {
    Problem P = make(B, N, seed, 1e-6);
    std::mt19937_64 r(seed + 1);
    std::uniform_real_distribution<double> u(-1, 1);
    std::vector<T> g((size_t)B * N), dout(B);
    for (auto& x : g) x = (T)u(r);
    for (auto& x : dout) x = (T)u(r);
    // ---- references
    std::vector<double> m_ref((size_t)B * N), f_ref(B, 0.0);
    std::vector<double> mdp(3 * B, 0), mdm(3 * N, 0), mdl(9 * N, 0);
    std::vector<double> fdp(3 * B, 0), fdm(3 * N, 0), fdl(9 * N, 0), fdw(N, 0);
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            double y[3], z[3], v[3];
            ref_y(P, b, n, y);
            double m = y[0] * y[0] + y[1] * y[1] + y[2] * y[2], e = std::exp(-0.5 * m);
            m_ref[(size_t)b * N + n] = m;
            f_ref[b] += (double)P.w[n] * e;
            for (int pass = 0; pass < 2; pass++) {
                double gg = pass == 0 ? (double)g[(size_t)b * N + n] : -0.5 * dout[b] * (double)P.w[n] * e;
                for (int k = 0; k < 3; k++) v[k] = 2 * gg * y[k];
                ref_zt(P, n, v, z);
                auto& dp = pass ? fdp : mdp;
                auto& dm = pass ? fdm : mdm;
                auto& dl = pass ? fdl : mdl;
                for (int i = 0; i < 3; i++) {
                    dp[3 * b + i] += z[i];
                    dm[3 * n + i] -= z[i];
                    for (int j = 0; j <= i; j++) dl[9 * n + 3 * i + j] -= z[i] * y[j];
                }
            }
            fdw[n] += dout[b] * e;
        }
    const double s = std::sqrt(0.5 * 1.4426950408889634);
    // ---- Mahalanobis forward (launch as src/cuda/gaussian.rs)
    {
        std::vector<T> out((size_t)B * N, (T)NAN);
        long gx = 32;
        while (gx < std::min(N, 256)) gx *= 2;
        GsMahaFwdArgs a{addr(P.p.data()), addr(P.mu.data()), addr(P.L.data()), addr(out.data()), B, N, P.eps, (int)gx, 0};
        Dim3 grid{(unsigned)((N + gx - 1) / gx), (unsigned)std::min<long>((B + 63) / 64, 65535), 1};
        emu_launch(K_(gs_maha_fwd), grid, 256, a);
        check("mahalanobis forward", out, m_ref, TOL_F, B, N);
    }
    // ---- field forward
    {
        std::vector<T> out(B, (T)NAN);
        int gs = 1;
        while (gs < 8 && (B + (256 / gs) * 2 - 1) / ((256 / gs) * 2) < 256) gs *= 2;
        if (gs_override) gs = gs_override;
        long per = (256 / gs) * 2;
        GsFieldFwdArgs a{addr(P.p.data()), addr(P.mu.data()), addr(P.L.data()), addr(P.w.data()), addr(out.data()),
                         B, N, P.eps, s, gs, 0};
        emu_launch(K_(gs_field_fwd), Dim3{(unsigned)((B + per - 1) / per), 1, 1}, 256, a);
        check("field forward", out, f_ref, TOL_F, B, N);
    }
    // ---- backwards: the host's split plan, or a forced one
    long n_gtiles = (N + 511) / 512, n_pchunks = (B + 63) / 64;
    double opt = std::sqrt(512.0 * 10 * N / (3.0 * std::max(B, 1)));
    long sg = std::clamp<long>(std::lround(opt), 1, std::max(n_gtiles, 1L));
    long sp = std::clamp<long>((512 + sg - 1) / sg, 1, std::max(n_pchunks, 1L));
    sg = std::clamp<long>((512 + sp - 1) / sp, 1, std::max(n_gtiles, 1L));
    if (force_sg) sg = force_sg;
    if (force_sp) sp = force_sp;
    std::vector<T> ws((size_t)(sg * 3 * B + sp * 10 * N));
    for (int field = 0; field < 2; field++) {
        std::vector<T> dp(3 * B, (T)NAN), dm(3 * N, (T)NAN), dl(9 * N, (T)NAN), dw(N, (T)NAN);
        std::fill(ws.begin(), ws.end(), (T)NAN);
        double sc = field ? s : 1.0;
        GsBwdArgs a{addr(P.p.data()), addr(P.mu.data()), addr(P.L.data()), addr(P.w.data()),
                    addr(field ? dout.data() : g.data()), addr(ws.data()), addr(ws.data() + sg * 3 * B),
                    B, N, n_pchunks, P.eps, sc, (int)n_gtiles, (int)sg, (int)sp, 1, 1, 0};
        emu_launch(field ? K_(gs_bwd_field) : K_(gs_bwd_maha), Dim3{(unsigned)sg, (unsigned)sp, 1}, 256, a);
        GsFinalizeArgs f{addr(ws.data()), addr(ws.data() + sg * 3 * B), addr(dp.data()), addr(dm.data()),
                         addr(dl.data()), field ? addr(dw.data()) : 0, B, N, 1 / sc, 1 / (sc * sc), (int)sg, (int)sp};
        emu_launch(K_(gs_finalize), Dim3{2, 1, 1}, 256, f);
        const char* nm = field ? "field" : "maha";
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s dpoints sg=%ld sp=%ld", nm, sg, sp);
        check(buf, dp, field ? fdp : mdp, TOL_B, B, N);
        std::snprintf(buf, sizeof buf, "%s dmeans", nm);
        check(buf, dm, field ? fdm : mdm, TOL_B, B, N);
        std::snprintf(buf, sizeof buf, "%s dchol", nm);
        check(buf, dl, field ? fdl : mdl, TOL_B, B, N);
        if (field) check("field dweights", dw, fdw, TOL_B, B, N);
    }
}

int main() {
    run(1, 1, 1);
    run(7, 5, 2);
    run(70, 33, 3);
    run(257, 40, 4, 0, 0, 4);        // field forward with the Gaussians split 4 ways in the CTA
    run(130, 600, 5);                // two Gaussian tiles
    run(300, 1100, 6, 2, 2);         // CTAs with 2 tiles x 2-3 chunks: the partial-sum paths
    run(65, 513, 7, 1, 1);           // one CTA does everything
    std::printf("%d failed\n", failures);
    return failures ? 1 : 0;
}
