// An installed fusekit, used from C++ through fusekit.hpp (tests/install/run.sh
// builds it with CMake's find_package(fusekit CONFIG), once against fusekit::fusekit
// and once against fusekit::static): a CPU context, fusekit::add with broadcasting,
// the values checked, and a mistake raised as fusekit::Error.
#include <fusekit.hpp>

#include <cstdio>
#include <vector>

int main() {
    try {
        auto ctx = fusekit::Context::cpu();
        auto a = fusekit::Buffer::owned<float>(ctx, {2, 3});
        auto b = fusekit::Buffer::owned<float>(ctx, {3});
        auto out = fusekit::Buffer::owned<float>(ctx, {2, 3});
        std::vector<float> ha{1, 2, 3, 4, 5, 6}, hb{10, 20, 30};
        a.copy_from_host(ha);
        b.copy_from_host(hb);
        fusekit::add(a, b, out);
        std::vector<float> r = out.to_vector<float>();
        int bad = 0;
        for (std::size_t i = 0; i < ha.size(); i++) {
            if (r[i] != ha[i] + hb[i % 3]) {
                std::fprintf(stderr, "out[%zu] = %g, expected %g\n", i, double(r[i]), double(ha[i] + hb[i % 3]));
                bad = 1;
            }
        }
        try {
            fusekit::add(a, out, b);  // out has the wrong shape
            std::fprintf(stderr, "no fusekit::Error for a wrong out shape\n");
            bad = 1;
        } catch (const fusekit::Error& e) {
            if (e.status() != FK_ERROR_SHAPE_MISMATCH) {
                std::fprintf(stderr, "wrong status: %s\n", e.what());
                bad = 1;
            }
        }
        std::printf("%s: %s\n", fk_version_string(), bad ? "FAILED" : "fusekit::add: ok");
        return bad;
    } catch (const fusekit::Error& e) {
        std::fprintf(stderr, "fusekit::Error: %s\n", e.what());
        return 1;
    }
}
