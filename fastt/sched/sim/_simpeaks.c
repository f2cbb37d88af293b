/* The tensors each op needs (fastt.sched.sim.simulate._flat_needs), and the peaks of memory of a
 * replay (fastt.sched.sim.simulate._peak_memory), compiled.
 *
 * The same needs and bytes as the Python functions, which stay the reference: a tensor is live on a
 * device from its producer's start (a received one from its transfer's start) until its last
 * consumer there has finished and its sends are done; per device the allocations and frees
 * are summed in time order (frees first at equal times) and the peak is added to the
 * device's persistent bytes. Slots are made in the Python function's order, so a slot keeps
 * the bytes of the first record of it.
 */
#include "_simcore.h"

typedef struct { double t; int alloc; double delta; } Event;  /* ordered (t, alloc, delta) */

static int event_cmp(const void *x, const void *y) {
  const Event *a = x, *b = y;
  if (a->t != b->t) return a->t < b->t ? -1 : 1;
  if (a->alloc != b->alloc) return a->alloc < b->alloc ? -1 : 1;
  if (a->delta != b->delta) return a->delta < b->delta ? -1 : 1;
  return 0;
}

typedef struct {
  Map map;
  Py_ssize_t count, *dev;
  double *from, *until, *bytes;
} Slots;

/* The slot of (key, d): made with [from, until, bytes] when new, else widened to them. */
static Py_ssize_t record(Slots *s, Py_ssize_t key, Py_ssize_t d, Py_ssize_t D, double from,
                         double until, double bytes) {
  int fresh;
  Py_ssize_t *v = map_slot(&s->map, (int64_t)key * D + d, &fresh);
  if (fresh) {
    *v = s->count++;
    s->dev[*v] = d; s->from[*v] = from; s->until[*v] = until; s->bytes[*v] = bytes;
  } else {
    if (from < s->from[*v]) s->from[*v] = from;
    if (until > s->until[*v]) s->until[*v] = until;
  }
  return *v;
}

PyObject *simcore_peaks(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *device_o, *start_o, *finish_o, *off_o, *prod_o, *key_o, *bytes_o;
  PyObject *tkey_o, *tsrc_o, *tdst_o, *tbytes_o, *tbegin_o, *tend_o, *persistent_o;
  Py_ssize_t D;
  if (!PyArg_ParseTuple(args, "nOOOOOOOOOOOOOO", &D, &device_o, &start_o, &finish_o, &off_o,
                        &prod_o, &key_o, &bytes_o, &tkey_o, &tsrc_o, &tdst_o, &tbytes_o,
                        &tbegin_o, &tend_o, &persistent_o))
    return NULL;
  PyObject *result = NULL;
  Slots s;
  memset(&s, 0, sizeof(s));
  Py_ssize_t *device = NULL, *off = NULL, *prod = NULL, *key = NULL, *tkey = NULL;
  Py_ssize_t *tsrc = NULL, *tdst = NULL, *fill = NULL, *first = NULL;
  double *start = NULL, *finish = NULL, *bytes = NULL, *tbytes = NULL, *tbegin = NULL;
  double *tend = NULL, *persistent = NULL, *base = NULL;
  Event *events = NULL;
  Py_ssize_t n = PySequence_Size(device_o), E = PySequence_Size(prod_o);
  Py_ssize_t T = PySequence_Size(tkey_o);
  if (n < 0 || E < 0 || T < 0) return NULL;
  if (D < 1) { PyErr_SetString(PyExc_ValueError, "no device"); return NULL; }
  NEW(device, n); NEW(start, n); NEW(finish, n); NEW(off, n + 1); NEW(persistent, n);
  NEW(prod, E); NEW(key, E); NEW(bytes, E);
  NEW(tkey, T); NEW(tsrc, T); NEW(tdst, T); NEW(tbytes, T); NEW(tbegin, T); NEW(tend, T);
  if (read_ints(device_o, device, n, "device") < 0 ||
      read_doubles(start_o, start, n, "start") < 0 ||
      read_doubles(finish_o, finish, n, "finish") < 0 ||
      read_ints(off_o, off, n + 1, "need offsets") < 0 ||
      read_doubles(persistent_o, persistent, n, "persistent") < 0 ||
      read_ints(prod_o, prod, E, "producers") < 0 || read_ints(key_o, key, E, "keys") < 0 ||
      read_doubles(bytes_o, bytes, E, "bytes") < 0 ||
      read_ints(tkey_o, tkey, T, "transfer keys") < 0 ||
      read_ints(tsrc_o, tsrc, T, "transfer sources") < 0 ||
      read_ints(tdst_o, tdst, T, "transfer destinations") < 0 ||
      read_doubles(tbytes_o, tbytes, T, "transfer bytes") < 0 ||
      read_doubles(tbegin_o, tbegin, T, "transfer begins") < 0 ||
      read_doubles(tend_o, tend, T, "transfer ends") < 0)
    goto done;
  for (Py_ssize_t i = 0; i < n; i++)
    if (device[i] < 0 || device[i] >= D) {
      PyErr_Format(PyExc_ValueError, "op %zd on device %zd of %zd", i, device[i], D);
      goto done;
    }
  for (Py_ssize_t t = 0; t < T; t++)
    if (tsrc[t] < 0 || tsrc[t] >= D || tdst[t] < 0 || tdst[t] >= D) {
      PyErr_SetString(PyExc_ValueError, "a transfer names no device");
      goto done;
    }
  if (off[0] != 0 || off[n] != E) {
    PyErr_SetString(PyExc_ValueError, "need offsets do not cover the needs");
    goto done;
  }
  for (Py_ssize_t e = 0; e < E; e++)
    if (prod[e] < 0 || prod[e] >= n) {
      PyErr_SetString(PyExc_ValueError, "a need names no op");
      goto done;
    }
  Py_ssize_t most = 2 * T + E;  /* each transfer makes at most two slots, each need one */
  if (map_init(&s.map, most) < 0) { PyErr_NoMemory(); goto done; }
  NEW(s.dev, most); NEW(s.from, most); NEW(s.until, most); NEW(s.bytes, most);
  for (Py_ssize_t t = 0; t < T; t++) {  /* the sender holds its copy until sent */
    record(&s, tkey[t], tsrc[t], D, tbegin[t], tend[t], tbytes[t]);
    record(&s, tkey[t], tdst[t], D, tbegin[t], tend[t], tbytes[t]);
  }
  for (Py_ssize_t j = 0; j < n; j++) {
    Py_ssize_t dj = device[j];
    double fj = finish[j];
    for (Py_ssize_t e = off[j]; e < off[j + 1]; e++) {
      Py_ssize_t m = prod[e], dm = device[m];
      Py_ssize_t v = record(&s, key[e], dm, D, start[m], finish[m], bytes[e]);
      if (dj != dm) {
        int fresh;
        Py_ssize_t *there = map_slot(&s.map, (int64_t)key[e] * D + dj, &fresh);
        if (fresh) {
          PyErr_Format(PyExc_ValueError, "op %zd needs a tensor of op %zd that was not sent "
                       "to its device", j, m);
          goto done;
        }
        v = *there;
      }
      if (fj > s.until[v]) s.until[v] = fj;
    }
  }
  NEW(first, D + 1); NEW(fill, D); NEW(events, 2 * s.count); NEW(base, D);
  memset(first, 0, (size_t)(D + 1) * sizeof(Py_ssize_t));
  for (Py_ssize_t v = 0; v < s.count; v++) first[s.dev[v] + 1] += 2;
  for (Py_ssize_t d = 0; d < D; d++) { first[d + 1] += first[d]; fill[d] = first[d]; }
  for (Py_ssize_t v = 0; v < s.count; v++) {
    Py_ssize_t d = s.dev[v];
    events[fill[d]++] = (Event){s.from[v], 1, s.bytes[v]};
    events[fill[d]++] = (Event){s.until[v], 0, -s.bytes[v]};
  }
  for (Py_ssize_t d = 0; d < D; d++) base[d] = 0.0;
  for (Py_ssize_t i = 0; i < n; i++)
    if (persistent[i] != 0.0) base[device[i]] += persistent[i];
  result = PyList_New(D);
  if (!result) goto done;
  for (Py_ssize_t d = 0; d < D; d++) {
    qsort(events + first[d], (size_t)(first[d + 1] - first[d]), sizeof(Event), event_cmp);
    double cur = 0.0, peak = 0.0;
    for (Py_ssize_t k = first[d]; k < first[d + 1]; k++) {
      cur += events[k].delta;
      if (cur > peak) peak = cur;
    }
    PyObject *x = PyFloat_FromDouble(base[d] + peak);
    if (!x) { Py_CLEAR(result); goto done; }
    PyList_SET_ITEM(result, d, x);
  }
done:
  free(device); free(start); free(finish); free(off); free(persistent); free(prod); free(key);
  free(bytes); free(tkey); free(tsrc); free(tdst); free(tbytes); free(tbegin); free(tend);
  free(s.map.keys); free(s.map.vals); free(s.dev); free(s.from); free(s.until); free(s.bytes);
  free(first); free(fill); free(events); free(base);
  return result;
}

/* simulate._flat_needs: per op, the tensors it needs as (producer, key number, bytes), read
   from its edges in order (an edge of no tensor: the key ("control", producer), 0 bytes);
   keys numbered in order of first appearance. */
PyObject *simcore_flat_needs(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *preds_o, *tensors_o;
  if (!PyArg_ParseTuple(args, "OO", &preds_o, &tensors_o)) return NULL;
  PyObject *preds = PySequence_Fast(preds_o, "preds");
  if (!preds) return NULL;
  PyObject *tensors = PySequence_Fast(tensors_o, "edge tensors");
  if (!tensors) { Py_DECREF(preds); return NULL; }
  PyObject *offsets = PyList_New(0), *producers = PyList_New(0), *numbers = PyList_New(0);
  PyObject *sizes = PyList_New(0), *keys = PyList_New(0), *ids = PyDict_New();
  PyObject *control = PyUnicode_FromString("control"), *zero = PyFloat_FromDouble(0.0);
  PyObject *result = NULL, *count = NULL;
  if (!offsets || !producers || !numbers || !sizes || !keys || !ids || !control || !zero)
    goto done;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(preds), E = PySequence_Fast_GET_SIZE(tensors);
  if (!(count = PyLong_FromSsize_t(0)) || PyList_Append(offsets, count) < 0) goto done;
  Py_CLEAR(count);
  for (Py_ssize_t j = 0; j < n; j++) {
    PyObject *row = PySequence_Fast(PySequence_Fast_GET_ITEM(preds, j), "preds");
    if (!row) goto done;
    for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(row); r++) {
      PyObject *pair = PySequence_Fast_GET_ITEM(row, r);
      Py_ssize_t e = -1;
      if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2)
        e = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
      if (e < 0 || e >= E) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "preds: (op, edge) pairs");
        Py_DECREF(row); goto done;
      }
      PyObject *m = PyTuple_GET_ITEM(pair, 0);
      PyObject *sent = PySequence_Fast(PySequence_Fast_GET_ITEM(tensors, e), "tensors");
      if (!sent) { Py_DECREF(row); goto done; }
      Py_ssize_t k = PySequence_Fast_GET_SIZE(sent);
      PyObject *made = NULL;
      if (!k) made = Py_BuildValue("((OO)O)", control, m, zero);  /* a control edge */
      for (Py_ssize_t t = 0; t < (k ? k : 1); t++) {
        PyObject *item = k ? PySequence_Fast_GET_ITEM(sent, t) : made;
        int bad = !item || !PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2;
        PyObject *key = bad ? NULL : PyTuple_GET_ITEM(item, 0);
        PyObject *number = bad ? NULL : PyDict_GetItemWithError(ids, key);
        if (!bad && !number && !PyErr_Occurred()) {
          number = PyLong_FromSsize_t(PyList_GET_SIZE(keys));
          bad = !number || PyDict_SetItem(ids, key, number) < 0 || PyList_Append(keys, key) < 0;
          Py_XDECREF(number);  /* the dict holds it */
        }
        bad = bad || !number || PyList_Append(producers, m) < 0 ||
              PyList_Append(numbers, number) < 0 ||
              PyList_Append(sizes, PyTuple_GET_ITEM(item, 1)) < 0;
        if (bad) {
          if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "tensors: (key, bytes)");
          Py_XDECREF(made); Py_DECREF(sent); Py_DECREF(row); goto done;
        }
      }
      Py_XDECREF(made);
      Py_DECREF(sent);
    }
    Py_DECREF(row);
    if (!(count = PyLong_FromSsize_t(PyList_GET_SIZE(producers))) ||
        PyList_Append(offsets, count) < 0)
      goto done;
    Py_CLEAR(count);
  }
  result = PyTuple_Pack(5, offsets, producers, numbers, sizes, keys);
done:
  Py_XDECREF(count); Py_DECREF(preds); Py_DECREF(tensors); Py_XDECREF(offsets);
  Py_XDECREF(producers); Py_XDECREF(numbers); Py_XDECREF(sizes); Py_XDECREF(keys);
  Py_XDECREF(ids); Py_XDECREF(control); Py_XDECREF(zero);
  return result;
}
