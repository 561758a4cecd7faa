/* copypool.h - a few threads that split one large host memcpy between them.
 *
 * Used by the local transport to fill and drain pinned bounce buffers when a
 * device copy's host side is pageable: one CPU thread copies about 10 GB/s,
 * less than the copy engine's 50 GB/s, so the memcpy of each chunk is shared
 * by the caller and `nthreads` helpers.  Between jobs helpers poll briefly
 * (tens of microseconds), then sleep on a condition variable; they block
 * every signal (Python's handlers run on the main thread).  One caller at a time: a second concurrent caller, a caller
 * in a forked child (the helpers did not survive fork) and small copies do a
 * plain memcpy.  Nothing here touches the GIL; every function is nogil-safe.
 */
#ifndef GEXMK_COPYPOOL_H
#define GEXMK_COPYPOOL_H

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Below this many bytes per thread, splitting costs more than it saves. */
#define GX_CPOOL_MIN_PART ((size_t)256 * 1024)

/* Helpers poll for the next job this many times (a pause each: tens of
 * microseconds) before sleeping, and the caller polls for their end as long
 * before it sleeps: in a pipelined copy the jobs follow each other every few
 * tens of microseconds, about what a sleeping thread takes to wake. */
#define GX_CPOOL_SPINS 2000

static inline void gx_cpool_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct gx_cpool gx_cpool;

typedef struct gx_cpool_worker {
    gx_cpool *pool;
    int index;               /* 1..nthreads: the caller copies part 0 */
} gx_cpool_worker;

struct gx_cpool {
    pthread_mutex_t mu;
    pthread_cond_t go;       /* a new job (gen changed) or stop */
    pthread_cond_t idle;     /* left reached 0 */
    pthread_mutex_t busy;    /* held by the one caller using the pool */
    int nthreads;            /* helper threads started */
    pid_t pid;               /* the process that started them */
    pthread_t *th;
    gx_cpool_worker *w;
    char *dst;
    const char *src;
    size_t n, part;
    unsigned long gen;       /* job number (written under mu, polled without) */
    int left;                /* helpers still copying the current job (atomic) */
    int sleepers;            /* helpers waiting on `go` (under mu) */
    int stop;
};

static void *gx_cpool_main(void *arg)
{
    gx_cpool_worker *w = (gx_cpool_worker *)arg;
    gx_cpool *p = w->pool;
    unsigned long seen = 0;
    int i;
    for (;;) {
        for (i = 0; i < GX_CPOOL_SPINS; i++) {
            if (__atomic_load_n(&p->gen, __ATOMIC_ACQUIRE) != seen
                    || __atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
                break;
            gx_cpool_relax();
        }
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->gen == seen) {
            p->sleepers++;
            pthread_cond_wait(&p->go, &p->mu);
            p->sleepers--;
        }
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        seen = p->gen;
        char *d = p->dst;
        const char *s = p->src;
        size_t n = p->n, part = p->part, off = part * (size_t)w->index;
        pthread_mutex_unlock(&p->mu);
        if (off < n)
            memcpy(d + off, s + off, n - off < part ? n - off : part);
        if (__atomic_sub_fetch(&p->left, 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_mutex_lock(&p->mu);          /* the caller may be asleep */
            pthread_cond_signal(&p->idle);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* Stop and join the helpers, free the pool (NULL allowed). */
static void gx_cpool_destroy(gx_cpool *p)
{
    int i;
    if (p == NULL)
        return;
    if (p->pid == getpid()) {
        pthread_mutex_lock(&p->mu);
        __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
        for (i = 0; i < p->nthreads; i++)
            pthread_join(p->th[i], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->idle);
    pthread_mutex_destroy(&p->busy);
    free(p->th);
    free(p->w);
    free(p);
}

/* A pool of nthreads helpers (0: none, every copy is a plain memcpy), or
 * NULL when memory runs out; fewer helpers when some fail to start. */
static gx_cpool *gx_cpool_create(int nthreads)
{
    gx_cpool *p = (gx_cpool *)calloc(1, sizeof *p);
    sigset_t all, old;
    int i;
    if (p == NULL)
        return NULL;
    if (nthreads < 0)
        nthreads = 0;
    p->th = (pthread_t *)calloc(nthreads ? nthreads : 1, sizeof *p->th);
    p->w = (gx_cpool_worker *)calloc(nthreads ? nthreads : 1, sizeof *p->w);
    if (p->th == NULL || p->w == NULL) {
        free(p->th);
        free(p->w);
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->idle, NULL);
    pthread_mutex_init(&p->busy, NULL);
    p->pid = getpid();
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (i = 0; i < nthreads; i++) {
        p->w[i].pool = p;
        p->w[i].index = i + 1;
        if (pthread_create(&p->th[i], NULL, gx_cpool_main, &p->w[i]) != 0)
            break;
        p->nthreads = i + 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p;
}

/* memcpy(dst, src, n), split between the caller and the pool's helpers. */
static void gx_cpool_copy(gx_cpool *p, void *dst, const void *src, size_t n)
{
    size_t parts, part;
    int i;
    if (p == NULL || p->nthreads == 0 || n < 2 * GX_CPOOL_MIN_PART || p->pid != getpid()
            || pthread_mutex_trylock(&p->busy) != 0) {
        memcpy(dst, src, n);
        return;
    }
    parts = (size_t)p->nthreads + 1;
    if (n / parts < GX_CPOOL_MIN_PART)
        parts = n / GX_CPOOL_MIN_PART;
    part = (n + parts - 1) / parts;
    part = (part + 4095) & ~(size_t)4095;        /* whole pages per thread */
    pthread_mutex_lock(&p->mu);
    p->dst = (char *)dst;
    p->src = (const char *)src;
    p->n = n;
    p->part = part;
    __atomic_store_n(&p->left, p->nthreads, __ATOMIC_RELEASE);
    __atomic_store_n(&p->gen, p->gen + 1, __ATOMIC_RELEASE);
    if (p->sleepers > 0)
        pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    memcpy(dst, src, n < part ? n : part);
    for (i = 0; i < GX_CPOOL_SPINS && __atomic_load_n(&p->left, __ATOMIC_ACQUIRE) > 0; i++)
        gx_cpool_relax();
    pthread_mutex_lock(&p->mu);
    while (__atomic_load_n(&p->left, __ATOMIC_ACQUIRE) > 0)
        pthread_cond_wait(&p->idle, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->busy);
}

#endif /* GEXMK_COPYPOOL_H */
