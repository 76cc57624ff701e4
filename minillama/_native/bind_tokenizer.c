/* The tokenizer's binding: what BPE (bind_bpe.c) and SPM (bind_spm.c) share -- ids as lists of shared ints,
 * one batch encoder behind both encode_many and encode_flat, the word cache's numbers -- and the smaller
 * types: Unigram (ugm.c) and WordPiece (wpm.c), the pieces of a vocab joined (decode.c), utf8_blob (text.c). */
#include "bind.h"

/* ids as a list of shared int objects: ints[id] (n_vocab of them) made on first use and kept, so a result list
 * allocates no ints (a first pass over a corpus otherwise spends more on making and freeing ints than in C). An
 * id outside ints gets a new int. Called with the GIL held, which guards ints. */
PyObject *lazy_ids_list(const ivec *v, PyObject **ints, Py_ssize_t n_vocab) {
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

void free_ints(PyObject **ints, Py_ssize_t n_vocab) {
    for (Py_ssize_t i = 0; ints && i < n_vocab; i++) Py_XDECREF(ints[i]);
    PyMem_Free(ints);
}

/* v as a list of the shared ints of ids (a tuple; PyLong_FromLong for an id outside it). */
PyObject *shared_ids_list(const ivec *v, PyObject *ids) {
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

/* A word cache as the dict Encoder.cache_info() gives. */
PyObject *cache_dict(wcache *c) {
    wcache_info i;
    wcache_stats(c, &i);
    return Py_BuildValue("{snsnsnsnsnsnsnsn}", "words", (Py_ssize_t)i.words, "bytes", (Py_ssize_t)i.bytes,
                         "old_words", (Py_ssize_t)i.old_words, "old_bytes", (Py_ssize_t)i.old_bytes,
                         "largest_entry", (Py_ssize_t)i.largest_entry, "longest_word", (Py_ssize_t)i.longest_word,
                         "max_bytes", (Py_ssize_t)i.max_bytes, "max_words", (Py_ssize_t)i.max_words);
}

/* ---- encode_many and encode_flat of every encoder (minillama dataset's batches, encode_batch's threads) ------- */

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

int flat_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t most, const char *signature, flat_call *c) {
    if (nargs < 4 || nargs > most) return PyErr_Format(PyExc_TypeError, "expected %s", signature), 0;
    if ((c->npre = flat_affix(args[1], c->pre, "prefix")) < 0 || (c->nsuf = flat_affix(args[2], c->suf, "suffix")) < 0)
        return 0;
    if (!PyUnicode_Check(args[3]))
        return PyErr_Format(PyExc_TypeError, "encode_flat: starts must be a str, got %s", Py_TYPE(args[3])->tp_name), 0;
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(args[3]) < 0) return 0;
#endif
    c->starts = args[3];
    PyObject *texts = PySequence_Tuple(args[0]);
    if (!texts) return 0;
    c->plain = 1;
    for (Py_ssize_t i = 0; c->plain && i < PyTuple_GET_SIZE(texts); i++)
        c->plain = PyUnicode_CheckExact(PyTuple_GET_ITEM(texts, i));
    c->texts = texts;
    return 1;
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

PyObject *batch_many(const batch_encoder *e, PyObject *seq) {
    PyObject *texts = PySequence_Tuple(seq); /* owns every item while the GIL is released */
    if (!texts) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(texts);
    batch_text *t = PyMem_Calloc((size_t)n + 1, sizeof *t);
    size_t *ends = PyMem_Calloc((size_t)n + 1, sizeof *ends);
    int *rs = PyMem_Calloc((size_t)n + 1, sizeof *rs);
    PyObject *res = NULL;
    if (!t || !ends || !rs) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!(rs[i] = e->prepare(PyTuple_GET_ITEM(texts, i), i, &t[i]))) goto done;
    ivec out = {NULL, 0, 0, 1};
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        size_t start = out.n;
        if (rs[i] > 0) rs[i] = e->encode(e->model, &t[i], &out);
        ok = rs[i] != 0 && out.ok;
        if (rs[i] <= 0) out.n = start; /* a text left to the caller leaves no ids behind */
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
        if (rs[i] > 0) {
            size_t start = i ? ends[i - 1] : 0;
            ivec part = {out.v + start, ends[i] - start, ends[i] - start, 1};
            ids = lazy_ids_list(&part, e->ints, e->n_vocab);
        } else {
            ids = Py_NewRef(Py_None);
        }
        if (!ids) Py_CLEAR(res);
        else PyList_SET_ITEM(res, i, ids);
    }
    ivec_free(&out);
done:
    PyMem_Free(t);
    PyMem_Free(ends);
    PyMem_Free(rs);
    Py_DECREF(texts);
    return res;
}

PyObject *batch_flat(const batch_encoder *e, flat_call *c) {
    Py_ssize_t n = PyTuple_GET_SIZE(c->texts);
    batch_text *t = PyMem_Calloc((size_t)n + 1, sizeof *t);
    int64_t *ends = PyMem_Calloc((size_t)n + 1, sizeof *ends);
    PyObject *res = NULL;
    int failed = !c->plain, found = 0;
    if (!t || !ends) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        PyObject *text = PyTuple_GET_ITEM(c->texts, i);
        int r = e->prepare(text, i, &t[i]);
        if (!r) goto done;
        failed = r < 0; /* left to the caller: None */
        found = found || str_starts_with(text, c->starts);
    }
    ivec out = {NULL, 0, 0, 1};
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; !failed && i < n; i++)
            failed = !(ivec_extend(&out, c->pre, (size_t)c->npre) &&
                       flat_push(&out, e->encode(e->model, &t[i], &out), c->suf, c->nsuf, &ends[i]));
        Py_END_ALLOW_THREADS
    }
    res = flat_result(&out, ends, n, failed, found);
done:
    PyMem_Free(t);
    PyMem_Free(ends);
    Py_CLEAR(c->texts);
    return res;
}

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

static PyMethodDef tokenizer_functions[] = {
    {"utf8_blob", utf8_blob, METH_O,
     "utf8_blob(tokens: list[str]) -> (bytes, bytes) | None: the tokens' UTF-8 joined and their n + 1 int64 "
     "offsets; None when one is no str or holds a surrogate."},
    {NULL, NULL, 0, NULL},
};

int add_tokenizer(PyObject *m) {
    if (add_bpe(m) < 0 || add_ugm_wpm(m) < 0 || add_spm(m) < 0) return -1;
    if (PyType_Ready(&PiecesType) < 0 || PyModule_AddObjectRef(m, "Pieces", (PyObject *)&PiecesType) < 0) return -1;
    return PyModule_AddFunctions(m, tokenizer_functions);
}
