// Tests of bindings/cpp/fusekit.hpp (C++17). Runs on the device named by argv[1] or
// FK_TEST_DEVICE (cpu, cuda, auto; default cpu). Prints one line per check and ends
// with "N passed, M failed"; exits non-zero on failure.
#include "fusekit.hpp"

#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

int g_pass = 0;
int g_fail = 0;

bool check(bool ok, const std::string& what) {
    std::printf("%s - %s\n", ok ? "ok  " : "FAIL", what.c_str());
    std::fflush(stdout);
    (ok ? g_pass : g_fail)++;
    return ok;
}

template <class T>
double diff(T a, T b) {
    return std::abs(a - b);
}

template <class T>
bool close_all(const std::vector<T>& got, const std::vector<T>& ref, double tol) {
    if (got.size() != ref.size()) return false;
    for (std::size_t i = 0; i < got.size(); i++) {
        double scale = std::abs(ref[i]) > 1.0 ? std::abs(ref[i]) : 1.0;
        if (!(diff(got[i], ref[i]) <= tol * scale)) {
            std::printf("  element %zu differs\n", i);
            return false;
        }
    }
    return true;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// One check named `what`: `f()` throws an E for which `pred(e)` holds.
template <class E, class F, class P>
bool check_throws(F f, P pred, const std::string& what) {
    bool caught = false;
    try {
        f();
    } catch (const E& e) {
        caught = pred(e);
    }
    return check(caught, what);
}

// Compile-time properties of the wrapper.
static_assert(fusekit::dtype_v<float> == FK_DTYPE_F32);
static_assert(fusekit::dtype_v<double> == FK_DTYPE_F64);
static_assert(fusekit::dtype_v<std::complex<float>> == FK_DTYPE_C64);
static_assert(fusekit::dtype_v<std::complex<double>> == FK_DTYPE_C128);
static_assert(fusekit::dtype_v<fusekit::half> == FK_DTYPE_F16);
static_assert(fusekit::dtype_v<fusekit::bfloat16> == FK_DTYPE_BF16);
static_assert(fusekit::dtype_v<const float> == FK_DTYPE_F32);
static_assert(!std::is_copy_constructible_v<fusekit::Context>);
static_assert(!std::is_copy_assignable_v<fusekit::Context>);
static_assert(!std::is_copy_constructible_v<fusekit::Stream>);
static_assert(!std::is_copy_constructible_v<fusekit::Buffer>);
static_assert(!std::is_copy_assignable_v<fusekit::Buffer>);
static_assert(std::is_nothrow_move_constructible_v<fusekit::Context>);
static_assert(std::is_nothrow_move_constructible_v<fusekit::Stream>);
static_assert(std::is_nothrow_move_constructible_v<fusekit::Buffer>);
static_assert(std::is_nothrow_move_assignable_v<fusekit::Buffer>);
static_assert(std::is_base_of_v<std::runtime_error, fusekit::Error>);
static_assert(!std::is_copy_constructible_v<fusekit::Event>);
static_assert(!std::is_copy_constructible_v<fusekit::Comm>);
static_assert(std::is_nothrow_move_constructible_v<fusekit::Event>);
static_assert(std::is_nothrow_move_constructible_v<fusekit::Comm>);
static_assert(std::is_base_of_v<fusekit::Error, fusekit::NotConverged>);
static_assert(static_cast<fk_matpow_method>(fusekit::MatpowMethod::Newton) == FK_MATPOW_NEWTON);
static_assert(sizeof(fk_matpow_report) == 32, "fk_matpow_report: 4 int32 + 2 double");

}  // namespace

int main(int argc, char** argv) {
    const char* dev = argc > 1 ? argv[1] : std::getenv("FK_TEST_DEVICE");
    std::string device = (dev && *dev) ? dev : "cpu";
    fusekit::DeviceKind kind = device == "cuda"   ? fusekit::DeviceKind::Cuda
                               : device == "auto" ? fusekit::DeviceKind::Auto
                                                  : fusekit::DeviceKind::Cpu;
    if (device != "cpu" && device != "cuda" && device != "auto") {
        std::fprintf(stderr, "usage: %s [cpu|cuda|auto]\n", argv[0]);
        return 2;
    }
    std::printf("# fusekit C++ wrapper test, device = %s, %s\n", device.c_str(),
                fusekit::version().c_str());

    try {
        check(fusekit::abi_version() == FK_ABI_VERSION, "abi_version matches the header");
        check(fusekit::version().rfind("fusekit ", 0) == 0, "version() = " + fusekit::version());
        check(fusekit::dtype_size(FK_DTYPE_C128) == 16, "dtype_size(C128) = 16");
        check(fusekit::device_count() >= 0, "device_count() >= 0");

        fusekit::Context ctx(kind);
        check(bool(ctx) && ctx.get() != nullptr, "Context created");
        const bool cuda = ctx.is_cuda();
        check(!ctx.name().empty(), "Context::name() = " + ctx.name());
        auto cc = ctx.compute_capability();
        check(cuda ? cc.first >= 3 : (cc.first == 0 && cc.second == 0),
              "compute_capability = " + std::to_string(cc.first) + "." + std::to_string(cc.second));
        auto mem = ctx.memory();
        check(mem.total_bytes > 0 && mem.free_bytes <= mem.total_bytes, "memory() sane");
        ctx.warmup();
        check(true, "warmup()");

        fusekit::Stream stream(ctx);
        check(bool(stream), "Stream created");
        check(cuda ? stream.handle() != nullptr : stream.handle() == nullptr, "Stream::handle()");

        // ---- owned buffers, accessors, host copies
        auto a = fusekit::Buffer::owned<float>(ctx, {2, 3});
        check(a.dtype() == FK_DTYPE_F32 && a.ndim() == 2, "owned<float> dtype/ndim");
        check(a.shape() == std::vector<std::int64_t>{2, 3}, "shape() = [2, 3]");
        check(a.strides() == std::vector<std::int64_t>{3, 1}, "strides() = [3, 1]");
        check(a.numel() == 6 && a.nbytes() == 24 && a.is_contiguous(), "numel/nbytes/is_contiguous");
        check(a.data() != nullptr && a.device().kind == ctx.kind(), "data()/device()");
        std::vector<float> ha{1, 2, 3, 4, 5, 6};
        a.copy_from_host(ha.data(), ha.size());
        check(a.to_vector<float>() == ha, "copy_from_host / to_vector round trip");

        auto b = fusekit::Buffer::owned<float>(ctx, {3});
        b.copy_from_host(std::vector<float>{10, 20, 30});
        auto out = fusekit::Buffer::owned(ctx, FK_DTYPE_F32, {2, 3});

        // ---- ops with and without a stream
        fusekit::add(a, b, out);
        check(out.to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36},
              "add with broadcasting [2,3] + [3]");
        fusekit::axpby(2.0, a, -1.0, b, out, stream);
        stream.synchronize();
        check(out.to_vector<float>(stream) == std::vector<float>{-8, -16, -24, -2, -10, -18},
              "axpby(2, a, -1, b) on a Stream");
        fusekit::scalar_mul(a, 0.5, out, nullptr);
        check(out.to_vector<float>() == std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3},
              "scalar_mul(a, 0.5) with an explicit nullptr stream");
        fusekit::exp(a, out);
        {
            std::vector<float> ref;
            for (float x : ha) ref.push_back(std::exp(x));
            check(close_all(out.to_vector<float>(), ref, 1e-6), "exp");
        }
        fusekit::sub(a, b, a);  // in place
        check(a.to_vector<float>() == std::vector<float>{-9, -18, -27, -6, -15, -24}, "in-place sub");
        fusekit::relu(a, a);
        check(a.to_vector<float>() == std::vector<float>(6, 0.0f), "in-place relu");

        // ---- f64 and every remaining unary op through the wrapper
        {
            auto x = fusekit::Buffer::owned<double>(ctx, {4});
            auto y = fusekit::Buffer::owned<double>(ctx, {4});
            std::vector<double> hx{0.25, 0.5, 1.5, 2.0};
            x.copy_from_host(hx);
            struct U {
                const char* name;
                void (*fn)(const fusekit::Buffer&, fusekit::Buffer&, fusekit::StreamRef);
                double (*ref)(double);
            };
            const U ops[] = {
                {"neg", fusekit::neg, [](double v) { return -v; }},
                {"abs", fusekit::abs, [](double v) { return std::fabs(v); }},
                {"log", fusekit::log, [](double v) { return std::log(v); }},
                {"sqrt", fusekit::sqrt, [](double v) { return std::sqrt(v); }},
                {"sin", fusekit::sin, [](double v) { return std::sin(v); }},
                {"cos", fusekit::cos, [](double v) { return std::cos(v); }},
                {"tanh", fusekit::tanh, [](double v) { return std::tanh(v); }},
                {"sigmoid", fusekit::sigmoid, [](double v) { return 1.0 / (1.0 + std::exp(-v)); }},
                {"copy", fusekit::copy, [](double v) { return v; }},
            };
            for (const U& u : ops) {
                u.fn(x, y, {});
                std::vector<double> ref;
                for (double v : hx) ref.push_back(u.ref(v));
                check(close_all(y.to_vector<double>(), ref, 1e-12), std::string("f64 ") + u.name);
            }
            fusekit::scalar_add(x, 1.0, y);
            check(close_all(y.to_vector<double>(), std::vector<double>{1.25, 1.5, 2.5, 3.0}, 0.0),
                  "f64 scalar_add");
            fusekit::mul(x, x, y);
            fusekit::div(y, x, y);
            check(close_all(y.to_vector<double>(), hx, 1e-15), "f64 mul then in-place div");
        }

        // ---- complex
        {
            using cf = std::complex<float>;
            auto z = fusekit::Buffer::owned<cf>(ctx, {3});
            auto w = fusekit::Buffer::owned<cf>(ctx, {3});
            auto zo = fusekit::Buffer::owned<cf>(ctx, {3});
            auto mag = fusekit::Buffer::owned<float>(ctx, {3});
            std::vector<cf> hz{{3, 4}, {1, -1}, {0, 2}}, hw{{1, 1}, {2, 0}, {0, -1}};
            z.copy_from_host(hz);
            w.copy_from_host(hw);
            fusekit::mul(z, w, zo);
            std::vector<cf> rm, rd;
            for (int i = 0; i < 3; i++) {
                rm.push_back(hz[i] * hw[i]);
                rd.push_back(hz[i] / hw[i]);
            }
            check(close_all(zo.to_vector<cf>(), rm, 1e-6), "complex64 mul");
            fusekit::div(z, w, zo);
            check(close_all(zo.to_vector<cf>(), rd, 1e-6), "complex64 div");
            fusekit::abs(z, mag);
            check(close_all(mag.to_vector<float>(), std::vector<float>{5, std::sqrt(2.0f), 2}, 1e-6),
                  "complex64 abs -> float");
            fusekit::axpby(std::complex<double>(0, 1), z, 0.0, w, zo);
            std::vector<cf> ri;
            for (auto v : hz) ri.push_back(cf(0, 1) * v);
            check(close_all(zo.to_vector<cf>(), ri, 1e-6), "complex64 axpby with complex alpha");

            using cd = std::complex<double>;
            auto zd = fusekit::Buffer::owned<cd>(ctx, {2});
            auto zdo = fusekit::Buffer::owned<cd>(ctx, {2});
            zd.copy_from_host(std::vector<cd>{{0, 3.14159265358979}, {1, 0}});
            fusekit::exp(zd, zdo);
            auto e = zdo.to_vector<cd>();
            check(std::abs(e[0] - cd(-1, 0)) < 1e-12 && std::abs(e[1] - cd(std::exp(1.0), 0)) < 1e-12,
                  "complex128 exp(i*pi) = -1");
        }

        // ---- half types (exact values): 1 + 2 = 3 in f16 and bf16
        {
            auto h = fusekit::Buffer::owned<fusekit::half>(ctx, {2});
            auto ho = fusekit::Buffer::owned<fusekit::half>(ctx, {2});
            std::vector<fusekit::half> hv{{0x3C00}, {0x4000}};
            h.copy_from_host(hv);
            fusekit::add(h, h, ho);
            auto r = ho.to_vector<fusekit::half>();
            check(r[0].bits == 0x4000 && r[1].bits == 0x4400, "f16 add exact (1+1=2, 2+2=4)");
            auto bf = fusekit::Buffer::owned<fusekit::bfloat16>(ctx, {1});
            auto bo = fusekit::Buffer::owned<fusekit::bfloat16>(ctx, {1});
            bf.copy_from_host(std::vector<fusekit::bfloat16>{{0x3F80}});
            fusekit::scalar_add(bf, 2.0, bo);
            check(bo.to_vector<fusekit::bfloat16>()[0].bits == 0x4040, "bf16 scalar_add exact (1+2=3)");
        }

        // ---- borrowed views with strides (the view's memory is another buffer's)
        {
            auto base = fusekit::Buffer::owned<double>(ctx, {2, 3});
            base.copy_from_host(std::vector<double>{1, 2, 3, 4, 5, 6});
            // transpose: shape [3, 2], strides [1, 3]
            auto t = fusekit::Buffer::borrowed(ctx, base.data(), FK_DTYPE_F64, {3, 2}, {1, 3});
            check(!t.is_contiguous() && t.strides() == std::vector<std::int64_t>{1, 3},
                  "borrowed transposed view: strides [1, 3], not contiguous");
            auto tc = fusekit::Buffer::owned<double>(ctx, {3, 2});
            fusekit::copy(t, tc);
            check(tc.to_vector<double>() == std::vector<double>{1, 4, 2, 5, 3, 6},
                  "copy of the transposed view is the transpose");
            if (!cuda) {
                std::vector<float> host{1, 2, 3, 4};
                auto hb = fusekit::Buffer::borrowed<float>(ctx, host.data(), {4});
                fusekit::scalar_mul(hb, 10.0, hb);
                check(host == std::vector<float>{10, 20, 30, 40},
                      "borrowed<float> over a std::vector writes through (CPU)");
            }
        }

        // ---- DLPack export
        {
            auto d = fusekit::Buffer::owned<float>(ctx, {2, 2});
            d.copy_from_host(std::vector<float>{1, 2, 3, 4});
            fusekit::dl::DLManagedTensorVersioned* m = d.to_dlpack();
            check(m != nullptr && m->version.major == 1 && m->dl_tensor.ndim == 2 &&
                      m->dl_tensor.dtype.code == 2 && m->dl_tensor.dtype.bits == 32,
                  "to_dlpack: version 1, ndim 2, float32");
            m->deleter(m);
            check(true, "to_dlpack deleter called");
        }

        // ---- errors become fusekit::Error with status, name and message
        {
            auto x = fusekit::Buffer::owned<float>(ctx, {4});
            auto y = fusekit::Buffer::owned<float>(ctx, {3});
            auto o = fusekit::Buffer::owned<float>(ctx, {4});
            bool caught = false;
            try {
                fusekit::add(x, y, o);
            } catch (const fusekit::Error& e) {
                caught = true;
                check(e.status() == FK_ERROR_SHAPE_MISMATCH, "Error::status() = FK_ERROR_SHAPE_MISMATCH");
                check(std::strcmp(e.status_name(), "FK_ERROR_SHAPE_MISMATCH") == 0,
                      std::string("Error::status_name() = ") + e.status_name());
                check(contains(e.message(), "fk_add") && contains(e.message(), "[4]") &&
                          contains(e.message(), "[3]"),
                      "Error::message() = " + e.message());
                check(contains(e.what(), "FK_ERROR_SHAPE_MISMATCH: fk_add"),
                      std::string("Error::what() = ") + e.what());
            }
            check(caught, "shape mismatch throws fusekit::Error");

            auto od = fusekit::Buffer::owned<double>(ctx, {4});
            check_throws<std::runtime_error>(  // catchable as std::runtime_error
                [&] { fusekit::neg(x, od); },
                [&](const std::runtime_error& e) { return contains(e.what(), "FK_ERROR_DTYPE_MISMATCH"); },
                "dtype mismatch throws (caught as std::runtime_error)");

            check_throws<fusekit::Error>(
                [&] {
                    std::vector<double> wrong(4);
                    x.copy_from_host(wrong.data(), wrong.size());
                },
                [&](const fusekit::Error& e) { return e.status() == FK_ERROR_DTYPE_MISMATCH; },
                "copy_from_host<double> into a float buffer throws FK_ERROR_DTYPE_MISMATCH");

            check_throws<fusekit::Error>(
                [&] {
                    std::vector<float> small(3);
                    x.copy_to_host(small.data(), small.size());
                },
                [&](const fusekit::Error& e) {
                    return e.status() == FK_ERROR_SHAPE_MISMATCH && contains(e.message(), "bytes = 12");
                },
                "copy_to_host with the wrong count throws FK_ERROR_SHAPE_MISMATCH");

            check_throws<fusekit::Error>(
                [&] { fusekit::Context bad(static_cast<fusekit::DeviceKind>(42)); },
                [&](const fusekit::Error& e) {
                    return e.status() == FK_ERROR_INVALID_ARGUMENT && contains(e.message(), "kind");
                },
                "Context with an invalid kind throws FK_ERROR_INVALID_ARGUMENT");
            check(fusekit::last_error_message().find("fk_context_create") == 0,
                  "last_error_message() = " + fusekit::last_error_message());
            check(fusekit::last_error_message() == fusekit::last_error_c_str(),
                  "last_error_c_str() is the same message without a copy");
        }

        // ---- move semantics
        {
            auto m1 = fusekit::Buffer::owned<float>(ctx, {5});
            fk_buffer* raw = m1.get();
            fusekit::Buffer m2 = std::move(m1);
            check(m2.get() == raw && !m1 && m1.get() == nullptr, "Buffer move construction transfers the handle");
            fusekit::Buffer m3 = fusekit::Buffer::owned<float>(ctx, {1});
            m3 = std::move(m2);  // releases m3's old buffer
            check(m3.get() == raw && !m2 && m3.numel() == 5, "Buffer move assignment");
            check_throws<fusekit::Error>(
                [&] { (void)m2.numel(); },
                [&](const fusekit::Error& e) { return e.status() == FK_ERROR_NULL_POINTER; },
                "using a moved-from Buffer throws FK_ERROR_NULL_POINTER");
            fk_buffer* rel = m3.release();
            check(!m3 && rel == raw, "release() gives up ownership");
            fusekit::Buffer back = fusekit::Buffer::adopt(rel);
            check(back.numel() == 5, "adopt() takes it back");

            fusekit::Context c2 = fusekit::Context::cpu();
            fusekit::Context c3 = std::move(c2);
            check(!c2 && bool(c3) && c3.kind() == fusekit::DeviceKind::Cpu, "Context move");
            check_throws<fusekit::Error>(
                [&] { (void)c2.name(); },
                [&](const fusekit::Error& e) { return e.status() == FK_ERROR_NULL_POINTER; },
                "using a moved-from Context throws");
            fusekit::Stream s2(c3);
            fusekit::Stream s3 = std::move(s2);
            check(!s2 && bool(s3), "Stream move");
            s3.synchronize();

            std::vector<fusekit::Buffer> many;
            for (int i = 0; i < 8; i++) many.push_back(fusekit::Buffer::owned<double>(c3, {i + 1}));
            bool all = true;
            for (int i = 0; i < 8; i++) all = all && many[i].numel() == i + 1;
            check(all, "Buffers stored in a std::vector survive reallocation");
        }


        // ---- runtime: memory statistics, pinned buffers, copies, events, communicators
        {
            fusekit::Context rc(kind);
            auto st0 = rc.memory_stats();
            check(st0.size == sizeof(fk_memory_stats) && st0.live_allocations == 0,
                  "memory_stats() of a fresh context");
            auto big = fusekit::Buffer::owned<float>(rc, {1000});
            auto st1 = rc.memory_stats();
            check(st1.allocated_bytes == 4000 && st1.live_allocations == 1, "memory_stats() counts a buffer");
            rc.set_release_threshold(0);
            check(rc.memory_stats().release_threshold_bytes == 0, "set_release_threshold");
            rc.trim(0);
            auto pin = fusekit::Buffer::pinned<float>(rc, {1000});
            check(pin.device().kind == (rc.is_cuda() ? fusekit::DeviceKind::CudaHost : fusekit::DeviceKind::Cpu),
                  "pinned buffer's device kind");
            float* hp = static_cast<float*>(pin.data());
            for (int i = 0; i < 1000; i++) hp[i] = float(i);
            fusekit::Stream rs(rc);
            fusekit::Event e0(rc), e1(rc);
            e0.record(rs);
            big.copy_from(pin, rs);
            auto twice = fusekit::Buffer::owned<float>(rc, {1000});
            fusekit::scalar_mul(big, 2.0, twice, rs);
            pin.copy_from(twice, rs);
            e1.record(rs);
            e1.synchronize();
            bool ok = e1.query();
            for (int i = 0; i < 1000; i++) ok = ok && hp[i] == 2.0f * float(i);
            check(ok, "pinned -> device -> op -> pinned, ordered by an event");
            check(e0.elapsed_ms(e1) >= 0.0f, "Event::elapsed_ms >= 0");
            fusekit::wait(rs, e1);
            check_throws<fusekit::Error>(
                [&] { fusekit::Buffer::owned<float>(rc, {999}).copy_from(pin); },
                [&](const fusekit::Error& e) {
                    return e.status() == FK_ERROR_SHAPE_MISMATCH && contains(e.message(), "fk_buffer_copy");
                },
                "copy_from of another size throws FK_ERROR_SHAPE_MISMATCH");
            if (!rc.is_cuda()) {
                fusekit::CommId id{};
                auto comm = fusekit::Comm::init_rank(rc, 1, id, 0);
                check(comm.rank() == 0 && comm.size() == 1, "single-rank CPU communicator");
                auto recv = fusekit::Buffer::owned<float>(rc, {1000});
                {
                    fusekit::Group g;
                    fusekit::all_reduce(comm, twice, recv, fusekit::ReduceOp::Sum, rs);
                    g.close();
                }
                check(recv.to_vector<float>() == twice.to_vector<float>(), "all_reduce over one rank copies");
                fusekit::broadcast(comm, &twice, recv, 0);
                fusekit::all_gather(comm, twice, recv);
                fusekit::reduce_scatter(comm, twice, recv, fusekit::ReduceOp::Max);
                check(recv.to_vector<float>() == twice.to_vector<float>(), "broadcast/all_gather/reduce_scatter");
                auto all = fusekit::Comm::init_all({&rc});
                check(all.size() == 1 && all[0].size() == 1, "Comm::init_all of one CPU context");
            }
        }
        if (cuda) {
            // the legacy default stream can be borrowed
            fusekit::Stream legacy = fusekit::Stream::wrap(ctx, nullptr);
            check(legacy.handle() == nullptr, "Stream::wrap(nullptr) is the legacy default stream");
        } else {
            check_throws<fusekit::Error>(
                [&] { (void)fusekit::Stream::wrap(ctx, nullptr); },
                [&](const fusekit::Error& e) { return e.status() == FK_ERROR_UNSUPPORTED; },
                "Stream::wrap on a CPU context throws FK_ERROR_UNSUPPORTED");
        }
        // ---- linear algebra
        {
            auto ma = fusekit::Buffer::owned<float>(ctx, {2, 3});
            auto mb = fusekit::Buffer::owned<float>(ctx, {3, 2});
            auto mc = fusekit::Buffer::owned<float>(ctx, {2, 2});
            ma.copy_from_host(std::vector<float>{1, 2, 3, 4, 5, 6});
            mb.copy_from_host(std::vector<float>{1, 0, 0, 1, 1, 1});
            fusekit::gemm(ma, mb, mc);
            check(mc.to_vector<float>() == std::vector<float>{4, 5, 10, 11}, "gemm [2,3] x [3,2]");
            fusekit::gemm(ma, ma, mc, fusekit::Op::N, fusekit::Op::T, 0.5, 0.0, 0, stream);
            stream.synchronize();
            check(mc.to_vector<float>(stream) == std::vector<float>{7, 16, 16, 38.5f}, "gemm a a^T * 0.5 on a Stream");
            // y = relu(x w^T + b)
            auto w = fusekit::Buffer::owned<float>(ctx, {2, 3});
            w.copy_from_host(std::vector<float>{1, 0, -1, 0, 1, 0});
            auto bias = fusekit::Buffer::owned<float>(ctx, {2});
            bias.copy_from_host(std::vector<float>{0.5f, -3});
            auto y = fusekit::Buffer::owned<float>(ctx, {2, 2});
            fusekit::linear_forward(ma, w, &bias, fusekit::Act::Relu, y);
            check(y.to_vector<float>() == std::vector<float>{0, 0, 0, 2}, "linear_forward relu");
            check(fusekit::linear_aux_size(fusekit::Act::GeluErf, FK_DTYPE_F32, 2, 2) == 16 &&
                      fusekit::linear_aux_size(fusekit::Act::GeluTanh, FK_DTYPE_F32, 2, 2) == 16 &&
                      fusekit::linear_aux_size(fusekit::Act::Relu, FK_DTYPE_F32, 2, 2) == 0,
                  "linear_aux_size");
            {
                // z = {-1.5, -1, -1.5, 2}: the exact GELU in double, and the tanh one apart from it
                auto ye = fusekit::Buffer::owned<float>(ctx, {2, 2});
                auto yt = fusekit::Buffer::owned<float>(ctx, {2, 2});
                auto aux = fusekit::Buffer::owned<float>(ctx, {2, 2});
                fusekit::linear_forward(ma, w, &bias, fusekit::Act::GeluErf, ye, &aux);
                fusekit::linear_forward(ma, w, &bias, fusekit::Act::GeluTanh, yt);
                const double z[4] = {-1.5, -1, -1.5, 2};
                auto e = ye.to_vector<float>(), t = yt.to_vector<float>(), a = aux.to_vector<float>();
                double err_erf = 0, err_tanh = 0, err_aux = 0;
                for (int i = 0; i < 4; ++i) {
                    double want = 0.5 * z[i] * (1.0 + std::erf(z[i] / std::sqrt(2.0)));
                    double tanh_ = 0.5 * z[i] * (1.0 + std::tanh(0.7978845608028654 * (z[i] + 0.044715 * z[i] * z[i] * z[i])));
                    err_erf = std::max(err_erf, std::fabs(e[i] - want));
                    err_tanh = std::max(err_tanh, std::fabs(t[i] - tanh_));
                    err_aux = std::max(err_aux, std::fabs(a[i] - z[i]));
                }
                char errs[96];
                std::snprintf(errs, sizeof errs, " (max errors: erf %.2e, tanh %.2e, aux %.2e)", err_erf, err_tanh,
                              err_aux);
                // tanh: on CUDA cuBLASLt's GELU epilogue, 1.8e-6 from the double formula on the H100
                check(err_erf < 1e-6 && err_tanh < 1e-5 && err_aux == 0 && std::fabs(e[1] - t[1]) > 1e-4,
                      std::string("linear_forward GeluErf / GeluTanh") + errs);
            }
            auto dy = fusekit::Buffer::owned<float>(ctx, {2, 2});
            dy.copy_from_host(std::vector<float>{1, 1, 1, 1});
            auto db = fusekit::Buffer::owned<float>(ctx, {2});
            fusekit::linear_backward(dy, ma, w, fusekit::Act::Relu, &y, nullptr, nullptr, &db);
            check(db.to_vector<float>() == std::vector<float>{0, 1}, "linear_backward db only");
            auto k1 = fusekit::Buffer::owned<float>(ctx, {1, 2});
            k1.copy_from_host(std::vector<float>{1, 2});
            auto k2 = fusekit::Buffer::owned<float>(ctx, {2, 1});
            k2.copy_from_host(std::vector<float>{3, 4});
            auto ko = fusekit::Buffer::owned<float>(ctx, {2, 2});
            fusekit::kron(k1, k2, ko);
            check(ko.to_vector<float>() == std::vector<float>{3, 6, 4, 8}, "kron [1,2] (x) [2,1]");
            check_throws<fusekit::Error>(
                [&] { fusekit::gemm(ma, ma, mc); },
                [&](const fusekit::Error& e) {
                    return e.status() == FK_ERROR_SHAPE_MISMATCH && contains(e.what(), "fk_gemm");
                },
                "gemm shape mismatch throws fusekit::Error");

            // ---- multi-layer perceptron: relu(x w^T + bias) w1^T, values by hand
            // z0 = {-1.5, -1, -1.5, 2}, h1 = {0, 0, 0, 2}, y = h1 w1^T = {0, 4}
            auto w1 = fusekit::Buffer::owned<float>(ctx, {1, 2});
            w1.copy_from_host(std::vector<float>{1, 2});
            const std::vector<std::int64_t> widths{3, 2, 1};
            const std::size_t bytes =
                fusekit::mlp_saved_size(ctx, widths, 2, FK_DTYPE_F32, fusekit::Act::Relu, fusekit::Act::None);
            check(bytes > 0 && fusekit::mlp_saved_size(ctx, {3, 1}, 2, FK_DTYPE_F32, fusekit::Act::Relu,
                                                       fusekit::Act::None) == 0,
                  "mlp_saved_size");
            auto saved = fusekit::Buffer::owned<float>(ctx, {static_cast<std::int64_t>((bytes + 3) / 4)});
            auto my = fusekit::Buffer::owned<float>(ctx, {2, 1});
            fusekit::mlp_forward(ma, {&w, &w1}, {&bias, nullptr}, fusekit::Act::Relu, fusekit::Act::None, my,
                                 &saved);
            check(my.to_vector<float>() == std::vector<float>{0, 4}, "mlp_forward relu, 2 layers");
            auto mdy = fusekit::Buffer::owned<float>(ctx, {2, 1});
            mdy.copy_from_host(std::vector<float>{1, 1});
            auto mdx = fusekit::Buffer::owned<float>(ctx, {2, 3});
            auto dw0 = fusekit::Buffer::owned<float>(ctx, {2, 3});
            auto dw1 = fusekit::Buffer::owned<float>(ctx, {1, 2});
            auto db0 = fusekit::Buffer::owned<float>(ctx, {2});
            fusekit::mlp_backward(mdy, ma, {&w, &w1}, fusekit::Act::Relu, fusekit::Act::None, &saved, &mdx,
                                  {&dw0, &dw1}, {&db0, nullptr});
            check(mdx.to_vector<float>() == std::vector<float>{0, 0, 0, 0, 2, 0} &&
                      dw0.to_vector<float>() == std::vector<float>{0, 0, 0, 8, 10, 12} &&
                      dw1.to_vector<float>() == std::vector<float>{0, 2} &&
                      db0.to_vector<float>() == std::vector<float>{0, 2},
                  "mlp_backward dx, dweights, dbiases[0]");
            check_throws<fusekit::Error>(
                [&] { fusekit::mlp_forward(ma, {&w, &ma}, {}, fusekit::Act::Relu, fusekit::Act::None, my); },
                [&](const fusekit::Error& e) {
                    return e.status() == FK_ERROR_SHAPE_MISMATCH &&
                           contains(e.what(), "fk_mlp_forward: weights[1]") && contains(e.what(), "layer 1");
                },
                "mlp_forward names the weight and layer of a shape mismatch");
        }

        // ---- Gaussian field and geodesic flow (values by hand)
        {
            const double eps = 1e-6;
            auto pts = fusekit::Buffer::owned<double>(ctx, {1, 3});
            pts.copy_from_host(std::vector<double>{1, 0, 0});
            auto mean = fusekit::Buffer::owned<double>(ctx, {1, 3});
            mean.copy_from_host(std::vector<double>{0, 0, 0});
            auto chol = fusekit::Buffer::owned<double>(ctx, {1, 3, 3});
            chol.copy_from_host(std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0, 1});
            auto w = fusekit::Buffer::owned<double>(ctx, {1});
            w.copy_from_host(std::vector<double>{2});
            auto field = fusekit::Buffer::owned<double>(ctx, {1});
            fusekit::gaussian_field_forward(pts, mean, chol, w, eps, field);
            const double m = 1.0 / ((1 + eps) * (1 + eps));
            check(std::abs(field.to_vector<double>()[0] - 2 * std::exp(-0.5 * m)) < 1e-12,
                  "gaussian_field_forward: one unit Gaussian at distance 1");
            auto dist = fusekit::Buffer::owned<double>(ctx, {1, 1});
            fusekit::mahalanobis_forward(pts, mean, chol, eps, dist);
            check(std::abs(dist.to_vector<double>()[0] - m) < 1e-12, "mahalanobis_forward = 1/(1+eps)^2");
            auto dout = fusekit::Buffer::owned<double>(ctx, {1});
            dout.copy_from_host(std::vector<double>{1});
            auto dw = fusekit::Buffer::owned<double>(ctx, {1});
            std::size_t ws_bytes = fusekit::gaussian_backward_workspace_size(ctx, FK_DTYPE_F64, 1, 1);
            auto ws = fusekit::Buffer::owned<double>(ctx, {static_cast<std::int64_t>(ws_bytes / 8 + 1)});
            fusekit::gaussian_field_backward(pts, mean, chol, w, eps, dout, nullptr, nullptr, nullptr, &dw,
                                             ws_bytes ? &ws : nullptr);
            check(std::abs(dw.to_vector<double>()[0] - std::exp(-0.5 * m)) < 1e-12,
                  "gaussian_field_backward: dweights = exp(-m/2)");

            // v = [1, 2], U = [[1], [1]] -> p = 3, s = 9; W = [[0.1], [0.2]] -> gamma = [0.9, 1.8]
            auto v = fusekit::Buffer::owned<double>(ctx, {1, 2});
            v.copy_from_host(std::vector<double>{1, 2});
            auto U = fusekit::Buffer::owned<double>(ctx, {2, 1});
            U.copy_from_host(std::vector<double>{1, 1});
            auto W = fusekit::Buffer::owned<double>(ctx, {2, 1});
            W.copy_from_host(std::vector<double>{0.1, 0.2});
            auto gamma = fusekit::Buffer::owned<double>(ctx, {1, 2});
            fusekit::christoffel_forward(v, U, W, 5.0, gamma);
            auto gv = gamma.to_vector<double>();
            check(std::abs(gv[0] - 0.9) < 1e-12 && std::abs(gv[1] - 1.8) < 1e-12, "christoffel_forward by hand");
            fusekit::christoffel_forward(v, U, W, 1.0, gamma);
            gv = gamma.to_vector<double>();
            check(std::abs(gv[0] - 0.9) < 1e-12 && gv[1] == 1.0, "christoffel_forward clamps at c");
            auto x1 = fusekit::Buffer::owned<double>(ctx, {1, 2});
            auto v1 = fusekit::Buffer::owned<double>(ctx, {1, 2});
            fusekit::leapfrog_forward(v, v, nullptr, U, W, nullptr, 0.0, 1, 5.0, x1, v1);
            check(x1.to_vector<double>() == std::vector<double>{1, 2} && v1.to_vector<double>() == std::vector<double>{1, 2},
                  "leapfrog_forward with dt = 0 is the identity");
        }

        // ---- optimizer math (values by hand)
        {
            // eigh: diag(4, 9)^(-1/2) = diag(1/2, 1/3)
            auto d = fusekit::Buffer::owned<double>(ctx, {2, 2});
            d.copy_from_host(std::vector<double>{4, 0, 0, 9});
            auto dp = fusekit::Buffer::owned<double>(ctx, {2, 2});
            fk_matpow_report rep = fusekit::matrix_power(d, -0.5, 0.0, dp, fusekit::MatpowMethod::Eigh);
            check(close_all(dp.to_vector<double>(), std::vector<double>{0.5, 0, 0, 1.0 / 3.0}, 1e-12),
                  "matrix_power eigh: diag(4, 9)^(-1/2)");
            check(rep.method == FK_MATPOW_EIGH && rep.iterations == 0 && rep.converged == 1 &&
                      std::isnan(rep.residual) && std::abs(rep.min_eigenvalue - 4.0) < 1e-12,
                  "matrix_power eigh report (method, iterations, converged, NaN residual, min eigenvalue 4)");
            // Newton: [[2, 1], [1, 2]] has eigenvalues 1 and 3 (eigenvectors [1, -1], [1, 1])
            auto a = fusekit::Buffer::owned<double>(ctx, {2, 2});
            a.copy_from_host(std::vector<double>{2, 1, 1, 2});
            auto root = fusekit::Buffer::owned<double>(ctx, {2, 2});
            rep = fusekit::matrix_power(a, -0.5, 0.0, root, fusekit::MatpowMethod::Newton, 100, 1e-12, 0, stream);
            const double s3 = 1.0 / std::sqrt(3.0);
            const double dg = 0.5 * (s3 + 1), off = 0.5 * (s3 - 1);
            check(close_all(root.to_vector<double>(stream), std::vector<double>{dg, off, off, dg}, 1e-10),
                  "matrix_power newton: [[2,1],[1,2]]^(-1/2) on a Stream");
            check(rep.method == FK_MATPOW_NEWTON && rep.converged == 1 && rep.iterations >= 1 &&
                      rep.iterations <= 100 && rep.residual <= 1e-12 && std::isnan(rep.min_eigenvalue),
                  "matrix_power newton report (" + std::to_string(rep.iterations) + " iterations)");
            check(fusekit::default_matpow_tol(FK_DTYPE_F64, 0) == 1e-12 &&
                      fusekit::default_matpow_tol(FK_DTYPE_F32, 0) == 1e-5 &&
                      fusekit::default_matpow_tol(FK_DTYPE_F32, FK_GEMM_ALLOW_TF32) == 3e-2,
                  "default_matpow_tol per dtype");
            rep = fusekit::matrix_power(a, 1.0 / 3.0, 0.0, root);  // auto, default tol
            check(rep.method == FK_MATPOW_EIGH && rep.converged == 1, "matrix_power auto (non-root power: eigh)");
            // one Newton iteration cannot reach 1e-14
            bool caught = false;
            try {
                fusekit::matrix_power(a, -0.5, 0.0, root, fusekit::MatpowMethod::Newton, 1, 1e-14);
            } catch (const fusekit::NotConverged& e) {
                caught = e.status() == FK_ERROR_NOT_CONVERGED &&
                         std::strcmp(e.status_name(), "FK_ERROR_NOT_CONVERGED") == 0 &&
                         contains(e.message(), "did not converge") && e.report().converged == 0 &&
                         e.report().iterations == 1 && e.report().method == FK_MATPOW_NEWTON &&
                         e.report().residual > 1e-14;
            }
            check(caught, "matrix_power non-convergence throws NotConverged with the report");
            check_throws<fusekit::Error>(  // also a fusekit::Error
                [&] { fusekit::matrix_power(a, -0.5, 0.0, root, fusekit::MatpowMethod::Newton, 1, 1e-14); },
                [&](const fusekit::Error& e) { return e.status() == FK_ERROR_NOT_CONVERGED; },
                "NotConverged is caught as fusekit::Error");
            check_throws<fusekit::Error>(
                [&] { fusekit::matrix_power(a, 0.3, 0.0, root, fusekit::MatpowMethod::Newton); },
                [&](const fusekit::Error& e) {
                    return e.status() == FK_ERROR_INVALID_ARGUMENT && contains(e.message(), "inverse roots");
                },
                "matrix_power newton with a non-root power throws FK_ERROR_INVALID_ARGUMENT");

            // Shampoo statistics: G [2, 3]
            auto g = fusekit::Buffer::owned<double>(ctx, {2, 3});
            g.copy_from_host(std::vector<double>{1, 2, 3, 4, 5, 6});
            auto l = fusekit::Buffer::owned<double>(ctx, {2, 2});
            auto r = fusekit::Buffer::owned<double>(ctx, {3, 3});
            fusekit::shampoo_stats(g, 1.0, 0.0, &l, &r);  // beta = 0: l, r not read
            const std::vector<double> ggt{14, 32, 32, 77};
            const std::vector<double> gtg{17, 22, 27, 22, 29, 36, 27, 36, 45};
            check(close_all(l.to_vector<double>(), ggt, 1e-14) && close_all(r.to_vector<double>(), gtg, 1e-14),
                  "shampoo_stats: L = G G^T, R = G^T G");
            fusekit::shampoo_stats(g, 0.5, 1.0, &l, nullptr);
            std::vector<double> l15;
            for (double v : ggt) l15.push_back(1.5 * v);
            check(close_all(l.to_vector<double>(), l15, 1e-14) && close_all(r.to_vector<double>(), gtg, 1e-14),
                  "shampoo_stats accumulates L only");
            check_throws<fusekit::Error>(
                [&] { fusekit::shampoo_stats(g, 1.0, 1.0, nullptr, nullptr); },
                [&](const fusekit::Error& e) {
                    return e.status() == FK_ERROR_NULL_POINTER && contains(e.message(), "fk_shampoo_stats");
                },
                "shampoo_stats without l and r throws FK_ERROR_NULL_POINTER");
            // preconditioning: diag(2, 3) G, then G with no roots
            auto lr = fusekit::Buffer::owned<double>(ctx, {2, 2});
            lr.copy_from_host(std::vector<double>{2, 0, 0, 3});
            auto pg = fusekit::Buffer::owned<double>(ctx, {2, 3});
            fusekit::shampoo_precondition(&lr, g, nullptr, pg);
            check(close_all(pg.to_vector<double>(), std::vector<double>{2, 4, 6, 12, 15, 18}, 1e-14),
                  "shampoo_precondition with l_root only");
            auto rr = fusekit::Buffer::owned<double>(ctx, {3, 3});
            rr.copy_from_host(std::vector<double>{0, 0, 1, 0, 1, 0, 1, 0, 0});  // reverses the columns
            fusekit::shampoo_precondition(&lr, g, &rr, pg, 0, stream);
            check(close_all(pg.to_vector<double>(stream), std::vector<double>{6, 4, 2, 18, 15, 12}, 1e-14),
                  "shampoo_precondition with both roots on a Stream");

            // per-sample gradients: a [2, 3], g [2, 2]
            auto pa = fusekit::Buffer::owned<double>(ctx, {2, 3});
            pa.copy_from_host(std::vector<double>{1, 0, 2, 0, 1, 1});
            auto pgr = fusekit::Buffer::owned<double>(ctx, {2, 2});
            pgr.copy_from_host(std::vector<double>{1, 2, 3, 0});
            auto per = fusekit::Buffer::owned<double>(ctx, {2, 2, 3});
            fusekit::per_sample_grads(pa, pgr, per);
            check(close_all(per.to_vector<double>(),
                            std::vector<double>{1, 0, 2, 2, 0, 4, 0, 3, 3, 0, 0, 0}, 1e-14),
                  "per_sample_grads: outer products g_b^T a_b");
            auto nrm = fusekit::Buffer::owned<double>(ctx, {2});
            fusekit::per_sample_grad_norms(pa, pgr, nrm);
            check(close_all(nrm.to_vector<double>(), std::vector<double>{25, 18}, 1e-13),
                  "per_sample_grad_norms = |g_b|^2 |a_b|^2");
            auto sum = fusekit::Buffer::owned<double>(ctx, {2, 3});
            fusekit::dp_clipped_grad_sum(pa, pgr, 1e9, sum);
            check(close_all(sum.to_vector<double>(), std::vector<double>{1, 3, 5, 2, 0, 4}, 1e-13),
                  "dp_clipped_grad_sum without clipping = sum of the gradients");
            auto nrm2 = fusekit::Buffer::owned<double>(ctx, {2});
            fusekit::dp_clipped_grad_sum(pa, pgr, 3.0, sum, &nrm2);
            const double f0 = 3.0 / 5.0, f1 = 3.0 / std::sqrt(18.0);
            check(close_all(sum.to_vector<double>(),
                            std::vector<double>{f0, 3 * f1, 2 * f0 + 3 * f1, 2 * f0, 0, 4 * f0}, 1e-13) &&
                      close_all(nrm2.to_vector<double>(), std::vector<double>{25, 18}, 1e-13),
                  "dp_clipped_grad_sum at max_norm 3 (both clipped) and its sq_norms");
            auto bad = fusekit::Buffer::owned<double>(ctx, {3, 2});
            check_throws<fusekit::Error>(
                [&] { fusekit::per_sample_grads(pa, bad, per); },
                [&](const fusekit::Error& e) {
                    return e.status() == FK_ERROR_SHAPE_MISMATCH && contains(e.message(), "fk_per_sample_grads");
                },
                "per_sample_grads with another batch throws FK_ERROR_SHAPE_MISMATCH");
            check_throws<fusekit::Error>(
                [&] { fusekit::dp_clipped_grad_sum(pa, pgr, -1.0, sum); },
                [&](const fusekit::Error& e) {
                    return e.status() == FK_ERROR_INVALID_ARGUMENT && contains(e.message(), "max_norm");
                },
                "dp_clipped_grad_sum with max_norm < 0 throws FK_ERROR_INVALID_ARGUMENT");
        }
    } catch (const fusekit::Error& e) {
        check(false, std::string("unexpected fusekit::Error: ") + e.what());
    } catch (const std::exception& e) {
        check(false, std::string("unexpected exception: ") + e.what());
    }

    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
}
