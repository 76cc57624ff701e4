/* The binding of byte-level BPE (bpe.c, merges.c): the BPE type, its word cache and its batch paths. */
#include "bind.h"

typedef struct {
    PyObject_HEAD
    bpe *b;
    Py_buffer flags; /* kept for the object's life: the splitters read it */
    int has_flags;
    PyObject **ints; /* lazy_ids_list's int of each id */
    Py_ssize_t n_vocab;
    int mode; /* the splitter encode_plain / encode_many use when called without one (0: none) */
} BPEObject;

static void BPE_dealloc(BPEObject *self) {
    bpe_free(self->b);
    free_ints(self->ints, self->n_vocab);
    if (self->has_flags) PyBuffer_Release(&self->flags);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int BPE_init(BPEObject *self, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *flags, *tok_bytes, *tok_off, *merges, *byte_ids, *byte_chars, *newline_ids = Py_None;
    int ignore_merges, mode = 0, chars = 0, escape_spaces = 0;
    Py_ssize_t max_bytes, max_words;
    if (self->b) {
        PyErr_SetString(PyExc_RuntimeError, "BPE is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOpnn|ippO", &flags, &tok_bytes, &tok_off, &merges, &byte_ids, &byte_chars,
                          &ignore_merges, &max_bytes, &max_words, &mode, &chars, &escape_spaces, &newline_ids))
        return -1;
    if (chars && ignore_merges) {
        PyErr_SetString(PyExc_ValueError, "BPE: character mode does not take ignore_merges");
        return -1;
    }
    if (max_bytes < 0 || max_words < 0 || mode < SPLIT_WORDS || mode >= SPLIT_END) {
        PyErr_SetString(PyExc_ValueError, "cache bounds must be >= 0, the mode one of the splitters or 0");
        return -1;
    }
    Py_buffer fb, tb, ob, mb, bb, cb, nb = {0};
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
    if (newline_ids != Py_None && !get_array(newline_ids, &nb, 4, "newline_ids")) goto f5;
    if (ob.len / 8 < 2 || mb.len / 4 % 3 || bb.len / 4 != 3 * 256 || cb.len / 4 != 256) {
        PyErr_SetString(PyExc_ValueError, "BPE tables: expected n_vocab + 1 >= 2 offsets, 3 ints a merge, "
                                          "256 x 3 byte ids and 256 byte characters");
        goto f5;
    }
    bpe *b;
    const bpe_chars ch = {escape_spaces, nb.buf, nb.buf ? (size_t)(nb.len / 4) : 0};
    Py_BEGIN_ALLOW_THREADS
    b = bpe_new(mb.buf, (size_t)(mb.len / 12), bb.buf, tb.buf, (size_t)tb.len, ob.buf, (size_t)(ob.len / 8 - 1),
                cb.buf, ignore_merges, (size_t)max_bytes, (size_t)max_words, chars ? &ch : NULL);
    Py_END_ALLOW_THREADS
    if (!b) {
        PyErr_SetString(PyExc_ValueError, "BPE tables are inconsistent (offsets, byte ids) or memory ran out");
        goto f5;
    }
    self->n_vocab = ob.len / 8 - 1;
    self->ints = PyMem_Calloc((size_t)self->n_vocab, sizeof(PyObject *));
    if (!self->ints) {
        bpe_free(b);
        PyErr_NoMemory();
        goto f5;
    }
    self->b = b;
    self->mode = mode;
    self->flags = fb;
    self->has_flags = 1;
    ok = 1;
f5:
    PyBuffer_Release(&nb); /* a no-op when none was taken */
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
    if (mode < SPLIT_WORDS || mode >= SPLIT_END || (mode == SPLIT_WORDS) != has_ends) {
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
        res = lazy_ids_list(&out, self->ints, self->n_vocab);
    else if (!out.ok)
        PyErr_NoMemory();
    else
        PyErr_SetString(PyExc_ValueError, "encode: word ends must rise to the text's length in code points");
    ivec_free(&out);
    return res;
}

/* The mode of a call (text, mode) of encode_plain / encode_many, checked: one of the core's splitters, or the
 * object's own for a call (text) when it has one; -1 and an exception set otherwise (signature: the method's,
 * for the message). */
static long splitter_mode(BPEObject *self, PyObject *const *args, Py_ssize_t nargs, const char *signature) {
    if (!self->b) {
        PyErr_SetString(PyExc_RuntimeError, "BPE is not initialised");
        return -1;
    }
    if (nargs == 1 && self->mode > SPLIT_WORDS) return self->mode;
    if (nargs != 2 || !PyLong_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "expected %s", signature);
        return -1;
    }
    long mode = PyLong_AsLong(args[1]);
    if (mode <= SPLIT_WORDS || mode >= SPLIT_END) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: mode %ld is no native splitter", signature, mode);
        return -1;
    }
    return mode;
}

/* encode_plain(text: str, mode) -> list[int] | None: encode() of a str whose UTF-8 Python already holds (no
 * bytes object made per call); None when text has lone surrogates (the caller's raw-byte path handles it). */
static PyObject *BPE_encode_plain(BPEObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long mode = splitter_mode(self, args, nargs, "encode_plain(text: str, mode: int = own)");
    if (mode < 0) return NULL;
    if (!PyUnicode_Check(args[0])) return PyErr_Format(PyExc_TypeError, "encode_plain: expected a str");
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(args[0], &n);
    if (!utf8) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    ivec out = {NULL, 0, 0, 1};
    int ok;
    Py_BEGIN_ALLOW_THREADS /* the str stays alive and immutable: args hold it */
    ok = bpe_encode(self->b, (const uint8_t *)utf8, (size_t)n, (int)mode, NULL, 0, self->flags.buf, &out);
    Py_END_ALLOW_THREADS
    PyObject *res = ok ? lazy_ids_list(&out, self->ints, self->n_vocab) : PyErr_NoMemory();
    ivec_free(&out);
    return res;
}

/* A batch's encoder (bind.h): bpe_encode in one mode over the text's UTF-8. */
typedef struct {
    bpe *b;
    int mode;
    const uint16_t *flags;
} bpe_batch;

/* A text of a batch as its UTF-8, the str's own; -1 (None, the caller's raw-byte path) for lone surrogates. */
static int bpe_prepare(PyObject *text, Py_ssize_t i, batch_text *t) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "encode_many: item %zd is %s, expected str", i, Py_TYPE(text)->tp_name);
        return 0;
    }
    Py_ssize_t n;
    if (!(t->data = PyUnicode_AsUTF8AndSize(text, &n))) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return 0;
        PyErr_Clear();
        return -1;
    }
    t->n = (size_t)n, t->kind = 1;
    return 1;
}

static int bpe_batch_encode(const void *model, const batch_text *t, ivec *out) {
    const bpe_batch *m = model;
    return bpe_encode(m->b, t->data, t->n, m->mode, NULL, 0, m->flags, out);
}

/* encode_many(texts: sequence of str, mode) -> list[list[int] | None]: encode_plain of each text, the GIL
 * released once for them all (a thread of a batch then never waits for it between texts). */
static PyObject *BPE_encode_many(BPEObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long mode = splitter_mode(self, args, nargs, "encode_many(texts: sequence of str, mode: int = own)");
    if (mode < 0) return NULL;
    const bpe_batch m = {self->b, (int)mode, self->flags.buf};
    const batch_encoder e = {bpe_prepare, bpe_batch_encode, &m, self->ints, self->n_vocab};
    return batch_many(&e, args[0]);
}

/* encode_flat(texts, prefix, suffix, starts, mode = own) -> (bytes, bytes, bool) | None: each text's encode_plain
 * ids between the prefix and suffix ids, all in one int32 buffer, where each text's ends (int64), and whether some
 * text starts with the str starts (never for ''), the GIL released once: no list per text. None when a text holds
 * lone surrogates or is no str of exactly type str (the caller encodes the batch its usual way). */
static PyObject *BPE_encode_flat(BPEObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char sig[] = "encode_flat(texts: sequence of str, prefix: ids, suffix: ids, starts: str, "
                              "mode: int = own)";
    flat_call c;
    if (!flat_args(args, nargs, 5, sig, &c)) return NULL;
    long mode = splitter_mode(self, args + 3, nargs - 3, sig); /* (starts[, mode]) as (text[, mode]) */
    if (mode < 0) {
        Py_DECREF(c.texts);
        return NULL;
    }
    const bpe_batch m = {self->b, (int)mode, self->flags.buf};
    const batch_encoder e = {bpe_prepare, bpe_batch_encode, &m, self->ints, self->n_vocab};
    return batch_flat(&e, &c);
}

/* BPE.resolve_merges(token_bytes, token_offsets, merge_text, n_merges) -> bytes | None: the int32 rows
 * (left, right, result) of Vocab.arrays().merges, resolved in C (merges.c); None when merge_text does not
 * hold n_merges lines. */
static PyObject *BPE_resolve_merges(PyObject *unused, PyObject *args) {
    (void)unused;
    PyObject *tok_bytes, *tok_off;
    Py_buffer text, tb, ob;
    Py_ssize_t n_merges;
    if (!PyArg_ParseTuple(args, "OOy*n", &tok_bytes, &tok_off, &text, &n_merges)) return NULL;
    PyObject *res = NULL;
    if (n_merges < 0 || n_merges > PY_SSIZE_T_MAX / 12) {
        PyErr_SetString(PyExc_ValueError, "resolve_merges: n_merges out of range");
        goto f0;
    }
    if (!get_array(tok_bytes, &tb, 1, "token_bytes")) goto f0;
    if (!get_array(tok_off, &ob, 8, "token_offsets")) goto f1;
    if (ob.len / 8 < 2) {
        PyErr_SetString(PyExc_ValueError, "resolve_merges: expected n_vocab + 1 >= 2 token offsets");
        goto f2;
    }
    res = PyBytes_FromStringAndSize(NULL, 12 * n_merges);
    if (!res) goto f2;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = resolve_merges(tb.buf, (size_t)tb.len, ob.buf, (size_t)(ob.len / 8 - 1), text.buf, (size_t)text.len,
                        (size_t)n_merges, (int32_t *)(void *)PyBytes_AS_STRING(res));
    Py_END_ALLOW_THREADS
    if (!ok) {
        Py_DECREF(res);
        res = Py_NewRef(Py_None);
    }
f2:
    PyBuffer_Release(&ob);
f1:
    PyBuffer_Release(&tb);
f0:
    PyBuffer_Release(&text);
    return res;
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
     "encode(text: bytes, mode: int, ends) -> list[int]: ids of UTF-8 text; mode 1 GPT-2, 2 LLaMA-3, 3 Falcon, "
     "4 StarCoder splitter, 5 newline runs, 0 words ending at the int64 code point offsets ends."},
    {"encode_plain", (PyCFunction)(void (*)(void))BPE_encode_plain, METH_FASTCALL,
     "encode_plain(text: str, mode: int = own) -> list[int] | None: encode(text's UTF-8, mode, None) for modes "
     ">= 1 (without one, the mode given to BPE()); None when text holds lone surrogates."},
    {"encode_many", (PyCFunction)(void (*)(void))BPE_encode_many, METH_FASTCALL,
     "encode_many(texts: sequence of str, mode: int) -> list[list[int] | None]: encode_plain of each, the GIL "
     "released once for all."},
    {"encode_flat", (PyCFunction)(void (*)(void))BPE_encode_flat, METH_FASTCALL,
     "encode_flat(texts: sequence of str, prefix: ids, suffix: ids, starts: str, mode: int = own) -> (bytes, bytes, "
     "bool) | None: prefix + encode_plain + suffix of each text as one int32 buffer, each text's end there (int64) "
     "and whether some text starts with starts (never for ''); None when a text holds lone surrogates or is no "
     "str of exactly type str. The GIL is released once for all."},
    {"resolve_merges", (PyCFunction)BPE_resolve_merges, METH_VARARGS | METH_STATIC,
     "resolve_merges(token_bytes, token_offsets, merge_text: bytes, n_merges) -> bytes | None: the int32 "
     "(left, right, result) rows of the merges, one a line of merge_text; None when the lines are not n_merges."},
    {"cache_info", (PyCFunction)BPE_cache_info, METH_NOARGS, "The word cache as numbers (Encoder.cache_info)."},
    {"clear_cache", (PyCFunction)BPE_clear_cache, METH_NOARGS, "Forget every cached word."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BPEType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minillama._native._core.BPE",
    .tp_basicsize = sizeof(BPEObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BPE (llama.cpp's llm_tokenizer_bpe) with its word cache, over a vocab's arrays: BPE(flags, "
              "token_bytes, token_offsets, merges, byte_ids, byte_chars, ignore_merges, max_bytes, max_words, "
              "mode=0, chars=False, escape_spaces=False, newline_ids=None); chars: SPM-style BPE over UTF-8 "
              "characters (gemma4).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)BPE_init,
    .tp_dealloc = (destructor)BPE_dealloc,
    .tp_methods = BPE_methods,
};

int add_bpe(PyObject *m) {
    if (PyType_Ready(&BPEType) < 0) return -1;
    return PyModule_AddObjectRef(m, "BPE", (PyObject *)&BPEType);
}
