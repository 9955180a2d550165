// CUDA intrinsics beyond forge's current kernels, so that new kernels are not limited by the
// CPU layer (included by cuda_cpu.h): atomics on shared and global memory, warp votes and
// __activemask, __ldg, memory fences, __half2 / __nv_bfloat162 arithmetic and the explicitly
// rounded float operations. FMA contraction is the compiler's (-mfma, contraction on, as NVRTC's
// default -fmad=true); __fmul_rn / __fadd_rn are never contracted, as on a GPU.
//
// Threads of a block run one at a time between synchronisation points, so an atomic is one
// read-modify-write; the race check records it as an atomic access (two atomics never race).
#pragma once

namespace forge_emu {

template <typename T, typename F>
FORGE_EMU_INLINE T atomic_rmw(T* address, F op, const void* pc) {
    check_access((uintptr_t)address, sizeof(T), Access::Atomic, true, pc);
    const T old = *address;
    *address = op(old);
    return old;
}

FORGE_EMU_INLINE unsigned vote(int line, const char* what, unsigned mask, int predicate) {
    Fiber* f = g_rt->current;
    if (!(mask & (1u << lane_of(f)))) {
        fail("thread %u calls %s (line %d) with a mask 0x%08x that leaves out its own lane", f->linear, what, line,
             mask);
    }
    f->state = State::AtWarp;
    f->op = WarpOp::Vote;
    f->mask = mask;
    f->line = line;
    f->what = what;
    f->value = predicate != 0;
    yield(f);
    return (unsigned)f->result;
}

// The lanes of the caller's warp executing this call together: it waits until every other lane
// has arrived, exited or is waiting at a block barrier.
FORGE_EMU_INLINE unsigned active_mask(int line) {
    Fiber* f = g_rt->current;
    f->state = State::AtWarp;
    f->op = WarpOp::Active;
    f->mask = 0;
    f->line = line;
    f->what = "__activemask";
    yield(f);
    return (unsigned)f->result;
}

FORGE_EMU_INLINE void vector_copy(void* dst, const void* src, unsigned n, const void* pc) {
    check_access((uintptr_t)src, n, Access::Read, true, pc);
    check_access((uintptr_t)dst, n, Access::Write, true, pc);
    memcpy(dst, src, n);
}

// Round-to-odd double -> float: a later float -> half/bfloat16 rounding to nearest is then
// correctly rounded (float keeps more than two extra bits).
FORGE_EMU_INLINE float to_float_odd(double d) {
    float f = (float)d;
    if ((double)f != d && !(__float_as_uint(f) & 1u)) f = nextafterf(f, d > (double)f ? INFINITY : -INFINITY);
    return f;
}

}  // namespace forge_emu

#define FORGE_EMU_PC __builtin_return_address(0)
#define FORGE_EMU_ATOMIC(name, T, expr)                                                                        \
    __attribute__((noinline, no_sanitize("thread"))) inline T name(T* address, T val) {                    \
        return ::forge_emu::atomic_rmw(address, [val](T old) { return (T)(expr); }, FORGE_EMU_PC);        \
    }

FORGE_EMU_ATOMIC(atomicAdd, int, old + val)
FORGE_EMU_ATOMIC(atomicAdd, unsigned int, old + val)
FORGE_EMU_ATOMIC(atomicAdd, unsigned long long, old + val)
FORGE_EMU_ATOMIC(atomicAdd, float, old + val)
FORGE_EMU_ATOMIC(atomicAdd, double, old + val)
FORGE_EMU_ATOMIC(atomicSub, int, old - val)
FORGE_EMU_ATOMIC(atomicSub, unsigned int, old - val)
FORGE_EMU_ATOMIC(atomicExch, int, val)
FORGE_EMU_ATOMIC(atomicExch, unsigned int, val)
FORGE_EMU_ATOMIC(atomicExch, unsigned long long, val)
FORGE_EMU_ATOMIC(atomicExch, float, val)
FORGE_EMU_ATOMIC(atomicMax, int, old > val ? old : val)
FORGE_EMU_ATOMIC(atomicMax, unsigned int, old > val ? old : val)
FORGE_EMU_ATOMIC(atomicMax, unsigned long long, old > val ? old : val)
FORGE_EMU_ATOMIC(atomicMax, long long, old > val ? old : val)
FORGE_EMU_ATOMIC(atomicMin, int, old < val ? old : val)
FORGE_EMU_ATOMIC(atomicMin, unsigned int, old < val ? old : val)
FORGE_EMU_ATOMIC(atomicMin, unsigned long long, old < val ? old : val)
FORGE_EMU_ATOMIC(atomicMin, long long, old < val ? old : val)
FORGE_EMU_ATOMIC(atomicAnd, int, old & val)
FORGE_EMU_ATOMIC(atomicAnd, unsigned int, old & val)
FORGE_EMU_ATOMIC(atomicOr, int, old | val)
FORGE_EMU_ATOMIC(atomicOr, unsigned int, old | val)
FORGE_EMU_ATOMIC(atomicXor, int, old ^ val)
FORGE_EMU_ATOMIC(atomicXor, unsigned int, old ^ val)
FORGE_EMU_ATOMIC(atomicInc, unsigned int, old >= val ? 0u : old + 1u)

#define FORGE_EMU_CAS(T)                                                                                      \
    __attribute__((noinline, no_sanitize("thread"))) inline T atomicCAS(T* address, T compare, T val) {    \
        return ::forge_emu::atomic_rmw(address, [=](T old) { return old == compare ? val : old; }, FORGE_EMU_PC); \
    }
FORGE_EMU_CAS(int)
FORGE_EMU_CAS(unsigned int)
FORGE_EMU_CAS(unsigned long long)
FORGE_EMU_CAS(unsigned short)

#define __ballot_sync(mask, pred) ::forge_emu::vote(__LINE__, "__ballot_sync", (mask), (pred))
#define __any_sync(mask, pred) (::forge_emu::vote(__LINE__, "__any_sync", (mask), (pred)) != 0u)
#define __all_sync(mask, pred)                                                                                \
    ([](unsigned m, unsigned b) { return (b & m) == m; }((mask), ::forge_emu::vote(__LINE__, "__all_sync", (mask), (pred))))
#define __activemask() ::forge_emu::active_mask(__LINE__)

template <typename T>
__forceinline__ T __ldg(const T* p) {
    return *p;
}

// One OS thread runs every thread of the grid: fences have nothing to order.
__forceinline__ void __threadfence_block() {}
__forceinline__ void __threadfence() {}
__forceinline__ void __threadfence_system() {}

// ---- float operations with explicit rounding (never contracted) -----------------------------------
__attribute__((noinline)) inline float __fmul_rn(float a, float b) { return a * b; }
__attribute__((noinline)) inline float __fadd_rn(float a, float b) { return a + b; }
__attribute__((noinline)) inline float __fsub_rn(float a, float b) { return a - b; }
__forceinline__ float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
__forceinline__ float __fdiv_rn(float a, float b) { return a / b; }
__forceinline__ int __float2int_rn(float x) { return (int)nearbyintf(x); }

// ---- half and bfloat16 arithmetic (exact in double, rounded once) ---------------------------------
struct alignas(4) __half2 {
    __half x, y;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

__forceinline__ __half half_of(double d) { return __float2half_rn(::forge_emu::to_float_odd(d)); }
__forceinline__ __nv_bfloat16 bf16_of(double d) { return __float2bfloat16_rn(::forge_emu::to_float_odd(d)); }
__forceinline__ double dbl(__half h) { return (double)__half2float(h); }
__forceinline__ double dbl(__nv_bfloat16 b) { return (double)__bfloat162float(b); }

__forceinline__ __half __hadd(__half a, __half b) { return half_of(dbl(a) + dbl(b)); }
__forceinline__ __half __hsub(__half a, __half b) { return half_of(dbl(a) - dbl(b)); }
__forceinline__ __half __hmul(__half a, __half b) { return half_of(dbl(a) * dbl(b)); }
__forceinline__ __half __hfma(__half a, __half b, __half c) { return half_of(fma(dbl(a), dbl(b), dbl(c))); }
__forceinline__ __half __hneg(__half a) { return __ushort_as_half((unsigned short)(a.__x ^ 0x8000u)); }
__forceinline__ __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return bf16_of(dbl(a) + dbl(b)); }
__forceinline__ __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return bf16_of(dbl(a) * dbl(b)); }
__forceinline__ __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    return bf16_of(fma(dbl(a), dbl(b), dbl(c)));
}

__forceinline__ __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
__forceinline__ __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
__forceinline__ __half2 __float2half2_rn(float a) { return __floats2half2_rn(a, a); }
__forceinline__ float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
__forceinline__ float __low2float(__half2 h) { return __half2float(h.x); }
__forceinline__ float __high2float(__half2 h) { return __half2float(h.y); }
__forceinline__ __half __low2half(__half2 h) { return h.x; }
__forceinline__ __half __high2half(__half2 h) { return h.y; }
__forceinline__ __half2 __hadd2(__half2 a, __half2 b) { return __half2{__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
__forceinline__ __half2 __hsub2(__half2 a, __half2 b) { return __half2{__hsub(a.x, b.x), __hsub(a.y, b.y)}; }
__forceinline__ __half2 __hmul2(__half2 a, __half2 b) { return __half2{__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
__forceinline__ __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
    return __half2{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}
__forceinline__ __half2 __hneg2(__half2 a) { return __half2{__hneg(a.x), __hneg(a.y)}; }

__forceinline__ __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
__forceinline__ float2 __bfloat1622float2(__nv_bfloat162 h) {
    return float2{__bfloat162float(h.x), __bfloat162float(h.y)};
}
__forceinline__ __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __nv_bfloat162{__hadd(a.x, b.x), __hadd(a.y, b.y)};
}
__forceinline__ __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __nv_bfloat162{__hmul(a.x, b.x), __hmul(a.y, b.y)};
}
__forceinline__ __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
    return __nv_bfloat162{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}
