/* Worker threads kept between teams (threadpool.h). One team runs at a time (call); the caller does part 0
 * itself. */
#define _POSIX_C_SOURCE 200809L
#include "threadpool.h"

#include <pthread.h>
#include <stdint.h>

typedef struct {
    mq_team_fn fn;
    void *ctx;
    int part, parts;
} job;

static struct {
    pthread_mutex_t call, mu;
    pthread_cond_t work, done;
    int n_workers, pending, n_jobs;
    unsigned long gen;
    job *jobs;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          0, 0, 0, 0, NULL};

static void run_job(const job *j) { j->fn(j->ctx, j->part, j->parts); }

static void *worker(void *arg) {
    const int id = (int)(intptr_t)arg; /* runs part id + 1 */
    unsigned long seen = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.gen == seen) pthread_cond_wait(&pool.work, &pool.mu);
        seen = pool.gen;
        if (id + 1 < pool.n_jobs) {
            job *j = &pool.jobs[id + 1];
            pthread_mutex_unlock(&pool.mu);
            run_job(j);
            pthread_mutex_lock(&pool.mu);
            if (--pool.pending == 0) pthread_cond_signal(&pool.done);
        }
    }
    return NULL;
}

/* A forked child has none of the parent's workers: it starts its own. */
static void pool_after_fork(void) {
    pthread_mutex_init(&pool.call, NULL);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.work, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.n_workers = pool.pending = pool.n_jobs = 0;
}

static void register_fork(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

/* Starts pool workers until there are n - 1 (or none more can be started); the pool is locked (call, mu) on
 * return. Returns how many of n parts run at once: the caller and the workers. */
static int pool_lock(int n) {
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    pthread_once(&fork_once, register_fork);
    pthread_mutex_lock(&pool.call);
    pthread_mutex_lock(&pool.mu);
    while (pool.n_workers < n - 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void *)(intptr_t)pool.n_workers) != 0) break;
        pthread_detach(t);
        pool.n_workers++;
    }
    return n - 1 < pool.n_workers ? n : pool.n_workers + 1;
}

/* Runs jobs[0..n) at once, jobs[0] on the caller; unlocks the pool. */
static void pool_run(job *jobs, int n) {
    pool.jobs = jobs, pool.n_jobs = n, pool.pending = n - 1;
    pool.gen++;
    pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.mu);
    run_job(&jobs[0]);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pool.n_jobs = 0;
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.call);
}

int mq_team(mq_team_fn fn, void *ctx, int threads) {
    if (threads < 1) threads = 1;
    if (threads > MQ_MAX_THREADS) threads = MQ_MAX_THREADS;
    if (threads == 1) {
        fn(ctx, 0, 1);
        return 1;
    }
    job jobs[MQ_MAX_THREADS];
    const int spread = pool_lock(threads);
    for (int i = 0; i < spread; i++) jobs[i] = (job){.fn = fn, .ctx = ctx, .part = i, .parts = spread};
    pool_run(jobs, spread);
    return spread;
}
