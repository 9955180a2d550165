/* The synthetic model's decode chain (forge.models.synthetic): per row, write each token's KV slot,
 * read the last `order` tokens back through the block table and take the next token from Python's
 * own hash of the tuple (seed, [position,] context...) - CPython's tuple hash (xxHash lanes, as in
 * Objects/tupleobject.c) over int hashes (x mod 2^61 - 1, keeping the sign; -1 hashes to -2), so the
 * tokens are those `SyntheticModel.next_token` gives, bit for bit (forge.kernels.cpu.synthetic checks
 * this hash against Python's when it loads the library). */
#include <stdint.h>

#define XXPRIME_1 11400714785074694791ULL
#define XXPRIME_2 14029467366897019727ULL
#define XXPRIME_5 2870177450012600261ULL
#define HASH_MODULUS ((1ULL << 61) - 1)
#define MAX_ORDER 64

static inline uint64_t int_hash(int64_t x) {
    uint64_t magnitude = x < 0 ? (uint64_t)(-(x + 1)) + 1 : (uint64_t)x;
    int64_t h = (int64_t)(magnitude % HASH_MODULUS);
    if (x < 0) h = -h;
    return (uint64_t)(h == -1 ? -2 : h);
}

static inline uint64_t tuple_add(uint64_t acc, uint64_t lane) {
    acc += lane * XXPRIME_2;
    acc = (acc << 31) | (acc >> 33);
    return acc * XXPRIME_1;
}

static inline int64_t tuple_end(uint64_t acc, uint64_t len) {
    acc += len ^ (XXPRIME_5 ^ 3527539ULL);
    return acc == (uint64_t)-1 ? 1546275796 : (int64_t)acc;
}

/* hash(tuple(values[:n])) for int values. */
int64_t forge_synthetic_tuple_hash(const int64_t *values, int64_t n) {
    uint64_t acc = XXPRIME_5;
    for (int64_t i = 0; i < n; i++) acc = tuple_add(acc, int_hash(values[i]));
    return tuple_end(acc, (uint64_t)n);
}

static inline int64_t floor_mod(int64_t a, int64_t m) {
    int64_t r = a % m;
    return r < 0 ? r + m : r;
}

/* Row i decodes num_steps[i] tokens from position starts[i], its first input tokens[i], through the
 * part of its block table at tables[offsets[i]...]: the request's blocks from first_blocks[i] on. The
 * sampled tokens go to out, row after row. Returns 0, or -1 when order is out of range. */
int forge_synthetic_decode_rows(int64_t *k, int64_t *v, int64_t block_size, int64_t order, int64_t seed,
                                uint64_t threshold, int64_t first, int64_t span, int64_t rows,
                                const int64_t *starts, const int64_t *tokens, const int64_t *num_steps,
                                const int64_t *tables, const int64_t *offsets, const int64_t *first_blocks,
                                int64_t *out) {
    if (order < 1 || order > MAX_ORDER) return -1;
    const uint64_t seed_lane = int_hash(seed), minus_one = int_hash(-1);
    uint64_t context[MAX_ORDER];
    for (int64_t i = 0; i < rows; i++) {
        const int64_t *table = tables + offsets[i], first_block = first_blocks[i];
        int64_t token = tokens[i];
        for (int64_t p = starts[i], end = starts[i] + num_steps[i]; p < end; p++) {
            int64_t slot = table[p / block_size - first_block] * block_size + p % block_size;
            k[slot] = v[slot] = token;
            for (int64_t j = 0; j < order; j++) {
                int64_t q = p - order + 1 + j;
                context[j] = q < 0 ? minus_one
                                   : int_hash(k[table[q / block_size - first_block] * block_size + q % block_size]);
            }
            uint64_t gate = tuple_add(tuple_add(tuple_add(tuple_add(XXPRIME_5, seed_lane), minus_one),
                                                int_hash(p)), context[order - 1]);
            uint64_t acc = tuple_add(XXPRIME_5, seed_lane);
            uint64_t len = (uint64_t)order + 1;
            if (((uint64_t)tuple_end(gate, 4) & 0xFFFFFFFFULL) >= threshold) {
                acc = tuple_add(acc, int_hash(p));
                len++;
            }
            for (int64_t j = 0; j < order; j++) acc = tuple_add(acc, context[j]);
            token = first + floor_mod(tuple_end(acc, len), span);
            *out++ = token;
        }
    }
    return 0;
}
