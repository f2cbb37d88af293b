/* What the files of fastt.sched._simcore share: reading Python sequences into C arrays,
 * making lists of them, and a map from (key, device) to a slot. */
#ifndef FASTT_SIMCORE_H
#define FASTT_SIMCORE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A Python sequence of n numbers read into doubles (d) or integers (i); exception set on
   failure. */
static inline int read_numbers(PyObject *seq, double *d, Py_ssize_t *i, Py_ssize_t n,
                        const char *what) {
  PyObject *fast = PySequence_Fast(seq, what);
  if (!fast) return -1;
  if (PySequence_Fast_GET_SIZE(fast) != n) {
    PyErr_Format(PyExc_ValueError, "%s: expected %zd values", what, n);
    Py_DECREF(fast); return -1;
  }
  PyObject **items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t k = 0; k < n; k++) {
    if (d) d[k] = PyFloat_AsDouble(items[k]);
    else i[k] = PyLong_AsSsize_t(items[k]);
    if (PyErr_Occurred()) { Py_DECREF(fast); return -1; }
  }
  Py_DECREF(fast);
  return 0;
}

static inline int read_doubles(PyObject *seq, double *out, Py_ssize_t n, const char *what) {
  return read_numbers(seq, out, NULL, n, what);
}

static inline int read_ints(PyObject *seq, Py_ssize_t *out, Py_ssize_t n, const char *what) {
  return read_numbers(seq, NULL, out, n, what);
}

/* A D x D matrix (a list of rows) read row-major. */
static inline int read_matrix(PyObject *rows, double *out, Py_ssize_t D, const char *what) {
  PyObject *fast = PySequence_Fast(rows, what);
  if (!fast) return -1;
  if (PySequence_Fast_GET_SIZE(fast) != D) {
    PyErr_Format(PyExc_ValueError, "%s: expected %zd rows", what, D);
    Py_DECREF(fast); return -1;
  }
  for (Py_ssize_t a = 0; a < D; a++)
    if (read_doubles(PySequence_Fast_GET_ITEM(fast, a), out + a * D, D, what) < 0) {
      Py_DECREF(fast); return -1;
    }
  Py_DECREF(fast);
  return 0;
}

static inline PyObject *double_item(const void *x, Py_ssize_t i) {
  return PyFloat_FromDouble(((const double *)x)[i]);
}

static inline PyObject *int_item(const void *x, Py_ssize_t i) {
  return PyLong_FromSsize_t(((const Py_ssize_t *)x)[i]);
}

/* A new list of x[0..n) made Python objects by item; NULL (an exception set) on failure. */
static inline PyObject *new_list(const void *x, Py_ssize_t n,
                                 PyObject *(*item)(const void *, Py_ssize_t)) {
  PyObject *out = PyList_New(n);
  if (!out) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *v = item(x, i);
    if (!v) { Py_DECREF(out); return NULL; }
    PyList_SET_ITEM(out, i, v);
  }
  return out;
}

static inline PyObject *double_list(const double *x, Py_ssize_t n) {
  return new_list(x, n, double_item);
}

static inline PyObject *int_list(const Py_ssize_t *x, Py_ssize_t n) {
  return new_list(x, n, int_item);
}

/* An open-addressing map from (key, device) to a transfer's slot. */
typedef struct { int64_t *keys; Py_ssize_t *vals; size_t mask; } Map;

static inline int map_init(Map *m, Py_ssize_t entries) {
  size_t size = 16;
  while (size < 2 * (size_t)entries + 1) size <<= 1;
  m->keys = malloc(size * sizeof(int64_t));
  m->vals = malloc(size * sizeof(Py_ssize_t));
  if (!m->keys || !m->vals) return -1;
  memset(m->keys, 0xff, size * sizeof(int64_t));  /* -1: empty */
  m->mask = size - 1;
  return 0;
}

static inline Py_ssize_t *map_slot(Map *m, int64_t key, int *fresh) {
  size_t h = ((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20;
  for (;; h++) {
    size_t i = h & m->mask;
    if (m->keys[i] == key) { *fresh = 0; return &m->vals[i]; }
    if (m->keys[i] == -1) { m->keys[i] = key; *fresh = 1; return &m->vals[i]; }
  }
}

/* p: k (+1, never 0) elements, or MemoryError and a jump to the caller's "done" label */
#define NEW(p, k) do { if (!((p) = malloc(((size_t)(k) + 1) * sizeof(*(p))))) { \
  PyErr_NoMemory(); goto done; } } while (0)

/* _simpeaks.c */
PyObject *simcore_peaks(PyObject *self, PyObject *args);
PyObject *simcore_flat_needs(PyObject *self, PyObject *args);
/* _simeft.c */
PyObject *simcore_eft(PyObject *self, PyObject *args);
PyObject *simcore_rank_u(PyObject *self, PyObject *args);
/* _simedges.c */
PyObject *simcore_graph_edges(PyObject *self, PyObject *args);

#endif
