/* The text measures' one pass, in C (NOTES #83): common/work/page.py's measure_text calls
 * solid_text(text) and hashes what it returns; page.py holds the same pass in Python, for a
 * checkout where this module is not built, and the tests hold the two equal.
 *
 * solid_text(text) -> (text_length, solid): ``solid`` is the text's UTF-8 bytes without ASCII
 * whitespace (space, \t, \n, \r, \f), and ``text_length`` the length in characters of the text
 * with each run of ASCII whitespace collapsed to one space and trimmed. A lone surrogate
 * (which lxml can hand over) is encoded as with "surrogatepass", as page.py does.
 *
 * One pass over the text's UTF-8 form (for an ASCII str, the str's own buffer: no copy), with
 * no branch on the bytes: the Python form takes four passes (an encode, two translates and a
 * pair count), ~55 us against ~20 on a farm page's 23 KB of text.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *
solid_text(PyObject *module, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "solid_text() takes a str");
        return NULL;
    }
    Py_ssize_t size;
    PyObject *encoded = NULL;
    const char *data = PyUnicode_AsUTF8AndSize(text, &size);
    if (data == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return NULL;
        PyErr_Clear(); /* a lone surrogate: encoded as page.py's Python pass does */
        encoded = PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass");
        if (encoded == NULL)
            return NULL;
        data = PyBytes_AS_STRING(encoded);
        size = PyBytes_GET_SIZE(encoded);
    }
    PyObject *solid = PyBytes_FromStringAndSize(NULL, size);
    if (solid == NULL) {
        Py_XDECREF(encoded);
        return NULL;
    }
    const unsigned char *in = (const unsigned char *)data;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(solid);
    Py_ssize_t kept = 0, chars = 0, words = 0;
    int after_space = 1;
    for (Py_ssize_t i = 0; i < size; i++) {
        unsigned char c = in[i];
        int space = (c == ' ') | (c == '\n') | (c == '\t') | (c == '\r') | (c == '\f');
        out[kept] = c;         /* written always, kept only when not a space */
        kept += !space;
        words += after_space & !space;                /* a word starts here */
        chars += !space & ((c & 0xC0) != 0x80);       /* not a UTF-8 continuation byte */
        after_space = space;
    }
    Py_XDECREF(encoded);
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

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_text_measure", "The text measures' one pass (NOTES #83).", 0, methods,
};

PyMODINIT_FUNC
PyInit__text_measure(void)
{
    return PyModule_Create(&module);
}
