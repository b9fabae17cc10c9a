"""How packer compiles its numba kernels, and what keeps a first run (empty JIT cache) short.

A kernel is compiled the first time it is called with new argument types, then cached on disk
(`cache=True`), so only a run on an empty cache pays for it. What that first run costs:

- A kernel called from a kernel is compiled once per *literal* argument type it meets:
  `f(x, 0)` and `f(x, 1)` are two compilations, and so is `f(x, n)` while type inference still
  holds `n = 0` as the literal 0. `kernel` and `helper` type the arguments of such nested
  calls without their literal values, so each helper is compiled once.
- Each compiled function costs a fixed tenth of a second or so (a third less for a `helper`,
  which has no Python entry point), and each numba feature pulls its own machinery into the
  compilation: array allocation, slice assignment (it formats an error message with the
  shapes), `typed.List`. The kernels on `pack`'s path therefore write into arrays their
  Python callers allocate, copy with loops, and take no typed lists.
- `pack` compiles the kernels it needs in a background thread while its input is being read,
  and `packer warmup` compiles all of them ahead of time (for an image build or a CI cache):
  see `packer.pipelines.warmup`.
"""

from __future__ import annotations

from numba import njit
from numba.core import types


def kernel(py_func):
    """A kernel called from Python: `njit(cache=True, nogil=True)`, typing the calls it makes
    to helpers without literal argument values."""
    return _unliteral_calls(njit(cache=True, nogil=True)(py_func))


def helper(py_func):
    """A function that only kernels call: compiled without the Python and C entry points a
    kernel needs (about a third of a small function's compile time) and not cached on its own
    (its code is part of each calling kernel's cache entry)."""
    options = {"nogil": True, "no_cpython_wrapper": True, "no_cfunc_wrapper": True}
    return _unliteral_calls(njit(**options)(py_func))


def _unliteral_calls(dispatcher):
    resolve = dispatcher.get_call_template

    def get_call_template(args, kws):
        args = tuple(types.unliteral(a) for a in args)
        return resolve(args, {k: types.unliteral(v) for k, v in kws.items()})

    dispatcher.get_call_template = get_call_template
    return dispatcher
