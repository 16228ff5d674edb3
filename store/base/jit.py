"""The compiled loops' loader: numba is imported here, in the background, never on a latency path.

Every kernel module (:mod:`store.kernels.record_assembly`, :mod:`store.kernels.segment_walk`, ...) writes its
loops as plain Python over NumPy arrays and registers them with :func:`kernel_set`.  A call
site asks the set for its loops with the work the call will do (records, rows or entries) and
gets, per call:

* the **compiled** loop (numba, ``cache=True``) when this process has it for the argument
  types of the call;
* else, for work of at most :data:`FALLBACK_MAX_WORK` units, the **same loop run as Python**
  (the function's own code with the set's helpers, byte for byte the compiled one's results,
  tested so), while a background thread imports numba and loads (or, on a fresh install,
  compiles) that signature;
* else (a large batch: a recovery, a backfill read) the compiled loop, loaded or compiled
  right there, as every call did before this module: at that size the compiled loop's
  speed is worth the wait.

Why: numba's import and the load of its cached machine code take 0.3-0.6 s in a fresh
process, and a fresh install (an empty cache) compiles every loop on its first use, 3-4 s
for delivery's.  Delivery, a server's first seconds, a Spark worker's first small batch and
a single send must not wait for that: a message due one second after a start must reach its
topic on time.  The Python loops cost tens of microseconds per record, so they serve small
batches until the compiled ones are in.

:func:`warm_up` (``rmq serve``, a streaming query's delivery step, ``rmq doctor``) runs the
paths delivery, reads and writes take on a throw-away store and waits until every signature
they used is compiled; ``background=True`` does it in a daemon thread.  ``rmq doctor`` runs it
in the foreground, so that a fresh install's cache is filled before the first real run.
"""

from __future__ import annotations

import logging
import queue
import threading
from types import FunctionType

import numpy as np

log = logging.getLogger("store.base.jit")

#: Largest work (records, rows, entries) a call runs as Python while its compiled loop is
#: not loaded yet: about 0.2 s of Python at most on the development machine (see docs/benchmarks.md).
FALLBACK_MAX_WORK = 512

#: Every kernel set of this process, in the order their modules were imported.
_SETS: list["KernelSet"] = []


#: Arguments other than arrays and numbers, as examples to type: the C functions of
#: :func:`c_function` by ``id`` (kept alive, so the ``id`` stays theirs), anything else one
#: per type (bounded: a new object per call must not grow it, nor ask for a compile per call).
_OBJECTS: dict[object, object] = {}


def _arg_key(a):
    """What decides the numba type of one argument, cheaply (no numba import)."""
    kind = type(a)
    if kind is int or kind is bool or kind is float:  # (most arguments: tested first)
        return kind
    if kind is np.ndarray:  # (then arrays: their flags read once)
        f = a.flags
        layout = "C" if f.c_contiguous else ("F" if f.f_contiguous else "A")
        return ("array", a.dtype, a.ndim, layout, not f.writeable)
    if isinstance(a, np.ndarray):
        f = a.flags
        layout = "C" if f.c_contiguous else ("F" if f.f_contiguous else "A")
        return ("array", a.dtype, a.ndim, layout, not f.writeable)
    if isinstance(a, np.generic):
        return ("scalar", a.dtype.str)
    if isinstance(a, (bool, int, float)):
        return type(a)
    # a C function (the CRC, memcpy) by identity (ctypes objects don't hash), others by type
    which = id(a) if id(a) in _AS_PYTHON else type(a)
    _OBJECTS.setdefault(which, a)
    return ("object", which)


def _prototype(key):
    """A value whose numba type is the type of every argument of ``key``."""
    if isinstance(key, type):
        return key(0)
    kind = key[0]
    if kind == "scalar":
        return np.dtype(key[1]).type(0)
    if kind == "object":
        return _OBJECTS[key[1]]
    _, dtype, ndim, layout, readonly = key
    if layout == "A":
        value = np.zeros((4,) * ndim, dtype)[(slice(None, None, 2),) * ndim]
    elif layout == "F" and ndim > 1:
        value = np.zeros((2,) * ndim, dtype, order="F")
    else:
        value = np.zeros((1,) * ndim, dtype)
    if readonly:
        value.setflags(write=False)
    return value


class _Compiler:
    """One daemon thread per process that imports numba and compiles (or loads from numba's
    cache) the signatures the Python loops served, one at a time."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)

    def submit(self, kset: "KernelSet", name: str, key: tuple) -> None:
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rmq-jit", daemon=True)
                self._thread.start()
        self._queue.put((kset, name, key))

    def _run(self) -> None:
        while True:
            kset, name, key = self._queue.get()
            try:
                kset.compile_signature(name, key)
            except Exception:  # noqa: BLE001 - the call that needs it compiles and raises
                log.exception("compiling %s.%s failed", kset.module, name)
            finally:
                with self._lock:
                    self._pending -= 1
                    if not self._pending:
                        self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or compiling; ``False`` on a timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)


_COMPILER = _Compiler()


#: Python callables standing in for C functions kernels take as arguments, by ``id``: a
#: ``ctypes`` function refuses NumPy integers, which the Python loops pass it.
_AS_PYTHON: dict[int, object] = {}


def c_function(fn):
    """Register ``fn`` (a ``ctypes`` function a kernel takes as an argument: the CRC, memcpy)
    so that the Python loops call it with NumPy integers; returns ``fn``."""
    _AS_PYTHON[id(fn)] = (fn, lambda *args: fn(*map(int, args)))
    return fn


def _python_args(args: tuple) -> tuple[tuple, list]:
    """The arguments as the Python loops take them, and the arrays to copy back after the
    call: C functions wrapped (:func:`c_function`), and integer arrays narrower than 64 bits
    (Arrow's int32 offsets) widened, since NumPy keeps an ``int32`` element's width when a
    Python int is added to it where numba widens to int64."""
    out, back = [], []
    for a in args:
        if isinstance(a, np.ndarray):
            if a.dtype.kind in "iu" and 1 < a.dtype.itemsize < 8:
                wide = a.astype(np.int64)
                if a.flags.writeable:
                    back.append((a, wide))
                a = wide
        else:
            entry = _AS_PYTHON.get(id(a))
            if entry is not None and entry[0] is a:
                a = entry[1]
        out.append(a)
    return tuple(out), back


class KernelSet:
    """The loops of one kernel module, compiled or as Python (see the module doc)."""

    def __init__(self, namespace: dict, helpers: tuple[str, ...], kernels: tuple[str, ...]):
        self.module = namespace["__name__"]
        self._namespace = namespace
        self._helpers = helpers
        self._names = kernels
        self._lock = threading.Lock()
        self._dispatchers: dict | None = None
        self._ready: dict[str, set] = {name: set() for name in kernels}
        self._asked: set = set()
        self._python = self._python_loops(dict(namespace))
        _SETS.append(self)

    def _python_loops(self, snapshot: dict) -> dict:
        """The kernels as Python functions resolving their helpers in ``snapshot`` (a copy of
        the module's globals taken before numba replaced any of them)."""
        for name in self._helpers + self._names:
            f = snapshot[name]
            snapshot[name] = FunctionType(f.__code__, snapshot, name, f.__defaults__,
                                          f.__closure__)
        return {name: snapshot[name] for name in self._names}

    # -- numba ------------------------------------------------------------------------------

    def dispatchers(self) -> dict:
        """numba's dispatchers of the kernels (numba imported on the first call)."""
        if self._dispatchers is None:
            with self._lock:
                if self._dispatchers is None:
                    from numba import njit

                    jit = njit(cache=True, nogil=True)
                    namespace = self._namespace
                    for name in self._helpers:
                        namespace[name] = jit(namespace[name])
                    self._dispatchers = {name: jit(namespace[name]) for name in self._names}
        return self._dispatchers

    def compile_signature(self, name: str, key: tuple) -> None:
        """Load from numba's cache, or compile, kernel ``name`` for the argument ``key``."""
        from numba import typeof

        dispatcher = self.dispatchers()[name]
        dispatcher.compile(tuple(typeof(_prototype(k)) for k in key))
        self._ready[name].add(key)

    # -- calls --------------------------------------------------------------------------------

    def __call__(self, work: int) -> "Loops":
        """The loops for a call doing ``work`` units (records, rows, entries)."""
        return Loops(self, int(work))

    def run(self, name: str, work: int, args: tuple):
        key = tuple(map(_arg_key, args))
        ready = self._ready[name]
        if key in ready:
            return self._dispatchers[name](*args)
        if work <= FALLBACK_MAX_WORK:
            if (name, key) not in self._asked:
                self._asked.add((name, key))
                _COMPILER.submit(self, name, key)
            python_args, back = _python_args(args)
            with np.errstate(all="ignore"):  # the compiled loops wrap around silently too
                result = self._python[name](*python_args)
            for array, wide in back:
                array[...] = wide
            return result
        result = self.dispatchers()[name](*args)
        ready.add(key)
        return result

    def loaded_or_ask(self, name: str, args: tuple) -> bool:
        """Whether kernel ``name`` is compiled and loaded for these arguments; if not, ask the
        background thread to load (or compile) it and say ``False`` at once.  For callers with
        a path of their own for any size (the NumPy reads): they never wait for numba."""
        key = tuple(map(_arg_key, args))
        if key in self._ready[name]:
            return True
        if (name, key) not in self._asked:
            self._asked.add((name, key))
            _COMPILER.submit(self, name, key)
        return False

    @property
    def loaded(self) -> bool:
        """Whether numba's dispatchers of this set exist (numba imported)."""
        return self._dispatchers is not None

    def ready(self) -> bool:
        """Whether every signature asked for so far is compiled."""
        return all(key in self._ready[name] for name, key in list(self._asked))


class Loops:
    """The kernels of a :class:`KernelSet` for one call's work: ``loops["name"](*args)``."""

    __slots__ = ("_set", "_work")

    def __init__(self, kset: KernelSet, work: int):
        self._set, self._work = kset, work

    def __getitem__(self, name: str):
        kset, work = self._set, self._work
        return lambda *args: kset.run(name, work, args)


def kernel_set(namespace: dict, *, helpers: tuple[str, ...] = (),
               kernels: tuple[str, ...] = ()) -> KernelSet:
    """Register the kernels of a module (its ``globals()``; ``helpers``: the functions they
    call, compiled with them)."""
    return KernelSet(namespace, helpers, kernels)


def ready() -> bool:
    """Whether numba is loaded in this process and every loop a call ran as Python is
    compiled by now (``False`` in a fresh process: nothing is loaded yet)."""
    return any(s.loaded for s in _SETS) and all(s.ready() for s in _SETS)


def wait_compiled(timeout: float | None = None) -> bool:
    """Wait until the background compiler has nothing left; ``False`` on a timeout."""
    return _COMPILER.wait_idle(timeout)
