/* minillama._native._core: the module. Each area's binding file adds its types and functions (bind.h): the
 * tokenizer's encoders and decoder, the quantized kernels, the model's blocks, the dataset's text work, the
 * sampler's pass over a vocab. */
#include "bind.h"

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "_core", "minillama's native core (C): the tokenizer and the quantized kernels.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__core(void) {
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    if (add_tokenizer(m) < 0 || add_quants(m) < 0 || add_model(m) < 0 || add_text(m) < 0 ||
        add_sample(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
