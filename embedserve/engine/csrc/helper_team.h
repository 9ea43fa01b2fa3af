/*
 * A second thread for a call's work: the calling thread and one helper thread (one per
 * kernel module, started on first use) take items of the call from a shared counter
 * until none is left, and the call returns when every item is done.
 *
 * Why not torch's OpenMP team: a replica computes on several threads (lanes, the urgent
 * thread, its event loop), each of which keeps a libgomp pool, and while the pools'
 * workers outnumber the cores a worker sleeps on a futex after ~100 turns of spinning, so
 * every parallel region of a short step woke one through the kernel (docs/engine.md);
 * a replica therefore ran short steps on one thread, and a 1 x 6 step's linears streamed
 * the model's 42 MB of bf16 weights from memory on one core (~24 GB/s). Here the caller
 * never waits for a helper that has not started: it claims items itself, so a helper
 * that is asleep, late or queued on the caller's own core costs nothing but the wake-up,
 * and one that runs takes its share of the stream. The helper spins ``HELPER_SPIN_NS``
 * after each call (a short step's calls come a few microseconds apart) before it sleeps,
 * and moves off its caller's core where it finds itself there.
 *
 * One call at a time uses the team; a call that finds it busy (a second thread's step)
 * runs alone. The claim word holds the call's id, its item count and the next item, so a
 * helper that read a finished call's description can never claim an item of it, nor of
 * the next call under the old description. A forked child starts without a helper.
 */
#ifndef EMBEDSERVE_HELPER_TEAM_H
#define EMBEDSERVE_HELPER_TEAM_H

#include <Python.h>   /* first, as Python asks; its pyconfig.h defines _GNU_SOURCE (sched_getcpu) */

#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "team_call.h"

/* How long the helper polls for the next call before it sleeps: longer than the gaps
 * between a short step's linears (its attention and LayerNorm calls, ~5-15 us), short
 * enough that a core is not held long after a step. */
#define HELPER_SPIN_NS 60000
/* How long a caller whose items are all claimed polls for the helper's before it sleeps
 * (sleeping frees its core, so a helper preempted mid-item can be moved there). */
#define CALLER_SPIN_NS 30000
/* The helper's thread name (15 characters at most). */
#define HELPER_THREAD_NAME "embedserve-help"
/* Items a call may have: the claim word's 16-bit fields. */
#define TEAM_MAX_ITEMS 0xFFFF


typedef struct {
    _Atomic uint64_t claim;        /* call id << 32 | items << 16 | next unclaimed item */
    _Atomic uint32_t call_id;      /* the newest call's id; the helper sleeps on it */
    _Atomic uint32_t done;         /* items of the current call finished; the caller sleeps on it */
    _Atomic int helper_asleep;     /* 1 asleep, 2 asleep and woken, 0 awake */
    _Atomic int caller_asleep;
    _Atomic int caller_cpu;
    _Atomic int busy;              /* a call holds the team */
    _Atomic int started;           /* 0 none, 1 starting or running, 2 could not start */
    _Atomic(team_item) run_item;   /* the current call's, stored before ``claim`` publishes it */
    _Atomic(const void *) call;
} HelperTeam;

static HelperTeam helper_team;

static inline long team_futex(_Atomic uint32_t *word, int op, uint32_t value) {
    return syscall(SYS_futex, (uint32_t *)word, op | FUTEX_PRIVATE_FLAG, value, NULL, NULL, 0);
}

static inline int64_t team_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Claims and runs items of call ``id`` until none is left; returns how many it ran. */
static Py_ssize_t team_take_items(uint32_t id) {
    Py_ssize_t ran = 0;
    for (;;) {
        uint64_t claim = atomic_load_explicit(&helper_team.claim, memory_order_acquire);
        const uint32_t items = (uint32_t)(claim >> 16) & 0xFFFF, next = (uint32_t)claim & 0xFFFF;
        if ((uint32_t)(claim >> 32) != id || next >= items)
            return ran;
        const team_item run_item = atomic_load_explicit(&helper_team.run_item, memory_order_relaxed);
        const void *call = atomic_load_explicit(&helper_team.call, memory_order_relaxed);
        /* Only while the claim word is unchanged: then the call is not finished (this item
         * is not done), so what was read above is its description and stays so. */
        if (!atomic_compare_exchange_weak_explicit(&helper_team.claim, &claim, claim + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        run_item(call, next);
        ++ran;
    }
}

/* Moves the helper off its caller's core to the other ``cores`` (those the process may use):
 * a woken thread is often queued on its waker's core, where it would only take the caller's
 * turns. A no-op with one core. */
static void team_leave_callers_core(const cpu_set_t *cores, int caller_cpu) {
    if (caller_cpu < 0 || caller_cpu >= CPU_SETSIZE || !CPU_ISSET(caller_cpu, cores))
        return;
    cpu_set_t others = *cores;
    CPU_CLR(caller_cpu, &others);
    if (CPU_COUNT(&others) > 0)
        sched_setaffinity(0, sizeof others, &others);
}

/* The helper: waits for a call (polling, then asleep), takes items of it, waits again. */
static void *team_helper_main(void *unused) {
    (void)unused;
    cpu_set_t cores;   /* those the process may use, as the helper started */
    if (sched_getaffinity(0, sizeof cores, &cores) != 0)
        CPU_ZERO(&cores);
    uint32_t seen = atomic_load(&helper_team.call_id);
    for (;;) {
        uint32_t id = atomic_load(&helper_team.call_id);
        const int64_t until = team_now_ns() + HELPER_SPIN_NS;
        while (id == seen) {
            for (int i = 0; i < 64 && id == seen; ++i) {
                _mm_pause();
                id = atomic_load(&helper_team.call_id);
            }
            if (team_now_ns() > until)
                break;
        }
        while (id == seen) {
            atomic_store(&helper_team.helper_asleep, 1);
            id = atomic_load(&helper_team.call_id);
            if (id == seen)
                team_futex(&helper_team.call_id, FUTEX_WAIT, seen);
            atomic_store(&helper_team.helper_asleep, 0);
            id = atomic_load(&helper_team.call_id);
        }
        seen = id;
        const int caller_cpu = atomic_load_explicit(&helper_team.caller_cpu, memory_order_relaxed);
        if (sched_getcpu() == caller_cpu)
            team_leave_callers_core(&cores, caller_cpu);
        const Py_ssize_t ran = team_take_items(id);
        if (ran) {
            const uint64_t claim = atomic_load_explicit(&helper_team.claim, memory_order_relaxed);
            const uint32_t items = (uint32_t)(claim >> 16) & 0xFFFF;
            /* This call cannot have finished before this add (its items include ours). */
            if (atomic_fetch_add(&helper_team.done, (uint32_t)ran) + (uint32_t)ran == items
                && atomic_load(&helper_team.caller_asleep))
                team_futex(&helper_team.done, FUTEX_WAKE, 1);
        }
    }
    return NULL;
}

static void team_forget_helper(void) {   /* a forked child has no helper thread */
    atomic_store(&helper_team.started, 0);
    atomic_store(&helper_team.busy, 0);
    atomic_store(&helper_team.helper_asleep, 0);
    atomic_store(&helper_team.caller_asleep, 0);
}

static void team_register_fork_handler(void) { pthread_atfork(NULL, NULL, team_forget_helper); }

/* 1 once the helper runs (started here on first use), 0 where it cannot be started. */
static int team_has_helper(void) {
    int state = atomic_load(&helper_team.started);
    if (state != 0)
        return state == 1;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&helper_team.started, &expected, 1))
        return atomic_load(&helper_team.started) == 1;
    static pthread_once_t at_fork = PTHREAD_ONCE_INIT;
    pthread_once(&at_fork, team_register_fork_handler);
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* the helper takes no signal: Python's stay on its threads */
    const int failed = pthread_create(&thread, &attr, team_helper_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (failed) {
        atomic_store(&helper_team.started, 2);
        return 0;
    }
    pthread_setname_np(thread, HELPER_THREAD_NAME);   /* as top and /proc/PID/task show it; set before any call returns */
    return 1;
}

/* 1 where this call holds the team (released at its end) and the helper runs; 0 where a
 * call on another thread holds it, or the helper cannot be started. */
static int team_hold(void) {
    int idle = 0;
    if (!atomic_compare_exchange_strong(&helper_team.busy, &idle, 1))
        return 0;
    if (team_has_helper())
        return 1;
    atomic_store(&helper_team.busy, 0);
    return 0;
}

/* Runs ``run_item(call, i)`` for every i < ``items``, on this thread and the helper.
 * ``run_item`` must not touch what another item writes. Call without the GIL. */
static void team_run(team_item run_item, const void *call, Py_ssize_t items) {
    if (items < 2 || items > TEAM_MAX_ITEMS || !team_hold()) {
        for (Py_ssize_t i = 0; i < items; ++i)
            run_item(call, i);
        return;
    }
    const uint32_t id = atomic_load_explicit(&helper_team.call_id, memory_order_relaxed) + 1;
    atomic_store_explicit(&helper_team.run_item, run_item, memory_order_relaxed);
    atomic_store_explicit(&helper_team.call, call, memory_order_relaxed);
    atomic_store_explicit(&helper_team.done, 0, memory_order_relaxed);
    atomic_store_explicit(&helper_team.caller_cpu, sched_getcpu(), memory_order_relaxed);
    atomic_store_explicit(&helper_team.claim, (uint64_t)id << 32 | (uint64_t)items << 16, memory_order_release);
    atomic_store(&helper_team.call_id, id);
    /* One wake per sleep: a helper on a halted core can take a millisecond to run (a VM's
     * idle vCPU), and the calls meanwhile need not each pay a system call for it. */
    int asleep = 1;
    if (atomic_compare_exchange_strong(&helper_team.helper_asleep, &asleep, 2))
        team_futex(&helper_team.call_id, FUTEX_WAKE, 1);
    const uint32_t ran = (uint32_t)team_take_items(id);
    uint32_t done = atomic_fetch_add(&helper_team.done, ran) + ran;
    const int64_t until = team_now_ns() + CALLER_SPIN_NS;
    while (done != (uint32_t)items && team_now_ns() < until) {
        for (int i = 0; i < 64 && done != (uint32_t)items; ++i) {
            _mm_pause();
            done = atomic_load(&helper_team.done);
        }
    }
    while (done != (uint32_t)items) {
        atomic_store(&helper_team.caller_asleep, 1);
        done = atomic_load(&helper_team.done);
        if (done != (uint32_t)items)
            team_futex(&helper_team.done, FUTEX_WAIT, done);
        atomic_store(&helper_team.caller_asleep, 0);
        done = atomic_load(&helper_team.done);
    }
    atomic_store(&helper_team.busy, 0);
}

#endif
