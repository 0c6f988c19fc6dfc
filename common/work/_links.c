/* A page's links resolved in C where their shape is plain (NOTES #83): common/work/links.py's
 * extract_links calls resolve_all() and keeps its own Python pass for a checkout where this
 * module is not built; the tests hold the two equal on random hrefs and bases.
 *
 * resolve_all(hrefs, base, max_links, max_chars, resolve) -> (links, truncated)
 * is links.extract_links for a base (links.Base) with an origin: the unique resolved links in order, capped
 * at max_links. An href is resolved here when it is ASCII and printable once its ASCII
 * whitespace ends are stripped, and is one of the shapes nearly every link has:
 *   - "http://..." or "https://..." (lower-case scheme): the href itself, without fragment,
 *     None without a host;
 *   - "/path" (not "//", no "/." anywhere): origin + href;
 *   - "#..." or "": the base URL itself;
 *   - "path" (no scheme, not starting with "?" or ".", no "/." anywhere): directory + href;
 * always cut at its first "#" and None when over max_chars. Every other href goes to
 * ``resolve(href, base)``, the Python function that has the final word (links.resolve).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_module.h"
#include <string.h>

static int
is_ascii_space(Py_UCS1 c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

static int
is_scheme_char(Py_UCS1 c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
           || c == '+' || c == '.' || c == '-';
}

/* ``prefix`` + s[start:end], or a new reference to None when over max_chars. */
static PyObject *
joined(PyObject *prefix, const Py_UCS1 *s, Py_ssize_t start, Py_ssize_t end,
       Py_ssize_t max_chars)
{
    Py_ssize_t head = prefix == NULL ? 0 : PyUnicode_GET_LENGTH(prefix);
    if (head + (end - start) > max_chars)
        Py_RETURN_NONE;
    PyObject *tail = PyUnicode_FromStringAndSize((const char *)s + start, end - start);
    if (tail == NULL || prefix == NULL)
        return tail;
    PyObject *url = PyUnicode_Concat(prefix, tail);
    Py_DECREF(tail);
    return url;
}

/* The href resolved in C: a new reference (a str or None), or NULL with no error set when its
 * shape is not one of the plain ones (the caller asks Python), or NULL with an error. */
static PyObject *
resolve_plain(PyObject *href, PyObject *origin, PyObject *directory, PyObject *base_url,
              Py_ssize_t max_chars)
{
    if (!PyUnicode_IS_ASCII(href))
        return NULL;
    const Py_UCS1 *s = PyUnicode_1BYTE_DATA(href);
    Py_ssize_t start = 0, end = PyUnicode_GET_LENGTH(href);
    while (start < end && is_ascii_space(s[start]))
        start++;
    while (end > start && is_ascii_space(s[end - 1]))
        end--;
    Py_ssize_t cut = end, dot_segment = 0;
    for (Py_ssize_t i = start; i < end; i++) {
        Py_UCS1 c = s[i];
        if (c < 0x20 || c > 0x7E)
            return NULL; /* a control character: Python removes or keeps it */
        if (c == '#' && cut == end)
            cut = i;
        if (c == '/' && i + 1 < end && s[i + 1] == '.')
            dot_segment = 1;
    }
    Py_ssize_t size = end - start;
    const Py_UCS1 *h = s + start;
    if (size == 0 || h[0] == '#') {
        if (PyUnicode_GET_LENGTH(base_url) > max_chars)
            Py_RETURN_NONE;
        return Py_NewRef(base_url);
    }
    if (h[0] == '/') {
        if (size > 1 && h[1] == '/')
            return NULL; /* scheme-relative */
        if (dot_segment)
            return NULL; /* dot segments: urljoin */
        return joined(origin, s, start, cut, max_chars);
    }
    int https = size >= 8 && memcmp(h, "https://", 8) == 0;
    if (https || (size >= 7 && memcmp(h, "http://", 7) == 0)) {
        Py_ssize_t host = start + (https ? 8 : 7);
        if (host >= cut || s[host] == '/' || s[host] == '?' || s[host] == '\\')
            Py_RETURN_NONE; /* no host */
        return joined(NULL, s, start, cut, max_chars);
    }
    if ((h[0] >= 'a' && h[0] <= 'z') || (h[0] >= 'A' && h[0] <= 'Z')) {
        Py_ssize_t i = 1;
        while (i < size && is_scheme_char(h[i]))
            i++;
        if (i < size && h[i] == ':')
            return NULL; /* a scheme: mailto:, HTTP:, ... */
    }
    if (h[0] == '?' || h[0] == '.' || dot_segment)
        return NULL; /* urljoin */
    return joined(directory, s, start, cut, max_chars);
}

static PyObject *
resolve_all(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "resolve_all(hrefs: list, base, max_links, max_chars, resolve)");
        return NULL;
    }
    PyObject *hrefs = args[0], *base = args[1], *resolve = args[4];
    Py_ssize_t max_links = PyLong_AsSsize_t(args[2]);
    Py_ssize_t max_chars = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    /* The base's fields, as links.Base holds them (str each). */
    PyObject *origin = PyObject_GetAttrString(base, "origin");
    PyObject *directory = PyObject_GetAttrString(base, "directory");
    PyObject *base_url = PyObject_GetAttrString(base, "url");
    PyObject *found = NULL, *seen = NULL;
    if (origin == NULL || directory == NULL || base_url == NULL)
        goto error;
    if (!PyUnicode_Check(origin) || !PyUnicode_Check(directory) || !PyUnicode_Check(base_url)) {
        PyErr_SetString(PyExc_TypeError, "resolve_all(): the base's origin, directory and url "
                        "must be str");
        goto error;
    }
    found = PyList_New(0);
    seen = PySet_New(NULL);
    if (found == NULL || seen == NULL)
        goto error;
    int truncated = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(hrefs); i++) {
        PyObject *href = PyList_GET_ITEM(hrefs, i);
        PyObject *url = NULL;
        if (PyUnicode_Check(href))
            url = resolve_plain(href, origin, directory, base_url, max_chars);
        if (url == NULL) {
            if (PyErr_Occurred())
                goto error;
            url = PyObject_CallFunctionObjArgs(resolve, href, base, NULL);
            if (url == NULL)
                goto error;
        }
        if (url == Py_None) {
            Py_DECREF(url);
            continue;
        }
        int known = PySet_Contains(seen, url);
        if (known < 0) {
            Py_DECREF(url);
            goto error;
        }
        if (!known) {
            if (PyList_GET_SIZE(found) >= max_links) {
                Py_DECREF(url);
                truncated = 1;
                break;
            }
            if (PySet_Add(seen, url) < 0 || PyList_Append(found, url) < 0) {
                Py_DECREF(url);
                goto error;
            }
        }
        Py_DECREF(url);
    }
    PyObject *links = PyList_AsTuple(found), *result = NULL;
    if (links != NULL)
        result = Py_BuildValue("(NO)", links, truncated ? Py_True : Py_False);
    Py_DECREF(found);
    Py_DECREF(seen);
    Py_DECREF(origin);
    Py_DECREF(directory);
    Py_DECREF(base_url);
    return result;
error:
    Py_XDECREF(found);
    Py_XDECREF(seen);
    Py_XDECREF(origin);
    Py_XDECREF(directory);
    Py_XDECREF(base_url);
    return NULL;
}

static PyMethodDef methods[] = {
    {"resolve_all", (PyCFunction)(void (*)(void))resolve_all, METH_FASTCALL,
     "resolve_all(hrefs, base, max_links, max_chars, resolve) -> (links, truncated): see "
     "common/work/_links.c."},
    {NULL, NULL, 0, NULL},
};

FLEET_MODULE(_links, "A page's links resolved in C (NOTES #83).", methods)
