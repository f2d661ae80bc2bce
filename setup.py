"""setup.cfg holds the whole configuration; this file only keeps ``pip install .`` from
writing ``build/`` and ``*.egg-info`` into the checkout: setuptools builds in a temporary
directory instead, removed when the build ends."""

import atexit
import shutil
import tempfile

from setuptools import setup

build_base = tempfile.mkdtemp(prefix="kombu-beetle-build-")
atexit.register(shutil.rmtree, build_base, ignore_errors=True)
setup(options={"build": {"build_base": build_base}, "egg_info": {"egg_base": build_base}})
