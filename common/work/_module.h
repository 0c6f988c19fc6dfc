/* What each of the fleet's C modules declares the same way (common/ops/native.py builds them):
 * its module definition and its init function, from its name, its docstring and its methods;
 * and whether a loop may go sixteen bytes at a time (SSE2, x86-64's baseline, with GCC's
 * builtins), else one at a time (an ARM build; tests/work/test_native.py builds that too). */
#define FLEET_MODULE(name, doc, methods)                                                  \
    static struct PyModuleDef name##_definition = {PyModuleDef_HEAD_INIT, #name, doc, 0,  \
                                                   methods};                            \
    PyMODINIT_FUNC PyInit_##name(void) { return PyModule_Create(&name##_definition); }

#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>
#define SIXTEEN_AT_A_TIME 1
#endif
