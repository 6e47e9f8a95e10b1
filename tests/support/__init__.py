"""What the tests share: helpers by area (``tests.support.analyses``, ``.cli``, ``.adapters``, ``.gates``) and the one
small model configuration; fixtures live in tests/conftest.py."""

# The tiny tier shrunk to two layers of width 32: the configuration every small test model starts from (tests that need
# another width, context or vocabulary say so with ``dict(SMALL, ...)``).
SMALL = dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=64)
