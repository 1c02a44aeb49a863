"""pip install --no-build-isolation .  (offline, Debian's /usr/bin/python3)

Builds the C library with CMake (`make build`) if it is not built yet, then
the extension datahelix._C against it, and ships the `datahelix` program
(and `datahelix-svc`, its media-free service commands) inside the package
(datahelix/bin/) so the DataServers it starts are found
without a PATH entry; the `datahelix` console command runs that program
(datahelix/_cli.py).  `make install` and `make deb` are the other ways in
(README "Installing")."""
import glob
import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(ROOT, "build")
LIBS = ["libavformat", "libavcodec", "libavutil", "libswscale",
        "libswresample", "libzmq",
        "libprotobuf-c", "jansson", "libsodium", "libcurl"]


def built():
    if not (os.path.exists(os.path.join(BUILD, "libdatahelix.a")) and
            os.path.exists(os.path.join(BUILD, "datahelix")) and
            os.path.exists(os.path.join(BUILD, "datahelix-svc"))):
        subprocess.check_call(["make", "-C", ROOT, "build"])
    return BUILD


class BuildPy(build_py):
    """Also copies the `datahelix` and `datahelix-svc` programs into the
    package."""

    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "datahelix", "bin")
        os.makedirs(dst, exist_ok=True)
        for prog in ("datahelix", "datahelix-svc"):
            shutil.copy2(os.path.join(built(), prog), dst)


def pkg_libs():
    return subprocess.check_output(["pkg-config", "--libs"] + LIBS,
                                   text=True).split()


setup(
    name="datahelix",
    version="0.1.0",
    description="A data plane for training video and multimodal models",
    package_dir={"": "python"},
    packages=["datahelix"],
    ext_modules=[Extension(
        "datahelix._C",
        # Every source of the extension, as CMake's list (a file left out
        # here loads as an undefined symbol at import).
        sources=sorted(glob.glob("src/python/*.c")),
        include_dirs=["include", "src/include", "src"],
        # The stable ABI, as the CMake build (docs/bundle.md): _C.abi3.so
        # loads on every CPython >= 3.11.
        define_macros=[("_GNU_SOURCE", None),
                       ("Py_LIMITED_API", "0x030B0000")],
        py_limited_api=True,
        extra_compile_args=["-std=c11"],
        extra_objects=[os.path.join(built(), "libdatahelix.a")],
        # Rebuilt when a header or the library changes, not only a source.
        depends=sorted(glob.glob("include/datahelix/*.h") +
                       glob.glob("src/include/datahelix/*.h") +
                       glob.glob("src/python/*.h")) +
        [os.path.join(BUILD, "libdatahelix.a")],
        extra_link_args=pkg_libs() + ["-lm", "-lpthread"])],
    cmdclass={"build_py": BuildPy},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
    entry_points={"console_scripts": ["datahelix = datahelix._cli:main"]},
)
