/* Threads that share a matrix's rows with the caller (hs_set_threads): the native
   target's products when it runs alone on borrowed cores, the native draft's step
   where it has several cores. Included by native_model.c.

   Why its own pool: a token is a few hundred products of tens of microseconds each,
   too short to start a thread for or to wake a sleeping one. A thread spins a
   while between jobs, then sleeps, so that between tokens (the engine's messages)
   it gives its core back. At one thread the threads sleep.

   A row is computed the same way whichever thread takes it, so the logits do not
   depend on how many threads there are. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { POOL_MAX = 16 };                      /* threads */
#define POOL_SPIN_TICKS 300000ull               /* time-stamp ticks a thread spins before it sleeps (~0.1 ms) */

typedef void (*pool_fn)(void *arg, int part, int parts);

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int started;                 /* threads made, beside the caller's */
    atomic_int width;            /* threads a job is split among, the caller's included */
    atomic_uint ticket[POOL_MAX]; /* per thread: the last job handed to it (wrapping) */
    atomic_int done, sleeping;
    atomic_int resting;          /* set between passes (hs_pool_rest): threads sleep at once */
    atomic_int tids[POOL_MAX];   /* per thread: its kernel thread id, for pinning */
    unsigned jobs;               /* jobs given out (wrapping) */
    pool_fn fn;                  /* the current job, parts ways */
    void *arg;
    int parts;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .width = 1, .parts = 1};

/* Thread `me` (1..): waits for its part of a job, does it, waits again. */
static void *pool_thread(void *arg) {
    const int me = (int)(intptr_t)arg;
    unsigned seen = 0;
    atomic_store(&pool.tids[me], (int)syscall(SYS_gettid));
    for (;;) {
        for (const unsigned long long start = __rdtsc(); atomic_load(&pool.ticket[me]) == seen;) {
            if (__rdtsc() - start < POOL_SPIN_TICKS && me < atomic_load(&pool.width) && !atomic_load(&pool.resting)) {
                _mm_pause();
                continue;
            }
            pthread_mutex_lock(&pool.lock);
            atomic_fetch_add(&pool.sleeping, 1);
            while (atomic_load(&pool.ticket[me]) == seen) pthread_cond_wait(&pool.wake, &pool.lock);
            atomic_fetch_sub(&pool.sleeping, 1);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = atomic_load(&pool.ticket[me]);
        pool.fn(pool.arg, me, pool.parts);
        atomic_fetch_add(&pool.done, 1);
    }
    return NULL;
}

/* Threads a job is split among now, the caller's included. */
static inline int pool_width(void) { return atomic_load(&pool.width); }

/* fn(arg, part, parts) for every part, the caller taking part 0; returns when all are done. */
static void pool_run(pool_fn fn, void *arg) {
    const int parts = atomic_load(&pool.width);
    if (parts <= 1) {
        fn(arg, 0, 1);
        return;
    }
    atomic_store(&pool.resting, 0);
    pool.fn = fn;
    pool.arg = arg;
    pool.parts = parts;
    atomic_store(&pool.done, 0);
    pool.jobs++;
    for (int i = 1; i < parts; i++) atomic_store(&pool.ticket[i], pool.jobs);
    if (atomic_load(&pool.sleeping) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    fn(arg, 0, parts);
    while (atomic_load(&pool.done) < parts - 1) _mm_pause();
}

/* A pass is over: the threads sleep now rather than spin, leaving their cores to
   the engine's other processes until the next pass wakes them (pool_run). */
void hs_pool_rest(void) { atomic_store(&pool.resting, 1); }

/* Split later products `threads` ways (at most POOL_MAX; threads that cannot be made
   leave it narrower). Returns the width now. */
int hs_set_threads(int threads) {
    threads = threads < 1 ? 1 : threads > POOL_MAX ? POOL_MAX : threads;
    while (pool.started < threads - 1) {
        pthread_t id;
        if (pthread_create(&id, NULL, pool_thread, (void *)(intptr_t)(pool.started + 1)) != 0) break;
        pthread_detach(id);
        pool.started++;
    }
    atomic_store(&pool.width, threads < pool.started + 1 ? threads : pool.started + 1);
    return atomic_load(&pool.width);
}

/* The kernel thread ids of the threads taking parts 1..n-1 now (n the width), each
   once it has started: the caller pins each to a core of its own. Returns n - 1. */
int hs_thread_ids(int *tids) {
    const int n = atomic_load(&pool.width);
    for (int i = 1; i < n; i++)
        while ((tids[i - 1] = atomic_load(&pool.tids[i])) == 0) sched_yield();
    return n - 1;
}
