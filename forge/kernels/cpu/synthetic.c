/* The synthetic model's decode chain (forge.models.synthetic): per row, write each token's KV slot,
 * take the last `order` tokens (read back through the block table at the row's first position, then
 * moved along as the row writes) and take the next token from Python's
 * own hash of the tuple (seed, [position,] context...) - CPython's tuple hash (xxHash lanes, as in
 * Objects/tupleobject.c) over int hashes (x mod 2^61 - 1, keeping the sign; -1 hashes to -2), so the
 * tokens are those `SyntheticModel.next_token` gives, bit for bit (forge.kernels.cpu.synthetic checks
 * this hash against Python's when it loads the library). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
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

static int64_t item(PyObject *list, Py_ssize_t i) { return PyLong_AsLongLong(PyList_GET_ITEM(list, i)); }

/* Row i decodes num_steps[i] tokens from position starts[i], its first input tokens[i], through its
 * block table tables[i] (lists of Python ints; called through ctypes.PyDLL, so with the GIL). Returns
 * a new list of each row's sampled tokens, or NULL with a Python exception set. */
PyObject *forge_synthetic_decode_rows(int64_t *k, int64_t *v, int64_t num_slots, int64_t block_size, int64_t order,
                                      int64_t seed,
                                      uint64_t threshold, int64_t first, int64_t span, PyObject *starts,
                                      PyObject *tokens, PyObject *num_steps, PyObject *tables) {
    if (order < 1 || order > MAX_ORDER || block_size < 1 || span < 1) {
        PyErr_SetString(PyExc_ValueError, "synthetic chain: order, block size or span out of range");
        return NULL;
    }
    if (!PyList_Check(starts) || !PyList_Check(tokens) || !PyList_Check(num_steps) || !PyList_Check(tables)) {
        PyErr_SetString(PyExc_TypeError, "synthetic chain: rows must be lists");
        return NULL;
    }
    Py_ssize_t rows = PyList_GET_SIZE(starts);
    if (PyList_GET_SIZE(tokens) != rows || PyList_GET_SIZE(num_steps) != rows || PyList_GET_SIZE(tables) != rows) {
        PyErr_SetString(PyExc_ValueError, "synthetic chain: rows of different lengths");
        return NULL;
    }
    const uint64_t seed_lane = int_hash(seed), minus_one = int_hash(-1);
    uint64_t context[MAX_ORDER];
    PyObject *out = PyList_New(rows);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < rows; i++) {
        int64_t start = item(starts, i), token = item(tokens, i), n = item(num_steps, i);
        PyObject *table = PyList_GET_ITEM(tables, i);
        int64_t hi = n > 0 ? (start + n - 1) / block_size : 0;
        PyObject *sampled = PyList_New(n > 0 ? n : 0);
        if (sampled == NULL || PyErr_Occurred() || !PyList_Check(table) || hi >= PyList_GET_SIZE(table) || start < 0) {
            Py_XDECREF(sampled);
            Py_DECREF(out);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "synthetic chain: a row outside its block table");
            return NULL;
        }
        PyList_SET_ITEM(out, i, sampled);
        if (n <= 0) continue;  /* nothing to decode: no slot is read (the table check above assumed a step) */
        /* the row's first context is read back through the table (positions < 0: -1); after each step it
         * moves by one position: what reading back the slots would give, as the row's own writes land on
         * its later positions only, never on the slots of the positions its context holds */
        for (int64_t c = 0; c < order - 1; c++) {
            int64_t q = start - order + 1 + c, at = q < 0 ? 0 : item(table, q / block_size) * block_size + q % block_size;
            if (PyErr_Occurred() || at < 0 || at >= num_slots) goto outside;  /* a block id overflowed, or outside */
            context[c] = q < 0 ? minus_one : int_hash(k[at]);
        }
        int64_t base = 0;
        for (int64_t p = start, j = 0; j < n; p++, j++) {
            if (j == 0 || p % block_size == 0) {
                base = item(table, p / block_size) * block_size;
                if (PyErr_Occurred() || base < 0 || base + block_size > num_slots) goto outside;
            }
            int64_t slot = base + p % block_size;
            k[slot] = v[slot] = token;
            if (j > 0)
                for (int64_t c = 0; c < order - 1; c++) context[c] = context[c + 1];
            context[order - 1] = int_hash(token);
            uint64_t gate = tuple_add(tuple_add(tuple_add(tuple_add(XXPRIME_5, seed_lane), minus_one),
                                                int_hash(p)), context[order - 1]);
            uint64_t acc = tuple_add(XXPRIME_5, seed_lane);
            uint64_t len = (uint64_t)order + 1;
            if (((uint64_t)tuple_end(gate, 4) & 0xFFFFFFFFULL) >= threshold) {
                acc = tuple_add(acc, int_hash(p));
                len++;
            }
            for (int64_t c = 0; c < order; c++) acc = tuple_add(acc, context[c]);
            token = first + floor_mod(tuple_end(acc, len), span);
            PyObject *value = PyLong_FromLongLong(token);
            if (value == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(sampled, j, value);
        }
    }
    return out;
outside:
    Py_DECREF(out);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "synthetic chain: a block id outside the cache");
    return NULL;
}

/* Write the Python ints `tokens` at positions start.. into k and v through the block table `table`
 * (a chunk's KV). Returns None, or NULL with a Python exception set. */
PyObject *forge_synthetic_write(int64_t *k, int64_t *v, int64_t num_slots, int64_t block_size, int64_t start,
                                PyObject *tokens, PyObject *table) {
    if (block_size < 1 || start < 0 || !PyList_Check(tokens) || !PyList_Check(table)) {
        PyErr_SetString(PyExc_ValueError, "synthetic chain: a chunk needs lists, a start >= 0 and a block size >= 1");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(tokens), blocks = PyList_GET_SIZE(table);
    if (n > 0 && (start + n - 1) / block_size >= blocks) {
        PyErr_SetString(PyExc_ValueError, "synthetic chain: a row outside its block table");
        return NULL;
    }
    Py_ssize_t i = 0;
    for (int64_t block = start / block_size, off = start % block_size; i < n; block++, off = 0) {
        int64_t base = item(table, block) * block_size;  /* one block at a time: no division per token */
        if (PyErr_Occurred()) return NULL;
        if (base < 0 || base + block_size > num_slots) {
            PyErr_SetString(PyExc_ValueError, "synthetic chain: a block id outside the cache");
            return NULL;
        }
        for (; off < block_size && i < n; off++, i++) {
            int64_t token = item(tokens, i);
            if (token == -1 && PyErr_Occurred()) return NULL;  /* -1: maybe no int64 (PyLong_AsLongLong) */
            k[base + off] = v[base + off] = token;
        }
    }
    Py_RETURN_NONE;
}
