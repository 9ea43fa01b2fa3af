"""Numba's on-disk cache for the tokenizer's kernels, made stale by an edit to any of them.

``cached_njit(**options)`` is ``numba.njit(cache=True, **options)`` with a different
staleness rule, and one compiled version per argument *type* (see ``KernelDispatcher``).
Numba's own rule stamps a cached kernel with the source of its own file only, but a
compiled kernel embeds every jitted function it calls (inlined or linked), so after an
edit to viterbi.py the cached ``encode_raw`` still counts as fresh and runs the old
Viterbi (once it segfaulted on a changed layout). Here the
stamp is a hash over every ``.py`` file under this package, and the cache directory
is named after it: any edit to any module a kernel can call gives an empty directory.
The rule this relies on, that kernels call only jitted functions defined in this
package, is checked by tests/test_tokenizer_kernel_cache.py.

Where the caches go (the first writable, the order Numba itself tries)::

    <parent>/<package>-<hash16>/<sub-package path>/<Numba's usual .nbi/.nbc files>
    parent: Numba's NUMBA_CACHE_DIR when set, else this package's __pycache__,
            else Numba's user-wide cache directory

Directories of older sources are never read again; deleting them is always safe.

Processes sharing a cache compile a kernel once between them: compiling a kernel for
one signature takes that signature's lock file (beside the kernel's index), so a second
process that needs the same compile meanwhile (two test workers, the replicas of a cold
``embedserve cluster``) waits, then loads what the first wrote. Nothing else waits on
it: a signature already on disk is loaded without any lock, and another signature of the
same kernel compiles beside it (in hf mode ``encode()`` and ``encode_batch()`` are two
signatures of one kernel family, each tens of seconds to compile). Only the index's
read-modify-write is serialized, under the kernel's own lock. Compile locks are taken
caller first, callee second, in call-graph order, and the index lock is taken with no
other lock taken after it, so two processes can never hold each other's.

A kernel's first call for a signature (loaded from disk or compiled) is announced as a
Numba event (``FIRST_CALL_EVENT``; ``on_first_call`` listens), tagged with whether it
ran inside ``warming_up()``: a server counts first calls outside its warm-up, which
are compiles or loads a request waited for. ``warming_up(compile=False)`` turns a
compile into ``KernelNotCached``: a server learns whether the cache holds what it needs
in the time a load takes, and compiles elsewhere when it does not.

This module owns where kernel caches live, when they are stale and which argument
types a kernel is compiled for, not what is compiled. It imports nothing from
embedserve (a test runs it from a copied package).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from numba.core import config, event, sigutils, types
from numba.core.caching import CompileResultCacheImpl, FunctionCache, _CacheLocator
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher
from numba.misc.appdirs import AppDirs

SOURCE_ROOT = Path(__file__).resolve().parent  # every module a kernel may call lives under here
_HASH_CHARS_IN_NAME = 16  # 64 bits of the hash name the directory; the index holds all of it
# The Numba event a kernel's first call for a signature triggers; its data is a FirstCall.
FIRST_CALL_EVENT = "embedserve:kernel_first_call"


class KernelNotCached(RuntimeError):
    """A kernel would compile inside ``warming_up(compile=False)``: the disk cache lacks it."""


class FirstCall(dict):
    """What a first call's event carries: ``kernel`` (its name), ``warm_up`` (inside
    ``warming_up()``), ``from_disk`` (loaded, not compiled)."""


class _WarmUpState(threading.local):
    """This thread's ``warming_up()`` block, if any. Per thread, as the caller's scope
    is: a request on another thread meanwhile is not warming up. (Module state
    because Numba's dispatchers, which read it, are module-level objects too.)"""

    active = False
    compile = True


_warm_up_state = _WarmUpState()


@contextlib.contextmanager
def warming_up(compile: bool = True) -> Iterator[None]:
    """Tag this thread's kernel first calls as warm-up; ``compile=False``: raise
    ``KernelNotCached`` instead of compiling a kernel the disk cache lacks."""
    state = _warm_up_state
    before = state.active, state.compile
    state.active, state.compile = True, compile and state.compile
    try:
        yield
    finally:
        state.active, state.compile = before


@contextlib.contextmanager
def on_first_call(listener: Callable[[FirstCall], None]) -> Iterator[None]:
    """Call ``listener`` after each kernel first call (any thread) while the block runs."""
    numba_listener = _FirstCallListener(listener)
    event.register(FIRST_CALL_EVENT, numba_listener)
    try:
        yield
    finally:
        event.unregister(FIRST_CALL_EVENT, numba_listener)


class _FirstCallListener(event.Listener):
    def __init__(self, listener: Callable[[FirstCall], None]) -> None:
        self._listener = listener

    def on_start(self, ev: event.Event) -> None:
        pass

    def on_end(self, ev: event.Event) -> None:
        # Failed compiles too: they took the time. (Numba's Event.is_failed reads inverted.)
        self._listener(ev.data)


@functools.cache
def source_tree_hash(root: Path) -> str:
    """sha256 over the relative path and content of every .py file under ``root``.

    Computed once per process: a running process keeps the code it imported, whatever
    happens to the files afterwards.
    """
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        for part in (path.relative_to(root).as_posix().encode(), path.read_bytes()):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()


def _cache_parents() -> list[Path]:
    parents = [Path(config.CACHE_DIR)] if config.CACHE_DIR else []
    return parents + [SOURCE_ROOT / "__pycache__", Path(AppDirs(appname="numba", appauthor=False).user_cache_dir)]


class SourceTreeLocator(_CacheLocator):
    """Puts a kernel's cache under a directory named by the source tree's hash."""

    def __init__(self, cache_path: Path, stamp: str, lineno: int):
        self._cache_path = str(cache_path)
        self._stamp = stamp
        self._lineno = lineno

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> str:
        return self._stamp

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        source = Path(py_file).resolve()
        if not source.is_relative_to(SOURCE_ROOT):
            return None
        stamp = source_tree_hash(SOURCE_ROOT)
        # The sub-package path keeps kernels of same-named files in different folders apart.
        relative = source.parent.relative_to(SOURCE_ROOT)
        for parent in _cache_parents():
            locator = cls(parent / f"{SOURCE_ROOT.name}-{stamp[:_HASH_CHARS_IN_NAME]}" / relative, stamp,
                          py_func.__code__.co_firstlineno)
            try:
                locator.ensure_cache_path()
            except OSError:
                continue
            return locator
        return None


class _SourceTreeCacheImpl(CompileResultCacheImpl):
    _locator_classes = [SourceTreeLocator]


class SourceTreeCache(FunctionCache):
    """Numba's per-function cache, located and stamped by ``SourceTreeLocator``."""

    _impl_class = _SourceTreeCacheImpl

    def _index_key(self, sig, codegen):
        # The key carries the hash as well: NUMBA_CACHE_LOCATOR_CLASSES can replace the
        # locator above, and even then an entry compiled from other sources must not match.
        return super()._index_key(sig, codegen) + (source_tree_hash(SOURCE_ROOT),)

    def holds(self, sig, codegen) -> bool:
        """Whether the on-disk index has this kernel for ``sig`` (what Numba's compile passes).

        Read without a lock: Numba replaces the index file whole, so a reader sees it
        before or after a save, never halfway.
        """
        return self._index_key(sig, codegen) in self._cache_file._load_index()

    def compile_lock_path(self, args: tuple) -> Path:
        """The file whose lock a process holds while it compiles this kernel for ``args``."""
        digest = hashlib.sha256(str(args).encode()).hexdigest()[:16]
        return Path(self._cache_path) / f"{self._impl.filename_base}.{digest}.lock"

    @property
    def index_lock_path(self) -> Path:
        """The file whose lock a process holds while it adds an entry to this kernel's index."""
        return Path(self._cache_path) / f"{self._impl.filename_base}.lock"

    def _save_overload(self, sig, data) -> None:
        # Numba's save reads the index, adds an entry and picks the next free data file
        # name: two processes saving other signatures at once would each drop the
        # other's entry and write the same data file.
        with _locked(self.index_lock_path):
            super()._save_overload(sig, data)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path``: released when the block ends or the process dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class KernelDispatcher(CPUDispatcher):
    """Numba's CPU dispatcher, compiling a kernel called from another kernel for the plain
    types of its arguments, never for their constant values.

    Numba types a constant argument (``_feed(tables, 32, ...)``, ``encode_raw(..., False,
    ...)``) as a literal and compiles the callee anew for it; while it infers a caller's
    types it even compiles callees for a variable's first, literal type (a counter that
    starts as ``Literal[int](0)``) before that settles to ``int64``. Each of those compiles
    costs as much as the general one and runs the same code: cold, the WordPiece
    normalizer's ``_feed`` compiled four times (24 s of a 51 s load). Kernels here never
    need a literal argument, so a call is typed, compiled and cached for the literals'
    plain types.
    """

    _holds_compile_lock = False   # this process compiles this kernel now (a recursive call)

    def get_call_template(self, args, kws):
        return super().get_call_template(tuple(types.unliteral(a) for a in args),  # type: ignore[attr-defined]  # numba's stubs lack unliteral
                                         {k: types.unliteral(v) for k, v in kws.items()})  # type: ignore[attr-defined]

    def compile(self, sig):
        """Numba's compile (memory, else disk cache, else compile and save); a compile runs
        under the signature's lock, so that what another process is compiling is loaded,
        not redone."""
        args, _ = sigutils.normalize_signature(sig)
        args = tuple(args)
        cache = self._cache
        if args in self.overloads:
            return super().compile(sig)
        # A dispatcher rebuilt from a pickle has Numba's own cache, without lock files.
        if self._holds_compile_lock or not isinstance(cache, SourceTreeCache):
            with self._first_call(False):
                return super().compile(sig)
        # Numba's lock first: this process's threads queue on it, never on the file.
        with global_compiler_lock:
            if cache.holds(sig, self.targetctx.codegen()):
                with self._first_call(True):
                    return super().compile(sig)  # a load from disk, keyed by ``sig`` as Numba's is
            if not _warm_up_state.compile:
                raise KernelNotCached(f"{self.py_func.__qualname__}{args}: not in the disk cache")
            with _locked(cache.compile_lock_path(args)), self._first_call(False):
                self._holds_compile_lock = True
                try:
                    return super().compile(sig)
                finally:
                    self._holds_compile_lock = False

    def _first_call(self, from_disk: bool):
        """The first-call event around a load or compile of this kernel."""
        return event.trigger_event(FIRST_CALL_EVENT, data=FirstCall(
            kernel=self.py_func.__qualname__, warm_up=_warm_up_state.active, from_disk=from_disk))


def cached_njit(**options) -> Callable:
    """``numba.njit(**options)`` as a ``KernelDispatcher``, its on-disk cache a ``SourceTreeCache``."""
    if "cache" in options:
        raise TypeError("cached_njit always caches; pass no 'cache' option")

    def decorate(fn):
        if config.DISABLE_JIT:  # what numba.njit returns then: the plain function
            return fn
        # What numba.njit(**options) builds, as this dispatcher class.
        dispatcher = KernelDispatcher(py_func=fn, locals={},
                                      targetoptions={**options, "nopython": True, "boundscheck": None})
        # What Dispatcher.enable_caching() (cache=True) does, with this cache class.
        dispatcher._cache = SourceTreeCache(dispatcher.py_func)
        return dispatcher

    return decorate
