/* The text measures' one pass, in C (NOTES #83): common/work/page.py's measure_text calls
 * solid_text(text) and hashes what it returns; page.py holds the same pass in Python, for a
 * checkout where this module is not built, and the tests hold the two equal.
 *
 * solid_text(text) -> (text_length, solid): ``solid`` is the text's UTF-8 bytes without ASCII
 * whitespace (space, \t, \n, \r, \f), and ``text_length`` the length in characters of the text
 * with each run of ASCII whitespace collapsed to one space and trimmed. A lone surrogate
 * (which lxml can hand over) is encoded as with "surrogatepass", as page.py does.
 *
 * One pass over the str's own storage, encoding to UTF-8 as it goes, with no branch on ASCII
 * characters: the Python form takes four passes (an encode, two translates and a pair count),
 * ~60 us against ~20 on a farm page's 23 KB of text, fresh from the parser.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_module.h"

#ifdef SIXTEEN_AT_A_TIME
/* The set bits of a byte, from a table: __builtin_popcount is a libgcc call without -mpopcnt,
 * which the x86-64 baseline lacks. */
#define POP2(n) n, n + 1, n + 1, n + 2
#define POP4(n) POP2(n), POP2(n + 1), POP2(n + 1), POP2(n + 2)
#define POP6(n) POP4(n), POP4(n + 1), POP4(n + 1), POP4(n + 2)
static const unsigned char BITS_SET[256] = {POP6(0), POP6(1), POP6(1), POP6(2)};
#define POPCOUNT16(m) (BITS_SET[(m) & 0xFFu] + BITS_SET[(m) >> 8])
#endif

/* One character: counted, and appended to ``out`` as UTF-8 unless it is ASCII whitespace. A
 * surrogate code point takes three bytes, as "surrogatepass" writes it. */
#define MEASURE(ch)                                                                  \
    do {                                                                             \
        Py_UCS4 c_ = (ch);                                                           \
        int space_ = (c_ == ' ') | (c_ == '\n') | (c_ == '\t') | (c_ == '\r')        \
                     | (c_ == '\f');                                                 \
        words += after_space & !space_; /* a word starts here */                     \
        chars += !space_;                                                            \
        after_space = space_;                                                        \
        if (c_ < 0x80) {                                                             \
            out[kept] = (unsigned char)c_; /* written always, kept when not a space */ \
            kept += !space_;                                                         \
        } else if (c_ < 0x800) {                                                     \
            out[kept++] = (unsigned char)(0xC0 | (c_ >> 6));                         \
            out[kept++] = (unsigned char)(0x80 | (c_ & 0x3F));                       \
        } else if (c_ < 0x10000) {                                                   \
            out[kept++] = (unsigned char)(0xE0 | (c_ >> 12));                        \
            out[kept++] = (unsigned char)(0x80 | ((c_ >> 6) & 0x3F));                \
            out[kept++] = (unsigned char)(0x80 | (c_ & 0x3F));                       \
        } else {                                                                     \
            out[kept++] = (unsigned char)(0xF0 | (c_ >> 18));                        \
            out[kept++] = (unsigned char)(0x80 | ((c_ >> 12) & 0x3F));               \
            out[kept++] = (unsigned char)(0x80 | ((c_ >> 6) & 0x3F));                \
            out[kept++] = (unsigned char)(0x80 | (c_ & 0x3F));                       \
        }                                                                            \
    } while (0)

#ifdef SIXTEEN_AT_A_TIME
/* Sixteen characters under U+0100 at once, as bytes: their whitespace found with five byte
 * compares, the words that start and the characters kept counted from the masks, and the
 * kept characters written in order as UTF-8 without a branch (each byte is written, and
 * the next one overwrites it when it was whitespace; a character over 0x7F takes two
 * bytes). ``out`` has room: an ASCII str's characters take one byte each, others two.
 * Farm text: 1.4 -> ~0.5 ns a character. */
static inline void
latin1_block(__m128i block, const unsigned char *bytes, unsigned char *out, Py_ssize_t *kept,
             Py_ssize_t *chars, Py_ssize_t *words, int *after_space)
{
    unsigned high = (unsigned)_mm_movemask_epi8(block);
    __m128i space = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(block, _mm_set1_epi8(' ')),
                     _mm_cmpeq_epi8(block, _mm_set1_epi8('\n'))),
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(block, _mm_set1_epi8('\t')),
                                  _mm_cmpeq_epi8(block, _mm_set1_epi8('\r'))),
                     _mm_cmpeq_epi8(block, _mm_set1_epi8('\f'))));
    unsigned spaces = (unsigned)_mm_movemask_epi8(space);
    unsigned solid = ~spaces & 0xFFFFu;
    unsigned after = ((spaces << 1) | (unsigned)*after_space) & 0xFFFFu;
    *words += POPCOUNT16(solid & after); /* a word starts after a space */
    *chars += POPCOUNT16(solid);
    *after_space = (int)(spaces >> 15);
    Py_ssize_t at = *kept;
    if (!spaces && !high) {
        _mm_storeu_si128((__m128i *)(out + at), block);
        *kept = at + 16;
        return;
    }
    if (!high) {
        for (int j = 0; j < 16; j++) {
            out[at] = bytes[j];
            at += (solid >> j) & 1u;
        }
    } else {
        for (int j = 0; j < 16; j++) {
            unsigned char c = bytes[j];
            unsigned two = (high >> j) & 1u;
            out[at] = two ? (unsigned char)(0xC0 | (c >> 6)) : c;
            out[at + 1] = (unsigned char)(0x80 | (c & 0x3F)); /* kept only by ``two`` */
            at += ((solid >> j) & 1u) + two;
        }
    }
    *kept = at;
}
#endif

static PyObject *
solid_text(PyObject *module, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "solid_text() takes a str");
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0)
        return NULL;
#endif
    /* Read in the str's own storage, one to four bytes a character: no UTF-8 copy is made
     * (PyUnicode_AsUTF8AndSize would build one, and keep it as long as the str lives). */
    Py_ssize_t length = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t per_char = PyUnicode_IS_ASCII(text) ? 1 : (kind == PyUnicode_1BYTE_KIND ? 2
                          : (kind == PyUnicode_2BYTE_KIND ? 3 : 4));
    if (length > PY_SSIZE_T_MAX / per_char)
        return PyErr_NoMemory();
    PyObject *solid = PyBytes_FromStringAndSize(NULL, length * per_char);
    if (solid == NULL)
        return NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(solid);
    Py_ssize_t kept = 0, chars = 0, words = 0;
    int after_space = 1;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *in = (const Py_UCS1 *)data;
        Py_ssize_t i = 0;
#ifdef SIXTEEN_AT_A_TIME
        for (; i + 16 <= length; i += 16) {
            latin1_block(_mm_loadu_si128((const __m128i *)(in + i)), in + i, out, &kept,
                         &chars, &words, &after_space);
        }
#endif
        for (; i < length; i++)
            MEASURE(in[i]);
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *in = (const Py_UCS2 *)data;
        Py_ssize_t i = 0;
#ifdef SIXTEEN_AT_A_TIME
        for (; i + 16 <= length; i += 16) {
            /* Sixteen characters packed to bytes when none is over U+00FF (a curly quote
             * or a dash makes a block go one character at a time). */
            __m128i low = _mm_loadu_si128((const __m128i *)(in + i));
            __m128i next = _mm_loadu_si128((const __m128i *)(in + i + 8));
            __m128i upper = _mm_set1_epi16((short)0xFF00);
            __m128i over = _mm_or_si128(_mm_and_si128(low, upper), _mm_and_si128(next, upper));
            if (_mm_movemask_epi8(_mm_cmpeq_epi8(over, _mm_setzero_si128())) != 0xFFFF) {
                for (Py_ssize_t j = i; j < i + 16; j++)
                    MEASURE(in[j]);
                continue;
            }
            __m128i block = _mm_packus_epi16(low, next);
            unsigned char bytes[16];
            _mm_storeu_si128((__m128i *)bytes, block);
            latin1_block(block, bytes, out, &kept, &chars, &words, &after_space);
        }
#endif
        for (; i < length; i++)
            MEASURE(in[i]);
    } else {
        const Py_UCS4 *in = (const Py_UCS4 *)data;
        for (Py_ssize_t i = 0; i < length; i++)
            MEASURE(in[i]);
    }
    if (_PyBytes_Resize(&solid, kept) < 0)
        return NULL;
    /* One space between each two words: the collapsed, trimmed text's length. */
    return Py_BuildValue("(nN)", chars + (words > 0 ? words - 1 : 0), solid);
}

static PyMethodDef methods[] = {
    {"solid_text", solid_text, METH_O,
     "solid_text(text) -> (text_length, solid): see common/work/_text_measure.c."},
    {NULL, NULL, 0, NULL},
};

FLEET_MODULE(_text_measure, "The text measures' one pass (NOTES #83).", methods)
