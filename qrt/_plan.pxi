# ------------------------------------------------------------ execution plans (qrt/plan.py compiles them)
#
# A program is a flat array of steps over slots. A slot points into an input, a stored tensor, the
# arena of the call's buffer set, an output array made for the call, or a fallback step's result.
# One call runs every step with the GIL released; a fallback step (an op with no native step here)
# takes the GIL back for its Python step only. Buffer sets come from a per-program pool, one per
# running call, so threads never share mutable buffers.

cimport numpy as cnp
from cpython.ref cimport PyObject
from libc.stdlib cimport calloc

cnp.import_array()

cdef enum:
    PS_QUANT_T = 1
    PS_QUANT_C
    PS_DEQUANT_T
    PS_DEQUANT_C
    PS_LINEAR
    PS_LINEAR_DYNAMIC
    PS_LINEAR_FLOAT
    PS_CELL
    PS_RELU
    PS_ADD
    PS_FALLBACK

cdef enum:
    SLOT_INPUT = 1
    SLOT_CONST
    SLOT_ARENA
    SLOT_FRESH
    SLOT_OBJECT

cdef enum:
    E_NATIVE = 1   # a kernel refused its input (NaN) or memory ran out: the per-node path says which
    E_RAISED = 2   # a fallback step raised
    E_RESHAPED = 3  # a fallback step returned another shape than when the program was compiled

cdef struct plan_step:
    int op, node, dtype, relu
    int a, b, c, y, y2, s0, s1  # slots (-1: none)
    Py_ssize_t m, n, outer, ch, inner
    float scale
    int32_t zp
    PyObject* kernel  # borrowed: the program keeps it
    const float* fvec
    const double* dvec
    const int32_t* ivec


cdef int run_native(const plan_step* s, void** P) noexcept nogil:
    """One native step; 0, or E_NATIVE."""
    cdef Py_ssize_t i, n
    cdef int err = 0
    if s.op == PS_QUANT_T:
        if s.dtype == 0:
            err = quantize_tensor_raw(<const float*>P[s.a], s.n, s.scale, s.zp, <uint8_t*>P[s.y])
        elif s.dtype == 1:
            err = quantize_tensor_raw(<const float*>P[s.a], s.n, s.scale, s.zp, <int8_t*>P[s.y])
        else:
            err = quantize_tensor_raw(<const float*>P[s.a], s.n, s.scale, s.zp, <int32_t*>P[s.y])
    elif s.op == PS_QUANT_C:
        if s.dtype == 0:
            err = quantize_channel_raw(<const float*>P[s.a], s.outer, s.ch, s.inner, s.fvec, s.ivec, <uint8_t*>P[s.y])
        elif s.dtype == 1:
            err = quantize_channel_raw(<const float*>P[s.a], s.outer, s.ch, s.inner, s.fvec, s.ivec, <int8_t*>P[s.y])
        else:
            err = quantize_channel_raw(<const float*>P[s.a], s.outer, s.ch, s.inner, s.fvec, s.ivec, <int32_t*>P[s.y])
    elif s.op == PS_DEQUANT_T:
        if s.dtype == 0:
            dequantize_tensor_raw(<const uint8_t*>P[s.a], s.n, s.scale, s.zp, <float*>P[s.y])
        elif s.dtype == 1:
            dequantize_tensor_raw(<const int8_t*>P[s.a], s.n, s.scale, s.zp, <float*>P[s.y])
        else:
            dequantize_tensor_raw(<const int32_t*>P[s.a], s.n, s.scale, s.zp, <float*>P[s.y])
    elif s.op == PS_DEQUANT_C:
        if s.dtype == 0:
            dequantize_channel_raw(<const uint8_t*>P[s.a], s.outer, s.ch, s.inner, s.dvec, s.ivec, <float*>P[s.y])
        elif s.dtype == 1:
            dequantize_channel_raw(<const int8_t*>P[s.a], s.outer, s.ch, s.inner, s.dvec, s.ivec, <float*>P[s.y])
        else:
            dequantize_channel_raw(<const int32_t*>P[s.a], s.outer, s.ch, s.inner, s.dvec, s.ivec, <float*>P[s.y])
    elif s.op == PS_LINEAR:
        err = (<StaticLinear>s.kernel).forward(<const uint8_t*>P[s.a], s.m, <uint8_t*>P[s.y])
    elif s.op == PS_LINEAR_DYNAMIC:
        # ReLU in the product's epilogue, on the output while it is in registers
        err = (<DynamicLinear>s.kernel).forward(<const float*>P[s.a], s.m, <float*>P[s.y], s.relu)
    elif s.op == PS_LINEAR_FLOAT:
        err = (<PackedFloat>s.kernel).gemm(<const float*>P[s.a], s.m, s.fvec, <float*>P[s.y])
        n = s.m * (<PackedFloat>s.kernel).n
        if err == 0 and s.relu:
            relu_to(<float*>P[s.y], <float*>P[s.y], n)
    elif s.op == PS_CELL:
        err = (<Recurrent>s.kernel).step_into(<const float*>P[s.a], <const float*>P[s.b], <const float*>P[s.c],
                                              <float*>P[s.y], <float*>P[s.y2], s.m, <float*>P[s.s0],
                                              <float*>P[s.s1])
    elif s.op == PS_RELU:
        relu_to(<const float*>P[s.a], <float*>P[s.y], s.n)
    elif s.op == PS_ADD:
        for i in range(s.n):
            (<float*>P[s.y])[i] = (<const float*>P[s.a])[i] + (<const float*>P[s.b])[i]
    return E_NATIVE if err else 0


cdef class _PlanBuffers:
    """One call's slots: the arena's intermediate buffers (kept between calls) and the call's pointers."""
    cdef object arena
    cdef void** ptrs
    cdef list objs
    cdef char* lo
    cdef char* hi
    cdef object error

    def __dealloc__(self):
        free(self.ptrs)


cdef class PlanProgram:
    """The steps of one model at one set of input shapes (built by qrt.plan)."""
    cdef plan_step* steps
    cdef int n_steps, n_slots
    cdef Py_ssize_t arena_size
    cdef list keep, pool, slots, inputs, input_types, fresh, call_slots, fallbacks, outputs

    def __cinit__(self):
        self.steps = NULL

    def __dealloc__(self):
        free(self.steps)

    def __init__(self, dict spec):
        self.inputs = list(spec["inputs"])
        self.input_types = list(spec["input_types"])
        self.slots = list(spec["slots"])  # (kind, info, shape, dtype, read natively)
        self.n_slots = len(self.slots)
        self.arena_size = spec["arena_size"]
        self.fallbacks = list(spec["fallbacks"])
        self.outputs = list(spec["outputs"])
        self.keep, self.pool = [], []
        self.fresh = [(i, s[2], s[3].num) for i, s in enumerate(self.slots) if s[0] == SLOT_FRESH]
        self.call_slots = [i for i, s in enumerate(self.slots) if s[0] in (SLOT_INPUT, SLOT_FRESH, SLOT_OBJECT)]
        steps = spec["steps"]
        self.steps = <plan_step*>calloc(max(len(steps), 1), sizeof(plan_step))
        if self.steps == NULL:
            raise MemoryError()
        cdef plan_step* st
        for k, d in enumerate(steps):
            st = &self.steps[k]
            st.op, st.node = d["op"], d["node"]
            st.dtype, st.relu = d.get("dtype", 0), d.get("relu", 0)
            st.a, st.b, st.c = d.get("a", -1), d.get("b", -1), d.get("c", -1)
            st.y, st.y2, st.s0, st.s1 = d.get("y", -1), d.get("y2", -1), d.get("s0", -1), d.get("s1", -1)
            st.m, st.n = d.get("m", 0), d.get("n", 0)
            st.outer, st.ch, st.inner = d.get("view", (0, 0, 0))
            st.scale, st.zp = d.get("scale", 0.0), d.get("zp", 0)
            if "kernel" in d:
                self.keep.append(d["kernel"])
                st.kernel = <PyObject*>d["kernel"]
            if "fvec" in d:
                st.fvec = <const float*>cnp.PyArray_DATA(self._keep(d["fvec"], np.float32))
            if "dvec" in d:
                st.dvec = <const double*>cnp.PyArray_DATA(self._keep(d["dvec"], np.float64))
            if "ivec" in d:
                st.ivec = <const int32_t*>cnp.PyArray_DATA(self._keep(d["ivec"], np.int32))
        self.n_steps = len(steps)

    cdef cnp.ndarray _keep(self, a, dtype):
        a = np.ascontiguousarray(a, dtype)
        self.keep.append(a)
        return a

    cdef _PlanBuffers buffers(self):
        """A buffer set: one from the pool, or a new one."""
        try:
            return self.pool.pop()
        except IndexError:
            pass
        cdef _PlanBuffers bs = _PlanBuffers.__new__(_PlanBuffers)
        bs.ptrs = <void**>calloc(max(self.n_slots, 1), sizeof(void*))
        if bs.ptrs == NULL:
            raise MemoryError()
        bs.objs = [None] * self.n_slots
        bs.arena = aligned_empty(max(self.arena_size, 1))
        bs.lo = <char*>cnp.PyArray_DATA(bs.arena)
        bs.hi = bs.lo + self.arena_size
        for i, (kind, info, shape, dtype, _) in enumerate(self.slots):
            if kind == SLOT_ARENA:
                bs.ptrs[i] = bs.lo + <Py_ssize_t>info
                nbytes = dtype.itemsize * int(np.prod(shape))
                if nbytes:  # a view for fallback steps reading it (scratch has none)
                    bs.objs[i] = bs.arena[info:info + nbytes].view(dtype).reshape(shape)
            elif kind == SLOT_CONST:
                bs.ptrs[i] = cnp.PyArray_DATA(info)
                bs.objs[i] = info
        return bs

    cdef object call(self, list inputs, bint checked):
        """The outputs of one call, or None when the per-node path must answer it (an error to report
        as it reports it, or a fallback whose result changed shape). checked: the inputs conform."""
        cdef _PlanBuffers bs = self.buffers()
        cdef int failed = -1, err, i, slot, nd
        cdef cnp.npy_intp dims[32]
        try:
            for i in range(len(self.inputs)):
                a = inputs[i]
                if not checked and not self.conforms(i, a):
                    want = cnp.PyArray_DescrFromType(self.input_types[i])
                    raise ValueError(f"input {i}: expected an aligned C-contiguous array of {want} in native byte order")
                slot = self.inputs[i]
                if slot >= 0:
                    bs.ptrs[slot] = cnp.PyArray_DATA(a)
                    bs.objs[slot] = a
            for slot, shape, typenum in self.fresh:
                nd = len(shape)
                for i in range(nd):
                    dims[i] = shape[i]
                a = cnp.PyArray_EMPTY(nd, dims, typenum, 0)
                bs.ptrs[slot] = cnp.PyArray_DATA(a)
                bs.objs[slot] = a
            err = self.execute(bs, &failed)
            if err == E_RAISED:
                e = bs.error
                if isinstance(e, ValueError):
                    raise ValueError(f"{self.fallbacks[self.steps[failed].m][3]}: {e}") from None
                raise e
            if err:
                return None
            return self.collect(bs)
        finally:
            for slot in self.call_slots:
                bs.objs[slot] = None
            bs.error = None
            self.pool.append(bs)

    cdef bint conforms(self, int i, a):
        """Input i may be read as it is: an aligned C-contiguous array of its dtype in native byte order."""
        return (cnp.PyArray_Check(a) and cnp.PyArray_TYPE(a) == <int>self.input_types[i]
                and cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISBEHAVED_RO(a))

    cdef int execute(self, _PlanBuffers bs, int* failed) noexcept:
        cdef int k, err = 0
        cdef const plan_step* s
        cdef void** P = bs.ptrs
        with nogil:
            for k in range(self.n_steps):
                s = &self.steps[k]
                if s.op == PS_FALLBACK:
                    with gil:
                        err = self.fallback(bs, s.m)
                else:
                    err = run_native(s, P)
                if err:
                    failed[0] = k
                    break
        return err

    cdef int fallback(self, _PlanBuffers bs, Py_ssize_t index) noexcept:
        """Run a fallback step's Python function on its slots' arrays; its results become slots."""
        try:
            fn, args, outs, label = self.fallbacks[index]
            values = []
            for slot, shape in args:
                v = bs.objs[slot]
                values.append(v if v.shape == shape else v.reshape(shape))
            results = fn(*values)
            if len(results) != len(outs):
                return E_RESHAPED
            for r, (slot, shape, typenum) in zip(results, outs):
                if not cnp.PyArray_Check(r) or r.shape != shape or cnp.PyArray_TYPE(r) != <int>typenum:
                    return E_RESHAPED
                if self.slots[slot][4] and not cnp.PyArray_IS_C_CONTIGUOUS(r):
                    r = np.ascontiguousarray(r)
                bs.objs[slot] = r
                bs.ptrs[slot] = cnp.PyArray_DATA(r)
        except BaseException as e:
            bs.error = e
            return E_RAISED
        return 0

    cdef list collect(self, _PlanBuffers bs):
        """The outputs: arrays made for this call as they are; anything else the call does not own, copied."""
        cdef list out = []
        cdef int slot, kind, i, nd
        cdef cnp.npy_intp dims[32]
        for spec in self.outputs:
            slot = spec[0]
            if slot < 0:  # a stored tensor
                out.append(spec[1].copy())
                continue
            shape = spec[1]
            kind = self.slots[slot][0]
            if kind == SLOT_FRESH or kind == SLOT_OBJECT:
                v = bs.objs[slot]
                if v.shape != shape:
                    v = v.reshape(shape)
                # a fallback's view (of the arena, an input, a stored tensor) or an array already
                # handed out is copied: outputs are the caller's, and never alias each other
                if (kind == SLOT_OBJECT and v.base is not None) or any(v is o for o in out):
                    v = v.copy()
                out.append(v)
                continue
            nd = len(shape)
            for i in range(nd):
                dims[i] = shape[i]
            v = cnp.PyArray_EMPTY(nd, dims, self.slots[slot][3].num, 0)
            memcpy(cnp.PyArray_DATA(v), bs.ptrs[slot], cnp.PyArray_NBYTES(v))
            out.append(v)
        return out


cdef class PlanExecutor:
    """Runs a model's programs by input shapes; ``miss(inputs)`` answers (and compiles) a new set of
    shapes, ``slow(inputs)`` answers a call the program hands back (the per-node path)."""
    cdef dict programs
    cdef object miss, slow
    cdef Py_ssize_t n_inputs

    def __init__(self, Py_ssize_t n_inputs, miss, slow):
        self.programs = {}
        self.n_inputs, self.miss, self.slow = n_inputs, miss, slow

    def add(self, tuple key, program) -> None:
        """The program for inputs of these shapes; None: answer them with the per-node path."""
        self.programs[key] = program if program is not None else False

    def clear(self) -> None:
        self.programs = {}

    def program_count(self) -> int:
        return len(self.programs)

    def has_program(self, tuple key) -> bool:
        """Whether inputs of these shapes run a compiled program (not the per-node path)."""
        return bool(self.programs.get(key))

    def try_run(self, list inputs):
        """The outputs if a compiled program takes these arrays exactly as they are (shapes seen
        before, dtypes, C order, native byte order); else None: bind and check them, then run()."""
        cdef Py_ssize_t i
        if len(inputs) != self.n_inputs:
            return None
        for a in inputs:
            if not cnp.PyArray_Check(a):
                return None
        prog = self.programs.get(tuple([a.shape for a in inputs]))
        if not prog:
            return None
        for i in range(self.n_inputs):
            if not (<PlanProgram>prog).conforms(i, inputs[i]):
                return None
        out = (<PlanProgram>prog).call(inputs, True)
        return self.slow(inputs) if out is None else out

    def stream_step(self, list given, list free, list state, list state_in, list state_out):
        """Stream.step's common call: the flat outputs for the inputs `given` (at the positions `free`) and
        `state` (at `state_in`), if a compiled program takes these arrays as they are; the new state
        (outputs `state_out`, made read-only) replaces state's items. None: Stream.step checks them."""
        cdef Py_ssize_t i
        if len(given) != len(free) or len(free) + len(state) != self.n_inputs:
            return None
        cdef list flat = [None] * self.n_inputs
        for i in range(len(free)):
            flat[<Py_ssize_t>free[i]] = given[i]
        for i in range(len(state)):
            flat[<Py_ssize_t>state_in[i]] = state[i]
        out = self.try_run(flat)
        if out is None:
            return None
        for i in range(len(state_out)):
            a = out[<Py_ssize_t>state_out[i]]
            cnp.PyArray_CLEARFLAGS(<cnp.ndarray>a, cnp.NPY_ARRAY_WRITEABLE)
            state[i] = a
        return out

    def run(self, list inputs) -> list:
        """The flat outputs of the model for its flat inputs (arrays of the inputs' dtypes, C-contiguous)."""
        if len(inputs) != self.n_inputs:
            raise ValueError(f"got {len(inputs)} input(s), the model takes {self.n_inputs}")
        for a in inputs:
            if not cnp.PyArray_Check(a):
                raise ValueError(f"expected numpy arrays, got {type(a).__name__}")
        key = tuple([a.shape for a in inputs])
        prog = self.programs.get(key)
        if prog is None:
            return self.miss(inputs)
        if prog is False:
            return self.slow(inputs)
        out = (<PlanProgram>prog).call(inputs, False)
        return self.slow(inputs) if out is None else out
