/* An installed fusekit, used from C (tests/install/run.sh builds it through
 * pkg-config, shared and static): a CPU context, fk_add with broadcasting, the
 * values checked. argv[1], when given, is the expected version ("0.1.0"). */
#include <fusekit.h>

#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        fk_status s_ = (call);                                                             \
        if (s_ != FK_OK) {                                                                 \
            fprintf(stderr, "%s: %s: %s\n", #call, fk_status_string(s_), fk_last_error_message()); \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main(int argc, char **argv) {
    printf("%s, ABI %u\n", fk_version_string(), (unsigned)fk_abi_version());
    if (argc > 1) {
        char want[64];
        snprintf(want, sizeof want, "fusekit %s", argv[1]);
        if (strcmp(fk_version_string(), want) != 0) {
            fprintf(stderr, "version: library says '%s', expected '%s'\n", fk_version_string(), want);
            return 1;
        }
    }
    if (fk_abi_version() != FK_ABI_VERSION) {
        fprintf(stderr, "ABI: library %u, header %u\n", (unsigned)fk_abi_version(), (unsigned)FK_ABI_VERSION);
        return 1;
    }

    fk_context *ctx = NULL;
    CHECK(fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, &ctx));
    int64_t shape[2] = {2, 3}, row[1] = {3};
    float ha[6] = {1, 2, 3, 4, 5, 6}, hb[3] = {10, 20, 30}, hout[6] = {0};
    fk_buffer *a = NULL, *b = NULL, *out = NULL;
    CHECK(fk_buffer_create(ctx, FK_DTYPE_F32, 2, shape, NULL, &a));
    CHECK(fk_buffer_create(ctx, FK_DTYPE_F32, 1, row, NULL, &b));
    CHECK(fk_buffer_create(ctx, FK_DTYPE_F32, 2, shape, NULL, &out));
    CHECK(fk_buffer_copy_from_host(a, ha, sizeof ha, NULL));
    CHECK(fk_buffer_copy_from_host(b, hb, sizeof hb, NULL));
    CHECK(fk_add(a, b, out, NULL)); /* b broadcast over the rows */
    CHECK(fk_buffer_copy_to_host(out, hout, sizeof hout, NULL));

    int bad = 0;
    for (int i = 0; i < 6; i++) {
        float want = ha[i] + hb[i % 3];
        if (hout[i] != want) {
            fprintf(stderr, "out[%d] = %g, expected %g\n", i, (double)hout[i], (double)want);
            bad = 1;
        }
    }
    /* a mistake gives a status and a message */
    fk_status s = fk_add(a, out, b, NULL);
    if (s != FK_ERROR_SHAPE_MISMATCH || strlen(fk_last_error_message()) == 0) {
        fprintf(stderr, "fk_add with a wrong out shape returned %s\n", fk_status_string(s));
        bad = 1;
    }
    fk_buffer_destroy(a);
    fk_buffer_destroy(b);
    fk_buffer_destroy(out);
    fk_context_destroy(ctx);
    puts(bad ? "FAILED" : "fk_add: ok");
    return bad;
}
