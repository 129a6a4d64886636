"""colibri.accelerated: the compiled engine (mypyc control plane, C/CUDA kernels).

It must match ``colibri.reference`` token for token. Until its compiled modules are built
this package is empty and ``colibri doctor`` reports it as not built.
"""
