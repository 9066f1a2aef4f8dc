"""This package's version, in a module of its own: every module can read it without importing the
package face (``airlock_redis/__init__.py``). ``pyproject.toml`` declares the same string
(``tests/test_public_face.py`` checks that the two agree)."""

__version__ = "0.1.0"
