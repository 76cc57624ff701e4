/* The argument helpers every binding file shares (bind.h): buffers of typed items, tuples of str. */
#include "bind.h"

/* buf as n items of itemsize bytes, C-contiguous; a TypeError/ValueError naming what otherwise. */
int get_array(PyObject *obj, Py_buffer *buf, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return 0;
    if (buf->itemsize != itemsize || buf->len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected items of %zd bytes, got %zd", name, itemsize, buf->itemsize);
        PyBuffer_Release(buf);
        return 0;
    }
    return 1;
}

/* Release the first n of bufs. */
void release_all(Py_buffer *bufs, int n) {
    for (int i = 0; i < n; i++) PyBuffer_Release(&bufs[i]);
}

/* objs[i] as bufs[i] with items of sizes[i] bytes; on failure the ones got are released. */
int get_arrays(PyObject **objs, Py_buffer *bufs, const Py_ssize_t *sizes, const char **names, int n) {
    for (int i = 0; i < n; i++)
        if (!get_array(objs[i], &bufs[i], sizes[i], names[i])) {
            release_all(bufs, i);
            return 0;
        }
    return 1;
}

/* seq as a tuple of str (owning every item while the GIL is released); NULL and a TypeError naming who and the
 * first item that is no str. */
PyObject *str_tuple(PyObject *seq, const char *who) {
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
int str_starts_with(PyObject *t, PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n == 0 || PyUnicode_GET_LENGTH(t) < n) return 0;
    int tk = PyUnicode_KIND(t), sk = PyUnicode_KIND(s);
    const void *td = PyUnicode_DATA(t), *sd = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_READ(tk, td, i) != PyUnicode_READ(sk, sd, i)) return 0;
    return 1;
}
