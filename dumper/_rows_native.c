/* The dump's row building for the common values, in C: dumper/rows.py's RowBuilder.value
 * for a plain tensor and an exact int, float or bool, everything else handed back to Python.
 *
 * Built at install (setup.py, optional: without a compiler the pure-Python RowBuilder does
 * the same work). What a value becomes is exactly what RowBuilder._tensor and ._scalar make
 * of it (tests/dumper/test_dump_rows_native.py holds the two paths to one another): the JSON entry,
 * the Leaf, the row, the handle, the identity key kept in the step's "seen" dict and the
 * tensor id. The framework's specifics come from the statistics backend (TorchStats.native_spec):
 * the tensor types taken here, a table dtype -> (name, kind, code), the strided layout (the
 * density test is torch's, redone here), the backend's reduce() for what the native kernel does
 * not read, and the
 * kernel's entry points (addresses of the functions of engine_adapter/stats_kernel.c, built
 * and loaded by the backend).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef void (*stats_fn)(const void *x, int64_t n, double *out);

/* codes of the dtype table: what the native kernel reads as it is */
#define CODE_OTHER 0
#define CODE_F32 1
#define CODE_F64 2
/* a tensor of at least this many elements is read with the GIL released (the kernel's
   OpenMP threshold: a smaller read is shorter than handing the GIL over and back) */
#define RELEASE_MIN 32768

typedef struct {
    PyObject_HEAD
    PyObject *tensor_types;   /* tuple of exact types */
    PyObject *dtypes;         /* dict */
    PyObject *strided;
    PyObject *reduce;         /* callable(t, kind) -> handle */
    PyObject *slow_value;     /* callable(x, seq, node, kind, direction, slot, index) */
    PyObject *slow_tensor;    /* same signature, a tensor */
    PyObject *leaf_type;
    PyObject *json_float;
    PyObject *float_kind, *int_kind, *opaque_kind, *type_name;
    stats_fn f32, f64;
    /* the step's state, shared with the Python RowBuilder */
    PyObject *rows, *leaves, *handles, *seen, *ids;
    /* prepared gradients (set_prepared): their type, and the step's group -> (handle index,
       tensor id) */
    PyObject *prepared_type, *groups;
    /* the step's statistics as records of 8 doubles, one per leaf whose statistics are read:
       row, is_float, max, min, mean, norm, nan_count, inf_count (for the writer's columns);
       covered: leaves with such a record or with no statistics at all (opaque) */
    PyObject *flat;
    Py_ssize_t covered;
    int tensor_ids;
} Rows;

static PyObject *s_dtype, *s_numel, *s_layout, *s_shape, *s_requires_grad, *s_is_contiguous,
    *s_data_ptr, *s_version, *s_stride, *s_is_cpu, *s_untyped_storage, *s_nbytes,
    *s_storage_offset, *s_itemsize,
    *k_type, *k_dtype, *k_shape, *k_max, *k_min, *k_mean, *k_norm, *k_requires_grad,
    *k_tensor_id, *k_value, *t_int, *t_float, *t_bool, *s_true, *s_false, *one;

/* the object holds the Python RowBuilder's bound methods (which hold this object): GC-aware */
#define ROWS_MEMBERS(X)                                                                      \
    X(tensor_types) X(dtypes) X(strided) X(reduce) X(slow_value) X(slow_tensor)      \
    X(leaf_type) X(json_float) X(float_kind) X(int_kind) X(opaque_kind) X(type_name)           \
    X(rows) X(leaves) X(handles) X(seen) X(ids) X(flat) X(prepared_type) X(groups)

static int Rows_traverse(Rows *self, visitproc visit, void *arg) {
#define VISIT(m) Py_VISIT(self->m);
    ROWS_MEMBERS(VISIT)
#undef VISIT
    return 0;
}

static int Rows_clear(Rows *self) {
#define CLEAR(m) Py_CLEAR(self->m);
    ROWS_MEMBERS(CLEAR)
#undef CLEAR
    return 0;
}

static void Rows_dealloc(Rows *self) {
    PyObject_GC_UnTrack(self);
    Rows_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Rows(tensor_types, dtypes, strided, reduce, slow_value, slow_tensor, leaf_type, json_float,
        kinds=(float, int, opaque), type_name, f32_addr, f64_addr, tensor_ids) */
static int Rows_init(Rows *self, PyObject *args, PyObject *kw) {
    PyObject *o[10];
    unsigned long long f32 = 0, f64 = 0;
    int tensor_ids = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOKKp", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &o[8], &o[9], &f32, &f64, &tensor_ids))
        return -1;
    if (!PyTuple_Check(o[0]) || !PyDict_Check(o[1]) || !PyTuple_Check(o[8]) ||
        PyTuple_GET_SIZE(o[8]) != 3 || !PyType_Check(o[6])) {
        PyErr_SetString(PyExc_TypeError, "Rows: bad arguments");
        return -1;
    }
    Rows_clear(self);
    PyObject **slots[] = {&self->tensor_types, &self->dtypes, &self->strided, &self->reduce,
                          &self->slow_value, &self->slow_tensor, &self->leaf_type,
                          &self->json_float, NULL, &self->type_name};
    for (int k = 0; k < 10; k++) {
        if (slots[k] == NULL) continue;
        Py_INCREF(o[k]);
        *slots[k] = o[k];
    }
    self->float_kind = PyTuple_GET_ITEM(o[8], 0); Py_INCREF(self->float_kind);
    self->int_kind = PyTuple_GET_ITEM(o[8], 1); Py_INCREF(self->int_kind);
    self->opaque_kind = PyTuple_GET_ITEM(o[8], 2); Py_INCREF(self->opaque_kind);
    self->f32 = (stats_fn)(uintptr_t)f32;
    self->f64 = (stats_fn)(uintptr_t)f64;
    self->tensor_ids = tensor_ids;
    return 0;
}

/* reset(rows, leaves, handles, seen, ids, flat): the new step's lists (ids: a one-item list,
   the next id; flat: an empty bytearray for the statistics records) */
static PyObject *Rows_reset(Rows *self, PyObject *args) {
    PyObject *rows, *leaves, *handles, *seen, *ids, *flat;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!", &PyList_Type, &rows, &PyList_Type, &leaves,
                          &PyList_Type, &handles, &PyDict_Type, &seen, &PyList_Type, &ids,
                          &PyByteArray_Type, &flat))
        return NULL;
    if (PyList_GET_SIZE(ids) != 1) {
        PyErr_SetString(PyExc_ValueError, "ids: a list of one int");
        return NULL;
    }
    Py_INCREF(rows); Py_XSETREF(self->rows, rows);
    Py_INCREF(leaves); Py_XSETREF(self->leaves, leaves);
    Py_INCREF(handles); Py_XSETREF(self->handles, handles);
    Py_INCREF(seen); Py_XSETREF(self->seen, seen);
    Py_INCREF(ids); Py_XSETREF(self->ids, ids);
    Py_INCREF(flat); Py_XSETREF(self->flat, flat);
    PyObject *groups = PyDict_New();
    if (groups == NULL) return NULL;
    Py_XSETREF(self->groups, groups);
    self->covered = 0;
    Py_RETURN_NONE;
}

/* set_prepared(type): the type of the gradients the C++ backward capture read
   (engine_adapter/torch_grads.py's PreparedGrad), taken by value() */
static PyObject *Rows_set_prepared(Rows *self, PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "set_prepared: a tuple subclass");
        return NULL;
    }
    Py_INCREF(type);
    Py_XSETREF(self->prepared_type, type);
    Py_RETURN_NONE;
}

static PyObject *Rows_covered(Rows *self, PyObject *unused) {
    return PyLong_FromSsize_t(self->covered);
}

/* one statistics record (see Rows.flat) from a finished handle, as apply_statistics makes
   the columns: an integer tensor's max and min as int() makes them, no mean or norm, counts 0 */
static int append_record(Rows *self, Py_ssize_t row, PyObject *h, Py_ssize_t numel, int is_float) {
    double rec[8];
    Py_ssize_t need = is_float ? 6 : 2;
    if (PyList_GET_SIZE(h) < need) { PyErr_SetString(PyExc_ValueError, "short statistics"); return -1; }
    double v[6] = {0, 0, 0, 0, 0, 0};
    for (Py_ssize_t k = 0; k < need; k++) {
        v[k] = PyFloat_AsDouble(PyList_GET_ITEM(h, k));
        if (v[k] == -1.0 && PyErr_Occurred()) return -1;
    }
    rec[0] = (double)row;
    rec[1] = is_float;
    if (is_float) {
        rec[2] = v[0]; rec[3] = v[1]; rec[4] = v[2] / (double)numel;
        rec[5] = v[3] >= 0 ? sqrt(v[3]) : v[3]; rec[6] = v[4]; rec[7] = v[5];
    } else {
        rec[2] = trunc(v[0]); rec[3] = trunc(v[1]); rec[4] = NAN; rec[5] = NAN; rec[6] = 0; rec[7] = 0;
    }
    Py_ssize_t at = PyByteArray_GET_SIZE(self->flat);
    if (PyByteArray_Resize(self->flat, at + (Py_ssize_t)sizeof rec) < 0) return -1;
    memcpy(PyByteArray_AS_STRING(self->flat) + at, rec, sizeof rec);
    return 0;
}

static PyObject *call_method0(PyObject *obj, PyObject *name) {
    return PyObject_CallMethodNoArgs(obj, name);
}

static int append_steal(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

/* the entry's Max, Min, Mean, Norm from a finished handle (a list of floats), as
   dump_rows._entry_statistics: stats[4] new references */
static int entry_statistics(Rows *self, PyObject *h, Py_ssize_t numel, int is_float, PyObject **st) {
    if (is_float) {
        if (PyList_GET_SIZE(h) < 4) { PyErr_SetString(PyExc_ValueError, "short statistics"); return -1; }
        double v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = PyFloat_AsDouble(PyList_GET_ITEM(h, k));
            if (v[k] == -1.0 && PyErr_Occurred()) return -1;
        }
        double mean = v[2] / (double)numel;
        double norm = v[3] >= 0 ? sqrt(v[3]) : v[3];
        double out[4] = {v[0], v[1], mean, norm};
        int finite = isfinite(v[0] - v[1] + mean + norm);
        for (int k = 0; k < 4; k++) {
            PyObject *f = PyFloat_FromDouble(out[k]);
            if (f == NULL) goto fail;
            if (!finite) {
                PyObject *j = PyObject_CallOneArg(self->json_float, f);
                Py_DECREF(f);
                f = j;
                if (f == NULL) goto fail;
            }
            st[k] = f;
            continue;
        fail:
            for (int j = 0; j < k; j++) Py_CLEAR(st[j]);
            return -1;
        }
        return 0;
    }
    if (PyList_GET_SIZE(h) < 2) { PyErr_SetString(PyExc_ValueError, "short statistics"); return -1; }
    for (int k = 0; k < 2; k++) {
        /* int(v): as Python's int() of a float (raises on NaN/inf, as the Python path does) */
        st[k] = PyNumber_Long(PyList_GET_ITEM(h, k));
        if (st[k] == NULL) { if (k) Py_CLEAR(st[0]); return -1; }
    }
    Py_INCREF(Py_None); st[2] = Py_None;
    Py_INCREF(Py_None); st[3] = Py_None;
    return 0;
}

static PyObject *stats_list(const double *out) {
    PyObject *l = PyList_New(6);
    if (l == NULL) return NULL;
    for (int k = 0; k < 6; k++) {
        PyObject *f = PyFloat_FromDouble(out[k]);
        if (f == NULL) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, k, f);
    }
    return l;
}

/* torch's is_non_overlapping_and_dense from a tensor's shape and strides (tuples of ints):
   1 or 0, -1 with an error set. The dims of size 2 or more, ordered by stride, must have the
   strides of a contiguous tensor of that order. */
static int dense_layout(PyObject *shape, PyObject *stride) {
    Py_ssize_t dim = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
    if (dim < 0 || !PyTuple_Check(stride) || PyTuple_GET_SIZE(stride) != dim || dim > 64) {
        PyErr_SetString(PyExc_RuntimeError, "native rows: unexpected shape or strides");
        return -1;
    }
    long long size[64], st[64];
    int perm[64], n = 0;
    for (Py_ssize_t k = 0; k < dim; k++) {
        size[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, k));
        st[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, k));
        if ((size[k] == -1 || st[k] == -1) && PyErr_Occurred()) return -1;
    }
    if (dim == 1) return size[0] < 2 || st[0] == 1;
    for (int k = 0; k < dim; k++)               /* the dims that matter, by stride */
        if (size[k] >= 2) {
            int j = n++;
            while (j > 0 && st[perm[j - 1]] > st[k]) { perm[j] = perm[j - 1]; j--; }
            perm[j] = k;
        }
    long long require = 1;
    for (int k = 0; k < n; k++) {
        if (st[perm[k]] != require) return 0;
        require *= size[perm[k]];
    }
    return 1;
}

/* the identity key of dump_rows / torch_stats._identity; *dense_out: the tensor covers exactly
   [data_ptr, data_ptr + numel) (contiguous, or dense in another order); NULL with no error:
   no identity (no storage) */
static PyObject *identity_key(Rows *self, PyObject *t, PyObject *dtype, PyObject *numel_obj,
                              PyObject *shape, int *dense_out, PyObject **ptr_out) {
    PyObject *c = NULL, *ptr = NULL, *ver = NULL, *key = NULL, *stride = NULL;
    *dense_out = 0;
    c = call_method0(t, s_is_contiguous);
    if (c == NULL) goto error;
    int dense = PyObject_IsTrue(c);
    Py_DECREF(c);
    if (dense < 0) goto error;
    if (!dense) {
        stride = call_method0(t, s_stride);
        if (stride == NULL) goto error;
        dense = dense_layout(shape, stride);
        if (dense < 0) goto error;
    }
    ptr = call_method0(t, s_data_ptr);
    if (ptr == NULL) goto error;
    ver = PyObject_GetAttr(t, s_version);
    if (ver == NULL) goto error;
    key = dense ? PyTuple_Pack(4, ptr, dtype, numel_obj, ver)
                : PyTuple_Pack(5, ptr, dtype, shape, stride, ver);
    Py_DECREF(ver);
    Py_XDECREF(stride);
    if (key == NULL) { Py_DECREF(ptr); *ptr_out = NULL; return NULL; }
    *dense_out = dense;
    *ptr_out = ptr;
    return key;
error:
    Py_XDECREF(ptr);
    Py_XDECREF(stride);
    *ptr_out = NULL;
    if (PyErr_ExceptionMatches(PyExc_RuntimeError)) {   /* no storage: no identity */
        PyErr_Clear();
        return NULL;
    }
    return NULL;
}

static PyObject *fallback(PyObject *fn, PyObject *const *args) {
    return PyObject_Vectorcall(fn, args, 7, NULL);
}

/* the step's next tensor id (a new reference; None without tensor ids), counted */
static PyObject *next_tensor_id(Rows *self) {
    if (!self->tensor_ids) Py_RETURN_NONE;
    PyObject *next = PyList_GET_ITEM(self->ids, 0);
    PyObject *after = PyNumber_Add(next, one);
    if (after == NULL) return NULL;
    Py_INCREF(next);
    PyList_SetItem(self->ids, 0, after);            /* steals after, lets the list's ref go */
    return next;
}

/* the entry, Leaf, row and statistics record of a value whose handle (or none: -1) and tensor
   id are known: what tensor_value and prepared_value share */
static PyObject *emit_value(Rows *self, PyObject *const *args, PyObject *dtype_name,
                            PyObject *shape_list, PyObject *numel_obj, Py_ssize_t numel,
                            PyObject *rg, PyObject *kind, Py_ssize_t handle_index,
                            PyObject *tensor_id) {
    PyObject *entry = NULL, *result = NULL, *h = NULL, *st[4] = {NULL, NULL, NULL, NULL};
    int filled = 0;
    h = handle_index >= 0 ? PyList_GET_ITEM(self->handles, handle_index) : NULL;
    Py_XINCREF(h);                  /* held while Python may run (json_float, a collection) */
    if (h != NULL && PyList_CheckExact(h)) {
        if (entry_statistics(self, h, numel, kind == self->float_kind, st) < 0) goto done;
        filled = 1;
    } else {
        for (int k = 0; k < 4; k++) { st[k] = Py_None; Py_INCREF(Py_None); }
    }
    entry = PyDict_New();
    if (entry == NULL) goto done;
    if (PyDict_SetItem(entry, k_type, self->type_name) < 0 ||
        PyDict_SetItem(entry, k_dtype, dtype_name) < 0 ||
        PyDict_SetItem(entry, k_shape, shape_list) < 0 ||
        PyDict_SetItem(entry, k_max, st[0]) < 0 || PyDict_SetItem(entry, k_min, st[1]) < 0 ||
        PyDict_SetItem(entry, k_mean, st[2]) < 0 || PyDict_SetItem(entry, k_norm, st[3]) < 0)
        goto done;
    if (rg != Py_None && PyDict_SetItem(entry, k_requires_grad, rg) < 0) goto done;
    if (tensor_id != Py_None && PyDict_SetItem(entry, k_tensor_id, tensor_id) < 0) goto done;

    Py_ssize_t row_index = PyList_GET_SIZE(self->rows);
    {
        PyObject *leaf_args = Py_BuildValue("(OnnnOO)", entry, handle_index, row_index, numel, kind,
                                            filled ? Py_True : Py_False);
        if (leaf_args == NULL) goto done;
        /* tuple.__new__(Leaf, (entry, ...)) */
        PyObject *new_args = PyTuple_Pack(1, leaf_args);
        Py_DECREF(leaf_args);
        if (new_args == NULL) goto done;
        PyObject *leaf = PyTuple_Type.tp_new((PyTypeObject *)self->leaf_type, new_args, NULL);
        Py_DECREF(new_args);
        if (append_steal(self->leaves, leaf) < 0) goto done;
    }
    {
        PyObject *row = PyList_New(14);
        if (row == NULL) goto done;
        PyObject *items[14] = {args[1], args[2], args[3], args[4], args[5], args[6], dtype_name,
                               shape_list, numel_obj, Py_None, Py_None, rg, Py_None, tensor_id};
        for (int k = 0; k < 14; k++) { Py_INCREF(items[k]); PyList_SET_ITEM(row, k, items[k]); }
        if (append_steal(self->rows, row) < 0) goto done;
    }
    /* the leaf and its row are in: its statistics record (the writer's columns), or none to
       gather (opaque); counted only now, so a value that failed halfway leaves the count
       short of the leaves and the writer takes the Python path */
    if (filled) {
        if (append_record(self, row_index, h, numel, kind == self->float_kind) < 0) goto done;
        self->covered++;
    } else if (h == NULL) {
        self->covered++;
    }
    result = entry;
    entry = NULL;
done:
    Py_XDECREF(entry); Py_XDECREF(h);
    for (int k = 0; k < 4; k++) Py_XDECREF(st[k]);
    return result;
}

/* a gradient the C++ backward capture already read (engine_adapter/torch_grads.py's
   PreparedGrad: dtype, shape, numel, requires_grad, statistics, group): the entry and row
   tensor_value makes of the tensor; values of one group (the same bytes in the step) share
   one handle and one tensor id, as tensor_value's identity does */
/* the step's identity table (dump_rows' _seen): 1 and the record's handle index and tensor id
   (a new reference) when `key` is there and its owner lives; 0 when not; -1 with an error */
/* whether `owner` (a storage) still holds the address `key` starts with: 1 yes, 0 no (its
   memory was freed or resized since, as FSDP and ZeRO-3 do: the address may hold other data
   now), -1 an error. An owner that is not a storage (the tensor itself) is taken as holding
   it, as rows.py's _owner_holds does. */
static int owner_holds(PyObject *owner, PyObject *key) {
    PyObject *o = PyObject_GetAttr(owner, s_nbytes);
    if (o == NULL) { PyErr_Clear(); return 1; }
    int storage = PyCallable_Check(o);      /* a storage's nbytes(); a tensor's is a number */
    Py_DECREF(o);
    if (!storage) return 1;
    unsigned long long ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(key, 0));
    if (PyErr_Occurred()) { PyErr_Clear(); return 1; }
    if ((o = call_method0(owner, s_data_ptr)) == NULL) return -1;
    unsigned long long base = PyLong_AsUnsignedLongLong(o);
    Py_DECREF(o);
    if (PyErr_Occurred()) return -1;
    if ((o = call_method0(owner, s_nbytes)) == NULL) return -1;
    unsigned long long nbytes = PyLong_AsUnsignedLongLong(o);
    Py_DECREF(o);
    if (PyErr_Occurred()) return -1;
    return base != 0 && base <= ptr && ptr <= base + nbytes;
}

static int seen_get(Rows *self, PyObject *key, Py_ssize_t *handle_index, PyObject **tensor_id) {
    PyObject *seen = PyDict_GetItemWithError(self->seen, key);     /* borrowed */
    if (seen == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *owner = PyWeakref_GetObject(PyTuple_GET_ITEM(seen, 0));   /* borrowed */
    if (owner == Py_None) return 0;
    Py_INCREF(owner);
    int holds = owner_holds(owner, key);
    Py_DECREF(owner);
    if (holds <= 0) return holds;
    if (PyTuple_GET_ITEM(seen, 2) != Py_None) {    /* a digest: not this path's (md5 task) */
        PyErr_SetString(PyExc_RuntimeError, "native rows: a digest in the seen table");
        return -1;
    }
    *handle_index = PyLong_AsSsize_t(PyTuple_GET_ITEM(seen, 1));
    if (*handle_index == -1 && PyErr_Occurred()) return -1;
    *tensor_id = PyTuple_GET_ITEM(seen, 3);
    Py_INCREF(*tensor_id);
    return 1;
}

/* put `key` into the step's identity table: (owner, weakly; handle index; no digest; tensor id) */
static int seen_put(Rows *self, PyObject *key, PyObject *owner, Py_ssize_t handle_index,
                    PyObject *tensor_id) {
    PyObject *ref = PyWeakref_NewRef(owner, NULL);
    if (ref == NULL) return -1;
    PyObject *rec = Py_BuildValue("(NnOO)", ref, handle_index, Py_None, tensor_id);
    if (rec == NULL) return -1;
    int r = PyDict_SetItem(self->seen, key, rec);
    Py_DECREF(rec);
    return r;
}

static PyObject *prepared_value(Rows *self, PyObject *x, PyObject *const *args) {
    Py_ssize_t items = PyTuple_GET_SIZE(x);
    if (items != 6 && items != 8) {
        PyErr_SetString(PyExc_ValueError, "native rows: a prepared gradient has 6 or 8 items");
        return NULL;
    }
    PyObject *dtype = PyTuple_GET_ITEM(x, 0), *shape = PyTuple_GET_ITEM(x, 1),
             *numel_obj = PyTuple_GET_ITEM(x, 2), *rg = PyTuple_GET_ITEM(x, 3),
             *stats = PyTuple_GET_ITEM(x, 4), *group = PyTuple_GET_ITEM(x, 5);
    /* 8 items: the tensor's identity key and the key's owner, found in (and put into) the
       step's identity table with the tensors read here; 6: a group of prepared values */
    PyObject *key = items == 8 ? PyTuple_GET_ITEM(x, 6) : Py_None;
    PyObject *info = PyDict_GetItemWithError(self->dtypes, dtype);     /* borrowed */
    if (info == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "native rows: unknown dtype");
        return NULL;
    }
    PyObject *dtype_name = PyTuple_GET_ITEM(info, 0), *kind = PyTuple_GET_ITEM(info, 1);
    Py_ssize_t numel = PyLong_AsSsize_t(numel_obj);
    if (numel == -1 && PyErr_Occurred()) return NULL;
    PyObject *shape_list = NULL, *tensor_id = NULL, *result = NULL;
    Py_ssize_t handle_index;
    shape_list = PySequence_List(shape);
    if (shape_list == NULL) return NULL;
    int found = 0;
    PyObject *known = NULL;
    if (key != Py_None) {
        found = seen_get(self, key, &handle_index, &tensor_id);
        if (found < 0) goto done;
    } else {
        known = PyDict_GetItemWithError(self->groups, group);     /* borrowed */
        if (known == NULL && PyErr_Occurred()) goto done;
        if (known != NULL) {
            handle_index = PyLong_AsSsize_t(PyTuple_GET_ITEM(known, 0));
            if (handle_index == -1 && PyErr_Occurred()) goto done;
            tensor_id = PyTuple_GET_ITEM(known, 1);
            Py_INCREF(tensor_id);
            found = 1;
        }
    }
    if (!found) {
        handle_index = PyList_GET_SIZE(self->handles);
        if (PyList_Append(self->handles, stats) < 0) goto done;
        tensor_id = next_tensor_id(self);
        if (tensor_id == NULL) goto done;
        if (key != Py_None) {
            if (seen_put(self, key, PyTuple_GET_ITEM(x, 7), handle_index, tensor_id) < 0) goto done;
        } else {
            PyObject *rec = Py_BuildValue("(nO)", handle_index, tensor_id);
            if (rec == NULL) goto done;
            int r = PyDict_SetItem(self->groups, group, rec);
            Py_DECREF(rec);
            if (r < 0) goto done;
        }
    }
    result = emit_value(self, args, dtype_name, shape_list, numel_obj, numel, rg, kind,
                        handle_index, tensor_id);
done:
    Py_XDECREF(shape_list); Py_XDECREF(tensor_id);
    return result;
}

/* whether the bytes of t, a dense tensor of numel elements, lie in memory its storage holds:
   1 yes (*storage_out: the storage, a new reference), 0 no (a storage freed or resized to
   0 bytes, as FSDP and ZeRO-3 do with sharded parameters between uses; a meta tensor: no
   memory), -1 an error. A tensor that fails is handed to the Python path, which says why in
   its entry (torch_stats.readable): never read here */
static int storage_ok(PyObject *t, PyObject *dtype, Py_ssize_t numel, long code,
                      PyObject **storage_out) {
    PyObject *storage = NULL, *o = NULL;
    long long nbytes, offset, itemsize, base;
    *storage_out = NULL;
    storage = call_method0(t, s_untyped_storage);
    if (storage == NULL) goto no;
    o = call_method0(storage, s_nbytes);
    if (o == NULL) goto no;
    nbytes = PyLong_AsLongLong(o);
    Py_DECREF(o);
    if (nbytes == -1 && PyErr_Occurred()) goto no;
    o = call_method0(storage, s_data_ptr);
    if (o == NULL) goto no;
    base = PyLong_AsLongLong(o);
    Py_DECREF(o);
    if (base == -1 && PyErr_Occurred()) goto no;
    o = call_method0(t, s_storage_offset);
    if (o == NULL) goto no;
    offset = PyLong_AsLongLong(o);
    Py_DECREF(o);
    if (offset == -1 && PyErr_Occurred()) goto no;
    if (code == CODE_F32) itemsize = 4;
    else if (code == CODE_F64) itemsize = 8;
    else {
        o = PyObject_GetAttr(dtype, s_itemsize);
        if (o == NULL) goto no;
        itemsize = PyLong_AsLongLong(o);
        Py_DECREF(o);
        if (itemsize == -1 && PyErr_Occurred()) goto no;
    }
    if (base == 0 || offset < 0 || (offset + (long long)numel) * itemsize > nbytes) {
        Py_DECREF(storage);
        return 0;
    }
    *storage_out = storage;
    return 1;
no:
    Py_XDECREF(storage);
    if (PyErr_ExceptionMatches(PyExc_RuntimeError) || PyErr_ExceptionMatches(PyExc_NotImplementedError) ||
        PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();          /* no storage to ask: the Python path says so */
        return 0;
    }
    return -1;
}

static PyObject *tensor_value(Rows *self, PyObject *t, PyObject *const *args) {
    PyObject *dtype = NULL, *numel_obj = NULL, *layout = NULL, *shape = NULL, *shape_list = NULL,
             *rg = NULL, *key = NULL, *ptr = NULL, *handle = NULL, *tensor_id = NULL,
             *result = NULL, *storage = NULL;
    PyObject *info, *dtype_name, *kind;
    Py_ssize_t handle_index = -1;
    int dense = 0;

    dtype = PyObject_GetAttr(t, s_dtype);
    if (dtype == NULL) return NULL;
    info = PyDict_GetItemWithError(self->dtypes, dtype);     /* borrowed */
    if (info == NULL) {
        Py_DECREF(dtype);
        if (PyErr_Occurred()) return NULL;
        return fallback(self->slow_tensor, args);             /* a dtype the table lacks */
    }
    dtype_name = PyTuple_GET_ITEM(info, 0);
    kind = PyTuple_GET_ITEM(info, 1);
    long code = PyLong_AsLong(PyTuple_GET_ITEM(info, 2));
    numel_obj = call_method0(t, s_numel);
    if (numel_obj == NULL) goto done;
    Py_ssize_t numel = PyLong_AsSsize_t(numel_obj);
    if (numel == -1 && PyErr_Occurred()) goto done;
    layout = PyObject_GetAttr(t, s_layout);
    if (layout == NULL) goto done;
    if (numel == 0 || layout != self->strided) kind = self->opaque_kind;
    shape = PyObject_GetAttr(t, s_shape);
    if (shape == NULL) goto done;
    shape_list = PySequence_List(shape);
    if (shape_list == NULL) goto done;
    rg = PyObject_GetAttr(t, s_requires_grad);
    if (rg == NULL) goto done;
    key = identity_key(self, t, dtype, numel_obj, shape, &dense, &ptr);
    if (key == NULL && PyErr_Occurred()) goto done;

    int found = key != NULL ? seen_get(self, key, &handle_index, &tensor_id) : 0;
    if (found < 0) goto done;
    if (!found) {
        if (kind != self->opaque_kind) {
            /* read only bytes that are there; a tensor that is not dense, or whose storage
               is freed or too short, goes to the Python path (which checks it and says why) */
            int ok = dense ? storage_ok(t, dtype, numel, code, &storage) : 0;
            if (ok < 0) goto done;
            if (!ok) { result = fallback(self->slow_tensor, args); goto done; }
            handle_index = PyList_GET_SIZE(self->handles);
            stats_fn fn = code == CODE_F32 ? self->f32 : code == CODE_F64 ? self->f64 : NULL;
            /* a dense tensor's values are the block [data_ptr, + numel) in some order: read
               as they lie (the statistics do not depend on the order), no contiguous copy */
            int native = fn != NULL && dense && ptr != NULL && kind == self->float_kind;
            if (native) {
                PyObject *cpu = PyObject_GetAttr(t, s_is_cpu);
                if (cpu == NULL) goto done;
                native = cpu == Py_True;
                Py_DECREF(cpu);
            }
            if (native) {
                void *data = PyLong_AsVoidPtr(ptr);
                if (data == NULL && PyErr_Occurred()) goto done;
                double out[6];
                if (numel >= RELEASE_MIN) {
                    Py_BEGIN_ALLOW_THREADS
                    fn(data, (int64_t)numel, out);
                    Py_END_ALLOW_THREADS
                } else {
                    fn(data, (int64_t)numel, out);
                }
                handle = stats_list(out);
            } else {
                handle = PyObject_CallFunctionObjArgs(self->reduce, t, kind, NULL);
            }
            if (handle == NULL || PyList_Append(self->handles, handle) < 0) goto done;
        }
        if (key != NULL) {
            tensor_id = next_tensor_id(self);
            if (tensor_id == NULL) goto done;
            PyObject *owner = storage != NULL ? (Py_INCREF(storage), storage)
                                              : call_method0(t, s_untyped_storage);
            if (owner == NULL) {
                if (!(PyErr_ExceptionMatches(PyExc_RuntimeError) ||
                      PyErr_ExceptionMatches(PyExc_NotImplementedError) ||
                      PyErr_ExceptionMatches(PyExc_TypeError)))
                    goto done;
                PyErr_Clear();
                owner = t; Py_INCREF(owner);
            }
            int r = seen_put(self, key, owner, handle_index, tensor_id);
            Py_DECREF(owner);
            if (r < 0) goto done;
        }
    }
    if (tensor_id == NULL) { tensor_id = Py_None; Py_INCREF(tensor_id); }
    result = emit_value(self, args, dtype_name, shape_list, numel_obj, numel, rg, kind,
                        handle_index, tensor_id);
done:
    Py_XDECREF(dtype); Py_XDECREF(numel_obj); Py_XDECREF(layout); Py_XDECREF(shape);
    Py_XDECREF(shape_list); Py_XDECREF(rg); Py_XDECREF(key); Py_XDECREF(ptr);
    Py_XDECREF(handle); Py_XDECREF(tensor_id); Py_XDECREF(storage);
    return result;
}

/* an exact int, bool or finite float: RowBuilder._scalar's entry and row */
static PyObject *scalar_value(Rows *self, PyObject *x, PyObject *type_name, PyObject *text,
                              PyObject *const *args) {
    PyObject *entry = PyDict_New();
    if (entry == NULL) { Py_DECREF(text); return NULL; }
    if (PyDict_SetItem(entry, k_type, type_name) < 0 || PyDict_SetItem(entry, k_value, x) < 0) {
        Py_DECREF(entry); Py_DECREF(text); return NULL;
    }
    PyObject *row = PyList_New(14);
    if (row == NULL) { Py_DECREF(entry); Py_DECREF(text); return NULL; }
    PyObject *items[14] = {args[1], args[2], args[3], args[4], args[5], args[6], type_name,
                           Py_None, Py_None, Py_None, Py_None, Py_None, text, Py_None};
    for (int k = 0; k < 14; k++) { Py_INCREF(items[k]); PyList_SET_ITEM(row, k, items[k]); }
    Py_DECREF(text);
    if (append_steal(self->rows, row) < 0) { Py_DECREF(entry); return NULL; }
    return entry;
}

/* value(x, seq, node, kind, direction, slot, index): RowBuilder.value */
static PyObject *Rows_value(Rows *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "value() takes 7 arguments");
        return NULL;
    }
    if (self->rows == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "value() before reset()");
        return NULL;
    }
    PyObject *x = args[0];
    PyTypeObject *tx = Py_TYPE(x);
    Py_ssize_t n = PyTuple_GET_SIZE(self->tensor_types);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)tx == PyTuple_GET_ITEM(self->tensor_types, i)) return tensor_value(self, x, args);
    if (x == Py_None) Py_RETURN_NONE;
    if ((PyObject *)tx == self->prepared_type) return prepared_value(self, x, args);
    if (tx == &PyBool_Type) {
        PyObject *text = x == Py_True ? s_true : s_false;
        Py_INCREF(text);
        return scalar_value(self, x, t_bool, text, args);
    }
    if (tx == &PyLong_Type) {
        PyObject *text = PyLong_Type.tp_repr(x);
        if (text == NULL) return NULL;
        return scalar_value(self, x, t_int, text, args);
    }
    if (tx == &PyFloat_Type && isfinite(PyFloat_AS_DOUBLE(x))) {
        PyObject *text = PyFloat_Type.tp_repr(x);
        if (text == NULL) return NULL;
        return scalar_value(self, x, t_float, text, args);
    }
    return fallback(self->slow_value, args);
}

static PyMethodDef Rows_methods[] = {
    {"value", (PyCFunction)(void (*)(void))Rows_value, METH_FASTCALL,
     "value(x, seq, node, kind, direction, slot, index): the JSON entry of x, its rows recorded"},
    {"reset", (PyCFunction)Rows_reset, METH_VARARGS,
     "reset(rows, leaves, handles, seen, ids, flat): the lists of a new step"},
    {"set_prepared", (PyCFunction)Rows_set_prepared, METH_O,
     "set_prepared(type): value() takes instances of type as gradients already read"},
    {"covered", (PyCFunction)Rows_covered, METH_NOARGS,
     "covered(): the step's leaves whose statistics are in flat, or that have none"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "probe.dumper._rows_native.Rows",
    .tp_basicsize = sizeof(Rows),
    .tp_dealloc = (destructor)Rows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Rows_traverse,
    .tp_clear = (inquiry)Rows_clear,
    .tp_doc = "The native half of probe.dumper.rows.RowBuilder.",
    .tp_methods = Rows_methods,
    .tp_init = (initproc)Rows_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows_native",
    "The dump's row building for plain tensors and scalars (see dumper/rows.py).", -1, NULL,
};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;

PyMODINIT_FUNC PyInit__rows_native(void) {
    INTERN(s_dtype, "dtype") INTERN(s_numel, "numel") INTERN(s_layout, "layout")
    INTERN(s_shape, "shape") INTERN(s_requires_grad, "requires_grad")
    INTERN(s_is_contiguous, "is_contiguous") INTERN(s_data_ptr, "data_ptr")
    INTERN(s_version, "_version") INTERN(s_stride, "stride") INTERN(s_is_cpu, "is_cpu")
    INTERN(s_untyped_storage, "untyped_storage") INTERN(s_nbytes, "nbytes")
    INTERN(s_storage_offset, "storage_offset") INTERN(s_itemsize, "itemsize")
    INTERN(k_type, "type") INTERN(k_dtype, "dtype") INTERN(k_shape, "shape") INTERN(k_max, "Max")
    INTERN(k_min, "Min") INTERN(k_mean, "Mean") INTERN(k_norm, "Norm")
    INTERN(k_requires_grad, "requires_grad") INTERN(k_tensor_id, "tensor_id")
    INTERN(k_value, "value") INTERN(t_int, "int") INTERN(t_float, "float") INTERN(t_bool, "bool")
    INTERN(s_true, "true") INTERN(s_false, "false")
    if ((one = PyLong_FromLong(1)) == NULL) return NULL;
    if (PyType_Ready(&RowsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RowsType);
    if (PyModule_AddObject(m, "Rows", (PyObject *)&RowsType) < 0) {
        Py_DECREF(&RowsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
