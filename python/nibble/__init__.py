"""nibble: low-bit (int4/int8) GEMMs and quantized linear layers for LLM inference.

This package currently installs the `nibble` command-line tool (`nibble info`, `nibble demo`,
`nibble bench gemm`, ...) built from the C++/CUDA library. The Python bindings of the C++ API
arrive with the nanobind module `nibble._C`.
"""

import os
import shutil
import sysconfig

__version__ = "0.1.0"


def cli_path() -> str:
    """Path of the installed `nibble` command-line tool, or raises FileNotFoundError."""
    beside = os.path.join(sysconfig.get_path("scripts"), "nibble")
    path = beside if os.path.exists(beside) else shutil.which("nibble")
    if path is None:
        raise FileNotFoundError(
            "the `nibble` executable is not on PATH; reinstall with `pip install .` from the "
            "nibble source tree")
    return os.path.realpath(path)
