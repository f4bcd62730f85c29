/* The recording hot path of profiler.mstx in C: mark, range_start, range_end.
 *
 * Each call checks one flag; while a session records it takes a CLOCK_MONOTONIC timestamp (the
 * clock behind time.perf_counter_ns) and appends one record to the calling thread's buffer:
 * parallel arrays of kind code, range id, time and two object references (message and domain,
 * or domain alone for an end). The GIL serialises appends and drains, so no lock is taken.
 * drain() hands every buffer's records to the recorder as bytes (codes, ids, times) and lists
 * (messages, domains), leaving fresh empty buffers behind. A buffer holds at most max_buffer
 * records between two drains. What a full buffer does is the session's overflow policy (the
 * names of ground.background): "block" (the default) calls on_full() to wake the drain, then
 * waits with the GIL released until the drain has taken the buffer (when on_full() says no
 * drain will come, the record is dropped and counted); "spool" detaches the full buffer and hands
 * it to on_full(chunk) on the calling thread, which writes it to disk; "drop" drops the record
 * and counts it. All of this is off the hot path: a record that fits costs what it always did.
 *
 * Calls given a CUDA stream, and range ends while stream ranges are open, go to Python
 * callables registered by profiler.mstx (they record device events, then push() here).
 * Bad ids never raise: an id that is not a non-negative int below 2**62 is recorded as -1.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(__GNUC__) || defined(__clang__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

typedef struct Buf {
    unsigned long tid;
    Py_ssize_t n, cap;
    int8_t *code;
    int64_t *id;
    int64_t *t;
    PyObject **a;
    PyObject **b;
    long long dropped;
    unsigned long taken;          /* times a drain (or a spill) took this buffer's records */
    struct Buf *next;
} Buf;

enum { OVERFLOW_BLOCK, OVERFLOW_SPOOL, OVERFLOW_DROP };

static int active = 0, ends = 0;
static Py_ssize_t max_buffer = 1000000;
static int overflow = OVERFLOW_BLOCK;
static long long waits = 0, wait_ns = 0;   /* this session's waits for the drain (block) */
static long long next_id_value = 1;
static unsigned long generation = 1;
static Buf *buffers = NULL;
static __thread Buf *tls_buf = NULL;
static __thread unsigned long tls_generation = 0;

static PyObject *default_domain = NULL;   /* "default" */
static PyObject *kw[3] = {NULL, NULL, NULL};  /* "message", "stream", "domain", interned */
static PyObject *zero = NULL;             /* 0 */
static PyObject *streams = NULL;          /* dict: range id -> stream (owned by mstx) */
static PyObject *slow_mark = NULL;        /* (message, stream, domain) -> None */
static PyObject *slow_start = NULL;       /* (message, stream, domain) -> id */
static PyObject *end_on_stream = NULL;    /* (range_id) -> None */
static PyObject *on_new_thread = NULL;    /* () -> None, once per thread per session */
static PyObject *on_full = NULL;          /* block: () -> bool (a drain will come); spool: (chunk) -> None */

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static Buf *new_buffer(void) {
    Buf *bf = (Buf *)calloc(1, sizeof(Buf));
    if (bf == NULL)
        return NULL;
    bf->tid = PyThread_get_thread_ident();
    bf->next = buffers;
    buffers = bf;
    tls_buf = bf;
    tls_generation = generation;
    if (on_new_thread != NULL) {
        PyObject *r = PyObject_CallNoArgs(on_new_thread);
        if (r == NULL)
            PyErr_Clear();          /* naming a thread must never fail the caller */
        Py_XDECREF(r);
    }
    return bf;
}

static int grow(Buf *bf) {
    Py_ssize_t cap = bf->cap ? bf->cap * 2 : 1024;
    if (cap > max_buffer)
        cap = max_buffer;
    if (cap <= bf->cap)
        return -1;
    int8_t *code = realloc(bf->code, cap * sizeof(int8_t));
    if (code) bf->code = code;
    int64_t *id = realloc(bf->id, cap * sizeof(int64_t));
    if (id) bf->id = id;
    int64_t *t = realloc(bf->t, cap * sizeof(int64_t));
    if (t) bf->t = t;
    PyObject **a = realloc(bf->a, cap * sizeof(PyObject *));
    if (a) bf->a = a;
    PyObject **b = realloc(bf->b, cap * sizeof(PyObject *));
    if (b) bf->b = b;
    if (!code || !id || !t || !a || !b)
        return -1;
    bf->cap = cap;
    return 0;
}

static PyObject *take_buffer(Buf *bf);

/* Block: wake the drain, then wait (GIL released) until it has taken this buffer. 0: room now;
 * 1: nothing to record into (no drain will come: counted as dropped; or the session ended);
 * -1: a signal handler raised while waiting (the exception is set). */
static int wait_for_drain(Buf *bf) {
    unsigned long gen = generation, taken = bf->taken;
    int64_t t0 = now_ns();
    int coming = 0;
    PyObject *r = on_full != NULL ? PyObject_CallNoArgs(on_full) : NULL;
    if (r == NULL)
        PyErr_Clear();
    else {
        coming = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (coming < 0) {
            PyErr_Clear();
            coming = 0;
        }
    }
    if (generation != gen)
        return 1;
    if (!coming) {
        bf->dropped++;
        return 1;
    }
    long pause_ns = 20000;
    int rc = 0;
    while (generation == gen && bf->taken == taken) {
        struct timespec pause = {0, pause_ns};
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&pause, NULL);
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0) {     /* Ctrl-C while a stuck sink holds the drain */
            rc = -1;
            break;
        }
        if (pause_ns < 1000000)
            pause_ns *= 2;
    }
    waits++;
    wait_ns += now_ns() - t0;
    return rc < 0 ? -1 : generation == gen ? 0 : 1;
}

/* Spool: hand the full buffer to on_full(chunk) on this thread; 0: room now, 1: session ended. */
static int spill(Buf *bf) {
    unsigned long gen = generation;
    Py_ssize_t n = bf->n;
    PyObject *chunk = take_buffer(bf);
    PyObject *r = chunk != NULL ? PyObject_CallOneArg(on_full, chunk) : NULL;
    Py_XDECREF(chunk);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
    if (generation != gen)
        return 1;
    if (r == NULL)
        bf->dropped += n;           /* the recorder's spill never raises; if it did, say so */
    return 0;
}

/* The cold path of push_record: the buffer is full (or its memory could not grow). */
static NOINLINE int make_room(Buf *bf) {
    if (overflow == OVERFLOW_DROP || on_full == NULL) {
        bf->dropped++;
        return 1;
    }
    return overflow == OVERFLOW_SPOOL ? spill(bf) : wait_for_drain(bf);
}

/* Append one record; a reference to a and b (b may be NULL) is taken. 0: recorded, or counted
 * as dropped, or the session ended meanwhile; -1 only when a signal handler raised during a
 * block wait (the exception is set). */
static inline int push_record(int8_t code, int64_t id, int64_t t, PyObject *a, PyObject *b) {
    Buf *bf = tls_buf;
    if (bf == NULL || tls_generation != generation) {
        bf = new_buffer();
        if (bf == NULL)
            return 0;
    }
    if (bf->n == bf->cap && grow(bf) < 0) {
        int rc = make_room(bf);
        if (rc != 0)
            return rc < 0 ? -1 : 0;
        if (bf->n == bf->cap && grow(bf) < 0) {
            bf->dropped++;          /* no memory even for an empty buffer */
            return 0;
        }
    }
    Py_ssize_t i = bf->n++;
    bf->code[i] = code;
    bf->id[i] = id;
    bf->t[i] = t;
    Py_INCREF(a);
    bf->a[i] = a;
    Py_XINCREF(b);
    bf->b[i] = b;
    return 0;
}

/* Positional-or-keyword arguments of (message, stream=None, domain="default"). */
static int parse_msg_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                          const char *fname, PyObject **message, PyObject **stream,
                          PyObject **domain) {
    static const char *names[3] = {"message", "stream", "domain"};
    PyObject *vals[3] = {NULL, Py_None, default_domain};
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most 3 arguments (%zd given)", fname, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        vals[i] = args[i];
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            int j;
            for (j = 0; j < 3; j++)        /* keyword names from code are interned: identity first */
                if (key == kw[j])
                    break;
            if (j == 3)
                for (j = 0; j < 3; j++)
                    if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0)
                        break;
            if (j == 3 || j < nargs) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected or repeated keyword argument %R",
                             fname, key);
                return -1;
            }
            vals[j] = args[nargs + k];
        }
    }
    if (vals[0] == NULL) {
        PyErr_Format(PyExc_TypeError, "%s() missing required argument 'message'", fname);
        return -1;
    }
    *message = vals[0];
    *stream = vals[1];
    *domain = vals[2];
    return 0;
}

static PyObject *call3(PyObject *fn, PyObject *x, PyObject *y, PyObject *z) {
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "probe.profiler._mstx_native is not configured");
        return NULL;
    }
    PyObject *argv[3] = {x, y, z};
    return PyObject_Vectorcall(fn, argv, 3, NULL);
}

PyDoc_STRVAR(mark_doc,
"mark(message, stream=None, domain='default')\n--\n\n"
"Record an instant event ``message`` in ``domain`` (device-timestamped with ``stream``).");

static PyObject *mark(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *message, *stream, *domain;
    if (parse_msg_args(args, nargs, kwnames, "mark", &message, &stream, &domain) < 0)
        return NULL;
    if (!active)
        Py_RETURN_NONE;
    if (stream != Py_None)
        return call3(slow_mark, message, stream, domain);
    if (push_record(0, 0, now_ns(), message, domain) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(range_start_doc,
"range_start(message, stream=None, domain='default')\n--\n\n"
"Open a range named ``message``; return its id for range_end (0 when not recording).");

static PyObject *range_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    PyObject *message, *stream, *domain;
    if (parse_msg_args(args, nargs, kwnames, "range_start", &message, &stream, &domain) < 0)
        return NULL;
    if (!active) {
        Py_INCREF(zero);
        return zero;
    }
    if (stream != Py_None)
        return call3(slow_start, message, stream, domain);
    long long rid = next_id_value++;
    if (push_record(1, rid, now_ns(), message, domain) < 0)
        return NULL;
    return PyLong_FromLongLong(rid);
}

PyDoc_STRVAR(range_end_doc,
"range_end(range_id, domain='default')\n--\n\n"
"Close the range ``range_id`` (any thread may close it); id 0 is ignored.");

static PyObject *range_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
    PyObject *rid_obj = nargs > 0 ? args[0] : NULL;
    PyObject *domain = nargs > 1 ? args[1] : default_domain;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "range_end() takes at most 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            if (PyUnicode_CompareWithASCIIString(key, "range_id") == 0 && nargs < 1)
                rid_obj = args[nargs + k];
            else if ((key == kw[2] || PyUnicode_CompareWithASCIIString(key, "domain") == 0)
                     && nargs < 2)
                domain = args[nargs + k];
            else {
                PyErr_Format(PyExc_TypeError,
                             "range_end() got an unexpected or repeated keyword argument %R", key);
                return NULL;
            }
        }
    }
    if (rid_obj == NULL) {
        PyErr_SetString(PyExc_TypeError, "range_end() missing required argument 'range_id'");
        return NULL;
    }
    if (!ends)
        Py_RETURN_NONE;
    int64_t rid;
    if (PyLong_Check(rid_obj)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(rid_obj, &overflow);
        if (v == 0 && !overflow)
            Py_RETURN_NONE;
        rid = (overflow || v < 0 || v >= (1LL << 62)) ? -1 : v;
        if (v == -1 && PyErr_Occurred())
            PyErr_Clear();
    } else {
        int truth = PyObject_IsTrue(rid_obj);
        if (truth < 0)
            PyErr_Clear();
        if (truth <= 0)
            Py_RETURN_NONE;
        rid = -1;
    }
    if (streams != NULL && PyDict_GET_SIZE(streams) > 0 && end_on_stream != NULL) {
        PyObject *r = PyObject_CallOneArg(end_on_stream, rid_obj);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    if (push_record(2, rid, now_ns(), domain, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(push_doc,
"push(code, range_id, t_ns, a, b)\n--\n\n"
"Append one raw record to this thread's buffer (the slow paths of profiler.mstx use it).");

static PyObject *push(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "push() takes 5 arguments");
        return NULL;
    }
    long code = PyLong_AsLong(args[0]);
    long long rid = PyLong_AsLongLong(args[1]);
    long long t = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (push_record((int8_t)code, rid, t, args[3], args[4] == Py_None ? NULL : args[4]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *next_id(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(next_id_value++);
}

static PyObject *now(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(now_ns());
}

PyDoc_STRVAR(set_state_doc,
"set_state(active, ends)\n--\n\n"
"Switch recording of marks/starts and of range ends on or off.");

static PyObject *set_state(PyObject *self, PyObject *args) {
    int a, e;
    if (!PyArg_ParseTuple(args, "pp", &a, &e))
        return NULL;
    active = a;
    ends = e;
    Py_RETURN_NONE;
}

static void set_ref(PyObject **slot, PyObject *value) {
    PyObject *old = *slot;
    if (value == Py_None)
        value = NULL;
    Py_XINCREF(value);
    *slot = value;
    Py_XDECREF(old);
}

PyDoc_STRVAR(configure_doc,
"configure(streams, slow_mark, slow_start, end_on_stream)\n--\n\n"
"Register the stream table and the Python slow paths (calls given a stream).");

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *s, *m, *st, *e;
    if (!PyArg_ParseTuple(args, "O!OOO", &PyDict_Type, &s, &m, &st, &e))
        return NULL;
    set_ref(&streams, s);
    set_ref(&slow_mark, m);
    set_ref(&slow_start, st);
    set_ref(&end_on_stream, e);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(session_doc,
"session(on_new_thread, max_buffer, overflow='block', on_full=None)\n--\n\n"
"Per-session settings: a callable run once per thread on its first record (None for none); "
"the most records a buffer holds between two drains; what a full buffer does ('block', "
"'spool' or 'drop'); on_full: for 'block' a callable () -> bool that wakes the drain and says "
"whether one will come, for 'spool' a callable (chunk) -> None that writes a chunk (a drain() "
"item) to disk. Without on_full a full buffer drops. Zeroes stats().");

static PyObject *session(PyObject *self, PyObject *args) {
    PyObject *cb, *full = Py_None;
    Py_ssize_t mb;
    const char *policy = "block";
    if (!PyArg_ParseTuple(args, "On|sO", &cb, &mb, &policy, &full))
        return NULL;
    int mode;
    if (strcmp(policy, "block") == 0)
        mode = OVERFLOW_BLOCK;
    else if (strcmp(policy, "spool") == 0)
        mode = OVERFLOW_SPOOL;
    else if (strcmp(policy, "drop") == 0)
        mode = OVERFLOW_DROP;
    else {
        PyErr_Format(PyExc_ValueError, "overflow %R: use one of block, spool, drop",
                     PyTuple_GET_ITEM(args, 2));
        return NULL;
    }
    if (full != Py_None && !PyCallable_Check(full)) {
        PyErr_SetString(PyExc_TypeError, "on_full must be callable or None");
        return NULL;
    }
    set_ref(&on_new_thread, cb);
    set_ref(&on_full, full);
    max_buffer = mb > 0 ? mb : 1;
    overflow = mode;
    waits = wait_ns = 0;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(stats_doc,
"stats() -> (waits, wait_ns)\n--\n\n"
"This session's waits for the drain ('block'): how many, and how long in all (ns).");

static PyObject *stats(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(LL)", waits, wait_ns);
}

static void free_arrays(int8_t *code, int64_t *id, int64_t *t, PyObject **a, PyObject **b) {
    free(code);
    free(id);
    free(t);
    free(a);
    free(b);
}

/* Detach a buffer's records and build its drain() item; the buffer is left empty. */
static PyObject *take_buffer(Buf *bf) {
    /* detach the arrays first: building Python objects may run code that records again */
    Py_ssize_t n = bf->n;
    int8_t *code = bf->code;
    int64_t *id = bf->id, *t = bf->t;
    PyObject **a = bf->a, **b = bf->b;
    long long dropped = bf->dropped;
    bf->code = NULL; bf->id = NULL; bf->t = NULL; bf->a = NULL; bf->b = NULL;
    bf->n = bf->cap = 0;
    bf->dropped = 0;
    bf->taken++;
    PyObject *la = PyList_New(n), *lb = PyList_New(n);
    PyObject *bc = PyBytes_FromStringAndSize((const char *)code, n * (Py_ssize_t)sizeof(int8_t));
    PyObject *bi = PyBytes_FromStringAndSize((const char *)id, n * (Py_ssize_t)sizeof(int64_t));
    PyObject *bt = PyBytes_FromStringAndSize((const char *)t, n * (Py_ssize_t)sizeof(int64_t));
    if (!la || !lb || !bc || !bi || !bt) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_DECREF(a[i]);
            Py_XDECREF(b[i]);
        }
        free_arrays(code, id, t, a, b);
        Py_XDECREF(la); Py_XDECREF(lb); Py_XDECREF(bc); Py_XDECREF(bi); Py_XDECREF(bt);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyList_SET_ITEM(la, i, a[i]);                 /* the buffer's reference moves */
        PyObject *bi_obj = b[i];
        if (bi_obj == NULL) {
            Py_INCREF(Py_None);
            bi_obj = Py_None;
        }
        PyList_SET_ITEM(lb, i, bi_obj);
    }
    free_arrays(code, id, t, a, b);
    return Py_BuildValue("(kNNNNNL)", bf->tid, bc, bi, bt, la, lb, dropped);
}

PyDoc_STRVAR(drain_doc,
"drain() -> list\n--\n\n"
"Take every thread's records: a list of (thread id, codes bytes (int8), ids bytes (int64), "
"times bytes (int64), list of first objects, list of second objects (None for an end), "
"number dropped since the last drain); threads with nothing new are left out.");

static PyObject *drain(PyObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Buf *bf = buffers; bf != NULL; bf = bf->next) {
        if (bf->n == 0 && bf->dropped == 0)
            continue;
        PyObject *item = take_buffer(bf);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

PyDoc_STRVAR(reset_doc,
"reset()\n--\n\n"
"Switch recording off and release every buffer with what it still holds.");

static PyObject *reset(PyObject *self, PyObject *unused) {
    active = ends = 0;
    generation++;                    /* every thread registers a new buffer on its next record */
    Buf *bf = buffers;
    buffers = NULL;
    set_ref(&on_new_thread, Py_None);
    set_ref(&on_full, Py_None);
    while (bf != NULL) {
        Buf *next = bf->next;
        for (Py_ssize_t i = 0; i < bf->n; i++) {
            Py_DECREF(bf->a[i]);
            Py_XDECREF(bf->b[i]);
        }
        free_arrays(bf->code, bf->id, bf->t, bf->a, bf->b);
        free(bf);
        bf = next;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"mark", (PyCFunction)(void (*)(void))mark, METH_FASTCALL | METH_KEYWORDS, mark_doc},
    {"range_start", (PyCFunction)(void (*)(void))range_start, METH_FASTCALL | METH_KEYWORDS,
     range_start_doc},
    {"range_end", (PyCFunction)(void (*)(void))range_end, METH_FASTCALL | METH_KEYWORDS,
     range_end_doc},
    {"push", (PyCFunction)(void (*)(void))push, METH_FASTCALL, push_doc},
    {"next_id", next_id, METH_NOARGS, "next_id()\n--\n\nA new range id."},
    {"now", now, METH_NOARGS, "now()\n--\n\nThe clock records use, in ns (time.perf_counter_ns)."},
    {"set_state", set_state, METH_VARARGS, set_state_doc},
    {"configure", configure, METH_VARARGS, configure_doc},
    {"session", session, METH_VARARGS, session_doc},
    {"drain", drain, METH_NOARGS, drain_doc},
    {"stats", stats, METH_NOARGS, stats_doc},
    {"reset", reset, METH_NOARGS, reset_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mstx_native",
    "The C recording path of profiler.mstx (see profiler/_mstx_native.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__mstx_native(void) {
    default_domain = PyUnicode_InternFromString("default");
    zero = PyLong_FromLong(0);
    kw[0] = PyUnicode_InternFromString("message");
    kw[1] = PyUnicode_InternFromString("stream");
    kw[2] = PyUnicode_InternFromString("domain");
    if (default_domain == NULL || zero == NULL || !kw[0] || !kw[1] || !kw[2])
        return NULL;
    return PyModule_Create(&module);
}
