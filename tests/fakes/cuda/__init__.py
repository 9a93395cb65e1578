"""A fake cuda-python for tests (importable as `cuda` when tests/fakes is on sys.path): only
`cuda.bindings.runtime` and `cuda.bindings.utils`, see tests/fakes/cuda/bindings/runtime.py."""
