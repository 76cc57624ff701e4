/* BLAKE2b (RFC 7693), unkeyed, one shot: the digest minillama dataset keeps of each document (hashlib.blake2b's
 * bytes, computed here with the GIL released), one or a batch of texts at a time. */
#include <stdlib.h>
#include <string.h>

#include "core.h"

static const uint64_t IV[8] = {0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
                               0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
                               0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

static const uint8_t SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

static inline uint64_t rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

#define G(a, b, c, d, x, y)                                                                                            \
    do {                                                                                                           \
        v[a] = v[a] + v[b] + (x);                                                                                  \
        v[d] = rotr(v[d] ^ v[a], 32);                                                                              \
        v[c] = v[c] + v[d];                                                                                        \
        v[b] = rotr(v[b] ^ v[c], 24);                                                                              \
        v[a] = v[a] + v[b] + (y);                                                                                  \
        v[d] = rotr(v[d] ^ v[a], 16);                                                                              \
        v[c] = v[c] + v[d];                                                                                        \
        v[b] = rotr(v[b] ^ v[c], 63);                                                                              \
    } while (0)

/* One 128-byte block into h; t: the bytes hashed so far, this block's included; last: the final block. */
static void compress(uint64_t h[8], const uint8_t *block, uint64_t t, int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i); /* core.h: little-endian */
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= t; /* the counter's high word stays 0: texts are far below 2**64 bytes */
    if (last) v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = SIGMA[r];
        G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

void blake2b(const uint8_t *data, size_t n, uint8_t *out, size_t outlen) {
    uint64_t h[8];
    uint8_t block[128];
    uint64_t t = 0;
    memcpy(h, IV, sizeof h);
    h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    for (; n > 128; data += 128, n -= 128) {
        t += 128;
        compress(h, data, t, 0);
    }
    memset(block, 0, sizeof block);
    if (n) memcpy(block, data, n);
    compress(h, block, t + n, 1);
    for (size_t i = 0; i < outlen; i++) out[i] = (uint8_t)(h[i / 8] >> (8 * (i % 8)));
}

int blake2b_texts(const void *const *data, const size_t *lens, const int *kinds, size_t n, size_t size, uint8_t *out,
                  size_t *total) {
    uint8_t *buf = NULL;
    size_t cap = 0;
    int failed = 0; /* 1: a surrogate, 2: no memory */
    *total = 0;
    for (size_t i = 0; !failed && i < n; i++) {
        const uint8_t *utf8 = data[i];
        size_t len = lens[i];
        if (kinds[i]) {
            int surrogate = 0;
            len = ucs_utf8_size(data[i], lens[i], kinds[i], 0, &surrogate);
            if (surrogate) {
                failed = 1;
                break;
            }
            if (len + 4 > cap) {
                free(buf);
                cap = 2 * len + 64;
                if (!(buf = malloc(cap))) {
                    failed = 2;
                    break;
                }
            }
            ucs_utf8_write(data[i], lens[i], kinds[i], 0, buf, &surrogate);
            utf8 = buf;
        }
        blake2b(utf8, len, out + i * size, size);
        *total += len;
    }
    free(buf);
    return failed;
}
