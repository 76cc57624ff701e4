/* The binding of SentencePiece BPE (spm.c): the SPM type, its word cache and its batch paths. */
#include "bind.h"

typedef struct {
    PyObject_HEAD
    spm *m;
    PyObject **ints; /* the int object of each id, made on first use: a result list allocates no ints */
    Py_ssize_t n_vocab;
    int add_prefix; /* encode_plain's dummy space prefix (the vocab's add_space_prefix) */
} SPMObject;

/* encode_plain leaves a str of this many characters or more to the caller (encoders/spm.py's _NATIVE_MAX_CHARS:
 * the pure path encodes it a piece at a time). */
#define SPM_PLAIN_MAX_CHARS ((Py_ssize_t)1 << 29)

static void SPM_dealloc(SPMObject *self) {
    spm_free(self->m);
    free_ints(self->ints, self->n_vocab);
    Py_TYPE(self)->tp_free((PyObject *)self);
}


static int SPM_init(SPMObject *self, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *tok_bytes, *tok_off, *scores, *byte_ids;
    Py_ssize_t max_bytes, max_words;
    int add_prefix;
    if (self->m) {
        PyErr_SetString(PyExc_RuntimeError, "SPM is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOnnp", &tok_bytes, &tok_off, &scores, &byte_ids, &max_bytes, &max_words,
                          &add_prefix))
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
    self->add_prefix = add_prefix;
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

static PyObject *SPM_encode(SPMObject *self, PyObject *obj) {
    if (!self->m) {
        PyErr_SetString(PyExc_RuntimeError, "SPM is not initialised");
        return NULL;
    }
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
        res = lazy_ids_list(&out, self->ints, self->n_vocab);
    else if (!out.ok)
        PyErr_NoMemory();
    else
        res = Py_NewRef(Py_None); /* a byte with no byte token: the caller raises the vocab's error */
    ivec_free(&out);
    return res;
}

/* A str's characters for spm_encode_plain: its data, length and kind; 0 and an exception when it is no str, 1
 * with *kind 0 when the core leaves it to the caller (too long). */
static int plain_chars(PyObject *obj, const void **data, size_t *n, int *kind) {
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "expected a str, got %s", Py_TYPE(obj)->tp_name);
        return 0;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(obj) < 0) return 0;
#endif
    Py_ssize_t len = PyUnicode_GET_LENGTH(obj);
    *data = PyUnicode_DATA(obj);
    *n = (size_t)len;
    *kind = len < SPM_PLAIN_MAX_CHARS ? (int)PyUnicode_KIND(obj) : 0;
    return 1;
}

/* The result of spm_encode_plain as Python sees it: the ids, None (the caller's path decides: a surrogate, a
 * byte no token covers, a text too long), or MemoryError. */
static PyObject *plain_result(SPMObject *self, int r, const ivec *out) {
    if (r > 0) return lazy_ids_list(out, self->ints, self->n_vocab);
    if (r == 0 && !out->ok) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* encode_plain(text: str) -> list[int] | None: Tokenizer.encode(text, add_special=False) for a vocab with no
 * special token matched in plain text -- the dummy prefix and U+2581 for spaces added here, while the str's
 * characters are written as UTF-8 with the GIL released (no bytes object, no UTF-8 kept on the str). */
static PyObject *SPM_encode_plain(SPMObject *self, PyObject *obj) {
    const void *data;
    size_t n;
    int kind;
    if (!self->m) {
        PyErr_SetString(PyExc_RuntimeError, "SPM is not initialised");
        return NULL;
    }
    if (!plain_chars(obj, &data, &n, &kind)) return NULL;
    if (!kind) Py_RETURN_NONE;
    ivec out = {NULL, 0, 0, 1};
    int r;
    Py_BEGIN_ALLOW_THREADS /* the caller's reference keeps the immutable str alive */
    r = spm_encode_plain(self->m, data, n, kind, self->add_prefix, &out);
    Py_END_ALLOW_THREADS
    PyObject *res = plain_result(self, r, &out);
    ivec_free(&out);
    return res;
}

/* A batch's encoder (bind.h): spm_encode_plain over a str's own characters. */
typedef struct {
    spm *m;
    int add_prefix;
} spm_batch;

/* A text of a batch as its characters; -1 (None, the caller's path) for one too long for the core. */
static int spm_prepare(PyObject *text, Py_ssize_t i, batch_text *t) {
    (void)i;
    if (!plain_chars(text, &t->data, &t->n, &t->kind)) return 0;
    return t->kind ? 1 : -1;
}

/* spm_encode_plain, its 0 for a byte that no token covers (memory left) as -1: None, the caller's path. */
static int spm_batch_encode(const void *model, const batch_text *t, ivec *out) {
    const spm_batch *m = model;
    int r = spm_encode_plain(m->m, t->data, t->n, t->kind, m->add_prefix, out);
    return r == 0 && out->ok ? -1 : r;
}

/* encode_many(texts: sequence of str) -> list[list[int] | None]: encode_plain of each, the GIL released once for
 * them all (encode_batch's threads). */
static PyObject *SPM_encode_many(SPMObject *self, PyObject *arg) {
    if (!self->m) {
        PyErr_SetString(PyExc_RuntimeError, "SPM is not initialised");
        return NULL;
    }
    const spm_batch m = {self->m, self->add_prefix};
    const batch_encoder e = {spm_prepare, spm_batch_encode, &m, self->ints, self->n_vocab};
    return batch_many(&e, arg);
}

/* encode_flat(texts, prefix, suffix, starts) -> (bytes, bytes, bool) | None: BPE.encode_flat for encode_plain's SPM
 * ids. None where encode_plain gives None for some text, or a text is no str of exactly type str. */
static PyObject *SPM_encode_flat(SPMObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!self->m) {
        PyErr_SetString(PyExc_RuntimeError, "SPM is not initialised");
        return NULL;
    }
    flat_call c;
    if (!flat_args(args, nargs, 4, "encode_flat(texts: sequence of str, prefix: ids, suffix: ids, starts: str)", &c))
        return NULL;
    const spm_batch m = {self->m, self->add_prefix};
    const batch_encoder e = {spm_prepare, spm_batch_encode, &m, self->ints, self->n_vocab};
    return batch_flat(&e, &c);
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
    {"encode", (PyCFunction)SPM_encode, METH_O,
     "encode(text: bytes | str) -> list[int] | None: ids of the bytes, or of a str's UTF-8 (U+2581 for spaces); "
     "None when a byte that no token covers has no byte token."},
    {"encode_plain", (PyCFunction)SPM_encode_plain, METH_O,
     "encode_plain(text: str) -> list[int] | None: the ids of a plain fragment as Tokenizer.encode prepares it "
     "(dummy prefix, U+2581 for spaces); None where the caller's path decides (lone surrogates, a byte with no "
     "byte token, 2**29 characters or more)."},
    {"encode_many", (PyCFunction)SPM_encode_many, METH_O,
     "encode_many(texts: sequence of str) -> list[list[int] | None]: encode_plain of each, the GIL released once."},
    {"encode_flat", (PyCFunction)(void (*)(void))SPM_encode_flat, METH_FASTCALL,
     "encode_flat(texts: sequence of str, prefix: ids, suffix: ids, starts: str) -> (bytes, bytes, bool) | None: "
     "prefix + encode_plain + suffix of each text as one int32 buffer, each text's end there (int64) and whether "
     "some text starts with starts (never for ''); None where encode_plain gives None for a text or a text is no "
     "str of exactly type str. The GIL is released once for all."},
    {"cache_info", (PyCFunction)SPM_cache_info, METH_NOARGS, "The word cache as numbers (Encoder.cache_info)."},
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

int add_spm(PyObject *m) {
    if (PyType_Ready(&SPMType) < 0) return -1;
    return PyModule_AddObjectRef(m, "SPM", (PyObject *)&SPMType);
}
