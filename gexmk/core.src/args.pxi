# ---- integer arguments from Python (STYLE rule 13) ---------------------------
#
# Every integer a user passes goes through one of these: an exact ``int`` takes
# a C fast path (no exception machinery, nothing allocated), anything else goes
# through ``__index__`` (numpy integers are welcome, floats, Decimal and str
# are not), and a value outside the C range raises a gexmk error that names the
# parameter and the range, never Cython's bare OverflowError.
#
# ``sig`` names the call: "put(rank, dest, src)" or just "addr".  Messages
# start with the name before the parenthesis ("put: rank must be an int (got
# float 0.7)"); the full signature is added where the argument looks like one
# meant for another parameter (a buffer where an int belongs), the usual sign
# of arguments in the wrong order.
#
# bool: accepted where Python's __index__ would be natural (ranks, indices,
# values); refused where it can only be a mistake (sizes, addresses, codes and
# flags such as dt, op, caps), as segment_create has always done.

from cpython.buffer cimport PyObject_CheckBuffer
from cpython.long cimport PyLong_AsUnsignedLongLong
from cpython.number cimport PyNumber_Index
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.limits cimport INT_MIN, INT_MAX

cdef extern from *:
    """
    /* 1 and *out = x for an exact int x that fits a long long, else 0 (too
     * large: the caller takes its general path).  Never raises.  Small values
     * (every rank, size and user-space address on CPython 3.11: up to two
     * 30-bit digits) are read in place, as Cython's own conversions do, so that
     * the checked conversion costs no more than Cython's unchecked one; the
     * rest goes through PyLong_AsLongLongAndOverflow. */
    static inline int gx_exact_int_ll(PyObject *x, long long *out)
    {
    #if !defined(Py_LIMITED_API) && PY_VERSION_HEX >= 0x030C0000
        if (PyUnstable_Long_IsCompact((PyLongObject *)x)) {
            *out = (long long)PyUnstable_Long_CompactValue((PyLongObject *)x);
            return 1;
        }
    #elif !defined(Py_LIMITED_API)
        const digit *d = ((PyLongObject *)x)->ob_digit;
        switch (Py_SIZE(x)) {
        case 0: *out = 0; return 1;
        case 1: *out = (long long)d[0]; return 1;
        case -1: *out = -(long long)d[0]; return 1;
        case 2: *out = (long long)(((unsigned long long)d[1] << PyLong_SHIFT) | d[0]); return 1;
        case -2: *out = -(long long)(((unsigned long long)d[1] << PyLong_SHIFT) | d[0]); return 1;
        default: break;
        }
    #endif
        int overflow = 0;
        *out = PyLong_AsLongLongAndOverflow(x, &overflow);   /* no error for an exact int */
        return !overflow;
    }
    """
    bint _exact_int_ll "gx_exact_int_ll" (object x, long long* out) noexcept


cdef str _fn(str sig):
    return sig.partition("(")[0]


cdef str _got(object x):
    """What the user passed, briefly: 'float 0.7', 'ndarray'."""
    name = type(x).__name__
    try:
        r = repr(x)
    except Exception:
        return name
    if len(r) > 40 or "\n" in r:
        return name
    if name in r.partition("(")[0]:       # Decimal('0'), np.float64(0.5): named already
        return r
    return f"{name} {r}"


cdef str _order_hint(object x, str sig):
    """'; the arguments are put(rank, dest, src)' when ``x`` looks like it was
    meant for another parameter (a buffer or an (address, nbytes) tuple)."""
    # numpy scalars export buffers too, but are numbers: no hint for them
    if "(" in sig and (type(x) is tuple or PyObject_CheckBuffer(x)) \
            and not isinstance(x, numbers.Number):
        return f"; the arguments are {sig}"
    return ""


cdef object _as_int(object x, str sig, str name, bint allow_bool=True):
    """``x`` as an exact Python int, through ``__index__``; TypeError naming
    ``name`` for anything else (floats are never truncated)."""
    if type(x) is int:
        return x
    if type(x) is bool and not allow_bool:
        raise TypeError(f"{_fn(sig)}: {name} must be an int, not a bool (got {x!r})")
    try:
        return PyNumber_Index(x)
    except TypeError:
        pass
    raise TypeError(f"{_fn(sig)}: {name} must be an int (got {_got(x)}){_order_hint(x, sig)}")


cdef long long _index_slow(object x, str sig, str name, long long lo, long long hi,
                           bint allow_bool) except? -1:
    i = _as_int(x, sig, name, allow_bool)
    if lo <= i <= hi:
        return <long long>i
    if lo == hi:
        raise ArgumentError(f"{_fn(sig)}: {name} must be {lo} (got {i})")
    raise ArgumentError(f"{_fn(sig)}: {name} must be in {lo}..{hi} (got {i})")


cdef inline long long _as_index(object x, str sig, str name, long long lo, long long hi,
                                bint allow_bool=True) except? -1:
    """An integer in [lo, hi]; ArgumentError naming ``name`` and the range
    otherwise."""
    cdef long long v
    if type(x) is int and _exact_int_ll(x, &v) and lo <= v <= hi:
        return v
    return _index_slow(x, sig, name, lo, hi, allow_bool)


cdef int _rank_slow(object x, str sig, const gx_team* tm) except? -1:
    i = _as_int(x, sig, "rank")
    if INT_MIN <= i <= INT_MAX:
        return <int>i      # the C path reports ranks outside the team, as for any int
    cdef Team team = <Team>tm.owner if tm.owner != NULL else None
    if team is not None and team._closed is not None:
        raise StateError(f"{_fn(sig)}: {team._closed}")
    raise RankError(f"{_fn(sig)}: rank {i} is outside the team (size {tm.size})")


cdef inline int _as_rank(object x, str sig, const gx_team* tm) except? -1:
    """A team rank as a C int.  Only the conversion: whether it is inside the
    team is checked where it is used (the C data path checks it anyway), with
    the same message ("put: rank 5 is outside the team (size 2)")."""
    cdef long long v
    if type(x) is int and _exact_int_ll(x, &v) and INT_MIN <= v <= INT_MAX:
        return <int>v
    return _rank_slow(x, sig, tm)


cdef unsigned long long _uint_slow(object x, str sig, str name, unsigned long long hi,
                                   object exc, str what) except? 0xFFFFFFFFFFFFFFFF:
    i = _as_int(x, sig, name, False)
    if 0 <= i <= hi:
        return PyLong_AsUnsignedLongLong(i)
    raise exc(f"{_fn(sig)}: {name} must be {what} in 0..{hi:#x} (got {i})")


cdef inline uintptr_t _as_addr(object x, str sig, str name,
                               object exc=BoundsError) except? 0xFFFFFFFFFFFFFFFF:
    """An address (uintptr_t range).  Out of range: ``exc`` (BoundsError for
    remote addresses, which then lie outside every segment)."""
    cdef long long v
    if type(x) is int and _exact_int_ll(x, &v) and v >= 0:
        return <uintptr_t>v
    return <uintptr_t>_uint_slow(x, sig, name, <uintptr_t>-1, exc, "an address")


cdef inline size_t _as_size(object x, str sig, str name) except? 0xFFFFFFFFFFFFFFFF:
    """A byte count (size_t range); ArgumentError naming ``name`` otherwise."""
    cdef long long v
    if type(x) is int and _exact_int_ll(x, &v) and v >= 0:
        return <size_t>v
    return <size_t>_uint_slow(x, sig, name, <size_t>-1, ArgumentError, "a byte count")
