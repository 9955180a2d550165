// CUDA's execution model on the CPU, for forge's own kernels (forge/kernels/cuda/*.cu).
//
// A kernel source is compiled as C++ with this header force-included (g++ -include) and
// <cuda_fp16.h> / <cuda_bf16.h> resolving to the stubs next to it. A launch runs the grid's
// blocks one after another; every thread of a block is a fiber with its own stack, switched
// by a few lines of assembly (x86-64) or ucontext (elsewhere). A fiber runs until it reaches
// a synchronisation point, so between two barriers the threads of a block run in turn, and a
// missing barrier shows up as a read of a value not yet written (or of NaN poison):
//
//   __syncthreads()      waits until every thread of the block is at the same __syncthreads;
//                        a barrier some threads skip (another call site, or threads that
//                        exited) aborts the launch with a message naming the line.
//   __syncwarp, shuffles wait only for the lanes of their mask in the same warp (32 lanes,
//                        threads 32w .. 32w+31), which must all reach the same call site;
//                        __shfl*_sync return values exchanged among those lanes only.
//
// Shared memory: every `__shared__` variable lives in the section forge_emu_shared, refilled
// with 0xff bytes (NaN for float, half and bfloat16) before each block; dynamic shared memory
// (`extern __shared__ T name[];`, which the loader rewrites to a pointer, the one construct
// C++ cannot declare) is sized to the launch, NaN-filled, and ends at a PROT_NONE guard page.
// A fault during a launch (guard page, stack overflow, any illegal address) aborts the launch
// with a message instead of killing the process. __half and __nv_bfloat16 convert with
// round-to-nearest-even, bit for bit as the GPU does.
//
// Entry points (extern "C", generated per kernel by the loader, see forge_emu::launch):
// launching a kernel, describing its parameters (size and kind of each) for the argument
// checks, and the static shared memory size. Launches must not run concurrently (the Python
// side holds a lock): they share the arena of fiber stacks and shared memory it allocates.
#pragma once

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#if !defined(__x86_64__) && !defined(FORGE_EMU_UCONTEXT)
#define FORGE_EMU_UCONTEXT 1
#endif
#ifdef FORGE_EMU_UCONTEXT
#include <ucontext.h>
#endif

// ---- CUDA keywords ---------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static __attribute__((section("forge_emu_shared"), aligned(16)))
#define warpSize 32
// The layer's own functions are not instrumented: the memory and race checks
// (cuda_cpu_check.h) see the kernel's accesses only.
#define FORGE_EMU_INLINE inline __attribute__((no_sanitize("thread")))

// ---- vector types -----------------------------------------------------------------------------
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};
// 16-byte vector types: a copy is one 16-byte access, checked for alignment and bounds (a GPU
// faults on a misaligned vector load), rather than four accesses the compiler may split it into.
namespace forge_emu {
inline __attribute__((no_sanitize("thread"))) void vector_copy(void* dst, const void* src, unsigned n, const void* pc);
}
#define FORGE_EMU_VECTOR(T, E)                                                                               \
    struct alignas(16) T {                                                                                   \
        E x, y, z, w;                                                                                        \
        T() = default;                                                                                       \
        constexpr T(E a, E b, E c, E d) : x(a), y(b), z(c), w(d) {}                                          \
        __attribute__((noinline, no_sanitize("thread"))) T(const T& o) {                                     \
            ::forge_emu::vector_copy(this, &o, sizeof(T), __builtin_return_address(0));                     \
        }                                                                                                    \
        __attribute__((noinline, no_sanitize("thread"))) T& operator=(const T& o) {                          \
            ::forge_emu::vector_copy(this, &o, sizeof(T), __builtin_return_address(0));                     \
            return *this;                                                                                    \
        }                                                                                                    \
    };
FORGE_EMU_VECTOR(uint4, unsigned int)
FORGE_EMU_VECTOR(int4, int)
FORGE_EMU_VECTOR(float4, float)
struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(8) float2 {
    float x, y;
};

// ---- math ---------------------------------------------------------------------------------------
__forceinline__ int min(int a, int b) { return a < b ? a : b; }
__forceinline__ int max(int a, int b) { return a > b ? a : b; }
__forceinline__ unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
__forceinline__ unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
__forceinline__ long long min(long long a, long long b) { return a < b ? a : b; }
__forceinline__ long long max(long long a, long long b) { return a > b ? a : b; }
__forceinline__ float min(float a, float b) { return fminf(a, b); }
__forceinline__ float max(float a, float b) { return fmaxf(a, b); }
__forceinline__ float rsqrtf(float x) { return 1.0f / sqrtf(x); }
__forceinline__ float __expf(float x) { return expf(x); }
__forceinline__ float __logf(float x) { return logf(x); }
__forceinline__ float __fdividef(float a, float b) { return a / b; }
__forceinline__ float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

__forceinline__ float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
__forceinline__ int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
__forceinline__ float __uint_as_float(unsigned int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
__forceinline__ unsigned int __float_as_uint(float f) {
    unsigned int i;
    memcpy(&i, &f, 4);
    return i;
}

// ---- half and bfloat16 (storage types; arithmetic goes through float, as in forge's kernels) -----
struct __half {
    unsigned short __x;
};
struct __nv_bfloat16 {
    unsigned short __x;
};

__forceinline__ float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h.__x & 0x8000u) << 16;
    const uint32_t exp = (h.__x >> 10) & 0x1fu;
    const uint32_t mant = h.__x & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
        const float v = (float)mant * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    const uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112u) << 23) | (mant << 13));
    return __uint_as_float(bits);
}

__forceinline__ __half __float2half_rn(float f) {
    const uint32_t x = __float_as_uint(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    __half h;
    if (a > 0x7f800000u) {  // NaN: keep it quiet
        h.__x = (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    } else if (a >= 0x477ff000u) {  // >= 65520 (halfway above 65504) rounds to infinity
        h.__x = (uint16_t)(sign | 0x7c00u);
    } else if (a < 0x38800000u) {  // below 2^-14: subnormal, in units of 2^-24
        h.__x = (uint16_t)(sign | (uint16_t)nearbyintf(__uint_as_float(a) * 16777216.0f));
    } else {  // normal: round to nearest even at bit 13, then rebias the exponent
        const uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;
        h.__x = (uint16_t)(sign | (r >> 13));
    }
    return h;
}
__forceinline__ __half __float2half(float f) { return __float2half_rn(f); }
__forceinline__ __half __ushort_as_half(unsigned short s) {
    __half h;
    h.__x = s;
    return h;
}
__forceinline__ unsigned short __half_as_ushort(__half h) { return h.__x; }

__forceinline__ float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((uint32_t)b.__x << 16); }
__forceinline__ __nv_bfloat16 __float2bfloat16_rn(float f) {
    const uint32_t x = __float_as_uint(f);
    __nv_bfloat16 b;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        b.__x = (uint16_t)((x >> 16) | 0x40u);  // quiet NaN
    } else {
        b.__x = (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    }
    return b;
}
__forceinline__ __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
__forceinline__ __nv_bfloat16 __ushort_as_bfloat16(unsigned short s) {
    __nv_bfloat16 b;
    b.__x = s;
    return b;
}

// ---- fibers -----------------------------------------------------------------------------------------
namespace forge_emu {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 128 * 1024;  // per thread; a PROT_NONE page below each
constexpr size_t kMaxDynamicShared = 227 * 1024;
constexpr unsigned kMaxThreads = 1024;

#ifdef FORGE_EMU_UCONTEXT
struct Context {
    ucontext_t uc;
};
#else
struct Context {
    void* sp;
};
extern "C" void forge_emu_switch(void** save_sp, void* new_sp);
extern "C" void forge_emu_trampoline();
// Saves the callee-saved registers on the current stack, stores the stack pointer in
// *save_sp, switches to new_sp and restores the registers saved there. A new fiber's stack
// is laid out so that the restore "returns" into forge_emu_trampoline, which calls r13(r12).
asm(R"(
    .text
    .p2align 4
    .globl forge_emu_switch
    .hidden forge_emu_switch
    .type forge_emu_switch,@function
forge_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size forge_emu_switch, .-forge_emu_switch
    .globl forge_emu_trampoline
    .hidden forge_emu_trampoline
    .type forge_emu_trampoline,@function
forge_emu_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size forge_emu_trampoline, .-forge_emu_trampoline
)");
#endif

enum class State : unsigned char { Ready, AtBarrier, AtWarp, Exited };
enum class WarpOp : unsigned char { Sync, Shuffle, Vote, Active };

struct Fiber {
    Context ctx;
    uint3 tid;
    unsigned linear;
    State state;
    WarpOp op;
    unsigned mask;
    int line;
    int site;  // __syncthreads: which call site (one per expansion of the macro)
    const char* what;
    int src;  // shuffle: absolute lane index (in the warp) to read
    uint64_t value;
    uint64_t result;
};

struct Launch {
    uint32_t grid[3];
    uint32_t block[3];
    uint64_t shared_mem;
    unsigned char* arena;  // see setup()
    uint64_t arena_size;
    uint64_t page;
    uint32_t checks;      // kCheckMemory | kCheckRaces
    uint32_t seed;        // picks the schedule: block order and thread order per block
    const uint64_t* extents;  // n_extents triples (first byte, end, argument index) of the pointer arguments
    uint32_t n_extents;
    uint32_t globals_known;   // every pointer argument has an extent: global accesses outside them fail
    const unsigned char* static_map;  // per byte of static shared memory: 0 padding, else variable number
    uint64_t static_map_len;
};

constexpr uint32_t kCheckMemory = 1;
constexpr uint32_t kCheckRaces = 2;
constexpr size_t kMaxStaticShared = 48 * 1024;

// Per 4-byte word of shared memory, for the race and initialisation checks (cuda_cpu_check.h).
struct ShadowWord {
    uint32_t gen;      // the block (Runtime::gen) the rest belongs to
    uint32_t w_epoch;  // barrier epoch of the last write
    uint32_t w_sync;   // the writer's warp's __syncwarp count at the last write
    uint32_t r_epoch;  // barrier epoch of the reads since the last write
    uint32_t r_sync;   // the readers' warp's __syncwarp count at the latest read
    uint16_t writer;   // thread, or kNobody
    uint16_t reader;   // thread, kNobody, or kMany
    uint8_t r_warp;    // warp of the readers (one warp, unless kSpansWarps)
    uint8_t init;      // bytes of the word written in this block
    uint8_t flags;     // kAtomicWrite, kSpansWarps
    uint8_t pad;
};

using Invoke = void (*)(void* kernel, void** args);

// Everything one launch needs; one instance per loaded module (runtime()). The memory it
// points into (stacks, shared memory) is the process's arena, passed with each launch.
struct Runtime {
    // fibers and their stacks (in the arena)
    Fiber fibers[kMaxThreads];
    unsigned char* stacks = nullptr;  // kMaxThreads * (page + kStackBytes)
    size_t page = 0;
    // dynamic shared memory: [smem_base, guard) then a PROT_NONE page
    unsigned char* smem_region = nullptr;
    unsigned char* guard = nullptr;
    unsigned char* dyn = nullptr;
    size_t dyn_bytes = 0;
    // the block being run
    Context sched;
    Fiber* current = nullptr;
    unsigned count = 0;
    uint3 block_idx{0, 0, 0};
    dim3 block_dim{1, 1, 1};
    dim3 grid_dim{1, 1, 1};
    void* kernel = nullptr;
    Invoke invoke = nullptr;
    void** args = nullptr;
    // checks (cuda_cpu_check.h)
    uint32_t checks = 0;
    uint32_t gen = 0;    // blocks run so far: shadow words of earlier blocks are stale
    uint32_t epoch = 0;  // __syncthreads released in this block
    uint32_t warp_sync[kMaxThreads / kWarp];
    const uint64_t* extents = nullptr;
    uint32_t n_extents = 0;
    uint32_t last_extent = 0;  // the extent the last global access was in
    bool globals_known = false;
    const unsigned char* static_map = nullptr;
    size_t static_map_len = 0;
    ShadowWord shadow[(kMaxStaticShared + kMaxDynamicShared) / 4];
    // errors
    bool failed = false;
    char message[1024];
    sigjmp_buf fault_jump;
};

inline Runtime* g_rt = nullptr;  // the runtime of the launch in progress (one at a time)

FORGE_EMU_INLINE void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
FORGE_EMU_INLINE void fail(const char* fmt, ...) {
    Runtime* rt = g_rt;
    if (rt->failed) return;  // keep the first error
    rt->failed = true;
    const int n = snprintf(rt->message, sizeof rt->message, "block (%u,%u,%u): ", rt->block_idx.x, rt->block_idx.y,
                           rt->block_idx.z);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt->message + n, sizeof rt->message - (size_t)n, fmt, ap);
    va_end(ap);
}

FORGE_EMU_INLINE void switch_context(Context* from, Context* to) {
#ifdef FORGE_EMU_UCONTEXT
    swapcontext(&from->uc, &to->uc);
#else
    forge_emu_switch(&from->sp, to->sp);
#endif
}

// Back to the scheduler; returns when the scheduler resumes this fiber.
FORGE_EMU_INLINE void yield(Fiber* f) { switch_context(&f->ctx, &g_rt->sched); }

extern "C" FORGE_EMU_INLINE void fiber_main(void*) {
    Runtime* rt = g_rt;
    Fiber* f = rt->current;
    rt->invoke(rt->kernel, rt->args);
    f->state = State::Exited;
    yield(f);
    __builtin_trap();  // an exited fiber is never resumed
}

#ifdef FORGE_EMU_UCONTEXT
extern "C" FORGE_EMU_INLINE void fiber_main_uc() { fiber_main(nullptr); }
#endif

FORGE_EMU_INLINE unsigned char* stack_top(Runtime* rt, unsigned i) {
    return rt->stacks + (size_t)(i + 1) * (rt->page + kStackBytes);
}

FORGE_EMU_INLINE void init_fiber(Runtime* rt, Fiber* f, unsigned i) {
    unsigned char* top = stack_top(rt, i);
#ifdef FORGE_EMU_UCONTEXT
    getcontext(&f->ctx.uc);
    f->ctx.uc.uc_stack.ss_sp = top - kStackBytes;
    f->ctx.uc.uc_stack.ss_size = kStackBytes;
    f->ctx.uc.uc_link = nullptr;
    makecontext(&f->ctx.uc, fiber_main_uc, 0);
#else
    void** sp = reinterpret_cast<void**>(top - 72);  // 16-aligned after the final ret
    sp[0] = nullptr;                                 // r15
    sp[1] = nullptr;                                 // r14
    sp[2] = reinterpret_cast<void*>(&fiber_main);    // r13
    sp[3] = f;                                       // r12
    sp[4] = nullptr;                                 // rbx
    sp[5] = nullptr;                                 // rbp
    sp[6] = reinterpret_cast<void*>(&forge_emu_trampoline);
    f->ctx.sp = sp;
#endif
}

// ---- built-ins used inside kernels ------------------------------------------------------------
FORGE_EMU_INLINE void sync_threads(int line, int site) {
    Fiber* f = g_rt->current;
    f->state = State::AtBarrier;
    f->line = line;
    f->site = site;
    yield(f);
}

FORGE_EMU_INLINE unsigned lane_of(const Fiber* f) { return f->linear % kWarp; }

FORGE_EMU_INLINE void sync_warp(int line, unsigned mask = 0xffffffffu) {
    Fiber* f = g_rt->current;
    if (!(mask & (1u << lane_of(f)))) {
        fail("thread %u calls __syncwarp (line %d) with a mask 0x%08x that leaves out its own lane", f->linear, line,
             mask);
    }
    f->state = State::AtWarp;
    f->op = WarpOp::Sync;
    f->mask = mask;
    f->line = line;
    f->what = "__syncwarp";
    yield(f);
}

template <typename T>
FORGE_EMU_INLINE T shuffle(int line, const char* what, unsigned mask, T var, int src) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffled values are at most 8 bytes");
    Fiber* f = g_rt->current;
    if (!(mask & (1u << lane_of(f)))) {
        fail("thread %u calls %s (line %d) with a mask 0x%08x that leaves out its own lane", f->linear, what, line, mask);
    }
    f->state = State::AtWarp;
    f->op = WarpOp::Shuffle;
    f->mask = mask;
    f->line = line;
    f->what = what;
    f->src = src;
    f->value = 0;
    memcpy(&f->value, &var, sizeof(T));
    yield(f);
    T out;
    memcpy(&out, &f->result, sizeof(T));
    return out;
}

FORGE_EMU_INLINE bool valid_width(int width) { return width >= 1 && width <= kWarp && (width & (width - 1)) == 0; }

template <typename T>
FORGE_EMU_INLINE T shfl_xor(int line, unsigned mask, T var, int lane_mask, int width = kWarp) {
    const int lane = (int)lane_of(g_rt->current);
    if (!valid_width(width)) fail("__shfl_xor_sync (line %d): width %d is not a power of two <= 32", line, width);
    const int base = lane & ~(width - 1);
    int src = lane ^ lane_mask;
    if (src >= base + width) src = lane;  // later groups are out of reach: own value
    return shuffle(line, "__shfl_xor_sync", mask, var, src);
}

template <typename T>
FORGE_EMU_INLINE T shfl(int line, unsigned mask, T var, int src_lane, int width = kWarp) {
    const int lane = (int)lane_of(g_rt->current);
    if (!valid_width(width)) fail("__shfl_sync (line %d): width %d is not a power of two <= 32", line, width);
    const int base = lane & ~(width - 1);
    return shuffle(line, "__shfl_sync", mask, var, base + (src_lane & (width - 1)));
}

template <typename T>
FORGE_EMU_INLINE T shfl_down(int line, unsigned mask, T var, unsigned delta, int width = kWarp) {
    const int lane = (int)lane_of(g_rt->current);
    if (!valid_width(width)) fail("__shfl_down_sync (line %d): width %d is not a power of two <= 32", line, width);
    const int base = lane & ~(width - 1);
    int src = lane + (int)delta;
    if (src >= base + width) src = lane;
    return shuffle(line, "__shfl_down_sync", mask, var, src);
}

template <typename T>
FORGE_EMU_INLINE T shfl_up(int line, unsigned mask, T var, unsigned delta, int width = kWarp) {
    const int lane = (int)lane_of(g_rt->current);
    if (!valid_width(width)) fail("__shfl_up_sync (line %d): width %d is not a power of two <= 32", line, width);
    const int base = lane & ~(width - 1);
    int src = lane - (int)delta;
    if (src < base) src = lane;
    return shuffle(line, "__shfl_up_sync", mask, var, src);
}

FORGE_EMU_INLINE uint3 thread_idx() { return g_rt->current->tid; }
FORGE_EMU_INLINE uint3 block_idx() { return g_rt->block_idx; }
FORGE_EMU_INLINE dim3 block_dim() { return g_rt->block_dim; }
FORGE_EMU_INLINE dim3 grid_dim() { return g_rt->grid_dim; }

// A static __shared__ variable and 16 bytes after it that no access may touch (the loader
// declares every static shared variable as one of these, see build.py).
template <typename T>
struct Padded {
    T value;
    unsigned char guard[16];
};

template <typename T>
FORGE_EMU_INLINE T* dynamic_shared() {
    return reinterpret_cast<T*>(g_rt->dyn);
}

// ---- the scheduler ---------------------------------------------------------------------------------
FORGE_EMU_INLINE const char* state_name(const Fiber& f) {
    switch (f.state) {
        case State::Ready:
            return "running";
        case State::AtBarrier:
            return "at __syncthreads";
        case State::AtWarp:
            return f.what;
        case State::Exited:
            return "exited";
    }
    return "?";
}

// Completes the warp operations whose lanes have all arrived. Returns whether any did; sets
// an error for a warp operation that can never complete.
// __activemask: the lanes at this call once every other lane of the warp has exited or waits
// at a block barrier (diverged); lanes waiting at another warp operation mean a divergence.
FORGE_EMU_INLINE bool resolve_active(Runtime* rt, Fiber* warp, unsigned lanes, int line) {
    unsigned mask = 0;
    for (unsigned m = 0; m < lanes; ++m) {
        const Fiber& f = warp[m];
        if (f.state == State::AtWarp && f.op == WarpOp::Active && f.line == line) {
            mask |= 1u << m;
        } else if (f.state == State::AtWarp) {
            fail("lane %u waits at __activemask (line %d) while lane %u waits at %s (line %d)", __builtin_ctz(mask | (1u << m)),
                 line, m, f.what, f.line);
            return false;
        } else if (f.state == State::Ready) {
            return false;
        }
    }
    for (unsigned m = 0; m < lanes; ++m) {
        if (mask & (1u << m)) {
            warp[m].result = mask;
            warp[m].state = State::Ready;
        }
    }
    return mask != 0;
}

FORGE_EMU_INLINE bool resolve_warp(Runtime* rt, unsigned base) {
    bool progressed = false;
    {
        const unsigned lanes = rt->count - base < (unsigned)kWarp ? rt->count - base : (unsigned)kWarp;
        Fiber* warp = rt->fibers + base;
        for (unsigned l = 0; l < lanes && !rt->failed; ++l) {
            const Fiber& first = warp[l];
            if (first.state != State::AtWarp) continue;
            if (first.op == WarpOp::Active) {
                progressed |= resolve_active(rt, warp, lanes, first.line);
                continue;
            }
            bool complete = true;
            for (unsigned m = 0; m < (unsigned)kWarp; ++m) {
                if (!(first.mask & (1u << m))) continue;
                if (m >= lanes) {
                    fail("%s (line %d) names lane %u in mask 0x%08x but the warp has only %u threads", first.what,
                         first.line, m, first.mask, lanes);
                    return false;
                }
                const Fiber& other = warp[m];
                if (other.state == State::AtWarp && other.op == first.op && other.line == first.line &&
                    other.mask == first.mask) {
                    continue;
                }
                complete = false;
                fail("lane %u of warp %u waits at %s (line %d, mask 0x%08x) but lane %u is %s (line %d): divergent "
                     "warp synchronisation",
                     l, base / kWarp, first.what, first.line, first.mask, m, state_name(other),
                     other.state == State::Exited ? -1 : other.line);
                return false;
            }
            if (!complete) continue;
            for (unsigned m = 0; m < (unsigned)kWarp; ++m) {
                if (!(first.mask & (1u << m))) continue;
                Fiber& f = warp[m];
                if (f.op == WarpOp::Vote) {
                    f.result = 0;
                    for (unsigned v = 0; v < (unsigned)kWarp; ++v) {
                        if ((first.mask & (1u << v)) && warp[v].value) f.result |= 1ull << v;
                    }
                } else if (f.op == WarpOp::Shuffle) {
                    if (!(first.mask & (1u << f.src))) {
                        fail("%s (line %d): lane %u reads lane %d, which is not in the mask 0x%08x", f.what, f.line, m,
                             f.src, first.mask);
                        return false;
                    }
                    f.result = warp[f.src].value;
                }
            }
            for (unsigned m = 0; m < (unsigned)kWarp; ++m) {
                if (first.mask & (1u << m)) warp[m].state = State::Ready;
            }
            if (first.op == WarpOp::Sync) ++rt->warp_sync[base / kWarp];  // orders the lanes' memory accesses
            progressed = true;
        }
    }
    return progressed;
}

FORGE_EMU_INLINE bool resolve_warps(Runtime* rt) {
    bool progressed = false;
    for (unsigned base = 0; base < rt->count && !rt->failed; base += kWarp) progressed |= resolve_warp(rt, base);
    return progressed;
}

// Releases the block barrier when every thread is at the same one; otherwise the block can
// never continue and this sets the error.
FORGE_EMU_INLINE void resolve_barrier(Runtime* rt) {
    unsigned at_barrier = 0, exited = 0, at_warp = 0;
    const Fiber* waiting = nullptr;
    const Fiber* gone = nullptr;
    const Fiber* stuck = nullptr;
    for (unsigned i = 0; i < rt->count; ++i) {
        const Fiber& f = rt->fibers[i];
        if (f.state == State::AtBarrier) {
            ++at_barrier;
            if (!waiting) waiting = &f;
        } else if (f.state == State::Exited) {
            ++exited;
            if (!gone) gone = &f;
        } else if (f.state == State::AtWarp) {
            ++at_warp;
            if (!stuck) stuck = &f;
        }
    }
    if (at_barrier == 0) {
        if (at_warp) fail("thread %u waits at %s (line %d) forever", stuck->linear, stuck->what, stuck->line);
        return;  // every thread exited
    }
    if (exited) {
        fail("__syncthreads (line %d) reached by %u threads after %u threads of the block exited (thread %u): "
             "a barrier inside divergent code",
             waiting->line, at_barrier, exited, gone->linear);
        return;
    }
    if (at_warp) {
        fail("thread %u waits at __syncthreads (line %d) while thread %u waits at %s (line %d): divergent "
             "synchronisation",
             waiting->linear, waiting->line, stuck->linear, stuck->what, stuck->line);
        return;
    }
    for (unsigned i = 0; i < rt->count; ++i) {
        if (rt->fibers[i].site != waiting->site) {
            fail("threads wait at different __syncthreads: thread %u at line %d, thread %u at line %d (a barrier "
                 "inside divergent code)",
                 waiting->linear, waiting->line, i, rt->fibers[i].line);
            return;
        }
    }
    for (unsigned i = 0; i < rt->count; ++i) rt->fibers[i].state = State::Ready;
    ++rt->epoch;
}

extern "C" char __start_forge_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_forge_emu_shared[] __attribute__((weak, visibility("hidden")));

FORGE_EMU_INLINE size_t static_shared_bytes() {
    return __start_forge_emu_shared ? (size_t)(__stop_forge_emu_shared - __start_forge_emu_shared) : 0;
}

FORGE_EMU_INLINE void run_fiber(Runtime* rt, Fiber* f) {
    rt->current = f;
    switch_context(&rt->sched, &f->ctx);
}

// One round: every ready thread runs to its next synchronisation point (or its end), in
// thread order or in reverse.
FORGE_EMU_INLINE void run_round(Runtime* rt, bool reverse) {
    for (unsigned k = 0; k < rt->count && !rt->failed; ++k) {
        Fiber* f = rt->fibers + (reverse ? rt->count - 1 - k : k);
        if (f->state == State::Ready) run_fiber(rt, f);
    }
}

// Each warp in turn runs ahead, through its warp operations, until every lane of it waits at
// a block barrier or has exited (as independent thread scheduling lets a warp do).
FORGE_EMU_INLINE void run_warps_ahead(Runtime* rt) {
    for (unsigned base = 0; base < rt->count && !rt->failed; base += kWarp) {
        const unsigned end = rt->count - base < (unsigned)kWarp ? rt->count : base + kWarp;
        do {
            for (unsigned i = base; i < end && !rt->failed; ++i) {
                if (rt->fibers[i].state == State::Ready) run_fiber(rt, rt->fibers + i);
            }
        } while (!rt->failed && resolve_warp(rt, base));
    }
}

enum class Schedule : unsigned { Forward, Reverse, WarpsAhead };

FORGE_EMU_INLINE void reset_block(Runtime* rt) {
    if (static_shared_bytes()) memset(__start_forge_emu_shared, 0xff, static_shared_bytes());
    memset(rt->smem_region, 0xff, (size_t)(rt->guard - rt->smem_region));
    ++rt->gen;
    rt->epoch = 0;
    memset(rt->warp_sync, 0, sizeof rt->warp_sync);
    for (unsigned i = 0; i < rt->count; ++i) {
        Fiber* f = rt->fibers + i;
        f->linear = i;
        f->tid.x = i % rt->block_dim.x;
        f->tid.y = (i / rt->block_dim.x) % rt->block_dim.y;
        f->tid.z = i / (rt->block_dim.x * rt->block_dim.y);
        f->state = State::Ready;
        f->line = 0;
        f->site = -1;
        init_fiber(rt, f, i);
    }
}

// The threads of a block run between synchronisation points in one of three orders, chosen
// per block from the launch's seed: thread order, reverse order, or each warp running ahead to
// its next barrier. A read of a value another thread writes without a barrier in between sees
// the poison (or a stale value) under one of them whichever neighbour it is; the race check
// (cuda_cpu_check.h) reports it under all of them.
FORGE_EMU_INLINE void run_block(Runtime* rt, Schedule schedule) {
    reset_block(rt);
    for (;;) {
        if (schedule == Schedule::WarpsAhead) {
            run_warps_ahead(rt);
        } else {
            run_round(rt, schedule == Schedule::Reverse);
        }
        if (rt->failed) return;
        if (resolve_warps(rt)) continue;
        if (rt->failed) return;
        bool all_exited = true;
        for (unsigned i = 0; i < rt->count && all_exited; ++i) all_exited = rt->fibers[i].state == State::Exited;
        if (all_exited) break;
        resolve_barrier(rt);
        if (rt->failed) return;
    }
    // Bytes between the end of the launch's dynamic shared memory and the guard page (at
    // most 15, alignment) must still hold the fill.
    for (unsigned char* p = rt->dyn + rt->dyn_bytes; p < rt->guard; ++p) {
        if (*p != 0xff) {
            fail("a thread wrote byte %zu of dynamic shared memory; the launch has %zu bytes", (size_t)(p - rt->dyn),
                 rt->dyn_bytes);
            return;
        }
    }
}

// ---- faults --------------------------------------------------------------------------------------------
FORGE_EMU_INLINE void on_fault(int sig, siginfo_t* info, void*) {
    Runtime* rt = g_rt;
    const unsigned char* addr = static_cast<const unsigned char*>(info->si_addr);
    Fiber* f = rt->current;
    const unsigned tid = f ? f->linear : 0;
    rt->failed = false;  // the fault is the error to report
    if (addr >= rt->guard && addr < rt->guard + rt->page) {
        fail("thread %u accessed dynamic shared memory at byte %zu; the launch has %zu bytes (guard page hit)", tid,
             (size_t)(addr - rt->dyn), rt->dyn_bytes);
    } else if (addr >= rt->stacks && addr < stack_top(rt, kMaxThreads - 1)) {
        fail("thread %u overflowed its %zu KiB stack", tid, kStackBytes / 1024);
    } else {
        fail("thread %u: %s at address %p (an illegal memory access on a GPU)", tid,
             sig == SIGBUS ? "bus error" : "segmentation fault", info->si_addr);
    }
    siglongjmp(rt->fault_jump, 1);
}

// The memory every module's launches share, one launch at a time, allocated and guarded by
// the loader (forge.kernels.cuda.cpu_emu.build.arena): kMaxThreads stacks of kStackBytes,
// each above a PROT_NONE page, then dynamic shared memory rounded up to pages and a PROT_NONE
// page after it.
FORGE_EMU_INLINE size_t smem_bytes(size_t page) { return (kMaxDynamicShared + page - 1) / page * page; }
FORGE_EMU_INLINE size_t arena_bytes(size_t page) { return kMaxThreads * (page + kStackBytes) + smem_bytes(page) + page; }

FORGE_EMU_INLINE bool setup(Runtime* rt, const Launch* launch, char* err, size_t err_len) {
    if (launch->arena_size != arena_bytes(launch->page)) {
        snprintf(err, err_len, "the loader's arena (%llu bytes) does not match cuda_cpu.h's layout (%zu bytes)",
                 (unsigned long long)launch->arena_size, arena_bytes(launch->page));
        return false;
    }
    rt->page = launch->page;
    rt->stacks = launch->arena;
    rt->smem_region = launch->arena + kMaxThreads * (rt->page + kStackBytes);
    rt->guard = rt->smem_region + smem_bytes(rt->page);
    return true;
}

// Blocks run one after another, in grid order, or in reverse on odd seeds (so a block that
// depends on another without a grid-wide sync sees it unfinished under one of the two).
FORGE_EMU_INLINE void run_grid(Runtime* rt, const Launch* launch) {
    const uint64_t gx = launch->grid[0], gy = launch->grid[1], n = gx * gy * launch->grid[2];
    for (uint64_t k = 0; k < n && !rt->failed; ++k) {
        const uint64_t b = (launch->seed & 1u) ? n - 1 - k : k;
        rt->block_idx = uint3{(unsigned)(b % gx), (unsigned)(b / gx % gy), (unsigned)(b / (gx * gy))};
        run_block(rt, static_cast<Schedule>((b + launch->seed) % 3));
    }
}

// Runs kernel over the grid. Returns 0, or 1 with the error message in err.
FORGE_EMU_INLINE int run(Runtime* rt, void* kernel, Invoke invoke, const Launch* launch, void** args, char* err,
               size_t err_len) {
    if (!setup(rt, launch, err, err_len)) return 1;
    const unsigned threads = launch->block[0] * launch->block[1] * launch->block[2];
    if (threads == 0 || threads > kMaxThreads || launch->shared_mem > kMaxDynamicShared) {
        snprintf(err, err_len, "invalid launch: %u threads, %llu bytes of dynamic shared memory", threads,
                 (unsigned long long)launch->shared_mem);
        return 1;
    }
    g_rt = rt;
    rt->failed = false;
    rt->message[0] = 0;
    rt->count = threads;
    rt->block_dim = dim3{launch->block[0], launch->block[1], launch->block[2]};
    rt->grid_dim = dim3{launch->grid[0], launch->grid[1], launch->grid[2]};
    rt->dyn_bytes = launch->shared_mem;
    rt->dyn = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(rt->guard) - launch->shared_mem) &
                                               ~static_cast<uintptr_t>(15));
    rt->kernel = kernel;
    rt->invoke = invoke;
    rt->args = args;
    rt->current = nullptr;
    rt->checks = launch->checks;
    rt->extents = launch->extents;
    rt->n_extents = launch->n_extents;
    rt->globals_known = launch->globals_known != 0;
    rt->static_map = launch->static_map;
    rt->static_map_len = launch->static_map_len;

    // Faults (guard pages, bad addresses) become errors; the handler runs on its own stack.
    static unsigned char alt_stack[64 * 1024];
    stack_t alt{}, old_alt{};
    alt.ss_sp = alt_stack;
    alt.ss_size = sizeof alt_stack;
    sigaltstack(&alt, &old_alt);
    struct sigaction action {}, old_segv{}, old_bus{};
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &old_segv);
    sigaction(SIGBUS, &action, &old_bus);
    if (sigsetjmp(rt->fault_jump, 1) == 0) run_grid(rt, launch);
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    sigaltstack(&old_alt, nullptr);
    g_rt = nullptr;
    if (rt->failed) {
        snprintf(err, err_len, "%s", rt->message);
        return 1;
    }
    return 0;
}

template <typename... P, size_t... I>
FORGE_EMU_INLINE void call_kernel(void (*fn)(P...), void** args, std::index_sequence<I...>) {
    fn(*static_cast<P*>(args[I])...);
}

template <typename... P>
FORGE_EMU_INLINE void invoke_kernel(void* kernel, void** args) {
    call_kernel(reinterpret_cast<void (*)(P...)>(kernel), args, std::index_sequence_for<P...>{});
}

FORGE_EMU_INLINE Runtime* runtime() {
    static Runtime instance;
    return &instance;
}

template <typename... P>
FORGE_EMU_INLINE int launch(void (*kernel)(P...), const Launch* config, void** args, char* err, size_t err_len) {
    return run(runtime(), reinterpret_cast<void*>(kernel), &invoke_kernel<P...>, config, args, err, err_len);
}

template <typename T>
constexpr char kind_of() {
    return std::is_pointer<T>::value ? 'p'
           : std::is_floating_point<T>::value ? 'f'
           : std::is_integral<T>::value ? (std::is_signed<T>::value ? 'i' : 'u')
                                        : 'o';
}

// Writes each parameter's size and kind ('p' pointer, 'f' float, 'i'/'u' integer, 'o' other);
// returns the number of parameters.
template <typename... P>
FORGE_EMU_INLINE int describe(void (*)(P...), int* sizes, char* kinds, int capacity) {
    const int n = (int)sizeof...(P);
    const int size_list[] = {(int)sizeof(P)..., 0};
    const char kind_list[] = {kind_of<P>()..., 0};
    for (int i = 0; i < n && i < capacity; ++i) {
        sizes[i] = size_list[i];
        kinds[i] = kind_list[i];
    }
    return n;
}

}  // namespace forge_emu

#define threadIdx (::forge_emu::thread_idx())
#define blockIdx (::forge_emu::block_idx())
#define blockDim (::forge_emu::block_dim())
#define gridDim (::forge_emu::grid_dim())
#define __syncthreads() ::forge_emu::sync_threads(__LINE__, __COUNTER__)
#define __syncwarp(...) ::forge_emu::sync_warp(__LINE__, ##__VA_ARGS__)
#define __shfl_xor_sync(...) ::forge_emu::shfl_xor(__LINE__, __VA_ARGS__)
#define __shfl_sync(...) ::forge_emu::shfl(__LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::forge_emu::shfl_down(__LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::forge_emu::shfl_up(__LINE__, __VA_ARGS__)

#include "cuda_cpu_check.h"
#include "cuda_cpu_intrinsics.h"
