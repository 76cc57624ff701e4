/* The binding of minillama dataset's text work: the digests of documents (digest.c) and the cut of a file into
 * paragraphs (text.c), both with the GIL released. */
#include "bind.h"

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
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(digests);
    size_t total;
    int failed; /* 1: a surrogate, 2: no memory */
    Py_BEGIN_ALLOW_THREADS /* texts holds every str: their characters stay alive and unchanged */
    failed = blake2b_texts(data, lens, kinds, (size_t)n, (size_t)size, out, &total);
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
 * released (paragraph_cut), then each paragraph decoded; None when data is not UTF-8 (the caller's decode names
 * the byte). */
static PyObject *paragraphs_of(PyObject *unused, PyObject *arg) {
    (void)unused;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    size_t k = 0, *spans;
    PyObject *res = NULL;
    Py_BEGIN_ALLOW_THREADS /* the buffer is held: bytes stay alive and unchanged */
    spans = paragraph_cut(b.buf, (size_t)b.len, &k);
    Py_END_ALLOW_THREADS
    if (!spans) {
        PyErr_NoMemory();
        goto done;
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
    free(spans);
    PyBuffer_Release(&b);
    return res;
}

static PyMethodDef text_functions[] = {
    {"utf8_digests", utf8_digests, METH_VARARGS,
     "utf8_digests(texts: sequence of str, size: int) -> (bytes, int) | None: hashlib.blake2b(t.encode(), "
     "digest_size=size).digest() of each text, joined, and their UTF-8 bytes in all, the GIL released; None when a "
     "text holds a surrogate."},
    {"paragraphs", paragraphs_of, METH_O,
     "paragraphs(data: bytes) -> list[str] | None: fileio.paragraphs(data.decode()), the cut found with the GIL "
     "released; None when data is not UTF-8."},
    {NULL, NULL, 0, NULL},
};

int add_text(PyObject *m) { return PyModule_AddFunctions(m, text_functions); }
