/* One pass over an msprobe dump.json straight into Arrow buffers (no Python objects per value).
 *
 * Compiled once per machine by collectors/msprobe_scan.py and loaded with ctypes. It reads the
 * common layout only: {"...": ..., "data": {NAME: ENTRY, ...}} where a forward/backward ENTRY
 * is an object whose "input_args", "output" and "input" are arrays and whose "input_kwargs" and
 * "parameters" are objects, each holding tensor-statistics objects or null (members read:
 * type, dtype, shape, Max, Min, Mean, Norm, md5, data_name, requires_grad and the tensor_id our
 * dumps add; others are skipped), and a "*.parameters_grad*" ENTRY maps each parameter to an
 * array of one tensor object. Numbers may be the NaN, Infinity and -Infinity literals Python's
 * json module writes; names and string values may hold escapes (json.dump writes every
 * non-ASCII character of a name as a \u escape), decoded as a JSON parser decodes them. Anything
 * else (nested outputs, non-tensor arguments, escapes in the layout's own member names or a
 * half surrogate pair, odd value types, truncated or malformed text) makes it return a negative
 * code, and the caller reads the file the general
 * way (orjson and a Python walk), which also words the error for malformed input.
 *
 * Every read is bounds-checked against the buffer's end, every write against the capacities the
 * caller gave (a capacity overflow is a negative code too, never a write out of bounds).
 */
#include <locale.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <float.h>
#include <math.h>

/* A string column: Arrow offsets (int32, n+1) and data bytes, one validity byte per row. */
typedef struct {
    int32_t *offsets;
    char *data;
    uint8_t *valid;
    int64_t data_cap;
    int64_t data_len;
} strcol_t;

typedef struct {
    const char *buf;
    int64_t len;
    /* entries */
    int64_t ent_cap, n_ent;
    strcol_t names;
    /* tensors */
    int64_t t_cap, n_t;
    int64_t *seq;         /* entry index */
    int8_t *slot;         /* 0 input_args, 1 input_kwargs, 2 output, 3 parameters, 4 input, 5 parameter_grad */
    int32_t *pos;         /* position in its array, -1 for an object member (its key is in keys) */
    strcol_t keys;        /* object member names (kwarg / parameter names) */
    strcol_t type, dtype, md5, data_name;
    double *stats;        /* 4 per tensor: Max, Min, Mean, Norm */
    uint8_t *stat_valid;  /* 4 per tensor */
    int8_t *requires_grad;/* -1 null, 0, 1 */
    int32_t *shape_off;   /* Arrow list offsets (n+1) */
    uint8_t *shape_valid;
    int64_t s_cap, n_s;
    int64_t *shape_vals;
    /* top-level members other than "data": key and value byte ranges */
    int64_t meta_cap, n_meta;
    int64_t *meta_ranges; /* 4 per member: key start, key end, value start, value end */
    int64_t err_pos;
    int64_t release;      /* buf is a file mapping: hand back the pages read (see release_read) */
    int64_t *tensor_id;   /* our dumps' "tensor_id" (an integer), per tensor */
    uint8_t *tensor_id_valid;
} scan_t;

enum { E_SYNTAX = -1, E_LAYOUT = -2, E_CAPACITY = -3, E_ESCAPE = -4, E_LOCALE = -5 };

#define WS(c) ((c) == ' ' || (c) == '\n' || (c) == '\r' || (c) == '\t')

static inline int64_t skip_ws(const scan_t *s, int64_t i) {
    while (i < s->len && WS(s->buf[i])) i++;
    return i;
}

/* A string at i (the opening quote): sets [*a, *b) to its raw bytes (escapes as written) and
   returns the index after the closing quote. *esc = 1 when it holds a backslash; with esc NULL
   such a string is E_ESCAPE (the caller falls back). */
static int64_t string_span(const scan_t *s, int64_t i, int64_t *a, int64_t *b, int *esc) {
    if (i >= s->len || s->buf[i] != '"') return E_SYNTAX;
    const char *start = s->buf + i + 1, *end = s->buf + s->len;
    const char *q = memchr(start, '"', (size_t)(end - start));
    if (q == NULL) return E_SYNTAX;
    const char *p = memchr(start, '\\', (size_t)(q - start));
    if (p != NULL) {
        if (esc == NULL) return E_ESCAPE;
        while (p < end && *p != '"') p += *p == '\\' ? 2 : 1;   /* an escaped quote is no end */
        if (p >= end) return E_SYNTAX;
        q = p;
    }
    if (esc != NULL) *esc = p != NULL;
    *a = i + 1;
    *b = q - s->buf;
    return *b + 1;
}

static int hex4(const char *p, uint32_t *v) {
    uint32_t x = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        x = x * 16 + (uint32_t)d;
    }
    *v = x;
    return 1;
}

/* The n raw bytes of a string with escapes, decoded as a JSON parser decodes them, into out
   (never longer than n); returns the length, or E_SYNTAX for a bad escape and E_ESCAPE for half
   a surrogate pair (not a character: the general path says so). */
static int64_t unescape(const char *p, int64_t n, char *out) {
    int64_t o = 0;
    for (int64_t k = 0; k < n;) {
        if (p[k] != '\\') { out[o++] = p[k++]; continue; }
        if (k + 1 >= n) return E_SYNTAX;
        char e = p[k + 1];
        k += 2;
        uint32_t u;
        switch (e) {
        case '"': out[o++] = '"'; continue;
        case '\\': out[o++] = '\\'; continue;
        case '/': out[o++] = '/'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'n': out[o++] = '\n'; continue;
        case 'r': out[o++] = '\r'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'u': break;
        default: return E_SYNTAX;
        }
        if (k + 4 > n || !hex4(p + k, &u)) return E_SYNTAX;
        k += 4;
        if (u >= 0xDC00 && u <= 0xDFFF) return E_ESCAPE;
        if (u >= 0xD800 && u <= 0xDBFF) {
            uint32_t lo;
            if (k + 6 > n || p[k] != '\\' || p[k + 1] != 'u' || !hex4(p + k + 2, &lo)
                || lo < 0xDC00 || lo > 0xDFFF) return E_ESCAPE;
            k += 6;
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (u < 0x80) {
            out[o++] = (char)u;
        } else if (u < 0x800) {
            out[o++] = (char)(0xC0 | (u >> 6));
            out[o++] = (char)(0x80 | (u & 0x3F));
        } else if (u < 0x10000) {
            out[o++] = (char)(0xE0 | (u >> 12));
            out[o++] = (char)(0x80 | ((u >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (u & 0x3F));
        } else {
            out[o++] = (char)(0xF0 | (u >> 18));
            out[o++] = (char)(0x80 | ((u >> 12) & 0x3F));
            out[o++] = (char)(0x80 | ((u >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (u & 0x3F));
        }
    }
    return o;
}

/* A member name at i (after skipping whitespace) and its colon: sets [*a, *b) to the name and
   returns the index of the member's value. esc: as string_span's (NULL: the layout's own
   member names, which are read literally). */
static int64_t member_key(const scan_t *s, int64_t i, int64_t *a, int64_t *b, int *esc) {
    i = string_span(s, skip_ws(s, i), a, b, esc);
    if (i < 0) return i;
    i = skip_ws(s, i);
    if (i >= s->len || s->buf[i] != ':') return E_SYNTAX;
    return skip_ws(s, i + 1);
}

static inline int lit(const scan_t *s, int64_t i, const char *w, int64_t n) {
    return i + n <= s->len && memcmp(s->buf + i, w, (size_t)n) == 0;
}

static int64_t number(const scan_t *s, int64_t i, double *out, int *ok);

/* Skip (and check) any JSON value at i, strings with escapes included; returns the index after
   it. Nesting deeper than 256 is a layout the caller reads the general way. */
/* A JSON integer in int64's range at i: its value in *out, the index after it; E_LAYOUT for
 * anything else (a fraction, an exponent, no digit, too many digits). */
static int64_t integer(const scan_t *s, int64_t i, int64_t *out) {
    int64_t j = i, v = 0;
    int neg = 0;
    if (j < s->len && s->buf[j] == '-') { neg = 1; j++; }
    int64_t d0 = j;
    while (j < s->len && s->buf[j] >= '0' && s->buf[j] <= '9') {
        if (v > (INT64_MAX - 9) / 10) return E_LAYOUT;
        v = v * 10 + (s->buf[j] - '0');
        j++;
    }
    if (j == d0 || (j < s->len && (s->buf[j] == '.' || s->buf[j] == 'e' || s->buf[j] == 'E')))
        return E_LAYOUT;
    *out = neg ? -v : v;
    return j;
}

static int64_t skip_value_d(const scan_t *s, int64_t i, int depth) {
    i = skip_ws(s, i);
    if (i >= s->len) return E_SYNTAX;
    if (depth > 256) return E_LAYOUT;
    char c = s->buf[i];
    if (c == '"') {
        for (i++; i < s->len; i++) {
            if (s->buf[i] == '\\') { i++; continue; }
            if (s->buf[i] == '"') return i + 1;
        }
        return E_SYNTAX;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        i = skip_ws(s, i + 1);
        if (i < s->len && s->buf[i] == close) return i + 1;
        for (;;) {
            if (c == '{') {
                i = skip_value_d(s, i, depth + 1);          /* the member name */
                if (i < 0) return i;
                if (s->buf[i - 1] != '"') return E_SYNTAX;
                i = skip_ws(s, i);
                if (i >= s->len || s->buf[i] != ':') return E_SYNTAX;
                i++;
            }
            i = skip_value_d(s, i, depth + 1);
            if (i < 0) return i;
            i = skip_ws(s, i);
            if (i < s->len && s->buf[i] == ',') { i++; continue; }
            if (i < s->len && s->buf[i] == close) return i + 1;
            return E_SYNTAX;
        }
    }
    if (lit(s, i, "true", 4) || lit(s, i, "null", 4)) return i + 4;
    if (lit(s, i, "false", 5)) return i + 5;
    double v;
    int ok;
    int64_t j = number(s, i, &v, &ok);
    return j == E_LAYOUT ? E_SYNTAX : j;
}

static int64_t skip_value(const scan_t *s, int64_t i) { return skip_value_d(s, i, 0); }

/* A number (JSON syntax, or NaN / Infinity / -Infinity as msprobe writes them) or null at i.
   Returns the index after it; *ok = 0 for null. */
/* The double nearest to w x 10^e10 (w < 2^64) without strtod, where that is exact and cheap:
   one x87 operation of w and an exact power of ten (10^27 at most) is correctly rounded to a
   64-bit mantissa, and rounding that to a double gives the double nearest to the exact value
   unless it lies exactly halfway between two doubles (its 11 extra bits 10000000000), which
   is left to strtod, as are results outside the normal range. Returns 0 when it does not
   apply (strtod then reads the text: the same double, a third of the time). */
static int exact_decimal(uint64_t w, int64_t e10, int neg, double *out) {
#if (defined(__x86_64__) || defined(__i386__)) && LDBL_MANT_DIG == 64
    static const long double p10[28] = {
        1e0L, 1e1L, 1e2L, 1e3L, 1e4L, 1e5L, 1e6L, 1e7L, 1e8L, 1e9L, 1e10L, 1e11L, 1e12L, 1e13L,
        1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L,
        1e26L, 1e27L};
    if (e10 < -27 || e10 > 27) return 0;
    long double y = e10 >= 0 ? (long double)w * p10[e10] : (long double)w / p10[-e10];
    if (y != 0.0L) {
        if (y < (long double)DBL_MIN || y > (long double)DBL_MAX) return 0;
        union { long double v; struct { uint64_t mant; uint16_t sign_exp; } bits; } u;
        u.v = y;
        if ((u.bits.mant & 0x7FF) == 0x400) return 0;       /* halfway: strtod decides */
    }
    double d = (double)y;
    *out = neg ? -d : d;
    return 1;
#else
    (void)w; (void)e10; (void)neg; (void)out;
    return 0;
#endif
}

/* A number (JSON syntax, or NaN / Infinity / -Infinity as msprobe writes them) or null at i.
   Returns the index after it; *ok = 0 for null. */
static int64_t number(const scan_t *s, int64_t i, double *out, int *ok) {
    if (lit(s, i, "null", 4)) { *ok = 0; return i + 4; }
    if (lit(s, i, "NaN", 3)) { *out = NAN; *ok = 1; return i + 3; }
    if (lit(s, i, "Infinity", 8)) { *out = INFINITY; *ok = 1; return i + 8; }
    if (lit(s, i, "-Infinity", 9)) { *out = -INFINITY; *ok = 1; return i + 9; }
    int64_t j = i;
    int neg = 0;
    if (j < s->len && s->buf[j] == '-') { neg = 1; j++; }
    /* the significant digits as an integer w (while they fit: 19 of them), and the power of
       ten that scales it */
    uint64_t w = 0;
    int digits = 0, exact = 1;
    int64_t e10 = 0;
    int64_t d0 = j;
    for (; j < s->len && s->buf[j] >= '0' && s->buf[j] <= '9'; j++) {
        if (w == 0 && s->buf[j] == '0') continue;
        if (digits < 19) { w = w * 10 + (uint64_t)(s->buf[j] - '0'); digits++; }
        else { exact = 0; }
    }
    if (j == d0) return E_LAYOUT;           /* a string, bool, object...: not a number */
    if (j < s->len && s->buf[j] == '.') {
        int64_t f0 = ++j;
        for (; j < s->len && s->buf[j] >= '0' && s->buf[j] <= '9'; j++) {
            if (w == 0 && s->buf[j] == '0') { e10--; continue; }
            if (digits < 19) { w = w * 10 + (uint64_t)(s->buf[j] - '0'); digits++; e10--; }
            else { exact = 0; }
        }
        if (j == f0) return E_SYNTAX;
    }
    if (j < s->len && (s->buf[j] == 'e' || s->buf[j] == 'E')) {
        j++;
        int eneg = 0;
        if (j < s->len && (s->buf[j] == '+' || s->buf[j] == '-')) { eneg = s->buf[j] == '-'; j++; }
        int64_t e0 = j, ev = 0;
        for (; j < s->len && s->buf[j] >= '0' && s->buf[j] <= '9'; j++) {
            if (ev < 100000) ev = ev * 10 + (s->buf[j] - '0');
        }
        if (j == e0) return E_SYNTAX;
        e10 += eneg ? -ev : ev;
    }
    *ok = 1;
    if (exact && exact_decimal(w, e10, neg, out)) return j;
    char tmp[64];
    if (j - i >= (int64_t)sizeof tmp) return E_LAYOUT;
    memcpy(tmp, s->buf + i, (size_t)(j - i));
    tmp[j - i] = 0;
    *out = strtod(tmp, NULL);
    return j;
}

/* n bytes of a string (raw, or with escapes: esc = 1, decoded) into column c at row. */
static int str_put(strcol_t *c, int64_t row, const char *p, int64_t n, int esc) {
    if (c->data_len + n > c->data_cap || c->data_len + n > INT32_MAX) return E_CAPACITY;
    if (esc) {
        n = unescape(p, n, c->data + c->data_len);
        if (n < 0) return (int)n;
    } else {
        memcpy(c->data + c->data_len, p, (size_t)n);
    }
    c->data_len += n;
    c->offsets[row + 1] = (int32_t)c->data_len;
    c->valid[row] = 1;
    return 0;
}

static inline void str_null(strcol_t *c, int64_t row) {
    c->offsets[row + 1] = (int32_t)c->data_len;
    c->valid[row] = 0;
}

/* An optional string member value (string or null) into column c at row. */
static int64_t str_member(scan_t *s, int64_t i, strcol_t *c, int64_t row) {
    if (lit(s, i, "null", 4)) { str_null(c, row); return i + 4; }
    int64_t a, b;
    int esc;
    int64_t j = string_span(s, i, &a, &b, &esc);
    if (j < 0) return j == E_SYNTAX ? E_LAYOUT : j;
    int r = str_put(c, row, s->buf + a, b - a, esc);
    return r < 0 ? r : j;
}

#define KEY_IS(w) (kb - ka == (int64_t)(sizeof(w) - 1) && memcmp(s->buf + ka, w, sizeof(w) - 1) == 0)

/* A tensor-statistics object at i (or null: no row). Appends one tensor row. */
static int64_t tensor(scan_t *s, int64_t i, int64_t seq, int slot, int32_t pos,
                      const char *key, int64_t key_len, int key_esc) {
    if (lit(s, i, "null", 4)) return i + 4;
    if (i >= s->len || s->buf[i] != '{') return E_LAYOUT;
    if (s->n_t >= s->t_cap) return E_CAPACITY;
    int64_t r = s->n_t;
    s->seq[r] = seq;
    s->slot[r] = (int8_t)slot;
    s->pos[r] = pos;
    if (key != NULL) {
        int e = str_put(&s->keys, r, key, key_len, key_esc);
        if (e < 0) return e;
    } else {
        str_null(&s->keys, r);
    }
    str_null(&s->type, r); str_null(&s->dtype, r); str_null(&s->md5, r); str_null(&s->data_name, r);
    for (int k = 0; k < 4; k++) { s->stats[4 * r + k] = 0; s->stat_valid[4 * r + k] = 0; }
    s->requires_grad[r] = -1;
    s->tensor_id[r] = 0;
    s->tensor_id_valid[r] = 0;
    s->shape_off[r + 1] = (int32_t)s->n_s;
    s->shape_valid[r] = 0;
    /* a member seen twice is a layout the caller reads instead (the general path refuses a
       repeated key: a JSON parser would keep its last value silently) */
    unsigned seen = 0;
    i = skip_ws(s, i + 1);
    if (i < s->len && s->buf[i] == '}') { s->n_t++; return i + 1; }
    for (;;) {
        int64_t ka, kb;
        i = member_key(s, i, &ka, &kb, NULL);
        if (i < 0) return i;
        int stat = -1;
        if (KEY_IS("Max")) stat = 0;
        else if (KEY_IS("Min")) stat = 1;
        else if (KEY_IS("Mean")) stat = 2;
        else if (KEY_IS("Norm")) stat = 3;
        if (stat >= 0) {
            if (seen & (32u << stat)) return E_LAYOUT;
            seen |= 32u << stat;
            double v = 0;
            int ok = 0;
            i = number(s, i, &v, &ok);
            if (i < 0) return i;
            s->stats[4 * r + stat] = v;
            s->stat_valid[4 * r + stat] = (uint8_t)ok;
        } else if (KEY_IS("type") || KEY_IS("dtype") || KEY_IS("md5") || KEY_IS("data_name")) {
            unsigned bit = KEY_IS("type") ? 1u : KEY_IS("dtype") ? 2u : KEY_IS("md5") ? 4u : 8u;
            if (seen & bit) return E_LAYOUT;
            seen |= bit;
            strcol_t *c = bit == 1u ? &s->type : bit == 2u ? &s->dtype : bit == 4u ? &s->md5 : &s->data_name;
            i = str_member(s, i, c, r);
            if (i < 0) return i;
        } else if (KEY_IS("requires_grad")) {
            if (seen & 512u) return E_LAYOUT;
            seen |= 512u;
            if (lit(s, i, "true", 4)) { s->requires_grad[r] = 1; i += 4; }
            else if (lit(s, i, "false", 5)) { s->requires_grad[r] = 0; i += 5; }
            else if (lit(s, i, "null", 4)) { s->requires_grad[r] = -1; i += 4; }
            else return E_LAYOUT;
        } else if (KEY_IS("tensor_id")) {
            if (seen & 1024u) return E_LAYOUT;
            seen |= 1024u;
            /* an integer in int64's range or null; anything else is read the general way */
            if (lit(s, i, "null", 4)) {
                s->tensor_id_valid[r] = 0;
                i += 4;
            } else {
                int64_t v;
                i = integer(s, i, &v);
                if (i < 0) return i;
                s->tensor_id[r] = v;
                s->tensor_id_valid[r] = 1;
            }
        } else if (KEY_IS("shape")) {
            if (seen & 16u) return E_LAYOUT;
            seen |= 16u;
            if (lit(s, i, "null", 4)) {
                i += 4;
            } else {
                if (i >= s->len || s->buf[i] != '[') return E_LAYOUT;
                i = skip_ws(s, i + 1);
                if (i < s->len && s->buf[i] == ']') {
                    i++;
                } else {
                    for (;;) {
                        int64_t v, j = integer(s, i, &v);
                        if (j < 0) return j;
                        if (s->n_s >= s->s_cap) return E_CAPACITY;
                        s->shape_vals[s->n_s++] = v;
                        i = skip_ws(s, j);
                        if (i < s->len && s->buf[i] == ',') { i = skip_ws(s, i + 1); continue; }
                        if (i < s->len && s->buf[i] == ']') { i++; break; }
                        return E_SYNTAX;
                    }
                }
                s->shape_valid[r] = 1;
                if (s->n_s > INT32_MAX) return E_CAPACITY;
                s->shape_off[r + 1] = (int32_t)s->n_s;
            }
        } else {
            i = skip_value(s, i);
            if (i < 0) return i;
        }
        i = skip_ws(s, i);
        if (i < s->len && s->buf[i] == ',') { i++; continue; }
        if (i < s->len && s->buf[i] == '}') break;
        return E_SYNTAX;
    }
    s->n_t++;
    return i + 1;
}

/* An array of tensors (or null) for one slot. */
static int64_t tensor_array(scan_t *s, int64_t i, int64_t seq, int slot) {
    if (lit(s, i, "null", 4)) return i + 4;
    if (i >= s->len || s->buf[i] != '[') return E_LAYOUT;
    i = skip_ws(s, i + 1);
    if (i < s->len && s->buf[i] == ']') return i + 1;
    for (int32_t k = 0;; k++) {
        i = tensor(s, skip_ws(s, i), seq, slot, k, NULL, 0, 0);
        if (i < 0) return i;
        i = skip_ws(s, i);
        if (i < s->len && s->buf[i] == ',') { i++; continue; }
        if (i < s->len && s->buf[i] == ']') return i + 1;
        return E_SYNTAX;
    }
}

/* The most members of one object of named tensors whose names are compared for repeats; an
   object with more (or with an escaped name beside others) is read the general way. */
#define MAX_NAMED 64

/* An object of named tensors (or null) for one slot; for parameter gradients (grad = 1) each
   member is an array of exactly one tensor. A name given twice is a layout the caller reads
   instead (the general path refuses it). */
static int64_t tensor_object(scan_t *s, int64_t i, int64_t seq, int slot, int grad) {
    if (lit(s, i, "null", 4)) return grad ? E_LAYOUT : i + 4;
    if (i >= s->len || s->buf[i] != '{') return E_LAYOUT;
    i = skip_ws(s, i + 1);
    if (i < s->len && s->buf[i] == '}') return i + 1;
    int64_t names[2 * MAX_NAMED];
    int n_names = 0, escaped = 0;
    for (;;) {
        int64_t ka, kb;
        int esc;
        i = member_key(s, i, &ka, &kb, &esc);
        if (i < 0) return i;
        if (n_names == MAX_NAMED) return E_LAYOUT;
        escaped |= esc;
        if (escaped && n_names > 0) return E_LAYOUT;
        for (int k = 0; k < n_names; k++)
            if (names[2 * k + 1] - names[2 * k] == kb - ka &&
                memcmp(s->buf + names[2 * k], s->buf + ka, (size_t)(kb - ka)) == 0) return E_LAYOUT;
        names[2 * n_names] = ka;
        names[2 * n_names + 1] = kb;
        n_names++;
        if (grad) {
            if (i >= s->len || s->buf[i] != '[') return E_LAYOUT;
            i = skip_ws(s, i + 1);
            if (lit(s, i, "null", 4)) return E_LAYOUT;
            i = tensor(s, i, seq, slot, -1, s->buf + ka, kb - ka, esc);
            if (i < 0) return i;
            i = skip_ws(s, i);
            if (i >= s->len || s->buf[i] != ']') return E_LAYOUT;
            i++;
        } else {
            i = tensor(s, i, seq, slot, -1, s->buf + ka, kb - ka, esc);
            if (i < 0) return i;
        }
        i = skip_ws(s, i);
        if (i < s->len && s->buf[i] == ',') { i++; continue; }
        if (i < s->len && s->buf[i] == '}') return i + 1;
        return E_SYNTAX;
    }
}

static int has(const char *p, int64_t n, const char *w) {
    int64_t m = (int64_t)strlen(w);
    for (int64_t k = 0; k + m <= n; k++)
        if (p[k] == w[0] && memcmp(p + k, w, (size_t)m) == 0) return 1;
    return 0;
}

/* One entry's value. */
static int64_t entry(scan_t *s, int64_t i, int64_t seq, int grad) {
    if (i >= s->len || s->buf[i] != '{') return E_LAYOUT;
    if (grad) return tensor_object(s, i, seq, 5, 1);
    i = skip_ws(s, i + 1);
    if (i < s->len && s->buf[i] == '}') return i + 1;
    unsigned seen = 0;
    for (;;) {
        int64_t ka, kb;
        i = member_key(s, i, &ka, &kb, NULL);
        if (i < 0) return i;
        int slot = KEY_IS("input_args") ? 0 : KEY_IS("input_kwargs") ? 1 : KEY_IS("output") ? 2
                 : KEY_IS("parameters") ? 3 : KEY_IS("input") ? 4 : -1;
        if (slot >= 0) {
            if (seen & (1u << slot)) return E_LAYOUT;     /* a repeated member: read the general way */
            seen |= 1u << slot;
            i = (slot == 1 || slot == 3) ? tensor_object(s, i, seq, slot, 0) : tensor_array(s, i, seq, slot);
        } else {
            i = skip_value(s, i);
        }
        if (i < 0) return i;
        i = skip_ws(s, i);
        if (i < s->len && s->buf[i] == ',') { i++; continue; }
        if (i < s->len && s->buf[i] == '}') return i + 1;
        return E_SYNTAX;
    }
}

/* A file mapping's pages before i, read, handed back every 32 MB: the mapping's resident size
   stays bounded (an 800 MB dump.json is not all resident at once). The pages stay in the page
   cache, and a later read of them (the top-level members, a second scan) maps them again. */
static void release_read(const scan_t *s, int64_t i, int64_t *done) {
    if (!s->release || i - *done < ((int64_t)32 << 20)) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t base = (uintptr_t)s->buf;
    uintptr_t from = (base + (uintptr_t)*done + page - 1) & ~(page - 1);
    uintptr_t to = (base + (uintptr_t)i) & ~(page - 1);
    if (to > from) madvise((void *)from, to - from, MADV_DONTNEED);
    *done = i;
}

/* The whole document. Returns the number of entries (>= 0) or a negative code; s->err_pos is
   where it stopped. */
int64_t probe_scan_msprobe(scan_t *s) {
    struct lconv *lc = localeconv();
    if (lc == NULL || lc->decimal_point == NULL || strcmp(lc->decimal_point, ".") != 0) return E_LOCALE;
    s->n_ent = s->n_t = s->n_s = s->n_meta = 0;
    s->names.data_len = s->keys.data_len = s->type.data_len = s->dtype.data_len = 0;
    s->md5.data_len = s->data_name.data_len = 0;
    s->names.offsets[0] = s->keys.offsets[0] = s->type.offsets[0] = s->dtype.offsets[0] = 0;
    s->md5.offsets[0] = s->data_name.offsets[0] = 0;
    s->shape_off[0] = 0;
    int64_t i = skip_ws(s, 0);
    int64_t released = 0;
    int seen_data = 0;
    if (i >= s->len || s->buf[i] != '{') { s->err_pos = i; return E_LAYOUT; }
    i = skip_ws(s, i + 1);
    if (i < s->len && s->buf[i] == '}') { s->err_pos = i; return E_LAYOUT; }
    for (;;) {
        int64_t ka, kb;
        i = member_key(s, i, &ka, &kb, NULL);
        if (i < 0) { s->err_pos = -1; return i; }
        if (KEY_IS("data")) {
            if (seen_data) { s->err_pos = i; return E_LAYOUT; }
            seen_data = 1;
            if (i >= s->len || s->buf[i] != '{') { s->err_pos = i; return E_LAYOUT; }
            i = skip_ws(s, i + 1);
            if (i < s->len && s->buf[i] == '}') {
                i++;
            } else {
                for (;;) {
                    int64_t na, nb;
                    int esc;
                    i = member_key(s, i, &na, &nb, &esc);
                    if (i < 0) { s->err_pos = -1; return i; }
                    if (s->n_ent >= s->ent_cap) return E_CAPACITY;
                    int e = str_put(&s->names, s->n_ent, s->buf + na, nb - na, esc);
                    if (e < 0) return e;
                    const char *name = s->names.data + s->names.offsets[s->n_ent];
                    i = entry(s, i, s->n_ent, has(name, s->names.offsets[s->n_ent + 1]
                                                        - s->names.offsets[s->n_ent], ".parameters_grad"));
                    if (i < 0) { s->err_pos = i; return i; }
                    s->n_ent++;
                    release_read(s, i, &released);
                    i = skip_ws(s, i);
                    if (i < s->len && s->buf[i] == ',') { i++; continue; }
                    if (i < s->len && s->buf[i] == '}') { i++; break; }
                    s->err_pos = i;
                    return E_SYNTAX;
                }
            }
        } else {
            int64_t v0 = i;
            i = skip_value(s, i);
            if (i < 0) { s->err_pos = v0; return i; }
            if (s->n_meta >= s->meta_cap) return E_CAPACITY;
            int64_t *m = s->meta_ranges + 4 * s->n_meta++;
            m[0] = ka; m[1] = kb; m[2] = v0; m[3] = i;
        }
        i = skip_ws(s, i);
        if (i < s->len && s->buf[i] == ',') { i++; continue; }
        if (i < s->len && s->buf[i] == '}') { i++; break; }
        s->err_pos = i;
        return E_SYNTAX;
    }
    if (skip_ws(s, i) != s->len || !seen_data) { s->err_pos = i; return E_SYNTAX; }
    return s->n_ent;
}
