/* DPOS's upward ranks and list scheduling (fastt.sched.placers.dpos.rank_u, eft_list_schedule),
 * compiled.
 *
 * The same ranks and placement as the Python functions, which stay the reference: ops in the visit
 * order, each to the candidate device where it finishes first, found insertion-based in the
 * device's timeline (fastt.sched.sim.schedule.Timeline: the same blocks, the same comparisons),
 * its data-ready times priced as Problem.transfer prices them, with the same floating-point
 * operations in the same order.
 */
#include "_simcore.h"

#define BLOCK 64  /* Timeline.BLOCK */

typedef struct { double *s, *e; Py_ssize_t n; } Block;  /* up to 2 * BLOCK + 1 intervals */
typedef struct { Block *b; double *gmax, *last; Py_ssize_t nb, cap; } Timeline;

static Py_ssize_t bisect_right(const double *a, Py_ssize_t n, double x) {
  Py_ssize_t lo = 0, hi = n;
  while (lo < hi) {
    Py_ssize_t mid = (lo + hi) / 2;
    if (x < a[mid]) hi = mid; else lo = mid + 1;
  }
  return lo;
}

/* Timeline.earliest: the earliest start >= ready of an idle gap at least duration long. */
static double earliest(const Timeline *tl, double ready, double duration) {
  Py_ssize_t b = bisect_right(tl->last, tl->nb, ready);
  if (b == tl->nb) return ready;
  const Block *blk = &tl->b[b];
  double t = ready;
  for (Py_ssize_t k = bisect_right(blk->e, blk->n, ready); k < blk->n; k++) {
    if (t + duration <= blk->s[k]) return t;
    if (blk->e[k] > t) t = blk->e[k];
  }
  for (Py_ssize_t bb = b + 1; bb < tl->nb; bb++)
    if (tl->gmax[bb] >= duration) {
      double prev = tl->last[bb - 1];
      const Block *x = &tl->b[bb];
      for (Py_ssize_t k = 0; k < x->n; k++) {
        if (prev + duration <= x->s[k]) return prev;
        prev = x->e[k];
      }
    }
  return tl->last[tl->nb - 1];
}

static void refresh(Timeline *tl, Py_ssize_t b) {
  double prev = b ? tl->last[b - 1] : 0.0, best = 0.0;
  const Block *x = &tl->b[b];
  for (Py_ssize_t k = 0; k < x->n; k++) {
    if (x->s[k] - prev > best) best = x->s[k] - prev;
    prev = x->e[k];
  }
  tl->gmax[b] = best;
}

static int new_block(Timeline *tl, Py_ssize_t at) {
  if (tl->nb == tl->cap) {
    Py_ssize_t cap = tl->cap ? 2 * tl->cap : 8;
    Block *b = realloc(tl->b, (size_t)cap * sizeof(Block));
    if (b) tl->b = b;
    double *g = realloc(tl->gmax, (size_t)cap * sizeof(double));
    if (g) tl->gmax = g;
    double *l = realloc(tl->last, (size_t)cap * sizeof(double));
    if (l) tl->last = l;
    if (!b || !g || !l) return -1;
    tl->cap = cap;
  }
  Py_ssize_t move = tl->nb - at;
  memmove(tl->b + at + 1, tl->b + at, (size_t)move * sizeof(Block));
  memmove(tl->gmax + at + 1, tl->gmax + at, (size_t)move * sizeof(double));
  memmove(tl->last + at + 1, tl->last + at, (size_t)move * sizeof(double));
  tl->nb++;
  Block *x = &tl->b[at];
  x->n = 0;
  x->s = malloc((2 * BLOCK + 1) * sizeof(double));
  x->e = malloc((2 * BLOCK + 1) * sizeof(double));
  return x->s && x->e ? 0 : -1;
}

/* Timeline._split: block b cut in two halves. */
static int split(Timeline *tl, Py_ssize_t b) {
  if (new_block(tl, b + 1) < 0) return -1;
  Block *x = &tl->b[b], *y = &tl->b[b + 1];
  Py_ssize_t h = x->n / 2;
  y->n = x->n - h;
  memcpy(y->s, x->s + h, (size_t)y->n * sizeof(double));
  memcpy(y->e, x->e + h, (size_t)y->n * sizeof(double));
  x->n = h;
  tl->last[b] = x->e[h - 1];
  tl->last[b + 1] = y->e[y->n - 1];
  refresh(tl, b);
  refresh(tl, b + 1);
  return 0;
}

/* Timeline.insert */
static int insert(Timeline *tl, double start, double finish) {
  if (!tl->nb) {
    if (new_block(tl, 0) < 0) return -1;
    tl->b[0].s[0] = start; tl->b[0].e[0] = finish; tl->b[0].n = 1;
    tl->gmax[0] = start; tl->last[0] = finish;
    return 0;
  }
  Py_ssize_t b = bisect_right(tl->last, tl->nb, start);
  if (b > tl->nb - 1) b = tl->nb - 1;
  Block *x = &tl->b[b];
  Py_ssize_t k = bisect_right(x->e, x->n, start);
  while (k < x->n && x->s[k] < start) k++;  /* up to rounding in the caller's arithmetic */
  double prev = k ? x->e[k - 1] : (b ? tl->last[b - 1] : 0.0);
  if (k == x->n) {
    x->s[k] = start; x->e[k] = finish; x->n++;
    tl->last[b] = finish;
    if (start - prev > tl->gmax[b]) tl->gmax[b] = start - prev;
    if (b + 1 < tl->nb && tl->gmax[b + 1] == tl->b[b + 1].s[0] - prev) refresh(tl, b + 1);
  } else {
    double filled = x->s[k] - prev;
    memmove(x->s + k + 1, x->s + k, (size_t)(x->n - k) * sizeof(double));
    memmove(x->e + k + 1, x->e + k, (size_t)(x->n - k) * sizeof(double));
    x->s[k] = start; x->e[k] = finish; x->n++;
    if (filled >= tl->gmax[b]) refresh(tl, b);
  }
  if (x->n > 2 * BLOCK) return split(tl, b);
  return 0;
}

static void free_timeline(Timeline *tl) {
  for (Py_ssize_t b = 0; b < tl->nb; b++) { free(tl->b[b].s); free(tl->b[b].e); }
  free(tl->b); free(tl->gmax); free(tl->last);
}

/* Each op's predecessors (or successors) as (op, edge) pairs, CSR. */
static int read_pairs(PyObject *preds_o, Py_ssize_t n, Py_ssize_t **off, Py_ssize_t **op,
                      Py_ssize_t **edge) {
  PyObject *fast = PySequence_Fast(preds_o, "preds");
  if (!fast) return -1;
  if (PySequence_Fast_GET_SIZE(fast) != n) {
    PyErr_SetString(PyExc_ValueError, "preds: one list per op");
    Py_DECREF(fast); return -1;
  }
  Py_ssize_t total = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    Py_ssize_t len = PySequence_Size(PySequence_Fast_GET_ITEM(fast, i));
    if (len < 0) { Py_DECREF(fast); return -1; }
    total += len;
  }
  *off = malloc((size_t)(n + 1) * sizeof(Py_ssize_t));
  *op = malloc((size_t)(total + 1) * sizeof(Py_ssize_t));
  *edge = malloc((size_t)(total + 1) * sizeof(Py_ssize_t));
  if (!*off || !*op || !*edge) { Py_DECREF(fast); PyErr_NoMemory(); return -1; }
  Py_ssize_t k = 0;
  (*off)[0] = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *row = PySequence_Fast(PySequence_Fast_GET_ITEM(fast, i), "preds");
    if (!row) { Py_DECREF(fast); return -1; }
    for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(row); r++) {
      PyObject *pair = PySequence_Fast_GET_ITEM(row, r);
      if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_ValueError, "preds: (op, edge) pairs");
        Py_DECREF(row); Py_DECREF(fast); return -1;
      }
      (*op)[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
      (*edge)[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
      k++;
    }
    Py_DECREF(row);
    if (PyErr_Occurred()) { Py_DECREF(fast); return -1; }
    (*off)[i + 1] = k;
  }
  Py_DECREF(fast);
  return 0;
}

PyObject *simcore_eft(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *visit_o, *w_o, *preds_o, *bytes_o, *intercept_o, *slope_o, *knee_o, *extra_o;
  PyObject *least_knee_o, *group_o, *gmem_o, *cap_o, *used_o, *group_dev_o, *pinned_o;
  Py_ssize_t D;
  if (!PyArg_ParseTuple(args, "nOOOOOOOOOOOOOOO", &D, &visit_o, &w_o, &preds_o, &bytes_o,
                        &intercept_o, &slope_o, &knee_o, &extra_o, &least_knee_o, &group_o,
                        &gmem_o, &cap_o, &used_o, &group_dev_o, &pinned_o))
    return NULL;
  PyObject *result = NULL;
  Py_ssize_t n = PySequence_Size(group_o), E = PySequence_Size(bytes_o);
  Py_ssize_t V = PySequence_Size(visit_o);
  if (n < 0 || E < 0 || V < 0) return NULL;
  if (D < 1) { PyErr_SetString(PyExc_ValueError, "no device"); return NULL; }
  Py_ssize_t *visit = NULL, *group = NULL, *group_dev = NULL, *pinned = NULL, *device = NULL;
  Py_ssize_t *poff = NULL, *pop = NULL, *pedge = NULL, *cands = NULL;
  double *w = NULL, *nbytes = NULL, *intercept = NULL, *slope = NULL, *knee = NULL;
  double *extra = NULL, *least_knee = NULL, *gmem = NULL, *cap = NULL, *used = NULL;
  double *start = NULL, *finish = NULL, *ready = NULL;
  Timeline *tls = NULL;
  NEW(visit, V); NEW(group, n); NEW(group_dev, n); NEW(pinned, n); NEW(device, n);
  NEW(w, n * D); NEW(nbytes, E); NEW(gmem, n); NEW(start, n); NEW(finish, n);
  NEW(intercept, D * D); NEW(slope, D * D); NEW(knee, D * D); NEW(extra, D * D);
  NEW(least_knee, D); NEW(cap, D); NEW(used, D); NEW(ready, D); NEW(cands, D);
  tls = calloc((size_t)D, sizeof(Timeline));
  if (!tls) { PyErr_NoMemory(); goto done; }
  if (read_ints(visit_o, visit, V, "visit") < 0 || read_ints(group_o, group, n, "group") < 0 ||
      read_ints(group_dev_o, group_dev, n, "group devices") < 0 ||
      read_ints(pinned_o, pinned, n, "pinned") < 0 ||
      read_doubles(bytes_o, nbytes, E, "edge bytes") < 0 ||
      read_doubles(gmem_o, gmem, n, "group memory") < 0 ||
      read_matrix(intercept_o, intercept, D, "intercept") < 0 ||
      read_matrix(slope_o, slope, D, "slope") < 0 || read_matrix(knee_o, knee, D, "knee") < 0 ||
      read_matrix(extra_o, extra, D, "extra") < 0 ||
      read_doubles(least_knee_o, least_knee, D, "least knee") < 0 ||
      read_doubles(cap_o, cap, D, "capacity") < 0 || read_doubles(used_o, used, D, "used") < 0)
    goto done;
  {
    PyObject *rows = PySequence_Fast(w_o, "w");
    if (!rows) goto done;
    int bad = PySequence_Fast_GET_SIZE(rows) != n;
    if (bad) PyErr_SetString(PyExc_ValueError, "w: one row per op");
    for (Py_ssize_t i = 0; i < n && !bad; i++)
      bad = read_doubles(PySequence_Fast_GET_ITEM(rows, i), w + i * D, D, "w") < 0;
    Py_DECREF(rows);
    if (bad) goto done;
  }
  if (read_pairs(preds_o, n, &poff, &pop, &pedge) < 0) goto done;
  for (Py_ssize_t k = 0; k < poff[n]; k++)
    if (pop[k] < 0 || pop[k] >= n || pedge[k] < 0 || pedge[k] >= E) {
      PyErr_SetString(PyExc_ValueError, "a predecessor names no op or no edge");
      goto done;
    }
  for (Py_ssize_t i = 0; i < n; i++) {
    device[i] = -1; start[i] = finish[i] = 0.0;
    if (group[i] < 0 || group[i] >= n || group_dev[i] >= D || pinned[i] >= D) {
      PyErr_SetString(PyExc_ValueError, "a group or a device out of range");
      goto done;
    }
  }
  for (Py_ssize_t v = 0; v < V; v++) {
    Py_ssize_t i = visit[v];
    if (i < 0 || i >= n) { PyErr_SetString(PyExc_ValueError, "visit names no op"); goto done; }
    Py_ssize_t g = group[i], placed = group_dev[g], nc = 0;
    if (placed >= 0) cands[nc++] = placed;
    else if (pinned[i] >= 0) cands[nc++] = pinned[i];
    else {
      for (Py_ssize_t d = 0; d < D; d++)
        if (used[d] + gmem[g] <= cap[d]) cands[nc++] = d;
      if (!nc) { result = PyLong_FromSsize_t(i); goto done; }  /* fits nowhere */
    }
    /* ready_times */
    for (Py_ssize_t d = 0; d < D; d++) ready[d] = 0.0;
    for (Py_ssize_t k = poff[i]; k < poff[i + 1]; k++) {
      Py_ssize_t m = pop[k], dm = device[m];
      double fm = finish[m], b = nbytes[pedge[k]];
      if (dm < 0) {
        PyErr_Format(PyExc_ValueError, "op %zd is visited before its predecessor %zd", i, m);
        goto done;
      }
      const double *ri = intercept + dm * D, *rs = slope + dm * D;
      if (b > least_knee[dm]) {
        for (Py_ssize_t d = 0; d < D; d++) {
          double x = 0.0;
          if (d != dm) {
            x = ri[d] + rs[d] * b;
            if (b > knee[dm * D + d]) x = x + extra[dm * D + d] * (b - knee[dm * D + d]);
          }
          double t = fm + x;
          if (t > ready[d]) ready[d] = t;
        }
      } else
        for (Py_ssize_t d = 0; d < D; d++) {
          double t = d == dm ? fm : fm + ri[d] + rs[d] * b;
          if (t > ready[d]) ready[d] = t;
        }
    }
    Py_ssize_t best_d = -1;
    double best_st = 0.0, best_ft = Py_HUGE_VAL;
    const double *wi = w + i * D;
    for (Py_ssize_t c = 0; c < nc; c++) {
      Py_ssize_t d = cands[c];
      double st = earliest(&tls[d], ready[d], wi[d]), ft = st + wi[d];
      if (ft < best_ft) { best_d = d; best_st = st; best_ft = ft; }
    }
    if (best_d < 0) {
      PyErr_Format(PyExc_ValueError, "op %zd finishes on no device", i);
      goto done;
    }
    if (placed < 0) { group_dev[g] = best_d; used[best_d] += gmem[g]; }
    device[i] = best_d; start[i] = best_st; finish[i] = best_ft;
    if (insert(&tls[best_d], best_st, best_ft) < 0) { PyErr_NoMemory(); goto done; }
  }
  {
    PyObject *a = int_list(device, n), *b = double_list(start, n), *c = double_list(finish, n);
    PyObject *u = double_list(used, D), *gd = int_list(group_dev, n);
    if (a && b && c && u && gd) result = PyTuple_Pack(5, a, b, c, u, gd);
    Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(c); Py_XDECREF(u); Py_XDECREF(gd);
  }
done:
  if (tls) for (Py_ssize_t d = 0; d < D; d++) free_timeline(&tls[d]);
  free(tls); free(visit); free(group); free(group_dev); free(pinned); free(device);
  free(poff); free(pop); free(pedge); free(cands); free(w); free(nbytes); free(intercept);
  free(slope); free(knee); free(extra); free(least_knee); free(gmem); free(cap); free(used);
  free(start); free(finish); free(ready);
  return result;
}

/* rank_u: each op's largest compute time (w_max) plus the largest c[e] + rank[j] over its
   successors (j, e), visited in reverse topological order. */
PyObject *simcore_rank_u(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *topo_o, *succs_o, *c_o, *wmax_o, *result = NULL;
  if (!PyArg_ParseTuple(args, "OOOO", &topo_o, &succs_o, &c_o, &wmax_o)) return NULL;
  Py_ssize_t n = PySequence_Size(wmax_o), E = PySequence_Size(c_o);
  if (n < 0 || E < 0) return NULL;
  Py_ssize_t *topo = NULL, *off = NULL, *op = NULL, *edge = NULL;
  double *c = NULL, *wmax = NULL, *rank = NULL;
  NEW(topo, n); NEW(c, E); NEW(wmax, n); NEW(rank, n);
  if (read_ints(topo_o, topo, n, "topo") < 0 || read_doubles(c_o, c, E, "c") < 0 ||
      read_doubles(wmax_o, wmax, n, "w max") < 0 ||
      read_pairs(succs_o, n, &off, &op, &edge) < 0)
    goto done;
  for (Py_ssize_t k = 0; k < off[n]; k++)
    if (op[k] < 0 || op[k] >= n || edge[k] < 0 || edge[k] >= E) {
      PyErr_SetString(PyExc_ValueError, "a successor names no op or no edge");
      goto done;
    }
  for (Py_ssize_t i = 0; i < n; i++) {
    if (topo[i] < 0 || topo[i] >= n) {
      PyErr_SetString(PyExc_ValueError, "topo names no op");
      goto done;
    }
    rank[i] = 0.0;
  }
  for (Py_ssize_t k = n - 1; k >= 0; k--) {
    Py_ssize_t i = topo[k];
    double best = 0.0;
    for (Py_ssize_t s = off[i]; s < off[i + 1]; s++) {
      double v = c[edge[s]] + rank[op[s]];
      if (v > best) best = v;
    }
    rank[i] = wmax[i] + best;
  }
  result = double_list(rank, n);
done:
  free(topo); free(off); free(op); free(edge); free(c); free(wmax); free(rank);
  return result;
}
