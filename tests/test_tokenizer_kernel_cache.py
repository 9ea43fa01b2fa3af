"""The kernels' on-disk cache: reused when nothing changed, never stale after an edit.

The behaviour tests run a small package in fresh processes: ``kpkg/caller.py`` holds
a cached kernel that calls jitted functions of ``kpkg/callee.py``, and
``kpkg/kernel_cache.py`` is a copy of embedserve's, so its source tree is ``kpkg``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from numba.core.dispatcher import Dispatcher

import embedserve.tokenizer
from embedserve.tokenizer import kernel_cache
from embedserve.tokenizer.kernel_cache import SOURCE_ROOT, SourceTreeCache, source_tree_hash

CALLEE = '''
import numba as nb

@nb.njit(inline="always")
def add(x):
    return x + {add}

@nb.njit
def scale(x):
    return x * {scale}
'''

CALLER = '''
from kpkg.callee import add, scale
from kpkg.kernel_cache import cached_njit

@cached_njit(nogil=True)
def run(x):
    return scale(add(x))
'''

REPORT = '''
import json
from kpkg.caller import run
value = run(1)
stats = run.stats
print(json.dumps({"value": int(value), "hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values()), "cache_path": stats.cache_path}))
'''

# REPORT for processes at once: each waits, imported, until the test creates "go", then
# calls run(v) for each JSON value in argv[2:] (1: the int64 signature, 1.5: a float64
# one) and reports the first value.
RACE_REPORT = '''
import json, os, sys, time
from pathlib import Path
from kpkg.caller import run
here = Path(sys.argv[1])
(here / f"ready-{os.getpid()}").touch()
while not (here / "go").exists():
    time.sleep(0.002)
value = [run(json.loads(a)) for a in sys.argv[2:]][0]
stats = run.stats
print(json.dumps({"value": int(value), "hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values())}))
'''

# Holds kernel locks of kpkg.caller.run until the test creates "release": argv[2:] names
# them ("index", or the type of a compile's one argument: "int64", "float64").
HOLD_LOCKS = '''
import fcntl, os, sys, time
from pathlib import Path
from numba.core import types
from kpkg.caller import run
here = Path(sys.argv[1])
cache = run._cache
paths = [cache.index_lock_path if name == "index" else cache.compile_lock_path((getattr(types, name),))
         for name in sys.argv[2:]]
fds = [os.open(path, os.O_RDWR | os.O_CREAT, 0o644) for path in paths]
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
(here / "held").touch()
while not (here / "release").exists():
    time.sleep(0.01)
'''

# A warm-up that may not compile: run(1) under warming_up(compile=False), then run(1.5)
# (another signature) outside any warm-up; the value (None: KernelNotCached) and the
# first calls announced.
WARM_UP_REPORT = '''
import json
from kpkg.caller import run
from kpkg.kernel_cache import KernelNotCached, on_first_call, warming_up
calls = []
with on_first_call(calls.append):
    try:
        with warming_up(compile=False):
            value = int(run(1))
    except KernelNotCached:
        value = None
    run(1.5)
print(json.dumps({"value": value, "calls": [dict(c) for c in calls]}))
'''

# Environment that would change where or whether Numba caches.
_NUMBA_CACHE_ENV = ("NUMBA_CACHE_DIR", "NUMBA_CACHE_LOCATOR_CLASSES", "NUMBA_DISABLE_JIT")


def write_callee(src: Path, add: int, scale: int) -> None:
    (src / "kpkg" / "callee.py").write_text(CALLEE.format(add=add, scale=scale))


@pytest.fixture
def package(tmp_path) -> Path:
    """The kpkg sources (callee: add 1, scale 2) under tmp_path/src."""
    src = tmp_path / "src"
    (src / "kpkg").mkdir(parents=True)
    (src / "kpkg" / "__init__.py").write_text("")
    shutil.copy(inspect.getfile(kernel_cache), src / "kpkg" / "kernel_cache.py")
    (src / "kpkg" / "caller.py").write_text(CALLER)
    write_callee(src, add=1, scale=2)
    return src


@pytest.fixture(params=["in-tree", "NUMBA_CACHE_DIR"])
def cache_parent(request, tmp_path) -> Path | None:
    """None: the package's own __pycache__; else the NUMBA_CACHE_DIR to set."""
    return None if request.param == "in-tree" else tmp_path / "numba-cache"


def kernel_env(src: Path, numba_cache_dir: Path | None) -> dict[str, str]:
    """The environment of a fresh interpreter that imports kpkg from ``src``."""
    env = {k: v for k, v in os.environ.items() if k not in _NUMBA_CACHE_ENV}
    env.update(PYTHONPATH=str(src), PYTHONDONTWRITEBYTECODE="1")  # no stale .pyc either
    if numba_cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(numba_cache_dir)
    return env


def run_kernel(src: Path, numba_cache_dir: Path | None) -> dict:
    """Import kpkg.caller in a fresh interpreter, call run(1); the kernel's cache stats."""
    done = subprocess.run([sys.executable, "-c", REPORT], env=kernel_env(src, numba_cache_dir),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def race(package: Path, tmp_path: Path, name: str, *argvs: list[str]) -> list[dict]:
    """One RACE_REPORT process per argv (the cache: tmp_path/numba-cache), started at once
    with tmp_path/name for their ready and go files; each one's report."""
    here = tmp_path / name
    here.mkdir()
    env = kernel_env(package, tmp_path / "numba-cache")
    racers = [subprocess.Popen([sys.executable, "-c", RACE_REPORT, str(here), *argv], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]
    try:
        deadline = time.monotonic() + 120
        while len(list(here.glob("ready-*"))) < len(racers):
            assert all(r.poll() is None for r in racers), [r.communicate() for r in racers]
            assert time.monotonic() < deadline, "the processes never got ready"
            time.sleep(0.01)
        (here / "go").touch()
        outputs = [r.communicate(timeout=120) for r in racers]
    finally:
        for racer in racers:
            racer.kill()
            racer.wait()
    assert [r.returncode for r in racers] == [0] * len(racers), outputs
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def test_a_second_process_loads_the_kernel_from_disk(package, cache_parent):
    first = run_kernel(package, cache_parent)
    second = run_kernel(package, cache_parent)
    assert (first["value"], first["misses"], first["hits"]) == (4, 1, 0)
    assert (second["value"], second["misses"], second["hits"]) == (4, 0, 1)


def test_a_warm_up_that_may_not_compile_loads_from_disk_or_raises_and_first_calls_are_announced(
        package, tmp_path):
    cache = tmp_path / "numba-cache"

    def report() -> dict:
        done = subprocess.run([sys.executable, "-c", WARM_UP_REPORT], env=kernel_env(package, cache),
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    float_compile = {"kernel": "run", "warm_up": False, "from_disk": False}
    cold = report()   # nothing on disk: refused, compiling nothing; run(1.5) compiles (and saves)
    assert cold == {"value": None, "calls": [float_compile]}
    assert run_kernel(package, cache)["misses"] == 1   # run(1) was indeed not saved by the refusal
    warm = report()
    assert warm == {"value": 4, "calls": [{"kernel": "run", "warm_up": True, "from_disk": True},
                                          {"kernel": "run", "warm_up": False, "from_disk": True}]}


def test_two_processes_that_need_a_kernel_at_once_compile_it_once(package, tmp_path):
    # Both call run(1) at the same moment on an empty cache: one compiles it, the other
    # waits for that signature's lock and then loads the first one's from disk.
    results = race(package, tmp_path, "both", ["1"], ["1"])
    assert [r["value"] for r in results] == [4, 4]
    assert sorted((r["misses"], r["hits"]) for r in results) == [(0, 1), (1, 0)]


@contextlib.contextmanager
def locks_held(package: Path, tmp_path: Path, *names: str) -> Iterator[None]:
    """Another process holding these locks of kpkg.caller.run (HOLD_LOCKS) for the block."""
    here = tmp_path / "holder"
    here.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCKS, str(here), *names],
                              env=kernel_env(package, tmp_path / "numba-cache"), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (here / "held").exists():
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline, "the holder never took its locks"
            time.sleep(0.01)
        yield
    finally:
        (here / "release").touch()
        holder.wait(timeout=60)


def test_a_kernel_on_disk_loads_while_another_process_holds_its_locks(package, tmp_path):
    # Loading takes no lock: a cached signature is not held up by a compile of this
    # or any other signature of the kernel, nor by an index update.
    cache = tmp_path / "numba-cache"
    assert run_kernel(package, cache)["misses"] == 1
    with locks_held(package, tmp_path, "index", "int64", "float64"):
        loaded = run_kernel(package, cache)
    assert (loaded["value"], loaded["misses"], loaded["hits"]) == (4, 0, 1)


def test_a_signature_compiles_while_another_one_is_being_compiled(package, tmp_path):
    with locks_held(package, tmp_path, "float64"):   # as if another process compiled run(1.5)
        compiled = run_kernel(package, tmp_path / "numba-cache")
    assert (compiled["value"], compiled["misses"], compiled["hits"]) == (4, 1, 0)


def test_signatures_compiled_at_once_by_two_processes_are_both_kept(package, tmp_path):
    # The two saves each add an entry to the same index: neither may drop the other's.
    assert sorted(r["misses"] for r in race(package, tmp_path, "compile", ["1"], ["1.5"])) == [1, 1]
    [both] = race(package, tmp_path, "load", ["1", "1.5"])
    assert (both["value"], both["misses"], both["hits"]) == (4, 0, 2)


def test_an_edit_to_a_called_module_compiles_afresh(package, cache_parent):
    assert run_kernel(package, cache_parent)["value"] == (1 + 1) * 2
    write_callee(package, add=10, scale=3)  # caller.py is untouched
    after = run_kernel(package, cache_parent)
    assert after["value"] == (1 + 10) * 3
    assert (after["misses"], after["hits"]) == (1, 0)


def test_the_cache_directory_is_named_by_the_source_hash_under_its_parent(package, cache_parent):
    cache_path = Path(run_kernel(package, cache_parent)["cache_path"])
    parent = cache_parent if cache_parent is not None else package / "kpkg" / "__pycache__"
    digest = source_tree_hash((package / "kpkg").resolve())
    assert cache_path.resolve() == (parent / f"kpkg-{digest[:16]}").resolve()


def tokenizer_kernels() -> list[Dispatcher]:
    """Every jitted function defined in the embedserve.tokenizer package."""
    found = {}
    for info in pkgutil.walk_packages(embedserve.tokenizer.__path__, "embedserve.tokenizer."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, Dispatcher) and value.py_func.__module__ == module.__name__:
                found[id(value)] = value
    assert found, "no kernels found"
    return list(found.values())


def test_every_cached_tokenizer_kernel_uses_the_source_tree_cache():
    cached = [k for k in tokenizer_kernels() if type(k._cache).__name__ != "NullCache"]
    assert cached
    assert [k.__qualname__ for k in cached if not isinstance(k._cache, SourceTreeCache)] == []


def test_kernels_call_only_jitted_functions_of_the_hashed_tree():
    """The hash covers what a kernel can embed only if everything it calls is in the tree."""
    outside = []
    for kernel in tokenizer_kernels():
        codes = [kernel.py_func.__code__]
        codes += [c for c in kernel.py_func.__code__.co_consts if isinstance(c, types.CodeType)]
        for name in {n for code in codes for n in code.co_names}:
            value = kernel.py_func.__globals__.get(name)
            if isinstance(value, Dispatcher):
                if not Path(inspect.getfile(value.py_func)).resolve().is_relative_to(SOURCE_ROOT):
                    outside.append(f"{kernel.__qualname__} -> {name}")
            elif isinstance(value, types.ModuleType) and value.__name__.startswith("embedserve."):
                if not Path(value.__file__).resolve().is_relative_to(SOURCE_ROOT):
                    outside.append(f"{kernel.__qualname__} -> module {value.__name__}")
    assert outside == []
