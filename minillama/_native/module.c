/* minillama._native._core: the CPython binding of the native core, the only file that includes Python.h.
 * Tables cross once, at construction (buffers from Vocab.arrays() and unicode_data's flags); text crosses as
 * UTF-8 bytes; the GIL is released while C works, so threads sharing one tokenizer run in parallel. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "core.h"

typedef struct {
    PyObject_HEAD
    bpe *b;
    Py_buffer flags; /* kept for the object's life: the splitters read it */
    int has_flags;
} BPEObject;

/* buf as n items of itemsize bytes, C-contiguous; a TypeError/ValueError naming what otherwise. */
static int get_array(PyObject *obj, Py_buffer *buf, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return 0;
    if (buf->itemsize != itemsize || buf->len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected items of %zd bytes, got %zd", name, itemsize, buf->itemsize);
        PyBuffer_Release(buf);
        return 0;
    }
    return 1;
}

static void BPE_dealloc(BPEObject *self) {
    bpe_free(self->b);
    if (self->has_flags) PyBuffer_Release(&self->flags);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int BPE_init(BPEObject *self, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *flags, *tok_bytes, *tok_off, *merges, *byte_ids, *byte_chars;
    int ignore_merges;
    Py_ssize_t max_bytes, max_words;
    if (self->b) {
        PyErr_SetString(PyExc_RuntimeError, "BPE is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOpnn", &flags, &tok_bytes, &tok_off, &merges, &byte_ids, &byte_chars,
                          &ignore_merges, &max_bytes, &max_words))
        return -1;
    if (max_bytes < 0 || max_words < 0) {
        PyErr_SetString(PyExc_ValueError, "cache bounds must be >= 0");
        return -1;
    }
    Py_buffer fb, tb, ob, mb, bb, cb;
    if (!get_array(flags, &fb, 2, "flags")) return -1;
    if (fb.len / 2 != MAX_CODE_POINT + 1) {
        PyErr_Format(PyExc_ValueError, "flags: expected %d entries, got %zd", MAX_CODE_POINT + 1, fb.len / 2);
        PyBuffer_Release(&fb);
        return -1;
    }
    int ok = 0;
    if (!get_array(tok_bytes, &tb, 1, "token_bytes")) goto f0;
    if (!get_array(tok_off, &ob, 8, "token_offsets")) goto f1;
    if (!get_array(merges, &mb, 4, "merges")) goto f2;
    if (!get_array(byte_ids, &bb, 4, "byte_ids")) goto f3;
    if (!get_array(byte_chars, &cb, 4, "byte_chars")) goto f4;
    if (ob.len / 8 < 2 || mb.len / 4 % 3 || bb.len / 4 != 3 * 256 || cb.len / 4 != 256) {
        PyErr_SetString(PyExc_ValueError, "BPE tables: expected n_vocab + 1 >= 2 offsets, 3 ints a merge, "
                                          "256 x 3 byte ids and 256 byte characters");
        goto f5;
    }
    bpe *b;
    Py_BEGIN_ALLOW_THREADS
    b = bpe_new(mb.buf, (size_t)(mb.len / 12), bb.buf, tb.buf, (size_t)tb.len, ob.buf, (size_t)(ob.len / 8 - 1),
                cb.buf, ignore_merges, (size_t)max_bytes, (size_t)max_words);
    Py_END_ALLOW_THREADS
    if (!b) {
        PyErr_SetString(PyExc_ValueError, "BPE tables are inconsistent (offsets, byte ids) or memory ran out");
        goto f5;
    }
    self->b = b;
    self->flags = fb;
    self->has_flags = 1;
    ok = 1;
f5:
    PyBuffer_Release(&cb);
f4:
    PyBuffer_Release(&bb);
f3:
    PyBuffer_Release(&mb);
f2:
    PyBuffer_Release(&ob);
f1:
    PyBuffer_Release(&tb);
f0:
    if (!ok) PyBuffer_Release(&fb);
    return ok ? 0 : -1;
}

static PyObject *ids_list(const ivec *v) {
    PyObject *list = PyList_New((Py_ssize_t)v->n);
    if (!list) return NULL;
    for (size_t i = 0; i < v->n; i++) {
        PyObject *x = PyLong_FromLong(v->v[i]);
        if (!x) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    return list;
}

static PyObject *BPE_encode(BPEObject *self, PyObject *args) {
    Py_buffer text, ends = {0};
    int mode;
    PyObject *ends_obj;
    if (!self->b) {
        PyErr_SetString(PyExc_RuntimeError, "BPE is not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*iO", &text, &mode, &ends_obj)) return NULL;
    int has_ends = ends_obj != Py_None;
    if (mode < SPLIT_WORDS || mode > SPLIT_LLAMA3 || (mode == SPLIT_WORDS) != has_ends) {
        PyBuffer_Release(&text);
        PyErr_SetString(PyExc_ValueError, "encode: mode 0 takes word ends, modes 1 and 2 take None");
        return NULL;
    }
    if (has_ends && !get_array(ends_obj, &ends, 8, "word ends")) {
        PyBuffer_Release(&text);
        return NULL;
    }
    ivec out = {NULL, 0, 0, 1};
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = bpe_encode(self->b, text.buf, (size_t)text.len, mode, has_ends ? ends.buf : NULL,
                    has_ends ? (size_t)(ends.len / 8) : 0, self->flags.buf, &out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&text);
    if (has_ends) PyBuffer_Release(&ends);
    PyObject *res = NULL;
    if (ok)
        res = ids_list(&out);
    else if (!out.ok)
        PyErr_NoMemory();
    else
        PyErr_SetString(PyExc_ValueError, "encode: word ends must rise to the text's length in code points");
    ivec_free(&out);
    return res;
}

static PyObject *BPE_cache_info(BPEObject *self, PyObject *unused) {
    (void)unused;
    if (!self->b) return PyDict_New();
    wcache_info i;
    wcache_stats(bpe_cache(self->b), &i);
    return Py_BuildValue("{snsnsnsnsnsnsnsn}", "words", (Py_ssize_t)i.words, "bytes", (Py_ssize_t)i.bytes,
                         "old_words", (Py_ssize_t)i.old_words, "old_bytes", (Py_ssize_t)i.old_bytes,
                         "largest_entry", (Py_ssize_t)i.largest_entry, "longest_word", (Py_ssize_t)i.longest_word,
                         "max_bytes", (Py_ssize_t)i.max_bytes, "max_words", (Py_ssize_t)i.max_words);
}

static PyObject *BPE_clear_cache(BPEObject *self, PyObject *unused) {
    (void)unused;
    if (self->b) wcache_clear(bpe_cache(self->b));
    Py_RETURN_NONE;
}

static PyMethodDef BPE_methods[] = {
    {"encode", (PyCFunction)BPE_encode, METH_VARARGS,
     "encode(text: bytes, mode: int, ends) -> list[int]: ids of UTF-8 text; mode 1 GPT-2, 2 LLaMA-3 splitter, "
     "0 words ending at the int64 code point offsets ends."},
    {"cache_info", (PyCFunction)BPE_cache_info, METH_NOARGS, "The word cache as numbers (Model.cache_info)."},
    {"clear_cache", (PyCFunction)BPE_clear_cache, METH_NOARGS, "Forget every cached word."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BPEType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minillama._native._core.BPE",
    .tp_basicsize = sizeof(BPEObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Byte-level BPE (llama.cpp's llm_tokenizer_bpe) with its word cache, over a vocab's arrays.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)BPE_init,
    .tp_dealloc = (destructor)BPE_dealloc,
    .tp_methods = BPE_methods,
};

/* ---- quants.c: matrix products of quantized weights (issue 24) ------------------------------------------------ */

/* matmul(weight, ggml_type, rows, cols, x, out, threads): out[t, r] = weight row r . x[t] for every activation
 * row t of x (float32, n x cols), out float32 (n x rows). weight: the raw rows, exactly rows * row_bytes bytes.
 * Every length is checked against its buffer before C reads it; the GIL is released while the kernels run. */
static PyObject *quants_product(PyObject *args, int single) {
    PyObject *wo, *xo, *oo;
    int gtype, threads;
    long long rows, cols;
    if (!PyArg_ParseTuple(args, "OiLLOOi", &wo, &gtype, &rows, &cols, &xo, &oo, &threads)) return NULL;
    int type = mq_type_of_ggml(gtype);
    if (type < 0) return PyErr_Format(PyExc_ValueError, "matmul: no kernel for ggml type %d", gtype);
    long long block = mq_block(type);
    if (rows < 0 || cols <= 0 || cols > INT32_MAX || cols % block || threads < 1 || threads > 1024)
        return PyErr_Format(PyExc_ValueError, "matmul: expected rows >= 0, 0 < cols <= 2^31 - 1 a multiple of %lld "
                            "and 1..1024 threads, got rows %lld, cols %lld, threads %d", block, rows, cols, threads);
    long long row_bytes = cols / block * mq_type_size(type);
    if (rows > 0 && row_bytes > PY_SSIZE_T_MAX / rows)
        return PyErr_Format(PyExc_ValueError, "matmul: %lld rows of %lld bytes overflow", rows, row_bytes);
    Py_buffer wb, xb, ob;
    if (PyObject_GetBuffer(wo, &wb, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *res = NULL;
    if (wb.len != rows * row_bytes) {
        PyErr_Format(PyExc_ValueError, "matmul: weight has %zd bytes, expected %lld rows of %lld", wb.len, rows,
                     row_bytes);
        goto w;
    }
    if (!get_array(xo, &xb, 4, "x")) goto w;
    if (!get_array(oo, &ob, 4, "out")) goto x;
    if (ob.readonly || (xb.format && strcmp(xb.format, "f")) || (ob.format && strcmp(ob.format, "f"))) {
        PyErr_SetString(PyExc_ValueError, "matmul: x and out must be float32, out writable");
        goto o;
    }
    long long n_x = xb.len / 4 / cols;
    if (xb.len != n_x * cols * 4 || n_x < 1 || (single && n_x != 1) || ob.len != n_x * rows * 4) {
        PyErr_Format(PyExc_ValueError, "matmul: x has %zd values, out %zd; expected %s of %lld values and %lld "
                     "outputs each", xb.len / 4, ob.len / 4, single ? "one row" : "rows", cols, rows);
        goto o;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = mq_matmul(type, wb.buf, rows, cols, xb.buf, n_x, ob.buf, threads);
    Py_END_ALLOW_THREADS
    if (ok) {
        Py_INCREF(Py_None);
        res = Py_None;
    } else
        PyErr_NoMemory();
o:
    PyBuffer_Release(&ob);
x:
    PyBuffer_Release(&xb);
w:
    PyBuffer_Release(&wb);
    return res;
}

static PyObject *quants_matmul(PyObject *self, PyObject *args) {
    (void)self;
    return quants_product(args, 0);
}

static PyObject *quants_matvec(PyObject *self, PyObject *args) {
    (void)self;
    return quants_product(args, 1);
}

static PyObject *quants_isa(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(mq_isa());
}

#define QUANTS_METHODS                                                                                               \
    {"matmul", quants_matmul, METH_VARARGS,                                                                          \
     "matmul(weight, ggml_type, rows, cols, x, out, threads): out[t] = weight . x[t] as ggml computes it."},          \
    {"matvec", quants_matvec, METH_VARARGS, "matvec(weight, ggml_type, rows, cols, x, out, threads): one row x."},   \
    {"kernels", quants_isa, METH_NOARGS, "'avx2' or 'scalar': the quantized kernels this CPU runs."},

/* ---- end of quants.c binding ------------------------------------------------------------------------------------ */

static PyMethodDef core_methods[] = {
    QUANTS_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "_core", "minillama's native tokenizer core (C).", -1, core_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&BPEType) < 0) return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    Py_INCREF(&BPEType);
    if (PyModule_AddObject(m, "BPE", (PyObject *)&BPEType) < 0) {
        Py_DECREF(&BPEType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
