/*
 * The arguments of linear() in the bf16 panel kernels (bf16_linear.c, amx_linear.c), read
 * from Python the same way in both: data pointers of x, the packed weight, the float32 bias
 * and y; rows, n (outputs), k (inputs), x's row stride and the thread count; and the
 * activation (bf16_activations.h). Each kernel then checks the shapes it can take.
 */
#ifndef EMBEDSERVE_PANEL_LINEAR_ARGS_H
#define EMBEDSERVE_PANEL_LINEAR_ARGS_H

#include <Python.h>

#include "bf16_activations.h"

typedef struct {
    unsigned long long x, panels, bias, y;
    Py_ssize_t rows, n, k, x_stride, threads;
    int activation;
} LinearArgs;

/* 1 with ``a`` filled, or 0 with a Python exception set (a wrong type, an unknown activation). */
static int parse_linear_args(PyObject *args, LinearArgs *a) {
    if (!PyArg_ParseTuple(args, "KKKKnnnnni", &a->x, &a->panels, &a->bias, &a->y, &a->rows, &a->n, &a->k,
                          &a->x_stride, &a->threads, &a->activation))
        return 0;
    if (a->activation < 0 || a->activation >= ACTIVATIONS) {
        PyErr_Format(PyExc_ValueError, "activation must be 0 to %d, got %d", ACTIVATIONS - 1, a->activation);
        return 0;
    }
    return 1;
}

#endif
