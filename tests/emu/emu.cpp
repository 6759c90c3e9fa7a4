// The emulator's scheduler (see emu.h).
#include "emu.h"

namespace emu {
uint3 threadIdx, blockIdx, gridDim, blockDim;
unsigned dyn_smem = 0;
unsigned char* smem = nullptr;

namespace {
enum State { READY, AT_BLOCK, AT_WARP, AT_BAR, DONE };
struct Thread {
    ucontext_t ctx;
    std::vector<char> stack;
    State state = READY;
    int bar_id = 0, bar_count = 0;  // AT_BAR: the named barrier and its thread count
};
std::vector<Thread> threads;
ucontext_t sched_ctx;
int current = -1;
KernelFn cur_fn;
const void* cur_args;

void entry() {
    cur_fn(cur_args);
    threads[current].state = DONE;
    swapcontext(&threads[current].ctx, &sched_ctx);
}

void yield(State s) {
    Thread& t = threads[current];
    t.state = s;
    swapcontext(&t.ctx, &sched_ctx);
}
}  // namespace

void sync_block() { yield(AT_BLOCK); }
void sync_warp() { yield(AT_WARP); }
void sync_bar(int id, int count) {
    threads[current].bar_id = id;
    threads[current].bar_count = count;
    yield(AT_BAR);
}
[[noreturn]] void trap() {
    fprintf(stderr, "__trap() in block %u thread %u\n", blockIdx.x, threadIdx.x);
    abort();
}

namespace {
struct MmaScratch {
    float a[32][4], b[32][2], c[32][4];
};
MmaScratch mma_scratch[32];
float tf32_trunc(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u &= 0xffffe000u;
    std::memcpy(&x, &u, 4);
    return x;
}
}  // namespace
double shfl_scratch[32][32];

}  // namespace emu

float geo_tf32(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) {
        u += 0x1000u;  // half an ulp of TF32 on the magnitude: ties away from zero
        u &= 0xffffe000u;
    }
    std::memcpy(&x, &u, 4);
    return x;
}

float geo_tf32_op(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x1000u;
    std::memcpy(&x, &u, 4);
    return x;
}

void geo_split(float x, float& hi, float& lo) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x1000u) & 0xffffe000u;
    std::memcpy(&hi, &u, 4);
    lo = geo_tf32_op(x - hi);
}

void geo_mma_tf32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
    using namespace emu;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    MmaScratch& sc = mma_scratch[w];
    for (int e = 0; e < 4; ++e) sc.a[lane][e] = tf32_trunc(a[e]), sc.c[lane][e] = d[e];
    for (int e = 0; e < 2; ++e) sc.b[lane][e] = tf32_trunc(b[e]);
    sync_warp();
    // A(r, k): lane 4(r%8) + k%4, register (r/8) + 2(k/4); B(k, n): lane 4n + k%4,
    // register k/4; C(r, n): lane 4(r%8) + n/2, register 2(r/8) + n%2
    const int g = lane >> 2, t = lane & 3;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const int r = g + 8 * (e >> 1), n = 2 * t + (e & 1);
        float acc = sc.c[lane][e];
        for (int k = 0; k < 8; ++k) {
            const float av = sc.a[4 * (r % 8) + k % 4][(r / 8) + 2 * (k / 4)];
            const float bv = sc.b[4 * n + k % 4][k / 4];
            acc += av * bv;
        }
        out[e] = acc;
    }
    sync_warp();  // every lane has read the scratch before the next mma reuses it
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}

namespace emu {
void launch(KernelFn fn, unsigned grid, unsigned block, unsigned smem_bytes, const void* args, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<unsigned char> shared(smem_bytes + 64);
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    dyn_smem = smem_bytes;
    cur_fn = fn;
    cur_args = args;
    const unsigned nwarps = (block + 31) / 32;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx = {b, 0, 0};
        std::fill(shared.begin(), shared.end(), 0xFF);
        smem = shared.data();
        threads.assign(block, Thread{});
        for (unsigned t = 0; t < block; ++t) {
            Thread& th = threads[t];
            th.stack.resize(1 << 20);
            getcontext(&th.ctx);
            th.ctx.uc_stack.ss_sp = th.stack.data();
            th.ctx.uc_stack.ss_size = th.stack.size();
            th.ctx.uc_link = nullptr;
            makecontext(&th.ctx, entry, 0);
        }
        std::vector<int> order(block);
        for (;;) {
            // run every ready thread once, in a random order, until it blocks
            bool ran = false;
            for (unsigned t = 0; t < block; ++t) order[t] = t;
            std::shuffle(order.begin(), order.end(), rng);
            for (int t : order) {
                if (threads[t].state != READY) continue;
                current = t;
                threadIdx = {(unsigned)t, 0, 0};
                swapcontext(&sched_ctx, &threads[t].ctx);
                ran = true;
            }
            // release barriers: a warp barrier when all its live threads wait at it,
            // the block barrier when every live thread waits at it
            bool all_block = true, any_live = false;
            for (unsigned t = 0; t < block; ++t) {
                if (threads[t].state == DONE) continue;
                any_live = true;
                if (threads[t].state != AT_BLOCK) all_block = false;
            }
            if (!any_live) break;
            bool released = false;
            if (all_block) {
                for (auto& th : threads)
                    if (th.state == AT_BLOCK) th.state = READY;
                released = true;
            } else {
                // named barriers: released when their count of threads waits at them
                for (int id = 1; id < 16; ++id) {
                    int n = 0, want = 0;
                    for (auto& th : threads)
                        if (th.state == AT_BAR && th.bar_id == id) ++n, want = th.bar_count;
                    if (n > 0 && n == want) {
                        for (auto& th : threads)
                            if (th.state == AT_BAR && th.bar_id == id) th.state = READY;
                        released = true;
                    }
                }
                for (unsigned w = 0; w < nwarps; ++w) {
                    bool all = true, some = false;
                    for (unsigned t = w * 32; t < std::min(block, w * 32 + 32); ++t) {
                        if (threads[t].state == DONE) continue;
                        some = true;
                        if (threads[t].state != AT_WARP) all = false;
                    }
                    if (some && all) {
                        for (unsigned t = w * 32; t < std::min(block, w * 32 + 32); ++t)
                            if (threads[t].state == AT_WARP) threads[t].state = READY;
                        released = true;
                    }
                }
            }
            if (!released && !ran) {
                fprintf(stderr, "deadlock in block %u: threads wait at different barriers\n", b);
                abort();
            }
        }
    }
    threads.clear();
}
}  // namespace emu
