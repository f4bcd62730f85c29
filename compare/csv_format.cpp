// Rows of Arrow columns formatted as CSV text, byte for byte as Arrow's CSV writer writes them
// (pyarrow.csv.write_csv, default options): see compare/csv_native.py, which calls it with ctypes.
//
// Per value: a null is empty; int64 in decimal; bool "true"/"false"; a string quoted, its quotes
// doubled; a list of int64 as the quoted text "[2, 4]" (empty when an element is null: the
// compare's CSV joins a list's elements in Arrow, where a null element makes the text null); a double as Arrow's formatter writes it (double-conversion's shortest round-trip
// digits, decimal notation for decimal exponents -6..9, else "d.ddde+X"; "inf", "-inf", "nan",
// "-0"). The shortest digits come from std::to_chars (Ryu in libstdc++): the same digits,
// shortest and then nearest, as double-conversion's, about four times as fast.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

enum Kind : int32_t { K_INT64 = 1, K_DOUBLE = 2, K_BOOL = 3, K_STRING = 4, K_LARGE_STRING = 5,
                      K_LIST_INT64 = 6 };

struct Column {
    int32_t kind;
    int32_t pad;
    int64_t offset;              // the array's slice offset, in values (and validity bits)
    const uint8_t* valid;        // validity bitmap, or null: all valid
    const void* values;          // int64/double values, the bool bitmap, string or list offsets
    const uint8_t* data;         // string bytes, or a list's int64 elements
    const uint8_t* child_valid;  // a list's elements' validity bitmap, or null: all valid
    int64_t child_offset;        // the elements' slice offset
};

inline bool bit(const uint8_t* bits, int64_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

inline char* put(char* o, const char* s, size_t n) {
    std::memcpy(o, s, n);
    return o + n;
}

char* format_double(char* o, double v) {
    if (std::isnan(v)) return put(o, "nan", 3);
    if (std::isinf(v)) return v < 0 ? put(o, "-inf", 4) : put(o, "inf", 3);
    if (v == 0) return std::signbit(v) ? put(o, "-0", 2) : put(o, "0", 1);
    char tmp[48];
    auto r = std::to_chars(tmp, tmp + sizeof tmp, v, std::chars_format::scientific);
    const char* p = tmp;
    if (*p == '-') *o++ = *p++;
    char digits[24];
    int n = 0;
    for (; *p != 'e'; ++p)
        if (*p != '.') digits[n++] = *p;
    ++p;                                           // 'e'
    bool neg = *p == '-';
    ++p;                                           // the exponent's sign
    int exp = 0;
    for (; p < r.ptr; ++p) exp = exp * 10 + (*p - '0');
    if (neg) exp = -exp;
    if (exp >= -6 && exp < 10) {                   // decimal notation
        int point = exp + 1;                       // digits before the decimal point
        if (point <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -point; ++i) *o++ = '0';
            return put(o, digits, n);
        }
        if (point >= n) {
            o = put(o, digits, n);
            for (int i = n; i < point; ++i) *o++ = '0';
            return o;
        }
        o = put(o, digits, point);
        *o++ = '.';
        return put(o, digits + point, n - point);
    }
    *o++ = digits[0];
    if (n > 1) {
        *o++ = '.';
        o = put(o, digits + 1, n - 1);
    }
    *o++ = 'e';
    *o++ = neg ? '-' : '+';
    return std::to_chars(o, o + 8, neg ? -exp : exp).ptr;
}

char* format_string(char* o, const uint8_t* s, int64_t n) {
    *o++ = '"';
    const uint8_t* end = s + n;
    while (s < end) {
        const void* q = std::memchr(s, '"', end - s);
        if (q == nullptr) {
            o = put(o, reinterpret_cast<const char*>(s), end - s);
            break;
        }
        const uint8_t* qq = static_cast<const uint8_t*>(q);
        o = put(o, reinterpret_cast<const char*>(s), qq - s + 1);
        *o++ = '"';
        s = qq + 1;
    }
    *o++ = '"';
    return o;
}

char* format_int_list(char* o, const Column& col, int64_t i) {
    const int32_t* off = static_cast<const int32_t*>(col.values);
    const int64_t* v = reinterpret_cast<const int64_t*>(col.data);
    int64_t lo = col.child_offset + off[i], hi = col.child_offset + off[i + 1];
    if (col.child_valid != nullptr)
        for (int64_t k = lo; k < hi; ++k)
            if (!bit(col.child_valid, k)) return o;
    *o++ = '"';
    *o++ = '[';
    for (int64_t k = lo; k < hi; ++k) {
        if (k > lo) {
            *o++ = ',';
            *o++ = ' ';
        }
        o = std::to_chars(o, o + 24, v[k]).ptr;
    }
    *o++ = ']';
    *o++ = '"';
    return o;
}

}  // namespace

extern "C" {

// Format rows [row0, row0 + nrows) of ``cols`` into ``out`` (``cap`` bytes): each row's values
// joined by commas, then a newline. Returns the bytes written, or -1 when ``cap`` would be
// exceeded (the caller sizes it from the columns' widths, so this is a guard) or -2 for an
// unknown column kind.
int64_t probe_csv_format(const Column* cols, int32_t ncols, int64_t row0, int64_t nrows,
                         char* out, int64_t cap) {
    char* o = out;
    char* limit = out + cap;
    for (int64_t r = row0; r < row0 + nrows; ++r) {
        for (int32_t c = 0; c < ncols; ++c) {
            const Column& col = cols[c];
            if (c) *o++ = ',';
            int64_t i = col.offset + r;
            if (col.valid != nullptr && !bit(col.valid, i)) continue;
            switch (col.kind) {
                case K_INT64:
                    o = std::to_chars(o, o + 24, static_cast<const int64_t*>(col.values)[i]).ptr;
                    break;
                case K_DOUBLE:
                    o = format_double(o, static_cast<const double*>(col.values)[i]);
                    break;
                case K_BOOL:
                    o = bit(static_cast<const uint8_t*>(col.values), i) ? put(o, "true", 4) : put(o, "false", 5);
                    break;
                case K_STRING: {
                    const int32_t* off = static_cast<const int32_t*>(col.values);
                    o = format_string(o, col.data + off[i], off[i + 1] - off[i]);
                    break;
                }
                case K_LARGE_STRING: {
                    const int64_t* off = static_cast<const int64_t*>(col.values);
                    o = format_string(o, col.data + off[i], off[i + 1] - off[i]);
                    break;
                }
                case K_LIST_INT64:
                    o = format_int_list(o, col, i);
                    break;
                default:
                    return -2;
            }
        }
        *o++ = '\n';
        if (o > limit) return -1;
    }
    return o - out;
}

}  // extern "C"
