/* WordPiece as llama.cpp runs it (llm_tokenizer_wpm), the port of encoders/wpm.py: each code point of the
 * text goes through a table Python builds once (the code point it becomes after the vocab's NFD-first /
 * lowercase rules, and whether it ends a word, vanishes or is a word of its own); each word, behind the
 * U+2581 phantom prefix, is cut greedily into the longest tokens from the left (a walk down a byte trie
 * of the token texts); a word with a position that starts no token is one unk. */
#include <stdlib.h>
#include <string.h>

#include "core.h"

static const uint8_t MARK[3] = {0xE2, 0x96, 0x81}; /* U+2581 */

struct wpm {
    btrie tokens; /* value: the token id */
    uint32_t *norm;
    int32_t unk;
    int32_t after_mark; /* the trie node of U+2581, where every word's first walk goes on (-1: none) */
    int32_t mark_tok;   /* the longest token within U+2581's bytes (-1: none), and its length */
    size_t mark_len;
};

void wpm_free(wpm *w) {
    if (!w) return;
    btrie_free(&w->tokens);
    free(w->norm);
    free(w);
}

wpm *wpm_new(const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, const int32_t *ids, size_t n_ids,
             size_t n_vocab, const uint32_t *norm, int32_t unk_id) {
    wpm *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->norm = malloc((size_t)(MAX_CODE_POINT + 1) * sizeof *w->norm);
    if (!w->norm || !btrie_init(&w->tokens)) {
        wpm_free(w);
        return NULL;
    }
    memcpy(w->norm, norm, (size_t)(MAX_CODE_POINT + 1) * sizeof *w->norm);
    for (size_t k = 0; k < n_ids; k++) { /* in token_to_id's order: a later text of the same bytes wins */
        int32_t id = ids[k];
        if (id < 0 || (size_t)id >= n_vocab) continue;
        int64_t s = tok_off[id], e = tok_off[id + 1];
        if (s < 0 || e < s || (uint64_t)e > tok_len || !btrie_insert(&w->tokens, tok_bytes + s, (size_t)(e - s), id)) {
            wpm_free(w);
            return NULL;
        }
    }
    if (!btrie_freeze(&w->tokens)) {
        wpm_free(w);
        return NULL;
    }
    w->unk = unk_id;
    w->after_mark = 0;
    w->mark_tok = -1;
    for (size_t k = 0; k < 3 && w->after_mark >= 0; k++) {
        w->after_mark = btrie_child(&w->tokens, w->after_mark, MARK[k]);
        if (w->after_mark >= 0 && btrie_value(&w->tokens, w->after_mark) >= 0) {
            w->mark_tok = btrie_value(&w->tokens, w->after_mark);
            w->mark_len = k + 1;
        }
    }
    return w;
}

/* The ids of one word (its bytes behind the phantom prefix); 1 ok, 0 no memory, -1 unk needed but < 0. No
 * word cache: the walk from U+2581's node costs less than a lookup in a cache of every word (measured). */
static int encode_word(const wpm *w, const uint8_t *b, size_t n, ivec *out) {
    size_t first = out->n, i = 0;
    while (i < n) {
        int32_t node = 0, tok = -1;
        size_t best = 0, j = i;
        if (i == 0) { /* every word starts with U+2581: its part of the walk is done once, at load */
            node = w->after_mark;
            tok = w->mark_tok;
            best = w->mark_len;
            j = node < 0 ? n : 3;
        }
        for (; j < n; j++) {
            node = btrie_child(&w->tokens, node, b[j]);
            if (node < 0) break;
            if (btrie_value(&w->tokens, node) >= 0) {
                tok = btrie_value(&w->tokens, node);
                best = j + 1;
            }
        }
        if (tok < 0) {
            out->n = first;
            if (w->unk < 0) return -1;
            return ivec_push(out, w->unk);
        }
        if (!ivec_push(out, tok)) return 0;
        i = best;
    }
    return 1;
}

int wpm_encode(const wpm *w, const uint8_t *text, size_t n, ivec *out) {
    /* a word's normalised bytes: at most 4 per input byte, behind the 3-byte prefix */
    if (n > (SIZE_MAX - 8) / 4) return 0;
    uint8_t *word = malloc(4 * n + 8);
    if (!word) return 0;
    memcpy(word, MARK, 3);
    size_t len = 3, i = 0;
    int r = 1;
    while (i < n && r == 1) {
        uint32_t cp = text[i];
        if (cp < 0x80) { /* ASCII, most of most text */
            i++;
        } else {
            size_t k;
            cp = utf8_next(text + i, n - i, &k);
            i += k;
            if (cp > MAX_CODE_POINT) cp = 0xFFFD;
        }
        uint32_t e = w->norm[cp];
        uint32_t cls = e >> WPM_CP_BITS, to = e & ((1u << WPM_CP_BITS) - 1);
        if (cls == WPM_KEEP) {
            if (to < 0x80)
                word[len++] = (uint8_t)to;
            else
                len += utf8_put(word + len, to);
            continue;
        }
        if (cls == WPM_DROP) continue;
        if (len > 3) r = encode_word(w, word, len, out);
        len = 3;
        if (cls == WPM_ALONE && r == 1) {
            len += utf8_put(word + len, to);
            r = encode_word(w, word, len, out);
            len = 3;
        }
    }
    if (len > 3 && r == 1) r = encode_word(w, word, len, out);
    free(word);
    return r;
}
