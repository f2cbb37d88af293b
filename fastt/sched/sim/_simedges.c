/* The merged edges of a problem compiled from a graph (fastt.sched.sim.problem._graph_edges),
 * compiled.
 *
 * The same edges as the Python function, which stays the reference: one edge per (producer,
 * consumer) pair, numbered consumer by consumer in the given order and, within a consumer,
 * producer by producer in the order its data inputs and then its control inputs first name
 * them; each edge carries its distinct tensors (the first reference to each, with its output's
 * bytes), its bytes their sum in that order. Inputs out of a loop's back edge are left out.
 */
#include "_simcore.h"

/* The producer of input name ``name`` (-1: a back edge's source, left out); exception set on
   failure. */
static Py_ssize_t producer(PyObject *name, PyObject *index, PyObject *back) {
  int skip = PySet_Contains(back, name);
  if (skip < 0) return -2;
  if (skip) return -1;
  PyObject *a = PyDict_GetItemWithError(index, name);
  if (!a) {
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, name);
    return -2;
  }
  Py_ssize_t v = PyLong_AsSsize_t(a);
  if (v < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "graph_edges: index < 0");
  return v < 0 ? -2 : v;
}

/* The attribute names read per op and per input, made once. */
static PyObject *s_inputs, *s_control_inputs, *s_outputs, *s_nbytes;

static int attribute_names(void) {
  if (s_nbytes) return 0;
  s_inputs = PyUnicode_InternFromString("inputs");
  s_control_inputs = PyUnicode_InternFromString("control_inputs");
  s_outputs = PyUnicode_InternFromString("outputs");
  s_nbytes = PyUnicode_InternFromString("nbytes");
  return s_inputs && s_control_inputs && s_outputs && s_nbytes ? 0 : -1;
}

/* Output ``ref``'s bytes, as float(outputs[index].nbytes or 0). */
static int output_bytes(PyObject *op, PyObject *ref, double *out) {
  PyObject *outputs = PyObject_GetAttr(op, s_outputs);
  if (!outputs) return -1;
  PyObject *spec = PyObject_GetItem(outputs, PyTuple_GET_ITEM(ref, 1));
  Py_DECREF(outputs);
  if (!spec) return -1;
  PyObject *nbytes = PyObject_GetAttr(spec, s_nbytes);
  Py_DECREF(spec);
  if (!nbytes) return -1;
  int truth = PyObject_IsTrue(nbytes);
  *out = truth > 0 ? PyFloat_AsDouble(nbytes) : 0.0;
  Py_DECREF(nbytes);
  return truth < 0 || PyErr_Occurred() ? -1 : 0;
}

/* list.append((x, e)) */
static int append_pair(PyObject *list, PyObject *x, PyObject *e) {
  PyObject *t = PyTuple_Pack(2, x, e);
  if (!t) return -1;
  int rc = PyList_Append(list, t);
  Py_DECREF(t);
  return rc;
}

PyObject *simcore_graph_edges(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *ops_o, *index, *back;
  if (!PyArg_ParseTuple(args, "OO!O", &ops_o, &PyDict_Type, &index, &back)) return NULL;
  if (attribute_names() < 0) return NULL;
  if (!PyAnySet_Check(back)) {
    PyErr_SetString(PyExc_TypeError, "graph_edges: back must be a set");
    return NULL;
  }
  PyObject *ops = PySequence_Fast(ops_o, "graph_edges: ops must be a sequence");
  if (!ops) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(ops);
  PyObject *result = NULL, *preds = NULL, *succs = NULL, *bytes = NULL, *tensors = NULL;
  PyObject *into = NULL;  /* this op's producers' tensor lists, in the order first named */
  PyObject **number = NULL, *zero = NULL;  /* 0 .. n-1 and 0.0, made once */
  Py_ssize_t *slot = NULL, *seen = NULL, *from = NULL;
  NEW(slot, n); NEW(seen, n); NEW(from, n); NEW(number, n);
  for (Py_ssize_t i = 0; i < n; i++) { seen[i] = -1; number[i] = NULL; }
  for (Py_ssize_t i = 0; i < n; i++)
    if (!(number[i] = PyLong_FromSsize_t(i))) goto done;
  if (!(zero = PyFloat_FromDouble(0.0))) goto done;
  preds = PyList_New(n); succs = PyList_New(n);
  bytes = PyList_New(0); tensors = PyList_New(0);
  if (!preds || !succs || !bytes || !tensors) goto done;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *a = PyList_New(0), *b = PyList_New(0);
    if (!a || !b) { Py_XDECREF(a); Py_XDECREF(b); goto done; }
    PyList_SET_ITEM(preds, i, a); PyList_SET_ITEM(succs, i, b);
  }
  Py_ssize_t e = 0;
  for (Py_ssize_t j = 0; j < n; j++) {
    PyObject *op = PySequence_Fast_GET_ITEM(ops, j);
    Py_ssize_t k = 0;  /* producers of op j so far */
    Py_CLEAR(into);
    into = PyList_New(0);
    if (!into) goto done;
    for (int control = 0; control < 2; control++) {
      PyObject *refs = PyObject_GetAttr(op, control ? s_control_inputs : s_inputs);
      if (!refs) goto done;
      PyObject *fast = PySequence_Fast(refs, "graph_edges: an op's inputs");
      Py_DECREF(refs);
      if (!fast) goto done;
      for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(fast); r++) {
        PyObject *ref = PySequence_Fast_GET_ITEM(fast, r);
        if (!control && (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) != 2)) {
          PyErr_SetString(PyExc_TypeError, "graph_edges: an input is not a TensorRef");
          Py_DECREF(fast); goto done;
        }
        Py_ssize_t a = producer(control ? ref : PyTuple_GET_ITEM(ref, 0), index, back);
        if (a >= n) PyErr_Format(PyExc_IndexError, "graph_edges: producer %zd of %zd ops",
                                 a, n);
        if (a == -2 || a >= n) { Py_DECREF(fast); goto done; }
        if (a < 0) continue;
        if (a == j) {
          PyErr_Format(PyExc_ValueError, "edge from op %zd to itself", j);
          Py_DECREF(fast); goto done;
        }
        PyObject *list;
        if (seen[a] != j) {  /* a new producer of op j */
          seen[a] = j; slot[a] = k++; from[slot[a]] = a;
          list = PyList_New(0);
          if (!list || PyList_Append(into, list) < 0) {
            Py_XDECREF(list); Py_DECREF(fast); goto done;
          }
          Py_DECREF(list);
        }
        if (control) continue;
        list = PyList_GET_ITEM(into, slot[a]);
        int known = 0;
        for (Py_ssize_t t = 0; t < PyList_GET_SIZE(list) && !known; t++) {
          PyObject *other = PyTuple_GET_ITEM(PyList_GET_ITEM(list, t), 0);
          known = PyObject_RichCompareBool(PyTuple_GET_ITEM(other, 1), PyTuple_GET_ITEM(ref, 1),
                                           Py_EQ);
          if (known < 0) { Py_DECREF(fast); goto done; }
        }
        if (known) continue;  /* the same tensor: it moves once */
        double nb;
        if (output_bytes(PySequence_Fast_GET_ITEM(ops, a), ref, &nb) < 0) {
          Py_DECREF(fast); goto done;
        }
        PyObject *f = PyFloat_FromDouble(nb);
        PyObject *item = f ? PyTuple_Pack(2, ref, f) : NULL;
        Py_XDECREF(f);
        if (!item || PyList_Append(list, item) < 0) {
          Py_XDECREF(item); Py_DECREF(fast); goto done;
        }
        Py_DECREF(item);
      }
      Py_DECREF(fast);
    }
    for (Py_ssize_t s = 0; s < k; s++, e++) {
      PyObject *list = PyList_GET_ITEM(into, s);
      double total = 0.0;
      for (Py_ssize_t t = 0; t < PyList_GET_SIZE(list); t++)
        total += PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(PyList_GET_ITEM(list, t), 1));
      PyObject *nb = total == 0.0 ? (Py_INCREF(zero), zero) : PyFloat_FromDouble(total);
      PyObject *edge = PyLong_FromSsize_t(e);
      int rc = nb && edge ? PyList_Append(bytes, nb) : -1;
      if (rc == 0) rc = PyList_Append(tensors, list);
      if (rc == 0) rc = append_pair(PyList_GET_ITEM(preds, j), number[from[s]], edge);
      if (rc == 0) rc = append_pair(PyList_GET_ITEM(succs, from[s]), number[j], edge);
      Py_XDECREF(nb); Py_XDECREF(edge);
      if (rc < 0) goto done;
    }
  }
  result = PyTuple_Pack(4, preds, succs, bytes, tensors);
done:
  Py_XDECREF(into); Py_XDECREF(preds); Py_XDECREF(succs); Py_XDECREF(bytes);
  Py_XDECREF(tensors); Py_DECREF(ops); Py_XDECREF(zero);
  if (number)
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(number[i]);
  free(slot); free(seen); free(from); free(number);
  return result;
}
