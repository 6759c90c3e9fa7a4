/*
 * C99 conformance test of the fusekit C ABI (include/fusekit.h).
 *
 * Build:  gcc -std=c99 -Wall -Wextra -Werror -pedantic -Iinclude \
 *             tests/c/test_fusekit.c -Ltarget/release -lfusekit -lm \
 *             -Wl,-rpath,$PWD/target/release -o test_fusekit
 * Run:    ./test_fusekit [cpu|cuda|auto]     (or FK_TEST_DEVICE=cpu|cuda|auto)
 *
 * Every check prints one line ("ok   - ..." or "FAIL - ..."); the last line is
 * "N passed, M failed" and the exit status is non-zero when anything failed.
 *
 * All device memory is allocated with fk_buffer_create and filled/read with
 * fk_buffer_copy_{from,to}_host, so the same program runs on the CPU and on CUDA.
 * Strided views are fk_buffer_wrap'ed around the data pointer of such a buffer
 * (host or device address alike). Reference values are computed here in double
 * precision from the exact (rounded) input values.
 */
#include "fusekit.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ checks */

static int g_pass = 0;
static int g_fail = 0;

static int check(int ok, const char *fmt, ...)
{
    va_list ap;
    printf("%s - ", ok ? "ok  " : "FAIL");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (ok)
        g_pass++;
    else
        g_fail++;
    return ok;
}

static const char *last_msg(void)
{
    const char *m = fk_last_error_message();
    return m ? m : "(null)";
}

/* Checks that `st` is FK_OK; on failure the line carries the status and message. */
static int expect_ok(fk_status st, const char *what)
{
    if (st == FK_OK)
        return check(1, "%s", what);
    return check(0, "%s: got %s (%d): %s", what, fk_status_string(st), (int)st, last_msg());
}

/* Checks that `st` is `want` and that the last message contains every given
 * substring (a NULL-terminated list). */
static int expect_err(fk_status st, fk_status want, const char *what, ...)
{
    va_list ap;
    const char *sub;
    const char *msg;
    int ok;
    if (st != want) {
        return check(0, "%s: expected %s, got %s (%d): %s", what, fk_status_string(want),
                     fk_status_string(st), (int)st, last_msg());
    }
    msg = last_msg();
    ok = 1;
    va_start(ap, what);
    while ((sub = va_arg(ap, const char *)) != NULL) {
        if (strstr(msg, sub) == NULL) {
            ok = 0;
            check(0, "%s: %s but message lacks \"%s\": \"%s\"", what, fk_status_string(st), sub, msg);
        }
    }
    va_end(ap);
    if (ok)
        return check(1, "%s -> %s: \"%s\"", what, fk_status_string(st), msg);
    return 0;
}

static int starts_with(const char *s, const char *prefix)
{
    return s != NULL && strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ------------------------------------------------------------------ device */

static fk_device_kind g_kind = FK_DEVICE_CPU; /* requested */
static fk_device_kind g_actual = FK_DEVICE_CPU; /* resolved (AUTO -> CPU or CUDA) */
static fk_context *g_ctx = NULL;

/* ------------------------------------------------------------------ host data helpers */

static size_t dt_size(fk_dtype dt)
{
    switch (dt) {
    case FK_DTYPE_F16:
    case FK_DTYPE_BF16:
        return 2;
    case FK_DTYPE_F32:
        return 4;
    case FK_DTYPE_F64:
    case FK_DTYPE_C64:
        return 8;
    case FK_DTYPE_C128:
        return 16;
    default:
        return 0;
    }
}

static const char *dt_name(fk_dtype dt)
{
    switch (dt) {
    case FK_DTYPE_F16:
        return "f16";
    case FK_DTYPE_BF16:
        return "bf16";
    case FK_DTYPE_F32:
        return "f32";
    case FK_DTYPE_F64:
        return "f64";
    case FK_DTYPE_C64:
        return "c64";
    case FK_DTYPE_C128:
        return "c128";
    default:
        return "?";
    }
}

/* Rounds `x` to the precision of a real dtype (f32 or f64). */
static double round_to(fk_dtype dt, double x)
{
    return dt == FK_DTYPE_F32 ? (double)(float)x : x;
}

/* Converts n doubles into a freshly malloc'ed host array of real dtype dt. */
static void *pack(fk_dtype dt, const double *v, size_t n)
{
    size_t i;
    void *p = malloc(n * dt_size(dt) + 1);
    if (p == NULL) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    for (i = 0; i < n; i++) {
        if (dt == FK_DTYPE_F32)
            ((float *)p)[i] = (float)v[i];
        else
            ((double *)p)[i] = v[i];
    }
    return p;
}

static void unpack(fk_dtype dt, const void *p, double *v, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        v[i] = dt == FK_DTYPE_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static int64_t numel_of(int nd, const int64_t *shape)
{
    int64_t n = 1;
    int i;
    for (i = 0; i < nd; i++)
        n *= shape[i];
    return n;
}

/* Element offset in an input of shape/strides `in` for linear index `lin` of an
 * output of shape `out_shape`, with NumPy broadcasting (right-aligned dims, size-1
 * dims repeat). */
static int64_t bcast_offset(int64_t lin, int nd_out, const int64_t *out_shape, int nd_in,
                            const int64_t *in_shape, const int64_t *in_strides)
{
    int64_t off = 0;
    int d;
    for (d = nd_out - 1; d >= 0; d--) {
        int64_t idx = lin % out_shape[d];
        int din = d - (nd_out - nd_in);
        lin /= out_shape[d];
        if (din >= 0 && in_shape[din] != 1)
            off += idx * in_strides[din];
    }
    return off;
}

/* ------------------------------------------------------------------ buffer helpers */

/* Creates a contiguous buffer on g_ctx and optionally fills it from host bytes. */
static fk_buffer *new_buffer(fk_dtype dt, int nd, const int64_t *shape, const void *host)
{
    fk_buffer *b = NULL;
    fk_status st = fk_buffer_create(g_ctx, dt, nd, shape, NULL, &b);
    if (st != FK_OK) {
        check(0, "fk_buffer_create(%s, ndim %d): %s: %s", dt_name(dt), nd, fk_status_string(st),
              last_msg());
        return NULL;
    }
    if (host != NULL) {
        size_t bytes = (size_t)numel_of(nd, shape) * dt_size(dt);
        st = fk_buffer_copy_from_host(b, host, bytes, NULL);
        if (st != FK_OK) {
            check(0, "fk_buffer_copy_from_host: %s: %s", fk_status_string(st), last_msg());
            fk_buffer_destroy(b);
            return NULL;
        }
    }
    return b;
}

/* A buffer of real dtype dt holding the doubles v (rounded to dt). */
static fk_buffer *new_real(fk_dtype dt, int nd, const int64_t *shape, const double *v)
{
    size_t n = (size_t)numel_of(nd, shape);
    void *h = pack(dt, v, n);
    fk_buffer *b = new_buffer(dt, nd, shape, h);
    free(h);
    return b;
}

/* A contiguous output poisoned with NaN so that unwritten elements fail. */
static fk_buffer *new_poisoned(fk_dtype dt, int nd, const int64_t *shape)
{
    size_t n = (size_t)numel_of(nd, shape);
    size_t reals = (dt == FK_DTYPE_C64 || dt == FK_DTYPE_C128) ? 2 * n : n;
    fk_dtype rdt = (dt == FK_DTYPE_C64) ? FK_DTYPE_F32 : (dt == FK_DTYPE_C128) ? FK_DTYPE_F64 : dt;
    double *v = (double *)malloc((reals + 1) * sizeof(double));
    void *h;
    fk_buffer *b;
    size_t i;
    for (i = 0; i < reals; i++)
        v[i] = NAN;
    h = pack(rdt, v, reals);
    b = new_buffer(dt, nd, shape, h);
    free(h);
    free(v);
    return b;
}

/* Wraps a view onto `base`'s memory: data = base + offset elements. */
static fk_buffer *wrap_view(const fk_buffer *base, int64_t offset, fk_dtype dt, int nd,
                            const int64_t *shape, const int64_t *strides)
{
    void *data = NULL;
    fk_buffer *v = NULL;
    fk_status st = fk_buffer_data(base, &data);
    if (st != FK_OK) {
        check(0, "fk_buffer_data: %s", last_msg());
        return NULL;
    }
    data = (void *)((uintptr_t)data + (uintptr_t)(offset * (int64_t)dt_size(dt)));
    st = fk_buffer_wrap(g_ctx, data, dt, nd, shape, strides, &v);
    if (st != FK_OK) {
        check(0, "fk_buffer_wrap: %s: %s", fk_status_string(st), last_msg());
        return NULL;
    }
    return v;
}

/* Reads a contiguous real buffer (n elements) into doubles. */
static int read_real(const fk_buffer *b, fk_dtype dt, double *v, size_t n)
{
    void *h = malloc(n * dt_size(dt) + 1);
    fk_status st = fk_buffer_copy_to_host(b, h, n * dt_size(dt), NULL);
    if (st != FK_OK) {
        check(0, "fk_buffer_copy_to_host: %s: %s", fk_status_string(st), last_msg());
        free(h);
        return 0;
    }
    unpack(dt, h, v, n);
    free(h);
    return 1;
}

/* Compares got with ref elementwise: |got-ref| <= tol * max(1, |ref|); infinities
 * and NaN must match exactly. Returns 1 on success, and reports the worst element. */
static int compare(const char *what, const double *got, const double *ref, size_t n, double tol)
{
    size_t i, worst = 0;
    double worst_err = 0.0;
    for (i = 0; i < n; i++) {
        double err;
        if (isnan(ref[i]) || isnan(got[i])) {
            if (isnan(ref[i]) && isnan(got[i]))
                continue;
            return check(0, "%s: element %lu is %g, expected %g", what, (unsigned long)i, got[i],
                         ref[i]);
        }
        if (isinf(ref[i]) || isinf(got[i])) {
            if (got[i] == ref[i])
                continue;
            return check(0, "%s: element %lu is %g, expected %g", what, (unsigned long)i, got[i],
                         ref[i]);
        }
        err = fabs(got[i] - ref[i]) / (fabs(ref[i]) > 1.0 ? fabs(ref[i]) : 1.0);
        if (err > worst_err) {
            worst_err = err;
            worst = i;
        }
    }
    if (worst_err > tol)
        return check(0, "%s: element %lu is %.17g, expected %.17g (rel err %.3g > %.3g)", what,
                     (unsigned long)worst, got[worst], ref[worst], worst_err, tol);
    return check(1, "%s (%lu elements, max rel err %.3g)", what, (unsigned long)n, worst_err);
}

static double tol_for(fk_dtype dt)
{
    return dt == FK_DTYPE_F32 ? 1e-5 : 1e-12;
}

/* ------------------------------------------------------------------ version, statuses, messages */

static void test_version(void)
{
    const char *v = fk_version_string();
    check(fk_abi_version() == FK_ABI_VERSION, "fk_abi_version() == FK_ABI_VERSION (%u)",
          (unsigned)fk_abi_version());
    check(fk_abi_version() / 1000 == FK_ABI_VERSION / 1000, "ABI major version matches");
    check(starts_with(v, "fusekit "), "fk_version_string() = \"%s\"", v ? v : "(null)");
}

static void test_status_strings(void)
{
    static const char *const names[] = {
        "FK_OK",
        "FK_ERROR_INVALID_ARGUMENT",
        "FK_ERROR_NULL_POINTER",
        "FK_ERROR_UNSUPPORTED_DTYPE",
        "FK_ERROR_SHAPE_MISMATCH",
        "FK_ERROR_DEVICE_MISMATCH",
        "FK_ERROR_ALIASING",
        "FK_ERROR_OUT_OF_MEMORY",
        "FK_ERROR_CUDA_UNAVAILABLE",
        "FK_ERROR_LIBRARY_NOT_FOUND",
        "FK_ERROR_KERNEL_COMPILE",
        "FK_ERROR_CUDA",
        "FK_ERROR_ABI_MISMATCH",
        "FK_ERROR_BUFFER_TOO_SMALL",
        "FK_ERROR_UNSUPPORTED",
        "FK_ERROR_INTERNAL",
        "FK_ERROR_IO",
        "FK_ERROR_DTYPE_MISMATCH",
        "FK_ERROR_NOT_CONVERGED",
    };
    static const fk_status codes[] = {
        FK_OK,
        FK_ERROR_INVALID_ARGUMENT,
        FK_ERROR_NULL_POINTER,
        FK_ERROR_UNSUPPORTED_DTYPE,
        FK_ERROR_SHAPE_MISMATCH,
        FK_ERROR_DEVICE_MISMATCH,
        FK_ERROR_ALIASING,
        FK_ERROR_OUT_OF_MEMORY,
        FK_ERROR_CUDA_UNAVAILABLE,
        FK_ERROR_LIBRARY_NOT_FOUND,
        FK_ERROR_KERNEL_COMPILE,
        FK_ERROR_CUDA,
        FK_ERROR_ABI_MISMATCH,
        FK_ERROR_BUFFER_TOO_SMALL,
        FK_ERROR_UNSUPPORTED,
        FK_ERROR_INTERNAL,
        FK_ERROR_IO,
        FK_ERROR_DTYPE_MISMATCH,
        FK_ERROR_NOT_CONVERGED,
    };
    size_t i;
    int all = 1;
    for (i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        const char *s = fk_status_string(codes[i]);
        if (codes[i] != (fk_status)i || s == NULL || strcmp(s, names[i]) != 0) {
            all = 0;
            check(0, "fk_status_string(%d) = \"%s\", expected \"%s\"", (int)codes[i],
                  s ? s : "(null)", names[i]);
        }
    }
    check(all, "fk_status_string names all %lu statuses (values 0..17)",
          (unsigned long)(sizeof(codes) / sizeof(codes[0])));
    check(strcmp(fk_status_string(9999), "FK_UNKNOWN_STATUS") == 0,
          "fk_status_string(9999) = FK_UNKNOWN_STATUS");
    check(strcmp(fk_status_string(-1), "FK_UNKNOWN_STATUS") == 0,
          "fk_status_string(-1) = FK_UNKNOWN_STATUS");
}

static void test_last_error(void)
{
    size_t needed = 0, sz = 0, len;
    char big[512];
    char small[8];
    char before[512];
    fk_status st;
    const char *m = fk_last_error_message();

    check(m != NULL && m[0] == '\0', "last error message is empty before any failure (\"%s\")",
          m ? m : "(null)");
    st = fk_last_error_message_copy(NULL, 0, &needed);
    check(st == FK_OK && needed == 1, "fk_last_error_message_copy size query on empty message -> 1");

    st = fk_dtype_size(42, &sz);
    expect_err(st, FK_ERROR_INVALID_ARGUMENT, "fk_dtype_size(42) fails", "fk_dtype_size", "dtype",
               "42", (const char *)NULL);
    m = fk_last_error_message();
    check(starts_with(m, "fk_dtype_size: "), "message has the form \"<function>: <cause>\"");
    len = strlen(m);

    /* copy form */
    needed = 0;
    st = fk_last_error_message_copy(NULL, 0, &needed);
    check(st == FK_OK && needed == len + 1, "copy: size query (buf NULL) -> FK_OK, needed = %lu",
          (unsigned long)needed);
    needed = 0;
    st = fk_last_error_message_copy(big, sizeof big, &needed);
    check(st == FK_OK && strcmp(big, m) == 0 && needed == len + 1,
          "copy: full copy equals fk_last_error_message()");
    st = fk_last_error_message_copy(big, len + 1, NULL);
    check(st == FK_OK && strcmp(big, m) == 0, "copy: exact capacity, needed NULL -> FK_OK");
    memset(small, 'x', sizeof small);
    st = fk_last_error_message_copy(small, sizeof small, &needed);
    check(st == FK_ERROR_BUFFER_TOO_SMALL && small[sizeof small - 1] == '\0' &&
              strncmp(small, m, sizeof small - 1) == 0 && needed == len + 1,
          "copy: small buffer -> FK_ERROR_BUFFER_TOO_SMALL with truncated prefix \"%s\"", small);
    st = fk_last_error_message_copy(big, len, NULL);
    check(st == FK_ERROR_BUFFER_TOO_SMALL && strlen(big) == len - 1,
          "copy: capacity one short -> FK_ERROR_BUFFER_TOO_SMALL");
    st = fk_last_error_message_copy(big, 0, NULL);
    check(st == FK_ERROR_BUFFER_TOO_SMALL, "copy: capacity 0 with a buffer -> FK_ERROR_BUFFER_TOO_SMALL");
    check(strcmp(fk_last_error_message(), m) == 0 || strlen(fk_last_error_message()) == len,
          "copy calls leave the last message unchanged");

    /* success leaves the message unchanged */
    strncpy(before, fk_last_error_message(), sizeof before - 1);
    before[sizeof before - 1] = '\0';
    st = fk_dtype_size(FK_DTYPE_F32, &sz);
    check(st == FK_OK && strcmp(fk_last_error_message(), before) == 0,
          "a successful call leaves the last message unchanged");

    /* a new failure replaces it */
    st = fk_dtype_size(FK_DTYPE_F32, NULL);
    expect_err(st, FK_ERROR_NULL_POINTER, "fk_dtype_size(out NULL)", "fk_dtype_size", "out",
               (const char *)NULL);
}

static void test_dtypes(void)
{
    static const fk_dtype dts[] = {FK_DTYPE_F16, FK_DTYPE_BF16, FK_DTYPE_F32,
                                   FK_DTYPE_F64, FK_DTYPE_C64,  FK_DTYPE_C128};
    static const size_t sizes[] = {2, 2, 4, 8, 8, 16};
    size_t i;
    for (i = 0; i < 6; i++) {
        size_t s = 0;
        fk_status st = fk_dtype_size(dts[i], &s);
        check(st == FK_OK && s == sizes[i], "fk_dtype_size(%s) = %lu", dt_name(dts[i]),
              (unsigned long)s);
    }
    {
        size_t s = 0;
        expect_err(fk_dtype_size(0, &s), FK_ERROR_INVALID_ARGUMENT, "fk_dtype_size(0)", "dtype",
                   (const char *)NULL);
        expect_err(fk_dtype_size(7, &s), FK_ERROR_INVALID_ARGUMENT, "fk_dtype_size(7)", "dtype",
                   (const char *)NULL);
    }
}

/* ------------------------------------------------------------------ contexts */

static int test_context(void)
{
    int32_t count = -1, ord = -1, major = -1, minor = -1;
    fk_device_kind kind = -1;
    fk_context *c = NULL;
    fk_status st;
    size_t needed = 0;
    char name[256];
    char tiny[4];
    uint64_t freeb = 0, total = 0;

    st = fk_device_count(&count);
    check(st == FK_OK && count >= 0, "fk_device_count = %d", (int)count);
    expect_err(fk_device_count(NULL), FK_ERROR_NULL_POINTER, "fk_device_count(NULL)", "out",
               (const char *)NULL);

    /* bad arguments */
    c = NULL;
    st = fk_context_create(FK_ABI_VERSION + 1000, FK_DEVICE_CPU, 0, &c);
    expect_err(st, FK_ERROR_ABI_MISMATCH, "fk_context_create(major+1)", "fk_context_create", "ABI",
               (const char *)NULL);
    check(c == NULL, "failed fk_context_create leaves *out untouched");
    st = fk_context_create(FK_ABI_VERSION + 1, FK_DEVICE_CPU, 0, &c);
    expect_err(st, FK_ERROR_ABI_MISMATCH, "fk_context_create(newer minor)", "ABI",
               (const char *)NULL);
    st = fk_context_create(FK_ABI_VERSION, 42, 0, &c);
    expect_err(st, FK_ERROR_INVALID_ARGUMENT, "fk_context_create(kind 42)", "kind",
               (const char *)NULL);
    st = fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, NULL);
    expect_err(st, FK_ERROR_NULL_POINTER, "fk_context_create(out NULL)", "out", (const char *)NULL);
    if (count == 0) {
        st = fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, 0, &c);
        expect_err(st, FK_ERROR_CUDA_UNAVAILABLE, "fk_context_create(CUDA) without a GPU",
                   "fk_context_create", (const char *)NULL);
    } else {
        st = fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, count, &c);
        expect_err(st, FK_ERROR_INVALID_ARGUMENT, "fk_context_create(CUDA, ordinal = count)",
                   "ordinal", (const char *)NULL);
        st = fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, -1, &c);
        expect_err(st, FK_ERROR_INVALID_ARGUMENT, "fk_context_create(CUDA, ordinal -1)", "ordinal",
                   (const char *)NULL);
    }

    /* the context under test */
    st = fk_context_create(FK_ABI_VERSION, g_kind, 0, &g_ctx);
    if (!expect_ok(st, "fk_context_create(requested device)") || g_ctx == NULL)
        return 0;
    st = fk_context_device(g_ctx, &kind, &ord);
    expect_ok(st, "fk_context_device");
    g_actual = kind;
    if (g_kind == FK_DEVICE_AUTO)
        check(kind == (count > 0 ? FK_DEVICE_CUDA : FK_DEVICE_CPU),
              "AUTO resolves to %s (%d CUDA devices)", kind == FK_DEVICE_CUDA ? "CUDA" : "CPU",
              (int)count);
    else
        check(kind == g_kind, "context kind is the requested one (%d)", (int)kind);
    check(ord == 0, "context ordinal = 0");
    expect_ok(fk_context_device(g_ctx, NULL, NULL), "fk_context_device(NULL, NULL out-pointers)");
    expect_err(fk_context_device(NULL, &kind, &ord), FK_ERROR_NULL_POINTER,
               "fk_context_device(ctx NULL)", "ctx", (const char *)NULL);

    needed = 0;
    st = fk_context_name(g_ctx, NULL, 0, &needed);
    check(st == FK_OK && needed >= 1, "fk_context_name size query -> %lu", (unsigned long)needed);
    st = fk_context_name(g_ctx, name, sizeof name, NULL);
    check(st == FK_OK && strlen(name) + 1 == needed && name[0] != '\0', "fk_context_name = \"%s\"",
          name);
    if (needed > sizeof tiny) {
        st = fk_context_name(g_ctx, tiny, sizeof tiny, NULL);
        expect_err(st, FK_ERROR_BUFFER_TOO_SMALL, "fk_context_name(4-byte buffer)",
                   "fk_context_name", (const char *)NULL);
        check(tiny[3] == '\0' && strncmp(tiny, name, 3) == 0,
              "fk_context_name truncated prefix \"%s\"", tiny);
    }
    expect_err(fk_context_name(NULL, name, sizeof name, NULL), FK_ERROR_NULL_POINTER,
               "fk_context_name(ctx NULL)", "ctx", (const char *)NULL);

    st = fk_context_compute_capability(g_ctx, &major, &minor);
    if (kind == FK_DEVICE_CPU)
        check(st == FK_OK && major == 0 && minor == 0, "compute capability on CPU is 0.0");
    else
        check(st == FK_OK && major >= 3, "compute capability %d.%d", (int)major, (int)minor);
    expect_err(fk_context_compute_capability(g_ctx, NULL, &minor), FK_ERROR_NULL_POINTER,
               "fk_context_compute_capability(major NULL)", "major", (const char *)NULL);

    st = fk_context_memory(g_ctx, &freeb, &total);
    check(st == FK_OK && total > 0 && freeb <= total, "fk_context_memory: %llu free of %llu bytes",
          (unsigned long long)freeb, (unsigned long long)total);
    expect_err(fk_context_memory(NULL, &freeb, &total), FK_ERROR_NULL_POINTER,
               "fk_context_memory(ctx NULL)", "ctx", (const char *)NULL);

    expect_ok(fk_context_warmup(g_ctx), "fk_context_warmup");
    expect_err(fk_context_warmup(NULL), FK_ERROR_NULL_POINTER, "fk_context_warmup(NULL)", "ctx",
               (const char *)NULL);

    /* lifecycle: destroy NULL, a second context, the context outliving rule */
    expect_ok(fk_context_destroy(NULL), "fk_context_destroy(NULL) is a no-op");
    c = NULL;
    st = fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, &c);
    if (expect_ok(st, "second (CPU) context") && c != NULL) {
        fk_buffer *b = NULL;
        int64_t shape[1] = {3};
        float v[3] = {1.0f, 2.0f, 3.0f}, w[3] = {0, 0, 0};
        st = fk_buffer_create(c, FK_DTYPE_F32, 1, shape, NULL, &b);
        expect_ok(st, "buffer on second context");
        expect_ok(fk_context_destroy(c), "context destroyed before its buffer");
        if (b != NULL) {
            st = fk_buffer_copy_from_host(b, v, sizeof v, NULL);
            st = st == FK_OK ? fk_buffer_copy_to_host(b, w, sizeof w, NULL) : st;
            check(st == FK_OK && w[2] == 3.0f, "buffer stays usable after its context handle is destroyed");
            expect_ok(fk_buffer_destroy(b), "fk_buffer_destroy after context");
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ streams */

static void test_stream(void)
{
    fk_stream *s = NULL, *w = NULL;
    void *raw = (void *)1;
    fk_status st;

    st = fk_stream_create(g_ctx, &s);
    if (expect_ok(st, "fk_stream_create")) {
        st = fk_stream_handle(s, &raw);
        if (g_actual == FK_DEVICE_CPU)
            check(st == FK_OK && raw == NULL, "fk_stream_handle on CPU is NULL");
        else
            check(st == FK_OK && raw != NULL, "fk_stream_handle of an owned CUDA stream is non-NULL");
        expect_ok(fk_stream_synchronize(s), "fk_stream_synchronize");
        expect_err(fk_stream_handle(s, NULL), FK_ERROR_NULL_POINTER, "fk_stream_handle(out NULL)",
                   "out", (const char *)NULL);
        expect_ok(fk_stream_destroy(s), "fk_stream_destroy");
    }
    expect_ok(fk_stream_destroy(NULL), "fk_stream_destroy(NULL) is a no-op");
    expect_err(fk_stream_create(NULL, &s), FK_ERROR_NULL_POINTER, "fk_stream_create(ctx NULL)",
               "ctx", (const char *)NULL);
    expect_err(fk_stream_create(g_ctx, NULL), FK_ERROR_NULL_POINTER, "fk_stream_create(out NULL)",
               "out", (const char *)NULL);
    expect_err(fk_stream_synchronize(NULL), FK_ERROR_NULL_POINTER, "fk_stream_synchronize(NULL)",
               "stream", (const char *)NULL);
    expect_err(fk_stream_handle(NULL, &raw), FK_ERROR_NULL_POINTER, "fk_stream_handle(NULL)",
               "stream", (const char *)NULL);

    st = fk_stream_wrap(g_ctx, NULL, &w);
    if (g_actual == FK_DEVICE_CPU) {
        expect_err(st, FK_ERROR_UNSUPPORTED, "fk_stream_wrap on a CPU context", "fk_stream_wrap",
                   "CPU", (const char *)NULL);
    } else if (expect_ok(st, "fk_stream_wrap(legacy default stream)")) {
        raw = (void *)1;
        st = fk_stream_handle(w, &raw);
        check(st == FK_OK && raw == NULL, "wrapped legacy stream handle is NULL");
        expect_ok(fk_stream_synchronize(w), "synchronize wrapped stream");
        expect_ok(fk_stream_destroy(w), "destroy wrapped stream");
    }
}

/* ------------------------------------------------------------------ buffers */

/* DLPack 1.1 structures (from dlpack.h), declared here to test the exchange. */
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;
typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;
typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

static int g_deleter_calls = 0;
static void test_deleter(DLManagedTensorVersioned *self)
{
    (void)self;
    g_deleter_calls++;
}

static void test_dlpack(void)
{
    int64_t shape[2] = {2, 3};
    double v[6] = {1, 2, 3, 4, 5, 6}, w[6];
    fk_buffer *b = new_real(FK_DTYPE_F64, 2, shape, v);
    fk_buffer *imp = NULL, *out = NULL;
    void *p = NULL;
    DLManagedTensorVersioned *m;
    DLManagedTensorVersioned mine;
    int64_t my_shape[2] = {2, 3};
    int64_t my_strides[2] = {1, 2}; /* column-major */
    void *data = NULL;
    fk_status st;

    if (b == NULL)
        return;
    st = fk_buffer_to_dlpack(b, &p);
    if (expect_ok(st, "fk_buffer_to_dlpack") && p != NULL) {
        m = (DLManagedTensorVersioned *)p;
        check(m->version.major == 1 && m->deleter != NULL, "export: DLPack version %u.%u, deleter set",
              (unsigned)m->version.major, (unsigned)m->version.minor);
        check(m->dl_tensor.ndim == 2 && m->dl_tensor.shape[0] == 2 && m->dl_tensor.shape[1] == 3,
              "export: ndim 2, shape [2, 3]");
        check(m->dl_tensor.dtype.code == 2 && m->dl_tensor.dtype.bits == 64 &&
                  m->dl_tensor.dtype.lanes == 1,
              "export: dtype kDLFloat 64 x1");
        check(m->dl_tensor.device.device_type == (g_actual == FK_DEVICE_CPU ? 1 : 2),
              "export: device type %d", (int)m->dl_tensor.device.device_type);
        check(m->dl_tensor.strides == NULL ||
                  (m->dl_tensor.strides[0] == 3 && m->dl_tensor.strides[1] == 1),
              "export: strides contiguous");
        fk_buffer_data(b, &data);
        check((char *)m->dl_tensor.data + m->dl_tensor.byte_offset == (char *)data,
              "export: data pointer is the buffer's");
        expect_ok(fk_buffer_destroy(b), "destroy buffer while its DLPack export is alive");
        b = NULL;
        if (g_actual == FK_DEVICE_CPU) {
            const double *d = (const double *)((char *)m->dl_tensor.data + m->dl_tensor.byte_offset);
            check(d[0] == 1.0 && d[5] == 6.0, "export: memory stays valid after fk_buffer_destroy");
        }
        m->deleter(m);
        check(1, "export: consumer deleter ran");
    }
    fk_buffer_destroy(b);
    expect_err(fk_buffer_to_dlpack(NULL, &p), FK_ERROR_NULL_POINTER, "fk_buffer_to_dlpack(NULL)",
               "buf", (const char *)NULL);

    /* import a caller's tensor (column-major strides) on the context's device */
    b = new_real(FK_DTYPE_F64, 2, shape, v);
    if (b == NULL)
        return;
    fk_buffer_data(b, &data);
    memset(&mine, 0, sizeof mine);
    mine.version.major = 1;
    mine.version.minor = 1;
    mine.deleter = test_deleter;
    mine.dl_tensor.data = data;
    mine.dl_tensor.device.device_type = g_actual == FK_DEVICE_CPU ? 1 : 2;
    mine.dl_tensor.device.device_id = 0;
    mine.dl_tensor.ndim = 2;
    mine.dl_tensor.dtype.code = 2;
    mine.dl_tensor.dtype.bits = 64;
    mine.dl_tensor.dtype.lanes = 1;
    mine.dl_tensor.shape = my_shape;
    mine.dl_tensor.strides = my_strides;
    g_deleter_calls = 0;
    st = fk_buffer_from_dlpack(g_ctx, &mine, &imp);
    if (expect_ok(st, "fk_buffer_from_dlpack (column-major f64)")) {
        int64_t s[2] = {0, 0};
        int32_t contig = -1;
        fk_buffer_strides(imp, s);
        fk_buffer_is_contiguous(imp, &contig);
        check(s[0] == 1 && s[1] == 2 && contig == 0, "import keeps strides [1, 2] (non-contiguous)");
        out = new_poisoned(FK_DTYPE_F64, 2, shape);
        if (out != NULL && expect_ok(fk_copy(imp, out, NULL), "fk_copy of imported view")) {
            /* element (i,j) of the view is v[i + 2j] */
            double ref[6];
            int i, j;
            for (i = 0; i < 2; i++)
                for (j = 0; j < 3; j++)
                    ref[i * 3 + j] = v[i + 2 * j];
            if (read_real(out, FK_DTYPE_F64, w, 6))
                compare("imported column-major view copied row-major", w, ref, 6, 0.0);
        }
        fk_buffer_destroy(out);
        check(g_deleter_calls == 0, "deleter not called while imported buffer lives");
        expect_ok(fk_buffer_destroy(imp), "destroy imported buffer");
        check(g_deleter_calls == 1, "deleter called exactly once on destroy (%d)", g_deleter_calls);
    }

    /* a read-only import is refused as an op output */
    mine.flags = 1;
    mine.dl_tensor.strides = NULL;
    g_deleter_calls = 0;
    imp = NULL;
    st = fk_buffer_from_dlpack(g_ctx, &mine, &imp);
    if (expect_ok(st, "fk_buffer_from_dlpack (read-only)")) {
        expect_err(fk_neg(b, imp, NULL), FK_ERROR_INVALID_ARGUMENT, "fk_neg into read-only DLPack out",
                   "read-only", (const char *)NULL);
        fk_buffer_destroy(imp);
        check(g_deleter_calls == 1, "read-only import deleter called once");
    }
    /* unsupported DLPack major version: the caller keeps ownership */
    mine.flags = 0;
    mine.version.major = 2;
    g_deleter_calls = 0;
    st = fk_buffer_from_dlpack(g_ctx, &mine, &imp);
    expect_err(st, FK_ERROR_UNSUPPORTED, "fk_buffer_from_dlpack(DLPack major 2)", "fk_buffer_from_dlpack",
               (const char *)NULL);
    check(g_deleter_calls == 0, "failed import does not call the deleter");
    expect_err(fk_buffer_from_dlpack(g_ctx, NULL, &imp), FK_ERROR_NULL_POINTER,
               "fk_buffer_from_dlpack(managed NULL)", "managed", (const char *)NULL);
    fk_buffer_destroy(b);
}

static void test_buffers(void)
{
    int64_t shape[3] = {2, 3, 4};
    int64_t got[3] = {0, 0, 0};
    fk_buffer *b = NULL, *z = NULL, *e = NULL, *v = NULL;
    fk_status st;
    fk_dtype dt = 0;
    int32_t nd = -1, contig = -1, ord = -1;
    int64_t n = -1;
    size_t nb = 0;
    void *data = NULL;
    fk_device_kind kind = -1;
    float host[24], back[24];
    int i;

    st = fk_buffer_create(g_ctx, FK_DTYPE_F32, 3, shape, NULL, &b);
    if (!expect_ok(st, "fk_buffer_create f32 [2,3,4]"))
        return;
    check(fk_buffer_dtype(b, &dt) == FK_OK && dt == FK_DTYPE_F32, "fk_buffer_dtype = F32");
    check(fk_buffer_ndim(b, &nd) == FK_OK && nd == 3, "fk_buffer_ndim = 3");
    check(fk_buffer_shape(b, got) == FK_OK && got[0] == 2 && got[1] == 3 && got[2] == 4,
          "fk_buffer_shape = [2,3,4]");
    check(fk_buffer_strides(b, got) == FK_OK && got[0] == 12 && got[1] == 4 && got[2] == 1,
          "fk_buffer_strides = [12,4,1]");
    check(fk_buffer_numel(b, &n) == FK_OK && n == 24, "fk_buffer_numel = 24");
    check(fk_buffer_nbytes(b, &nb) == FK_OK && nb == 96, "fk_buffer_nbytes = 96");
    check(fk_buffer_is_contiguous(b, &contig) == FK_OK && contig == 1, "fk_buffer_is_contiguous = 1");
    check(fk_buffer_data(b, &data) == FK_OK && data != NULL, "fk_buffer_data non-NULL");
    check(fk_buffer_device(b, &kind, &ord) == FK_OK && kind == g_actual && ord == 0,
          "fk_buffer_device = context's device");
    expect_ok(fk_buffer_device(b, NULL, NULL), "fk_buffer_device(NULL out-pointers)");

    /* host copies */
    for (i = 0; i < 24; i++)
        host[i] = (float)i * 0.5f - 3.0f;
    expect_ok(fk_buffer_copy_from_host(b, host, sizeof host, NULL), "fk_buffer_copy_from_host");
    memset(back, 0, sizeof back);
    expect_ok(fk_buffer_copy_to_host(b, back, sizeof back, NULL), "fk_buffer_copy_to_host");
    check(memcmp(host, back, sizeof host) == 0, "host round trip is exact");
    {
        fk_stream *s = NULL;
        if (expect_ok(fk_stream_create(g_ctx, &s), "stream for async copies")) {
            for (i = 0; i < 24; i++)
                host[i] = (float)(24 - i);
            expect_ok(fk_buffer_copy_from_host_async(b, host, sizeof host, s),
                      "fk_buffer_copy_from_host_async");
            memset(back, 0, sizeof back);
            expect_ok(fk_buffer_copy_to_host_async(b, back, sizeof back, s),
                      "fk_buffer_copy_to_host_async");
            expect_ok(fk_stream_synchronize(s), "synchronize after async copies");
            check(memcmp(host, back, sizeof host) == 0, "async round trip is exact");
            fk_stream_destroy(s);
        }
    }
    expect_err(fk_buffer_copy_from_host(b, host, sizeof host - 4, NULL), FK_ERROR_SHAPE_MISMATCH,
               "copy_from_host with wrong byte count", "fk_buffer_copy_from_host", "bytes = 92", "96",
               (const char *)NULL);
    expect_err(fk_buffer_copy_to_host(b, back, sizeof back + 4, NULL), FK_ERROR_SHAPE_MISMATCH,
               "copy_to_host with wrong byte count", "bytes = 100", (const char *)NULL);
    expect_err(fk_buffer_copy_from_host(b, NULL, sizeof host, NULL), FK_ERROR_NULL_POINTER,
               "copy_from_host(src NULL)", "src", (const char *)NULL);
    expect_err(fk_buffer_copy_to_host(b, NULL, sizeof back, NULL), FK_ERROR_NULL_POINTER,
               "copy_to_host(dst NULL)", "dst", (const char *)NULL);
    expect_err(fk_buffer_copy_to_host(NULL, back, sizeof back, NULL), FK_ERROR_NULL_POINTER,
               "copy_to_host(buf NULL)", "buf", (const char *)NULL);

    /* accessor NULL arguments */
    expect_err(fk_buffer_dtype(NULL, &dt), FK_ERROR_NULL_POINTER, "fk_buffer_dtype(NULL)", "buf",
               (const char *)NULL);
    expect_err(fk_buffer_ndim(b, NULL), FK_ERROR_NULL_POINTER, "fk_buffer_ndim(out NULL)", "out",
               (const char *)NULL);
    expect_err(fk_buffer_shape(b, NULL), FK_ERROR_NULL_POINTER, "fk_buffer_shape(out NULL)", "out",
               (const char *)NULL);
    expect_err(fk_buffer_strides(NULL, got), FK_ERROR_NULL_POINTER, "fk_buffer_strides(NULL)",
               "buf", (const char *)NULL);
    expect_err(fk_buffer_numel(NULL, &n), FK_ERROR_NULL_POINTER, "fk_buffer_numel(NULL)", "buf",
               (const char *)NULL);
    expect_err(fk_buffer_nbytes(NULL, &nb), FK_ERROR_NULL_POINTER, "fk_buffer_nbytes(NULL)", "buf",
               (const char *)NULL);
    expect_err(fk_buffer_is_contiguous(NULL, &contig), FK_ERROR_NULL_POINTER,
               "fk_buffer_is_contiguous(NULL)", "buf", (const char *)NULL);
    expect_err(fk_buffer_data(NULL, &data), FK_ERROR_NULL_POINTER, "fk_buffer_data(NULL)", "buf",
               (const char *)NULL);
    expect_err(fk_buffer_device(NULL, &kind, &ord), FK_ERROR_NULL_POINTER, "fk_buffer_device(NULL)",
               "buf", (const char *)NULL);
    /* a handle of another kind is recognised, not trusted */
    expect_err(fk_buffer_numel((const fk_buffer *)(const void *)g_ctx, &n), FK_ERROR_INVALID_ARGUMENT,
               "fk_buffer_numel(context handle as buffer)", "not a live fk_buffer", (const char *)NULL);

    /* strided view (wrap) */
    {
        int64_t vshape[2] = {3, 4};
        int64_t vstrides[2] = {1, 6}; /* transposed-ish view of the 24 elements */
        v = wrap_view(b, 0, FK_DTYPE_F32, 2, vshape, vstrides);
        if (v != NULL) {
            check(fk_buffer_strides(v, got) == FK_OK && got[0] == 1 && got[1] == 6,
                  "wrapped view strides = [1,6]");
            check(fk_buffer_is_contiguous(v, &contig) == FK_OK && contig == 0,
                  "wrapped view is not contiguous");
            check(fk_buffer_numel(v, &n) == FK_OK && n == 12, "wrapped view numel = 12");
            expect_err(fk_buffer_copy_to_host(v, back, 12 * sizeof(float), NULL), FK_ERROR_UNSUPPORTED,
                       "copy_to_host of a non-contiguous view", "not contiguous", (const char *)NULL);
            expect_ok(fk_buffer_destroy(v), "destroy wrapped view (memory not freed)");
            check(fk_buffer_copy_to_host(b, back, sizeof back, NULL) == FK_OK && back[0] == host[0],
                  "base buffer intact after destroying a view of it");
        }
    }

    /* 0-d and empty buffers */
    st = fk_buffer_create(g_ctx, FK_DTYPE_F64, 0, NULL, NULL, &z);
    if (expect_ok(st, "fk_buffer_create 0-d (shape NULL)")) {
        check(fk_buffer_ndim(z, &nd) == FK_OK && nd == 0, "0-d ndim = 0");
        check(fk_buffer_numel(z, &n) == FK_OK && n == 1, "0-d numel = 1");
        expect_ok(fk_buffer_shape(z, NULL), "fk_buffer_shape(0-d, NULL)");
        fk_buffer_destroy(z);
    }
    {
        int64_t es[2] = {0, 3};
        st = fk_buffer_create(g_ctx, FK_DTYPE_F32, 2, es, NULL, &e);
        if (expect_ok(st, "fk_buffer_create empty [0,3]")) {
            check(fk_buffer_numel(e, &n) == FK_OK && n == 0, "empty numel = 0");
            expect_ok(fk_buffer_copy_to_host(e, NULL, 0, NULL), "copy_to_host of 0 bytes (dst NULL)");
            expect_ok(fk_exp(e, e, NULL), "op on empty buffers is a no-op");
            fk_buffer_destroy(e);
        }
        st = fk_buffer_wrap(g_ctx, NULL, FK_DTYPE_F32, 2, es, NULL, &e);
        if (expect_ok(st, "fk_buffer_wrap(NULL data, empty shape)"))
            fk_buffer_destroy(e);
    }

    /* bad creation arguments */
    {
        int64_t bad[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        int64_t neg[2] = {2, -1};
        fk_buffer *x = NULL;
        expect_err(fk_buffer_create(g_ctx, 99, 3, shape, NULL, &x), FK_ERROR_INVALID_ARGUMENT,
                   "fk_buffer_create(dtype 99)", "dtype", (const char *)NULL);
        expect_err(fk_buffer_create(g_ctx, FK_DTYPE_F32, 9, bad, NULL, &x), FK_ERROR_INVALID_ARGUMENT,
                   "fk_buffer_create(ndim 9)", "ndim", (const char *)NULL);
        expect_err(fk_buffer_create(g_ctx, FK_DTYPE_F32, -1, bad, NULL, &x),
                   FK_ERROR_INVALID_ARGUMENT, "fk_buffer_create(ndim -1)", "ndim", (const char *)NULL);
        expect_err(fk_buffer_create(g_ctx, FK_DTYPE_F32, 2, neg, NULL, &x), FK_ERROR_INVALID_ARGUMENT,
                   "fk_buffer_create(negative extent)", "shape[1] = -1", (const char *)NULL);
        expect_err(fk_buffer_create(g_ctx, FK_DTYPE_F32, 2, NULL, NULL, &x), FK_ERROR_NULL_POINTER,
                   "fk_buffer_create(shape NULL, ndim 2)", "shape", (const char *)NULL);
        expect_err(fk_buffer_create(NULL, FK_DTYPE_F32, 3, shape, NULL, &x), FK_ERROR_NULL_POINTER,
                   "fk_buffer_create(ctx NULL)", "ctx", (const char *)NULL);
        expect_err(fk_buffer_create(g_ctx, FK_DTYPE_F32, 3, shape, NULL, NULL), FK_ERROR_NULL_POINTER,
                   "fk_buffer_create(out NULL)", "out", (const char *)NULL);
        expect_err(fk_buffer_wrap(g_ctx, NULL, FK_DTYPE_F32, 3, shape, NULL, &x), FK_ERROR_NULL_POINTER,
                   "fk_buffer_wrap(data NULL, 24 elements)", "data", (const char *)NULL);
        check(x == NULL, "failed constructors leave *out untouched");
    }
    expect_ok(fk_buffer_destroy(NULL), "fk_buffer_destroy(NULL) is a no-op");
    expect_ok(fk_buffer_destroy(b), "fk_buffer_destroy");
}

/* ------------------------------------------------------------------ elementwise: real dtypes */

enum binop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_AXPBY, N_BINOPS };
static const char *const binop_names[] = {"add", "sub", "mul", "div", "axpby"};
static const double AXPBY_ALPHA = 1.5, AXPBY_BETA = -0.25;

enum unop {
    OP_NEG,
    OP_ABS,
    OP_EXP,
    OP_LOG,
    OP_SQRT,
    OP_SIN,
    OP_COS,
    OP_TANH,
    OP_SIGMOID,
    OP_RELU,
    OP_SCALAR_ADD,
    OP_SCALAR_MUL,
    OP_COPY,
    N_UNOPS
};
static const char *const unop_names[] = {"neg",  "abs",     "exp",  "log",        "sqrt",
                                         "sin",  "cos",     "tanh", "sigmoid",    "relu",
                                         "scalar_add", "scalar_mul", "copy"};
static const double SCALAR_ADD_S = 0.75, SCALAR_MUL_S = -2.0;

static fk_scalar real_scalar(double x)
{
    fk_scalar s;
    s.re = x;
    s.im = 0.0;
    return s;
}

typedef fk_status (*binop_fn)(const fk_buffer *, const fk_buffer *, fk_buffer *, const fk_stream *);
typedef fk_status (*unop_fn)(const fk_buffer *, fk_buffer *, const fk_stream *);

static fk_status axpby_op(const fk_buffer *a, const fk_buffer *b, fk_buffer *out, const fk_stream *s)
{
    return fk_axpby(real_scalar(AXPBY_ALPHA), a, real_scalar(AXPBY_BETA), b, out, s);
}

static fk_status scalar_add_op(const fk_buffer *a, fk_buffer *out, const fk_stream *s)
{
    return fk_scalar_add(a, real_scalar(SCALAR_ADD_S), out, s);
}

static fk_status scalar_mul_op(const fk_buffer *a, fk_buffer *out, const fk_stream *s)
{
    return fk_scalar_mul(a, real_scalar(SCALAR_MUL_S), out, s);
}

/* The entry point of each op, indexed by enum binop / enum unop. */
static const binop_fn binop_run[N_BINOPS] = {fk_add, fk_sub, fk_mul, fk_div, axpby_op};
static const unop_fn unop_run[N_UNOPS] = {fk_neg,  fk_abs,     fk_exp,        fk_log,        fk_sqrt,
                                          fk_sin,  fk_cos,     fk_tanh,       fk_sigmoid,    fk_relu,
                                          scalar_add_op, scalar_mul_op, fk_copy};

/* The double-precision reference of each op. */
static double ref_binop(int op, double a, double b)
{
    switch (op) {
    case OP_ADD:
        return a + b;
    case OP_SUB:
        return a - b;
    case OP_MUL:
        return a * b;
    case OP_DIV:
        return a / b;
    default:
        return AXPBY_ALPHA * a + AXPBY_BETA * b;
    }
}

static double ref_neg(double a)
{
    return -a;
}

static double ref_sigmoid(double a)
{
    return 1.0 / (1.0 + exp(-a));
}

static double ref_relu(double a)
{
    return a > 0.0 ? a : 0.0;
}

static double ref_scalar_add(double a)
{
    return a + SCALAR_ADD_S;
}

static double ref_scalar_mul(double a)
{
    return a * SCALAR_MUL_S;
}

static double ref_copy(double a)
{
    return a;
}

static double (*const unop_ref[N_UNOPS])(double) = {
    ref_neg, fabs, exp, log, sqrt, sin, cos, tanh, ref_sigmoid, ref_relu, ref_scalar_add, ref_scalar_mul, ref_copy};

/* An operand: a buffer (possibly a strided view), its shape and strides, and the
 * host copy of the memory it views (`host` at element `off` is element 0). */
typedef struct {
    fk_buffer *buf;
    int nd;
    int64_t shape[4];
    int64_t strides[4];
    const double *host;
    int64_t off;
} operand;

static double operand_at(const operand *o, int64_t lin, int nd_out, const int64_t *out_shape)
{
    return o->host[o->off + bcast_offset(lin, nd_out, out_shape, o->nd, o->shape, o->strides)];
}

/* Runs an op into a fresh poisoned output and compares with the reference: the binary
 * op `op` on a and b, or, with b NULL, the unary op `op` on a. */
static void check_op(fk_dtype dt, int op, const operand *a, const operand *b, int nd,
                     const int64_t *out_shape, const fk_stream *s, const char *layout)
{
    int64_t n = numel_of(nd, out_shape), i;
    double *ref = (double *)malloc((size_t)n * sizeof(double));
    double *got = (double *)malloc((size_t)n * sizeof(double));
    fk_buffer *out = new_poisoned(dt, nd, out_shape);
    char what[160];
    fk_status st;
    sprintf(what, "%s %s %s", dt_name(dt), b != NULL ? binop_names[op] : unop_names[op], layout);
    if (out != NULL) {
        st = b != NULL ? binop_run[op](a->buf, b->buf, out, s) : unop_run[op](a->buf, out, s);
        /* an owned CUDA stream does not order with the legacy default stream used by
         * the blocking copy below: synchronise it first */
        if (st == FK_OK && s != NULL)
            st = fk_stream_synchronize(s);
        if (st != FK_OK) {
            check(0, "%s: %s: %s", what, fk_status_string(st), last_msg());
        } else if (read_real(out, dt, got, (size_t)n)) {
            for (i = 0; i < n; i++) {
                double x = operand_at(a, i, nd, out_shape);
                ref[i] = round_to(dt, b != NULL ? ref_binop(op, x, operand_at(b, i, nd, out_shape))
                                                : unop_ref[op](x));
            }
            compare(what, got, ref, (size_t)n, tol_for(dt));
        }
    }
    fk_buffer_destroy(out);
    free(ref);
    free(got);
}

static void check_binary(fk_dtype dt, int op, const operand *a, const operand *b, int nd,
                         const int64_t *out_shape, const fk_stream *s, const char *layout)
{
    check_op(dt, op, a, b, nd, out_shape, s, layout);
}

static void check_unary(fk_dtype dt, int op, const operand *a, int nd, const int64_t *out_shape,
                        const fk_stream *s, const char *layout)
{
    check_op(dt, op, a, NULL, nd, out_shape, s, layout);
}

static void set_operand(operand *o, fk_buffer *buf, int nd, const int64_t *shape,
                        const int64_t *strides, const double *host, int64_t off)
{
    int d;
    o->buf = buf;
    o->nd = nd;
    for (d = 0; d < nd; d++) {
        o->shape[d] = shape[d];
        o->strides[d] = strides[d];
    }
    o->host = host;
    o->off = off;
}

#define BASE_N 80

static void test_real_ops(fk_dtype dt)
{
    double mixed[BASE_N], pos[BASE_N], bvals[3];
    int64_t base_shape[1] = {BASE_N};
    fk_buffer *mixed_base = NULL, *pos_base = NULL, *col_base = NULL, *bbuf = NULL, *row = NULL;
    fk_buffer *mview = NULL, *pview = NULL, *colview = NULL;
    operand ma, pa, bb, rowop, colop;
    /* strided view: shape [4,3,5], strides [20,1,2] into 80 elements (max offset 70) */
    int64_t vshape[3] = {4, 3, 5}, vstrides[3] = {20, 1, 2};
    int64_t bshape[2] = {3, 1}, bstrides[2] = {1, 1};
    int64_t rshape[1] = {5}, rstrides[1] = {1};
    /* negative-stride column: shape [4,1], strides [-2,1], element 0 at offset 7 */
    int64_t cshape[2] = {4, 1}, cstrides[2] = {-2, 1};
    int64_t out2[2] = {4, 5};
    int64_t colbase_shape[1] = {8};
    double colhost[8];
    fk_stream *s = NULL;
    int i, op;

    for (i = 0; i < BASE_N; i++) {
        mixed[i] = round_to(dt, 2.0 * sin(0.37 * i + 0.1));
        pos[i] = round_to(dt, 0.25 + 1.25 * (1.0 + sin(0.71 * i + 0.3)));
    }
    bvals[0] = 0.75;
    bvals[1] = -1.25;
    bvals[2] = 1.5;
    for (i = 0; i < 8; i++)
        colhost[i] = round_to(dt, (i % 2 ? 1.0 : -1.0) * (0.5 + 0.125 * i));

    mixed_base = new_real(dt, 1, base_shape, mixed);
    pos_base = new_real(dt, 1, base_shape, pos);
    bbuf = new_real(dt, 2, bshape, bvals);
    row = new_real(dt, 1, rshape, mixed + 11);
    col_base = new_real(dt, 1, colbase_shape, colhost);
    if (!mixed_base || !pos_base || !bbuf || !row || !col_base)
        goto done;
    mview = wrap_view(mixed_base, 0, dt, 3, vshape, vstrides);
    pview = wrap_view(pos_base, 0, dt, 3, vshape, vstrides);
    colview = wrap_view(col_base, 7, dt, 2, cshape, cstrides);
    if (!mview || !pview || !colview)
        goto done;
    set_operand(&ma, mview, 3, vshape, vstrides, mixed, 0);
    set_operand(&pa, pview, 3, vshape, vstrides, pos, 0);
    set_operand(&bb, bbuf, 2, bshape, bstrides, bvals, 0);
    set_operand(&rowop, row, 1, rshape, rstrides, mixed + 11, 0);
    set_operand(&colop, colview, 2, cshape, cstrides, colhost, 7);
    {
        int32_t contig = -1;
        fk_buffer_is_contiguous(mview, &contig);
        check(contig == 0, "%s: input view [4,3,5] strides [20,1,2] is non-contiguous", dt_name(dt));
    }
    if (!expect_ok(fk_stream_create(g_ctx, &s), "stream for ops"))
        s = NULL;

    for (op = 0; op < N_BINOPS; op++) {
        /* strided a [4,3,5] with b [3,1] broadcast */
        check_binary(dt, op, &ma, &bb, 3, vshape, NULL, "strided[4,3,5] x bcast[3,1]");
        /* row [5] with a negative-stride column [4,1] -> [4,5], on an owned stream */
        check_binary(dt, op, &rowop, &colop, 2, out2, s, "row[5] x negstride col[4,1] (stream)");
    }
    for (op = 0; op < N_UNOPS; op++) {
        const operand *in = (op == OP_LOG || op == OP_SQRT) ? &pa : &ma;
        check_unary(dt, op, in, 3, vshape, NULL, "strided[4,3,5]");
    }
    /* unary broadcasting: [5] -> [4,5] */
    check_unary(dt, OP_COPY, &rowop, 2, out2, s, "bcast row[5]->[4,5] (stream)");
    check_unary(dt, OP_EXP, &rowop, 2, out2, NULL, "bcast row[5]->[4,5]");
    check_unary(dt, OP_SCALAR_MUL, &colop, 2, out2, NULL, "bcast negstride col[4,1]->[4,5]");

    /* 0-d operand broadcasting against [4,5] */
    {
        double sv = 0.5;
        fk_buffer *zb = new_real(dt, 0, NULL, &sv);
        operand zo;
        if (zb != NULL) {
            set_operand(&zo, zb, 0, NULL, NULL, &sv, 0);
            check_binary(dt, OP_SUB, &rowop, &zo, 1, rshape, NULL, "row[5] - 0-d scalar -> [5]");
            check_binary(dt, OP_MUL, &zo, &colop, 2, cshape, NULL,
                         "0-d scalar * negstride col[4,1] -> [4,1]");
            check_unary(dt, OP_COPY, &zo, 2, out2, NULL, "0-d -> [4,5] broadcast copy");
            fk_buffer_destroy(zb);
        }
    }
    if (s != NULL)
        expect_ok(fk_stream_synchronize(s), "synchronize op stream");

    /* IEEE division by zero and NaN propagation */
    {
        double num[4] = {1.0, -1.0, 0.0, 2.0}, den[4] = {0.0, 0.0, 0.0, 4.0};
        double ref[4], got[4];
        double rin[4], rref[4];
        int64_t sh[1] = {4};
        fk_buffer *x = new_real(dt, 1, sh, num), *y = new_real(dt, 1, sh, den);
        fk_buffer *o = new_poisoned(dt, 1, sh);
        ref[0] = INFINITY;
        ref[1] = -INFINITY;
        ref[2] = NAN;
        ref[3] = 0.5;
        if (x && y && o && expect_ok(fk_div(x, y, o, NULL), "div by zero call") &&
            read_real(o, dt, got, 4))
            compare(dt == FK_DTYPE_F32 ? "f32 div by zero gives inf/-inf/NaN (IEEE)"
                                       : "f64 div by zero gives inf/-inf/NaN (IEEE)",
                    got, ref, 4, 0.0);
        fk_buffer_destroy(x);
        rin[0] = -1.0;
        rin[1] = 0.0;
        rin[2] = 2.0;
        rin[3] = NAN;
        rref[0] = 0.0;
        rref[1] = 0.0;
        rref[2] = 2.0;
        rref[3] = NAN;
        x = new_real(dt, 1, sh, rin);
        if (x && o && expect_ok(fk_relu(x, o, NULL), "relu with NaN call") && read_real(o, dt, got, 4))
            compare(dt == FK_DTYPE_F32 ? "f32 relu propagates NaN" : "f64 relu propagates NaN", got,
                    rref, 4, 0.0);
        fk_buffer_destroy(x);
        fk_buffer_destroy(y);
        fk_buffer_destroy(o);
    }

    /* in place: out is exactly a (same handle), and a second handle on the same view */
    {
        double xv[20], yv[5], got[20], ref[20];
        int64_t sh[2] = {4, 5};
        fk_buffer *x, *y, *x2 = NULL;
        for (i = 0; i < 20; i++)
            xv[i] = round_to(dt, 0.1 * i - 1.0);
        for (i = 0; i < 5; i++)
            yv[i] = round_to(dt, 1.0 + i);
        x = new_real(dt, 2, sh, xv);
        y = new_real(dt, 1, rshape, yv);
        if (x && y && expect_ok(fk_add(x, y, x, NULL), "in-place add (out == a handle)") &&
            read_real(x, dt, got, 20)) {
            for (i = 0; i < 20; i++)
                ref[i] = round_to(dt, xv[i] + yv[i % 5]);
            compare(dt == FK_DTYPE_F32 ? "f32 in-place add x += y[bcast]" : "f64 in-place add x += y[bcast]",
                    got, ref, 20, tol_for(dt));
            x2 = wrap_view(x, 0, dt, 2, sh, NULL);
            if (x2 && expect_ok(fk_mul(x, y, x2, NULL), "in-place mul via a second identical view") &&
                read_real(x, dt, got, 20)) {
                for (i = 0; i < 20; i++)
                    ref[i] = round_to(dt, ref[i] * yv[i % 5]);
                compare(dt == FK_DTYPE_F32 ? "f32 in-place mul via identical view"
                                           : "f64 in-place mul via identical view",
                        got, ref, 20, tol_for(dt));
            }
            if (x2 && expect_ok(fk_exp(x2, x, NULL), "in-place exp (distinct handles, same view)"))
                check(1, "in-place unary accepted");
        }
        fk_buffer_destroy(x2);
        fk_buffer_destroy(x);
        fk_buffer_destroy(y);
    }

done:
    fk_stream_destroy(s);
    fk_buffer_destroy(mview);
    fk_buffer_destroy(pview);
    fk_buffer_destroy(colview);
    fk_buffer_destroy(mixed_base);
    fk_buffer_destroy(pos_base);
    fk_buffer_destroy(bbuf);
    fk_buffer_destroy(row);
    fk_buffer_destroy(col_base);
}

/* ------------------------------------------------------------------ complex64 */

static void test_complex64(void)
{
    /* interleaved (re, im) pairs */
    float a[12] = {1.0f, 2.0f, -3.0f, 0.5f, 0.0f, -1.0f, 2.5f, 0.0f, 1e3f, -2e3f, -0.75f, -0.25f};
    float b[12] = {0.5f, -1.0f, 2.0f, 2.0f, 0.0f, 3.0f, -4.0f, 0.0f, 3e-3f, 1e-3f, 1.0f, 1.0f};
    int64_t sh[1] = {6};
    fk_buffer *A = new_buffer(FK_DTYPE_C64, 1, sh, a);
    fk_buffer *B = new_buffer(FK_DTYPE_C64, 1, sh, b);
    fk_buffer *O = new_poisoned(FK_DTYPE_C64, 1, sh);
    fk_buffer *R = new_poisoned(FK_DTYPE_F32, 1, sh);
    float host[12];
    double got[12], ref[12];
    int i;

    if (!A || !B || !O || !R)
        goto done;
    if (expect_ok(fk_mul(A, B, O, NULL), "c64 mul call") &&
        expect_ok(fk_buffer_copy_to_host(O, host, sizeof host, NULL), "c64 mul copy back")) {
        for (i = 0; i < 6; i++) {
            double ar = a[2 * i], ai = a[2 * i + 1], br = b[2 * i], bi = b[2 * i + 1];
            ref[2 * i] = ar * br - ai * bi;
            ref[2 * i + 1] = ar * bi + ai * br;
        }
        for (i = 0; i < 12; i++)
            got[i] = host[i];
        compare("c64 mul (re, im)", got, ref, 12, 1e-5);
    }
    if (expect_ok(fk_div(A, B, O, NULL), "c64 div call") &&
        expect_ok(fk_buffer_copy_to_host(O, host, sizeof host, NULL), "c64 div copy back")) {
        for (i = 0; i < 6; i++) {
            double ar = a[2 * i], ai = a[2 * i + 1], br = b[2 * i], bi = b[2 * i + 1];
            double d = br * br + bi * bi;
            ref[2 * i] = (ar * br + ai * bi) / d;
            ref[2 * i + 1] = (ai * br - ar * bi) / d;
        }
        for (i = 0; i < 12; i++)
            got[i] = host[i];
        /* error relative to |a/b| of the element */
        {
            int ok = 1;
            for (i = 0; i < 6; i++) {
                double mag = sqrt(ref[2 * i] * ref[2 * i] + ref[2 * i + 1] * ref[2 * i + 1]);
                double err = hypot(got[2 * i] - ref[2 * i], got[2 * i + 1] - ref[2 * i + 1]) /
                             (mag > 1.0 ? mag : 1.0);
                if (!(err <= 1e-5)) {
                    ok = 0;
                    check(0, "c64 div element %d: (%g, %g), expected (%g, %g)", i, got[2 * i],
                          got[2 * i + 1], ref[2 * i], ref[2 * i + 1]);
                }
            }
            if (ok)
                check(1, "c64 div (re, im) incl. large/small magnitudes");
        }
    }
    if (expect_ok(fk_abs(A, R, NULL), "c64 abs call (out f32)")) {
        float r[6];
        if (expect_ok(fk_buffer_copy_to_host(R, r, sizeof r, NULL), "c64 abs copy back")) {
            for (i = 0; i < 6; i++) {
                got[i] = r[i];
                ref[i] = hypot(a[2 * i], a[2 * i + 1]);
            }
            compare("c64 abs is the real magnitude", got, ref, 6, 1e-6);
        }
    }
    /* complex add with a broadcast [1] operand, and complex scalar_mul by i */
    {
        int64_t one[1] = {1};
        float c[2] = {0.5f, -0.5f};
        fk_buffer *C = new_buffer(FK_DTYPE_C64, 1, one, c);
        fk_scalar iu;
        iu.re = 0.0;
        iu.im = 1.0;
        if (C && expect_ok(fk_add(A, C, O, NULL), "c64 add with broadcast [1]") &&
            fk_buffer_copy_to_host(O, host, sizeof host, NULL) == FK_OK) {
            for (i = 0; i < 6; i++) {
                ref[2 * i] = (double)a[2 * i] + c[0];
                ref[2 * i + 1] = (double)a[2 * i + 1] + c[1];
            }
            for (i = 0; i < 12; i++)
                got[i] = host[i];
            compare("c64 add broadcast", got, ref, 12, 1e-6);
        }
        if (expect_ok(fk_scalar_mul(A, iu, O, NULL), "c64 scalar_mul by i") &&
            fk_buffer_copy_to_host(O, host, sizeof host, NULL) == FK_OK) {
            for (i = 0; i < 6; i++) {
                ref[2 * i] = -(double)a[2 * i + 1];
                ref[2 * i + 1] = a[2 * i];
            }
            for (i = 0; i < 12; i++)
                got[i] = host[i];
            compare("c64 scalar_mul by i rotates", got, ref, 12, 1e-6);
        }
        fk_buffer_destroy(C);
    }
    /* complex-specific errors */
    expect_err(fk_abs(A, O, NULL), FK_ERROR_DTYPE_MISMATCH, "c64 abs into c64 out", "fk_abs", "out",
               (const char *)NULL);
    expect_err(fk_relu(A, O, NULL), FK_ERROR_UNSUPPORTED_DTYPE, "c64 relu", "fk_relu", "relu",
               (const char *)NULL);
done:
    fk_buffer_destroy(A);
    fk_buffer_destroy(B);
    fk_buffer_destroy(O);
    fk_buffer_destroy(R);
}

/* ------------------------------------------------------------------ half types (exact values) */

static void test_half(void)
{
    /* f16: 1 + 2 = 3, 0.5 + 0.5 = 1, -3 + 1 = -2, 2 + 0.25 = 2.25 */
    uint16_t fa[4] = {0x3C00, 0x3800, 0xC200, 0x4000};
    uint16_t fb[4] = {0x4000, 0x3800, 0x3C00, 0x3400};
    uint16_t fr[4] = {0x4200, 0x3C00, 0xC000, 0x4080};
    /* bf16: the same values (upper halves of the binary32 encodings) */
    uint16_t ba[4] = {0x3F80, 0x3F00, 0xC040, 0x4000};
    uint16_t bb[4] = {0x4000, 0x3F00, 0x3F80, 0x3E80};
    uint16_t br[4] = {0x4040, 0x3F80, 0xC000, 0x4010};
    int64_t sh[1] = {4};
    uint16_t got[4];
    int k;
    for (k = 0; k < 2; k++) {
        fk_dtype dt = k == 0 ? FK_DTYPE_F16 : FK_DTYPE_BF16;
        fk_buffer *A = new_buffer(dt, 1, sh, k == 0 ? fa : ba);
        fk_buffer *B = new_buffer(dt, 1, sh, k == 0 ? fb : bb);
        fk_buffer *O = new_buffer(dt, 1, sh, NULL);
        const uint16_t *want = k == 0 ? fr : br;
        if (A && B && O && expect_ok(fk_add(A, B, O, NULL), k == 0 ? "f16 add call" : "bf16 add call") &&
            fk_buffer_copy_to_host(O, got, sizeof got, NULL) == FK_OK)
            check(memcmp(got, want, sizeof got) == 0, "%s add exact: %04x %04x %04x %04x",
                  dt_name(dt), got[0], got[1], got[2], got[3]);
        fk_buffer_destroy(A);
        fk_buffer_destroy(B);
        fk_buffer_destroy(O);
    }
}

/* ------------------------------------------------------------------ bad inputs */

static void test_bad_inputs(void)
{
    int64_t sa[2] = {4, 5}, sb[1] = {5}, sbad[1] = {3}, so_bad[2] = {4, 4};
    double v[20];
    fk_buffer *a, *b, *o, *bd = NULL, *od = NULL, *obad = NULL, *shifted = NULL, *zero_stride = NULL;
    fk_scalar cplx;
    int i;
    for (i = 0; i < 20; i++)
        v[i] = i;
    a = new_real(FK_DTYPE_F32, 2, sa, v);
    b = new_real(FK_DTYPE_F32, 1, sb, v);
    o = new_real(FK_DTYPE_F32, 2, sa, v);
    bd = new_real(FK_DTYPE_F64, 1, sb, v);
    od = new_real(FK_DTYPE_F64, 2, sa, v);
    if (!a || !b || !o || !bd || !od)
        goto done;

    /* NULL handles */
    expect_err(fk_add(NULL, b, o, NULL), FK_ERROR_NULL_POINTER, "fk_add(a NULL)", "fk_add: ",
               "a is NULL", (const char *)NULL);
    expect_err(fk_sub(a, NULL, o, NULL), FK_ERROR_NULL_POINTER, "fk_sub(b NULL)", "fk_sub: ",
               "b is NULL", (const char *)NULL);
    expect_err(fk_mul(a, b, NULL, NULL), FK_ERROR_NULL_POINTER, "fk_mul(out NULL)", "fk_mul: ",
               "out is NULL", (const char *)NULL);
    expect_err(fk_axpby(real_scalar(1), a, real_scalar(1), NULL, o, NULL), FK_ERROR_NULL_POINTER,
               "fk_axpby(b NULL)", "fk_axpby: ", "b is NULL", (const char *)NULL);
    expect_err(fk_exp(NULL, o, NULL), FK_ERROR_NULL_POINTER, "fk_exp(a NULL)", "fk_exp: ",
               "a is NULL", (const char *)NULL);
    expect_err(fk_scalar_add(a, real_scalar(1), NULL, NULL), FK_ERROR_NULL_POINTER,
               "fk_scalar_add(out NULL)", "fk_scalar_add: ", "out is NULL", (const char *)NULL);
    expect_err(fk_add((const fk_buffer *)(const void *)g_ctx, b, o, NULL), FK_ERROR_INVALID_ARGUMENT,
               "fk_add(a is a context handle)", "not a live fk_buffer", (const char *)NULL);

    /* shape mismatch */
    obad = new_poisoned(FK_DTYPE_F32, 2, so_bad);
    if (obad != NULL) {
        expect_err(fk_add(a, b, obad, NULL), FK_ERROR_SHAPE_MISMATCH, "fk_add(out [4,4] for [4,5])",
                   "fk_add", "out has shape [4, 4]", (const char *)NULL);
        expect_err(fk_neg(a, obad, NULL), FK_ERROR_SHAPE_MISMATCH, "fk_neg(out [4,4] for a [4,5])",
                   "fk_neg", "a does not broadcast to out", "[4, 4]", (const char *)NULL);
        fk_buffer_destroy(obad);
    }
    obad = new_poisoned(FK_DTYPE_F32, 1, sbad);
    if (obad != NULL) {
        expect_err(fk_mul(a, obad, o, NULL), FK_ERROR_SHAPE_MISMATCH, "fk_mul([4,5] x [3])",
                   "fk_mul", "a and b do not broadcast", "cannot be broadcast", (const char *)NULL);
        expect_err(fk_copy(obad, o, NULL), FK_ERROR_SHAPE_MISMATCH, "fk_copy([3] -> [4,5])",
                   "fk_copy", "a does not broadcast to out", (const char *)NULL);
        fk_buffer_destroy(obad);
    }

    /* dtype mismatch */
    expect_err(fk_add(a, bd, o, NULL), FK_ERROR_DTYPE_MISMATCH, "fk_add(f32, f64 -> f32)", "fk_add",
               "dtypes differ", (const char *)NULL);
    expect_err(fk_div(a, b, od, NULL), FK_ERROR_DTYPE_MISMATCH, "fk_div(f32, f32 -> f64)", "fk_div",
               "dtypes differ", (const char *)NULL);
    expect_err(fk_sqrt(a, od, NULL), FK_ERROR_DTYPE_MISMATCH, "fk_sqrt(f32 -> f64)", "fk_sqrt",
               "out has dtype", (const char *)NULL);

    /* imaginary scalar for a real dtype */
    cplx.re = 1.0;
    cplx.im = 0.5;
    expect_err(fk_scalar_add(a, cplx, o, NULL), FK_ERROR_INVALID_ARGUMENT,
               "fk_scalar_add(real dtype, imaginary scalar)", "fk_scalar_add", "imaginary",
               (const char *)NULL);
    expect_err(fk_axpby(real_scalar(1), a, cplx, b, o, NULL), FK_ERROR_INVALID_ARGUMENT,
               "fk_axpby(real dtype, imaginary beta)", "beta", (const char *)NULL);

    /* aliasing: out is a view of a shifted by one element (partial overlap) */
    {
        int64_t sh[1] = {19};
        fk_buffer *a1 = wrap_view(a, 0, FK_DTYPE_F32, 1, sh, NULL);
        shifted = wrap_view(a, 1, FK_DTYPE_F32, 1, sh, NULL);
        if (a1 && shifted) {
            expect_err(fk_neg(a1, shifted, NULL), FK_ERROR_ALIASING, "fk_neg(out = a shifted by 1)",
                       "fk_neg", "overlaps a", (const char *)NULL);
            expect_err(fk_add(b, a1, shifted, NULL), FK_ERROR_SHAPE_MISMATCH,
                       "fk_add([5], [19] -> shifted [19]) is a shape error", "fk_add", (const char *)NULL);
            expect_err(fk_add(a1, a1, shifted, NULL), FK_ERROR_ALIASING,
                       "fk_add(out overlaps a and b)", "overlaps", (const char *)NULL);
        }
        fk_buffer_destroy(a1);
    }
    {
        /* out overlapping b only: b = row 1 of a ([5]), out = a viewed with a [4,5] shifted window */
        int64_t sh[1] = {5};
        fk_buffer *brow = wrap_view(a, 5, FK_DTYPE_F32, 1, sh, NULL);
        fk_buffer *orow = wrap_view(a, 7, FK_DTYPE_F32, 1, sh, NULL);
        if (brow && orow)
            expect_err(fk_sub(b, brow, orow, NULL), FK_ERROR_ALIASING, "fk_sub(out overlaps b)",
                       "overlaps b", (const char *)NULL);
        fk_buffer_destroy(brow);
        fk_buffer_destroy(orow);
    }
    /* self-overlapping output (stride 0) */
    {
        int64_t sh[2] = {4, 5}, st[2] = {0, 1};
        zero_stride = wrap_view(o, 0, FK_DTYPE_F32, 2, sh, st);
        if (zero_stride)
            expect_err(fk_add(a, b, zero_stride, NULL), FK_ERROR_INVALID_ARGUMENT,
                       "fk_add(out with a zero stride)", "self-overlap", (const char *)NULL);
    }
    /* a broadcast (stride 0) input is fine */
    if (zero_stride) {
        double got[20], ref[20];
        int j;
        fk_buffer *o2 = new_poisoned(FK_DTYPE_F32, 2, sa);
        if (o2 && expect_ok(fk_add(zero_stride, b, o2, NULL), "stride-0 input accepted") &&
            read_real(o2, FK_DTYPE_F32, got, 20)) {
            for (j = 0; j < 20; j++)
                ref[j] = v[j % 5] + v[j % 5];
            compare("f32 add with a stride-0 (broadcast view) input", got, ref, 20, 1e-6);
        }
        fk_buffer_destroy(o2);
    }

done:
    fk_buffer_destroy(zero_stride);
    fk_buffer_destroy(shifted);
    fk_buffer_destroy(a);
    fk_buffer_destroy(b);
    fk_buffer_destroy(o);
    fk_buffer_destroy(bd);
    fk_buffer_destroy(od);
}

/* CUDA only: buffers and streams of different devices are refused. */
static void test_device_mismatch(void)
{
    fk_context *cpu = NULL;
    fk_buffer *hb = NULL, *db = NULL, *dout = NULL;
    fk_stream *hs = NULL;
    int64_t sh[1] = {8};
    if (g_actual != FK_DEVICE_CUDA)
        return;
    if (!expect_ok(fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, &cpu), "CPU context beside CUDA"))
        return;
    fk_buffer_create(cpu, FK_DTYPE_F32, 1, sh, NULL, &hb);
    fk_stream_create(cpu, &hs);
    db = new_poisoned(FK_DTYPE_F32, 1, sh);
    dout = new_poisoned(FK_DTYPE_F32, 1, sh);
    if (hb && db && dout && hs) {
        expect_err(fk_add(hb, db, dout, NULL), FK_ERROR_DEVICE_MISMATCH, "fk_add(a on CPU, out on CUDA)",
                   "fk_add", "a is on cpu", (const char *)NULL);
        expect_err(fk_exp(db, dout, hs), FK_ERROR_DEVICE_MISMATCH, "fk_exp on a CPU stream",
                   "fk_exp", (const char *)NULL);
    }
    fk_buffer_destroy(hb);
    fk_buffer_destroy(db);
    fk_buffer_destroy(dout);
    fk_stream_destroy(hs);
    fk_context_destroy(cpu);
}

/* ------------------------------------------------------------------ main */

/* ------------------------------------------------------------------ CUDA graph capture */

/* The few CUDA driver calls the capture test needs, loaded from libcuda.so.1 at run
 * time (the C tests build without a CUDA toolkit: no cuda.h). */
typedef int cu_result;
typedef void *cu_stream;
typedef void *cu_graph;
typedef void *cu_graph_exec;
static struct {
    cu_result (*init)(unsigned);
    cu_result (*stream_create)(cu_stream *, unsigned);
    cu_result (*stream_destroy)(cu_stream);
    cu_result (*stream_sync)(cu_stream);
    cu_result (*begin_capture)(cu_stream, int);
    cu_result (*end_capture)(cu_stream, cu_graph *);
    cu_result (*instantiate)(cu_graph_exec *, cu_graph, unsigned long long);
    cu_result (*launch)(cu_graph_exec, cu_stream);
    cu_result (*exec_destroy)(cu_graph_exec);
    cu_result (*graph_destroy)(cu_graph);
} cu;

static int cu_sym(void *lib, const char *name, void *fp, size_t size)
{
    void *sym = dlsym(lib, name);
    if (sym == NULL)
        return 0;
    memcpy(fp, &sym, size); /* object to function pointer, as POSIX allows */
    return 1;
}

static int cu_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return 0;
    return cu_sym(lib, "cuInit", &cu.init, sizeof cu.init) &&
           cu_sym(lib, "cuStreamCreate", &cu.stream_create, sizeof cu.stream_create) &&
           cu_sym(lib, "cuStreamDestroy_v2", &cu.stream_destroy, sizeof cu.stream_destroy) &&
           cu_sym(lib, "cuStreamSynchronize", &cu.stream_sync, sizeof cu.stream_sync) &&
           cu_sym(lib, "cuStreamBeginCapture_v2", &cu.begin_capture, sizeof cu.begin_capture) &&
           cu_sym(lib, "cuStreamEndCapture", &cu.end_capture, sizeof cu.end_capture) &&
           cu_sym(lib, "cuGraphInstantiateWithFlags", &cu.instantiate, sizeof cu.instantiate) &&
           cu_sym(lib, "cuGraphLaunch", &cu.launch, sizeof cu.launch) &&
           cu_sym(lib, "cuGraphExecDestroy", &cu.exec_destroy, sizeof cu.exec_destroy) &&
           cu_sym(lib, "cuGraphDestroy", &cu.graph_destroy, sizeof cu.graph_destroy);
}

static uint64_t g_cap_rng = 0x9E3779B97F4A7C15ull;
static float cap_rand(void)
{
    g_cap_rng = g_cap_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_cap_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

enum { CAP_M = 37, CAP_K = 24, CAP_N = 19, CAP_BUFS = 9 };
/* x, w, b, dy (inputs); y, dx, dw, db, sum (outputs) */
static const int64_t cap_shapes[CAP_BUFS][2] = {{CAP_M, CAP_K}, {CAP_N, CAP_K}, {CAP_N, 1}, {CAP_M, CAP_N},
                                                {CAP_M, CAP_N}, {CAP_M, CAP_K}, {CAP_N, CAP_K}, {CAP_N, 1},
                                                {CAP_M, CAP_N}};

static size_t cap_numel(int i)
{
    return (size_t)(cap_shapes[i][0] * cap_shapes[i][1]);
}

static fk_status cap_make(fk_context *ctx, fk_stream *s, fk_buffer **b)
{
    int i;
    for (i = 0; i < CAP_BUFS; i++) {
        int nd = cap_shapes[i][1] == 1 ? 1 : 2;
        fk_status st = fk_buffer_create(ctx, FK_DTYPE_F32, nd, cap_shapes[i], s, &b[i]);
        if (st != FK_OK)
            return st;
    }
    return FK_OK;
}

/* linear forward (relu) + backward + add: the ops the capture records. */
static fk_status cap_ops(fk_buffer **b, fk_stream *s)
{
    fk_status st = fk_linear_forward(b[0], b[1], b[2], FK_ACT_RELU, b[4], NULL, s);
    if (st == FK_OK)
        st = fk_linear_backward(b[3], b[0], b[1], FK_ACT_RELU, b[4], b[5], b[6], b[7], s);
    if (st == FK_OK)
        st = fk_add(b[4], b[3], b[8], s);
    return st;
}

/* fk_linear_forward + fk_linear_backward + fk_add captured into a CUDA graph as the
 * very first ops of a new context on a fresh CUstream (global capture mode), then
 * replayed twice on new inputs and compared with the CPU context. */
static void test_graph_capture(void)
{
    fk_context *g = NULL, *c = NULL;
    fk_stream *s = NULL;
    cu_stream raw = NULL;
    cu_graph graph = NULL;
    cu_graph_exec exec = NULL;
    fk_buffer *gb[CAP_BUFS] = {0}, *cb[CAP_BUFS] = {0};
    float *host[CAP_BUFS] = {0}, *want = NULL;
    fk_status st;
    cu_result r;
    int i, replay;
    if (g_actual != FK_DEVICE_CUDA) {
        check(1, "graph capture: skipped (not running on CUDA)");
        return;
    }
    if (!cu_load() || cu.init(0) != 0) {
        check(0, "graph capture: libcuda.so.1 or one of its capture functions could not be loaded");
        return;
    }
    if (!expect_ok(fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, 0, &g), "graph capture: new CUDA context") ||
        !expect_ok(fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, &c), "graph capture: CPU context"))
        goto done;
    r = cu.stream_create(&raw, 1 /* CU_STREAM_NON_BLOCKING */);
    if (!check(r == 0, "graph capture: cuStreamCreate (%d)", r))
        goto done;
    if (!expect_ok(fk_stream_wrap(g, raw, &s), "graph capture: fk_stream_wrap of a fresh CUstream") ||
        !expect_ok(cap_make(g, s, gb), "graph capture: CUDA buffers") ||
        !expect_ok(cap_make(c, NULL, cb), "graph capture: CPU buffers") ||
        !expect_ok(fk_stream_synchronize(s), "graph capture: buffers ready"))
        goto done;
    for (i = 0; i < CAP_BUFS; i++)
        host[i] = (float *)malloc(cap_numel(i) * sizeof(float));
    want = (float *)malloc(CAP_M * CAP_K * sizeof(float));

    r = cu.begin_capture(raw, 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL */);
    if (!check(r == 0, "graph capture: cuStreamBeginCapture (%d)", r))
        goto done;
    st = cap_ops(gb, s);
    r = cu.end_capture(raw, &graph);
    expect_ok(st, "graph capture: fk_linear_forward + fk_linear_backward + fk_add as the first ops, inside the capture");
    if (!check(r == 0 && graph != NULL, "graph capture: cuStreamEndCapture (%d; nonzero: the capture was invalidated)", r))
        goto done;
    r = cu.instantiate(&exec, graph, 0);
    if (!check(r == 0, "graph capture: cuGraphInstantiateWithFlags (%d)", r))
        goto done;
    for (replay = 0; replay < 2; replay++) {
        int bad = 0;
        for (i = 0; i < 4; i++) {
            size_t j, n = cap_numel(i);
            for (j = 0; j < n; j++)
                host[i][j] = cap_rand();
            st = fk_buffer_copy_from_host(gb[i], host[i], n * sizeof(float), s);
            if (st == FK_OK)
                st = fk_buffer_copy_from_host(cb[i], host[i], n * sizeof(float), NULL);
            if (st != FK_OK)
                bad = 1;
        }
        for (i = 4; i < CAP_BUFS && !bad; i++) {
            size_t n = cap_numel(i);
            memset(host[i], 0xFF, n * sizeof(float)); /* NaN: only the graph makes it right */
            if (fk_buffer_copy_from_host(gb[i], host[i], n * sizeof(float), s) != FK_OK)
                bad = 1;
        }
        if (!check(!bad, "graph capture: new inputs, replay %d", replay))
            goto done;
        r = cu.launch(exec, raw);
        if (!check(r == 0 && cu.stream_sync(raw) == 0, "graph capture: cuGraphLaunch, replay %d (%d)", replay, r))
            goto done;
        if (!expect_ok(cap_ops(cb, NULL), "graph capture: the same ops on the CPU"))
            goto done;
        for (i = 4; i < CAP_BUFS; i++) {
            size_t j, n = cap_numel(i);
            double num = 0.0, den = 0.0;
            st = fk_buffer_copy_to_host(gb[i], host[i], n * sizeof(float), s);
            if (st == FK_OK)
                st = fk_buffer_copy_to_host(cb[i], want, n * sizeof(float), NULL);
            if (!expect_ok(st, "graph capture: read back"))
                goto done;
            for (j = 0; j < n; j++) {
                double d = (double)host[i][j] - (double)want[j];
                num += d * d;
                den += (double)want[j] * (double)want[j];
            }
            check(!isnan(num) && sqrt(num) <= 1e-4 * sqrt(den) + 1e-30,
                  "graph capture: replay %d output %d matches the CPU (rel err %.3g)", replay, i,
                  den > 0 ? sqrt(num / den) : sqrt(num));
        }
    }
done:
    if (exec != NULL)
        cu.exec_destroy(exec);
    if (graph != NULL)
        cu.graph_destroy(graph);
    for (i = 0; i < CAP_BUFS; i++) {
        fk_buffer_destroy(gb[i]);
        fk_buffer_destroy(cb[i]);
        free(host[i]);
    }
    free(want);
    fk_stream_destroy(s);
    if (raw != NULL) {
        cu.stream_sync(raw);
        cu.stream_destroy(raw);
    }
    fk_context_destroy(c);
    fk_context_destroy(g);
}

int main(int argc, char **argv)
{
    const char *dev = argc > 1 ? argv[1] : getenv("FK_TEST_DEVICE");
    if (dev == NULL || dev[0] == '\0')
        dev = "cpu";
    if (strcmp(dev, "cpu") == 0)
        g_kind = FK_DEVICE_CPU;
    else if (strcmp(dev, "cuda") == 0)
        g_kind = FK_DEVICE_CUDA;
    else if (strcmp(dev, "auto") == 0)
        g_kind = FK_DEVICE_AUTO;
    else {
        fprintf(stderr, "usage: %s [cpu|cuda|auto] (or FK_TEST_DEVICE); got \"%s\"\n", argv[0], dev);
        return 2;
    }
    printf("# fusekit C ABI test, device = %s, library %s\n", dev, fk_version_string());

    test_last_error(); /* first: it checks the message is empty before any failure */
    test_version();
    test_status_strings();
    test_dtypes();
    if (test_context()) {
        test_stream();
        test_buffers();
        test_dlpack();
        test_real_ops(FK_DTYPE_F32);
        test_real_ops(FK_DTYPE_F64);
        test_complex64();
        test_half();
        test_bad_inputs();
        test_device_mismatch();
        test_graph_capture();
        expect_ok(fk_context_destroy(g_ctx), "fk_context_destroy");
    }

    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
}
