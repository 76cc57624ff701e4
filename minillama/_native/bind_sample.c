/* The binding of the sampler chain's pass over a vocab (sample.c), the GIL released while it scans. */
#include "bind.h"
#include "sample.h"

/* top_k(x, adj_idx, adj_val, idx, val) -> int: sample.h's ms_top_k of x (float32, n scores) with the adjusted ids
 * adj_idx (int64, strictly ascending, each in 0..n-1) scored adj_val (float64, as many), k = len(idx) (int64,
 * written) = len(val) (float64, written): how many were kept, or -1 when x holds a NaN. */
static PyObject *top_k(PyObject *unused, PyObject *args) {
    (void)unused;
    PyObject *objs[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4])) return NULL;
    Py_buffer b[5];
    const Py_ssize_t sizes[3] = {4, 8, 8};
    const char *names[3] = {"top_k x", "top_k adj_idx", "top_k adj_val"};
    if (!get_arrays(objs, b, sizes, names, 3)) return NULL;
    int got = 3;
    PyObject *res = NULL;
    for (; got < 5; got++) {
        if (PyObject_GetBuffer(objs[got], &b[got], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) goto done;
        if (b[got].itemsize != 8) {
            PyErr_Format(PyExc_ValueError, "top_k: expected idx and val of 8-byte items, got %zd", b[got].itemsize);
            got++;
            goto done;
        }
    }
    const int64_t n = b[0].len / 4, m = b[1].len / 8, k = b[3].len / 8;
    const int64_t *adj_idx = b[1].buf;
    if (b[2].len / 8 != m || b[4].len / 8 != k) {
        PyErr_SetString(PyExc_ValueError, "top_k: expected as many adj_val as adj_idx and as many val as idx");
        goto done;
    }
    for (int64_t j = 0; j < m; j++)
        if (adj_idx[j] < 0 || adj_idx[j] >= n || (j && adj_idx[j] <= adj_idx[j - 1])) {
            PyErr_Format(PyExc_ValueError,
                         "top_k: expected adjusted ids ascending, each in 0..%lld, found %lld at %lld",
                         (long long)(n - 1), (long long)adj_idx[j], (long long)j);
            goto done;
        }
    int64_t kept;
    Py_BEGIN_ALLOW_THREADS
    kept = ms_top_k(b[0].buf, n, adj_idx, b[2].buf, m, k, b[3].buf, b[4].buf);
    Py_END_ALLOW_THREADS
    if (kept == -2)
        PyErr_Format(PyExc_ValueError, "top_k: expected at most %lu scores, got %lld", (unsigned long)UINT32_MAX,
                     (long long)n);
    else if (kept == -3)
        PyErr_NoMemory();
    else
        res = PyLong_FromLongLong((long long)kept);
done:
    release_all(b, got);
    return res;
}

static PyMethodDef sample_functions[] = {
    {"top_k", top_k, METH_VARARGS,
     "top_k(x, adj_idx, adj_val, idx, val) -> int: the len(idx) best scores of x (float32; the ids adj_idx, int64 "
     "ascending, scored adj_val instead), best first, equal scores in id order, -inf and NaN never kept, into idx "
     "(int64) and val (float64); how many were kept, or -1 when x holds a NaN."},
    {NULL, NULL, 0, NULL},
};

int add_sample(PyObject *m) { return PyModule_AddFunctions(m, sample_functions); }
