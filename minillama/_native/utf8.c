/* The int32 vector the core fills (ivec_push is inline in core.h; this is its slow path), and the memory of the
 * big tables probed at random (huge pages where the kernel has them). */
#define _DEFAULT_SOURCE /* mmap flags, madvise */
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core.h"

int ivec_room(ivec *a, size_t n) {
    if (a->cap - a->n >= n) return 1;
    size_t cap = a->cap ? a->cap : 64;
    while (cap - a->n < n) {
        if (cap > SIZE_MAX / 2 / sizeof(int32_t)) {
            a->ok = 0;
            return 0;
        }
        cap *= 2;
    }
    int32_t *v = realloc(a->v, cap * sizeof *v);
    if (!v) {
        a->ok = 0;
        return 0;
    }
    a->v = v;
    a->cap = cap;
    return 1;
}

int ivec_extend(ivec *a, const int32_t *x, size_t n) {
    if (!ivec_room(a, n)) return 0;
    if (n) memcpy(a->v + a->n, x, n * sizeof *x);
    a->n += n;
    return 1;
}

void ivec_free(ivec *a) {
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* A table of n bytes probed at random (the BPE pair and token tables, several MB): with 4 KB pages nearly every
 * probe misses the TLB too, so a table of 2 MB or more gets fresh memory of its own (mmap: never pages the heap
 * has touched already), 2 MB aligned and asked for huge pages (Linux's transparent huge pages, madvise mode
 * included); elsewhere, or when that fails, malloc. zero: calloc's zeroing. big_free(p, n) frees it. */
#define HUGE_PAGE ((size_t)2 << 20)

static int big_mapped(size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    return n >= HUGE_PAGE && n <= SIZE_MAX / 2;
#else
    (void)n;
    return 0;
#endif
}

void *big_alloc(size_t n, int zero) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (big_mapped(n)) {
        size_t size = (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), span = size + HUGE_PAGE;
        uint8_t *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return NULL;
        size_t head = (HUGE_PAGE - (uintptr_t)m % HUGE_PAGE) % HUGE_PAGE; /* trim to a 2 MB boundary */
        if (head) munmap(m, head);
        if (span - head - size) munmap(m + head + size, span - head - size);
        madvise(m + head, size, MADV_HUGEPAGE); /* advice only: a refusal leaves normal pages */
        return m + head;                        /* zeroed already */
    }
#endif
    return zero ? calloc(n ? n : 1, 1) : malloc(n ? n : 1);
}

void big_free(void *p, size_t n) {
    if (!p) return;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (big_mapped(n)) {
        munmap(p, (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
        return;
    }
#endif
    free(p);
}
