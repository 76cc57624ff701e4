/* The dot-product kernels of quants.c, one per ggml type: a weight row's raw blocks against the activation row
 * quantized to the type's partner (block_q8_0/_q8_1/_q8_K or F16/BF16/F32), integer products per block, float32
 * terms added in the order of ggml's ggml_vec_dot_*_generic (no contraction: -ffp-contract=off). Included twice:
 * by quants.c with KNAME suffix _scalar (its table's dot column) and by quants_avx2.c under an AVX2 target, where
 * the compiler vectorises the integer loops (the float order stays the one written here, so both give the same
 * bits) and its table takes those it has no hand-written kernel for.
 * Before including: define KNAME(name) to add the file's suffix. Needs quants_common.h. */

MQ_MAYBE_UNUSED static float KNAME(dot_f32)(const uint8_t *w, const uint8_t *y, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)(ld_f32(w + 4 * i) * ld_f32(y + 4 * i));
    return (float)s;
}

MQ_MAYBE_UNUSED static float KNAME(dot_f16)(const uint8_t *w, const uint8_t *y, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)(f16(ld_u16(w + 2 * i)) * f16(ld_u16(y + 2 * i)));
    return (float)s;
}

MQ_MAYBE_UNUSED static float KNAME(dot_bf16)(const uint8_t *w, const uint8_t *y, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)(bf16(ld_u16(w + 2 * i)) * bf16(ld_u16(y + 2 * i)));
    return (float)s;
}

MQ_MAYBE_UNUSED static float KNAME(dot_q4_0)(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 18, y += 34) {
        const int8_t *q8 = (const int8_t *)(y + 2);
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; j++) {
            s0 += ((w[2 + j] & 0x0F) - 8) * q8[j];
            s1 += ((w[2 + j] >> 4) - 8) * q8[j + 16];
        }
        sumf += (float)(s0 + s1) * f16(ld_u16(w)) * f16(ld_u16(y));
    }
    return sumf;
}

MQ_MAYBE_UNUSED static float KNAME(dot_q4_1)(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 20, y += 36) {
        const int8_t *q8 = (const int8_t *)(y + 4);
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; j++) {
            s0 += (w[4 + j] & 0x0F) * q8[j];
            s1 += (w[4 + j] >> 4) * q8[j + 16];
        }
        sumf += (f16(ld_u16(w)) * f16(ld_u16(y))) * (float)(s0 + s1) + f16(ld_u16(w + 2)) * f16(ld_u16(y + 2));
    }
    return sumf;
}

MQ_MAYBE_UNUSED static float KNAME(dot_q5_0)(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 22, y += 34) {
        const int8_t *q8 = (const int8_t *)(y + 2);
        uint32_t qh = ld_u32(w + 2);
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; j++) {
            int h0 = (int)((qh >> j) << 4) & 0x10, h1 = (int)(qh >> (j + 12)) & 0x10;
            s0 += (((w[6 + j] & 0x0F) | h0) - 16) * q8[j];
            s1 += (((w[6 + j] >> 4) | h1) - 16) * q8[j + 16];
        }
        sumf += (f16(ld_u16(w)) * f16(ld_u16(y))) * (float)(s0 + s1);
    }
    return sumf;
}

MQ_MAYBE_UNUSED static float KNAME(dot_q5_1)(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 24, y += 36) {
        const int8_t *q8 = (const int8_t *)(y + 4);
        uint32_t qh = ld_u32(w + 4);
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; j++) {
            int h0 = (int)((qh >> j) << 4) & 0x10, h1 = (int)(qh >> (j + 12)) & 0x10;
            s0 += ((w[8 + j] & 0x0F) | h0) * q8[j];
            s1 += ((w[8 + j] >> 4) | h1) * q8[j + 16];
        }
        sumf += (f16(ld_u16(w)) * f16(ld_u16(y))) * (float)(s0 + s1) + f16(ld_u16(w + 2)) * f16(ld_u16(y + 2));
    }
    return sumf;
}

MQ_MAYBE_UNUSED static float KNAME(dot_q8_0)(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 34, y += 34) {
        const int8_t *qw = (const int8_t *)(w + 2), *q8 = (const int8_t *)(y + 2);
        int s = 0;
        for (int j = 0; j < 32; j++) s += qw[j] * q8[j];
        sumf += (float)s * (f16(ld_u16(w)) * f16(ld_u16(y)));
    }
    return sumf;
}

/* block_q8_K: float d at 0, int8 qs[256] at 4, int16 bsums[16] at 260. */
MQ_MAYBE_UNUSED static float KNAME(dot_q2_k)(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 256; ib++, w += 84, y += 292) {
        const uint8_t *sc = w, *q2 = w + 16;
        const int8_t *q8 = (const int8_t *)(y + 4);
        int summs = 0, isum = 0, is = 0;
        for (int j = 0; j < 16; j++) summs += ld_i16(y + 260 + 2 * j) * (sc[j] >> 4);
        for (int k = 0; k < 2; k++, q2 += 32) {
            for (int shift = 0; shift < 8; shift += 2, q8 += 32) {
                int d0 = sc[is++] & 0xF, d1 = sc[is++] & 0xF, s0 = 0, s1 = 0;
                for (int l = 0; l < 16; l++) s0 += q8[l] * ((q2[l] >> shift) & 3);
                for (int l = 16; l < 32; l++) s1 += q8[l] * ((q2[l] >> shift) & 3);
                isum += d0 * s0 + d1 * s1;
            }
        }
        float yd = ld_f32(y);
        float dall = yd * f16(ld_u16(w + 80)), dmin = yd * f16(ld_u16(w + 82));
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    return sumf;
}

/* Eight int32 lanes per block (value p into lane p % 8) scaled into eight float lanes, as ggml's K-quant dots. */
#define LANES_ADD(sums, d, aux32) for (int l = 0; l < 8; l++) (sums)[l] += (d) * (float)(aux32)[l]

MQ_MAYBE_UNUSED static float KNAME(dot_q3_k)(const uint8_t *w, const uint8_t *y, int n) {
    float sums[8] = {0};
    for (int ib = 0; ib < n / 256; ib++, w += 110, y += 292) {
        int8_t a[256];
        int8_t sc[16];
        const uint8_t *hm = w, *q3 = w + 32, *s = w + 96;
        for (int j = 0; j < 16; j++) {
            int low = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
            int high = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
            sc[j] = (int8_t)((low | (high << 4)) - 32);
        }
        for (int half = 0, m = 0; half < 2; half++, q3 += 32)
            for (int shift = 0; shift < 8; shift += 2, m++)
                for (int l = 0; l < 32; l++)
                    a[half * 128 + shift * 16 + l] = (int8_t)(((q3[l] >> shift) & 3) - ((hm[l] >> m) & 1 ? 0 : 4));
        const int8_t *q8 = (const int8_t *)(y + 4);
        int32_t aux32[8] = {0};
        for (int p = 0; p < 256; p += 8)
            for (int l = 0; l < 8; l++) aux32[l] += sc[p / 16] * (q8[p + l] * a[p + l]);
        float d = f16(ld_u16(w + 108)) * ld_f32(y);
        LANES_ADD(sums, d, aux32);
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    return sumf;
}

/* The eight 6-bit scales and mins of a Q4_K/Q5_K block's 12 scale bytes. */
static inline void kscales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

MQ_MAYBE_UNUSED static float KNAME(dot_q45_k)(const uint8_t *w, const uint8_t *y, int n, int five) {
    float sums[8] = {0}, sumf = 0;
    const int size = five ? 176 : 144;
    for (int ib = 0; ib < n / 256; ib++, w += size, y += 292) {
        uint8_t a[256], sc[8], mn[8];
        kscales(w + 4, sc, mn);
        const uint8_t *q4 = w + (five ? 48 : 16), *hm = w + 16;
        for (int j = 0; j < 4; j++, q4 += 32)
            for (int l = 0; l < 32; l++) {
                a[j * 64 + l] = (uint8_t)(q4[l] & 0xF);
                a[j * 64 + 32 + l] = (uint8_t)(q4[l] >> 4);
                if (five) {
                    a[j * 64 + l] |= (uint8_t)(((hm[l] >> (2 * j)) & 1) << 4);
                    a[j * 64 + 32 + l] |= (uint8_t)(((hm[l] >> (2 * j + 1)) & 1) << 4);
                }
            }
        int sumi = 0;
        for (int j = 0; j < 16; j++) sumi += ld_i16(y + 260 + 2 * j) * mn[j / 2];
        const int8_t *q8 = (const int8_t *)(y + 4);
        int32_t aux32[8] = {0};
        for (int p = 0; p < 256; p += 8)
            for (int l = 0; l < 8; l++) aux32[l] += sc[p / 32] * (q8[p + l] * a[p + l]);
        float yd = ld_f32(y);
        float d = f16(ld_u16(w)) * yd;
        LANES_ADD(sums, d, aux32);
        float dmin = f16(ld_u16(w + 2)) * yd;
        sumf -= dmin * (float)sumi;
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    return sumf;
}

MQ_MAYBE_UNUSED static float KNAME(dot_q4_k)(const uint8_t *w, const uint8_t *y, int n) { return KNAME(dot_q45_k)(w, y, n, 0); }
MQ_MAYBE_UNUSED static float KNAME(dot_q5_k)(const uint8_t *w, const uint8_t *y, int n) { return KNAME(dot_q45_k)(w, y, n, 1); }

MQ_MAYBE_UNUSED static float KNAME(dot_q6_k)(const uint8_t *w, const uint8_t *y, int n) {
    float sums[8] = {0};
    for (int ib = 0; ib < n / 256; ib++, w += 210, y += 292) {
        int8_t a[256];
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                a[h * 128 + l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                a[h * 128 + l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                a[h * 128 + l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                a[h * 128 + l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        const int8_t *q8 = (const int8_t *)(y + 4);
        int32_t aux32[8] = {0};
        for (int p = 0; p < 256; p += 8)
            for (int l = 0; l < 8; l++) aux32[l] += sc[p / 16] * (q8[p + l] * a[p + l]);
        float d = f16(ld_u16(w + 208)) * ld_f32(y);
        LANES_ADD(sums, d, aux32);
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    return sumf;
}

#undef LANES_ADD
