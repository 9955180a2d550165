// Memory and race checks of the CPU layer (included by cuda_cpu.h), in the spirit of
// compute-sanitizer's memcheck, racecheck and initcheck.
//
// The loader compiles kernels with g++'s thread-sanitizer instrumentation (-fsanitize=thread,
// without its run-time library): every load and store of the kernel's code calls one of the
// __tsan_* hooks below with its address. The layer's own functions are not instrumented
// (FORGE_EMU_INLINE). For each access of a thread, while checks are on:
//
//   fiber stacks (locals)      nothing to check;
//   static __shared__          the bytes must lie inside one variable (each is followed by
//                              16 guard bytes, Padded), and the shared-memory checks below;
//   dynamic shared memory      the bytes must lie inside the launch's size, and the checks below;
//   anything else (global)     when the launch knows every pointer argument's buffer
//                              (Launch::extents), the bytes must lie inside one of them;
//   every n-byte access        n-aligned, as a GPU requires (a misaligned float4 load faults).
//
// Shared memory, per 4-byte word (ShadowWord): the last writer with the barrier epoch and its
// warp's __syncwarp count at the write, and the readers since. A read of bytes no thread of
// the block wrote is an uninitialised read. Two accesses of different threads, one of them a
// write, conflict unless a __syncthreads lies between them (a later epoch) or, within one warp,
// a __syncwarp does; atomics do not conflict with each other. Shuffles order no memory (CUDA
// gives them no memory-ordering semantics).
//
// The first error aborts the launch (the access is not performed) with a message naming the
// thread, the kind of error and "pc 0x..." (an offset in the library), which the loader turns
// into source lines and the shared variable's name.
#pragma once

#include <dlfcn.h>

namespace forge_emu {

// The checks run on every access of kernel code: inlined into the hooks.
#define FORGE_EMU_HOT FORGE_EMU_INLINE __attribute__((always_inline))

enum class Access : unsigned char { Read, Write, Atomic };

constexpr uint16_t kNobody = 0xffff;
constexpr uint16_t kMany = 0xfffe;
constexpr uint8_t kAtomicWrite = 1;
constexpr uint8_t kSpansWarps = 2;

FORGE_EMU_INLINE const char* access_name(Access kind) {
    return kind == Access::Read ? "read" : kind == Access::Write ? "write" : "atomic";
}

FORGE_EMU_INLINE unsigned long pc_offset(const void* pc) {
    Dl_info info;
    if (pc && dladdr(pc, &info) && info.dli_fbase) return (unsigned long)((const char*)pc - (const char*)info.dli_fbase);
    return 0;
}

// Ends the launch at once: the offending access must not happen (a write outside a buffer
// would corrupt the process's heap).
[[noreturn]] FORGE_EMU_INLINE void abort_launch() { siglongjmp(g_rt->fault_jump, 1); }

#define FORGE_EMU_CHECK_FAIL(pc, fmt, ...)                                                                    \
    do {                                                                                                      \
        fail("thread %u: " fmt " (pc 0x%lx)", g_rt->current->linear, __VA_ARGS__, pc_offset(pc));            \
        abort_launch();                                                                                       \
    } while (0)

FORGE_EMU_HOT bool ordered(const Runtime* rt, unsigned other, uint32_t epoch, uint32_t sync, unsigned warp) {
    return epoch < rt->epoch || (other / kWarp == warp && sync < rt->warp_sync[warp]);
}

FORGE_EMU_HOT void word_access(Runtime* rt, ShadowWord* s, unsigned mask, Access kind, const char* where,
                                  size_t byte, const void* pc) {
    const unsigned t = rt->current->linear, warp = t / kWarp;
    const uint32_t sync = rt->warp_sync[warp];
    if (s->gen != rt->gen) *s = ShadowWord{rt->gen, 0, 0, 0, 0, kNobody, kNobody, 0, 0, 0, 0};
    if (kind == Access::Read && s->reader == t && s->r_epoch == rt->epoch && (s->init & mask) == mask) {
        s->r_sync = sync;  // this thread read the word since its last write: checked then
        return;
    }
    if (kind == Access::Read && (s->init & mask) != mask) {
        FORGE_EMU_CHECK_FAIL(pc, "reads %s byte %zu, which no thread of the block wrote (uninitialised shared memory)",
                             where, byte);
    }
    const bool both_atomic = kind == Access::Atomic && (s->flags & kAtomicWrite);
    if (s->writer != kNobody && s->writer != t && !both_atomic && !ordered(rt, s->writer, s->w_epoch, s->w_sync, warp)) {
        FORGE_EMU_CHECK_FAIL(pc,
                             "%s of %s byte %zu races with thread %u's write (no __syncthreads or __syncwarp "
                             "between them)",
                             access_name(kind), where, byte, (unsigned)s->writer);
    }
    if (kind == Access::Read) {
        if (s->reader == kNobody || s->r_epoch != rt->epoch) {
            s->reader = (uint16_t)t;
            s->r_warp = (uint8_t)warp;
            s->flags &= (uint8_t)~kSpansWarps;
        } else if (s->reader != t) {
            if (s->r_warp != warp) s->flags |= kSpansWarps;
            s->reader = kMany;
        }
        s->r_epoch = rt->epoch;
        s->r_sync = sync;
        return;
    }
    if (s->reader != kNobody && s->reader != t && s->r_epoch == rt->epoch) {
        const bool synced = !(s->flags & kSpansWarps) && s->r_warp == warp && s->r_sync < sync;
        if (!synced) {
            FORGE_EMU_CHECK_FAIL(pc,
                                 "%s of %s byte %zu races with a read by %s %u (no __syncthreads or __syncwarp "
                                 "between them)",
                                 access_name(kind), where, byte, s->reader == kMany ? "threads of warp" : "thread",
                                 s->reader == kMany ? (unsigned)s->r_warp : (unsigned)s->reader);
        }
    }
    s->writer = (uint16_t)t;
    s->w_epoch = rt->epoch;
    s->w_sync = sync;
    s->init |= (uint8_t)mask;
    s->flags = (uint8_t)((s->flags & ~kAtomicWrite) | (kind == Access::Atomic ? kAtomicWrite : 0));
    s->reader = kNobody;
}

// Bytes [offset, offset + n) of a shared region whose shadow starts at word `first_word`.
FORGE_EMU_HOT void shared_access(Runtime* rt, size_t offset, unsigned n, Access kind, const char* where,
                                    size_t first_word, const void* pc) {
    if (!(rt->checks & kCheckRaces)) return;
    for (size_t w = offset / 4; w <= (offset + n - 1) / 4; ++w) {
        unsigned mask = 0;
        for (size_t b = w * 4; b < w * 4 + 4; ++b) {
            if (b >= offset && b < offset + n) mask |= 1u << (b - w * 4);
        }
        word_access(rt, rt->shadow + first_word + w, mask, kind, where, offset, pc);
    }
}

FORGE_EMU_HOT void static_shared_access(Runtime* rt, uintptr_t a, unsigned n, Access kind, const void* pc) {
    const size_t off = a - (uintptr_t)__start_forge_emu_shared;
    if (!rt->static_map) return shared_access(rt, off, n, kind, "static shared", 0, pc);
    const unsigned char var = off < rt->static_map_len ? rt->static_map[off] : 0;
    for (size_t b = off; b < off + n; ++b) {
        if (b >= rt->static_map_len || rt->static_map[b] != var || var == 0) {
            FORGE_EMU_CHECK_FAIL(pc, "%s of %u bytes at static shared byte %zu is outside every __shared__ variable",
                                 access_name(kind), n, b);
        }
    }
    shared_access(rt, off, n, kind, "static shared", 0, pc);
}

FORGE_EMU_HOT void dynamic_shared_access(Runtime* rt, uintptr_t a, unsigned n, Access kind, const void* pc) {
    const uintptr_t dyn = (uintptr_t)rt->dyn;
    if (a < dyn || a + n > dyn + rt->dyn_bytes) {
        FORGE_EMU_CHECK_FAIL(pc, "%s of %u bytes at dynamic shared byte %lld; the launch has %zu bytes",
                             access_name(kind), n, (long long)(a - dyn), rt->dyn_bytes);
    }
    shared_access(rt, a - dyn, n, kind, "dynamic shared", kMaxStaticShared / 4, pc);
}

FORGE_EMU_HOT void global_access(Runtime* rt, uintptr_t a, unsigned n, Access kind, const void* pc) {
    if (!rt->globals_known) return;
    long long nearest = -1;
    uint64_t distance = ~0ull;
    bool before = false;
    const uint32_t hit = rt->last_extent;
    if (hit < rt->n_extents && a >= rt->extents[3 * hit] && a + n <= rt->extents[3 * hit + 1]) return;
    for (uint32_t i = 0; i < rt->n_extents; ++i) {
        const uint64_t lo = rt->extents[3 * i], hi = rt->extents[3 * i + 1];
        if (a >= lo && a + n <= hi) {
            rt->last_extent = i;
            return;
        }
        const uint64_t d = a < lo ? lo - a : (a >= hi ? a - hi : 0);
        if (d < distance) {
            distance = d;
            before = a < lo;
            nearest = (long long)rt->extents[3 * i + 2];
        }
    }
    FORGE_EMU_CHECK_FAIL(pc,
                         "%s of %u bytes at %p is outside every pointer argument's buffer (it starts %llu bytes "
                         "%s the buffer of argument #%lld): an illegal memory access on a GPU",
                         access_name(kind), n, (void*)a, (unsigned long long)distance,
                         before ? "before the start of" : "past the end of", nearest);
}

FORGE_EMU_HOT void check_access(uintptr_t a, unsigned n, Access kind, bool aligned, const void* pc) {
    Runtime* rt = g_rt;
    if (!rt || !rt->checks || !rt->current) return;
    if (a - (uintptr_t)rt->stacks < (uintptr_t)(kMaxThreads * (rt->page + kStackBytes))) return;  // locals
    if (aligned && n > 1 && (a & (n - 1)) && (rt->checks & kCheckMemory)) {
        FORGE_EMU_CHECK_FAIL(pc, "misaligned %s of %u bytes at %p (a GPU faults: misaligned address)",
                             access_name(kind), n, (void*)a);
    }
    if (a - (uintptr_t)__start_forge_emu_shared < static_shared_bytes()) {
        static_shared_access(rt, a, n, kind, pc);
    } else if (a - (uintptr_t)rt->smem_region < (uintptr_t)(rt->guard + rt->page - rt->smem_region)) {
        dynamic_shared_access(rt, a, n, kind, pc);
    } else if (rt->checks & kCheckMemory) {
        global_access(rt, a, n, kind, pc);
    }
}

}  // namespace forge_emu

// ---- the instrumentation's hooks ---------------------------------------------------------------
#define FORGE_EMU_HOOK extern "C" __attribute__((visibility("hidden"), no_sanitize("thread"), noinline))
#define FORGE_EMU_ACCESS_HOOKS(n)                                                                              \
    FORGE_EMU_HOOK void __tsan_read##n(void* a) {                                                              \
        ::forge_emu::check_access((uintptr_t)a, n, ::forge_emu::Access::Read, true, __builtin_return_address(0)); \
    }                                                                                                          \
    FORGE_EMU_HOOK void __tsan_write##n(void* a) {                                                             \
        ::forge_emu::check_access((uintptr_t)a, n, ::forge_emu::Access::Write, true, __builtin_return_address(0)); \
    }                                                                                                          \
    FORGE_EMU_HOOK void __tsan_unaligned_read##n(void* a) {                                                    \
        ::forge_emu::check_access((uintptr_t)a, n, ::forge_emu::Access::Read, false, __builtin_return_address(0)); \
    }                                                                                                          \
    FORGE_EMU_HOOK void __tsan_unaligned_write##n(void* a) {                                                   \
        ::forge_emu::check_access((uintptr_t)a, n, ::forge_emu::Access::Write, false,                         \
                                  __builtin_return_address(0));                                                \
    }

FORGE_EMU_ACCESS_HOOKS(1)
FORGE_EMU_ACCESS_HOOKS(2)
FORGE_EMU_ACCESS_HOOKS(4)
FORGE_EMU_ACCESS_HOOKS(8)
FORGE_EMU_ACCESS_HOOKS(16)

FORGE_EMU_HOOK void __tsan_read_range(void* a, long n) {
    if (n > 0) ::forge_emu::check_access((uintptr_t)a, (unsigned)n, ::forge_emu::Access::Read, false, __builtin_return_address(0));
}
FORGE_EMU_HOOK void __tsan_write_range(void* a, long n) {
    if (n > 0) ::forge_emu::check_access((uintptr_t)a, (unsigned)n, ::forge_emu::Access::Write, false, __builtin_return_address(0));
}
FORGE_EMU_HOOK void __tsan_init() {}
FORGE_EMU_HOOK void __tsan_func_entry(void*) {}
FORGE_EMU_HOOK void __tsan_func_exit(void*) {}
FORGE_EMU_HOOK void __tsan_vptr_update(void*, void*) {}
