/* What each of the fleet's C modules declares the same way (common/ops/native.py builds them):
 * its module definition and its init function, from its name, its docstring and its methods. */
#define FLEET_MODULE(name, doc, methods)                                                  \
    static struct PyModuleDef name##_definition = {PyModuleDef_HEAD_INIT, #name, doc, 0,  \
                                                   methods};                            \
    PyMODINIT_FUNC PyInit_##name(void) { return PyModule_Create(&name##_definition); }
