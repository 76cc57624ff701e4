/* minillama._native._core: the CPython binding of the native core, the only file that includes Python.h.
 * Tables cross once, at construction (buffers from Vocab.arrays() and unicode_data's flags); text crosses as
 * UTF-8 bytes; the GIL is released while C works, so threads sharing one tokenizer run in parallel. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

/* A word cache as the dict Model.cache_info() gives. */
static PyObject *cache_dict(wcache *c) {
    wcache_info i;
    wcache_stats(c, &i);
    return Py_BuildValue("{snsnsnsnsnsnsnsn}", "words", (Py_ssize_t)i.words, "bytes", (Py_ssize_t)i.bytes,
                         "old_words", (Py_ssize_t)i.old_words, "old_bytes", (Py_ssize_t)i.old_bytes,
                         "largest_entry", (Py_ssize_t)i.largest_entry, "longest_word", (Py_ssize_t)i.longest_word,
                         "max_bytes", (Py_ssize_t)i.max_bytes, "max_words", (Py_ssize_t)i.max_words);
}

static PyObject *BPE_cache_info(BPEObject *self, PyObject *unused) {
    (void)unused;
    return self->b ? cache_dict(bpe_cache(self->b)) : PyDict_New();
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

/* ---- SPM: llama.cpp's llm_tokenizer_spm (spm.c) ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    spm *m;
    PyObject **ints; /* the int object of each id, made on first use: a result list allocates no ints */
    Py_ssize_t n_vocab;
} SPMObject;

static void SPM_dealloc(SPMObject *self) {
    spm_free(self->m);
    for (Py_ssize_t i = 0; self->ints && i < self->n_vocab; i++) Py_XDECREF(self->ints[i]);
    PyMem_Free(self->ints);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ids as a list of the object's shared int objects (ids are < n_vocab: spm.c emits only token ids). */
static PyObject *spm_ids_list(SPMObject *self, const ivec *v) {
    PyObject *list = PyList_New((Py_ssize_t)v->n);
    if (!list) return NULL;
    for (size_t i = 0; i < v->n; i++) {
        int32_t id = v->v[i];
        PyObject *x = id >= 0 && id < self->n_vocab ? self->ints[id] : NULL;
        if (!x) {
            x = PyLong_FromLong(id);
            if (!x) {
                Py_DECREF(list);
                return NULL;
            }
            if (id >= 0 && id < self->n_vocab) self->ints[id] = Py_NewRef(x);
        } else {
            Py_INCREF(x);
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    return list;
}

static int SPM_init(SPMObject *self, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *tok_bytes, *tok_off, *scores, *byte_ids;
    Py_ssize_t max_bytes, max_words;
    if (self->m) {
        PyErr_SetString(PyExc_RuntimeError, "SPM is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOnn", &tok_bytes, &tok_off, &scores, &byte_ids, &max_bytes, &max_words))
        return -1;
    if (max_bytes < 0 || max_words < 0) {
        PyErr_SetString(PyExc_ValueError, "cache bounds must be >= 0");
        return -1;
    }
    Py_buffer tb, ob, sb, bb;
    int ok = 0;
    if (!get_array(tok_bytes, &tb, 1, "token_bytes")) return -1;
    if (!get_array(tok_off, &ob, 8, "token_offsets")) goto s1;
    if (!get_array(scores, &sb, 4, "scores")) goto s2;
    if (!get_array(byte_ids, &bb, 4, "byte_ids")) goto s3;
    if (ob.len / 8 < 2 || sb.len / 4 != ob.len / 8 - 1 || bb.len / 4 != 256) {
        PyErr_SetString(PyExc_ValueError, "SPM tables: expected n_vocab + 1 >= 2 offsets, n_vocab float32 scores "
                                          "and 256 byte ids");
        goto s4;
    }
    spm *m;
    Py_BEGIN_ALLOW_THREADS
    m = spm_new(tb.buf, (size_t)tb.len, ob.buf, (size_t)(ob.len / 8 - 1), sb.buf, bb.buf, (size_t)max_bytes,
                (size_t)max_words);
    Py_END_ALLOW_THREADS
    if (!m) {
        PyErr_SetString(PyExc_ValueError, "SPM tables are inconsistent (offsets, byte ids) or memory ran out");
        goto s4;
    }
    self->n_vocab = ob.len / 8 - 1;
    self->ints = PyMem_Calloc((size_t)self->n_vocab, sizeof(PyObject *));
    if (!self->ints) {
        spm_free(m);
        PyErr_NoMemory();
        goto s4;
    }
    self->m = m;
    ok = 1;
s4:
    PyBuffer_Release(&bb);
s3:
    PyBuffer_Release(&sb);
s2:
    PyBuffer_Release(&ob);
s1:
    PyBuffer_Release(&tb);
    return ok ? 0 : -1;
}

static PyObject *SPM_encode(SPMObject *self, PyObject *args) {
    PyObject *obj;
    if (!self->m) {
        PyErr_SetString(PyExc_RuntimeError, "SPM is not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O", &obj)) return NULL;
    /* a str as its UTF-8 (kept by the str, valid: a lone surrogate raises UnicodeEncodeError), else bytes */
    Py_buffer text = {0};
    const char *data;
    Py_ssize_t len;
    int valid = PyUnicode_Check(obj);
    if (valid) {
        if (!(data = PyUnicode_AsUTF8AndSize(obj, &len))) return NULL;
    } else {
        if (PyObject_GetBuffer(obj, &text, PyBUF_SIMPLE) < 0) return NULL;
        data = text.buf;
        len = text.len;
    }
    ivec out = {NULL, 0, 0, 1};
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = spm_encode(self->m, (const uint8_t *)data, (size_t)len, valid, &out);
    Py_END_ALLOW_THREADS
    if (!valid) PyBuffer_Release(&text);
    PyObject *res = NULL;
    if (ok)
        res = spm_ids_list(self, &out);
    else if (!out.ok)
        PyErr_NoMemory();
    else
        res = Py_NewRef(Py_None); /* a byte with no byte token: the caller raises the vocab's error */
    ivec_free(&out);
    return res;
}

static PyObject *SPM_cache_info(SPMObject *self, PyObject *unused) {
    (void)unused;
    return self->m ? cache_dict(spm_cache(self->m)) : PyDict_New();
}

static PyObject *SPM_clear_cache(SPMObject *self, PyObject *unused) {
    (void)unused;
    if (self->m) wcache_clear(spm_cache(self->m));
    Py_RETURN_NONE;
}

static PyMethodDef SPM_methods[] = {
    {"encode", (PyCFunction)SPM_encode, METH_VARARGS,
     "encode(text: bytes | str) -> list[int] | None: ids of the bytes, or of a str's UTF-8 (U+2581 for spaces); "
     "None when a byte that no token covers has no byte token."},
    {"cache_info", (PyCFunction)SPM_cache_info, METH_NOARGS, "The word cache as numbers (Model.cache_info)."},
    {"clear_cache", (PyCFunction)SPM_clear_cache, METH_NOARGS, "Forget every cached word."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SPMType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minillama._native._core.SPM",
    .tp_basicsize = sizeof(SPMObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SentencePiece BPE (llama.cpp's llm_tokenizer_spm) with its word cache, over a vocab's arrays.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SPM_init,
    .tp_dealloc = (destructor)SPM_dealloc,
    .tp_methods = SPM_methods,
};

/* ---- end of SPM ------------------------------------------------------------------------------------------ */

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "_core", "minillama's native tokenizer core (C).", -1, NULL, NULL, NULL, NULL, NULL,
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
    if (PyType_Ready(&SPMType) < 0 || PyModule_AddObjectRef(m, "SPM", (PyObject *)&SPMType) < 0) return Py_DECREF(m), NULL;
    return m;
}
