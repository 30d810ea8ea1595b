# ------------------------------------------------------------ execution plans (qrt/plan.py compiles them)
#
# A program is a flat array of steps over slots. A slot points into an input, a stored tensor, the
# arena of the call's buffer set, an output array made for the call, or a fallback step's result.
# One call runs every step with the GIL released; a fallback step (an op with no native step here)
# takes the GIL back for its Python step only. Buffer sets come from a per-program pool, one per
# running call, so threads never share mutable buffers.

from cpython.ref cimport PyObject
from libc.stdlib cimport calloc
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cpdef enum PlanStep:  # qrt/plan.py reads the numbers from here (K.PlanStep)
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
    PS_SEQUENCE
    PS_EMBEDDING
    PS_SOFTMAX
    PS_COPY
    PS_ATTENTION
    PS_UNARY
    PS_LAYER_NORM
    PS_BINARY
    PS_SUM
    PS_BATCH_NORM
    PS_MASK
    PS_MATMUL
    PS_GATHER
    PS_CUMSUM
    PS_CAT
    PS_FALLBACK

cpdef enum Slot:  # how a value is stored (K.Slot)
    SLOT_INPUT = 1
    SLOT_CONST
    SLOT_ARENA
    SLOT_FRESH
    SLOT_OBJECT

cdef enum:
    E_NATIVE = 1   # a kernel refused its input (NaN, an index out of range) or memory ran out: the
                   # per-node path says which
    E_RAISED = 2   # a fallback step raised
    E_RESHAPED = 3  # a fallback step returned another shape than when the program was compiled

cdef struct plan_step:
    int op, node, dtype, relu
    int round_first  # PS_QUANT_T, PS_QUANT_C: the zero point added after rounding (torch on aarch64)
    int a, b, c, d, y, y2, y3, s0, s1  # slots (-1: none)
    Py_ssize_t m, n, outer, ch, inner
    Py_ssize_t offset, stride, outer_stride  # PS_COPY: where its blocks lie in the source, in bytes
    float scale
    int32_t zp
    PyObject* kernel  # borrowed: the program keeps it
    const float* fvec
    const float* fvec2  # PS_LAYER_NORM: the bias (fvec the weight), NULL for none; PS_BATCH_NORM: beta (fvec alpha)
    const double* dvec
    const int32_t* ivec


cdef inline void* slot_or_null(void** P, int slot) noexcept nogil:
    return P[slot] if slot >= 0 else NULL


cdef inline void copy_block(char* dst, const char* src, Py_ssize_t n) noexcept nogil:
    """memcpy of n bytes, a block of one 4- or 8-byte element as one move: a memcpy of a size known only at run
    time is a call (RoFormer's rotary halves, a stack of [12, 128, 16] pairs and slices of every other element,
    made one an element)."""
    if n == 4:
        memcpy(dst, src, 4)
    elif n == 8:
        memcpy(dst, src, 8)
    else:
        memcpy(dst, src, n)


cdef void copy_blocks(const plan_step* s, const char* src, char* dst) noexcept nogil:
    """PS_COPY (select, slice): in each of s.outer rows of the source (s.outer_stride bytes apart), s.ch
    blocks of s.inner bytes, the first at s.offset, s.stride apart; one after the other in dst."""
    cdef Py_ssize_t o, k
    # blocks of one element (every other element of a row) as a strided loop of elements, where they lie as
    # elements of that size do (a block of 4 bools need not)
    cdef bint elements = s.inner in (4, 8) and s.ch > 1 and \
        (<size_t>(src + s.offset) | <size_t>dst | <size_t>s.outer_stride) % <size_t>s.inner == 0
    for o in range(s.outer):
        if elements:
            move_elements(MOVE_ROW, src + o * s.outer_stride + s.offset, s.stride, dst, 1, s.ch, s.inner)
            dst += s.ch * s.inner
            continue
        for k in range(s.ch):
            copy_block(dst, src + o * s.outer_stride + s.offset + k * s.stride, s.inner)
            dst += s.inner


cdef int run_native(const plan_step* s, void** P) noexcept nogil:
    """One native step; 0, or E_NATIVE."""
    cdef Py_ssize_t i, n
    cdef const char* parts[4]  # PS_CAT's operands
    cdef int err = 0
    if s.op == PS_QUANT_T:
        if s.dtype == 0:
            err = quantize_tensor_raw(<const float*>P[s.a], s.n, s.scale, s.zp, s.round_first, <uint8_t*>P[s.y])
        elif s.dtype == 1:
            err = quantize_tensor_raw(<const float*>P[s.a], s.n, s.scale, s.zp, s.round_first, <int8_t*>P[s.y])
        else:
            err = quantize_tensor_raw(<const float*>P[s.a], s.n, s.scale, s.zp, s.round_first, <int32_t*>P[s.y])
    elif s.op == PS_QUANT_C:
        if s.dtype == 0:
            err = quantize_channel_raw(<const float*>P[s.a], s.outer, s.ch, s.inner, s.fvec, s.ivec, s.round_first,
                                       <uint8_t*>P[s.y])
        elif s.dtype == 1:
            err = quantize_channel_raw(<const float*>P[s.a], s.outer, s.ch, s.inner, s.fvec, s.ivec, s.round_first,
                                       <int8_t*>P[s.y])
        else:
            err = quantize_channel_raw(<const float*>P[s.a], s.outer, s.ch, s.inner, s.fvec, s.ivec, s.round_first,
                                       <int32_t*>P[s.y])
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
        # dtype 1: split by columns, each thread the heads its attention task reads next (Plan._stack_linears)
        err = (<DynamicLinear>s.kernel).forward(<const float*>P[s.a], s.m, <float*>P[s.y], s.relu, s.dtype)
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
    elif s.op == PS_SEQUENCE:
        err = (<SequenceStep>s.kernel).run(<const float*>P[s.a], <const float*>slot_or_null(P, s.b),
                                           <const float*>slot_or_null(P, s.c), <float*>P[s.y], <float*>P[s.y2],
                                           <float*>slot_or_null(P, s.y3), <uint8_t*>P[s.s0])
    elif s.op == PS_EMBEDDING:
        if s.dtype:  # int32 indices
            err = (<EmbeddingTable>s.kernel).gather_int32(<const int32_t*>P[s.a], s.n, <float*>P[s.y])
        else:
            err = (<EmbeddingTable>s.kernel).gather(<const int64_t*>P[s.a], s.n, <float*>P[s.y])
    elif s.op == PS_SOFTMAX:  # dtype: 1 for log_softmax
        (<FloatOps>s.kernel).softmax_into(s.dtype, <const float*>P[s.a], <float*>P[s.y], s.outer, s.ch, s.inner)
    elif s.op == PS_COPY:
        copy_blocks(s, <const char*>P[s.a], <char*>P[s.y])
    elif s.op == PS_UNARY:  # dtype: the function's code (UNARY_OPS)
        (<FloatOps>s.kernel).unary_into(s.dtype, <const float*>P[s.a], <float*>P[s.y], s.n)
    elif s.op == PS_LAYER_NORM:  # scale: eps; b: the residual added to a first (the add fused), or none
        (<FloatOps>s.kernel).layer_norm_into(<const float*>P[s.a], <const float*>slot_or_null(P, s.b), s.fvec,
                                             s.fvec2, s.scale, <float*>P[s.y], s.m, s.n)
    elif s.op == PS_BINARY:
        (<BinaryStep>s.kernel).run(<const float*>P[s.a], <const float*>P[s.b], <float*>P[s.y])
    elif s.op == PS_SUM:  # dtype: 1 for mean
        (<FloatOps>s.kernel).sum_into(s.dtype, <const float*>P[s.a] if s.ch else NULL, <float*>P[s.y], s.outer, s.ch,
                                      s.inner)
    elif s.op == PS_BATCH_NORM:
        (<FloatOps>s.kernel).batch_norm_into(<const float*>P[s.a], s.fvec, s.fvec2, <float*>P[s.y], s.outer, s.ch,
                                             s.inner)
    elif s.op == PS_MASK:
        (<MaskStep>s.kernel).run(<const char*>P[s.a], <const char*>slot_or_null(P, s.b),
                                 <const char*>slot_or_null(P, s.c), <char*>P[s.y])
    elif s.op == PS_ATTENTION:
        err = (<AttentionStep>s.kernel).run(<const float*>P[s.a], <const float*>P[s.b], <const float*>P[s.c],
                                            slot_or_null(P, s.d), <float*>P[s.y])
    elif s.op == PS_MATMUL:
        err = (<MatmulStep>s.kernel).run(<const float*>P[s.a], <const float*>P[s.b], <float*>P[s.y])
    elif s.op == PS_GATHER:
        err = (<GatherStep>s.kernel).run(<const char*>P[s.a], <const int64_t*>P[s.b], <char*>P[s.y])
    elif s.op == PS_CUMSUM:
        (<CumsumStep>s.kernel).run(<const char*>P[s.a], <int64_t*>P[s.y])
    elif s.op == PS_CAT:
        parts[0], parts[1], parts[2], parts[3] = (<const char*>P[s.a], <const char*>slot_or_null(P, s.b),
                                                  <const char*>slot_or_null(P, s.c), <const char*>slot_or_null(P, s.d))
        (<CatStep>s.kernel).run(parts, <char*>P[s.y])
    return E_NATIVE if err else 0


cdef class SequenceStep:
    """A sequence op (rnn/lstm/gru_dynamic) at one input shape, as a program runs it: what
    qrt.recurrent.run_sequence computes (layers in turn, each direction's time loop writing its half of
    the layer's output, batch_first inputs and outputs, the final states), on the plan's arena.

    runs: one list of Recurrent per layer, one per direction (as qrt.recurrent.layer_runs makes them).
    The layout of the scratch (scratch_bytes, one arena block): the time-major copy of a batch-first
    input (batch > 1; at batch 1 both layouts are the same bytes), the outputs of the layers before the
    last (two, used in turn), and the time loops' own scratch. The last layer writes the op's output
    in place, batch first or not."""
    cdef list keep
    cdef PyObject** cells  # layers * dirs Recurrent, borrowed from keep
    cdef Py_ssize_t layers, dirs, hidden, n_in, steps, batch, block
    cdef bint has_cell, batch_first
    cdef Py_ssize_t x_at, buf_at[2], loop_at
    cdef readonly Py_ssize_t scratch_bytes

    def __cinit__(self):
        self.cells = NULL

    def __dealloc__(self):
        free(self.cells)

    def __init__(self, list runs, bint has_cell, bint batch_first, Py_ssize_t steps, Py_ssize_t batch):
        self.keep = [r for layer in runs for r in layer]
        self.layers, self.dirs = len(runs), len(runs[0])
        self.cells = <PyObject**>calloc(len(self.keep), sizeof(PyObject*))
        if self.cells == NULL:
            raise MemoryError()
        cdef Recurrent r, first = self.keep[0]
        cdef Py_ssize_t k, loop = 0
        for k, r in enumerate(self.keep):
            self.cells[k] = <PyObject*>r
        self.hidden, self.n_in = first.hidden, first.input_size
        self.has_cell, self.batch_first = has_cell, batch_first
        self.steps, self.batch = steps, batch
        # fixed here, with the scratch it needs: every cell has the same gate rows, so the same block
        self.block = first.sequence_block(steps, batch)
        for r in self.keep:
            loop = max(loop, r.sequence_scratch(steps, batch, self.block))
        layer_out = align64(steps * batch * self.dirs * self.hidden * sizeof(float))
        self.x_at = 0
        self.buf_at[0] = align64(steps * batch * self.n_in * sizeof(float)) if batch_first and batch > 1 else 0
        self.buf_at[1] = self.buf_at[0] + (layer_out if self.layers > 1 else 0)
        self.loop_at = self.buf_at[1] + (layer_out if self.layers > 2 else 0)
        self.scratch_bytes = self.loop_at + loop

    cdef int run(self, const float* x, const float* h0, const float* c0, float* y, float* h_n, float* c_n,
                 uint8_t* scratch) noexcept nogil:
        """y, h_n (, c_n) from x and the initial states (NULL: zeros); scratch: scratch_bytes, 64-aligned.
        Returns 1 if the input or a state holds NaN or infinity, -1 if out of memory."""
        cdef Py_ssize_t T = self.steps, B = self.batch, H = self.hidden, D = self.dirs, n, d, i
        cdef Py_ssize_t state = B * H, width = D * H, ldt, ldb
        cdef const float* src = x
        cdef float* out
        cdef float* c
        cdef int err = 0
        init_state(h_n, h0, self.layers * D * state)
        if self.has_cell:
            init_state(c_n, c0, self.layers * D * state)
        if self.batch_first and B > 1:  # time major, as the loops read it
            swap_leading(x, B, T, self.n_in, <float*>(scratch + self.x_at))
            src = <const float*>(scratch + self.x_at)
        for n in range(self.layers):
            # rows of time step t lie ldt floats apart, those of batch row i ldb apart
            out, ldt, ldb = <float*>(scratch + self.buf_at[n % 2]), B * width, width
            if n == self.layers - 1:  # the last layer writes the op's output, batch first or not
                out = y
                if self.batch_first:
                    ldt, ldb = width, T * width
            for d in range(D):
                i = n * D + d
                c = c_n + i * state if self.has_cell else h_n + i * state
                err = (<Recurrent>self.cells[i]).sequence_into(src, T, B, out + d * H, ldt, ldb, d == 1,
                                                                h_n + i * state, c, self.block,
                                                                scratch + self.loop_at)
                if err:
                    return err
            src = out
        return 0


cdef inline void init_state(float* state, const float* given, Py_ssize_t n) noexcept nogil:
    if given != NULL:
        memcpy(state, given, n * sizeof(float))
    else:
        memset(state, 0, n * sizeof(float))


cdef void swap_leading(const float* x, Py_ssize_t a, Py_ssize_t b, Py_ssize_t inner, float* y) noexcept nogil:
    """y [b, a, inner] = x [a, b, inner] with its first two dimensions swapped."""
    cdef Py_ssize_t i, j
    for i in range(a):
        for j in range(b):
            memcpy(y + (j * a + i) * inner, x + (i * b + j) * inner, inner * sizeof(float))


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


cdef inline bint of_type(a, int typenum):
    """Array a holds typenum's type, under its number or an equivalent one (np.longlong is int64 under a number
    of its own on Linux)."""
    cdef int t = cnp.PyArray_TYPE(a)
    return t == typenum or cnp.PyArray_EquivTypenums(t, typenum)


cdef class PlanProgram:
    """The steps of one model at one set of input shapes (built by qrt.plan)."""
    cdef plan_step* steps
    cdef int n_steps, n_slots
    cdef Py_ssize_t arena_size
    cdef list keep, pool, slots, inputs, input_types, fresh, call_slots, fallbacks, outputs
    cdef object spare  # a free buffer set kept apart from the pool: one thread's calls never resize a list
    cdef list direct  # per output: a fresh array of its own shape that no other output names, returned as it is
    # the input shapes it was compiled for, flat (dims) with each input's rank (ranks), for takes_shapes
    cdef cnp.npy_intp* dims
    cdef int* ranks
    cdef Py_ssize_t n_ranks

    def __cinit__(self):
        self.steps, self.dims, self.ranks = NULL, NULL, NULL

    def __dealloc__(self):
        free(self.steps)
        free(self.dims)
        free(self.ranks)

    cdef set_shapes(self, tuple shapes):
        """The input shapes this program was compiled for (the executor's key for it)."""
        cdef Py_ssize_t total = sum([len(s) for s in shapes])
        free(self.ranks)
        free(self.dims)
        self.n_ranks = len(shapes)
        self.ranks = <int*>calloc(max(self.n_ranks, 1), sizeof(int))
        self.dims = <cnp.npy_intp*>calloc(max(total, 1), sizeof(cnp.npy_intp))
        if self.ranks == NULL or self.dims == NULL:
            raise MemoryError()
        cdef Py_ssize_t i, at = 0
        for i, shape in enumerate(shapes):
            self.ranks[i] = len(shape)
            for d in shape:
                self.dims[at] = d
                at += 1

    cdef bint takes_shapes(self, list inputs):
        """Whether these arrays have the shapes this program was compiled for (a dict lookup by a tuple
        of their shapes answers the same, from Python objects made for it)."""
        cdef Py_ssize_t i, d, at = 0
        if len(inputs) != self.n_ranks:
            return False
        for i in range(self.n_ranks):
            a = inputs[i]
            if not cnp.PyArray_Check(a) or cnp.PyArray_NDIM(<cnp.ndarray>a) != self.ranks[i]:
                return False
            for d in range(self.ranks[i]):
                if cnp.PyArray_DIMS(<cnp.ndarray>a)[d] != self.dims[at + d]:
                    return False
            at += self.ranks[i]
        return True

    def __init__(self, dict spec):
        self.inputs = list(spec["inputs"])
        self.input_types = list(spec["input_types"])
        self.slots = list(spec["slots"])  # (kind, info, shape, dtype, read natively)
        self.n_slots = len(self.slots)
        self.arena_size = spec["arena_size"]
        self.fallbacks = list(spec["fallbacks"])
        self.outputs = list(spec["outputs"])
        self.keep, self.pool = [], []
        self.fresh = [(i, s[2], s[3].num, s[3].itemsize * math.prod(s[2])) for i, s in enumerate(self.slots)
                      if s[0] == SLOT_FRESH]  # (slot, shape, type, bytes)
        self.call_slots = [i for i, s in enumerate(self.slots) if s[0] in (SLOT_INPUT, SLOT_FRESH, SLOT_OBJECT)]
        named = [o[0] for o in self.outputs]
        self.direct = [o[0] >= 0 and self.slots[o[0]][0] == SLOT_FRESH and named.count(o[0]) == 1
                       and tuple(self.slots[o[0]][2]) == tuple(o[1]) for o in self.outputs]
        steps = spec["steps"]
        self.steps = <plan_step*>calloc(max(len(steps), 1), sizeof(plan_step))
        if self.steps == NULL:
            raise MemoryError()
        cdef plan_step* st
        for k, d in enumerate(steps):
            st = &self.steps[k]
            st.op, st.node = d["op"], d["node"]
            st.dtype, st.relu, st.round_first = d.get("dtype", 0), d.get("relu", 0), d.get("round_first", 0)
            st.a, st.b, st.c, st.d = d.get("a", -1), d.get("b", -1), d.get("c", -1), d.get("d", -1)
            st.y, st.y2, st.y3 = d.get("y", -1), d.get("y2", -1), d.get("y3", -1)
            st.s0, st.s1 = d.get("s0", -1), d.get("s1", -1)
            st.m, st.n = d.get("m", 0), d.get("n", 0)
            st.offset, st.stride, st.outer_stride = d.get("offset", 0), d.get("stride", 0), d.get("outer_stride", 0)
            st.outer, st.ch, st.inner = d.get("view", (0, 0, 0))
            st.scale, st.zp = d.get("scale", 0.0), d.get("zp", 0)
            if "kernel" in d:
                self.keep.append(d["kernel"])
                st.kernel = <PyObject*>d["kernel"]
            if "fvec" in d:
                st.fvec = <const float*>cnp.PyArray_DATA(self._keep(d["fvec"], np.float32))
            if "fvec2" in d:
                st.fvec2 = <const float*>cnp.PyArray_DATA(self._keep(d["fvec2"], np.float32))
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
        """A buffer set: the spare one, one from the pool, or a new one."""
        cdef _PlanBuffers bs
        if self.spare is not None:
            bs, self.spare = self.spare, None
            return bs
        try:
            return self.pool.pop()
        except IndexError:
            pass
        bs = _PlanBuffers.__new__(_PlanBuffers)
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

    cdef object call(self, list inputs, bint checked, double* times=NULL):
        """The outputs of one call, or None when the per-node path must answer it (an error to report
        as it reports it, or a fallback whose result changed shape). checked: the inputs conform. times
        (NULL: not timed): each step's seconds added to times[step]."""
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
            for slot, shape, typenum, nbytes in self.fresh:
                nd = len(shape)
                for i in range(nd):
                    dims[i] = shape[i]
                if nbytes >= LINE_ALIGNED_BYTES:
                    a = empty_on_a_line(nd, dims, typenum)
                else:
                    a = cnp.PyArray_EMPTY(nd, dims, typenum, 0)
                bs.ptrs[slot] = cnp.PyArray_DATA(a)
                bs.objs[slot] = a
            err = self.execute(bs, &failed, times)
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
            if self.spare is None:
                self.spare = bs
            else:
                self.pool.append(bs)

    cdef object profile(self, list inputs, int repeats):
        """(node index, seconds) of each step, in step order: the median over `repeats` calls (at least 1)
        of these inputs, which conform; None if a call was handed back."""
        cdef int r
        samples = np.zeros((max(repeats, 1), max(self.n_steps, 1)), np.float64)
        cdef double[:, ::1] t = samples
        for r in range(samples.shape[0]):
            if self.call(inputs, True, &t[r, 0]) is None:
                return None
        median = np.median(samples, axis=0)
        return [(self.steps[k].node, float(median[k])) for k in range(self.n_steps)]

    cdef bint conforms(self, int i, a):
        """Input i may be read as it is: an aligned C-contiguous array of its dtype in native byte order."""
        if not cnp.PyArray_Check(a):
            return False
        return (of_type(a, <int>self.input_types[i])
                and cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISBEHAVED_RO(a))

    cdef int execute(self, _PlanBuffers bs, int* failed, double* times) noexcept:
        cdef int k, err = 0
        cdef const plan_step* s
        cdef void** P = bs.ptrs
        cdef double t0 = 0
        with nogil:
            for k in range(self.n_steps):
                s = &self.steps[k]
                if times != NULL:
                    t0 = monotonic_seconds()
                if s.op == PS_FALLBACK:
                    with gil:
                        err = self.fallback(bs, s.m)
                else:
                    err = run_native(s, P)
                if times != NULL:
                    times[k] += monotonic_seconds() - t0
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
                if not cnp.PyArray_Check(r) or r.shape != shape or not of_type(r, <int>typenum):
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
        cdef Py_ssize_t j, n = len(self.outputs)
        cdef list out = [None] * n, handed = []
        cdef int slot, kind, i, nd
        cdef cnp.npy_intp dims[32]
        for j in range(n):
            spec = self.outputs[j]
            slot = spec[0]
            if self.direct[j]:
                out[j] = bs.objs[slot]
                if n > 1:  # a fallback's result among the other outputs may be this very array
                    handed.append(out[j])
                continue
            if slot < 0:  # a stored tensor
                out[j] = spec[1].copy()
                continue
            shape = spec[1]
            kind = self.slots[slot][0]
            if kind == SLOT_FRESH or kind == SLOT_OBJECT:
                v = bs.objs[slot]
                # a fallback's view (of the arena, an input, a stored tensor) or an array already handed
                # out (two outputs, one a reshape of the other, say) is copied: outputs are the caller's,
                # and never alias each other
                shared = (kind == SLOT_OBJECT and v.base is not None) or is_in(v, handed)
                handed.append(v)
                if v.shape != shape:
                    v = v.reshape(shape)
                out[j] = v.copy() if shared else v
                continue
            nd = len(shape)
            for i in range(nd):
                dims[i] = shape[i]
            v = cnp.PyArray_EMPTY(nd, dims, self.slots[slot][3].num, 0)
            memcpy(cnp.PyArray_DATA(v), bs.ptrs[slot], cnp.PyArray_NBYTES(v))
            out[j] = v
        return out


# A call's output arrays of this many bytes or more start on a cache line (empty_on_a_line). numpy aligns to 16
# bytes, and where an output is not on a line, every 64-byte vector store of the step writing it spans two: a
# dynamic Linear writing there took 1.1-1.25x its time at 128x384x1152, 1.05-1.15x at 512x256x256, 1.02-1.1x at
# M=64 K=N=1024 (one thread, runs of bench/output_alignment.py). An output on a line costs about 0.3 us more to
# make (a byte buffer and a view of it), more than a memory-bound step's split stores save below this size.
cdef Py_ssize_t LINE_ALIGNED_BYTES = 65536


def _set_line_aligned_bytes(Py_ssize_t n) -> int:
    """Set the size from which a call's outputs start on a cache line; returns the old one (bench A/Bs)."""
    global LINE_ALIGNED_BYTES
    old, LINE_ALIGNED_BYTES = LINE_ALIGNED_BYTES, n
    return old


cdef inline double monotonic_seconds() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9


cdef bint is_in(v, list objs):
    """Whether v is one of objs (by identity)."""
    for o in objs:
        if o is v:
            return True
    return False


cdef bint any_nested(inputs):
    for a in inputs:
        if type(a) is list or type(a) is tuple:
            return True
    return False


cdef bint gather(tree, value, list flat):
    """The arrays of value, nested as tree (a tuple of input indices and tuples), into flat at those
    indices; False if value is not nested that way (as deep as tree, no deeper)."""
    if type(tree) is int:
        flat[<Py_ssize_t>tree] = value
        return True
    if (type(value) is not list and type(value) is not tuple) or len(value) != len(<tuple>tree):
        return False
    for t, v in zip(<tuple>tree, value):
        if not gather(t, v, flat):
            return False
    return True


cdef object nest_outputs(tree, list out):
    """graph.nest: the tree with each output index replaced by that output."""
    if type(tree) is int:
        return out[<Py_ssize_t>tree]
    return tuple([nest_outputs(t, out) for t in <tuple>tree])


cdef class PlanExecutor:
    """Runs a model's programs by input shapes; ``miss(inputs)`` answers (and compiles) a new set of
    shapes, ``slow(inputs)`` answers a call the program hands back (the per-node path)."""
    cdef dict programs
    cdef object last  # the program of the last call: the next one usually has the same shapes
    cdef object miss, slow
    cdef Py_ssize_t n_inputs
    # calls a compiled program handed back to the per-node path (a kernel refused its input, a fallback
    # changed shape): each costs a second run, so tests and profiles look here
    cdef readonly Py_ssize_t handed_back
    # what call() takes and returns, as Model.run does (set_structure)
    cdef list names  # the inputs' names, for a dict of every input by name
    cdef object in_tree  # forward()'s arguments as nested tuples of input indices; None: flat
    cdef object out_tree  # the outputs' nesting; None: one array or a flat tuple (out_tuple)
    cdef bint out_tuple

    def __init__(self, Py_ssize_t n_inputs, miss, slow):
        self.programs = {}
        self.n_inputs, self.miss, self.slow = n_inputs, miss, slow
        self.names = [None] * n_inputs

    def set_structure(self, list names, in_tree, out_tree, bint out_tuple) -> None:
        """How call() takes its inputs and nests its outputs (see call)."""
        self.names, self.in_tree, self.out_tree, self.out_tuple = names, in_tree, out_tree, out_tuple

    def call(self, inputs):
        """Model.run's common call in one native call: inputs as Model.run takes them (one array, a flat
        list or tuple, a list or tuple nested as forward()'s arguments, a dict of every input by name)
        that a compiled program takes as they are; the outputs nested as Model.run returns them. None
        for anything else: the caller binds and checks the inputs, then calls run()."""
        cdef list flat
        if cnp.PyArray_CheckExact(inputs):
            flat = [inputs]
        elif type(inputs) is list or type(inputs) is tuple:
            if self.in_tree is not None and any_nested(inputs):
                flat = [None] * self.n_inputs
                if not gather(self.in_tree, inputs, flat):
                    return None
            else:
                flat = list(inputs)
        elif type(inputs) is dict:
            if len(inputs) != self.n_inputs:
                return None
            flat = [(<dict>inputs).get(name) for name in self.names]  # a missing name: None, not an array
        else:
            return None
        out = self._try_run(flat)
        return None if out is None else self.shaped(out)

    cdef object shaped(self, list out):
        """The flat outputs nested as Model.run returns them."""
        if self.out_tree is not None:
            return nest_outputs(self.out_tree, out)
        return tuple(out) if self.out_tuple else out[0]

    def add(self, tuple key, program) -> None:
        """The program for inputs of these shapes; None: answer them with the per-node path."""
        if program is not None:
            (<PlanProgram>program).set_shapes(key)
        self.programs[key] = program if program is not None else False

    def clear(self) -> None:
        self.programs, self.last = {}, None

    def program_count(self) -> int:
        return len(self.programs)

    def has_program(self, tuple key) -> bool:
        """Whether inputs of these shapes run a compiled program (not the per-node path)."""
        return bool(self.programs.get(key))

    def fallback_steps(self, tuple key) -> list | None:
        """The nodes ("node 'name' (op)") the program for these shapes runs through their Python step;
        None if there is no program."""
        prog = self.programs.get(key)
        if not prog:
            return None
        return [f[3] for f in (<PlanProgram>prog).fallbacks]

    def profile(self, list inputs, int repeats) -> list | None:
        """(node index, seconds) of each step of the compiled program for these arrays (as try_run takes
        them), the median of `repeats` calls; None if there is no such program or it handed a call back.
        Timing is on these calls only: run() and call() never read the clock."""
        if len(inputs) != self.n_inputs or not all(cnp.PyArray_Check(a) for a in inputs):
            return None
        prog = self.programs.get(tuple([a.shape for a in inputs]))
        if not prog or not all((<PlanProgram>prog).conforms(i, a) for i, a in enumerate(inputs)):
            return None
        return (<PlanProgram>prog).profile(inputs, repeats)

    def try_run(self, list inputs):
        """The outputs if a compiled program takes these arrays exactly as they are (shapes seen
        before, dtypes, C order, native byte order); else None: bind and check them, then run()."""
        return self._try_run(inputs)

    cdef object _try_run(self, list inputs):
        cdef Py_ssize_t i
        if len(inputs) != self.n_inputs:
            return None
        prog = self.last
        if prog is None or not (<PlanProgram>prog).takes_shapes(inputs):
            for a in inputs:
                if not cnp.PyArray_Check(a):
                    return None
            prog = self.programs.get(tuple([a.shape for a in inputs]))
            if not prog:
                return None
            self.last = prog
        for i in range(self.n_inputs):
            if not (<PlanProgram>prog).conforms(i, inputs[i]):
                return None
        out = (<PlanProgram>prog).call(inputs, True)
        return self.hand_back(inputs) if out is None else out

    def stream_step(self, inputs, list free, list state, list state_in, list state_out):
        """Stream.step's common call: the outputs, nested as Model.run returns them, for `inputs` (one array
        or a sequence, at the positions `free`) and `state` (at `state_in`), if a compiled program takes
        these arrays as they are; the new state (outputs `state_out`, made read-only) replaces state's
        items. None: Stream.step checks them."""
        cdef Py_ssize_t i
        cdef list given
        if cnp.PyArray_CheckExact(inputs):
            given = [inputs]
        elif type(inputs) is list or type(inputs) is tuple:
            given = list(inputs)
        else:
            return None
        if len(given) != len(free) or len(free) + len(state) != self.n_inputs:
            return None
        cdef list flat = [None] * self.n_inputs
        for i in range(len(free)):
            flat[<Py_ssize_t>free[i]] = given[i]
        for i in range(len(state)):
            flat[<Py_ssize_t>state_in[i]] = state[i]
        out = self._try_run(flat)
        if out is None:
            return None
        for i in range(len(state_out)):
            a = out[<Py_ssize_t>state_out[i]]
            cnp.PyArray_CLEARFLAGS(<cnp.ndarray>a, cnp.NPY_ARRAY_WRITEABLE)
            state[i] = a
        return self.shaped(out)

    cdef hand_back(self, list inputs):
        self.handed_back += 1
        return self.slow(inputs)

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
        return self.hand_back(inputs) if out is None else out
