/* The event loops of fastt.sched.sim.simulate (simulate and simulate_fifo), compiled.
 *
 * The same simulation as the Python loops of fastt.sched.sim.sim_loops (which stay the reference
 * and the fallback): the same events in the same order, the same floating-point operations,
 * so both give identical start and finish times. Python prepares the inputs (the tensors each
 * op needs, flattened once per problem) and builds the result; this file only runs the loop
 * (_simpeaks.c flattens the needs and sums the memory a replay holds; _simeft.c is DPOS's
 * ranks and list scheduling).
 */
#include "_simcore.h"

typedef struct { double t; double u; Py_ssize_t j; } Item;  /* heap entry, ordered (t, u, j) */
typedef struct { Item *a; Py_ssize_t n, cap; } Heap;

static int item_less(const Item *x, const Item *y) {
  if (x->t != y->t) return x->t < y->t;
  if (x->u != y->u) return x->u < y->u;
  return x->j < y->j;
}

static int heap_push(Heap *h, double t, double u, Py_ssize_t j) {
  if (h->n == h->cap) {
    Py_ssize_t cap = h->cap ? 2 * h->cap : 16;
    Item *a = realloc(h->a, (size_t)cap * sizeof(Item));
    if (!a) { PyErr_NoMemory(); return -1; }
    h->a = a; h->cap = cap;
  }
  Py_ssize_t i = h->n++;
  Item x = {t, u, j};
  while (i > 0) {
    Py_ssize_t parent = (i - 1) / 2;
    if (!item_less(&x, &h->a[parent])) break;
    h->a[i] = h->a[parent]; i = parent;
  }
  h->a[i] = x;
  return 0;
}

static Item heap_pop(Heap *h) {
  Item top = h->a[0], last = h->a[--h->n];
  Py_ssize_t i = 0, n = h->n;
  for (;;) {
    Py_ssize_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && item_less(&h->a[c + 1], &h->a[c])) c++;
    if (!item_less(&h->a[c], &last)) break;
    h->a[i] = h->a[c]; i = c;
  }
  if (n) h->a[i] = last;
  return top;
}

typedef struct {
  Py_ssize_t n, D;
  /* per op */
  Py_ssize_t *device, *stream, *need_off, *unknown, *waiting;
  double *w, *start, *finish;
  char *unordered;
  /* per need */
  Py_ssize_t *prod, *keyid, *need_slot;
  double *need_bytes;
  /* consumers, CSR per producer */
  Py_ssize_t *local_off, *local, *remote_off, *remote, *gate_off, *gate;
  /* lanes: per (device, stream) the ordered ops, CSR; pos per (device, stream) */
  Py_ssize_t streams, *lane_off, *lane, *pos;
  double *stream_free;  /* [stream][device] */
  /* transfers: per producer its slots (sorted by destination), CSR */
  Py_ssize_t slots, *slot_key, *slot_dst, *owe_off, *owe;
  double *slot_bytes, *arrival;
  /* links */
  double *intercept, *slope, *knee, *extra, *least_knee, *send_cpu, *recv_cpu, *call_cpu;
  double *serve_from; /* per device: no transfer leaves it before */
  Py_ssize_t concurrency;  /* -1: unlimited */
  double small_bytes, *lane_free;  /* [src][dst][small][k] */
  Heap *charges;  /* per device */
  double *until; char *moving;  /* _InFlight */
  /* recorded transfers */
  Py_ssize_t nt, *t_slot, *t_src;
  double *t_begin, *t_end;
  Heap events;
  char *armed, *snapshot;
  /* first come, first served: per need its consumer; per producer its needs, CSR; per op
     its lane (device + D * stream), when its inputs are all there; per lane the ops
     waiting for that time, those ready (by time or priority), until when it is busy */
  Py_ssize_t *need_op, *cons_off, *cons, *lane_id;
  double *ready_at, *busy_until, *priority;
  Heap *waiting_q, *ready_q;
  Py_ssize_t nlanes;
  Py_ssize_t *slot_owner;
} Sim;

static int push_charge(Sim *s, Py_ssize_t d, double begin, double work) {
  return heap_push(&s->charges[d], begin, work, 0);
}

static double absorb(Sim *s, Py_ssize_t d, double t, double *free) {
  Heap *q = &s->charges[d];
  while (q->n && q->a[0].t <= t) {
    Item c = heap_pop(q);
    double f = free[d] > c.t ? free[d] : c.t;
    free[d] = f + c.u;
    if (free[d] > t) t = free[d];
  }
  return t;
}

static int lone(Sim *s, Py_ssize_t end, double start, double finish) {
  if (!s->moving[end]) {
    s->moving[end] = 1; s->until[end] = finish;
    return 1;
  }
  double was = s->until[end];
  s->until[end] = was >= finish ? was : finish;
  return start >= was;
}

static int send(Sim *s, Py_ssize_t m, Py_ssize_t src, double t) {
  Py_ssize_t D = s->D;
  if (t < s->serve_from[src]) t = s->serve_from[src];
  for (Py_ssize_t k = s->owe_off[m]; k < s->owe_off[m + 1]; k++) {
    Py_ssize_t slot = s->owe[k], dst = s->slot_dst[slot];
    double nbytes = s->slot_bytes[slot], latency = s->intercept[src * D + dst];
    double cost = latency + s->slope[src * D + dst] * nbytes;
    double knee = s->knee[src * D + dst];
    if (nbytes > s->least_knee[src] && nbytes > knee)
      cost = cost + s->extra[src * D + dst] * (nbytes - knee);
    double begin = t;
    if (s->concurrency >= 0) {
      double *lanes = s->lane_free + ((src * D + dst) * 2 + (nbytes < s->small_bytes)) *
                                     s->concurrency;
      Py_ssize_t best = 0;
      for (Py_ssize_t x = 1; x < s->concurrency; x++)
        if (lanes[x] < lanes[best]) best = x;
      begin = t > lanes[best] ? t : lanes[best];
      lanes[best] = begin + cost;
    }
    s->arrival[slot] = begin + cost;
    double *calls = s->call_cpu + (src * D + dst) * 4;
    double shares[2] = {s->send_cpu[src * D + dst], s->recv_cpu[src * D + dst]};
    if (shares[0] || shares[1] || calls[0] || calls[1] || calls[2] || calls[3]) {
      double copy = cost - latency;
      Py_ssize_t ends[2] = {src, dst};
      for (int end = 0; end < 2; end++) {
        Py_ssize_t d = ends[end];
        double work = shares[end] * copy + calls[lone(s, d, t, begin + cost) ? end + 2 : end];
        if (work > 0 && push_charge(s, d, begin, work) < 0) return -1;
      }
    }
    Py_ssize_t i = s->nt++;
    s->t_slot[i] = slot; s->t_src[i] = src; s->t_begin[i] = begin; s->t_end[i] = begin + cost;
  }
  return 0;
}

static void known(Sim *s, const Py_ssize_t *consumers, Py_ssize_t count) {
  for (Py_ssize_t c = 0; c < count; c++) {
    Py_ssize_t j = consumers[c];
    if (--s->unknown[j] == 0 && !s->unordered[j]) {
      Py_ssize_t d = s->device[j], st = s->stream[j], ds = d * s->streams + st;
      if (s->lane_off[ds] + s->pos[ds] < s->lane_off[ds + 1] &&
          s->lane[s->lane_off[ds] + s->pos[ds]] == j)
        s->armed[d] = 1;
    }
  }
}

static double inputs_ready(Sim *s, Py_ssize_t j, Py_ssize_t d) {
  double t = 0.0;
  for (Py_ssize_t e = s->need_off[j]; e < s->need_off[j + 1]; e++) {
    Py_ssize_t m = s->prod[e];
    double x = s->device[m] == d ? s->finish[m] : s->arrival[s->need_slot[e]];
    if (x > t) t = x;
  }
  return t;
}

static int started(Sim *s, Py_ssize_t j, double t) {
  s->start[j] = t;
  s->finish[j] = t + s->w[j];
  if (heap_push(&s->events, s->finish[j], 0.0, j) < 0) return -1;
  known(s, s->local + s->local_off[j], s->local_off[j + 1] - s->local_off[j]);
  return 0;
}

static int try_start(Sim *s, Py_ssize_t d) {
  int armed = 0;
  for (Py_ssize_t st = 0; st < s->streams; st++) {
    Py_ssize_t ds = d * s->streams + st, lo = s->lane_off[ds], hi = s->lane_off[ds + 1];
    double *free = s->stream_free + st * s->D;
    while (lo + s->pos[ds] < hi) {
      Py_ssize_t j = s->lane[lo + s->pos[ds]];
      if (s->unknown[j]) break;
      double ready = inputs_ready(s, j, d);
      double t = free[d] >= ready ? free[d] : ready;
      if (st == 0) t = absorb(s, d, t, s->stream_free);
      s->pos[ds]++;
      if (started(s, j, t) < 0) return -1;
      free[d] = s->finish[j];
      if (s->w[j] > 0) break;
    }
  }
  for (Py_ssize_t st = 0; st < s->streams; st++) {
    Py_ssize_t ds = d * s->streams + st, at = s->lane_off[ds] + s->pos[ds];
    if (at < s->lane_off[ds + 1] && !s->unknown[s->lane[at]]) armed = 1;
  }
  s->armed[d] = (char)armed;
  return 0;
}

static int becomes_ready(Sim *s, Py_ssize_t j, double t) {
  Py_ssize_t x = s->lane_id[j];
  if (heap_push(&s->waiting_q[x], t, 0.0, j) < 0) return -1;
  if (s->busy_until[x] <= t) return heap_push(&s->events, t, 1.0, x);  /* else it looks later */
  return 0;
}

/* TensorFlow's own executor: each lane runs its ready ops first come, first served (or the
   highest priority first); events are (time, 0: an op finishes / 1: a lane looks, op or lane). */
static int run_fifo(Sim *s) {
  for (Py_ssize_t j = 0; j < s->n; j++)
    if (!s->unknown[j] && becomes_ready(s, j, 0.0) < 0) return -1;
  while (s->events.n) {
    Item ev = heap_pop(&s->events);
    double t = ev.t;
    Py_ssize_t x = ev.j;
    if (ev.u == 1.0) {
      Heap *q = &s->waiting_q[x];
      while (q->n && q->a[0].t <= t) {
        Item it = heap_pop(q);
        double key = s->priority ? -s->priority[it.j] : it.t;
        if (heap_push(&s->ready_q[x], key, 0.0, it.j) < 0) return -1;
      }
      if (s->busy_until[x] > t || !s->ready_q[x].n) continue;
      if (x < s->D && s->charges[x].n && absorb(s, x, t, s->busy_until) > t) {
        if (heap_push(&s->events, s->busy_until[x], 1.0, x) < 0) return -1;  /* bytes first */
        continue;
      }
      Py_ssize_t j = heap_pop(&s->ready_q[x]).j;
      s->start[j] = t;
      s->finish[j] = t + s->w[j];
      s->busy_until[x] = s->finish[j];
      if (heap_push(&s->events, s->finish[j], 0.0, j) < 0) return -1;
      continue;
    }
    Py_ssize_t m = x;
    if (send(s, m, s->device[m], t) < 0) return -1;
    if (heap_push(&s->events, t, 1.0, s->lane_id[m]) < 0) return -1;
    for (Py_ssize_t k = s->cons_off[m]; k < s->cons_off[m + 1]; k++) {
      Py_ssize_t e = s->cons[k], j = s->need_op[e];
      double a = s->device[m] == s->device[j] ? t : s->arrival[s->need_slot[e]];
      if (a > s->ready_at[j]) s->ready_at[j] = a;
      if (--s->unknown[j] == 0 && becomes_ready(s, j, s->ready_at[j]) < 0) return -1;
    }
  }
  return 0;
}

#define ALLOC(ptr, count) do { (ptr) = calloc((size_t)(count) + 1, sizeof(*(ptr))); \
  if (!(ptr)) { PyErr_NoMemory(); goto fail; } } while (0)

/* Build CSR lists: for each "owner" in [0, n), the values pushed for it in push order. */
static int csr(Py_ssize_t n, Py_ssize_t count, const Py_ssize_t *owner, const Py_ssize_t *value,
               Py_ssize_t **off_out, Py_ssize_t **list_out) {
  Py_ssize_t *off = calloc((size_t)n + 2, sizeof(Py_ssize_t));
  Py_ssize_t *list = calloc((size_t)count + 1, sizeof(Py_ssize_t));
  if (!off || !list) { free(off); free(list); PyErr_NoMemory(); return -1; }
  for (Py_ssize_t i = 0; i < count; i++) off[owner[i] + 1]++;
  for (Py_ssize_t i = 0; i < n; i++) off[i + 1] += off[i];
  Py_ssize_t *fill = malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
  if (!fill) { free(off); free(list); PyErr_NoMemory(); return -1; }
  memcpy(fill, off, ((size_t)n + 1) * sizeof(Py_ssize_t));
  for (Py_ssize_t i = 0; i < count; i++) list[fill[owner[i]]++] = value[i];
  free(fill);
  *off_out = off; *list_out = list;
  return 0;
}

static int fifo_setup(Sim *s, PyObject *priority_o) {
  Py_ssize_t n = s->n, E = s->need_off[n], *owner = NULL, *value = NULL;
  int ok = -1;
  ALLOC(s->need_op, E); ALLOC(s->lane_id, n); ALLOC(s->ready_at, n);
  ALLOC(owner, E); ALLOC(value, E);
  for (Py_ssize_t j = 0; j < n; j++) {
    s->lane_id[j] = s->device[j] + s->D * s->stream[j];
    for (Py_ssize_t e = s->need_off[j]; e < s->need_off[j + 1]; e++) {
      s->need_op[e] = j;
      owner[e] = s->prod[e]; value[e] = e;
    }
  }
  if (csr(n, E, owner, value, &s->cons_off, &s->cons) < 0) goto fail;
  s->nlanes = s->D * s->streams;
  ALLOC(s->busy_until, s->nlanes);
  s->waiting_q = calloc((size_t)s->nlanes, sizeof(Heap));
  s->ready_q = calloc((size_t)s->nlanes, sizeof(Heap));
  if (!s->waiting_q || !s->ready_q) { PyErr_NoMemory(); goto fail; }
  if (priority_o != Py_None) {
    ALLOC(s->priority, n);
    if (read_doubles(priority_o, s->priority, n, "priority") < 0) goto fail;
  }
  ok = 0;
fail:
  free(owner); free(value);
  return ok;
}

static PyObject *simulate(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *device_o, *w_o, *stream_o, *orders_o, *need_off_o, *prod_o, *keyid_o, *bytes_o;
  PyObject *intercept_o, *slope_o, *knee_o, *extra_o, *least_knee_o, *send_o, *recv_o, *call_o;
  PyObject *priority_o, *serve_o;
  Py_ssize_t transfer_stream, concurrency, D;
  double small_bytes;
  if (!PyArg_ParseTuple(args, "nOOOOOOOOOOOOOOOOnndOO", &D, &device_o, &w_o, &stream_o,
                        &orders_o, &need_off_o, &prod_o, &keyid_o, &bytes_o, &intercept_o,
                        &slope_o, &knee_o, &extra_o, &least_knee_o, &send_o, &recv_o, &call_o,
                        &transfer_stream, &concurrency, &small_bytes, &priority_o, &serve_o))
    return NULL;
  int ordered = orders_o != Py_None;
  Sim sim, *s = &sim;
  memset(s, 0, sizeof(sim));
  Map map = {0};
  Py_ssize_t placed = 0, nl = 0;
  Py_ssize_t *owner = NULL, *value = NULL;
  PyObject *result = NULL;
  Py_ssize_t n = PySequence_Size(device_o);
  if (n < 0) return NULL;
  if (D < 1 || (ordered && PySequence_Size(orders_o) != D)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "one order per device");
    return NULL;
  }
  Py_ssize_t E = PySequence_Size(prod_o);
  if (E < 0) return NULL;
  s->n = n; s->D = D; s->concurrency = concurrency; s->small_bytes = small_bytes;
  ALLOC(s->device, n); ALLOC(s->stream, n); ALLOC(s->need_off, n + 1); ALLOC(s->w, n);
  ALLOC(s->start, n); ALLOC(s->finish, n); ALLOC(s->unordered, n); ALLOC(s->unknown, n);
  ALLOC(s->waiting, n);
  ALLOC(s->prod, E); ALLOC(s->keyid, E); ALLOC(s->need_bytes, E); ALLOC(s->need_slot, E);
  if (read_ints(device_o, s->device, n, "device") < 0 ||
      read_doubles(w_o, s->w, n, "w") < 0 ||
      read_ints(stream_o, s->stream, n, "stream") < 0 ||
      read_ints(need_off_o, s->need_off, n + 1, "need offsets") < 0 ||
      read_ints(prod_o, s->prod, E, "producers") < 0 ||
      read_ints(keyid_o, s->keyid, E, "keys") < 0 ||
      read_doubles(bytes_o, s->need_bytes, E, "bytes") < 0)
    goto fail;
  ALLOC(s->intercept, D * D); ALLOC(s->slope, D * D); ALLOC(s->knee, D * D);
  ALLOC(s->extra, D * D); ALLOC(s->least_knee, D); ALLOC(s->send_cpu, D * D);
  ALLOC(s->recv_cpu, D * D); ALLOC(s->call_cpu, 4 * D * D); ALLOC(s->serve_from, D);
  if (read_matrix(intercept_o, s->intercept, D, "intercept") < 0 ||
      read_matrix(slope_o, s->slope, D, "slope") < 0 ||
      read_matrix(knee_o, s->knee, D, "knee") < 0 ||
      read_matrix(extra_o, s->extra, D, "extra") < 0 ||
      read_doubles(least_knee_o, s->least_knee, D, "least knee") < 0 ||
      read_matrix(send_o, s->send_cpu, D, "send cpu") < 0 ||
      read_matrix(recv_o, s->recv_cpu, D, "recv cpu") < 0 ||
      read_doubles(call_o, s->call_cpu, 4 * D * D, "call cpu") < 0 ||
      read_doubles(serve_o, s->serve_from, D, "serve from") < 0)
    goto fail;
  for (Py_ssize_t i = 0; i < n; i++)
    if (s->device[i] < 0 || s->device[i] >= D) {
      PyErr_Format(PyExc_ValueError, "op %zd on device %zd of %zd", i, s->device[i], D);
      goto fail;
    }
  for (Py_ssize_t e = 0; e < E; e++)
    if (s->prod[e] < 0 || s->prod[e] >= n) {
      PyErr_SetString(PyExc_ValueError, "a need names no op");
      goto fail;
    }

  /* streams and unordered ops */
  s->streams = 1;
  for (Py_ssize_t i = 0; i < n; i++) {
    if (s->stream[i] + 1 > s->streams) s->streams = s->stream[i] + 1;
    s->unordered[i] = s->stream[i] == transfer_stream;
  }
  /* lanes: each device's order, per stream, without the unordered ops */
  ALLOC(owner, n); ALLOC(value, n);
  for (Py_ssize_t d = 0; d < D && ordered; d++) {
    PyObject *fast = PySequence_Fast(PySequence_Fast_GET_ITEM(orders_o, d), "order");
    if (!fast) goto fail;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    for (Py_ssize_t k = 0; k < len; k++) {
      Py_ssize_t i = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, k));
      if (i < 0 || i >= n || placed >= n) {
        Py_DECREF(fast);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "orders name no op");
        goto fail;
      }
      if (s->unordered[i]) continue;
      owner[placed] = d * s->streams + s->stream[i]; value[placed] = i; placed++;
    }
    Py_DECREF(fast);
  }
  if (ordered && csr(D * s->streams, placed, owner, value, &s->lane_off, &s->lane) < 0)
    goto fail;
  ALLOC(s->pos, D * s->streams); ALLOC(s->stream_free, D * s->streams);

  /* per need: local or remote consumers, transfer slots, gates */
  if (map_init(&map, E) < 0) { PyErr_NoMemory(); goto fail; }
  free(owner); free(value);
  ALLOC(owner, E); ALLOC(value, E);
  ALLOC(s->slot_key, E); ALLOC(s->slot_dst, E); ALLOC(s->slot_bytes, E);
  ALLOC(s->slot_owner, E);
  for (Py_ssize_t j = 0; j < n; j++) {
    Py_ssize_t dj = s->device[j];
    s->unknown[j] = s->need_off[j + 1] - s->need_off[j];
    for (Py_ssize_t e = s->need_off[j]; e < s->need_off[j + 1]; e++) {
      Py_ssize_t m = s->prod[e];
      s->need_slot[e] = -1;
      if (s->device[m] == dj) continue;
      int fresh;
      Py_ssize_t *slot = map_slot(&map, (int64_t)s->keyid[e] * D + dj, &fresh);
      if (fresh) {
        *slot = s->slots++;
        s->slot_key[*slot] = s->keyid[e]; s->slot_dst[*slot] = dj;
        s->slot_owner[*slot] = m;
      }
      s->slot_bytes[*slot] = s->need_bytes[e];  /* the last need's bytes, as a dict keeps */
      s->need_slot[e] = *slot;
    }
  }
  /* each producer's slots in insertion order, then stably by destination */
  {
    Py_ssize_t *ids = NULL;
    ALLOC(ids, s->slots);
    for (Py_ssize_t k = 0; k < s->slots; k++) ids[k] = k;
    int ok = csr(n, s->slots, s->slot_owner, ids, &s->owe_off, &s->owe);
    free(ids);
    if (ok < 0) goto fail;
    for (Py_ssize_t m = 0; m < n; m++) {  /* insertion sort: stable, lists are short */
      for (Py_ssize_t a = s->owe_off[m] + 1; a < s->owe_off[m + 1]; a++) {
        Py_ssize_t x = s->owe[a], b = a;
        while (b > s->owe_off[m] && s->slot_dst[s->owe[b - 1]] > s->slot_dst[x]) {
          s->owe[b] = s->owe[b - 1]; b--;
        }
        s->owe[b] = x;
      }
    }
  }
  ALLOC(s->arrival, s->slots);
  /* consumers: on the producer's device, and on others (once per need) */
  if (ordered) {
    Py_ssize_t nr = 0;
    Py_ssize_t *r_owner = NULL, *r_value = NULL;
    ALLOC(r_owner, E); ALLOC(r_value, E);
    for (Py_ssize_t j = 0; j < n; j++)
      for (Py_ssize_t e = s->need_off[j]; e < s->need_off[j + 1]; e++) {
        Py_ssize_t m = s->prod[e];
        if (s->device[m] == s->device[j]) { owner[nl] = m; value[nl] = j; nl++; }
        else { r_owner[nr] = m; r_value[nr] = j; nr++; }
      }
    int ok = csr(n, nl, owner, value, &s->local_off, &s->local);
    if (ok == 0) ok = csr(n, nr, r_owner, r_value, &s->remote_off, &s->remote);
    free(r_owner); free(r_value);
    if (ok < 0) goto fail;
  }
  /* gates: producer -> the unordered ops it feeds, once per distinct producer */
  if (ordered) {
    Py_ssize_t ng = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
      if (!s->unordered[j]) continue;
      for (Py_ssize_t e = s->need_off[j]; e < s->need_off[j + 1]; e++) {
        Py_ssize_t m = s->prod[e], seen = 0;
        for (Py_ssize_t f = s->need_off[j]; f < e; f++)
          if (s->prod[f] == m) { seen = 1; break; }
        if (seen) continue;
        s->waiting[j]++;
        owner[ng] = m; value[ng] = j; ng++;
      }
    }
    if (csr(n, ng, owner, value, &s->gate_off, &s->gate) < 0) goto fail;
  }
  /* links */
  if (concurrency >= 0) ALLOC(s->lane_free, D * D * 2 * (concurrency ? concurrency : 1));
  s->charges = calloc((size_t)D + 1, sizeof(Heap));
  if (!s->charges) { PyErr_NoMemory(); goto fail; }
  ALLOC(s->until, D); ALLOC(s->moving, D); ALLOC(s->armed, D);
  ALLOC(s->t_slot, s->slots); ALLOC(s->t_src, s->slots); ALLOC(s->t_begin, s->slots);
  ALLOC(s->t_end, s->slots);
  if (concurrency == 0) { PyErr_SetString(PyExc_ValueError, "link concurrency 0"); goto fail; }

  for (Py_ssize_t i = 0; i < n; i++) s->finish[i] = -1.0;
  if (!ordered) {
    if (fifo_setup(s, priority_o) < 0 || run_fifo(s) < 0) goto fail;
    goto done;
  }
  ALLOC(s->snapshot, D);
  char *snapshot = s->snapshot;
  for (Py_ssize_t j = 0; j < n; j++)
    if (s->unordered[j] && !s->waiting[j] &&
        started(s, j, inputs_ready(s, j, s->device[j])) < 0) goto fail;
  for (Py_ssize_t d = 0; d < D; d++)
    if (try_start(s, d) < 0) goto fail;
  while (s->events.n) {
    Item ev = heap_pop(&s->events);
    Py_ssize_t m = ev.j;
    if (send(s, m, s->device[m], ev.t) < 0) goto fail;
    known(s, s->remote + s->remote_off[m], s->remote_off[m + 1] - s->remote_off[m]);
    for (Py_ssize_t g = s->gate_off[m]; g < s->gate_off[m + 1]; g++) {
      Py_ssize_t j = s->gate[g];
      if (--s->waiting[j] == 0 &&
          started(s, j, inputs_ready(s, j, s->device[j])) < 0) goto fail;
    }
    memcpy(snapshot, s->armed, (size_t)D);
    for (Py_ssize_t d = 0; d < D; d++)
      if (snapshot[d] && try_start(s, d) < 0) goto fail;
  }
done:
  {
    PyObject *start = double_list(s->start, n), *finish = double_list(s->finish, n);
    PyObject *slot = int_list(s->t_slot, s->nt), *src = int_list(s->t_src, s->nt);
    PyObject *begin = double_list(s->t_begin, s->nt), *end = double_list(s->t_end, s->nt);
    Py_ssize_t *keys = malloc(((size_t)s->slots + 1) * sizeof(Py_ssize_t));
    Py_ssize_t *dsts = malloc(((size_t)s->slots + 1) * sizeof(Py_ssize_t));
    double *nbytes = malloc(((size_t)s->slots + 1) * sizeof(double));
    PyObject *key = NULL, *dst = NULL, *size = NULL;
    if (keys && dsts && nbytes) {
      for (Py_ssize_t i = 0; i < s->nt; i++) {
        keys[i] = s->slot_key[s->t_slot[i]]; dsts[i] = s->slot_dst[s->t_slot[i]];
        nbytes[i] = s->slot_bytes[s->t_slot[i]];
      }
      key = int_list(keys, s->nt); dst = int_list(dsts, s->nt); size = double_list(nbytes, s->nt);
    } else {
      PyErr_NoMemory();
    }
    free(keys); free(dsts); free(nbytes);
    if (start && finish && slot && src && begin && end && key && dst && size)
      result = Py_BuildValue("(OO(OOOOOO))", start, finish, key, src, dst, size, begin, end);
    Py_XDECREF(start); Py_XDECREF(finish); Py_XDECREF(slot); Py_XDECREF(src);
    Py_XDECREF(begin); Py_XDECREF(end); Py_XDECREF(key); Py_XDECREF(dst); Py_XDECREF(size);
  }
fail:
  free(owner); free(value); free(s->snapshot); free(s->slot_owner);
  free(map.keys); free(map.vals);
  free(s->device); free(s->stream); free(s->need_off); free(s->unknown); free(s->waiting);
  free(s->w); free(s->start); free(s->finish); free(s->unordered);
  free(s->prod); free(s->keyid); free(s->need_slot); free(s->need_bytes);
  free(s->local_off); free(s->local); free(s->remote_off); free(s->remote);
  free(s->gate_off); free(s->gate); free(s->lane_off); free(s->lane); free(s->pos);
  free(s->stream_free); free(s->slot_key); free(s->slot_dst); free(s->owe_off); free(s->owe);
  free(s->slot_bytes); free(s->arrival);
  free(s->intercept); free(s->slope); free(s->knee); free(s->extra); free(s->least_knee);
  free(s->send_cpu); free(s->recv_cpu); free(s->call_cpu); free(s->serve_from);
  free(s->lane_free);
  if (s->charges) for (Py_ssize_t d = 0; d < D; d++) free(s->charges[d].a);
  free(s->charges); free(s->until); free(s->moving); free(s->armed);
  free(s->t_slot); free(s->t_src); free(s->t_begin); free(s->t_end);
  free(s->events.a);
  free(s->need_op); free(s->cons_off); free(s->cons); free(s->lane_id); free(s->ready_at);
  free(s->busy_until); free(s->priority);
  for (Py_ssize_t x = 0; x < s->nlanes; x++) {
    if (s->waiting_q) free(s->waiting_q[x].a);
    if (s->ready_q) free(s->ready_q[x].a);
  }
  free(s->waiting_q); free(s->ready_q);
  return result;
}

static PyMethodDef methods[] = {
  {"simulate", simulate, METH_VARARGS,
   "simulate(D, device, w, stream, orders or None (first come, first served), need_off, "
   "producers, keys, bytes, intercept, slope, knee, extra, least_knee, send_cpu, recv_cpu, "
   "call_cpu, transfer_stream, concurrency, small_bytes, priority or None, serve_from) -> "
   "(start, finish, (key, src, dst, bytes, begin, end))"},
  {"peaks", simcore_peaks, METH_VARARGS,
   "peaks(D, device, start, finish, need_off, producers, keys, bytes, transfer keys, "
   "sources, destinations, bytes, begins, ends, persistent) -> each device's peak bytes"},
  {"flat_needs", simcore_flat_needs, METH_VARARGS,
   "flat_needs(preds, edge tensors) -> (need offsets, producers, key numbers, bytes, keys)"},
  {"eft", simcore_eft, METH_VARARGS,
   "eft(D, visit, w, preds, edge_bytes, intercept, slope, knee, extra, least_knee, group, "
   "group memory, capacity, used, group devices, pinned) -> (device, start, finish, used, "
   "group devices), or the op that fits no device"},
  {"rank_u", simcore_rank_u, METH_VARARGS,
   "rank_u(topo, succs, c, w max) -> each op's upward rank"},
  {"graph_edges", simcore_graph_edges, METH_VARARGS,
   "graph_edges(ops, index, back) -> (preds, succs, edge bytes, edge tensors)"},
  {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_simcore",
                                    "fastt's compiled simulation loop", -1, methods};

PyMODINIT_FUNC PyInit__simcore(void) {
  PyObject *m = PyModule_Create(&module);
  /* the functions and their arguments: fastt.sched.sim._native.SIMCORE_ABI */
  if (m && PyModule_AddIntConstant(m, "ABI", 6) < 0) { Py_DECREF(m); return NULL; }
  return m;
}
