/* The binding of the model's blocks (model.c): the Stack type, which checks every length once and keeps the
 * buffers alive, and GeGLU's GELU table. */
#include <math.h>

#include "bind.h"
#include "model.h"

/* Stack(hparams, layers, head=None): a model's blocks over its quantized weights, for model.c. hparams: a dict of
 * every name in Stack.HPARAMS (model.h's MS_HPARAMS); each layer: a dict of every name in Stack.FIELDS (model.h's
 * MS_LAYER_FIELDS), vectors float32 or None (an optional one), matrices a tuple of 1-3 pieces (raw uint8 rows, ggml
 * type, rows, cols); head = (out_norm, output matrix, n_vocab), for forward's logits. A name missing or unknown is a
 * ValueError naming it. Every length is checked here, once; the buffers are kept for the object's life (the map
 * stays open while a view of it is held). */
typedef struct {
    PyObject_HEAD
    ms_model m;
    Py_buffer *bufs;
    int n_bufs;
} StackObject;

enum { ST_VEC, ST_MAT, ST_F64, ST_I64 };
/* The layer fields' parse table, from MS_LAYER_FIELDS: name, kind, required, size, outputs, place in ms_layer. */
typedef struct {
    const char *name;
    int kind, required, size, outputs;
    size_t offset;
} st_field;
static const st_field st_fields[] = {
#define ST_FIELD_ROW(kind, name, required, size, outputs)                                                             \
    {#name, ST_##kind, required, MS_DIM_##size, MS_DIM_##outputs, offsetof(ms_layer, name)},
    MS_LAYER_FIELDS(ST_FIELD_ROW)
#undef ST_FIELD_ROW
};
#define ST_N_FIELDS ((int)(sizeof st_fields / sizeof st_fields[0]))
#define ST_MAX_BUFS_PER_LAYER (ST_N_FIELDS * MS_MAX_PARTS)

enum { SH_I64, SH_F32, SH_BOOL };
/* The hyper-parameters' parse table, from MS_HPARAMS. */
typedef struct {
    const char *name;
    int kind;
    size_t offset;
} st_hparam;
static const st_hparam st_hparams[] = {
#define ST_HPARAM_ROW(kind, name) {#name, SH_##kind, offsetof(ms_model, name)},
    MS_HPARAMS(ST_HPARAM_ROW)
#undef ST_HPARAM_ROW
};
#define ST_N_HPARAMS ((int)(sizeof st_hparams / sizeof st_hparams[0]))

/* d's value of each of the n names (names[i] at i, borrowed) into out: a dict holding exactly those keys, else a
 * ValueError naming the first missing or unknown one (what: "hparams", "layer 3"). */
static int st_by_name(PyObject *d, const char *const *names, int n, PyObject **out, const char *what) {
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "Stack: %s must be a dict by name, not %.100s", what, Py_TYPE(d)->tp_name);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        out[i] = PyDict_GetItemString(d, names[i]);
        if (!out[i]) {
            PyErr_Format(PyExc_ValueError, "Stack: %s has no '%s' (expected every name in Stack.%s)", what,
                         names[i], n == ST_N_FIELDS ? "FIELDS" : "HPARAMS");
            return 0;
        }
    }
    if (PyDict_GET_SIZE(d) != n) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(d, &pos, &key, &value)) {
            int known = 0;
            for (int i = 0; i < n && !known; i++) known = PyUnicode_Check(key) && !PyUnicode_CompareWithASCIIString(key, names[i]);
            if (!known) {
                PyErr_Format(PyExc_ValueError, "Stack: %s has an unknown field %R (expected only the names in Stack.%s)",
                             what, key, n == ST_N_FIELDS ? "FIELDS" : "HPARAMS");
                return 0;
            }
        }
    }
    return 1;
}

static const char *st_field_names[ST_N_FIELDS], *st_hparam_names[ST_N_HPARAMS];

/* A tuple of the names of a table (Stack.FIELDS, Stack.HPARAMS). */
static PyObject *st_names_tuple(const char *const *names, int n) {
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(names[i]);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static void Stack_dealloc(StackObject *self) {
    for (int i = 0; i < self->n_bufs; i++) PyBuffer_Release(&self->bufs[i]);
    PyMem_Free(self->bufs);
    PyMem_Free(self->m.layers);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A float32 vector of n values (required: None refused), kept in self->bufs. */
static int stack_vector(StackObject *self, PyObject *o, int64_t n, int required, const float **out, const char *what,
                        int il) {
    *out = NULL;
    if (o == Py_None) {
        if (!required) return 1;
        PyErr_Format(PyExc_ValueError, "Stack: layer %d: %s is required", il, what);
        return 0;
    }
    Py_buffer *b = &self->bufs[self->n_bufs];
    if (!get_array(o, b, 4, what)) return 0;
    self->n_bufs++;
    if ((b->format && strcmp(b->format, "f")) || b->len / 4 != n) {
        PyErr_Format(PyExc_ValueError, "Stack: layer %d: %s has %zd values, expected %lld float32", il, what,
                     b->len / 4, (long long)n);
        return 0;
    }
    *out = b->buf;
    return 1;
}

/* A matrix of `in` inputs and `out` outputs from 1-3 pieces. */
static int stack_matrix(StackObject *self, PyObject *o, int64_t in, int64_t out, ms_matrix *M, const char *what,
                        int il) {
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) < 1 || PyTuple_GET_SIZE(o) > MS_MAX_PARTS) {
        PyErr_Format(PyExc_ValueError, "Stack: layer %d: %s must be a tuple of 1-%d pieces", il, what, MS_MAX_PARTS);
        return 0;
    }
    memset(M, 0, sizeof *M);
    M->n = (int)PyTuple_GET_SIZE(o), M->cols = in;
    for (int i = 0; i < M->n; i++) {
        PyObject *raw;
        int gtype;
        long long rows, cols;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(o, i), "OiLL", &raw, &gtype, &rows, &cols)) return 0;
        int type = mq_type_of_ggml(gtype);
        if (type < 0 || cols != in || cols % mq_block(type < 0 ? 0 : type) || rows < 1 || rows > out - M->n_out) {
            PyErr_Format(PyExc_ValueError, "Stack: layer %d: %s piece %d: type %d, %lld x %lld; expected a known "
                         "type, %lld inputs (whole blocks), %lld outputs in all", il, what, i, gtype, rows, cols,
                         (long long)in, (long long)out);
            return 0;
        }
        M->type[i] = type;
        Py_buffer *b = &self->bufs[self->n_bufs];
        if (PyObject_GetBuffer(raw, b, PyBUF_C_CONTIGUOUS) < 0) return 0;
        self->n_bufs++;
        long long row_bytes = cols / mq_block(type) * mq_type_size(type);
        if (b->len != rows * row_bytes) {
            PyErr_Format(PyExc_ValueError, "Stack: layer %d: %s piece %d has %zd bytes, expected %lld rows of %lld",
                         il, what, i, b->len, rows, row_bytes);
            return 0;
        }
        M->w[i] = b->buf, M->rows[i] = rows, M->n_out += rows;
    }
    if (M->n_out != out) {
        PyErr_Format(PyExc_ValueError, "Stack: layer %d: %s has %lld outputs, expected %lld", il, what,
                     (long long)M->n_out, (long long)out);
        return 0;
    }
    return 1;
}

static int Stack_init(StackObject *self, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *hparams, *layers, *head = Py_None;
    if (self->m.layers) {
        PyErr_SetString(PyExc_RuntimeError, "Stack is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OO!|O", &hparams, &PyList_Type, &layers, &head)) return -1;
    PyObject *hv[ST_N_HPARAMS];
    if (!st_by_name(hparams, st_hparam_names, ST_N_HPARAMS, hv, "hparams")) return -1;
    ms_model m = {0};
    for (int i = 0; i < ST_N_HPARAMS; i++) {
        char *at = (char *)&m + st_hparams[i].offset;
        if (st_hparams[i].kind == SH_I64) {
            long long v = PyLong_AsLongLong(hv[i]);
            if (v == -1 && PyErr_Occurred()) return -1;
            *(int64_t *)at = v;
        } else if (st_hparams[i].kind == SH_F32) {
            double v = PyFloat_AsDouble(hv[i]);
            if (v == -1.0 && PyErr_Occurred()) return -1;
            *(float *)at = (float)v;
        } else {
            int v = PyObject_IsTrue(hv[i]);
            if (v < 0) return -1;
            *(int *)at = v;
        }
    }
    const long long lim = 1 << 20;
    if (m.n_embd < 1 || m.n_embd > lim || m.n_head < 1 || m.n_head > lim || m.n_head_kv < 1 ||
        m.n_head % m.n_head_kv || m.head_dim < 1 || m.head_dim > lim || m.head_dim_v < 1 || m.head_dim_v > lim ||
        m.n_ff < 1 || m.n_ff > lim || m.n_rot < 0 || m.n_rot > m.head_dim || m.n_rot % 2 ||
        m.n_head * m.head_dim > lim || m.n_head * m.head_dim_v > lim || PyList_GET_SIZE(layers) < 1 ||
        PyList_GET_SIZE(layers) > 4096 || !isfinite(m.eps) || m.eps < 0 || m.n_expert < 0 ||
        m.n_expert > MS_MAX_EXPERTS || m.n_expert_used < 0 || m.n_expert_used > m.n_expert || m.n_ff_exp < 0 ||
        m.n_ff_exp > lim || m.kv_split < 1 || m.kv_split > 4096 || !isfinite(m.rope_freq_scale) ||
        m.rope_freq_scale <= 0 || !isfinite(m.rope_ext_factor) || !isfinite(m.rope_attn_factor) ||
        !isfinite(m.rope_beta_fast) || m.rope_beta_fast <= 0 || !isfinite(m.rope_beta_slow) ||
        m.rope_beta_slow <= 0 || m.n_ctx_orig < 1 || m.n_ctx_orig > (1LL << 40)) {
        PyErr_SetString(PyExc_ValueError, "Stack: hyper-parameters out of range");
        return -1;
    }
    const int n_layer = (int)PyList_GET_SIZE(layers);
    m.n_layer = n_layer;
    self->m = m;
    self->m.layers = PyMem_Calloc((size_t)n_layer, sizeof(ms_layer));
    self->bufs = PyMem_Calloc((size_t)(n_layer + 1) * ST_MAX_BUFS_PER_LAYER, sizeof(Py_buffer));
    if (!self->m.layers || !self->bufs) {
        PyErr_NoMemory();
        return -1;
    }
    const int64_t d = m.n_embd;
    double bases[2];
    PyObject *freqs[2];
    int n_tables = 0;
    for (int il = 0; il < n_layer; il++) {
        PyObject *v[ST_N_FIELDS], *rope_freqs = NULL;
        char what[32];
        snprintf(what, sizeof what, "layer %d", il);
        if (!st_by_name(PyList_GET_ITEM(layers, il), st_field_names, ST_N_FIELDS, v, what)) return -1;
        ms_layer *L = &self->m.layers[il];
        for (int i = 0; i < ST_N_FIELDS; i++) {
            const st_field *f = &st_fields[i];
            char *at = (char *)L + f->offset;
            int ok = 1;
            if (f->kind == ST_VEC)
                ok = stack_vector(self, v[i], ms_dim(&self->m, f->size), f->required, (const float **)at, f->name, il);
            else if (f->kind == ST_MAT && v[i] == Py_None && !f->required)
                ok = 1; /* absent (calloc'd: no pieces) */
            else if (f->kind == ST_MAT)
                ok = stack_matrix(self, v[i], ms_dim(&self->m, f->size), ms_dim(&self->m, f->outputs),
                                  (ms_matrix *)at, f->name, il);
            else if (f->kind == ST_F64)
                *(double *)at = PyFloat_AsDouble(v[i]);
            else
                *(int64_t *)at = PyLong_AsLongLong(v[i]);
            if (!ok || PyErr_Occurred()) return -1;
            if (at == (char *)&L->rope_freqs) rope_freqs = v[i];
        }
        const char *bad = ms_check_layer(&self->m, L);
        if (bad) {
            PyErr_Format(PyExc_ValueError, "Stack: layer %d: %s", il, bad);
            return -1;
        }
        if (!isfinite(L->rope_base) || L->rope_base <= 0 || L->window < 0) {
            PyErr_Format(PyExc_ValueError, "Stack: layer %d: rope base %g, window %lld", il, L->rope_base,
                         (long long)L->window);
            return -1;
        }
        int found = 0;
        for (int i = 0; i < n_tables; i++) found |= bases[i] == L->rope_base && freqs[i] == rope_freqs;
        if (!found) {
            if (n_tables == 2) {
                PyErr_SetString(PyExc_ValueError, "Stack: at most two rope bases/factors over the layers");
                return -1;
            }
            bases[n_tables] = L->rope_base, freqs[n_tables++] = rope_freqs;
        }
    }
    if (head != Py_None) { /* (out_norm, output matrix, n_vocab): "layer" n_layer in the messages */
        long long n_vocab;
        PyObject *norm, *out;
        if (!PyTuple_Check(head) || !PyArg_ParseTuple(head, "OOL", &norm, &out, &n_vocab)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "Stack: head must be None or (out_norm, output, n_vocab)");
            }
            return -1;
        }
        if (n_vocab < 1 || n_vocab > (1LL << 31)) {
            PyErr_Format(PyExc_ValueError, "Stack: head: n_vocab %lld out of range", n_vocab);
            return -1;
        }
        if (!stack_vector(self, norm, d, 1, &self->m.out_norm, "out_norm", n_layer) ||
            !stack_matrix(self, out, d, n_vocab, &self->m.output, "output", n_layer))
            return -1;
    }
    return 0;
}

/* A cache's cell order (ma_attend_cells's cells) from o: None (cell c holds position c: buf NULL, 1), or int64
 * [1 .. 2^30] each -1 or a position below `rows` (the positions stored). 0 and an error naming `who` otherwise. */
static int get_cells(PyObject *o, Py_buffer *b, long long rows, const char *who) {
    memset(b, 0, sizeof *b);
    if (o == Py_None) return 1;
    if (!get_array(o, b, 8, who)) return 0;
    const char *f = b->format ? b->format + (strchr("<=@", b->format[0]) && b->format[0] ? 1 : 0) : "";
    const Py_ssize_t n = b->len / 8;
    int ok = (!strcmp(f, "q") || !strcmp(f, "l")) && n >= 1 && n <= (1 << 30);
    const int64_t *c = b->buf;
    for (Py_ssize_t i = 0; ok && i < n; i++) ok = c[i] >= -1 && c[i] < rows;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: expected 1..2^30 int64 cells, each -1 or a position below %lld", who,
                     rows);
        PyBuffer_Release(b);
        memset(b, 0, sizeof *b);
    }
    return ok;
}

/* forward(x, seqs, threads): x [T, n_embd] float32, run through every block in place; seqs a list of (rows, start,
 * k_caches, v_caches), one per sequence, whose rows lie in x one sequence after the other (rows >= 1, adding up to
 * T): that sequence's tokens at positions start..start+rows-1, their keys and values stored in its caches (one
 * float16 array per layer, [capacity, n_head_kv, head_dim(_v)], capacity >= start + rows), and optionally the cell
 * orders of its full-attention and sliding-window layers' caches (get_cells; None: by position). No two of the
 * arrays (x and every cache) may share memory: the threads of a pass write them at once. */
static PyObject *Stack_forward(StackObject *self, PyObject *args) {
    PyObject *xo, *list, *lo = Py_None;
    int threads;
    if (!self->m.layers) return PyErr_Format(PyExc_RuntimeError, "Stack is not initialised");
    if (!PyArg_ParseTuple(args, "OO!i|O", &xo, &PyList_Type, &list, &threads, &lo)) return NULL;
    const ms_model *m = &self->m;
    const Py_ssize_t n_seq = PyList_GET_SIZE(list);
    if (threads < 1 || threads > 1024 || n_seq < 1 || n_seq > (1 << 16))
        return PyErr_Format(PyExc_ValueError, "forward: expected 1..1024 threads and 1..65536 sequences, got %d and "
                            "%zd", threads, n_seq);
    PyObject *so = PyList_AsTuple(list); /* the items stay alive whatever a buffer export does to the list */
    if (!so) return NULL;
    Py_buffer xb, lb = {0};
    if (!get_array(xo, &xb, 4, "x")) {
        Py_DECREF(so);
        return NULL;
    }
    if (lo != Py_None && !get_array(lo, &lb, 4, "logits")) {
        PyBuffer_Release(&xb);
        Py_DECREF(so);
        return NULL;
    }
    const long long T = xb.len / 4 / m->n_embd;
    PyObject *res = NULL;
    const size_t n_arrays = 2 * (size_t)m->n_layer * (size_t)n_seq;
    size_t n_caches = 0;
    Py_buffer *cb = PyMem_Calloc(n_arrays, sizeof(Py_buffer));
    uint16_t **ptrs = PyMem_Calloc(n_arrays, sizeof(uint16_t *));
    ms_seq *seqs = PyMem_Calloc((size_t)n_seq, sizeof(ms_seq));
    ms_span *spans = PyMem_Calloc(n_arrays + 2, sizeof(ms_span));
    Py_buffer *cellb = PyMem_Calloc(2 * (size_t)n_seq, sizeof(Py_buffer)); /* each sequence's cell orders */
    if (!cb || !ptrs || !seqs || !spans || !cellb) {
        PyErr_NoMemory();
        goto done;
    }
    if (xb.readonly || (xb.format && strcmp(xb.format, "f")) || T < 1 || xb.len != T * m->n_embd * 4) {
        PyErr_Format(PyExc_ValueError, "forward: x must be writable float32 rows of %lld values",
                     (long long)m->n_embd);
        goto done;
    }
    long long rows_seen = 0;
    for (Py_ssize_t s = 0; s < n_seq; s++) {
        PyObject *ko, *vo, *cells[2] = {Py_None, Py_None};
        long long rows, start;
        PyObject *item = PyTuple_GET_ITEM(so, s);
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "forward: sequence %zd must be a tuple (rows, start, k_caches, v_caches"
                         "[, cells, window_cells])", s);
            goto done;
        }
        if (!PyArg_ParseTuple(item, "LLO!O!|OO", &rows, &start, &PyList_Type, &ko, &PyList_Type, &vo, &cells[0],
                              &cells[1]))
            goto done;
        if (rows < 1 || rows > T - rows_seen || start < 0 || start > (1LL << 40) ||
            PyList_GET_SIZE(ko) != m->n_layer || PyList_GET_SIZE(vo) != m->n_layer) {
            PyErr_Format(PyExc_ValueError, "forward: sequence %zd: expected 1..%lld rows (of x's %lld left), a "
                         "position >= 0, %d key and value caches", s, T - rows_seen, T - rows_seen, m->n_layer);
            goto done;
        }
        rows_seen += rows;
        uint16_t **kp = ptrs + 2 * (size_t)m->n_layer * (size_t)s;
        for (int i = 0; i < 2 * m->n_layer; i++) {
            const int is_v = i >= m->n_layer;
            /* the list may have changed size while an earlier item's buffer was taken (a __buffer__ in Python) */
            PyObject *list = is_v ? vo : ko;
            if (PyList_GET_SIZE(list) != m->n_layer) {
                PyErr_SetString(PyExc_ValueError, "forward: a cache list changed size");
                goto done;
            }
            Py_buffer *b = &cb[n_caches];
            if (!get_array(PyList_GET_ITEM(list, i % m->n_layer), b, 2, "cache")) goto done;
            n_caches++;
            const long long need = (start + rows) * m->n_head_kv * (is_v ? m->head_dim_v : m->head_dim);
            if (b->readonly || !b->format || strcmp(b->format, "e") || b->len / 2 < need) {
                PyErr_Format(PyExc_ValueError, "forward: sequence %zd: cache %d has %zd values, expected at least "
                             "%lld writable float16", s, i, b->len / 2, need);
                goto done;
            }
            kp[i] = b->buf;
        }
        seqs[s] = (ms_seq){.n = rows, .start = start, .k = kp, .v = kp + m->n_layer};
        for (int i = 0; i < 2; i++) {
            if (!get_cells(cells[i], &cellb[2 * s + i], start + rows, "forward: cells")) goto done;
            seqs[s].cells[i] = cellb[2 * s + i].buf;
            seqs[s].n_cells[i] = cellb[2 * s + i].len / 8;
        }
    }
    if (rows_seen != T) {
        PyErr_Format(PyExc_ValueError, "forward: the sequences have %lld rows, x has %lld", rows_seen, T);
        goto done;
    }
    if (lb.buf && (!m->out_norm || lb.readonly || (lb.format && strcmp(lb.format, "f")) ||
                   lb.len != (Py_ssize_t)n_seq * m->output.n_out * 4)) {
        PyErr_Format(PyExc_ValueError, "forward: logits must be writable float32 [%zd sequences, %lld] of a Stack "
                     "made with a head, got %zd values%s", n_seq, (long long)m->output.n_out, lb.len / 4,
                     m->out_norm ? "" : " (this Stack has none)");
        goto done;
    }
    for (size_t i = 0; i < n_caches; i++)
        spans[i] = (ms_span){(uintptr_t)cb[i].buf, (uintptr_t)cb[i].buf + (uintptr_t)cb[i].len};
    spans[n_caches] = (ms_span){(uintptr_t)xb.buf, (uintptr_t)xb.buf + (uintptr_t)xb.len};
    size_t n_spans = n_caches + 1;
    if (lb.buf) spans[n_spans++] = (ms_span){(uintptr_t)lb.buf, (uintptr_t)lb.buf + (uintptr_t)lb.len};
    if (ms_spans_overlap(spans, n_spans)) {
        PyErr_SetString(PyExc_ValueError, "forward: x, the logits and the caches must not share memory (is a "
                        "cache given twice?)");
        goto done;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = ms_forward(m, xb.buf, seqs, (int)n_seq, threads, lb.buf);
    Py_END_ALLOW_THREADS
    if (ok) {
        Py_INCREF(Py_None);
        res = Py_None;
    } else
        PyErr_NoMemory();
done:
    for (size_t i = 0; i < n_caches; i++) PyBuffer_Release(&cb[i]);
    for (Py_ssize_t i = 0; cellb && i < 2 * n_seq; i++)
        if (cellb[i].buf) PyBuffer_Release(&cellb[i]);
    PyMem_Free(cellb);
    PyMem_Free(cb);
    PyMem_Free(ptrs);
    PyMem_Free(seqs);
    PyMem_Free(spans);
    if (lb.buf) PyBuffer_Release(&lb);
    PyBuffer_Release(&xb);
    Py_DECREF(so);
    return res;
}

/* rope_shift(layer, k, deltas): ms_rope_shift over layer's float16 key cache k [>= n, n_head_kv, head_dim] (its
 * first n rows, n = len(deltas), int64 position deltas), in place. */
static PyObject *Stack_rope_shift(StackObject *self, PyObject *args) {
    PyObject *ko, *dobj;
    int layer;
    if (!self->m.layers) return PyErr_Format(PyExc_RuntimeError, "Stack is not initialised");
    if (!PyArg_ParseTuple(args, "iOO", &layer, &ko, &dobj)) return NULL;
    const ms_model *m = &self->m;
    if (layer < 0 || layer >= m->n_layer)
        return PyErr_Format(PyExc_ValueError, "rope_shift: expected a layer of 0..%d, got %d", m->n_layer - 1, layer);
    Py_buffer kb, db;
    if (!get_array(ko, &kb, 2, "rope_shift: k")) return NULL;
    if (!get_array(dobj, &db, 8, "rope_shift: deltas")) {
        PyBuffer_Release(&kb);
        return NULL;
    }
    const long long n = db.len / 8, row = (long long)m->n_head_kv * m->head_dim;
    const int64_t *d = db.buf;
    int ok = !kb.readonly && kb.format && !strcmp(kb.format, "e") && kb.len / 2 >= n * row;
    for (long long i = 0; ok && i < n; i++) ok = d[i] > -(1LL << 31) && d[i] < (1LL << 31);
    if (!ok) {
        PyBuffer_Release(&db);
        PyBuffer_Release(&kb);
        return PyErr_Format(PyExc_ValueError, "rope_shift: expected writable float16 keys of at least %lld values "
                            "and int64 deltas within 32 bits", n * row);
    }
    Py_BEGIN_ALLOW_THREADS
    ok = ms_rope_shift(m, layer, kb.buf, n, d);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&db);
    PyBuffer_Release(&kb);
    if (!ok) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef Stack_methods[] = {
    {"rope_shift", (PyCFunction)Stack_rope_shift, METH_VARARGS,
     "rope_shift(layer, k, deltas): the layer's float16 key cache k rotated in place by deltas[t] positions (int64) "
     "per row, as llama.cpp's K shift after a context shift."},
    {"forward", (PyCFunction)Stack_forward, METH_VARARGS,
     "forward(x, seqs, threads, logits=None): every block over x [T, n_embd] in place; seqs: [(rows, start, "
     "k_caches, v_caches[, cells, window_cells]), ...], each sequence's rows in turn (cells: None or int64, the "
     "position each cell of its full-attention / sliding-window layers' cache holds or -1, in llama.cpp's order); logits [len(seqs), n_vocab]: each sequence's last "
     "row through the head (a Stack made with one)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StackType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minillama._native._core.Stack",
    .tp_basicsize = sizeof(StackObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A llama-family model's blocks over its quantized weights (model.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Stack_init,
    .tp_dealloc = (destructor)Stack_dealloc,
    .tp_methods = Stack_methods,
};


/* gelu_table() -> bytes: ms_gelu_table as 65536 float32 (tests compare it with llama.cpp's ggml_table_gelu_f16). */
static PyObject *gelu_table(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBytes_FromStringAndSize((const char *)ms_gelu_table(), 65536 * sizeof(float));
}

/* attend(q, k, v, out, (n, H, Hkv, D, Dv), start, window, scale, pass_rows, kv_split, sinks=None, cells=None):
 * ma_attend_seq over one sequence's rows. q: float32 [n, H, D]; k, v: its float16 cache [>= start + n, Hkv, D] and
 * [.., Hkv, Dv] (by position); out: float32 [n, H, Dv], written; sinks: None or float32 [H]; cells: None or the
 * cache's cell order (int64, each cell's position or -1). Each length is checked against the shapes given. */
static PyObject *attend(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *qo, *ko, *vo, *oo, *so = Py_None, *co = Py_None;
    long long n, H, Hkv, D, Dv, start, window, pass_rows, kv_split;
    float scale;
    if (!PyArg_ParseTuple(args, "OOOO(LLLLL)LLfLL|OO", &qo, &ko, &vo, &oo, &n, &H, &Hkv, &D, &Dv, &start, &window,
                          &scale, &pass_rows, &kv_split, &so, &co))
        return NULL;
    const long long lim = 1 << 20;
    if (n < 1 || n > lim || H < 1 || H > 4096 || Hkv < 1 || H % Hkv || D < 1 || D > 65536 || Dv < 1 ||
        Dv > 65536 || start < 0 || start > (1LL << 40) || window < 0 || pass_rows < n || pass_rows > lim ||
        kv_split < 1 || kv_split > 4096 || !isfinite(scale))
        return PyErr_Format(PyExc_ValueError, "attend: expected 1 <= n <= pass_rows, heads H a multiple of Hkv, "
                            "start and window >= 0, 1..4096 kv_split and a finite scale; got n %lld, H %lld, Hkv "
                            "%lld, D %lld, Dv %lld, start %lld, window %lld, pass_rows %lld, kv_split %lld", n, H, Hkv,
                            D, Dv, start, window, pass_rows, kv_split);
    Py_buffer b[3], ob;
    PyObject *objs[3] = {qo, ko, vo};
    const Py_ssize_t sizes[3] = {4, 2, 2};
    const char *names[3] = {"q", "k", "v"};
    if (!get_arrays(objs, b, sizes, names, 3)) return NULL;
    if (PyObject_GetBuffer(oo, &ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        release_all(b, 3);
        return NULL;
    }
    Py_buffer sb = {0};
    if (so != Py_None && !get_array(so, &sb, 4, "sinks")) {
        PyBuffer_Release(&ob);
        release_all(b, 3);
        return NULL;
    }
    const long long cells = start + n;
    Py_buffer cb;
    if (!get_cells(co, &cb, cells, "attend: cells")) {
        if (sb.buf) PyBuffer_Release(&sb);
        PyBuffer_Release(&ob);
        release_all(b, 3);
        return NULL;
    }
    if (b[0].len != n * H * D * 4 || b[1].len < cells * Hkv * D * 2 || b[2].len < cells * Hkv * Dv * 2 ||
        ob.len != n * H * Dv * 4 || ob.itemsize != 4 || (sb.buf && sb.len != H * 4)) {
        if (cb.buf) PyBuffer_Release(&cb);
        if (sb.buf) PyBuffer_Release(&sb);
        PyBuffer_Release(&ob);
        release_all(b, 3);
        return PyErr_Format(PyExc_ValueError, "attend: expected q of %lld floats, k and v of at least %lld "
                            "positions, out of %lld floats and sinks of %lld", n * H * D, cells, n * H * Dv, H);
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = ma_attend_seq(b[0].buf, n, H, Hkv, D, Dv, start, b[1].buf, b[2].buf, window, cb.buf, cb.len / 8, scale,
                       sb.buf, pass_rows, kv_split, ob.buf);
    Py_END_ALLOW_THREADS
    if (cb.buf) PyBuffer_Release(&cb);
    if (sb.buf) PyBuffer_Release(&sb);
    PyBuffer_Release(&ob);
    release_all(b, 3);
    if (!ok) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* One row of n values: silu (ggml_vec_silu_f32: ma_swiglu with g = 1, the same bits) or ggml_vec_soft_max_f32's
 * exponentials (ggml_v_expf eight at a time, libm's expf for the n % 8 left). ones: n floats of 1. */
static void row_silu(Py_ssize_t n, float *y, const float *x, const float *ones) { ma_swiglu(n, y, x, ones); }

static void row_exp(Py_ssize_t n, float *y, const float *x, const float *ones) {
    (void)ones;
    const Py_ssize_t n8 = n & ~(Py_ssize_t)7;
    ma_v_expf_n(n8, x, y);
    for (Py_ssize_t i = n8; i < n; i++) y[i] = expf(x[i]);
}

/* (x, out, n) -> out = op of each row of n values of x; x, out: float32, the same number of values, a multiple of
 * n. The GIL is released while the rows are computed. */
static PyObject *rows_op(PyObject *args, const char *name, void (*op)(Py_ssize_t, float *, const float *,
                                                                        const float *)) {
    PyObject *xo, *oo;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOn", &xo, &oo, &n)) return NULL;
    Py_buffer xb, ob;
    if (!get_array(xo, &xb, 4, "x")) return NULL;
    if (PyObject_GetBuffer(oo, &ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&xb);
        return NULL;
    }
    const Py_ssize_t len = xb.len / 4;
    float *ones = NULL;
    if (n < 1 || n > (1 << 24) || len % n || ob.len != xb.len || ob.itemsize != 4) {
        PyErr_Format(PyExc_ValueError, "%s: expected x and out of the same multiple of n = %zd floats, got %zd and "
                     "%zd bytes", name, n, xb.len, ob.len);
    } else if (!(ones = PyMem_Malloc((size_t)n * sizeof(float)))) {
        PyErr_NoMemory();
    } else {
        for (Py_ssize_t i = 0; i < n; i++) ones[i] = 1.0f;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < len / n; r++) op(n, (float *)ob.buf + r * n, (const float *)xb.buf + r * n, ones);
        Py_END_ALLOW_THREADS
        PyMem_Free(ones);
    }
    PyBuffer_Release(&ob);
    PyBuffer_Release(&xb);
    return ones ? Py_NewRef(Py_None) : NULL;
}

/* silu(x, out, n): out = silu(x) over rows of n values, as ggml_vec_silu_f32 computes a row. */
static PyObject *silu(PyObject *self, PyObject *args) {
    (void)self;
    return rows_op(args, "silu", row_silu);
}

/* exp_rows(x, out, n): out = e^x over rows of n values, as ggml_vec_soft_max_f32 takes its exponentials. */
static PyObject *exp_rows(PyObject *self, PyObject *args) {
    (void)self;
    return rows_op(args, "exp_rows", row_exp);
}

/* mul_f32(w, x, out): out [rows, E] = x [rows, d] times the float32 matrix w [E, d]^T as llama.cpp's CPU backend
 * multiplies a float32 weight (mo_router: ggml_vec_dot_f32's order for one row, tinyBLAS's for more). */
static PyObject *mul_f32(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *wo, *xo, *oo;
    Py_ssize_t E, d;
    if (!PyArg_ParseTuple(args, "OOOnn", &wo, &xo, &oo, &E, &d)) return NULL;
    Py_buffer b[2], ob;
    PyObject *objs[2] = {wo, xo};
    const Py_ssize_t sizes[2] = {4, 4};
    const char *names[2] = {"w", "x"};
    if (!get_arrays(objs, b, sizes, names, 2)) return NULL;
    if (PyObject_GetBuffer(oo, &ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        release_all(b, 2);
        return NULL;
    }
    const Py_ssize_t rows = d > 0 ? b[1].len / 4 / d : 0;
    if (E < 1 || d < 1 || E > (1 << 24) || d > (1 << 24) || b[0].len != E * d * 4 || b[1].len != rows * d * 4 ||
        rows < 1 || ob.len != rows * E * 4 || ob.itemsize != 4) {
        PyBuffer_Release(&ob);
        release_all(b, 2);
        return PyErr_Format(PyExc_ValueError, "mul_f32: expected w of %zd x %zd floats, x of rows of %zd and out of "
                            "rows of %zd", E, d, d, E);
    }
    const int simd = mo_simd();
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++)
        mo_router(b[0].buf, (const float *)b[1].buf + r * d, E, d, rows, simd, (float *)ob.buf + r * E);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ob);
    release_all(b, 2);
    Py_RETURN_NONE;
}

/* gdn_unary(x, out, op): out = op(x) elementwise, op 0 sigmoid, 1 softplus, 2 exp, as ggml's unary ops compute
 * them (libm's expf and logf, md_unary). x, out: float32 of the same size. */
static PyObject *gdn_unary(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *oo;
    int op;
    if (!PyArg_ParseTuple(args, "OOi", &xo, &oo, &op)) return NULL;
    Py_buffer xb, ob;
    if (!get_array(xo, &xb, 4, "x")) return NULL;
    if (PyObject_GetBuffer(oo, &ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&xb);
        return NULL;
    }
    if (op < MD_SIGMOID || op > MD_EXP || ob.len != xb.len || ob.itemsize != 4) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&xb);
        return PyErr_Format(PyExc_ValueError, "gdn_unary: expected op 0, 1 or 2 and x and out of the same size, got "
                            "op %d, %zd and %zd bytes", op, xb.len, ob.len);
    }
    Py_BEGIN_ALLOW_THREADS
    md_unary(op, xb.len / 4, xb.buf, ob.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ob);
    PyBuffer_Release(&xb);
    Py_RETURN_NONE;
}

/* gated_delta_net(q, k, v, g, beta, state, out, before, (n, Hv, Hk, S)): one sequence's n tokens through ggml's
 * gated_delta_net (md_gated_delta_net): q, k float32 [n, Hk, S], v [n, Hv, S], g, beta [n, Hv], state [Hv, S, S]
 * (updated in place), out [n, Hv, S]; before: None or [Hv, S, S], the state before the last token. */
static PyObject *gated_delta_net(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[5], *so, *oo, *bo;
    Py_ssize_t n, hv, hk, S;
    if (!PyArg_ParseTuple(args, "OOOOOOOO(nnnn)", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &so, &oo, &bo,
                          &n, &hv, &hk, &S))
        return NULL;
    Py_buffer b[5], sb, ob, bb = {0};
    const Py_ssize_t sizes[5] = {4, 4, 4, 4, 4};
    const char *names[5] = {"q", "k", "v", "g", "beta"};
    if (!get_arrays(objs, b, sizes, names, 5)) return NULL;
    if (PyObject_GetBuffer(so, &sb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        release_all(b, 5);
        return NULL;
    }
    if (PyObject_GetBuffer(oo, &ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&sb);
        release_all(b, 5);
        return NULL;
    }
    if (bo != Py_None && PyObject_GetBuffer(bo, &bb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&sb);
        release_all(b, 5);
        return NULL;
    }
    const int sane = n >= 1 && hv >= 1 && hk >= 1 && S >= 1 && n <= (1 << 24) && hv <= (1 << 16) &&
                     hk <= (1 << 16) && S <= (1 << 12) && hv % hk == 0;
    const int ok = sane && b[0].len == n * hk * S * 4 && b[1].len == n * hk * S * 4 && b[2].len == n * hv * S * 4 &&
                   b[3].len == n * hv * 4 && b[4].len == n * hv * 4 && sb.len == hv * S * S * 4 && sb.itemsize == 4 &&
                   ob.len == n * hv * S * 4 && ob.itemsize == 4 &&
                   (bo == Py_None || (bb.len == hv * S * S * 4 && bb.itemsize == 4));
    if (!ok) {
        if (bo != Py_None) PyBuffer_Release(&bb);
        PyBuffer_Release(&ob);
        PyBuffer_Release(&sb);
        release_all(b, 5);
        return PyErr_Format(PyExc_ValueError, "gated_delta_net: expected q, k of %zd x %zd x %zd floats, v and out of "
                            "%zd x %zd x %zd, g and beta of %zd x %zd, state (and before) of %zd x %zd x %zd, with "
                            "Hv a multiple of Hk", n, hk, S, n, hv, S, n, hv, hv, S, S);
    }
    const int simd = mo_simd();
    Py_BEGIN_ALLOW_THREADS
    md_gated_delta_net(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf, sb.buf, n, hv, hk, S, simd, ob.buf,
                       bo == Py_None ? NULL : bb.buf);
    Py_END_ALLOW_THREADS
    if (bo != Py_None) PyBuffer_Release(&bb);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&sb);
    release_all(b, 5);
    Py_RETURN_NONE;
}

static PyMethodDef model_functions[] = {
    {"gdn_unary", gdn_unary, METH_VARARGS,
     "gdn_unary(x, out, op): out = sigmoid (0), softplus (1) or exp (2) of x as ggml's unary ops (libm's expf)."},
    {"gated_delta_net", gated_delta_net, METH_VARARGS,
     "gated_delta_net(q, k, v, g, beta, state, out, before, (n, Hv, Hk, S)): ggml's gated_delta_net of one "
     "sequence, the state updated in place."},
    {"exp_rows", exp_rows, METH_VARARGS,
     "exp_rows(x, out, n): out = e^x over rows of n values as ggml's soft_max takes them (ggml_v_expf)."},
    {"mul_f32", mul_f32, METH_VARARGS,
     "mul_f32(w, x, out, E, d): out [rows, E] = x [rows, d] w^T in llama.cpp's float32 order."},
    {"silu", silu, METH_VARARGS,
     "silu(x, out, n): out = silu(x) over rows of n values as ggml_vec_silu_f32 computes them (ggml_v_expf)."},
    {"gelu_table", gelu_table, METH_NOARGS, "gelu_table() -> bytes: GeGLU's table of GELU at every float16, float32."},
    {"attend", attend, METH_VARARGS,
     "attend(q, k, v, out, (n, H, Hkv, D, Dv), start, window, scale, pass_rows, kv_split, sinks=None, cells=None): "
     "one sequence's rows attending to its float16 cache as the C blocks attend them (out: float32 [n, H, Dv]; "
     "cells: None or int64, the position each cache cell holds or -1, in llama.cpp's cell order)."},
    {NULL, NULL, 0, NULL},
};

int add_model(PyObject *m) {
    for (int i = 0; i < ST_N_FIELDS; i++) st_field_names[i] = st_fields[i].name;
    for (int i = 0; i < ST_N_HPARAMS; i++) st_hparam_names[i] = st_hparams[i].name;
    if (PyType_Ready(&StackType) < 0) return -1;
    PyObject *fields = st_names_tuple(st_field_names, ST_N_FIELDS), *hps = st_names_tuple(st_hparam_names, ST_N_HPARAMS);
    int bad = !fields || !hps || PyDict_SetItemString(StackType.tp_dict, "FIELDS", fields) < 0 ||
              PyDict_SetItemString(StackType.tp_dict, "HPARAMS", hps) < 0;
    Py_XDECREF(fields);
    Py_XDECREF(hps);
    if (bad) return -1;
    PyType_Modified(&StackType);
    if (PyModule_AddObjectRef(m, "Stack", (PyObject *)&StackType) < 0) return -1;
    return PyModule_AddFunctions(m, model_functions);
}
