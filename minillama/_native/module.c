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
    PyObject **ints; /* lazy_ids_list's int of each id */
    Py_ssize_t n_vocab;
    int mode; /* the splitter encode_plain / encode_many use when called without one (0: none) */
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

/* ids as a list of shared int objects: ints[id] (n_vocab of them) made on first use and kept, so a result list
 * allocates no ints (a first pass over a corpus otherwise spends more on making and freeing ints than in C). An
 * id outside ints gets a new int. Called with the GIL held, which guards ints. */
static PyObject *lazy_ids_list(const ivec *v, PyObject **ints, Py_ssize_t n_vocab) {
    PyObject *list = PyList_New((Py_ssize_t)v->n);
    if (!list) return NULL;
    for (size_t i = 0; i < v->n; i++) {
        int32_t id = v->v[i];
        /* the table's slots and the ints are scattered: ask for the next ones early */
        if (i + 16 < v->n && v->v[i + 16] >= 0 && v->v[i + 16] < n_vocab) __builtin_prefetch(&ints[v->v[i + 16]]);
        if (i + 8 < v->n && v->v[i + 8] >= 0 && v->v[i + 8] < n_vocab && ints[v->v[i + 8]])
            __builtin_prefetch(ints[v->v[i + 8]], 1);
        PyObject *x = id >= 0 && id < n_vocab ? ints[id] : NULL;
        if (!x) {
            x = PyLong_FromLong(id);
            if (!x) {
                Py_DECREF(list);
                return NULL;
            }
            if (id >= 0 && id < n_vocab) ints[id] = Py_NewRef(x);
        } else {
            Py_INCREF(x);
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    return list;
}

static void free_ints(PyObject **ints, Py_ssize_t n_vocab) {
    for (Py_ssize_t i = 0; ints && i < n_vocab; i++) Py_XDECREF(ints[i]);
    PyMem_Free(ints);
}

static void BPE_dealloc(BPEObject *self) {
    bpe_free(self->b);
    free_ints(self->ints, self->n_vocab);
    if (self->has_flags) PyBuffer_Release(&self->flags);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int BPE_init(BPEObject *self, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *flags, *tok_bytes, *tok_off, *merges, *byte_ids, *byte_chars;
    int ignore_merges, mode = 0;
    Py_ssize_t max_bytes, max_words;
    if (self->b) {
        PyErr_SetString(PyExc_RuntimeError, "BPE is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOpnn|i", &flags, &tok_bytes, &tok_off, &merges, &byte_ids, &byte_chars,
                          &ignore_merges, &max_bytes, &max_words, &mode))
        return -1;
    if (max_bytes < 0 || max_words < 0 || mode < SPLIT_WORDS || mode >= SPLIT_END) {
        PyErr_SetString(PyExc_ValueError, "cache bounds must be >= 0, the mode one of the splitters or 0");
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

/* ---- encode_flat: many texts' ids in one int32 buffer (minillama dataset's batches) ------------------------- */

#define FLAT_MAX_AFFIX 64 /* ids in encode_flat's prefix or suffix: bos/eos and a separator, a few at most */

/* A sequence of at most FLAT_MAX_AFFIX ids into ids[]; its length, or -1 and an exception naming what. */
static Py_ssize_t flat_affix(PyObject *seq, int32_t *ids, const char *name) {
    PyObject *t = PySequence_Tuple(seq);
    if (!t) return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    if (n > FLAT_MAX_AFFIX) {
        Py_DECREF(t);
        PyErr_Format(PyExc_ValueError, "encode_flat: expected a %s of at most %d ids, got %zd", name, FLAT_MAX_AFFIX, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long x = PyLong_AsLong(PyTuple_GET_ITEM(t, i));
        if (x == -1 && PyErr_Occurred()) {
            Py_DECREF(t);
            return -1;
        }
        if (x < 0 || x > INT32_MAX) {
            Py_DECREF(t);
            PyErr_Format(PyExc_ValueError, "encode_flat: expected %s ids >= 0, got %ld", name, x);
            return -1;
        }
        ids[i] = (int32_t)x;
    }
    Py_DECREF(t);
    return n;
}

/* seq as a tuple of str (owning every item while the GIL is released); NULL and a TypeError naming who and the
 * first item that is no str. */
static PyObject *str_tuple(PyObject *seq, const char *who) {
    PyObject *texts = PySequence_Tuple(seq);
    if (!texts) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(texts); i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(texts, i))) {
            PyErr_Format(PyExc_TypeError, "%s: item %zd is %s, expected str", who, i,
                         Py_TYPE(PyTuple_GET_ITEM(texts, i))->tp_name);
            Py_DECREF(texts);
            return NULL;
        }
    return texts;
}

/* Whether str t starts with str s (str.startswith, code point by code point); 0 for an empty s. */
static int str_starts_with(PyObject *t, PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n == 0 || PyUnicode_GET_LENGTH(t) < n) return 0;
    int tk = PyUnicode_KIND(t), sk = PyUnicode_KIND(s);
    const void *td = PyUnicode_DATA(t), *sd = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_READ(tk, td, i) != PyUnicode_READ(sk, sd, i)) return 0;
    return 1;
}

/* encode_flat's arguments (texts, prefix, suffix, starts, ...): its texts as a tuple (owning them while the GIL is
 * released), its prefix and suffix ids and starts (a str, borrowed); NULL and an exception when they are not.
 * *plain is 0 when some text is no str of exactly type str (the caller returns None: Tokenizer.encode_concat
 * then encodes text by text, which takes or refuses it as encode does). */
static PyObject *flat_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t most, int32_t *pre, Py_ssize_t *npre,
                           int32_t *suf, Py_ssize_t *nsuf, PyObject **starts, int *plain, const char *signature) {
    if (nargs < 4 || nargs > most) return PyErr_Format(PyExc_TypeError, "expected %s", signature);
    if ((*npre = flat_affix(args[1], pre, "prefix")) < 0 || (*nsuf = flat_affix(args[2], suf, "suffix")) < 0)
        return NULL;
    if (!PyUnicode_Check(args[3]))
        return PyErr_Format(PyExc_TypeError, "encode_flat: starts must be a str, got %s", Py_TYPE(args[3])->tp_name);
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(args[3]) < 0) return NULL;
#endif
    *starts = args[3];
    PyObject *texts = PySequence_Tuple(args[0]);
    if (!texts) return NULL;
    *plain = 1;
    for (Py_ssize_t i = 0; *plain && i < PyTuple_GET_SIZE(texts); i++) *plain = PyUnicode_CheckExact(PyTuple_GET_ITEM(texts, i));
    return texts;
}

/* encode_flat's result: (ids as int32 bytes, each text's end in them as int64 bytes, whether some text starts
 * with starts); None when some text failed (failed, out.ok set) and MemoryError when memory ran out. Frees out. */
static PyObject *flat_result(ivec *out, const int64_t *ends, Py_ssize_t n, int failed, int found) {
    PyObject *res = NULL;
    if (!out->ok)
        PyErr_NoMemory();
    else if (failed)
        res = Py_NewRef(Py_None);
    else
        res = Py_BuildValue("(y#y#N)", out->v ? (const char *)out->v : "", (Py_ssize_t)(out->n * sizeof *out->v),
                            (const char *)ends, /* y# of NULL would be None */
                            (Py_ssize_t)(n * (Py_ssize_t)sizeof *ends), PyBool_FromLong(found));
    ivec_free(out);
    return res;
}

/* One text's ids between prefix and suffix in out (ok: the encoder's result, 1 for success); ends[i] set. 0 when
 * the text failed or memory ran out. */
static inline int flat_push(ivec *out, int ok, const int32_t *suf, Py_ssize_t nsuf, int64_t *end) {
    if (ok <= 0 || !out->ok || !ivec_extend(out, suf, (size_t)nsuf)) return 0;
    *end = (int64_t)out->n;
    return 1;
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

/* encode_many(texts: sequence of str, mode) -> list[list[int] | None]: encode_plain of each text, the GIL
 * released once for them all (a thread of a batch then never waits for it between texts). */
static PyObject *BPE_encode_many(BPEObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long mode = splitter_mode(self, args, nargs, "encode_many(texts: sequence of str, mode: int = own)");
    if (mode < 0) return NULL;
    PyObject *texts = PySequence_Tuple(args[0]); /* owns every item while the GIL is released */
    if (!texts) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(texts);
    const char **utf8 = PyMem_Calloc((size_t)n + 1, sizeof *utf8);
    Py_ssize_t *lens = PyMem_Calloc((size_t)n + 1, sizeof *lens);
    size_t *ends = PyMem_Calloc((size_t)n + 1, sizeof *ends);
    PyObject *res = NULL;
    if (!utf8 || !lens || !ends) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(texts, i);
        if (!PyUnicode_Check(t)) {
            PyErr_Format(PyExc_TypeError, "encode_many: item %zd is %s, expected str", i, Py_TYPE(t)->tp_name);
            goto done;
        }
        utf8[i] = PyUnicode_AsUTF8AndSize(t, &lens[i]);
        if (!utf8[i]) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) goto done;
            PyErr_Clear(); /* lone surrogates: None, the caller's raw-byte path */
        }
    }
    ivec out = {NULL, 0, 0, 1};
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        if (utf8[i])
            ok = bpe_encode(self->b, (const uint8_t *)utf8[i], (size_t)lens[i], (int)mode, NULL, 0, self->flags.buf,
                            &out);
        ends[i] = out.n;
    }
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        ivec_free(&out);
        goto done;
    }
    res = PyList_New(n);
    for (Py_ssize_t i = 0; res && i < n; i++) {
        PyObject *ids;
        if (utf8[i]) {
            size_t start = i ? ends[i - 1] : 0;
            ivec part = {out.v + start, ends[i] - start, ends[i] - start, 1};
            ids = lazy_ids_list(&part, self->ints, self->n_vocab);
        } else {
            ids = Py_NewRef(Py_None);
        }
        if (!ids) Py_CLEAR(res);
        else PyList_SET_ITEM(res, i, ids);
    }
    ivec_free(&out);
done:
    PyMem_Free(utf8);
    PyMem_Free(lens);
    PyMem_Free(ends);
    Py_DECREF(texts);
    return res;
}

/* encode_flat(texts, prefix, suffix, starts, mode = own) -> (bytes, bytes, bool) | None: each text's encode_plain
 * ids between the prefix and suffix ids, all in one int32 buffer, where each text's ends (int64), and whether some
 * text starts with the str starts (never for ''), the GIL released once: no list per text. None when a text holds
 * lone surrogates or is no str of exactly type str (the caller encodes the batch its usual way). */
static PyObject *BPE_encode_flat(BPEObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char sig[] = "encode_flat(texts: sequence of str, prefix: ids, suffix: ids, starts: str, "
                              "mode: int = own)";
    int32_t pre[FLAT_MAX_AFFIX], suf[FLAT_MAX_AFFIX];
    Py_ssize_t npre, nsuf;
    PyObject *starts;
    int plain, found = 0;
    PyObject *texts = flat_args(args, nargs, 5, pre, &npre, suf, &nsuf, &starts, &plain, sig);
    if (!texts) return NULL;
    long mode = splitter_mode(self, args + 3, nargs - 3, sig); /* (starts[, mode]) as (text[, mode]) */
    Py_ssize_t n = PyTuple_GET_SIZE(texts);
    const char **utf8 = PyMem_Calloc((size_t)n + 1, sizeof *utf8);
    Py_ssize_t *lens = PyMem_Calloc((size_t)n + 1, sizeof *lens);
    int64_t *ends = PyMem_Calloc((size_t)n + 1, sizeof *ends);
    PyObject *res = NULL;
    int failed = !plain;
    if (mode < 0) goto done;
    if (!utf8 || !lens || !ends) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(texts, i);
        utf8[i] = PyUnicode_AsUTF8AndSize(t, &lens[i]);
        if (!utf8[i]) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) goto done;
            PyErr_Clear(); /* lone surrogates: None */
            failed = 1;
        }
        found = found || str_starts_with(t, starts);
    }
    ivec out = {NULL, 0, 0, 1};
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; !failed && i < n; i++)
            failed = !(ivec_extend(&out, pre, (size_t)npre) &&
                       flat_push(&out, bpe_encode(self->b, (const uint8_t *)utf8[i], (size_t)lens[i], (int)mode, NULL,
                                                  0, self->flags.buf, &out), suf, nsuf, &ends[i]));
        Py_END_ALLOW_THREADS
    }
    res = flat_result(&out, ends, n, failed, found);
done:
    PyMem_Free(utf8);
    PyMem_Free(lens);
    PyMem_Free(ends);
    Py_DECREF(texts);
    return res;
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

/* A word cache as the dict Encoder.cache_info() gives. */
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
     "encode(text: bytes, mode: int, ends) -> list[int]: ids of UTF-8 text; mode 1 GPT-2, 2 LLaMA-3, 3 Falcon, "
     "4 StarCoder splitter, 0 words ending at the int64 code point offsets ends."},
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
    .tp_doc = "Byte-level BPE (llama.cpp's llm_tokenizer_bpe) with its word cache, over a vocab's arrays.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)BPE_init,
    .tp_dealloc = (destructor)BPE_dealloc,
    .tp_methods = BPE_methods,
};

/* ==== Unigram (UGM) and WordPiece (WPM): ugm.c, wpm.c ================================================ */

/* ids: a tuple of the ints 0..n_vocab - 1 the Python side made once, so an id list holds shared ints instead of
 * a new int object per id (a first pass over a corpus otherwise spends more on allocating ints than on C). */
typedef struct {
    PyObject_HEAD
    ugm *u;
    PyObject *ids;
} UGMObject;

typedef struct {
    PyObject_HEAD
    wpm *w;
    PyObject *ids;
} WPMObject;

static void UGM_dealloc(UGMObject *self) {
    ugm_free(self->u);
    Py_XDECREF(self->ids);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void WPM_dealloc(WPMObject *self) {
    wpm_free(self->w);
    Py_XDECREF(self->ids);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* v as a list of the shared ints of ids (a tuple; PyLong_FromLong for an id outside it). */
static PyObject *shared_ids_list(const ivec *v, PyObject *ids) {
    PyObject *list = PyList_New((Py_ssize_t)v->n);
    if (!list) return NULL;
    Py_ssize_t n_ids = PyTuple_GET_SIZE(ids);
    for (size_t i = 0; i < v->n; i++) {
        int32_t id = v->v[i];
        PyObject *x = id >= 0 && id < n_ids ? Py_NewRef(PyTuple_GET_ITEM(ids, id)) : PyLong_FromLong(id);
        if (!x) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    return list;
}

/* Release the first n of bufs. */
static void release_all(Py_buffer *bufs, int n) {
    for (int i = 0; i < n; i++) PyBuffer_Release(&bufs[i]);
}

/* objs[i] as bufs[i] with items of sizes[i] bytes; on failure the ones got are released. */
static int get_arrays(PyObject **objs, Py_buffer *bufs, const Py_ssize_t *sizes, const char **names, int n) {
    for (int i = 0; i < n; i++)
        if (!get_array(objs[i], &bufs[i], sizes[i], names[i])) {
            release_all(bufs, i);
            return 0;
        }
    return 1;
}

static int UGM_init(UGMObject *self, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *o[8];
    int unk, esc, prefix, merge;
    double unk_score;
    if (self->u) {
        PyErr_SetString(PyExc_RuntimeError, "UGM is already initialised");
        return -1;
    }
    PyObject *ids;
    if (!PyArg_ParseTuple(args, "OOOOOOOOidpppO!", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &unk,
                          &unk_score, &esc, &prefix, &merge, &PyTuple_Type, &ids))
        return -1;
    static const Py_ssize_t sizes[8] = {1, 8, 4, 4, 1, 8, 4, 1};
    static const char *names[8] = {"token_bytes", "token_offsets", "token_ids", "token_scores", "user_bytes",
                                   "user_offsets", "charsmap_units", "charsmap_replacements"};
    Py_buffer b[8];
    if (!get_arrays(o, b, sizes, names, 8)) return -1;
    size_t n_tok = (size_t)(b[2].len / 4), n_user = (size_t)(b[5].len / 8);
    if ((size_t)(b[1].len / 8) != n_tok + 1 || (size_t)(b[3].len / 4) != n_tok || n_user == 0) {
        PyErr_SetString(PyExc_ValueError, "UGM tables: expected n + 1 token offsets for n ids and n scores, and "
                                          "user offsets");
        release_all(b, 8);
        return -1;
    }
    ugm *u;
    Py_BEGIN_ALLOW_THREADS
    u = ugm_new(b[0].buf, (size_t)b[0].len, b[1].buf, b[2].buf, b[3].buf, n_tok, b[4].buf, (size_t)b[4].len,
                b[5].buf, n_user - 1, b[6].buf, (size_t)(b[6].len / 4), b[7].buf, (size_t)b[7].len, unk, unk_score,
                esc, prefix, merge);
    Py_END_ALLOW_THREADS
    release_all(b, 8);
    if (!u) {
        PyErr_SetString(PyExc_ValueError, "UGM tables are inconsistent (offsets) or memory ran out");
        return -1;
    }
    self->u = u;
    self->ids = Py_NewRef(ids);
    return 0;
}

static int WPM_init(WPMObject *self, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *o[4];
    int unk;
    if (self->w) {
        PyErr_SetString(PyExc_RuntimeError, "WPM is already initialised");
        return -1;
    }
    PyObject *ids;
    if (!PyArg_ParseTuple(args, "OOOOiO!", &o[0], &o[1], &o[2], &o[3], &unk, &PyTuple_Type, &ids)) return -1;
    static const Py_ssize_t sizes[4] = {1, 8, 4, 4};
    static const char *names[4] = {"token_bytes", "token_offsets", "token_ids", "norm"};
    Py_buffer b[4];
    if (!get_arrays(o, b, sizes, names, 4)) return -1;
    if (b[1].len / 8 < 1 || b[3].len / 4 != MAX_CODE_POINT + 1) {
        PyErr_Format(PyExc_ValueError, "WPM tables: expected n_vocab + 1 token offsets and %d norm entries",
                     MAX_CODE_POINT + 1);
        release_all(b, 4);
        return -1;
    }
    wpm *w;
    Py_BEGIN_ALLOW_THREADS
    w = wpm_new(b[0].buf, (size_t)b[0].len, b[1].buf, b[2].buf, (size_t)(b[2].len / 4), (size_t)(b[1].len / 8 - 1),
                b[3].buf, unk);
    Py_END_ALLOW_THREADS
    release_all(b, 4);
    if (!w) {
        PyErr_SetString(PyExc_ValueError, "WPM tables are inconsistent (offsets) or memory ran out");
        return -1;
    }
    self->w = w;
    self->ids = Py_NewRef(ids);
    return 0;
}

/* encode(text) of either: text is bytes (UTF-8 or raw) or a str (its UTF-8: an ASCII str's own buffer, read
 * in place). The ids, or None where the pure path must decide: a str that has no UTF-8 form (lone
 * surrogates), or what the encoder refuses (it raises there). */
static PyObject *run_encode(const void *model, int (*encode)(const void *, const uint8_t *, size_t, ivec *),
                            PyObject *ids, PyObject *args) {
    PyObject *arg, *utf8 = NULL;
    Py_buffer text = {0};
    const uint8_t *data;
    size_t n;
    if (!model) {
        PyErr_SetString(PyExc_RuntimeError, "the encoder is not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O", &arg)) return NULL;
    if (PyUnicode_Check(arg)) {
        if (PyUnicode_IS_COMPACT_ASCII(arg)) {
            data = PyUnicode_DATA(arg); /* the tuple args holds arg while the GIL is released */
            n = (size_t)PyUnicode_GET_LENGTH(arg);
        } else {
            utf8 = PyUnicode_AsUTF8String(arg);
            if (!utf8) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return NULL;
                PyErr_Clear();
                Py_RETURN_NONE;
            }
            data = (const uint8_t *)PyBytes_AS_STRING(utf8);
            n = (size_t)PyBytes_GET_SIZE(utf8);
        }
    } else {
        if (PyObject_GetBuffer(arg, &text, PyBUF_SIMPLE) < 0) return NULL;
        data = text.buf;
        n = (size_t)text.len;
    }
    ivec out = {NULL, 0, 0, 1};
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = encode(model, data, n, &out);
    Py_END_ALLOW_THREADS
    if (text.obj) PyBuffer_Release(&text);
    Py_XDECREF(utf8);
    PyObject *res = r > 0 ? shared_ids_list(&out, ids) : r < 0 ? Py_NewRef(Py_None) : PyErr_NoMemory();
    ivec_free(&out);
    return res;
}

static int ugm_encode_any(const void *m, const uint8_t *s, size_t n, ivec *out) { return ugm_encode(m, s, n, out); }
static int wpm_encode_any(const void *m, const uint8_t *s, size_t n, ivec *out) { return wpm_encode(m, s, n, out); }

static PyObject *UGM_encode(UGMObject *self, PyObject *args) { return run_encode(self->u, ugm_encode_any, self->ids, args); }
static PyObject *WPM_encode(WPMObject *self, PyObject *args) { return run_encode(self->w, wpm_encode_any, self->ids, args); }

static PyMethodDef UGM_methods[] = {
    {"encode", (PyCFunction)UGM_encode, METH_VARARGS,
     "encode(text: str | bytes) -> list[int] | None: the ids of one fragment; None where the pure path decides."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef WPM_methods[] = {
    {"encode", (PyCFunction)WPM_encode, METH_VARARGS,
     "encode(text: str | bytes) -> list[int] | None: the ids of one fragment; None where the pure path decides."},

    {NULL, NULL, 0, NULL},
};

static PyTypeObject UGMType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minillama._native._core.UGM",
    .tp_basicsize = sizeof(UGMObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Unigram (llama.cpp's llm_tokenizer_ugm): normalisation and Viterbi over a vocab's tables.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)UGM_init,
    .tp_dealloc = (destructor)UGM_dealloc,
    .tp_methods = UGM_methods,
};

static PyTypeObject WPMType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minillama._native._core.WPM",
    .tp_basicsize = sizeof(WPMObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "WordPiece (llama.cpp's llm_tokenizer_wpm): normalisation and greedy longest match.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)WPM_init,
    .tp_dealloc = (destructor)WPM_dealloc,
    .tp_methods = WPM_methods,
};

/* The two types into module m; -1 on failure. */
static int add_ugm_wpm(PyObject *m) {
    PyTypeObject *types[2] = {&UGMType, &WPMType};
    const char *names[2] = {"UGM", "WPM"};
    for (int i = 0; i < 2; i++) {
        if (PyType_Ready(types[i]) < 0) return -1;
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            return -1;
        }
    }
    return 0;
}

/* ==== end of Unigram and WordPiece ==================================================================== */

/* ---- SPM: llama.cpp's llm_tokenizer_spm (spm.c) ------------------------------------------------------------ */

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

/* encode_many(texts: sequence of str) -> list[list[int] | None]: encode_plain of each, the GIL released once for
 * them all (encode_batch's threads). */
static PyObject *SPM_encode_many(SPMObject *self, PyObject *arg) {
    if (!self->m) {
        PyErr_SetString(PyExc_RuntimeError, "SPM is not initialised");
        return NULL;
    }
    PyObject *texts = PySequence_Tuple(arg); /* owns every item while the GIL is released */
    if (!texts) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(texts);
    const void **data = PyMem_Calloc((size_t)n + 1, sizeof *data);
    size_t *lens = PyMem_Calloc((size_t)n + 1, sizeof *lens), *ends = PyMem_Calloc((size_t)n + 1, sizeof *ends);
    int *kinds = PyMem_Calloc((size_t)n + 1, sizeof *kinds), *rs = PyMem_Calloc((size_t)n + 1, sizeof *rs);
    PyObject *res = NULL;
    if (!data || !lens || !ends || !kinds || !rs) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!plain_chars(PyTuple_GET_ITEM(texts, i), &data[i], &lens[i], &kinds[i])) goto done;
    ivec out = {NULL, 0, 0, 1};
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        size_t start = out.n;
        rs[i] = kinds[i] ? spm_encode_plain(self->m, data[i], lens[i], kinds[i], self->add_prefix, &out) : -1;
        ok = out.ok;
        if (rs[i] <= 0) out.n = start; /* a failed text leaves no ids behind */
        ends[i] = out.n;
    }
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        ivec_free(&out);
        goto done;
    }
    res = PyList_New(n);
    for (Py_ssize_t i = 0; res && i < n; i++) {
        size_t start = i ? ends[i - 1] : 0;
        ivec part = {out.v + start, ends[i] - start, ends[i] - start, 1};
        PyObject *ids = plain_result(self, rs[i], &part);
        if (!ids) Py_CLEAR(res);
        else PyList_SET_ITEM(res, i, ids);
    }
    ivec_free(&out);
done:
    PyMem_Free(data);
    PyMem_Free(lens);
    PyMem_Free(ends);
    PyMem_Free(kinds);
    PyMem_Free(rs);
    Py_DECREF(texts);
    return res;
}

/* encode_flat(texts, prefix, suffix, starts) -> (bytes, bytes, bool) | None: BPE.encode_flat for encode_plain's SPM
 * ids. None where encode_plain gives None for some text, or a text is no str of exactly type str. */
static PyObject *SPM_encode_flat(SPMObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int32_t pre[FLAT_MAX_AFFIX], suf[FLAT_MAX_AFFIX];
    Py_ssize_t npre, nsuf;
    PyObject *starts;
    int plain, found = 0;
    if (!self->m) {
        PyErr_SetString(PyExc_RuntimeError, "SPM is not initialised");
        return NULL;
    }
    PyObject *texts = flat_args(args, nargs, 4, pre, &npre, suf, &nsuf, &starts, &plain,
                                "encode_flat(texts: sequence of str, prefix: ids, suffix: ids, starts: str)");
    if (!texts) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(texts);
    const void **data = PyMem_Calloc((size_t)n + 1, sizeof *data);
    size_t *lens = PyMem_Calloc((size_t)n + 1, sizeof *lens);
    int *kinds = PyMem_Calloc((size_t)n + 1, sizeof *kinds);
    int64_t *ends = PyMem_Calloc((size_t)n + 1, sizeof *ends);
    PyObject *res = NULL;
    int failed = !plain;
    if (!data || !lens || !kinds || !ends) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(texts, i);
        if (!plain_chars(t, &data[i], &lens[i], &kinds[i])) goto done;
        failed |= !kinds[i];
        found = found || str_starts_with(t, starts);
    }
    ivec out = {NULL, 0, 0, 1};
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; !failed && i < n; i++)
            failed = !(ivec_extend(&out, pre, (size_t)npre) &&
                       flat_push(&out, spm_encode_plain(self->m, data[i], lens[i], kinds[i], self->add_prefix, &out),
                                 suf, nsuf, &ends[i]));
        Py_END_ALLOW_THREADS
    }
    res = flat_result(&out, ends, n, failed, found);
done:
    PyMem_Free(data);
    PyMem_Free(lens);
    PyMem_Free(kinds);
    PyMem_Free(ends);
    Py_DECREF(texts);
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

/* ---- end of SPM ------------------------------------------------------------------------------------------ */

/* ---- decode.c: the pieces of a vocab, joined ------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    pieces *p;
} PiecesObject;

static void Pieces_dealloc(PiecesObject *self) {
    pieces_free(self->p);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Pieces_init(PiecesObject *self, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *o[3];
    if (self->p) {
        PyErr_SetString(PyExc_RuntimeError, "Pieces is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2])) return -1;
    static const Py_ssize_t sizes[3] = {1, 8, 1};
    static const char *names[3] = {"piece_bytes", "piece_offsets", "special"};
    Py_buffer b[3];
    if (!get_arrays(o, b, sizes, names, 3)) return -1;
    if (b[1].len / 8 < 2 || b[2].len != b[1].len / 8 - 1) {
        PyErr_SetString(PyExc_ValueError, "Pieces tables: expected n + 1 >= 2 offsets and n special flags");
        release_all(b, 3);
        return -1;
    }
    self->p = pieces_new(b[0].buf, (size_t)b[0].len, b[1].buf, (size_t)b[2].len, b[2].buf);
    release_all(b, 3);
    if (!self->p) {
        PyErr_SetString(PyExc_ValueError, "Pieces tables are inconsistent (offsets) or memory ran out");
        return -1;
    }
    return 0;
}

/* join(ids: list, start, end, plain, strip_space) -> bytes | None: the pieces of ids[start:end] joined (the plain
 * table: control and unknown pieces empty), the first one's leading space left out when strip_space; None when
 * an id there is not an int in range (the caller's checks then name it). The ids are read with the GIL held (the
 * list may change once it is released); the copy runs without it. */
static PyObject *Pieces_join(PiecesObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!self->p) {
        PyErr_SetString(PyExc_RuntimeError, "Pieces is not initialised");
        return NULL;
    }
    if (nargs != 5 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "expected join(ids: list, start: int, end: int, plain: bool, strip_space: bool)");
        return NULL;
    }
    PyObject *list = args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    int plain = PyObject_IsTrue(args[3]), strip = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || plain < 0 || strip < 0) return NULL;
    if (start < 0 || end > PyList_GET_SIZE(list) || start > end) {
        PyErr_SetString(PyExc_ValueError, "join: expected 0 <= start <= end <= len(ids)");
        return NULL;
    }
    size_t n = (size_t)(end - start), n_vocab = pieces_count(self->p);
    int32_t small[256], *ids = n <= 256 ? small : PyMem_Malloc(n * sizeof *ids);
    if (!ids) return PyErr_NoMemory();
    PyObject *res = NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(list, start + (Py_ssize_t)i);
        int overflow;
        long v = PyLong_CheckExact(x) ? PyLong_AsLongAndOverflow(x, &overflow) : -1;
        if (v < 0 || (size_t)v >= n_vocab) {
            res = Py_NewRef(Py_None);
            goto done;
        }
        ids[i] = (int32_t)v;
    }
    size_t skip, total = pieces_size(self->p, ids, n, plain, strip, &skip);
    if (total > PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        goto done;
    }
    res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!res) goto done;
    Py_BEGIN_ALLOW_THREADS /* res is not shared yet, ids are ours */
    pieces_join(self->p, ids, n, plain, skip, (uint8_t *)PyBytes_AS_STRING(res));
    Py_END_ALLOW_THREADS
done:
    if (ids != small) PyMem_Free(ids);
    return res;
}

static PyMethodDef Pieces_methods[] = {
    {"join", (PyCFunction)(void (*)(void))Pieces_join, METH_FASTCALL,
     "join(ids: list, start, end, plain: bool, strip_space: bool) -> bytes | None: the pieces of ids[start:end] "
     "joined; None when one of those is not an int id of the vocab."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PiecesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minillama._native._core.Pieces",
    .tp_basicsize = sizeof(PiecesObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Every token's piece of a vocab (llama_token_to_piece), joined for a run of ids (llama_detokenize).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pieces_init,
    .tp_dealloc = (destructor)Pieces_dealloc,
    .tp_methods = Pieces_methods,
};

/* utf8_blob(tokens: list[str]) -> (bytes, bytes) | None: Vocab.arrays()'s token bytes in one pass: every str's
 * UTF-8 joined, and the n + 1 int64 offsets of each (native byte order); None when an item is no str or holds a
 * surrogate (the Python path then writes its raw bytes). Short work: the GIL stays held (the list is read). */
static PyObject *utf8_blob(PyObject *unused, PyObject *list) {
    (void)unused;
    if (!PyList_Check(list)) return PyErr_Format(PyExc_TypeError, "utf8_blob: expected a list, got %s",
                                                 Py_TYPE(list)->tp_name);
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int64_t));
    if (!offsets) return NULL;
    int64_t *off = (int64_t *)(void *)PyBytes_AS_STRING(offsets);
    size_t total = 0;
    off[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(list, i);
        int bad = 0;
        if (!PyUnicode_Check(t)) bad = 1;
#if PY_VERSION_HEX < 0x030C0000
        else if (PyUnicode_READY(t) < 0) return Py_DECREF(offsets), NULL;
#endif
        else total += ucs_utf8_size(PyUnicode_DATA(t), (size_t)PyUnicode_GET_LENGTH(t), PyUnicode_KIND(t), 0, &bad);
        if (bad || total > PY_SSIZE_T_MAX - 8) {
            Py_DECREF(offsets);
            Py_RETURN_NONE;
        }
        off[i + 1] = (int64_t)total;
    }
    uint8_t *buf = PyMem_Malloc(total + 4); /* the writer's 3 bytes past the end */
    if (!buf) return Py_DECREF(offsets), PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(list, i);
        int bad;
        ucs_utf8_write(PyUnicode_DATA(t), (size_t)PyUnicode_GET_LENGTH(t), PyUnicode_KIND(t), 0, buf + off[i], &bad);
    }
    PyObject *blob = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)total);
    PyMem_Free(buf);
    if (!blob) return Py_DECREF(offsets), NULL;
    return Py_BuildValue("(NN)", blob, offsets);
}

/* ---- end of decode.c binding ----------------------------------------------------------------------------- */

/* ---- quants.c: matrix products of quantized weights ------------------------------------------------ */
#include "model.h" /* mq_quantize_row, mq_partner_bytes */

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

/* quantize(ggml_type, x) -> bytes: x (float32, a multiple of the partner's block) quantized to the partner of
 * weights of ggml_type, as every product quantizes its activation rows (tests compare it with llama.cpp's). */
static PyObject *quants_quantize(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo;
    int gtype;
    if (!PyArg_ParseTuple(args, "iO", &gtype, &xo)) return NULL;
    const int type = mq_type_of_ggml(gtype);
    if (type < 0) return PyErr_Format(PyExc_ValueError, "quantize: no kernel for ggml type %d", gtype);
    Py_buffer xb;
    if (!get_array(xo, &xb, 4, "x")) return NULL;
    PyObject *res = NULL;
    const long long n = xb.len / 4, block = mq_partner_block(type);
    if ((xb.format && strcmp(xb.format, "f")) || n % block || n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "quantize: expected float32 x of a multiple of %lld values, got %lld", block,
                     n);
        goto x;
    }
    res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)mq_partner_bytes(type, n));
    if (res) {
        mq_init();
        mq_quantize_row(type, xb.buf, n, (uint8_t *)PyBytes_AS_STRING(res));
    }
x:
    PyBuffer_Release(&xb);
    return res;
}

static PyObject *quants_isa(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(mq_isa());
}

#define QUANTS_METHODS                                                                                               \
    {"matmul", quants_matmul, METH_VARARGS,                                                                          \
     "matmul(weight, ggml_type, rows, cols, x, out, threads): out[t] = weight . x[t] as ggml computes it."},          \
    {"matvec", quants_matvec, METH_VARARGS, "matvec(weight, ggml_type, rows, cols, x, out, threads): one row x."},   \
    {"kernels", quants_isa, METH_NOARGS, "'avx2' or 'scalar': the quantized kernels this CPU runs."},               \
    {"quantize", quants_quantize, METH_VARARGS, "quantize(ggml_type, x): x as the partner of ggml_type's weights."},

/* ---- end of quants.c binding ------------------------------------------------------------------------------------ */

/* ---- model.c: the blocks of a llama-family model in C ------------------------------------------------ */
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
        m.n_ff_exp > lim) {
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

/* A buffer's bytes, for the overlap check. */
typedef struct {
    uintptr_t lo, hi;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* forward(x, seqs, threads): x [T, n_embd] float32, run through every block in place; seqs a list of (rows, start,
 * k_caches, v_caches), one per sequence, whose rows lie in x one sequence after the other (rows >= 1, adding up to
 * T): that sequence's tokens at positions start..start+rows-1, their keys and values stored in its caches (one
 * float16 array per layer, [capacity, n_head_kv, head_dim(_v)], capacity >= start + rows). No two of the arrays
 * (x and every cache) may share memory: the threads of a pass write them at once. */
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
    span *spans = PyMem_Calloc(n_arrays + 2, sizeof(span));
    if (!cb || !ptrs || !seqs || !spans) {
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
        PyObject *ko, *vo;
        long long rows, start;
        PyObject *item = PyTuple_GET_ITEM(so, s);
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "forward: sequence %zd must be a tuple (rows, start, k_caches, v_caches)",
                         s);
            goto done;
        }
        if (!PyArg_ParseTuple(item, "LLO!O!", &rows, &start, &PyList_Type, &ko, &PyList_Type, &vo)) goto done;
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
        spans[i] = (span){(uintptr_t)cb[i].buf, (uintptr_t)cb[i].buf + (uintptr_t)cb[i].len};
    spans[n_caches] = (span){(uintptr_t)xb.buf, (uintptr_t)xb.buf + (uintptr_t)xb.len};
    size_t n_spans = n_caches + 1;
    if (lb.buf) spans[n_spans++] = (span){(uintptr_t)lb.buf, (uintptr_t)lb.buf + (uintptr_t)lb.len};
    qsort(spans, n_spans, sizeof(span), span_cmp);
    uintptr_t end = spans[0].hi;
    for (size_t i = 1; i < n_spans; end = spans[i].hi > end ? spans[i].hi : end, i++)
        if (spans[i].lo < end && spans[i].lo < spans[i].hi) {
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
    PyMem_Free(cb);
    PyMem_Free(ptrs);
    PyMem_Free(seqs);
    PyMem_Free(spans);
    if (lb.buf) PyBuffer_Release(&lb);
    PyBuffer_Release(&xb);
    Py_DECREF(so);
    return res;
}

static PyMethodDef Stack_methods[] = {
    {"forward", (PyCFunction)Stack_forward, METH_VARARGS,
     "forward(x, seqs, threads, logits=None): every block over x [T, n_embd] in place; seqs: [(rows, start, "
     "k_caches, v_caches), ...], each sequence's rows in turn; logits [len(seqs), n_vocab]: each sequence's last "
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

static int add_stack(PyObject *m) {
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
    return PyModule_AddObjectRef(m, "Stack", (PyObject *)&StackType);
}

/* ---- end of model.c binding --------------------------------------------------------------------------------- */

/* utf8_digests(texts: sequence of str, size: int) -> (bytes, int) | None: the BLAKE2b digest of size bytes
 * (hashlib.blake2b(t.encode(), digest_size=size).digest()) of each text's UTF-8, joined, and the UTF-8 bytes of all;
 * the GIL released while it hashes. None when a text holds a surrogate (the caller's surrogatepass path). */
static PyObject *utf8_digests(PyObject *unused, PyObject *args) {
    (void)unused;
    PyObject *arg;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "On", &arg, &size)) return NULL;
    if (size < 1 || size > 64) return PyErr_Format(PyExc_ValueError, "utf8_digests: expected a size of 1 to 64, got %zd", size);
    PyObject *texts = str_tuple(arg, "utf8_digests");
    if (!texts) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(texts);
    const void **data = PyMem_Calloc((size_t)n + 1, sizeof *data);
    size_t *lens = PyMem_Calloc((size_t)n + 1, sizeof *lens);
    int *kinds = PyMem_Calloc((size_t)n + 1, sizeof *kinds);
    PyObject *res = NULL, *digests = NULL;
    if (!data || !lens || !kinds) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(texts, i);
        data[i] = PyUnicode_DATA(t);
        lens[i] = (size_t)PyUnicode_GET_LENGTH(t);
        kinds[i] = PyUnicode_IS_ASCII(t) ? 0 : (int)PyUnicode_KIND(t); /* 0: the data is its UTF-8 */
    }
    if (!(digests = PyBytes_FromStringAndSize(NULL, n * size))) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(digests), *buf = NULL;
    size_t cap = 0, total = 0;
    int failed = 0; /* 1: a surrogate, 2: no memory */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        const uint8_t *utf8 = data[i];
        size_t len = lens[i];
        if (kinds[i]) {
            int surrogate = 0;
            len = ucs_utf8_size(data[i], lens[i], kinds[i], 0, &surrogate);
            if (surrogate) {
                failed = 1;
                break;
            }
            if (len + 4 > cap) {
                free(buf);
                cap = 2 * len + 64;
                if (!(buf = malloc(cap))) {
                    failed = 2;
                    break;
                }
            }
            ucs_utf8_write(data[i], lens[i], kinds[i], 0, buf, &surrogate);
            utf8 = buf;
        }
        blake2b(utf8, len, out + i * size, (size_t)size);
        total += len;
    }
    free(buf);
    Py_END_ALLOW_THREADS
    if (failed == 2)
        PyErr_NoMemory();
    else if (failed)
        res = Py_NewRef(Py_None);
    else
        res = Py_BuildValue("(On)", digests, (Py_ssize_t)total);
done:
    Py_XDECREF(digests);
    PyMem_Free(data);
    PyMem_Free(lens);
    PyMem_Free(kinds);
    Py_DECREF(texts);
    return res;
}

/* paragraphs(data: bytes) -> list[str] | None: fileio.paragraphs(data.decode()) -- the cut found with the GIL
 * released (paragraph_spans), then each paragraph decoded; None when data is not UTF-8 (the caller's decode names
 * the byte). */
static PyObject *paragraphs_of(PyObject *unused, PyObject *arg) {
    (void)unused;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    /* room for a paragraph every 64 bytes at first (a 256 KiB chunk of prose has one every ~200), more when the
     * text has more: a long paragraph costs no memory in proportion to it */
    size_t n = (size_t)b.len, cap = n / 64 + 16, k;
    size_t *spans = PyMem_Malloc(2 * cap * sizeof *spans);
    PyObject *res = NULL;
    for (;;) {
        if (!spans) {
            PyErr_NoMemory();
            goto done;
        }
        Py_BEGIN_ALLOW_THREADS /* the buffer is held: bytes stay alive and unchanged */
        k = paragraph_spans(b.buf, n, spans, cap);
        Py_END_ALLOW_THREADS
        if (k <= cap) break;
        PyMem_Free(spans);
        cap = k;
        spans = PyMem_Malloc(2 * cap * sizeof *spans);
    }
    if (!(res = PyList_New((Py_ssize_t)k))) goto done;
    for (size_t i = 0; i < k; i++) {
        PyObject *text = PyUnicode_DecodeUTF8((const char *)b.buf + spans[2 * i], (Py_ssize_t)(spans[2 * i + 1] -
                                              spans[2 * i]), NULL);
        if (!text) {
            Py_CLEAR(res);
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                res = Py_NewRef(Py_None);
            }
            goto done;
        }
        PyList_SET_ITEM(res, (Py_ssize_t)i, text);
    }
done:
    PyMem_Free(spans);
    PyBuffer_Release(&b);
    return res;
}

/* gelu_table() -> bytes: ms_gelu_table as 65536 float32 (tests compare it with llama.cpp's ggml_table_gelu_f16). */
static PyObject *gelu_table(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBytes_FromStringAndSize((const char *)ms_gelu_table(), 65536 * sizeof(float));
}

static PyMethodDef core_methods[] = {
    QUANTS_METHODS
    {"gelu_table", gelu_table, METH_NOARGS, "gelu_table() -> bytes: GeGLU's table of GELU at every float16, float32."},
    {"utf8_blob", utf8_blob, METH_O,
     "utf8_blob(tokens: list[str]) -> (bytes, bytes) | None: the tokens' UTF-8 joined and their n + 1 int64 "
     "offsets; None when one is no str or holds a surrogate."},
    {"utf8_digests", utf8_digests, METH_VARARGS,
     "utf8_digests(texts: sequence of str, size: int) -> (bytes, int) | None: hashlib.blake2b(t.encode(), "
     "digest_size=size).digest() of each text, joined, and their UTF-8 bytes in all, the GIL released; None when a "
     "text holds a surrogate."},
    {"paragraphs", paragraphs_of, METH_O,
     "paragraphs(data: bytes) -> list[str] | None: fileio.paragraphs(data.decode()), the cut found with the GIL "
     "released; None when data is not UTF-8."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "_core", "minillama's native core (C): the tokenizer and the quantized kernels.", -1,
    core_methods, NULL, NULL, NULL, NULL,
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
    if (add_ugm_wpm(m) < 0) return Py_DECREF(m), NULL;
    if (PyType_Ready(&SPMType) < 0 || PyModule_AddObjectRef(m, "SPM", (PyObject *)&SPMType) < 0) return Py_DECREF(m), NULL;
    if (PyType_Ready(&PiecesType) < 0 || PyModule_AddObjectRef(m, "Pieces", (PyObject *)&PiecesType) < 0)
        return Py_DECREF(m), NULL;
    if (add_stack(m) < 0) return Py_DECREF(m), NULL;
    return m;
}
