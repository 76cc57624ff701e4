/* The CPython binding of the native core: module.c creates minillama._native._core and asks each area's binding
 * file to add its types and functions (bind_tokenizer.c with bind_bpe.c and bind_spm.c, bind_quants.c,
 * bind_model.c, bind_text.c, bind_sample.c). Only these files include Python.h (through this header); the algorithms they call
 * are plain C. Tables cross once, at construction; text crosses as UTF-8 or a str's own characters; the GIL is
 * released while C works, so threads sharing one object run in parallel. */
#ifndef MINILLAMA_BIND_H
#define MINILLAMA_BIND_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core.h"

/* Each area's types and functions into module m; -1 with an exception set on failure. */
int add_tokenizer(PyObject *m); /* BPE, SPM, UGM, WPM, Pieces, utf8_blob */
int add_quants(PyObject *m);    /* matmul, matvec, quantize, kernels */
int add_model(PyObject *m);     /* Stack, gelu_table */
int add_text(PyObject *m);      /* utf8_digests, paragraphs */
int add_sample(PyObject *m);    /* top_k */
/* bind_tokenizer.c's parts: the two encoders with word caches and batch paths. */
int add_bpe(PyObject *m);
int add_spm(PyObject *m);

/* ---- bind.c: arguments ---------------------------------------------------------------------------------------- */

/* buf as n items of itemsize bytes, C-contiguous; a TypeError/ValueError naming what otherwise. */
int get_array(PyObject *obj, Py_buffer *buf, Py_ssize_t itemsize, const char *name);
/* objs[i] as bufs[i] with items of sizes[i] bytes; on failure the ones got are released. */
int get_arrays(PyObject **objs, Py_buffer *bufs, const Py_ssize_t *sizes, const char **names, int n);
/* Release the first n of bufs. */
void release_all(Py_buffer *bufs, int n);
/* seq as a tuple of str (owning every item while the GIL is released); NULL and a TypeError naming who and the
 * first item that is no str. */
PyObject *str_tuple(PyObject *seq, const char *who);
/* Whether str t starts with str s (str.startswith, code point by code point); 0 for an empty s. */
int str_starts_with(PyObject *t, PyObject *s);

/* ---- bind_tokenizer.c: ids as Python sees them ---------------------------------------------------------------- */

/* ids as a list of shared int objects: ints[id] (n_vocab of them) made on first use and kept, so a result list
 * allocates no ints. An id outside ints gets a new int. Called with the GIL held, which guards ints. */
PyObject *lazy_ids_list(const ivec *v, PyObject **ints, Py_ssize_t n_vocab);
void free_ints(PyObject **ints, Py_ssize_t n_vocab);
/* v as a list of the shared ints of ids (a tuple; PyLong_FromLong for an id outside it). */
PyObject *shared_ids_list(const ivec *v, PyObject *ids);
/* A word cache as the dict Encoder.cache_info() gives. */
PyObject *cache_dict(wcache *c);

/* ---- bind_tokenizer.c: one batch encoder for every encoder's encode_many and encode_flat --------------------- */

/* One text of a batch as its encoder reads it: n units of data, kind bytes each (what prepare made of it). */
typedef struct {
    const void *data;
    size_t n;
    int kind;
} batch_text;

/* An encoder for the batch paths. prepare (GIL held): text i (an item of the batch) into *t; 1 done, -1 when its
 * result is None (left to the caller's path: no encode), 0 with an exception set. encode (GIL released): the ids
 * of *t appended to out; > 0 done, < 0 its result is None, 0 failed: encode_many raises MemoryError,
 * encode_flat gives MemoryError when out->ok is 0 (memory ran out) and None otherwise. model: encode's first
 * argument; ints, n_vocab: lazy_ids_list's. */
typedef struct {
    int (*prepare)(PyObject *text, Py_ssize_t i, batch_text *t);
    int (*encode)(const void *model, const batch_text *t, ivec *out);
    const void *model;
    PyObject **ints;
    Py_ssize_t n_vocab;
} batch_encoder;

/* encode_many(texts): list[list[int] | None], each text prepared then encoded, the GIL released once for all. */
PyObject *batch_many(const batch_encoder *e, PyObject *texts);

#define FLAT_MAX_AFFIX 64 /* ids in encode_flat's prefix or suffix: bos/eos and a separator, a few at most */

/* encode_flat's arguments (texts, prefix, suffix, starts, ...) once read: texts as a tuple (owned: it holds them
 * while the GIL is released), the prefix and suffix ids, starts (a str, borrowed), and plain: 0 when some text is
 * no str of exactly type str (the result is None: Tokenizer.encode_concat then encodes text by text). */
typedef struct {
    PyObject *texts, *starts;
    int32_t pre[FLAT_MAX_AFFIX], suf[FLAT_MAX_AFFIX];
    Py_ssize_t npre, nsuf;
    int plain;
} flat_call;

/* args as a flat_call (at least 4, at most `most` of them; signature: the method's, for the messages); 0 and an
 * exception when they are not. */
int flat_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t most, const char *signature, flat_call *c);
/* encode_flat: (prefix + ids + suffix of every text as int32 bytes, each text's end there as int64 bytes, whether
 * some text starts with starts) | None, the GIL released once for all; releases c->texts. */
PyObject *batch_flat(const batch_encoder *e, flat_call *c);

#endif
