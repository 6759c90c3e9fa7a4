// Runs the Kronecker kernels of kernels/linalg.cu on the CPU with the launch
// configurations src/cuda/linalg/kron.rs chooses, and checks every output element
// bit for bit against the same product computed directly, every byte around the
// output still poisoned (nothing written out of bounds), and every store aligned
// to its width (FK_CHECK_ALIGNED in linalg_common.cuh).
//
// Driven by the unit test `kron_kernel_in_the_cpu_emulator` (src/cuda/linalg/kron/tests.rs),
// which writes linalg.cu (the source NVRTC compiles) and this directory's
// linalg_common.cuh as common.cuh into a build directory, compiles this file with
// g++ and passes a file of cases, one per line:
//   kernel dtype batch m n p q sa0 sa1 sa2 sb0 sb1 sb2 a_mod b_mod out_mod
//   cols units rows s_blocks i_chunks tasks bs il uniform small gx gy bx by
// (*_mod: the pointer's address modulo 64; strides in elements, possibly negative
// or zero). The kernel has no barriers, so threads run one after another.
// Last line: "N passed, M failed".
#include "linalg.cu"

#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

typedef void (*Kernel)(KronArgs);

static const std::map<std::string, Kernel>& kernels() {
    static const std::map<std::string, Kernel> k = {
        {"kron_w8_f16", kron_w8_f16},   {"kron_w4_f16", kron_w4_f16},   {"kron_w2_f16", kron_w2_f16},
        {"kron_w1_f16", kron_w1_f16},   {"kron_w8_bf16", kron_w8_bf16}, {"kron_w4_bf16", kron_w4_bf16},
        {"kron_w2_bf16", kron_w2_bf16}, {"kron_w1_bf16", kron_w1_bf16}, {"kron_w4_f32", kron_w4_f32},
        {"kron_w2_f32", kron_w2_f32},   {"kron_w1_f32", kron_w1_f32},   {"kron_w2_f64", kron_w2_f64},
        {"kron_w1_f64", kron_w1_f64},   {"kron_w2_c64", kron_w2_c64},   {"kron_w1_c64", kron_w1_c64},
        {"kron_split_c64", kron_split_c64}, {"kron_w1_c128", kron_w1_c128},
        {"kron_split_c128", kron_split_c128},
    };
    return k;
}

struct Case {
    std::string kernel, dtype;
    i64 batch, m, n, p, q, sa[3], sb[3];
    i64 a_mod, b_mod, out_mod;
    KronArgs args;
    unsigned gx, gy, bx, by;
};

// Storage for an operand with `count` matrices (strides may be 0 or negative): the
// byte range it spans, its first element's address at `mod` modulo 64, the rest
// poisoned with 0xFF.
struct Storage {
    std::vector<unsigned char> bytes;
    unsigned char* origin = nullptr;  // element [0, 0, 0]
};

static Storage make_storage(i64 es, i64 count, i64 rows, i64 cols, const i64 s[3], i64 mod) {
    i64 lo = 0, hi = 0;
    const i64 dims[3] = {count, rows, cols};
    for (int d = 0; d < 3; ++d) {
        i64 span = (dims[d] - 1) * s[d];
        lo += span < 0 ? span : 0;
        hi += span > 0 ? span : 0;
    }
    Storage st;
    st.bytes.assign((size_t)((hi - lo + 1) * es + 256), 0xFF);
    uintptr_t base = (uintptr_t)st.bytes.data() + (uintptr_t)(-lo * es);
    uintptr_t origin = (base + 63) / 64 * 64 + (uintptr_t)mod;
    st.origin = (unsigned char*)origin;
    return st;
}

template <typename T> static bool same(const T& x, const T& y) { return std::memcmp(&x, &y, sizeof(T)) == 0; }

template <typename T> static T random_value(std::mt19937_64& r);
static double uni(std::mt19937_64& r) { return std::uniform_real_distribution<double>(-2, 2)(r); }
template <> f16 random_value<f16>(std::mt19937_64& r) { return from_compute<f16>((float)uni(r)); }
template <> bf16 random_value<bf16>(std::mt19937_64& r) { return from_compute<bf16>((float)uni(r)); }
template <> f32 random_value<f32>(std::mt19937_64& r) { return (float)uni(r); }
template <> f64 random_value<f64>(std::mt19937_64& r) { return uni(r); }
template <> c64 random_value<c64>(std::mt19937_64& r) { return cmake<c64>((float)uni(r), (float)uni(r)); }
template <> c128 random_value<c128>(std::mt19937_64& r) { return cmake<c128>(uni(r), uni(r)); }

template <typename T> static T load(const unsigned char* origin, i64 off) {
    T v;
    std::memcpy(&v, origin + off * (i64)sizeof(T), sizeof(T));
    return v;
}

template <typename T> static std::string run(Case& c, unsigned seed) {
    const i64 es = sizeof(T);
    std::mt19937_64 rng(seed);
    const i64 ba = c.sa[0] == 0 ? 1 : c.batch, bb = c.sb[0] == 0 ? 1 : c.batch;
    Storage sa = make_storage(es, ba, c.m, c.n, c.sa, c.a_mod);
    Storage sb = make_storage(es, bb, c.p, c.q, c.sb, c.b_mod);
    for (i64 x = 0; x < ba; ++x)
        for (i64 i = 0; i < c.m; ++i)
            for (i64 j = 0; j < c.n; ++j) {
                T v = random_value<T>(rng);
                std::memcpy(sa.origin + (x * c.sa[0] + i * c.sa[1] + j * c.sa[2]) * es, &v, es);
            }
    for (i64 x = 0; x < bb; ++x)
        for (i64 s = 0; s < c.p; ++s)
            for (i64 t = 0; t < c.q; ++t) {
                T v = random_value<T>(rng);
                std::memcpy(sb.origin + (x * c.sb[0] + s * c.sb[1] + t * c.sb[2]) * es, &v, es);
            }
    const i64 rows = c.batch * c.m * c.p, cols = c.n * c.q, total = rows * cols;
    const i64 guard = 64;
    std::vector<unsigned char> ob((size_t)(total * es + 2 * guard + 128), 0xFF);
    unsigned char* out = (unsigned char*)(((uintptr_t)ob.data() + guard + 63) / 64 * 64 + (uintptr_t)c.out_mod);
    KronArgs a = c.args;
    a.a = (u64)(uintptr_t)sa.origin;
    a.b = (u64)(uintptr_t)sb.origin;
    a.out = (u64)(uintptr_t)out;
    Kernel k = kernels().at(c.kernel);
    gridDim = Dim3{c.gx, c.gy, 1};
    blockDim = Dim3{c.bx, c.by, 1};
    for (unsigned y = 0; y < c.gy; ++y)
        for (unsigned x = 0; x < c.gx; ++x)
            for (unsigned ty = 0; ty < c.by; ++ty)
                for (unsigned tx = 0; tx < c.bx; ++tx) {
                    blockIdx = Dim3{x, y, 0};
                    threadIdx = Dim3{tx, ty, 0};
                    k(a);
                }
    // every element
    i64 bad = 0;
    std::string first;
    for (i64 x = 0; x < c.batch; ++x)
        for (i64 i = 0; i < c.m; ++i)
            for (i64 s = 0; s < c.p; ++s)
                for (i64 j = 0; j < c.n; ++j)
                    for (i64 t = 0; t < c.q; ++t) {
                        const i64 xa = c.sa[0] == 0 ? 0 : x, xb = c.sb[0] == 0 ? 0 : x;
                        T av = load<T>(sa.origin, xa * c.sa[0] + i * c.sa[1] + j * c.sa[2]);
                        T bv = load<T>(sb.origin, xb * c.sb[0] + s * c.sb[1] + t * c.sb[2]);
                        T want = from_compute<T>(to_compute(av) * to_compute(bv));
                        i64 o = ((x * c.m + i) * c.p + s) * cols + j * c.q + t;
                        T got = load<T>(out, o);
                        if (!same(got, want)) {
                            if (!bad) {
                                std::ostringstream m;
                                m << "element [" << x << ", " << i * c.p + s << ", " << j * c.q + t << "] differs";
                                first = m.str();
                            }
                            ++bad;
                        }
                    }
    if (bad) return first + " (" + std::to_string(bad) + " of " + std::to_string(total) + ")";
    for (unsigned char* p = ob.data(); p < out; ++p)
        if (*p != 0xFF) return "a byte before the output was written";
    for (unsigned char* p = out + total * es; p < ob.data() + ob.size(); ++p)
        if (*p != 0xFF) return "a byte after the output was written";
    return "";
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: kron_emu CASES_FILE\n");
        return 2;
    }
    std::ifstream f(argv[1]);
    std::string line;
    int passed = 0, failed = 0;
    unsigned seed = 1;
    while (std::getline(f, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream in(line);
        Case c{};
        KronArgs& a = c.args;
        in >> c.kernel >> c.dtype >> c.batch >> c.m >> c.n >> c.p >> c.q >> c.sa[0] >> c.sa[1] >> c.sa[2] >>
            c.sb[0] >> c.sb[1] >> c.sb[2] >> c.a_mod >> c.b_mod >> c.out_mod >> a.cols >> a.units >> a.rows >>
            a.s_blocks >> a.i_chunks >> a.tasks >> a.bs >> a.il >> a.uniform >> a.small >> c.gx >> c.gy >> c.bx >> c.by;
        if (!in) {
            std::fprintf(stderr, "unreadable case: %s\n", line.c_str());
            return 2;
        }
        a.batch = c.batch, a.m = c.m, a.n = c.n, a.p = c.p, a.q = c.q;
        a.sa0 = c.sa[0], a.sa1 = c.sa[1], a.sa2 = c.sa[2], a.sb0 = c.sb[0], a.sb1 = c.sb[1], a.sb2 = c.sb[2];
        std::string err;
        if (c.dtype == "f16") err = run<f16>(c, seed);
        else if (c.dtype == "bf16") err = run<bf16>(c, seed);
        else if (c.dtype == "f32") err = run<f32>(c, seed);
        else if (c.dtype == "f64") err = run<f64>(c, seed);
        else if (c.dtype == "c64") err = run<c64>(c, seed);
        else if (c.dtype == "c128") err = run<c128>(c, seed);
        else err = "unknown dtype " + c.dtype;
        ++seed;
        if (err.empty()) {
            ++passed;
        } else {
            ++failed;
            std::printf("FAIL %s: %s\n", line.c_str(), err.c_str());
        }
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
