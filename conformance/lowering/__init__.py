"""The lowering chapter: test_lowering.py and the helpers only it imports."""
