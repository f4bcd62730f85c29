/* The module dump's backward capture without the interpreter: autograd hooks in C++.
 *
 * engine_adapter/torch_grads.py builds this file once per machine (against the torch it runs)
 * and imports it as the extension module _torch_grads; its functions are called with the GIL
 * held, the hooks run on autograd's threads without it.
 *
 * The Python capture (engine_adapter/torch_adapter.py: a pre-hook on each module output's
 * autograd node, a post-hook on the view node each module input goes through, a hook on each
 * parameter; here a pre-hook on its AccumulateGrad node) calls into Python from autograd ~75 times a step of a small model, and each call
 * takes the GIL that the dump's writer thread holds while it writes the last step. Here the
 * same hooks read a CPU floating gradient's statistics (the kernel of
 * engine_adapter/stats_kernel.c, by address, on the data where it lies when it is float32 or
 * float64 and dense) and queue an event; the backward pass runs
 * without the GIL, and Python replays the events in order (torch_grads.NativeGrads.drain) into
 * the same handlers the Python hooks call, with a PreparedGrad (dtype, shape, numel,
 * requires_grad, statistics, group) in place of the tensor. Any other gradient (on another
 * device, no elements, not floating) is queued as the tensor itself and replayed at once, with
 * the events before it, under the GIL: the Python path's work, in the same order.
 *
 * A group names the data of a gradient in the step: two events with the same address, dtype,
 * element count, version (and shape and strides, for a tensor that is not dense) while the
 * first one's storage lives are the same data (one statistics handle, one tensor id), as
 * dumper/rows.py's identity does for what it reads.
 */
#include <Python.h>

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

using torch::autograd::FunctionPostHook;
using torch::autograd::FunctionPreHook;
using torch::autograd::variable_list;

namespace {

typedef void (*stats_fn)(const void *x, int64_t n, double *out);

enum Kind : int32_t { CALL = 0, PARAM = 1 };
enum State : int32_t { UNDEFINED = 0, PREPARED = 1, TENSOR = 2 };

struct Event {
    int32_t kind;
    int64_t id;
    int32_t state;
    at::ScalarType dtype;
    std::vector<int64_t> sizes;
    int64_t numel;
    bool requires_grad;
    double stats[6];
    int64_t group;
    at::Tensor tensor;   /* TENSOR only: replayed by Python */
};

/* what torch::autograd::impl::grad_accumulator gives (a shared or an intrusive pointer) */
using AccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor &>()));

using Key = std::tuple<const void *, int, int64_t, int64_t, std::vector<int64_t>>;

struct Read {
    int64_t group;
    double stats[6];
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    Read(int64_t group, const double *read, c10::weak_intrusive_ptr<c10::StorageImpl> storage)
        : group(group), storage(std::move(storage)) {
        std::copy(read, read + 6, stats);
    }
};

struct State_ {
    std::mutex lock;
    std::vector<Event> events;
    /* the step's gradients read: identity -> (group, statistics, the storage, weakly) */
    std::map<Key, Read> groups;
    int64_t next_group = 0;
    stats_fn f32 = nullptr, f64 = nullptr;
    PyObject *prepared_type = nullptr;   /* PreparedGrad */
    PyObject *on_tensor = nullptr;       /* drain(): replay now (a TENSOR event is queued) */
    PyObject *on_first = nullptr;        /* backward_started(): the step's first event */
    std::atomic<int> active{0};
    std::atomic<int> fired{0};
    std::atomic<int64_t> pending{0};    /* events queued, not taken */
    /* watched parameters: id -> (their AccumulateGrad node, kept alive; the hook's switch) */
    std::map<int64_t, std::pair<AccumulatorPtr, std::shared_ptr<std::atomic<bool>>>> params;
};

/* never destroyed: at process exit, after the interpreter is gone, releasing a kept
   AccumulateGrad node (and its parameter) or a queued tensor must not run */
State_ &S = *new State_();

}  // namespace

namespace {

void call_python(PyObject *fn) {
    if (fn == nullptr || !Py_IsInitialized()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == nullptr) PyErr_WriteUnraisable(fn);
    Py_XDECREF(r);
    PyGILState_Release(gil);
}

/* a gradient read here: a CPU floating tensor with elements (float32/float64 as they lie,
   another float type through a float32 copy, a tensor that is not dense through a contiguous
   copy: what torch_stats._reduce_host reads) */
/* whether g's bytes lie in memory its storage holds: not a tensor subclass with its own
   dispatch (a DTensor: no memory of its own), not a storage freed or resized below g's extent
   (FSDP and ZeRO-3 free sharded parameters' storage so). A gradient that fails is handed to
   Python as it is, whose statistics path checks it again and says why it is not read
   (torch_stats.readable). */
bool in_storage(const at::Tensor &g) {
    if (g.unsafeGetTensorImpl()->is_python_dispatch() || !g.has_storage()) return false;
    const c10::Storage &storage = g.storage();
    if (storage.data() == nullptr) return false;
    int64_t extent = g.storage_offset() + 1;
    auto sz = g.sizes();
    auto st = g.strides();
    for (size_t i = 0; i < sz.size(); ++i) extent += (sz[i] - 1) * st[i];
    return extent * static_cast<int64_t>(g.element_size()) <= static_cast<int64_t>(storage.nbytes());
}

bool readable(const at::Tensor &g) {
    return S.f32 != nullptr && S.f64 != nullptr && S.prepared_type != nullptr && g.is_cpu() &&
           g.layout() == at::kStrided && g.numel() > 0 && at::isFloatingType(g.scalar_type()) &&
           in_storage(g);
}

void read_statistics(const at::Tensor &g, double *out) {
    at::NoGradGuard no_grad;            /* (a create_graph backward: no graph for the copies) */
    at::Tensor x = g;
    at::ScalarType t = x.scalar_type();
    if (t != at::kFloat && t != at::kDouble) x = x.to(at::kFloat);
    /* a dense tensor's values are the block [data_ptr, + numel) in some order */
    if (!x.is_non_overlapping_and_dense()) x = x.contiguous();
    (x.scalar_type() == at::kFloat ? S.f32 : S.f64)(x.const_data_ptr(), x.numel(), out);
}

/* the identity of dumper/rows.py: a dense tensor by its block, another by its layout too */
Key key_of(const at::Tensor &g) {
    Key key{g.const_data_ptr(), static_cast<int>(g.scalar_type()), g.numel(), g._version(), {}};
    if (!g.is_non_overlapping_and_dense()) {
        auto &layout = std::get<4>(key);
        auto sz = g.sizes();
        auto st = g.strides();
        layout.assign(sz.begin(), sz.end());
        layout.insert(layout.end(), st.begin(), st.end());
    }
    return key;
}

/* the statistics of g, a readable gradient, and its group: read once a step (a gradient is
   often the gradient of one call's output and of the next call's input: the same bytes) */
int64_t read_once(const at::Tensor &g, double *out) {
    Key key = key_of(g);
    {
        std::lock_guard<std::mutex> hold(S.lock);
        auto it = S.groups.find(key);
        if (it != S.groups.end() && !it->second.storage.expired()) {
            std::copy(it->second.stats, it->second.stats + 6, out);
            return it->second.group;
        }
    }
    read_statistics(g, out);
    std::lock_guard<std::mutex> hold(S.lock);
    int64_t group = S.next_group++;
    S.groups.insert_or_assign(std::move(key), Read(group, out, g.storage().getWeakStorageImpl()));
    return group;
}

void record(int32_t kind, int64_t id, const at::Tensor &g) {
    if (!S.active.load(std::memory_order_relaxed)) return;
    if (S.fired.exchange(1) == 0) call_python(S.on_first);
    Event e;
    e.kind = kind;
    e.id = id;
    e.numel = 0;
    e.requires_grad = false;
    e.group = -1;
    e.dtype = at::ScalarType::Undefined;
    bool slow = false;
    if (!g.defined()) {
        e.state = UNDEFINED;
    } else if (readable(g)) {
        e.state = PREPARED;
        e.dtype = g.scalar_type();
        e.sizes = g.sizes().vec();
        e.numel = g.numel();
        e.requires_grad = g.requires_grad();
        e.group = read_once(g, e.stats);
        std::lock_guard<std::mutex> hold(S.lock);
        S.events.push_back(std::move(e));
        S.pending.store(static_cast<int64_t>(S.events.size()));
        return;
    } else {
        e.state = TENSOR;
        e.tensor = g;
        slow = true;
    }
    {
        std::lock_guard<std::mutex> hold(S.lock);
        S.events.push_back(std::move(e));
        S.pending.store(static_cast<int64_t>(S.events.size()));
    }
    if (slow) call_python(S.on_tensor);
}

/* the gradient of output `slot` of a node (a module output's autograd node) */
struct OutputHook : FunctionPreHook {
    int64_t id;
    size_t slot;
    OutputHook(int64_t id, size_t slot) : id(id), slot(slot) {}
    variable_list operator()(const variable_list &grads) override {
        if (slot < grads.size()) record(CALL, id, grads[slot]);
        return grads;
    }
};

/* the gradient a view node hands back to its input (a module input's gradient) */
struct InputHook : FunctionPostHook {
    int64_t id;
    explicit InputHook(int64_t id) : id(id) {}
    variable_list operator()(const variable_list &outputs, const variable_list &) override {
        if (!outputs.empty()) record(CALL, id, outputs[0]);
        return outputs;
    }
};

/* the gradients of a call's inputs where the nodes the call made take them (no node added:
   torch_api.capture_edges): input j's contributions are added up here, in the order they come,
   and handed to done(j, total) once all `expected[j]` are in (queued as an event, or to a
   Python function: capture_edges and capture_edges_calling) */
struct EdgeSum {
    std::mutex lock;
    std::vector<int> expected, waiting;
    std::vector<at::Tensor> total;
    std::function<void(size_t, const at::Tensor &)> done;
    EdgeSum(std::vector<int> counts, std::function<void(size_t, const at::Tensor &)> done)
        : expected(counts), waiting(counts), total(counts.size()), done(std::move(done)) {}
    void add(size_t j, const at::Tensor &g) {
        at::Tensor complete;
        {
            std::lock_guard<std::mutex> hold(lock);
            if (g.defined()) {
                if (!total[j].defined()) {
                    total[j] = g;
                } else {
                    at::NoGradGuard no_grad;
                    total[j] = total[j] + g;
                }
            }
            if (--waiting[j] > 0) return;
            complete = std::move(total[j]);
            total[j] = at::Tensor();
            waiting[j] = expected[j];          /* ready for another backward (a retained graph) */
        }
        done(j, complete);
    }
};

struct EdgeHook : FunctionPostHook {
    std::shared_ptr<EdgeSum> sum;
    std::vector<std::pair<size_t, size_t>> edges;     /* (next edge of the node, input) */
    EdgeHook(std::shared_ptr<EdgeSum> sum, std::vector<std::pair<size_t, size_t>> edges)
        : sum(std::move(sum)), edges(std::move(edges)) {}
    variable_list operator()(const variable_list &outputs, const variable_list &) override {
        for (auto &[i, j] : edges) sum->add(j, i < outputs.size() ? outputs[i] : at::Tensor());
        return outputs;
    }
};

/* a parameter's gradient as the optimizer will read it: its .grad once its AccumulateGrad node
   has added the incoming gradient (msprobe's parameters_grad: under gradient accumulation the
   N-th micro-batch's entry holds the sum of the first N+1), until its watch is removed. A
   post-hook: the node owns it, so `acc` outlives it. */
struct ParamHook : FunctionPostHook {
    int64_t id;
    std::shared_ptr<std::atomic<bool>> on;
    torch::autograd::AccumulateGrad *acc;
    ParamHook(int64_t id, std::shared_ptr<std::atomic<bool>> on, torch::autograd::AccumulateGrad *acc)
        : id(id), on(std::move(on)), acc(acc) {}
    variable_list operator()(const variable_list &outputs, const variable_list &) override {
        if (on->load(std::memory_order_relaxed) && acc->variable.defined())
            record(PARAM, id, acc->variable.grad());
        return outputs;
    }
};

/* a tuple of ints (a shape, strides); a list of the 6 statistics: new references, or null */
PyObject *int_tuple(c10::IntArrayRef values) {
    PyObject *out = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
    if (out == nullptr) return nullptr;
    for (size_t k = 0; k < values.size(); k++) {
        PyObject *n = PyLong_FromLongLong(values[k]);
        if (n == nullptr) { Py_DECREF(out); return nullptr; }
        PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(k), n);
    }
    return out;
}

PyObject *statistics_list(const double *stats) {
    PyObject *out = PyList_New(6);
    if (out == nullptr) return nullptr;
    for (int k = 0; k < 6; k++) {
        PyObject *v = PyFloat_FromDouble(stats[k]);
        if (v == nullptr) { Py_DECREF(out); return nullptr; }
        PyList_SET_ITEM(out, k, v);
    }
    return out;
}

/* ------------------------------------------------- hooks that call Python as they fire
   (the API level's capture, and the module level's where the gradients are not read here): the
   calls a Python hook registered with grad_fn.register_hook / register_prehook makes, without
   registration's Python (a handle object, a dict) and without wrapping every gradient of the
   node into tuples when one fires: fn(index, grad) with the one gradient it watches. An
   exception in fn goes up through backward, as from a Python hook. */
/* a PreparedGrad of g, a readable gradient whose statistics are `stats`, identified as
   dumper/rows.py identifies a tensor: (dtype, shape, numel, requires_grad, statistics, -1,
   its identity key, the key's owner: its storage's Python object). The row builder finds it in
   the step's identity table with the tensors read there (a parameter's gradient that autograd
   hands to .grad as it is, read again by the optimizer, is one tensor id). Under the GIL. */
PyObject *keyed_prepared(const at::Tensor &g, const double *stats) {
    PyObject *dtype = reinterpret_cast<PyObject *>(torch::getTHPDtype(g.scalar_type()));
    PyObject *shape = int_tuple(g.sizes());
    if (shape == nullptr) return nullptr;
    PyObject *key = nullptr;
    if (g.is_non_overlapping_and_dense()) {
        key = Py_BuildValue("(NOLL)", PyLong_FromVoidPtr(const_cast<void *>(g.const_data_ptr())),
                            dtype, static_cast<long long>(g.numel()),
                            static_cast<long long>(g._version()));
    } else {
        PyObject *stride = int_tuple(g.strides());
        if (stride == nullptr) { Py_DECREF(shape); return nullptr; }
        key = Py_BuildValue("(NOONL)", PyLong_FromVoidPtr(const_cast<void *>(g.const_data_ptr())),
                            dtype, shape, stride, static_cast<long long>(g._version()));
    }
    if (key == nullptr) { Py_DECREF(shape); return nullptr; }
    PyObject *owner = torch::createPyObject(g.storage());
    if (owner == nullptr) { Py_DECREF(shape); Py_DECREF(key); return nullptr; }
    PyObject *list = statistics_list(stats);
    if (list == nullptr) { Py_DECREF(shape); Py_DECREF(key); Py_DECREF(owner); return nullptr; }
    PyObject *inner = Py_BuildValue("(ONLONiNN)", dtype, shape, static_cast<long long>(g.numel()),
                                    g.requires_grad() ? Py_True : Py_False, list, -1, key, owner);
    if (inner == nullptr) return nullptr;
    PyObject *value = PyObject_CallOneArg(S.prepared_type, inner);
    Py_DECREF(inner);
    return value;
}

/* what a hook calling Python hands over for gradient g: a keyed PreparedGrad when `prepare`
   and g is readable (its statistics read before the GIL is taken), else the tensor (None when
   undefined). Called without the GIL; returns under it (gil: to release), or null with a
   Python error set. */
PyObject *handed_over(const at::Tensor &g, bool prepare, PyGILState_STATE *gil) {
    if (prepare && g.defined() && readable(g)) {
        double stats[6];
        read_once(g, stats);
        *gil = PyGILState_Ensure();
        return keyed_prepared(g, stats);
    }
    *gil = PyGILState_Ensure();
    return THPVariable_Wrap(g);
}

/* fn(index, what handed_over gives for grad), from a hook (without the GIL); an exception in
   fn goes up through backward */
void call_fn(PyObject *fn, long index, bool prepare, const at::Tensor &grad) {
    PyGILState_STATE gil;
    PyObject *r = nullptr;
    PyObject *g = handed_over(grad, prepare, &gil);
    if (g != nullptr) {
        PyObject *i = PyLong_FromLong(index);
        if (i != nullptr) {
            PyObject *args[2] = {i, g};
            r = PyObject_Vectorcall(fn, args, 2, nullptr);
            Py_DECREF(i);
        }
        Py_DECREF(g);
    }
    if (r != nullptr) {
        Py_DECREF(r);
        PyGILState_Release(gil);
        return;
    }
    python_error err;
    err.persist();
    PyGILState_Release(gil);
    throw std::move(err);
}

struct PyCallback {
    PyObject *fn;
    long index;
    bool prepare;
    PyCallback(PyObject *f, long i, bool p) : fn(f), index(i), prepare(p) { Py_INCREF(fn); }
    PyCallback(const PyCallback &) = delete;
    PyCallback &operator=(const PyCallback &) = delete;
    ~PyCallback() {
        if (!Py_IsInitialized()) return;       /* at process exit: let it go unreleased */
        PyGILState_STATE gil = PyGILState_Ensure();
        Py_DECREF(fn);
        PyGILState_Release(gil);
    }
    void operator()(const at::Tensor &grad) const { call_fn(fn, index, prepare, grad); }
};

/* fn(index, gradient of output `slot` of the node) */
struct PyOutputHook : FunctionPreHook {
    PyCallback call;
    size_t slot;
    PyOutputHook(PyObject *fn, long index, size_t slot, bool prepare)
        : call(fn, index, prepare), slot(slot) {}
    variable_list operator()(const variable_list &grads) override {
        if (slot < grads.size()) call(grads[slot]);
        return grads;
    }
};

/* fn(index, the gradient a view node hands back to its input) */
struct PyInputHook : FunctionPostHook {
    PyCallback call;
    PyInputHook(PyObject *fn, long index, bool prepare) : call(fn, index, prepare) {}
    variable_list operator()(const variable_list &outputs, const variable_list &) override {
        if (!outputs.empty()) call(outputs[0]);
        return outputs;
    }
};

PyObject *value_of(Event &e) {
    if (e.state == UNDEFINED) Py_RETURN_NONE;
    if (e.state == TENSOR) return THPVariable_Wrap(std::move(e.tensor));
    PyObject *shape = int_tuple(e.sizes);
    if (shape == nullptr) return nullptr;
    PyObject *stats = statistics_list(e.stats);
    if (stats == nullptr) { Py_DECREF(shape); return nullptr; }
    PyObject *dtype = reinterpret_cast<PyObject *>(torch::getTHPDtype(e.dtype));
    PyObject *inner = Py_BuildValue("(OOLOOL)", dtype, shape, static_cast<long long>(e.numel),
                                    e.requires_grad ? Py_True : Py_False, stats,
                                    static_cast<long long>(e.group));
    Py_DECREF(shape);
    Py_DECREF(stats);
    if (inner == nullptr) return nullptr;
    PyObject *value = PyObject_CallOneArg(S.prepared_type, inner);
    Py_DECREF(inner);
    return value;
}

const at::Tensor *tensor_of(PyObject *t) {
    if (!THPVariable_Check(t)) {
        PyErr_SetString(PyExc_TypeError, "torch_grads: not a tensor");
        return nullptr;
    }
    return &THPVariable_Unpack(t);
}

}  // namespace

namespace {

/* ------------------------------------------------------------------ the module's functions */

bool int_arg(PyObject *o, long long *out) {
    *out = PyLong_AsLongLong(o);
    return !(*out == -1 && PyErr_Occurred());
}

#define ARGS(n)                                                                              \
    if (nargs != (n)) {                                                                      \
        PyErr_Format(PyExc_TypeError, "takes %d arguments (%zd given)", (n), nargs);         \
        return nullptr;                                                                      \
    }

/* the arguments (t, id) of watch_param: t's tensor, or null (an error set) */
const at::Tensor *tensor_and_id(PyObject *const *args, Py_ssize_t nargs, long long *id) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "takes 2 arguments (%zd given)", nargs);
        return nullptr;
    }
    const at::Tensor *v = tensor_of(args[0]);
    return v != nullptr && int_arg(args[1], id) ? v : nullptr;
}

/* init(f32, f64, PreparedGrad, drain, backward_started): the kernel's entry points (addresses)
   and the Python side; init(0, 0, None, None, None) lets the last capture's objects go */
PyObject *init(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    ARGS(5)
    long long f32, f64;
    if (!int_arg(args[0], &f32) || !int_arg(args[1], &f64)) return nullptr;
    PyObject **slots[3] = {&S.prepared_type, &S.on_tensor, &S.on_first};
    for (int k = 0; k < 3; k++) {
        PyObject *o = args[2 + k] == Py_None ? nullptr : args[2 + k];
        Py_XINCREF(o);
        Py_XSETREF(*slots[k], o);
    }
    S.f32 = reinterpret_cast<stats_fn>(static_cast<uintptr_t>(f32));
    S.f64 = reinterpret_cast<stats_fn>(static_cast<uintptr_t>(f64));
    Py_RETURN_NONE;
}

/* recording(active): a step starts (true: record what the hooks see) or ends; new groups */
PyObject *recording(PyObject *, PyObject *active) {
    int on = PyObject_IsTrue(active);
    if (on < 0) return nullptr;
    S.active.store(on);
    S.fired.store(0);
    std::lock_guard<std::mutex> hold(S.lock);
    S.groups.clear();
    Py_RETURN_NONE;
}

/* t.view_as(t) for each t of the sequence `tensors`, the j-th view's node given the post-hook
   make(j) (a view without a node: not hooked); a tuple */
template <typename Make>
PyObject *views_of(PyObject *tensors, Make make) {
    PyObject *seq = PySequence_Fast(tensors, "a sequence of tensors");
    if (seq == nullptr) return nullptr;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyTuple_New(n);
    if (out == nullptr) { Py_DECREF(seq); return nullptr; }
    for (Py_ssize_t j = 0; j < n; j++) {
        const at::Tensor *v = tensor_of(PySequence_Fast_GET_ITEM(seq, j));
        if (v == nullptr) { Py_DECREF(seq); Py_DECREF(out); return nullptr; }
        at::Tensor view;
        try {
            view = v->view_as(*v);
        } catch (const std::exception &e) {
            PyErr_SetString(PyExc_RuntimeError, e.what());
            Py_DECREF(seq); Py_DECREF(out);
            return nullptr;
        }
        const auto &node = view.grad_fn();
        if (node) node->add_post_hook(make(static_cast<long>(j)));
        PyObject *w = THPVariable_Wrap(std::move(view));
        if (w == nullptr) { Py_DECREF(seq); Py_DECREF(out); return nullptr; }
        PyTuple_SET_ITEM(out, j, w);
    }
    Py_DECREF(seq);
    return out;
}

/* each i-th item of the sequence `outputs` that is a tensor requiring grad: its autograd node
   given the pre-hook make(i, output_nr); (how many such tensors, the list of the indices of
   those without a node: leaves, that the caller hooks itself) */
template <typename Make>
PyObject *watch_outputs(PyObject *outputs, Make make) {
    PyObject *seq = PySequence_Fast(outputs, "a sequence");
    if (seq == nullptr) return nullptr;
    PyObject *leaves = PyList_New(0);
    if (leaves == nullptr) { Py_DECREF(seq); return nullptr; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), watched = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!THPVariable_Check(o)) continue;
        const at::Tensor &t = THPVariable_Unpack(o);
        if (!t.requires_grad()) continue;
        watched++;
        const auto &node = t.grad_fn();
        if (node) {
            node->add_pre_hook(make(static_cast<long>(i), t.output_nr()));
            continue;
        }
        PyObject *k = PyLong_FromSsize_t(i);
        if (k == nullptr || PyList_Append(leaves, k) < 0) {
            Py_XDECREF(k); Py_DECREF(seq); Py_DECREF(leaves);
            return nullptr;
        }
        Py_DECREF(k);
    }
    Py_DECREF(seq);
    return Py_BuildValue("(nN)", watched, leaves);
}

/* capture(tensors, first_id): views of tensors (views_of) whose j-th gradient is queued as
   event first_id + j */
PyObject *capture(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    ARGS(2)
    long long first;
    if (!int_arg(args[1], &first)) return nullptr;
    return views_of(args[0], [first](long j) { return std::make_unique<InputHook>(first + j); });
}

/* watch(outputs, first_id): the gradient of output i (watch_outputs) queued as event
   first_id + i */
PyObject *watch(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    ARGS(2)
    long long first;
    if (!int_arg(args[1], &first)) return nullptr;
    return watch_outputs(args[0], [first](long i, uint32_t slot) {
        return std::make_unique<OutputHook>(first + i, slot);
    });
}

/* capture_calling(prepare, tensors, fn): views of tensors (views_of) whose j-th gradient is
   handed to fn(j, grad) as it comes (with `prepare`, a readable one as a keyed PreparedGrad:
   no reference to the tensor is kept, so autograd hands a parameter's gradient to .grad
   without copying it) */
PyObject *capture_calling(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    ARGS(3)
    int prepare = PyObject_IsTrue(args[0]);
    if (prepare < 0) return nullptr;
    PyObject *fn = args[2];
    return views_of(args[1], [fn, prepare](long j) {
        return std::make_unique<PyInputHook>(fn, j, prepare != 0);
    });
}

/* watch_calling(prepare, outputs, fn): the gradient of output i (watch_outputs) handed to
   fn(i, grad) as it comes (`prepare`: as capture_calling's) */
PyObject *watch_calling(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    ARGS(3)
    int prepare = PyObject_IsTrue(args[0]);
    if (prepare < 0) return nullptr;
    PyObject *fn = args[2];
    return watch_outputs(args[1], [fn, prepare](long i, uint32_t slot) {
        return std::make_unique<PyOutputHook>(fn, i, slot, prepare != 0);
    });
}

/* prepare(t): a keyed PreparedGrad of t when it is readable (a CPU floating strided tensor
   with elements, the library initialised with a PreparedGrad type), else t itself */
PyObject *prepare(PyObject *, PyObject *t) {
    const at::Tensor *v = tensor_of(t);
    if (v == nullptr) return nullptr;
    if (!readable(*v)) { Py_INCREF(t); return t; }
    double stats[6];
    read_once(*v, stats);       /* (with the GIL: a wake-up of the writer costs more) */
    return keyed_prepared(*v, stats);
}

using NodePtr = std::decay_t<decltype(std::declval<const at::Tensor &>().grad_fn())>;
using EdgeHits = std::vector<std::pair<NodePtr, std::vector<std::pair<size_t, size_t>>>>;

/* the nodes made since autograd sequence number `start` that are reached from the nodes of the
   sequence `outputs` and take one of the sequence `inputs` (tensors): each with its hits
   (next edge of the node, input), into `found`; counts[j]: input j's hits. False with a Python
   error set. */
bool walk_edges(PyObject *inputs, PyObject *outputs, long long start, EdgeHits &found,
                std::vector<int> &counts) {
    using torch::autograd::Node;
    std::map<std::pair<const Node *, uint32_t>, size_t> targets;
    std::vector<NodePtr> keep;
    PyObject *ins = PySequence_Fast(inputs, "a sequence of tensors");
    if (ins == nullptr) return false;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ins);
    counts.assign(static_cast<size_t>(n), 0);
    try {
        for (Py_ssize_t j = 0; j < n; j++) {
            const at::Tensor *v = tensor_of(PySequence_Fast_GET_ITEM(ins, j));
            if (v == nullptr) { Py_DECREF(ins); return false; }
            if (!v->requires_grad()) continue;
            auto edge = torch::autograd::impl::gradient_edge(*v);
            if (!edge.function) continue;
            targets.emplace(std::make_pair(edge.function.get(), edge.input_nr), static_cast<size_t>(j));
            keep.push_back(edge.function);
        }
        PyObject *outs = PySequence_Fast(outputs, "a sequence of tensors");
        if (outs == nullptr) { Py_DECREF(ins); return false; }
        std::vector<NodePtr> stack;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(outs); i++) {
            PyObject *o = PySequence_Fast_GET_ITEM(outs, i);
            if (!THPVariable_Check(o)) continue;
            const auto &node = THPVariable_Unpack(o).grad_fn();
            if (node && node->sequence_nr() >= static_cast<uint64_t>(start)) stack.push_back(node);
        }
        Py_DECREF(outs);
        std::set<const Node *> seen;
        while (!stack.empty()) {
            NodePtr node = std::move(stack.back());
            stack.pop_back();
            if (!seen.insert(node.get()).second) continue;
            std::vector<std::pair<size_t, size_t>> hits;
            const auto &next = node->next_edges();
            for (size_t i = 0; i < next.size(); i++) {
                const auto &e = next[i];
                if (!e.function) continue;
                auto it = targets.find(std::make_pair(e.function.get(), e.input_nr));
                if (it != targets.end()) {
                    hits.emplace_back(i, it->second);
                    counts[it->second]++;
                } else if (!seen.count(e.function.get()) && e.function->num_outputs() > 0 &&
                           e.function->sequence_nr() >= static_cast<uint64_t>(start)) {
                    stack.push_back(e.function);
                }
            }
            if (!hits.empty()) found.emplace_back(std::move(node), std::move(hits));
        }
    } catch (const std::exception &e) {
        Py_DECREF(ins);
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return false;
    }
    Py_DECREF(ins);
    return true;
}

/* the list of the j with counts[j] > 0 (new reference, or null) */
PyObject *taken_list(const std::vector<int> &counts) {
    PyObject *taken = PyList_New(0);
    if (taken == nullptr) return nullptr;
    for (size_t j = 0; j < counts.size(); j++) {
        if (counts[j] == 0) continue;
        PyObject *k = PyLong_FromSize_t(j);
        if (k == nullptr || PyList_Append(taken, k) < 0) { Py_XDECREF(k); Py_DECREF(taken); return nullptr; }
        Py_DECREF(k);
    }
    return taken;
}

/* hook each found node with make(hits) (a post-hook); false with a Python error set */
template <typename Make>
bool hook_edges(EdgeHits &found, Make make) {
    try {
        for (auto &[node, hits] : found) node->add_post_hook(make(std::move(hits)));
    } catch (const std::exception &e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return false;
    }
    return true;
}

/* capture_edges(inputs, outputs, start, first_id): the nodes walk_edges finds get a post-hook
   (EdgeHook): input j's gradient is queued as event first_id + j. A list of the j that are
   taken by such a node. */
PyObject *capture_edges(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    ARGS(4)
    long long start, first;
    if (!int_arg(args[2], &start) || !int_arg(args[3], &first)) return nullptr;
    EdgeHits found;
    std::vector<int> counts;
    if (!walk_edges(args[0], args[1], start, found, counts)) return nullptr;
    auto sum = std::make_shared<EdgeSum>(counts, [first](size_t j, const at::Tensor &total) {
        record(CALL, first + static_cast<int64_t>(j), total);
    });
    if (!hook_edges(found, [&sum](std::vector<std::pair<size_t, size_t>> hits) {
            return std::make_unique<EdgeHook>(sum, std::move(hits));
        }))
        return nullptr;
    return taken_list(counts);
}

/* capture_edges_calling(prepare, inputs, outputs, start, fn): capture_edges' hooks, input j's
   gradient (its contributions added up here, in the order they come) handed to fn(j, grad) as
   it is complete (`prepare`: as capture_calling's). The API level's capture with nothing
   queued: one C++ call per recorded call, no Python walk of the graph, no Python hook. */
PyObject *capture_edges_calling(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    ARGS(5)
    int prepare = PyObject_IsTrue(args[0]);
    if (prepare < 0) return nullptr;
    long long start;
    if (!int_arg(args[3], &start)) return nullptr;
    EdgeHits found;
    std::vector<int> counts;
    if (!walk_edges(args[1], args[2], start, found, counts)) return nullptr;
    if (!found.empty()) {
        auto fn = std::make_shared<PyCallback>(args[4], 0L, prepare != 0);   /* its reference */
        auto sum = std::make_shared<EdgeSum>(counts, [fn](size_t j, const at::Tensor &total) {
            call_fn(fn->fn, static_cast<long>(j), fn->prepare, total);
        });
        if (!hook_edges(found, [&sum](std::vector<std::pair<size_t, size_t>> hits) {
                return std::make_unique<EdgeHook>(sum, std::move(hits));
            }))
            return nullptr;
    }
    return taken_list(counts);
}

/* grouped(t): t read as a replayed event is (a PreparedGrad with its group: the same data as
   a queued gradient is the same group) when it is readable and the step is recorded, else t
   itself. For a gradient a Python hook got beside the queued ones (torch_grads.NativeGrads.
   first_grad: a leaf module output's, which may be the very tensor a parameter's AccumulateGrad
   hook queues after it; a parameter hooked as its module runs) */
PyObject *grouped(PyObject *, PyObject *t) {
    const at::Tensor *v = tensor_of(t);
    if (v == nullptr) return nullptr;
    if (!S.active.load(std::memory_order_relaxed) || !readable(*v)) { Py_INCREF(t); return t; }
    Event e;
    e.kind = CALL;
    e.id = 0;
    e.state = PREPARED;
    e.dtype = v->scalar_type();
    e.sizes = v->sizes().vec();
    e.numel = v->numel();
    e.requires_grad = v->requires_grad();
    e.group = read_once(*v, e.stats);
    return value_of(e);
}

/* watch_param(p, id): hook parameter p (a leaf) for its gradient, on its AccumulateGrad node
   (kept alive here, as DDP keeps it, so every graph uses this node). Not a hook on the tensor:
   a tensor's first Python hook (Tensor.register_hook, setting its _backward_hooks) clears
   every hook the tensor has, a C++ one included; a node's hooks stay. A post-hook (ParamHook):
   the gradient read is .grad after accumulation. */
PyObject *watch_param(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    long long id;
    const at::Tensor *v = tensor_and_id(args, nargs, &id);
    if (v == nullptr) return nullptr;
    AccumulatorPtr node;
    try {
        node = torch::autograd::impl::grad_accumulator(*v);
    } catch (const std::exception &e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
    if (!node) {
        PyErr_SetString(PyExc_ValueError, "watch_param: not a leaf that requires grad");
        return nullptr;
    }
    auto on = std::make_shared<std::atomic<bool>>(true);
    auto *acc = dynamic_cast<torch::autograd::AccumulateGrad *>(node.get());
    if (acc == nullptr) {
        PyErr_SetString(PyExc_ValueError, "watch_param: the parameter's node is not an AccumulateGrad");
        return nullptr;
    }
    node->add_post_hook(std::make_unique<ParamHook>(id, on, acc));
    std::lock_guard<std::mutex> hold(S.lock);
    S.params[id] = std::make_pair(std::move(node), std::move(on));
    Py_RETURN_NONE;
}

/* remove_param(id): the hook of watch_param(p, id) records no more; its node is let go */
PyObject *remove_param(PyObject *, PyObject *arg) {
    long long id;
    if (!int_arg(arg, &id)) return nullptr;
    std::lock_guard<std::mutex> hold(S.lock);
    auto it = S.params.find(id);
    if (it != S.params.end()) {
        it->second.second->store(false);
        S.params.erase(it);
    }
    Py_RETURN_NONE;
}

/* take(out): append the queued events to out as (kind, id, value), forget them; how many */
PyObject *take(PyObject *, PyObject *out) {
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "take: a list");
        return nullptr;
    }
    std::vector<Event> events;
    {
        std::lock_guard<std::mutex> hold(S.lock);
        events.swap(S.events);
        S.pending.store(0);
    }
    for (Event &e : events) {
        PyObject *value = value_of(e);
        if (value == nullptr) return nullptr;
        PyObject *item = Py_BuildValue("(iLN)", e.kind, static_cast<long long>(e.id), value);
        if (item == nullptr || PyList_Append(out, item) < 0) { Py_XDECREF(item); return nullptr; }
        Py_DECREF(item);
    }
    return PyLong_FromSize_t(events.size());
}

/* new_step(): forget the gradients read (a step starts) */
PyObject *new_step(PyObject *, PyObject *) {
    std::lock_guard<std::mutex> hold(S.lock);
    S.groups.clear();
    Py_RETURN_NONE;
}

/* pending(): events queued, not taken yet */
PyObject *pending(PyObject *, PyObject *) {
    return PyLong_FromLongLong(S.pending.load(std::memory_order_relaxed));
}

PyMethodDef methods[] = {
    {"init", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(init)), METH_FASTCALL, nullptr},
    {"recording", recording, METH_O, nullptr},
    {"watch_param", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(watch_param)), METH_FASTCALL, nullptr},
    {"remove_param", remove_param, METH_O, nullptr},
    {"capture", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(capture)), METH_FASTCALL, nullptr},
    {"watch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(watch)), METH_FASTCALL, nullptr},
    {"capture_edges_calling", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(capture_edges_calling)), METH_FASTCALL, nullptr},
    {"capture_calling", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(capture_calling)), METH_FASTCALL, nullptr},
    {"watch_calling", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(watch_calling)), METH_FASTCALL, nullptr},
    {"prepare", prepare, METH_O, nullptr},
    {"grouped", grouped, METH_O, nullptr},
    {"capture_edges", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(capture_edges)), METH_FASTCALL, nullptr},
    {"take", take, METH_O, nullptr},
    {"pending", pending, METH_NOARGS, nullptr},
    {"new_step", new_step, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torch_grads",
                      "The module dump's backward capture in C++ (see torch_grads.py).", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__torch_grads(void) { return PyModule_Create(&module); }
