// Runs the fused MLP's kernels (kernels/mlp_fused.cu, the module source NVRTC
// compiles: `kernel_source mlp_fused`) on the CPU through the coroutine emulator
// (emu.h, the warp collectives of mlp_common.cuh), with the arguments the Rust
// launcher builds. Driven by the unit test `mlp_fused_kernels_in_the_cpu_emulator`
// (src/cuda/linalg/mlp_fused/tests.rs), which compares what comes back with the
// CPU backend.
//
//   mlp_emu CASES OUT
// CASES holds launches, each: u64 base (the Rust side's address of the arena),
// u64 arena bytes, the arena, then u32 launches and per launch: u32 name length,
// the kernel name, u32 grid, u32 dynamic shared bytes, u32 seed, the MfArgs bytes.
// Every address in an MfArgs is an address of the Rust side's arena; here each is
// moved onto this process's copy. OUT receives the arena after the launches.
#include "mlp_fused.cu"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {
#define ENTRY(name) {#name, [](const void* p) { name(*static_cast<const MfArgs*>(p)); }}
const std::map<std::string, emu::KernelFn> KERNELS = {
    ENTRY(mlpf_fwd_w16_f16), ENTRY(mlpf_fwd_w32_f16), ENTRY(mlpf_fwd_w64_f16), ENTRY(mlpf_fwd_w128_f16),
    ENTRY(mlpf_bwd_w16_f16), ENTRY(mlpf_bwd_w32_f16), ENTRY(mlpf_bwd_w64_f16), ENTRY(mlpf_bwd_w128_f16),
    ENTRY(mlpf_fwd_w16_bf16), ENTRY(mlpf_fwd_w32_bf16), ENTRY(mlpf_fwd_w64_bf16), ENTRY(mlpf_fwd_w128_bf16),
    ENTRY(mlpf_bwd_w16_bf16), ENTRY(mlpf_bwd_w32_bf16), ENTRY(mlpf_bwd_w64_bf16), ENTRY(mlpf_bwd_w128_bf16),
};

template <typename T> T get(std::ifstream& in) {
    T v;
    in.read(reinterpret_cast<char*>(&v), sizeof v);
    if (!in) {
        std::fprintf(stderr, "truncated case file\n");
        std::exit(2);
    }
    return v;
}

void move(u64& p, u64 base, u64 size, unsigned char* arena) {
    if (p == 0) return;
    if (p < base || p >= base + size) {
        std::fprintf(stderr, "address %#llx outside the arena\n", (unsigned long long)p);
        std::exit(2);
    }
    p = (u64)(uintptr_t)(arena + (p - base));
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: mlp_emu CASES OUT\n");
        return 2;
    }
    std::ifstream in(argv[1], std::ios::binary);
    const u64 base = get<u64>(in), size = get<u64>(in);
    std::vector<unsigned char> mem(size + 256);
    unsigned char* arena = mem.data() + (256 - (uintptr_t)mem.data() % 256) % 256;
    in.read(reinterpret_cast<char*>(arena), (std::streamsize)size);
    const unsigned launches = get<unsigned>(in);
    for (unsigned i = 0; i < launches; ++i) {
        std::string name(get<unsigned>(in), '\0');
        in.read(name.data(), (std::streamsize)name.size());
        const unsigned grid = get<unsigned>(in), smem = get<unsigned>(in), seed = get<unsigned>(in);
        MfArgs a = get<MfArgs>(in);
        for (u64* p : {&a.x, &a.y, &a.dy, &a.dx, &a.partial}) move(*p, base, size, arena);
        for (int l = 0; l < a.n_layers; ++l)
            for (u64* p : {&a.layers[l].w, &a.layers[l].b, &a.layers[l].aux, &a.layers[l].hidden, &a.layers[l].dz})
                move(*p, base, size, arena);
        auto k = KERNELS.find(name);
        if (k == KERNELS.end()) {
            std::fprintf(stderr, "no kernel %s\n", name.c_str());
            return 2;
        }
        emu::launch(k->second, grid, FK_MF_WARPS * 32, smem, &a, seed);
    }
    std::ofstream out(argv[2], std::ios::binary);
    out.write(reinterpret_cast<const char*>(arena), (std::streamsize)size);
    return out ? 0 : 1;
}
