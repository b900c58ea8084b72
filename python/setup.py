"""Build hook: records the source tree the package was built from in nanolm/_build_paths.py, so
that a `pip install ./python` finds libnanolm.so in that tree's build folder (after $NANOLM_LIB and
before the system loader). Everything else is in pyproject.toml."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self):
        super().run()
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with open(os.path.join(self.build_lib, "nanolm", "_build_paths.py"), "w") as f:
            f.write('"""Written by python/setup.py at build time."""\n')
            f.write(f"SOURCE_TREE = {repo!r}\n")


setup(cmdclass={"build_py": BuildPy})
