/* The binding of the quantized kernels (quants.c): matrix products of quantized weights, the activations'
 * quantization, the kernels this CPU runs. */
#include "bind.h"
#include "model.h" /* mq_quantize_row, mq_partner_bytes */

/* matmul(weight, ggml_type, rows, cols, x, out, threads): out[t, r] = weight row r . x[t] for every activation
 * row t of x (float32, n x cols), out float32 (n x rows). weight: the raw rows, exactly rows * row_bytes bytes.
 * Every length is checked against its buffer before C reads it; the GIL is released while the kernels run. */
enum { PRODUCT, ONE_ROW, EXPERT };

/* EXPERT: the rows of x as a mixture-of-experts feed-forward multiplies the rows that chose one expert (moe.c's
 * mo_expert_rows, in work items of 16 weight rows): each row with the bits of its product alone. */
static int expert_product(int type, const uint8_t *w, long long rows, long long cols, const float *x, long long n_x,
                          float *out) {
    const size_t y_row = mq_partner_bytes(type, cols);
    uint8_t *y = malloc(y_row * (size_t)n_x + 1);
    if (!y) return 0;
    for (long long t = 0; t < n_x; t++) mq_quantize_row(type, x + t * cols, cols, y + (size_t)t * y_row);
    const ms_matrix M = {.n = 1, .type = {type}, .w = {w}, .rows = {rows}, .cols = cols, .n_out = rows};
    for (long long r0 = 0; r0 < rows; r0 += 16)
        mo_expert_rows(&M, rows, 0, y, y_row, 0, n_x, r0, r0 + 16 < rows ? r0 + 16 : rows, out, rows);
    free(y);
    return 1;
}

static PyObject *quants_product(PyObject *args, int mode) {
    const int single = mode == ONE_ROW;
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
    ok = mode == EXPERT ? expert_product(type, wb.buf, rows, cols, xb.buf, n_x, ob.buf)
                        : mq_matmul(type, wb.buf, rows, cols, xb.buf, n_x, ob.buf, threads);
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
    return quants_product(args, PRODUCT);
}

static PyObject *quants_matvec(PyObject *self, PyObject *args) {
    (void)self;
    return quants_product(args, ONE_ROW);
}

static PyObject *quants_expert_matmul(PyObject *self, PyObject *args) {
    (void)self;
    return quants_product(args, EXPERT);
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

/* quant_types() -> {ggml_type: (block, type_size, partner, partner_block, partner_size)}: the weight types that run
 * in C (the chosen instruction set's traits table, quants.h), the one list Python routes by. */
static PyObject *quants_types(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *d = PyDict_New();
    for (int t = 0; d && t < MQ_NTYPES; t++) {
        const mq_traits *r = mq_traits_of(t);
        if (!r) continue;
        PyObject *k = PyLong_FromLong(t), *v = Py_BuildValue("(iiiii)", r->block, r->size, r->partner,
                                                             r->partner_block, r->partner_size);
        if (!k || !v || PyDict_SetItem(d, k, v) < 0) Py_CLEAR(d);
        Py_XDECREF(k), Py_XDECREF(v);
    }
    return d;
}

static PyMethodDef quants_functions[] = {
    {"matmul", quants_matmul, METH_VARARGS,
     "matmul(weight, ggml_type, rows, cols, x, out, threads): out[t] = weight . x[t] as ggml computes it."},
    {"matvec", quants_matvec, METH_VARARGS, "matvec(weight, ggml_type, rows, cols, x, out, threads): one row x."},
    {"expert_matmul", quants_expert_matmul, METH_VARARGS,
     "expert_matmul(weight, ggml_type, rows, cols, x, out, threads): matmul as one expert's rows (each alone)."},
    {"kernels", quants_isa, METH_NOARGS, "'avx2' or 'scalar': the quantized kernels this CPU runs."},
    {"quant_types", quants_types, METH_NOARGS, "{ggml_type: (block, size, partner, ...)}: the types run in C."},
    {"quantize", quants_quantize, METH_VARARGS, "quantize(ggml_type, x): x as the partner of ggml_type's weights."},
    {NULL, NULL, 0, NULL},
};

int add_quants(PyObject *m) { return PyModule_AddFunctions(m, quants_functions); }
